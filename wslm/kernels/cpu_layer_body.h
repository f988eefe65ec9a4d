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

/* softmax(q k^T * scale) v for one new token over the len keys of its sequence (paged, block by block).
   The q heads that share a key/value head are done together, so each key and value row is read (and
   converted) once. work: group * (len + hd) + hd floats. */
static void NAME(attend)(const T *q, const wslm_layer *l, long heads, long kvh, long hd, const int32_t *table,
                         long bs, long len, T *out, float *work) {
    long group = heads / kvh, row = kvh * hd;
    float *scores = work, *acc = work + group * len, *vf = acc + group * hd, scale = (float)l->scale;
    const T *kc = (const T *)l->k_cache, *vc = (const T *)l->v_cache;
    for (long kh = 0; kh < kvh; kh++) {
        const T *qh = q + kh * group * hd;  /* q heads kh * group ... are this key head's */
        for (long t0 = 0; t0 < len; t0 += bs) {
            const T *kp = kc + (long)table[t0 / bs] * bs * row + kh * hd;
            for (long t = t0; t < t0 + bs && t < len; t++, kp += row)
                for (long g = 0; g < group; g++) scores[g * len + t] = NAME(dot_qk)(kp, qh + g * hd, hd) * scale;
        }
        float sum[64];  /* group <= 64 (the caller checks) */
        for (long g = 0; g < group; g++) {
            float *sc = scores + g * len, top = -INFINITY;
            for (long t = 0; t < len; t++) top = sc[t] > top ? sc[t] : top;
            sum[g] = exp_shifted(sc, len, top);
        }
        for (long i = 0; i < group * hd; i++) acc[i] = 0.0f;
        for (long t0 = 0; t0 < len; t0 += bs) {
            const T *vp = vc + (long)table[t0 / bs] * bs * row + kh * hd;
            for (long t = t0; t < t0 + bs && t < len; t++, vp += row) {
                NAME(to_f32)(vp, vf, hd);
                for (long g = 0; g < group; g++) {
                    float p = scores[g * len + t], *a = acc + g * hd;
                    for (long i = 0; i < hd; i++) a[i] += p * vf[i];
                }
            }
        }
        for (long g = 0; g < group; g++)
            for (long i = 0; i < hd; i++) out[(kh * group + g) * hd + i] = ST(acc[g * hd + i] / sum[g]);
    }
}

/* hidden [d]: the token's embedding in; out: the last layer's output, and residual [d] the stream before
   it (the caller adds them for the final norm). cos2/sin2 [hd]: this position's rotary rows; table: the
   sequence's block table; len: its tokens including this one, whose key and value go to slot.
   Returns 0; -1 out of memory; -2 a weight kind it does not know or a head layout it does not take. */
int ENTRY(const wslm_layer *layers, int64_t n_layers, int64_t d, int64_t heads, int64_t kvh, int64_t hd,
          T *hidden, T *residual, const T *cos2, const T *sin2, const int32_t *table, int64_t bs, int64_t len,
          int64_t slot, int threads) {
    long qkv_n = 0, gu_n = 0, widest = 0;
    for (long i = 0; i < n_layers; i++) {
        const wslm_linear *ls[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up, &layers[i].down};
        qkv_n = max_l(qkv_n, layers[i].qkv.n);
        gu_n = max_l(gu_n, layers[i].gate_up.n);
        for (int j = 0; j < 4; j++) widest = max_l(widest, max_l(ls[j]->n, ls[j]->k));
    }
    long q_size = heads * hd, kv_size = kvh * hd, group = heads / kvh;
    if (group > 64) return -2;
    size_t elems = (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2);
    T *x = (T *)malloc(sizeof(T) * elems);
    float *f = (float *)malloc(sizeof(float) * (size_t)(group * (len + hd) + hd));
    uint16_t *xb = ACT_BF16 ? NULL : (uint16_t *)malloc(sizeof(uint16_t) * 2 * (size_t)widest);
    if (!x || !f || (!ACT_BF16 && !xb)) { free(x); free(f); free(xb); return -1; }
    uint16_t *ob = xb ? xb + widest : NULL;
    T *qkv = x + d, *att = qkv + qkv_n, *gu = att + q_size, *act = gu + gu_n;
    int rc = 0;
    for (long li = 0; li < n_layers && rc == 0; li++) {
        const wslm_layer *l = layers + li;
        if (li == 0) memcpy(residual, hidden, sizeof(T) * (size_t)d);
        else for (long i = 0; i < d; i++) residual[i] = ST(LD(hidden[i]) + LD(residual[i]));
        NAME(rms_norm)(residual, (const T *)l->w_in, l->eps_in, d, x);
        if ((rc = NAME(linear)(&l->qkv, x, qkv, threads, xb, ob))) break;
        if (l->qk_norm)
            for (long r = 0; r < heads + kvh; r++)
                NAME(rms_norm)(qkv + r * hd, (const T *)l->qk_norm + r * hd, l->qk_eps, hd, qkv + r * hd);
        NAME(rotate)(qkv, heads + kvh, hd, cos2, sin2);
        memcpy((T *)l->k_cache + slot * kv_size, qkv + q_size, sizeof(T) * (size_t)kv_size);
        memcpy((T *)l->v_cache + slot * kv_size, qkv + q_size + kv_size, sizeof(T) * (size_t)kv_size);
        NAME(attend)(qkv, l, heads, kvh, hd, table, bs, len, att, f);
        if ((rc = NAME(linear)(&l->o, att, hidden, threads, xb, ob))) break;
        for (long i = 0; i < d; i++) residual[i] = ST(LD(hidden[i]) + LD(residual[i]));
        NAME(rms_norm)(residual, (const T *)l->w_post, l->eps_post, d, x);
        if ((rc = NAME(linear)(&l->gate_up, x, gu, threads, xb, ob))) break;
        long inter = l->gate_up.n / 2;
        for (long i = 0; i < inter; i++) {
            float g = LD(gu[i]);
            act[i] = ST(RND(g / (1.0f + expf(-g))) * LD(gu[inter + i]));
        }
        rc = NAME(linear)(&l->down, act, hidden, threads, xb, ob);
    }
    free(x);
    free(f);
    free(xb);
    return rc;
}
