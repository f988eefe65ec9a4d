/* Shared by the CPU kernels built by cpu_gemv.py (cpu_gemv.c, cpu_layer.c, cpu_gguf.c, cpu_gguf_gemm.c): bf16
   conversions, the GGUF kernels' integer dot products and the entry points one file calls in the other. */
#ifndef WSLM_CPU_KERNELS_H
#define WSLM_CPU_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* The GGUF kernels' integer dot products (cpu_gguf.c, cpu_gguf_gemm.c). VNNI (AVX512-VNNI with VL, or
   AVX-VNNI): one instruction for maddubs + madd + add (DPBUSD), and for madd + add (MADD_ACC). The same
   integers either way: no int16 lane of maddubs saturates there (4- to 6-bit codes, or |w| <= 128, times int8
   activations of |x| <= 127: at most 2 * 128 * 127 < 32767), so a build's bits do not depend on it. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define GG_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define MADD_ACC(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define GG_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define MADD_ACC(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#elif defined(__AVX2__)
#define DPBUSD(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define MADD_ACC(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

static inline float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {  /* round to nearest even, as torch does (NaN stays NaN) */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float rbf(float f) { return bf2f(f2bf(f)); }  /* f as a bf16 op would leave it */

/* the fp16 value at p (GGUF block scales; cpu_gguf.c and cpu_gguf_gemm.c) */
static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {
        if (m == 0) u = s;
        else {  /* subnormal: normalise */
            e = 113;
            while (!(m & 1024)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 1023) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* the K-quants' 6-bit scale and minimum of sub-block j (llama.cpp's get_scale_min_k4; cpu_gguf.c and
   cpu_gguf_gemm.c) */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

static inline void prefetch(const void *p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 0, 3);
#endif
}

int wslm_int8_mm_bf16(const uint16_t *x, long M, const int8_t *w, const uint16_t *scale, uint16_t *out,
                      long N, long K, int threads);
int wslm_int4_mv_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                      long N, long K, long G, long BN, int threads);
int wslm_int4_mm_q8(const uint16_t *x, long M, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                    long N, long K, long G, long BN, int threads);
int wslm_int4_mv_q8(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                    long N, long K, long G, long BN, int threads);
/* a team thread's rows [n0, n1) of the one-row products above (cpu_gemv.c); scratch per thread */
#define ROW_SCRATCH_BYTES(K) ((size_t)(K) * 8 + 256)
int wslm_int4_mv_q8_rows(const uint16_t *x, const uint8_t *packed, const uint16_t *sz, uint16_t *out,
                         long N, long K, long G, long BN, long n0, long n1, void *scratch);
/* GGUF blocks in place (cpu_gguf.c); w: its wslm_gguf struct; x / out bf16 (1) or fp32 (0) */
int wslm_gguf_mm(const void *w, const void *x, long M, int x_bf16, void *out, int out_bf16, int threads);
int wslm_gguf_rows(const void *w, const void *x, int x_bf16, void *out, int out_bf16, long n0, long n1,
                   void *scratch);
size_t wslm_gguf_xq_size(long K);
void wslm_gguf_quant(const void *w, const void *x, int x_bf16, void *buf);
int wslm_gguf_rows_q(const void *w, const void *bufs, size_t per, long M, void *out, int out_bf16, long n0, long n1);
int wslm_int8_mv_rows(const uint16_t *x, const int8_t *w, const uint16_t *scale, uint16_t *out, long N, long K,
                      long n0, long n1, void *scratch);
#endif
