/* One sequence's decode step through every layer of a Llama-shaped model in one call (cpu_native.py).

   A lone chat on CPU is the desktop app's everyday case, and there a step is overhead: the layers of the
   demo model do ~110 MFLOP of int4 products (~3.5 ms on one core in wslm_int4_mv_q8) while ~20 torch ops
   per layer (or inductor's graph) add another 5-7 ms of dispatch and cache misses. Here one C loop runs
   norm, q|k|v, q/k norm, rotary, the KV write, paged attention, o, norm, gate|up, SiLU and down for every
   layer, with the same bf16 roundings as the torch ops of cpu_decode.py (each op's result rounded to bf16,
   sums inside an op in fp32), so it agrees with that path to the products' rounding. */
#include "cpu_kernels.h"

enum { LIN_INT4 = 1, LIN_INT8 = 2, LIN_BF16 = 3 };

typedef struct {
    int64_t kind;
    const void *w;           /* int4: torch's CPU pack; int8 and bf16: [N, K] */
    const uint16_t *scales;  /* int4: [K/G, N, 2] (scale, zero); int8: [N]; bf16: unused */
    const uint16_t *bias;    /* [N] or NULL: added to the rounded product, as a torch add after it */
    int64_t n, k, group;
} wslm_linear;

typedef struct {
    const uint16_t *w_in, *w_post;  /* [d] */
    const uint16_t *qk_norm;        /* [heads + kv_heads, hd] (q weights, then k weights), or NULL */
    double eps_in, eps_post, qk_eps, scale;
    wslm_linear qkv, o, gate_up, down;
    uint16_t *k_cache, *v_cache;    /* this layer's pool: [slots, kv_heads, hd] */
} wslm_layer;

static inline float dot_bf16(const uint16_t *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 av = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + i))), 16));
        acc = _mm512_fmadd_ps(av, _mm512_loadu_ps(b + i), acc);
    }
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) s += bf2f(a[i]) * b[i];
    return s;
}

/* bf16 [N, K] times one row, fp32 sums (as torch's bf16 GEMV), four weight rows at a time so that the
   multiply-adds do not wait on each other; AVX512-BF16 multiplies 32 pairs an instruction where K % 32 == 0
   there, any K in the plain loop. */
#ifndef DENSE_AHEAD
#define DENSE_AHEAD 16  /* rows: a memory latency's worth of the loop ahead */
#endif
static void dense_rows(const uint16_t *x, const uint16_t *w, uint16_t *out, long K, long n0, long n1) {
    long n = n0;
#if defined(__AVX512BF16__)
    for (; K % 32 == 0 && n + 4 <= n1; n += 4) {
        if (n + DENSE_AHEAD + 4 <= n1)
            for (long p = 0; p < 4 * K * 2; p += 64) prefetch((const char *)(w + (n + DENSE_AHEAD) * K) + p);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (long k = 0; k < K; k += 32) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
            for (int j = 0; j < 4; j++)
                acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(w + (n + j) * K + k), xv);
        }
        for (int j = 0; j < 4; j++) out[n + j] = f2bf(_mm512_reduce_add_ps(acc[j]));
    }
#endif
    if (n >= n1) return;
    float *xf = (float *)malloc(sizeof(float) * (size_t)K);
    if (!xf) { for (; n < n1; n++) out[n] = 0; return; }
    for (long k = 0; k < K; k++) xf[k] = bf2f(x[k]);
    for (; n < n1; n++) out[n] = f2bf(dot_bf16(w + n * K, xf, K));
    free(xf);
}

static int linear(const wslm_linear *l, const uint16_t *x, uint16_t *out, int threads) {
    int rc = 0;
    if (l->kind == LIN_INT4)  /* what Int4Weight.decode_rows runs for one row (cpu_gemv.int4_mv) */
        rc = wslm_int4_mv_q8(x, (const uint8_t *)l->w, l->scales, out, l->n, l->k, l->group, threads);
    else if (l->kind == LIN_INT8)
        rc = wslm_int8_mm_bf16(x, 1, (const int8_t *)l->w, l->scales, out, l->n, l->k, threads);
    else if (l->kind == LIN_BF16) {
#if defined(_OPENMP)
        if (threads > 1) {
#pragma omp parallel num_threads(threads)
            {
                int t = omp_get_thread_num(), nt = omp_get_num_threads();
                long quads = (l->n + 3) / 4, a = quads * t / nt * 4, b = quads * (t + 1) / nt * 4;
                dense_rows(x, (const uint16_t *)l->w, out, l->k, a, b < l->n ? b : l->n);
            }
        } else
#endif
            dense_rows(x, (const uint16_t *)l->w, out, l->k, 0, l->n);
    } else
        return -2;
    if (rc == 0 && l->bias)
        for (long i = 0; i < l->n; i++) out[i] = f2bf(bf2f(out[i]) + bf2f(l->bias[i]));
    return rc;
}

/* w * rms_norm(x): F.rms_norm's fp32 sum and bf16 result, then the bf16 multiply (in place is fine) */
static void rms_norm(const uint16_t *x, const uint16_t *w, double eps, long d, uint16_t *out) {
    float ss = 0.0f;
    for (long i = 0; i < d; i++) { float v = bf2f(x[i]); ss += v * v; }
    float r = 1.0f / sqrtf(ss / (float)d + (float)eps);
    for (long i = 0; i < d; i++) out[i] = f2bf(bf2f(w[i]) * rbf(bf2f(x[i]) * r));
}

/* neox rotary in place over rows of hd: x * [cos|cos] + [x2|x1] * [-sin|sin], products rounded first */
static void rotate(uint16_t *x, long rows, long hd, const uint16_t *cos2, const uint16_t *sin2) {
    long half = hd / 2;
    for (long r = 0; r < rows; r++) {
        uint16_t *v = x + r * hd;
        for (long i = 0; i < half; i++) {
            float a = bf2f(v[i]), b = bf2f(v[i + half]);
            float lo = rbf(a * bf2f(cos2[i])) + rbf(b * bf2f(sin2[i]));
            float hi = rbf(b * bf2f(cos2[i + half])) + rbf(a * bf2f(sin2[i + half]));
            v[i] = f2bf(lo);
            v[i + half] = f2bf(hi);
        }
    }
}

/* q . k for bf16 rows: AVX512-BF16 multiplies 32 pairs an instruction (products exact in fp32, as after a
   conversion), else both converted */
static inline float dot_bf16_bf16(const uint16_t *a, const uint16_t *b, long n) {
#if defined(__AVX512BF16__)
    if (n % 32 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (long i = 0; i < n; i += 32)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
        return _mm512_reduce_add_ps(acc);
    }
#endif
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += bf2f(a[i]) * bf2f(b[i]);
    return s;
}

#if defined(__AVX512F__)
/* e^x for 16 lanes: 2^(x log2 e) split into 2^n (scalef) and a degree-6 polynomial of 2^f, f in
   [-0.5, 0.5]: within ~2 ulp of expf, and 0 below -87 (softmax subtracts the max first, so x <= 0) */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

/* sc[i] = e^(sc[i] - top) in place; returns their sum */
static float exp_shifted(float *sc, long n, float top) {
    long i = 0;
    float total = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps(), m = _mm512_set1_ps(top);
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + i), m));
        _mm512_storeu_ps(sc + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    total = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++) { sc[i] = expf(sc[i] - top); total += sc[i]; }
    return total;
}

static inline void bf16_to_f32(const uint16_t *x, float *y, long n) {
    long i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i))), 16)));
#endif
    for (; i < n; i++) y[i] = bf2f(x[i]);
}

/* softmax(q k^T * scale) v for one new token over the len keys of its sequence (paged, block by block).
   The q heads that share a key/value head are done together, so each key and value row is read (and
   converted) once. work: group * (len + hd) + hd floats. */
static void attend(const uint16_t *q, const wslm_layer *l, long heads, long kvh, long hd, const int32_t *table,
                   long bs, long len, uint16_t *out, float *work) {
    long group = heads / kvh, row = kvh * hd;
    float *scores = work, *acc = work + group * len, *vf = acc + group * hd, scale = (float)l->scale;
    for (long kh = 0; kh < kvh; kh++) {
        const uint16_t *qh = q + kh * group * hd;  /* q heads kh * group ... are this key head's */
        for (long t0 = 0; t0 < len; t0 += bs) {
            const uint16_t *kp = l->k_cache + (long)table[t0 / bs] * bs * row + kh * hd;
            for (long t = t0; t < t0 + bs && t < len; t++, kp += row)
                for (long g = 0; g < group; g++) scores[g * len + t] = dot_bf16_bf16(kp, qh + g * hd, hd) * scale;
        }
        float sum[64];  /* group <= 64 (the caller checks) */
        for (long g = 0; g < group; g++) {
            float *sc = scores + g * len, top = -INFINITY;
            for (long t = 0; t < len; t++) top = sc[t] > top ? sc[t] : top;
            sum[g] = exp_shifted(sc, len, top);
        }
        for (long i = 0; i < group * hd; i++) acc[i] = 0.0f;
        for (long t0 = 0; t0 < len; t0 += bs) {
            const uint16_t *vp = l->v_cache + (long)table[t0 / bs] * bs * row + kh * hd;
            for (long t = t0; t < t0 + bs && t < len; t++, vp += row) {
                bf16_to_f32(vp, vf, hd);
                for (long g = 0; g < group; g++) {
                    float p = scores[g * len + t], *a = acc + g * hd;
                    for (long i = 0; i < hd; i++) a[i] += p * vf[i];
                }
            }
        }
        for (long g = 0; g < group; g++)
            for (long i = 0; i < hd; i++) out[(kh * group + g) * hd + i] = f2bf(acc[g * hd + i] / sum[g]);
    }
}

static long max_l(long a, long b) { return a > b ? a : b; }

/* hidden [d] bf16: the token's embedding in; out: the last layer's output, and residual [d] the stream
   before it (the caller adds them for the final norm). cos2/sin2 [hd]: this position's rotary rows; table:
   the sequence's block table; len: its tokens including this one, whose key and value go to slot.
   Returns 0; -1 out of memory; -2 a weight kind it does not know. */
int wslm_decode_row(const wslm_layer *layers, int64_t n_layers, int64_t d, int64_t heads, int64_t kvh, int64_t hd,
                    uint16_t *hidden, uint16_t *residual, const uint16_t *cos2, const uint16_t *sin2,
                    const int32_t *table, int64_t bs, int64_t len, int64_t slot, int threads) {
    long qkv_n = 0, gu_n = 0;
    for (long i = 0; i < n_layers; i++) {
        qkv_n = max_l(qkv_n, layers[i].qkv.n);
        gu_n = max_l(gu_n, layers[i].gate_up.n);
    }
    long q_size = heads * hd, kv_size = kvh * hd;
    size_t halves = (size_t)(d + qkv_n + q_size + gu_n + gu_n / 2);
    uint16_t *x = (uint16_t *)malloc(sizeof(uint16_t) * halves);
    long group = heads / kvh;
    if (group > 64) return -2;
    float *f = (float *)malloc(sizeof(float) * (size_t)(group * (len + hd) + hd));
    if (!x || !f) { free(x); free(f); return -1; }
    uint16_t *qkv = x + d, *att = qkv + qkv_n, *gu = att + q_size, *act = gu + gu_n;
    int rc = 0;
    for (long li = 0; li < n_layers && rc == 0; li++) {
        const wslm_layer *l = layers + li;
        if (li == 0) memcpy(residual, hidden, sizeof(uint16_t) * (size_t)d);
        else for (long i = 0; i < d; i++) residual[i] = f2bf(bf2f(hidden[i]) + bf2f(residual[i]));
        rms_norm(residual, l->w_in, l->eps_in, d, x);
        if ((rc = linear(&l->qkv, x, qkv, threads))) break;
        if (l->qk_norm)
            for (long r = 0; r < heads + kvh; r++) rms_norm(qkv + r * hd, l->qk_norm + r * hd, l->qk_eps, hd, qkv + r * hd);
        rotate(qkv, heads + kvh, hd, cos2, sin2);
        memcpy(l->k_cache + slot * kv_size, qkv + q_size, sizeof(uint16_t) * (size_t)kv_size);
        memcpy(l->v_cache + slot * kv_size, qkv + q_size + kv_size, sizeof(uint16_t) * (size_t)kv_size);
        attend(qkv, l, heads, kvh, hd, table, bs, len, att, f);
        if ((rc = linear(&l->o, att, hidden, threads))) break;
        for (long i = 0; i < d; i++) residual[i] = f2bf(bf2f(hidden[i]) + bf2f(residual[i]));
        rms_norm(residual, l->w_post, l->eps_post, d, x);
        if ((rc = linear(&l->gate_up, x, gu, threads))) break;
        long inter = l->gate_up.n / 2;
        for (long i = 0; i < inter; i++) {
            float g = bf2f(gu[i]);
            act[i] = f2bf(rbf(g / (1.0f + expf(-g))) * bf2f(gu[inter + i]));
        }
        rc = linear(&l->down, act, hidden, threads);
    }
    free(x);
    free(f);
    return rc;
}
