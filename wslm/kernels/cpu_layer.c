/* One sequence's decode step through every layer of a Llama-shaped model in one call (platforms/cpu/decode_native.py).

   A lone chat on CPU is the desktop app's everyday case, and there a step is overhead: the layers of the
   demo model do ~110 MFLOP of int4 products (~3.5 ms on one core in wslm_int4_mv_q8) while ~20 torch ops
   per layer (or inductor's graph) add another 5-7 ms of dispatch and cache misses. Here one C loop runs
   norm, q|k|v, q/k norm, rotary, the KV write, paged attention, o, norm, gate|up, SiLU and down for every
   layer, rounding as the torch ops of platforms/cpu/decode_math.py do (each op's result in the model's dtype, sums inside
   an op in fp32), so it agrees with that path to the products' rounding.

   Two builds of the step (cpu_layer_body.h): bf16 activations and KV cache (wslm_decode_row), and float32
   ones (wslm_decode_row_f32) for the float32 engine dtype=auto picks on CPUs without bf16 arithmetic
   (AVX2-only desktops); there int4/int8 products still take bf16 rows, as the torch path converts them. */
#include "cpu_kernels.h"
#include <sched.h>

enum { LIN_INT4 = 1, LIN_INT8 = 2, LIN_BF16 = 3, LIN_F32 = 4, LIN_GGUF = 5 };

typedef struct {
    int64_t kind;
    const void *w;           /* int4: torch's CPU pack; int8: [N, K]; bf16 / f32: [N, K] dense; gguf: the
                                parts' struct (cpu_gguf.c's wslm_gguf: blocks in the mapped file) */
    const uint16_t *scales;  /* int4: [K/G, N, 2] bf16 (scale, zero); int8: [N] bf16; dense: unused */
    const void *bias;        /* [N] in the activations' dtype, or NULL: added to the rounded product */
    int64_t n, k, group;
    int64_t block;           /* int4: rows per pack block (64 or 32, as torch packed it) */
} wslm_linear;

/* A sparse mixture-of-experts MLP (Qwen3-MoE's, layers/moe.py): the router's softmax picks top_k experts,
   each a SiLU-gated MLP; their outputs, weighted, summed */
typedef struct {
    wslm_linear router;          /* [experts, d] dense, the activations' dtype */
    const wslm_linear *gate_up;  /* [experts]: each expert's gate rows then up rows */
    const wslm_linear *down;     /* [experts] */
    int64_t experts, top_k, norm_topk;
} wslm_moe;

typedef struct {
    const void *w_in, *w_post;  /* [d], the activations' dtype */
    const void *qk_norm;        /* [heads + kv_heads, hd] (q weights, then k weights), or NULL */
    double eps_in, eps_post, qk_eps, scale;
    wslm_linear qkv, o, gate_up, down;  /* gate_up / down unused where moe is set */
    void *k_cache, *v_cache;    /* this layer's pool: [slots, kv_heads, hd] */
    const wslm_moe *moe;        /* the MLP is this mixture of experts, or NULL */
} wslm_layer;

static int has_moe(const wslm_layer *layers, long n_layers) {
    for (long i = 0; i < n_layers; i++)
        if (layers[i].moe) return 1;
    return 0;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline __m256 bf8(const uint16_t *p) {  /* 8 bf16 -> fp32 */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#endif
#if defined(__AVX512F__)
static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

/* sum a[i] * b[i], a bf16, b fp32 */
static inline float dot_bf16(const uint16_t *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(bf16x16(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(bf8(a + i), _mm256_loadu_ps(b + i), acc);
    s = hsum8(acc);
#endif
    for (; i < n; i++) s += bf2f(a[i]) * b[i];
    return s;
}

/* sum a[i] * b[i] in fp32 */
static inline float dot_f32(const float *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = hsum8(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* bf16 [N, K] times one row, fp32 sums (as torch's bf16 GEMV), four weight rows at a time so that the
   multiply-adds do not wait on each other; AVX512-BF16 multiplies 32 pairs an instruction where K % 32 == 0
   there, any K in the plain loop. */
#ifndef DENSE_AHEAD
#define DENSE_AHEAD 16  /* rows: a memory latency's worth of the loop ahead */
#endif
static void dense_rows_bf16(const void *xv, const void *wv, void *ov, long K, long n0, long n1) {
    const uint16_t *x = (const uint16_t *)xv, *w = (const uint16_t *)wv;
    uint16_t *out = (uint16_t *)ov;
    long n = n0;
#if defined(__AVX512BF16__)
    for (; K % 32 == 0 && n + 4 <= n1; n += 4) {
        if (n + DENSE_AHEAD + 4 <= n1)
            for (long p = 0; p < 4 * K * 2; p += 64) prefetch((const char *)(w + (n + DENSE_AHEAD) * K) + p);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (long k = 0; k < K; k += 32) {
            __m512bh xb = (__m512bh)_mm512_loadu_si512(x + k);
            for (int j = 0; j < 4; j++)
                acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(w + (n + j) * K + k), xb);
        }
        for (int j = 0; j < 4; j++) out[n + j] = f2bf(_mm512_reduce_add_ps(acc[j]));
    }
#endif
    if (n >= n1) return;
    float *xf = (float *)malloc(sizeof(float) * (size_t)K);
    if (!xf) { for (; n < n1; n++) out[n] = 0; return; }
    for (long k = 0; k < K; k++) xf[k] = bf2f(x[k]);
    for (; n < n1; n++) {
        if (n + DENSE_AHEAD < n1)
            for (long p = 0; p < K * 2; p += 64) prefetch((const char *)(w + (n + DENSE_AHEAD) * K) + p);
        out[n] = f2bf(dot_bf16(w + n * K, xf, K));
    }
    free(xf);
}

/* float32 [N, K] times one row (a float32 engine's dense weights) */
static void dense_rows_f32(const void *xv, const void *wv, void *ov, long K, long n0, long n1) {
    const float *x = (const float *)xv, *w = (const float *)wv;
    float *out = (float *)ov;
    for (long n = n0; n < n1; n++) {
        if (n + DENSE_AHEAD / 2 < n1)
            for (long p = 0; p < K * 4; p += 64) prefetch((const char *)(w + (n + DENSE_AHEAD / 2) * K) + p);
        out[n] = dot_f32(w + n * K, x, K);
    }
}

typedef void (*rows_fn)(const void *, const void *, void *, long, long, long);

static void dense(rows_fn fn, const void *x, const void *w, void *out, long N, long K, int threads) {
#if defined(_OPENMP)
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            long quads = (N + 3) / 4, a = quads * t / nt * 4, b = quads * (t + 1) / nt * 4;
            fn(x, w, out, K, a, b < N ? b : N);
        }
        return;
    }
#endif
    (void)threads;
    fn(x, w, out, K, 0, N);
}

/* the bf16 row products both builds share (x and out bf16) */
static int linear_bf16_rows(const wslm_linear *l, const uint16_t *x, uint16_t *out, int threads) {
    if (l->kind == LIN_INT4)  /* what Int4Weight.kernel().mm runs for one row (cpu_gemv.int4_mv) */
        return wslm_int4_mv_q8(x, (const uint8_t *)l->w, l->scales, out, l->n, l->k, l->group, l->block, threads);
    if (l->kind == LIN_INT8)
        return wslm_int8_mm_bf16(x, 1, (const int8_t *)l->w, l->scales, out, l->n, l->k, threads);
    if (l->kind == LIN_GGUF) return wslm_gguf_mm(l->w, x, 1, 1, out, 1, threads);
    return -2;
}

#if defined(__AVX512F__)
/* e^x for 16 lanes: 2^(x log2 e) split into 2^n and a degree-6 polynomial of 2^f, f in [-0.5, 0.5]:
   within ~2 ulp of expf, and 0 below -87 (softmax subtracts the max first, so x <= 0) */
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
#elif defined(__AVX2__) && defined(__FMA__)
/* the same for 8 lanes; 2^n built in the exponent bits (n in [-126, 0] here) */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
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
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps(), m = _mm256_set1_ps(top);
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), m));
        _mm256_storeu_ps(sc + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    total = hsum8(acc);
#endif
    for (; i < n; i++) { sc[i] = expf(sc[i] - top); total += sc[i]; }
    return total;
}

static long max_l(long a, long b) { return a > b ? a : b; }
static float max_f(float a, float b) { return a > b ? a : b; }

/* Attention over a long context runs in stretches of ATT_STRETCH keys, each kept unnormalised with its
   top score and merged after (flash-decoding), so a team can share one head's keys. The stretches follow
   from the context length alone, never from the thread count: one thread, a team of any size and a
   verification step's rows sum a token's attention in the same order, and a greedy answer does not change
   with the threads a step happened to run on. */
#ifndef ATT_STRETCH
#define ATT_STRETCH 256
#endif
#define ATT_MAX_STRETCHES 64
/* keys a stretch: ATT_STRETCH, or more (a multiple of 16) past ATT_MAX_STRETCHES of them. A multiple of 16
   so that only the last stretch leaves a remainder to the softmax's vector loop (and each starts a block). */
static long att_span(long len) {
    long span = ATT_STRETCH;
    if (len > span * ATT_MAX_STRETCHES) span = ((len + ATT_MAX_STRETCHES - 1) / ATT_MAX_STRETCHES + 15) / 16 * 16;
    return span;
}
static long att_stretches(long len) {
    long span = att_span(len), s = (len + span - 1) / span;
    return s < 1 ? 1 : s;
}
/* the keys [*ta, *tb) of stretch c: every path takes its bounds from here (the same bits depend on it) */
static void att_stretch(long len, long c, long *ta, long *tb) {
    long span = att_span(len);
    *ta = c * span;
    *tb = c == att_stretches(len) - 1 ? len : (c + 1) * span;
}
/* the scratch floats one thread's attention takes (attend_head: scores and a value row, the stretches' parts) */
#define ATT_WORK_FLOATS(group, len, hd) ((group) * (len) + (hd) + ATT_MAX_STRETCHES * (group) * ((hd) + 2))

/* ---- a team: every thread of the step in one parallel region ----------------------------------------
   With OMP_WAIT_POLICY=PASSIVE (wslm's default: a server's other threads need the cores too) each
   `omp parallel` wakes the sleeping threads through the kernel, ~20-60 us, and a step of a small model has
   ~120 products: a second thread cost more than it gave (docs/benchmarks.md). So a step with threads runs
   as one region: one wake-up a step, and between its phases a barrier that spins, briefly, as llama.cpp's
   threads do, then yields the core (a busy machine: the thread it waits for may need it). */
#if defined(_OPENMP)

typedef struct {
    int count, sense, n;
} team_bar;

#ifndef TEAM_SPINS
#define TEAM_SPINS 20000
#endif
static void team_wait(team_bar *b, int *sense) {
    int s = !*sense;
    *sense = s;
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->sense, s, __ATOMIC_RELEASE);
        return;
    }
    for (long spins = 0; __atomic_load_n(&b->sense, __ATOMIC_ACQUIRE) != s; spins++) {
        if (spins < TEAM_SPINS) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else
            sched_yield();
    }
}

/* the rows [*n0, *n1) of an n-row product that thread t of nt computes: whole pack blocks for int4, whole
   groups of 4 otherwise (the kernels' units), the last thread taking any rest */
static void team_rows(const wslm_linear *l, int t, int nt, long *n0, long *n1) {
    long unit = l->kind == LIN_INT4 ? l->block : 4, units = l->n / unit;  /* gguf: any rows; 4 as int8 */
    *n0 = units * t / nt * unit;
    *n1 = t == nt - 1 ? l->n : units * (t + 1) / nt * unit;
}

/* rows [n0, n1) of a bf16 product: x, out bf16; scratch: ROW_SCRATCH_BYTES(k) */
static int team_bf16_rows(const wslm_linear *l, const uint16_t *x, uint16_t *out, long n0, long n1, void *scratch) {
    if (n0 >= n1) return 0;
    if (l->kind == LIN_INT4)
        return wslm_int4_mv_q8_rows(x, (const uint8_t *)l->w, l->scales, out, l->n, l->k, l->group, l->block, n0, n1,
                                    scratch);
    if (l->kind == LIN_INT8)
        return wslm_int8_mv_rows(x, (const int8_t *)l->w, l->scales, out, l->n, l->k, n0, n1, scratch);
    if (l->kind == LIN_BF16) { dense_rows_bf16(x, l->w, out, l->k, n0, n1); return 0; }
    if (l->kind == LIN_GGUF) return wslm_gguf_rows(l->w, x, 1, out, 1, n0, n1, scratch);
    return -2;
}
#endif

/* The step in bf16: every op's result rounded to bf16, as the bf16 torch ops round theirs. */
#define ACT_BF16 1
#define T uint16_t
#define LD(v) bf2f(v)
#define ST(f) f2bf(f)
#define RND(f) rbf(f)
#define NAME(n) n##_bf16
#define ENTRY wslm_decode_row
#define ENTRY_ROWS wslm_decode_rows
#include "cpu_layer_body.h"
#undef ACT_BF16
#undef T
#undef LD
#undef ST
#undef RND
#undef NAME
#undef ENTRY
#undef ENTRY_ROWS

/* The step in float32. */
#define ACT_BF16 0
#define T float
#define LD(v) (v)
#define ST(f) (f)
#define RND(f) (f)
#define NAME(n) n##_f32
#define ENTRY wslm_decode_row_f32
#define ENTRY_ROWS wslm_decode_rows_f32
#include "cpu_layer_body.h"
