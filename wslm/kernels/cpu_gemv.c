/* int8 / int4 weight-only matrix products for a few activation rows (decode) on CPU; built by cpu_gemv.py.

   out[m, n] = bf16(scale[n] * sum_k x[m, k] * w[n, k]), fp32 accumulation: the math of
   aten._weight_int8pack_mm, which expands and multiplies one weight row at a time and stalls on memory
   (the demo's 49152x576 lm_head: 2.6-3.5 ms a call on one Xeon core once the layers' weights have pushed
   it out of cache; this loop, which asks for rows a few ahead, 1.4 ms). Each block of weight rows is read
   once for all activation rows. Built on the user's machine with -march=native: AVX-512 and AVX2 get
   intrinsics, anything else the plain loop. */
#include "cpu_kernels.h"


#define ROWS 4     /* weight rows per inner loop */
#define AHEAD 8    /* prefetch this many row groups ahead: hardware prefetch alone leaves the loop waiting */
#define MAXM 4     /* activation rows per pass: 4 x 4 accumulators stay in registers */

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOADX(p) _mm512_loadu_ps(p)
#define VLOADW(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOADX(p) _mm256_loadu_ps(p)
#define VLOADW(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
#define LANES 1
typedef float vec;
#define VZERO() 0.0f
#define VLOADX(p) (*(p))
#define VLOADW(p) ((float)*(p))
#define VFMA(a, b, c) ((a) * (b) + (c))
static inline float vsum(vec v) { return v; }
#endif


/* rows [n, n + ROWS) of w against activation rows [m0, m0 + mc) (mc <= MAXM) */
static inline void block(const float *xf, long m0, long mc, const int8_t *w, long n, long K,
                         const uint16_t *scale, uint16_t *out, float *outf, long N) {
    vec acc[MAXM][ROWS];
    for (long r = 0; r < MAXM; r++)
        for (long j = 0; j < ROWS; j++) acc[r][j] = VZERO();
    const int8_t *w0 = w + n * K;
    for (long k = 0; k < K; k += LANES) {
        vec wv[ROWS];
        for (long j = 0; j < ROWS; j++) wv[j] = VLOADW(w0 + j * K + k);
        for (long r = 0; r < MAXM; r++) {
            if (r >= mc) break;
            vec xv = VLOADX(xf + (m0 + r) * K + k);
            for (long j = 0; j < ROWS; j++) acc[r][j] = VFMA(xv, wv[j], acc[r][j]);
        }
    }
    for (long r = 0; r < mc; r++)
        for (long j = 0; j < ROWS; j++) {
            float v = vsum(acc[r][j]) * bf2f(scale[n + j]);
            if (outf) outf[(m0 + r) * N + n + j] = v;
            else out[(m0 + r) * N + n + j] = f2bf(v);
        }
}

#if defined(__AVX512BF16__)
/* Several activation rows with AVX512-BF16: the block's ROWS weight rows widened to bf16 once (int8 is
   exact in bf16) into wb, then 32 products an instruction for every activation row: the int8 -> float
   conversions, which the loop above repeats for each MAXM rows, are paid once. Products exact, fp32 sums
   in another order than torch's (a bf16 rounding apart at most). */
static void block_bf16(const uint16_t *x, long M, const int8_t *w, long n, long K, const uint16_t *scale,
                       uint16_t *out, float *outf, long N, uint16_t *wb) {
    for (long j = 0; j < ROWS; j++)
        for (long k = 0; k < K; k += 32) {
            const int8_t *src = w + (n + j) * K + k;
            __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src)));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 16))));
            _mm512_storeu_si512(wb + j * K + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    for (long m0 = 0; m0 < M; m0 += MAXM) {
        long mc = M - m0 < MAXM ? M - m0 : MAXM;
        __m512 acc[MAXM][ROWS];
        for (long r = 0; r < MAXM; r++)
            for (long j = 0; j < ROWS; j++) acc[r][j] = _mm512_setzero_ps();
        for (long k = 0; k < K; k += 32) {
            __m512bh wv[ROWS];
            for (long j = 0; j < ROWS; j++) wv[j] = (__m512bh)_mm512_loadu_si512(wb + j * K + k);
            for (long r = 0; r < mc; r++) {
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + r) * K + k);
                for (long j = 0; j < ROWS; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[j], xv);
            }
        }
        for (long r = 0; r < mc; r++)
            for (long j = 0; j < ROWS; j++) {
                float v = _mm512_reduce_add_ps(acc[r][j]) * bf2f(scale[n + j]);
                if (outf) outf[(m0 + r) * N + n + j] = v;
                else out[(m0 + r) * N + n + j] = f2bf(v);
            }
    }
}
#endif

static void rows_range(const uint16_t *x, const float *xf, long M, const int8_t *w, const uint16_t *scale,
                       uint16_t *out, float *outf, long N, long K, long n0, long n1) {
#if defined(__AVX512BF16__)
    uint16_t *wb = (M > 1 && K % 32 == 0) ? (uint16_t *)malloc(sizeof(uint16_t) * ROWS * (size_t)K) : NULL;
#endif
    for (long n = n0; n < n1; n += ROWS) {
        const char *ahead = (const char *)(w + (n + AHEAD * ROWS) * K);
        if (n + AHEAD * ROWS < N)
            for (long p = 0; p < ROWS * K; p += 64) prefetch(ahead + p);
#if defined(__AVX512BF16__)
        if (wb) { block_bf16(x, M, w, n, K, scale, out, outf, N, wb); continue; }
#endif
        for (long m0 = 0; m0 < M; m0 += MAXM)
            block(xf, m0, M - m0 < MAXM ? M - m0 : MAXM, w, n, K, scale, out, outf, N);
    }
#if defined(__AVX512BF16__)
    free(wb);
#endif
    (void)x;
}

static int int8_mm(const uint16_t *x, long M, const int8_t *w, const uint16_t *scale, uint16_t *out, float *outf,
                   long N, long K, int threads) {
    float *xf = (float *)malloc(sizeof(float) * (size_t)(M * K));
    if (!xf) return -1;
    for (long i = 0; i < M * K; i++) xf[i] = bf2f(x[i]);
    long chunks = N / ROWS;
#if defined(_OPENMP)
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            long c0 = chunks * t / nt, c1 = chunks * (t + 1) / nt;
            rows_range(x, xf, M, w, scale, out, outf, N, K, c0 * ROWS, c1 * ROWS);
        }
        free(xf);
        return 0;
    }
#endif
    (void)threads;
    rows_range(x, xf, M, w, scale, out, outf, N, K, 0, chunks * ROWS);
    free(xf);
    return 0;
}

/* x [M, K] bf16, w [N, K] int8, scale [N] bf16 -> out [M, N] bf16. N % 4 == 0 and K % 16 == 0 (the
   caller checks). Returns 0, or -1 when memory for the fp32 copy of x could not be had. */
int wslm_int8_mm_bf16(const uint16_t *x, long M, const int8_t *w, const uint16_t *scale, uint16_t *out,
                      long N, long K, int threads) {
    return int8_mm(x, M, w, scale, out, NULL, N, K, threads);
}

/* the same with out [M, N] float32, unrounded: an LM head's logits (rounding them to bf16 alone moved the
   demo's next-token distributions by a mean KL of 0.0004 nats, docs/benchmarks.md) */
int wslm_int8_mm_f32(const uint16_t *x, long M, const int8_t *w, const uint16_t *scale, float *out,
                     long N, long K, int threads) {
    return int8_mm(x, M, w, scale, NULL, out, N, K, threads);
}

/* ---- int4, torch's CPU pack (aten._convert_weight_to_int4pack_for_cpu) ----------------------------
   packed [N / BN, K, BN / 2] bytes, BN = 64 where torch runs AVX-512 code and 32 where it runs AVX2: byte
   (b, k, j) holds q[BN b + j, k] in its low nibble and q[BN b + BN/2 + j, k] in its high one; sz [K / G, N, 2]
   bf16 (scale, zero): w[n, k] = (q - 8) * scale + zero, per group of G columns. Per group:
   out += scale * sum(x q) + (zero - 8 scale) * sum(x): the q sums in fp32, as
   aten._weight_int4pack_mm_for_cpu does. */

#ifndef INT4_AHEAD
#define INT4_AHEAD 2048
#endif
static void int4_blocks(const float *xf, const float *xsum, const uint8_t *packed, const uint16_t *sz,
                        uint16_t *out, long N, long K, long G, long BN, long b0, long b1) {
    const long half = BN / 2;
    for (long b = b0; b < b1; b++) {
        const uint8_t *p = packed + b * K * half;
        float acc[64];
        for (int j = 0; j < BN; j++) acc[j] = 0.0f;
        for (long g = 0; g < K / G; g++) {
            if (g + 2 < K / G)
                for (int l = 0; l < BN / 16; l++) prefetch(sz + ((g + 2) * N + b * BN) * 2 + l * 32);
            float s[64];
#if defined(__AVX512F__)
            if (BN == 64) {
                __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
                const __m256i low = _mm256_set1_epi8(0x0f);
                for (long k = g * G; k < (g + 1) * G; k++) {
                    if (k % 2 == 0) prefetch(p + k * 32 + INT4_AHEAD);
                    __m256i v = _mm256_loadu_si256((const __m256i *)(p + k * 32));
                    __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    __m512 xv = _mm512_set1_ps(xf[k]);
                    s0 = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(lo))), s0);
                    s1 = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(lo, 1))), s1);
                    s2 = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(hi))), s2);
                    s3 = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(hi, 1))), s3);
                }
                _mm512_storeu_ps(s, s0); _mm512_storeu_ps(s + 16, s1); _mm512_storeu_ps(s + 32, s2); _mm512_storeu_ps(s + 48, s3);
            } else
#endif
            {
                for (int j = 0; j < BN; j++) s[j] = 0.0f;
                for (long k = g * G; k < (g + 1) * G; k++) {
                    const uint8_t *v = p + k * half;
                    float xv = xf[k];
                    for (int j = 0; j < half; j++) s[j] += xv * (float)(v[j] & 15);
                    for (int j = 0; j < half; j++) s[half + j] += xv * (float)(v[j] >> 4);
                }
            }
            const uint16_t *z = sz + (g * N + b * BN) * 2;
            for (int j = 0; j < BN; j++) {
                float scale = bf2f(z[2 * j]), zero = bf2f(z[2 * j + 1]);
                acc[j] += scale * s[j] + (zero - 8.0f * scale) * xsum[g];
            }
        }
        for (int j = 0; j < BN; j++) out[b * BN + j] = f2bf(acc[j]);
    }
}

/* one activation row: x [K] bf16 -> out [N] bf16; N % BN == 0, K % G == 0, BN 64 or 32 (the caller checks) */
int wslm_int4_mv_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                      long N, long K, long G, long BN, int threads) {
    float *xf = (float *)malloc(sizeof(float) * (size_t)(K + K / G));
    if (!xf) return -1;
    float *xsum = xf + K;
    for (long g = 0; g < K / G; g++) {
        float t = 0.0f;
        for (long k = g * G; k < (g + 1) * G; k++) { xf[k] = bf2f(x[k]); t += xf[k]; }
        xsum[g] = t;
    }
    long blocks = N / BN;
#if defined(_OPENMP)
    if (threads > 1 && blocks > 1) {
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int4_blocks(xf, xsum, packed, sz, out, N, K, G, BN, blocks * t / nt, blocks * (t + 1) / nt);
        }
        free(xf);
        return 0;
    }
#endif
    int4_blocks(xf, xsum, packed, sz, out, N, K, G, BN, 0, blocks);
    free(xf);
    return 0;
}

/* ---- int4 x int8: the activation quantized per 32 columns (llama.cpp's Q8 blocks) ---------------------
   The fp32 loop above turns every nibble into a float before its multiply-add: ~4 instructions for 16
   products, so it runs at ~20 G products/s on a core and a decode step waits on arithmetic, not memory.
   Here the row x is rounded to int8 with one scale per 32 columns, and an int8 dot product instruction
   multiplies 4 nibbles by 4 int8 values and sums them in one lane. The weight is still read in place:
   shuffles gather the 4 columns of a lane from torch's pack (32 bytes a column). The result is the exact
   product of the dequantized weight with the int8-rounded row (what llama.cpp computes for its Q4 formats),
   not torch's: outputs differ from it by about a bf16 rounding. The integer sums are exact, and the loops
   below apply the scales in the same order, so an AVX2 machine gets the AVX-512 one's bits. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
#define Q8_512 1
/* vpermt2b's two index vectors: lane l of the first gathers byte l of 4 consecutive columns (rows 0-15 of
   the block in its low nibbles), of the second byte 16 + l (rows 16-31) */
static inline void q8_idx_512(__m512i *idx0, __m512i *idx1) {
    int8_t i0[64], i1[64];
    for (int l = 0; l < 16; l++)
        for (int t = 0; t < 4; t++) { i0[4 * l + t] = (int8_t)(t * 32 + l); i1[4 * l + t] = (int8_t)(t * 32 + 16 + l); }
    *idx0 = _mm512_loadu_si512(i0);
    *idx1 = _mm512_loadu_si512(i1);
}

/* 8 columns of a 64-row block (256 bytes at q) as 8 vectors of 4-column lanes: w[0-3] columns 0-3 (rows
   0-15, 16-31, 32-47, 48-63), w[4-7] columns 4-7 */
static inline void q8_unpack_512(const uint8_t *q, __m512i idx0, __m512i idx1, __m512i *w) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int l = 0; l < 256; l += 64) prefetch(q + INT4_AHEAD + l);
    for (int h = 0; h < 2; h++) {
        __m512i A = _mm512_loadu_si512(q + 128 * h), B = _mm512_loadu_si512(q + 128 * h + 64);
        __m512i P0 = _mm512_permutex2var_epi8(A, idx0, B), P1 = _mm512_permutex2var_epi8(A, idx1, B);
        w[4 * h] = _mm512_and_si512(P0, low);
        w[4 * h + 1] = _mm512_and_si512(P1, low);
        w[4 * h + 2] = _mm512_and_si512(_mm512_srli_epi16(P0, 4), low);
        w[4 * h + 3] = _mm512_and_si512(_mm512_srli_epi16(P1, 4), low);
    }
}

/* the 16 (scale, zero) pairs of rows 16 i .. 16 i + 15 at z: s = scale, zc = zero - 8 scale */
static inline void q8_pairs_512(const uint16_t *z, int i, __m512 *s, __m512 *zc) {
    __m512i pair = _mm512_loadu_si512(z + 32 * i);
    *s = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
    __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32((int)0xffff0000u)));
    *zc = _mm512_fnmadd_ps(*s, _mm512_set1_ps(8.0f), zero);
}

/* f += sum * scale * d + (zero - 8 scale) * m: the order every q8 loop applies them in */
static inline __m512 q8_update_512(__m512 f, __m512i sum, __m512 s, __m512 zc, __m512 d, __m512 m) {
    f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(s, d), f);
    return _mm512_fmadd_ps(zc, m, f);
}

/* vpermt2b gathers 4 columns per lane in one shuffle; vpdpbusd: 64 products an instruction */
static void q8_blocks_512(const int8_t *xq, const float *xd, const float *xs, const uint8_t *packed,
                          const uint16_t *sz, uint16_t *out, long N, long K, long G, long b0, long b1) {
    __m512i idx0, idx1;
    q8_idx_512(&idx0, &idx1);
    for (long b = b0; b < b1; b++) {
        const uint8_t *p = packed + b * K * 32;
        __m512 f[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (long c = 0; c < K / 32; c++) {
            __m512i a[4], e[4];
            for (int i = 0; i < 4; i++) a[i] = e[i] = _mm512_setzero_si512();
            for (long k = c * 32; k < c * 32 + 32; k += 8) {
                __m512i w[8];
                q8_unpack_512(p + k * 32, idx0, idx1, w);
                int32_t x0, x1;
                memcpy(&x0, xq + k, 4);
                memcpy(&x1, xq + k + 4, 4);
                __m512i xa = _mm512_set1_epi32(x0), xb = _mm512_set1_epi32(x1);
                for (int i = 0; i < 4; i++) {
                    a[i] = _mm512_dpbusd_epi32(a[i], w[i], xa);
                    e[i] = _mm512_dpbusd_epi32(e[i], w[4 + i], xb);
                }
            }
            const uint16_t *z = sz + ((c * 32 / G) * N + b * 64) * 2;
            __m512 d = _mm512_set1_ps(xd[c]), m = _mm512_set1_ps(xs[c]);
            for (int i = 0; i < 4; i++) {
                __m512 s, zc;
                q8_pairs_512(z, i, &s, &zc);
                f[i] = q8_update_512(f[i], _mm512_add_epi32(a[i], e[i]), s, zc, d, m);
            }
        }
        float r[64];
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(r + 16 * i, f[i]);
        for (int j = 0; j < 64; j++) out[b * 64 + j] = f2bf(r[j]);
    }
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define Q8_256 1
/* 4 unsigned nibbles times 4 int8 values, summed into each 32-bit lane: one instruction with VNNI
   (AVX-512's, or AVX-VNNI on Alder Lake and later), else maddubs + madd, as llama.cpp does */
static inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, w, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

/* the (scale, zero) pairs of rows r0..r0+3 and r0+h..r0+h+3 at z, in the lane order of the loops below:
   s = scale, zc = zero - 8 scale */
static inline void q8_pairs_256(const uint16_t *z, long r0, long h, __m256 *s, __m256 *zc) {
    __m256i pair = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(z + 2 * r0))),
                                           _mm_loadu_si128((const __m128i *)(z + 2 * (r0 + h))), 1);
    *s = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
    __m256 zero = _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32((int)0xffff0000u)));
    *zc = _mm256_fnmadd_ps(*s, _mm256_set1_ps(8.0f), zero);
}

/* f += sum * scale * d + (zero - 8 scale) * m: the order every q8 loop applies them in */
static inline __m256 q8_update_256(__m256 f, __m256i sum, __m256 s, __m256 zc, __m256 d, __m256 m) {
    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(s, d), f);
    return _mm256_fmadd_ps(zc, m, f);
}

static inline __m256 q8_scale(__m256 f, __m256i sum, const uint16_t *z, long r0, long h, __m256 d, __m256 m) {
    __m256 s, zc;
    q8_pairs_256(z, r0, h, &s, &zc);
    return q8_update_256(f, sum, s, zc, d, m);
}

/* The AVX2 pack (32-row blocks, 16 bytes a column): two loads hold 4 columns; byte unpacks and a lane swap
   put columns (k, k+2, k+1, k+3) of one row in each 32-bit lane, so xp is the row in that order. Lane l of
   u0 is row l (l < 4) or 8 + l - 4, of u1 row 4 + l or 12 + l - 4; high nibbles the same + 16: w[i] has
   rows q8_row0_32(i) .. + 3 and + 8 .. + 11. */
static inline long q8_row0_32(int i) { return (i & 1) * 4 + (i >> 1) * 16; }

static inline void q8_unpack_256_32(const uint8_t *q, __m256i *w) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    prefetch(q + INT4_AHEAD);
    __m256i A = _mm256_loadu_si256((const __m256i *)q), B = _mm256_loadu_si256((const __m256i *)(q + 32));
    __m256i t0 = _mm256_unpacklo_epi8(A, B), t1 = _mm256_unpackhi_epi8(A, B);
    __m256i s0 = _mm256_permute2x128_si256(t0, t1, 0x20), s1 = _mm256_permute2x128_si256(t0, t1, 0x31);
    __m256i u0 = _mm256_unpacklo_epi16(s0, s1), u1 = _mm256_unpackhi_epi16(s0, s1);
    w[0] = _mm256_and_si256(u0, low);
    w[1] = _mm256_and_si256(u1, low);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(u0, 4), low);
    w[3] = _mm256_and_si256(_mm256_srli_epi16(u1, 4), low);
}

/* a block's 32 sums, in the lanes' order (r: 4 vectors of 8), to bf16 rows of out */
static inline void q8_store_256_32(const float *r, uint16_t *out) {
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 4; l++) {
            out[q8_row0_32(i) + l] = f2bf(r[8 * i + l]);
            out[q8_row0_32(i) + 8 + l] = f2bf(r[8 * i + 4 + l]);
        }
}

static void q8_blocks_256_32(const int8_t *xp, const float *xd, const float *xs, const uint8_t *packed,
                             const uint16_t *sz, uint16_t *out, long N, long K, long G, long b0, long b1) {
    for (long b = b0; b < b1; b++) {
        const uint8_t *p = packed + b * K * 16;
        __m256 f[4];
        for (int i = 0; i < 4; i++) f[i] = _mm256_setzero_ps();
        for (long c = 0; c < K / 32; c++) {
            __m256i a[4];
            for (int i = 0; i < 4; i++) a[i] = _mm256_setzero_si256();
            for (long k = c * 32; k < c * 32 + 32; k += 4) {
                __m256i w[4];
                q8_unpack_256_32(p + k * 16, w);
                int32_t x4;
                memcpy(&x4, xp + k, 4);
                __m256i xv = _mm256_set1_epi32(x4);
                for (int i = 0; i < 4; i++) a[i] = dot4(a[i], w[i], xv);
            }
            const uint16_t *z = sz + ((c * 32 / G) * N + b * 32) * 2;
            __m256 d = _mm256_set1_ps(xd[c]), m = _mm256_set1_ps(xs[c]);
            for (int i = 0; i < 4; i++) f[i] = q8_scale(f[i], a[i], z, q8_row0_32(i), 8, d, m);
        }
        float r[32];
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(r + 8 * i, f[i]);
        q8_store_256_32(r, out + b * 32);
    }
}
#endif

#if defined(Q8_256) && !defined(Q8_512)
/* The AVX-512 pack (64-row blocks) on a build without VBMI: byte unpacks interleave 4 columns per 32-bit
   lane: lane l of u[i] holds row 4i + l (l < 4) or 16 + 4i + l - 4 (l >= 4) of the low nibbles, the same
   + 32 of the high ones. */
static void q8_blocks_256_64(const int8_t *xq, const float *xd, const float *xs, const uint8_t *packed,
                             const uint16_t *sz, uint16_t *out, long N, long K, long G, long b0, long b1) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (long b = b0; b < b1; b++) {
        const uint8_t *p = packed + b * K * 32;
        __m256 f[8];
        for (int i = 0; i < 8; i++) f[i] = _mm256_setzero_ps();
        for (long c = 0; c < K / 32; c++) {
            __m256i a[8];  /* 0-3: low nibbles (rows 0-31), 4-7: high (rows 32-63) */
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_si256();
            for (long k = c * 32; k < c * 32 + 32; k += 4) {
                const uint8_t *q = p + k * 32;
                prefetch(q + INT4_AHEAD);
                prefetch(q + INT4_AHEAD + 64);
                __m256i c0 = _mm256_loadu_si256((const __m256i *)q), c1 = _mm256_loadu_si256((const __m256i *)(q + 32));
                __m256i c2 = _mm256_loadu_si256((const __m256i *)(q + 64)), c3 = _mm256_loadu_si256((const __m256i *)(q + 96));
                __m256i t0 = _mm256_unpacklo_epi8(c0, c1), t1 = _mm256_unpackhi_epi8(c0, c1);
                __m256i t2 = _mm256_unpacklo_epi8(c2, c3), t3 = _mm256_unpackhi_epi8(c2, c3);
                __m256i u[4] = {_mm256_unpacklo_epi16(t0, t2), _mm256_unpackhi_epi16(t0, t2),
                                _mm256_unpacklo_epi16(t1, t3), _mm256_unpackhi_epi16(t1, t3)};
                int32_t x4;
                memcpy(&x4, xq + k, 4);
                __m256i xv = _mm256_set1_epi32(x4);
                for (int i = 0; i < 4; i++) {
                    a[i] = dot4(a[i], _mm256_and_si256(u[i], low), xv);
                    a[4 + i] = dot4(a[4 + i], _mm256_and_si256(_mm256_srli_epi16(u[i], 4), low), xv);
                }
            }
            const uint16_t *z = sz + ((c * 32 / G) * N + b * 64) * 2;
            __m256 d = _mm256_set1_ps(xd[c]), m = _mm256_set1_ps(xs[c]);
            for (int i = 0; i < 8; i++) f[i] = q8_scale(f[i], a[i], z, (i & 3) * 4 + (i >> 2) * 32, 16, d, m);
        }
        for (int i = 0; i < 8; i++) {
            float r[8];
            long r0 = (i & 3) * 4 + (i >> 2) * 32;
            _mm256_storeu_ps(r, f[i]);
            for (int l = 0; l < 4; l++) {
                out[b * 64 + r0 + l] = f2bf(r[l]);
                out[b * 64 + r0 + 16 + l] = f2bf(r[4 + l]);
            }
        }
    }
}
#endif

/* 512 or 256 where wslm_int4_mv_q8 has its int8 loop here (AVX-512 VBMI + VNNI, or AVX2), else 0 (it runs
   the fp32 one) */
int wslm_int4_q8_native(void) {
#if defined(Q8_512)
    return 512;
#elif defined(Q8_256)
    return 256;
#else
    return 0;
#endif
}

#if defined(Q8_256)
typedef void (*q8_fn)(const int8_t *, const float *, const float *, const uint8_t *, const uint16_t *, uint16_t *,
                      long, long, long, long, long);
#endif

/* ---- many rows: each 32-column chunk of a weight block unpacked once (into wb, in L1), then every row's
   products read it: the shuffles and nibble splits, ~2/3 of the one-row loop's instructions, are paid once
   for all rows. Per row the integer sums and the order of the float updates are the one-row loop's, so
   each row gets the bits it gets alone. facc: M x BN floats of running sums. */
#if defined(Q8_512)
static void q8_many_512(const int8_t *xq, const float *xd, const float *xs, long M, const uint8_t *packed,
                        const uint16_t *sz, uint16_t *out, long N, long K, long G, long b, __m512i *wb,
                        float *facc) {
    __m512i idx0, idx1;
    q8_idx_512(&idx0, &idx1);
    const uint8_t *p = packed + b * K * 32;
    for (long i = 0; i < M * 64; i++) facc[i] = 0.0f;
    for (long c = 0; c < K / 32; c++) {
        for (int j = 0; j < 4; j++) q8_unpack_512(p + (c * 32 + 8 * j) * 32, idx0, idx1, wb + 8 * j);
        const uint16_t *z = sz + ((c * 32 / G) * N + b * 64) * 2;
        __m512 s[4], zc[4];
        for (int i = 0; i < 4; i++) q8_pairs_512(z, i, &s[i], &zc[i]);
        for (long m = 0; m < M; m++) {
            const int8_t *xm = xq + m * K + c * 32;
            __m512i a[4], e[4];
            for (int i = 0; i < 4; i++) a[i] = e[i] = _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) {
                int32_t x0, x1;
                memcpy(&x0, xm + 8 * j, 4);
                memcpy(&x1, xm + 8 * j + 4, 4);
                __m512i xa = _mm512_set1_epi32(x0), xb = _mm512_set1_epi32(x1);
                const __m512i *w = wb + 8 * j;
                for (int i = 0; i < 4; i++) {
                    a[i] = _mm512_dpbusd_epi32(a[i], w[i], xa);
                    e[i] = _mm512_dpbusd_epi32(e[i], w[4 + i], xb);
                }
            }
            __m512 d = _mm512_set1_ps(xd[m * (K / 32) + c]), mm = _mm512_set1_ps(xs[m * (K / 32) + c]);
            float *f = facc + m * 64;
            for (int i = 0; i < 4; i++)
                _mm512_storeu_ps(f + 16 * i, q8_update_512(_mm512_loadu_ps(f + 16 * i), _mm512_add_epi32(a[i], e[i]),
                                                           s[i], zc[i], d, mm));
        }
    }
    for (long m = 0; m < M; m++)
        for (int j = 0; j < 64; j++) out[m * N + b * 64 + j] = f2bf(facc[m * 64 + j]);
}
#endif

#if defined(Q8_256)
/* The AVX2 pack (32-row blocks): per 4 columns the 4 vectors q8_blocks_256_32 builds, in wb[4 j ..] */
static void q8_many_256_32(const int8_t *xp, const float *xd, const float *xs, long M, const uint8_t *packed,
                           const uint16_t *sz, uint16_t *out, long N, long K, long G, long b, __m256i *wb,
                           float *facc) {
    const uint8_t *p = packed + b * K * 16;
    for (long i = 0; i < M * 32; i++) facc[i] = 0.0f;
    for (long c = 0; c < K / 32; c++) {
        for (int j = 0; j < 8; j++) q8_unpack_256_32(p + (c * 32 + 4 * j) * 16, wb + 4 * j);
        const uint16_t *z = sz + ((c * 32 / G) * N + b * 32) * 2;
        __m256 s[4], zc[4];
        for (int i = 0; i < 4; i++) q8_pairs_256(z, q8_row0_32(i), 8, &s[i], &zc[i]);
        for (long m = 0; m < M; m++) {
            const int8_t *xm = xp + m * K + c * 32;
            __m256i a[4];
            for (int i = 0; i < 4; i++) a[i] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                int32_t x4;
                memcpy(&x4, xm + 4 * j, 4);
                __m256i xv = _mm256_set1_epi32(x4);
                for (int i = 0; i < 4; i++) a[i] = dot4(a[i], wb[4 * j + i], xv);
            }
            __m256 d = _mm256_set1_ps(xd[m * (K / 32) + c]), mm = _mm256_set1_ps(xs[m * (K / 32) + c]);
            float *f = facc + m * 32;
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(f + 8 * i, q8_update_256(_mm256_loadu_ps(f + 8 * i), a[i], s[i], zc[i], d, mm));
        }
    }
    for (long m = 0; m < M; m++) q8_store_256_32(facc + m * 32, out + m * N + b * 32);
}
#endif

#if defined(Q8_256)
/* x [M, K] bf16 rounded to int8 per 32 columns: xq [M, K] (xp: the same in q8_blocks_256_32's column order),
   xd, xs [M, K / 32] (scale, scale * sum of the codes) */
static void q8_rows(const uint16_t *x, long M, long K, int8_t *xq, int8_t *xp, float *xd, float *xs) {
    long nb = K / 32;
    for (long c = 0; c < M * nb; c++) {
        float v[32], amax = 0.0f;
        for (int i = 0; i < 32; i++) { v[i] = bf2f(x[c * 32 + i]); float av = v[i] < 0 ? -v[i] : v[i]; if (av > amax) amax = av; }
        float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            float t = v[i] * inv;
            int qi = (int)(t >= 0.0f ? t + 0.5f : t - 0.5f);
            xq[c * 32 + i] = (int8_t)qi;
            sum += qi;
        }
        xd[c] = d;
        xs[c] = d * (float)sum;
    }
    for (long k = 0; k < M * K; k += 4) {
        xp[k] = xq[k]; xp[k + 1] = xq[k + 2]; xp[k + 2] = xq[k + 1]; xp[k + 3] = xq[k + 3];
    }
}
#endif

/* activation rows x [M, K] bf16 -> out [M, N] bf16, each row rounded to int8 per 32 columns (the same bits
   as M calls for one row); N % BN == 0, K % G == 0, G % 32 == 0, BN 64 or 32 (the caller checks). Each
   block of weight rows is read once for all M rows (it stays in L1 while they pass); torch's kernel runs
   one row at a time over the whole weight. Without AVX2: wslm_int4_mv_bf16 row by row. */
int wslm_int4_mm_q8(const uint16_t *x, long M, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                    long N, long K, long G, long BN, int threads) {
#if defined(Q8_256)
    long nb = K / 32;
    float *xd = (float *)malloc(sizeof(float) * 2 * (size_t)(M * nb) + 2 * (size_t)(M * K));
    if (!xd) return -1;
    float *xs = xd + M * nb;
    int8_t *xq = (int8_t *)(xs + M * nb), *xp = xq + M * K;
    q8_rows(x, M, K, xq, xp, xd, xs);
    q8_fn fn = q8_blocks_256_32;
    const int8_t *xa = xp;
    if (BN != 32) {
#if defined(Q8_512)
        fn = q8_blocks_512;
#else
        fn = q8_blocks_256_64;
#endif
        xa = xq;
    }
    long blocks = N / BN;
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads) if (threads > 1 && blocks > 1)
#endif
    {
        int t = 0, nt = 1;
#if defined(_OPENMP)
        t = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
        long b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
        /* unpacked chunk (32 zmm / 32 ymm) and the rows' running sums */
        void *wb = M > 1 ? aligned_alloc(64, 2048 + sizeof(float) * 64 * (size_t)M) : NULL;
        float *facc = wb ? (float *)((char *)wb + 2048) : NULL;
        for (long b = b0; b < b1; b++) {
#if defined(Q8_512)
            if (wb && BN == 64) { q8_many_512(xq, xd, xs, M, packed, sz, out, N, K, G, b, (__m512i *)wb, facc); continue; }
#endif
            if (wb && BN == 32) { q8_many_256_32(xp, xd, xs, M, packed, sz, out, N, K, G, b, (__m256i *)wb, facc); continue; }
            for (long m = 0; m < M; m++)
                fn(xa + m * K, xd + m * nb, xs + m * nb, packed, sz, out + m * N, N, K, G, b, b + 1);
        }
        free(wb);
    }
    free(xd);
    return 0;
#else
    for (long m = 0; m < M; m++) {
        int rc = wslm_int4_mv_bf16(x + m * K, packed, sz, out + m * N, N, K, G, BN, threads);
        if (rc) return rc;
    }
    return 0;
#endif
}

/* one activation row x [K] bf16 -> out [N] bf16: wslm_int4_mm_q8 with M = 1 */
int wslm_int4_mv_q8(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                    long N, long K, long G, long BN, int threads) {
    return wslm_int4_mm_q8(x, 1, packed, sz, out, N, K, G, BN, threads);
}

/* ---- one team's share: rows [n0, n1) of a one-row product, with no threads of its own ---------------
   cpu_layer.c runs a whole decode step in one parallel region (one wake-up of the other threads a step
   instead of one per product); each thread computes its rows with these. n0, n1: multiples of BN (int4)
   or of ROWS (int8). scratch: ROW_SCRATCH_BYTES(K) bytes of the caller's, per thread. The bits are the
   whole call's: the row is rounded the same way by every thread, and a row's sums do not depend on the
   split. */
int wslm_int4_mv_q8_rows(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                         long N, long K, long G, long BN, long n0, long n1, void *scratch) {
#if defined(Q8_256)
    long nb = K / 32;
    float *xd = (float *)scratch, *xs = xd + nb;
    int8_t *xq = (int8_t *)(xs + nb), *xp = xq + K;
    q8_rows(x, 1, K, xq, xp, xd, xs);
    if (BN == 32) { q8_blocks_256_32(xp, xd, xs, packed, sz, out, N, K, G, n0 / BN, n1 / BN); return 0; }
#if defined(Q8_512)
    q8_blocks_512(xq, xd, xs, packed, sz, out, N, K, G, n0 / BN, n1 / BN);
#else
    q8_blocks_256_64(xq, xd, xs, packed, sz, out, N, K, G, n0 / BN, n1 / BN);
#endif
    return 0;
#else
    float *xf = (float *)scratch, *xsum = xf + K;
    for (long g = 0; g < K / G; g++) {
        float t = 0.0f;
        for (long k = g * G; k < (g + 1) * G; k++) { xf[k] = bf2f(x[k]); t += xf[k]; }
        xsum[g] = t;
    }
    int4_blocks(xf, xsum, packed, sz, out, N, K, G, BN, n0 / BN, n1 / BN);
    return 0;
#endif
}

int wslm_int8_mv_rows(const uint16_t *x, const int8_t *w, const uint16_t *scale, uint16_t *out, long N, long K,
                      long n0, long n1, void *scratch) {
    float *xf = (float *)scratch;
    for (long i = 0; i < K; i++) xf[i] = bf2f(x[i]);
    rows_range(x, xf, 1, w, scale, out, NULL, N, K, n0, n1);
    return 0;
}
