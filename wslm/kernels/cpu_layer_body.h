/* The decode step of cpu_layer.c for one activation type, included once per type with:
   T (the stored element: uint16_t bf16 or float), LD(v) (T -> float), ST(f) (float -> T), RND(f) (f as an
   op in T leaves it), NAME(n) (a per-type name), ENTRY (the exported function), ACT_BF16 (1 or 0). */

/* q . k of two rows of T, fp32 sums */
static inline float NAME(dot_qk)(const T *a, const T *b, long n) {
#if ACT_BF16
#if defined(__AVX512BF16__)
    if (n % 32 == 0) {  /* 32 pairs an instruction; the products are exact in fp32, as after a conversion */
        __m512 acc = _mm512_setzero_ps();
        for (long i = 0; i < n; i += 32)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
        return _mm512_reduce_add_ps(acc);
    }
#endif
    long i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(bf16x16(a + i), bf16x16(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(bf8(a + i), bf8(b + i), acc);
    s = hsum8(acc);
#endif
    for (; i < n; i++) s += bf2f(a[i]) * bf2f(b[i]);
    return s;
#else
    return dot_f32(a, b, n);
#endif
}

/* a row of T as fp32 (n floats at y) */
static inline void NAME(to_f32)(const T *x, float *y, long n) {
#if ACT_BF16
    long i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, bf16x16(x + i));
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf8(x + i));
#endif
    for (; i < n; i++) y[i] = bf2f(x[i]);
#else
    memcpy(y, x, sizeof(float) * (size_t)n);
#endif
}

/* out = x @ w.T (+ bias). The float32 build hands int4/int8 products a bf16 row and widens their bf16
   result, as Int4Weight/Int8Weight.apply do in a float32 engine; xb, ob: scratch of k and n bf16. */
static int NAME(linear)(const wslm_linear *l, const T *x, T *out, int threads, uint16_t *xb, uint16_t *ob) {
    int rc = 0;
#if ACT_BF16
    (void)xb, (void)ob;
    if (l->kind == LIN_BF16) dense(dense_rows_bf16, x, l->w, out, l->n, l->k, threads);
    else rc = linear_bf16_rows(l, x, out, threads);
#else
    if (l->kind == LIN_F32) dense(dense_rows_f32, x, l->w, out, l->n, l->k, threads);
    else if (l->kind == LIN_GGUF) rc = wslm_gguf_mm(l->w, x, 1, 0, out, 0, threads);  /* fp32 in and out */
    else if (l->kind == LIN_INT4 || l->kind == LIN_INT8) {
        for (long i = 0; i < l->k; i++) xb[i] = f2bf(x[i]);
        rc = linear_bf16_rows(l, xb, ob, threads);
        for (long i = 0; i < l->n; i++) out[i] = bf2f(ob[i]);
    } else
        rc = -2;
#endif
    if (rc == 0 && l->bias) {
        const T *b = (const T *)l->bias;
        for (long i = 0; i < l->n; i++) out[i] = ST(LD(out[i]) + LD(b[i]));
    }
    return rc;
}

/* w * rms_norm(x): F.rms_norm's fp32 sum and result in T, then the multiply in T (in place is fine) */
static void NAME(rms_norm)(const T *x, const T *w, double eps, long d, T *out) {
    float ss = 0.0f;
    for (long i = 0; i < d; i++) { float v = LD(x[i]); ss += v * v; }
    float r = 1.0f / sqrtf(ss / (float)d + (float)eps);
    for (long i = 0; i < d; i++) out[i] = ST(LD(w[i]) * RND(LD(x[i]) * r));
}

/* neox rotary in place over rows of hd: x * [cos|cos] + [x2|x1] * [-sin|sin], products rounded first */
static void NAME(rotate)(T *x, long rows, long hd, const T *cos2, const T *sin2) {
    long half = hd / 2;
    for (long r = 0; r < rows; r++) {
        T *v = x + r * hd;
        for (long i = 0; i < half; i++) {
            float a = LD(v[i]), b = LD(v[i + half]);
            float lo = RND(a * LD(cos2[i])) + RND(b * LD(sin2[i]));
            float hi = RND(b * LD(cos2[i + half])) + RND(a * LD(sin2[i + half]));
            v[i] = ST(lo);
            v[i + half] = ST(hi);
        }
    }
}

/* Ask for the key or value row of one head at token t (its block from the table) ahead of its use: a
   head's rows lie a whole slot apart, and the hardware prefetchers alone left attention waiting on
   memory (2/3 of a 4k-context step's time). */
#ifndef ATT_AHEAD
#define ATT_AHEAD 32
#endif
static inline void NAME(fetch_row)(const T *cache, const int32_t *table, long bs, long row, long kh, long hd,
                                   long t) {
    const char *p = (const char *)(cache + ((long)table[t / bs] * bs + t % bs) * row + kh * hd);
    for (long b = 0; b < (long)sizeof(T) * hd; b += 64) prefetch(p + b);
}

/* softmax(q k^T * scale) v, unnormalised, for one key/value head's q heads over the keys [ta, tb) of the
   sequence (paged, block by block): for each q head g of the group, top[g] (the largest score), sum[g]
   (of e^(score - top)) and acc[g * hd ...] (of e^(score - top) v). The q heads that share the key/value
   head are done together, so each key and value row is read (and converted) once.
   work: group * (tb - ta) + hd floats. */
static void NAME(attend_part)(const T *q, const wslm_layer *l, long kh, long group, long kvh, long hd,
                              const int32_t *table, long bs, long ta, long tb, float *work, float *top,
                              float *sum, float *acc) {
    long row = kvh * hd, n = tb - ta;
    float *scores = work, *vf = work + group * n, scale = (float)l->scale;
    const T *kc = (const T *)l->k_cache, *vc = (const T *)l->v_cache;
    const T *qh = q + kh * group * hd;  /* q heads kh * group ... are this key head's */
    /* the first rows asked for at once: the loops below ask ATT_AHEAD rows ahead, which leaves a stretch's first
       rows to wait on memory one after another */
    for (long t = ta; t < tb && t < ta + ATT_AHEAD; t++) NAME(fetch_row)(kc, table, bs, row, kh, hd, t);
    for (long t = ta; t < tb;) {
        long end = (t / bs + 1) * bs < tb ? (t / bs + 1) * bs : tb;
        const T *kp = kc + ((long)table[t / bs] * bs + t % bs) * row + kh * hd;
        for (; t < end; t++, kp += row) {
            if (t + ATT_AHEAD < tb) NAME(fetch_row)(kc, table, bs, row, kh, hd, t + ATT_AHEAD);
            for (long g = 0; g < group; g++) scores[g * n + t - ta] = NAME(dot_qk)(kp, qh + g * hd, hd) * scale;
        }
    }
    for (long g = 0; g < group; g++) {
        float *sc = scores + g * n, m = -INFINITY;
        for (long t = 0; t < n; t++) m = sc[t] > m ? sc[t] : m;
        top[g] = m;
        sum[g] = n ? exp_shifted(sc, n, m) : 0.0f;
    }
    for (long t = ta; t < tb && t < ta + ATT_AHEAD; t++) NAME(fetch_row)(vc, table, bs, row, kh, hd, t);
    for (long i = 0; i < group * hd; i++) acc[i] = 0.0f;
    for (long t = ta; t < tb;) {
        long end = (t / bs + 1) * bs < tb ? (t / bs + 1) * bs : tb;
        const T *vp = vc + ((long)table[t / bs] * bs + t % bs) * row + kh * hd;
        for (; t < end; t++, vp += row) {
            if (t + ATT_AHEAD < tb) NAME(fetch_row)(vc, table, bs, row, kh, hd, t + ATT_AHEAD);
            NAME(to_f32)(vp, vf, hd);
            for (long g = 0; g < group; g++) {
                float p = scores[g * n + t - ta], *a = acc + g * hd;
                for (long i = 0; i < hd; i++) a[i] += p * vf[i];
            }
        }
    }
}

/* q head g's output from the stretches of its key/value head: part holds each stretch's top scores [group],
   sums [group] and accumulators [group * hd], group * (hd + 2) floats a stretch, in context order. Every path
   (one thread, a team, the rows of a verification step) merges here, in this order, so a token's attention
   has the same bits whichever thread computed which stretch. */
static void NAME(merge_head)(const float *part, long stretches, long group, long hd, long g, T *out) {
    float m = -INFINITY, total = 0.0f, w[ATT_MAX_STRETCHES];
    for (long c = 0; c < stretches; c++) m = max_f(m, part[c * group * (hd + 2) + g]);
    for (long c = 0; c < stretches; c++) {
        const float *top = part + c * group * (hd + 2);
        w[c] = stretches == 1 ? 1.0f : expf(top[g] - m);
        total += top[group + g] * w[c];
    }
    for (long i = 0; i < hd; i++) {
        float a = 0.0f;
        for (long c = 0; c < stretches; c++) a += part[c * group * (hd + 2) + 2 * group + g * hd + i] * w[c];
        out[i] = ST(a / total);
    }
}

/* softmax(q k^T * scale) v for the q heads of key/value head kh over the len keys of the sequence, one
   thread: its stretches one after another, then merged (merge_head). out: the q heads' rows [heads * hd].
   work: group * len + hd floats; part: ATT_MAX_STRETCHES * group * (hd + 2) floats. */
static void NAME(attend_head)(const T *q, const wslm_layer *l, long kh, long group, long kvh, long hd,
                              const int32_t *table, long bs, long len, T *out, float *work, float *part) {
    long stretches = att_stretches(len), ta, tb;
    for (long c = 0; c < stretches; c++) {
        float *top = part + c * group * (hd + 2), *sum = top + group, *acc = sum + group;
        att_stretch(len, c, &ta, &tb);
        NAME(attend_part)(q, l, kh, group, kvh, hd, table, bs, ta, tb, work, top, sum, acc);
    }
    for (long g = 0; g < group; g++) NAME(merge_head)(part, stretches, group, hd, g, out + (kh * group + g) * hd);
}

/* softmax(q k^T * scale) v for one new token over the len keys of its sequence, one thread.
   work: ATT_WORK_FLOATS(group, len, hd) floats. */
static void NAME(attend)(const T *q, const wslm_layer *l, long heads, long kvh, long hd, const int32_t *table,
                         long bs, long len, T *out, float *work) {
    long group = heads / kvh;
    float *part = work + group * len + hd;
    for (long kh = 0; kh < kvh; kh++) NAME(attend_head)(q, l, kh, group, kvh, hd, table, bs, len, out, work, part);
}

/* The phases of a layer that one thread does (the products and attention are split in a team). */

/* residual += hidden (the first layer: residual = hidden), then x = the norm of it */
static void NAME(add_norm)(long li, const T *hidden, T *residual, const T *w, double eps, long d, T *x) {
    if (li == 0) memcpy(residual, hidden, sizeof(T) * (size_t)d);
    else for (long i = 0; i < d; i++) residual[i] = ST(LD(hidden[i]) + LD(residual[i]));
    NAME(rms_norm)(residual, w, eps, d, x);
}

/* q/k norm, rotary, and this token's key and value into the cache */
static void NAME(rope_store)(const wslm_layer *l, T *qkv, long heads, long kvh, long hd, const T *cos2,
                             const T *sin2, long slot) {
    long q_size = heads * hd, kv_size = kvh * hd;
    if (l->qk_norm)
        for (long r = 0; r < heads + kvh; r++)
            NAME(rms_norm)(qkv + r * hd, (const T *)l->qk_norm + r * hd, l->qk_eps, hd, qkv + r * hd);
    NAME(rotate)(qkv, heads + kvh, hd, cos2, sin2);
    memcpy((T *)l->k_cache + slot * kv_size, qkv + q_size, sizeof(T) * (size_t)kv_size);
    memcpy((T *)l->v_cache + slot * kv_size, qkv + q_size + kv_size, sizeof(T) * (size_t)kv_size);
}

/* act[i] = silu(gate[i]) * up[i] for i in [i0, i1) */
static void NAME(silu_mul)(const T *gu, T *act, long inter, long i0, long i1) {
    for (long i = i0; i < i1; i++) {
        float g = LD(gu[i]);
        act[i] = ST(RND(g / (1.0f + expf(-g))) * LD(gu[inter + i]));
    }
}

static long NAME(widest)(const wslm_layer *layers, long n_layers, long *qkv_n, long *gu_n) {
    long widest = 0;
    *qkv_n = *gu_n = 0;
    for (long i = 0; i < n_layers; i++) {
        const wslm_linear *ls[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up, &layers[i].down};
        *qkv_n = max_l(*qkv_n, layers[i].qkv.n);
        *gu_n = max_l(*gu_n, layers[i].gate_up.n);
        for (int j = 0; j < 4; j++) widest = max_l(widest, max_l(ls[j]->n, ls[j]->k));
    }
    return widest;
}

/* A mixture-of-experts MLP for one row, as layers/moe.py and kernels/torch_moe.py compute it: the router's
   logits in T, softmax and top-k in fp32 (renormalised when norm_topk), the weights rounded to T; each
   chosen expert's gate|up, SiLU and down as the dense MLP's, its output kept apart; each output times its
   weight rounded to T, the k of them summed in slot order in fp32 and rounded once. With threads the experts
   are shared among them, each on one thread (an expert's products are too small to split well: a parallel
   region each cost more than it saved), so the bits do not depend on the thread count. */
static int NAME(moe)(const wslm_moe *m, const T *x, T *out, long d, int threads) {
    long E = m->experts, K = m->top_k;
    if (K < 1 || K > 64 || K > E) return -2;
    long gn = m->gate_up[0].n, kx = max_l(max_l(gn, E), d);  /* every expert has one shape; kx: the widest row */
    int nt_max = threads > 1 ? threads : 1;
    T *logit = (T *)malloc(sizeof(T) * (size_t)(E + K * d + nt_max * (gn + gn / 2)));
    float *p = (float *)malloc(sizeof(float) * (size_t)(E + d));
    /* the float32 build hands int4/int8 products bf16 rows: scratch of kx each way, per thread */
    uint16_t *bs = ACT_BF16 ? NULL : (uint16_t *)malloc(sizeof(uint16_t) * 2 * (size_t)(nt_max * kx));
    if (!logit || !p || (!ACT_BF16 && !bs)) { free(logit); free(p); free(bs); return -1; }
    T *ys = logit + E;
    float *acc = p + E;
    int rc = NAME(linear)(&m->router, x, logit, threads, bs, bs ? bs + kx : NULL);
    float top = -INFINITY, total = 0.0f;
    for (long e = 0; e < E; e++) { p[e] = LD(logit[e]); top = p[e] > top ? p[e] : top; }
    for (long e = 0; e < E; e++) { p[e] = expf(p[e] - top); total += p[e]; }
    long ids[64];
    float w[64], picked = 0.0f;
    for (long j = 0; j < K; j++) {  /* the largest first, the lower index on a tie; a pick is marked -1 */
        long best = 0;
        for (long e = 1; e < E; e++)
            if (p[e] > p[best]) best = e;
        ids[j] = best;
        w[j] = p[best] / total;
        picked += w[j];
        p[best] = -1.0f;
    }
    int bad = rc != 0;
    if (!bad) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(nt_max) if (nt_max > 1) reduction(| : bad)
#endif
        {
#if defined(_OPENMP)
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
            int t = 0, nt = 1;
#endif
            T *g = ys + K * d + t * (gn + gn / 2), *a = g + gn;
            uint16_t *xb = bs ? bs + 2 * t * kx : NULL, *ob = xb ? xb + kx : NULL;
            for (long j = t; j < K; j += nt) {
                const wslm_linear *gl = &m->gate_up[ids[j]];
                long inter = gl->n / 2;
                bad |= NAME(linear)(gl, x, g, 1, xb, ob) != 0;
                NAME(silu_mul)(g, a, inter, 0, inter);
                bad |= NAME(linear)(&m->down[ids[j]], a, ys + j * d, 1, xb, ob) != 0;
            }
        }
    }
    if (rc == 0 && bad) rc = -2;
    for (long i = 0; i < d; i++) acc[i] = 0.0f;
    for (long j = 0; j < K && rc == 0; j++) {
        float wj = LD(ST(m->norm_topk ? w[j] / picked : w[j]));
        for (long i = 0; i < d; i++) acc[i] += LD(ST(LD(ys[j * d + i]) * wj));
    }
    for (long i = 0; i < d; i++) out[i] = ST(acc[i]);
    free(logit);
    free(p);
    free(bs);
    return rc;
}

#if defined(_OPENMP)
/* A team thread's rows of out = x @ w.T (+ bias): x whole, out shared (each thread writes its rows).
   The float32 build rounds x to bf16 in its own xb and takes its rows through the shared ob. */
static void NAME(team_linear)(const wslm_linear *l, const T *x, T *out, int t, int nt, void *scratch, uint16_t *xb,
                              uint16_t *ob) {
    long n0, n1;
    team_rows(l, t, nt, &n0, &n1);
#if ACT_BF16
    (void)xb, (void)ob;
    team_bf16_rows(l, x, out, n0, n1, scratch);
#else
    if (l->kind == LIN_F32) dense_rows_f32(x, l->w, out, l->k, n0, n1);
    else if (l->kind == LIN_GGUF) wslm_gguf_rows(l->w, x, 0, out, 0, n0, n1, scratch);
    else {
        for (long i = 0; i < l->k; i++) xb[i] = f2bf(x[i]);
        team_bf16_rows(l, xb, ob, n0, n1, scratch);
        for (long i = n0; i < n1; i++) out[i] = bf2f(ob[i]);
    }
#endif
    if (l->bias) {
        const T *b = (const T *)l->bias;
        for (long i = n0; i < n1; i++) out[i] = ST(LD(out[i]) + LD(b[i]));
    }
}

/* whether a team takes every product of the layers (a team cannot return an error from inside) */
static int NAME(team_takes)(const wslm_layer *layers, long n_layers) {
    if (has_moe(layers, n_layers)) return 0;  /* experts: the one-row loop, each product with threads */
    for (long i = 0; i < n_layers; i++) {
        const wslm_linear *ls[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up, &layers[i].down};
        for (int j = 0; j < 4; j++) {
            long k = ls[j]->kind;
            if (!(k == LIN_INT4 || k == LIN_INT8 || k == LIN_GGUF || k == (ACT_BF16 ? LIN_BF16 : LIN_F32))) return 0;
        }
    }
    return 1;
}

/* The step with threads: one parallel region; every product split by rows, attention by key/value head
   and stretch (att_stretches: ATT_STRETCH keys each, from the context length alone, merged by merge_head as one
   thread merges them: the same bits for any thread count); the small phases on thread 0. */
static int NAME(step_team)(const wslm_layer *layers, long n_layers, long d, long heads, long kvh, long hd,
                           T *hidden, T *residual, const T *cos2, const T *sin2, const int32_t *table, long bs,
                           long len, long slot, int threads) {
    if (!NAME(team_takes)(layers, n_layers)) return -2;  /* every kind known before the team starts */
    long qkv_n, gu_n, widest = NAME(widest)(layers, n_layers, &qkv_n, &gu_n);
    long q_size = heads * hd, group = heads / kvh;
    long stretches = att_stretches(len), units = kvh * stretches;  /* attention units: (key/value head, stretch) */
    size_t shared = sizeof(T) * (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2)
                    + sizeof(float) * (size_t)(units * group * (hd + 2)) + sizeof(uint16_t) * (size_t)widest;
    size_t own = ROW_SCRATCH_BYTES(widest) + sizeof(float) * (size_t)(group * (len + hd) + hd)
                 + sizeof(uint16_t) * (size_t)widest;
    own = (own + 63) & ~(size_t)63;
    shared = (shared + 63) & ~(size_t)63;
    char *mem = (char *)aligned_alloc(64, shared + own * (size_t)threads);
    if (!mem) return -1;
    T *x = (T *)mem, *qkv = x + d, *att = qkv + qkv_n, *gu = att + q_size, *act = gu + gu_n;
    float *part = (float *)(act + gu_n / 2);
    uint16_t *ob = (uint16_t *)(part + units * group * (hd + 2));
    team_bar bar = {0, 0, 1};
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads(), sense = 0;
#pragma omp single
        bar.n = nt;  /* (the implied barrier publishes it) */
        char *mine = mem + shared + own * (size_t)t;
        void *scratch = mine;
        float *work = (float *)(mine + ROW_SCRATCH_BYTES(widest));
        uint16_t *xb = (uint16_t *)(work + group * (len + hd) + hd);
        long u0 = units * t / nt, u1 = units * (t + 1) / nt, h0 = heads * t / nt, h1 = heads * (t + 1) / nt;
        for (long li = 0; li < n_layers; li++) {
            const wslm_layer *l = layers + li;
            if (t == 0) NAME(add_norm)(li, hidden, residual, (const T *)l->w_in, l->eps_in, d, x);
            team_wait(&bar, &sense);
            NAME(team_linear)(&l->qkv, x, qkv, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            if (t == 0) NAME(rope_store)(l, qkv, heads, kvh, hd, cos2, sin2, slot);
            team_wait(&bar, &sense);
            for (long u = u0; u < u1; u++) {
                long kh = u / stretches, c = u % stretches;
                float *top = part + u * group * (hd + 2), *sum = top + group, *acc = sum + group;
                long ta, tb;
                att_stretch(len, c, &ta, &tb);
                NAME(attend_part)(qkv, l, kh, group, kvh, hd, table, bs, ta, tb, work, top, sum, acc);
            }
            team_wait(&bar, &sense);
            for (long h = h0; h < h1; h++)  /* merge the stretches of q head h */
                NAME(merge_head)(part + h / group * stretches * group * (hd + 2), stretches, group, hd, h % group,
                                 att + h * hd);
            team_wait(&bar, &sense);
            NAME(team_linear)(&l->o, att, hidden, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            if (t == 0) NAME(add_norm)(1, hidden, residual, (const T *)l->w_post, l->eps_post, d, x);
            team_wait(&bar, &sense);
            NAME(team_linear)(&l->gate_up, x, gu, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            long inter = l->gate_up.n / 2;
            NAME(silu_mul)(gu, act, inter, inter * t / nt, inter * (t + 1) / nt);
            team_wait(&bar, &sense);
            NAME(team_linear)(&l->down, act, hidden, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
        }
    }
    free(mem);
    return 0;
}
#endif

/* hidden [d]: the token's embedding in; out: the last layer's output, and residual [d] the stream before
   it (the caller adds them for the final norm). cos2/sin2 [hd]: this position's rotary rows; table: the
   sequence's block table; len: its tokens including this one, whose key and value go to slot; threads:
   more than one runs the step as a team (above).
   Returns 0; -1 out of memory; -2 a weight kind it does not know or a head layout it does not take. */
int ENTRY(const wslm_layer *layers, int64_t n_layers, int64_t d, int64_t heads, int64_t kvh, int64_t hd,
          T *hidden, T *residual, const T *cos2, const T *sin2, const int32_t *table, int64_t bs, int64_t len,
          int64_t slot, int threads) {
    long q_size = heads * hd, group = heads / kvh;
    if (group > 64) return -2;
    int experts = has_moe(layers, n_layers);
#if defined(_OPENMP)
    if (threads > 1 && !experts)
        return NAME(step_team)(layers, n_layers, d, heads, kvh, hd, hidden, residual, cos2, sin2, table, bs, len,
                               slot, threads);
#endif
    /* one thread, or a model with experts: products split by rows over the threads each, the rest on one */
    int pt = experts ? threads : 1;
    long qkv_n, gu_n, widest = NAME(widest)(layers, n_layers, &qkv_n, &gu_n);
    size_t elems = (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2);
    T *x = (T *)malloc(sizeof(T) * elems);
    float *f = (float *)malloc(sizeof(float) * (size_t)ATT_WORK_FLOATS(group, len, hd));
    uint16_t *xb = ACT_BF16 ? NULL : (uint16_t *)malloc(sizeof(uint16_t) * 2 * (size_t)widest);
    if (!x || !f || (!ACT_BF16 && !xb)) { free(x); free(f); free(xb); return -1; }
    uint16_t *ob = xb ? xb + widest : NULL;
    T *qkv = x + d, *att = qkv + qkv_n, *gu = att + q_size, *act = gu + gu_n;
    int rc = 0;
    for (long li = 0; li < n_layers && rc == 0; li++) {
        const wslm_layer *l = layers + li;
        NAME(add_norm)(li, hidden, residual, (const T *)l->w_in, l->eps_in, d, x);
        if ((rc = NAME(linear)(&l->qkv, x, qkv, pt, xb, ob))) break;
        NAME(rope_store)(l, qkv, heads, kvh, hd, cos2, sin2, slot);
        NAME(attend)(qkv, l, heads, kvh, hd, table, bs, len, att, f);
        if ((rc = NAME(linear)(&l->o, att, hidden, pt, xb, ob))) break;
        NAME(add_norm)(1, hidden, residual, (const T *)l->w_post, l->eps_post, d, x);
        if (l->moe) {
            rc = NAME(moe)(l->moe, x, hidden, d, pt);
            continue;
        }
        if ((rc = NAME(linear)(&l->gate_up, x, gu, pt, xb, ob))) break;
        long inter = l->gate_up.n / 2;
        NAME(silu_mul)(gu, act, inter, 0, inter);
        rc = NAME(linear)(&l->down, act, hidden, pt, xb, ob);
    }
    free(x);
    free(f);
    free(xb);
    return rc;
}

/* ---- several rows of one sequence (speculative verification) -------------------------------------------
   M consecutive tokens of one sequence in one call: the last accepted token and the drafts after it. Each
   row's arithmetic is the one-row step's, op for op (its products through the same kernels, its attention
   over the keys up to its own position), so its output is bit for bit what M one-row steps would give; the
   GGUF products take all M rows per weight chunk (cpu_gguf.c's rows_range: a chunk read from memory once,
   met by every row while in cache), which is where a verification step saves over M decode steps. */

/* out[m] = x[m] @ w.T (+ bias) for m < M; x rows l->k apart, out rows l->n apart */
static int NAME(linear_m)(const wslm_linear *l, const T *x, T *out, long M, int threads, uint16_t *xb,
                          uint16_t *ob) {
    if (l->kind != LIN_GGUF || M == 1) {
        for (long m = 0; m < M; m++) {
            int rc = NAME(linear)(l, x + m * l->k, out + m * l->n, threads, xb, ob);
            if (rc) return rc;
        }
        return 0;
    }
    int rc = wslm_gguf_mm(l->w, x, M, ACT_BF16, out, ACT_BF16, threads);  /* split by weight rows */
    if (rc == 0 && l->bias) {
        const T *b = (const T *)l->bias;
        for (long m = 0; m < M; m++)
            for (long i = 0; i < l->n; i++) out[m * l->n + i] = ST(LD(out[m * l->n + i]) + LD(b[i]));
    }
    return rc;
}

#if defined(_OPENMP)
/* A team thread's weight rows of out[m] = x[m] @ w.T (+ bias) for every m < M. GGUF blocks: the rows as
   rounded in q (wslm_gguf_quant, per bytes apart), every row met by each chunk of blocks; other kinds: row by
   row through team_linear. The split is by weight rows, so each row's bits are the one-row step's. */
static void NAME(team_linear_m)(const wslm_linear *l, const T *x, T *out, long M, const char *q, size_t per, int t,
                                int nt, void *scratch, uint16_t *xb, uint16_t *ob) {
    if (l->kind != LIN_GGUF) {
        for (long m = 0; m < M; m++) NAME(team_linear)(l, x + m * l->k, out + m * l->n, t, nt, scratch, xb, ob);
        return;
    }
    long n0, n1;
    team_rows(l, t, nt, &n0, &n1);
    if (n0 >= n1) return;
    wslm_gguf_rows_q(l->w, q, per, M, out, ACT_BF16, n0, n1);
    if (l->bias) {
        const T *b = (const T *)l->bias;
        for (long m = 0; m < M; m++)
            for (long i = n0; i < n1; i++) out[m * l->n + i] = ST(LD(out[m * l->n + i]) + LD(b[i]));
    }
}

/* rows [m0, m1) of x (l->k apart) rounded into q for l's product (GGUF blocks only) */
static void NAME(team_quant)(const wslm_linear *l, const T *x, char *q, size_t per, long m0, long m1) {
    if (l->kind == LIN_GGUF)
        for (long m = m0; m < m1; m++) wslm_gguf_quant(l->w, x + m * l->k, ACT_BF16, q + per * (size_t)m);
}

/* The verification step with threads: one parallel region (one wake-up a step, where a region per product
   woke the sleeping threads ~120 times a step of the demo), barriers between the phases; the rows' norms,
   rotary and KV writes split by row, attention by (row, key/value head) (its stretches in turn, merged as
   every path merges them), the products by weight rows. */
static int NAME(rows_team)(const wslm_layer *layers, long n_layers, long d, long heads, long kvh, long hd,
                           T *hidden, T *residual, const T *cos2, const T *sin2, const int32_t *tables,
                           long table_stride, long bs, const int64_t *lens, long len, const int64_t *slots, long M,
                           int threads) {
    if (!NAME(team_takes)(layers, n_layers)) return -2;  /* every kind known before the team starts */
    if (M > 16) return -2;
    long qkv_n, gu_n, widest = NAME(widest)(layers, n_layers, &qkv_n, &gu_n);
    long q_size = heads * hd, group = heads / kvh;
    size_t per = wslm_gguf_xq_size(widest);
    size_t acts = sizeof(T) * (size_t)M * (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2);
    acts = (acts + 63) & ~(size_t)63;
    size_t shared = acts + per * (size_t)M + sizeof(uint16_t) * (size_t)widest;
    size_t own = ROW_SCRATCH_BYTES(widest) + sizeof(float) * (size_t)ATT_WORK_FLOATS(group, len, hd)
                 + sizeof(uint16_t) * (size_t)widest;
    own = (own + 63) & ~(size_t)63;
    shared = (shared + 63) & ~(size_t)63;
    char *mem = (char *)aligned_alloc(64, shared + own * (size_t)threads);
    if (!mem) return -1;
    T *x = (T *)mem, *qkv = x + M * d, *att = qkv + M * qkv_n, *gu = att + M * q_size, *act = gu + M * gu_n;
    char *q = mem + acts;
    uint16_t *ob = (uint16_t *)(q + per * (size_t)M);
    team_bar bar = {0, 0, 1};
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads(), sense = 0;
#pragma omp single
        bar.n = nt;  /* (the implied barrier publishes it) */
        char *mine = mem + shared + own * (size_t)t;
        void *scratch = mine;
        float *work = (float *)(mine + ROW_SCRATCH_BYTES(widest));
        uint16_t *xb = (uint16_t *)(work + ATT_WORK_FLOATS(group, len, hd));
        long m0 = M * t / nt, m1 = M * (t + 1) / nt, units = M * kvh, u0 = units * t / nt, u1 = units * (t + 1) / nt;
        for (long li = 0; li < n_layers; li++) {
            const wslm_layer *l = layers + li;
            long qn = l->qkv.n, gn = l->gate_up.n, inter = gn / 2;
            for (long m = m0; m < m1; m++)
                NAME(add_norm)(li, hidden + m * d, residual + m * d, (const T *)l->w_in, l->eps_in, d, x + m * d);
            NAME(team_quant)(&l->qkv, x, q, per, m0, m1);
            team_wait(&bar, &sense);
            NAME(team_linear_m)(&l->qkv, x, qkv, M, q, per, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            for (long m = m0; m < m1; m++)  /* every row's key and value in the cache before any row attends */
                NAME(rope_store)(l, qkv + m * qn, heads, kvh, hd, cos2 + m * hd, sin2 + m * hd, slots[m]);
            team_wait(&bar, &sense);
            for (long u = u0; u < u1; u++) {
                long m = u / kvh, kh = u % kvh;
                NAME(attend_head)(qkv + m * qn, l, kh, group, kvh, hd, tables + m * table_stride, bs, lens[m],
                                  att + m * q_size, work, work + group * len + hd);
            }
            team_wait(&bar, &sense);
            NAME(team_quant)(&l->o, att, q, per, m0, m1);
            team_wait(&bar, &sense);
            NAME(team_linear_m)(&l->o, att, hidden, M, q, per, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            for (long m = m0; m < m1; m++)
                NAME(add_norm)(1, hidden + m * d, residual + m * d, (const T *)l->w_post, l->eps_post, d, x + m * d);
            NAME(team_quant)(&l->gate_up, x, q, per, m0, m1);
            team_wait(&bar, &sense);
            NAME(team_linear_m)(&l->gate_up, x, gu, M, q, per, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
            for (long m = m0; m < m1; m++) NAME(silu_mul)(gu + m * gn, act + m * inter, inter, 0, inter);
            NAME(team_quant)(&l->down, act, q, per, m0, m1);
            team_wait(&bar, &sense);
            NAME(team_linear_m)(&l->down, act, hidden, M, q, per, t, nt, scratch, xb, ob);
            team_wait(&bar, &sense);
        }
    }
    free(mem);
    return 0;
}
#endif

/* hidden, residual [M, d]; cos2/sin2 [M, hd]; slots [M]. Row m attends to the first lens[m] keys of the
   sequence whose block table is tables + m * table_stride: the rows of one sequence (a verification step: the
   same table, lens one apart) or of several (a batch of decodes), each written to the cache before any
   attends. threads: more than one runs the step as a team (rows_team); one thread runs each product for all
   rows (GGUF blocks read once), the rest row by row. Returns as ENTRY. */
int ENTRY_ROWS(const wslm_layer *layers, int64_t n_layers, int64_t d, int64_t heads, int64_t kvh, int64_t hd,
               T *hidden, T *residual, const T *cos2, const T *sin2, const int32_t *tables, int64_t table_stride,
               int64_t bs, const int64_t *lens, const int64_t *slots, int64_t M, int threads) {
    long q_size = heads * hd, group = heads / kvh, len = 0;
    if (group > 64 || M < 1 || has_moe(layers, n_layers)) return -2;  /* experts: rows one at a time (caller) */
    for (long m = 0; m < M; m++) {
        if (lens[m] < 1) return -2;
        len = max_l(len, lens[m]);
    }
#if defined(_OPENMP)
    if (threads > 1 && M > 1)
        return NAME(rows_team)(layers, n_layers, d, heads, kvh, hd, hidden, residual, cos2, sin2, tables, table_stride,
                               bs, lens, len, slots, M, threads);
#endif
    long qkv_n, gu_n, widest = NAME(widest)(layers, n_layers, &qkv_n, &gu_n);
    size_t elems = (size_t)M * (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2);
    T *x = (T *)malloc(sizeof(T) * elems);
    float *f = (float *)malloc(sizeof(float) * (size_t)ATT_WORK_FLOATS(group, len, hd));
    uint16_t *xb = ACT_BF16 ? NULL : (uint16_t *)malloc(sizeof(uint16_t) * 2 * (size_t)widest);
    if (!x || !f || (!ACT_BF16 && !xb)) { free(x); free(f); free(xb); return -1; }
    uint16_t *ob = xb ? xb + widest : NULL;
    T *qkv = x + M * d, *att = qkv + M * qkv_n, *gu = att + M * q_size, *act = gu + M * gu_n;
    int rc = 0;
    for (long li = 0; li < n_layers && rc == 0; li++) {
        const wslm_layer *l = layers + li;
        long qn = l->qkv.n, gn = l->gate_up.n, inter = gn / 2;
        for (long m = 0; m < M; m++)
            NAME(add_norm)(li, hidden + m * d, residual + m * d, (const T *)l->w_in, l->eps_in, d, x + m * d);
        if ((rc = NAME(linear_m)(&l->qkv, x, qkv, M, threads, xb, ob))) break;
        for (long m = 0; m < M; m++)  /* every row's key and value in the cache before any row attends */
            NAME(rope_store)(l, qkv + m * qn, heads, kvh, hd, cos2 + m * hd, sin2 + m * hd, slots[m]);
        for (long m = 0; m < M; m++)
            NAME(attend)(qkv + m * qn, l, heads, kvh, hd, tables + m * table_stride, bs, lens[m], att + m * q_size, f);
        if ((rc = NAME(linear_m)(&l->o, att, hidden, M, threads, xb, ob))) break;
        for (long m = 0; m < M; m++)
            NAME(add_norm)(1, hidden + m * d, residual + m * d, (const T *)l->w_post, l->eps_post, d, x + m * d);
        if ((rc = NAME(linear_m)(&l->gate_up, x, gu, M, threads, xb, ob))) break;
        for (long m = 0; m < M; m++) NAME(silu_mul)(gu + m * gn, act + m * inter, inter, 0, inter);
        rc = NAME(linear_m)(&l->down, act, hidden, M, threads, xb, ob);
    }
    free(x);
    free(f);
    free(xb);
    return rc;
}
