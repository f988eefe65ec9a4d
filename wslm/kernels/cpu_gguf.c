/* GGUF weights multiplied in the file's own block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K),
   read in place from the memory-mapped file; built with cpu_gemv.c by cpu_gemv.py, called through
   cpu_gguf.py and from cpu_layer.c's decode step.

   As llama.cpp does, each activation row is first rounded to int8: per 32 columns for the 32-column block
   types (one float scale and the block's code sum: "Q8_0 + sum"), per 256 columns for the K-quants (one
   float scale and the code sums of every 16 columns: "Q8_K"). A weight block's dot product with it is then
   integer arithmetic (AVX2: maddubs + madd, 32 products an instruction pair), and the block's scales and
   minimums are applied once per block or sub-block in fp32. The result is the exact product of the
   dequantized weight with the int8-rounded row, up to fp32 rounding of the per-block sums
   (tests/test_gguf_blocks.py checks every type against gguf-py's dequantization).

   A fused weight (q|k|v, gate|up) is a list of parts, each a [rows, bytes per row] array of blocks of one
   type (Q4_K_M files mix Q4_K and Q6_K inside one layer). `index`, when set, is the output position of
   every row: llama.cpp's converter stores the q/k rows of Llama-family models permuted, and rows kept in
   place in the mapped file cannot be reordered without copying them; writing each row's result to its
   HF position costs one indexed store per output value (see gguf_blocks.py for why not RoPE). */
#include "cpu_kernels.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

enum { GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8, GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14 };

#define GGUF_PARTS 4
typedef struct {
    int64_t parts;
    int64_t type[GGUF_PARTS];
    const uint8_t *data[GGUF_PARTS];  /* [rows, bytes per row] of blocks, in the file's layout */
    int64_t rows[GGUF_PARTS];
    const int32_t *index;             /* [n] output column of each row, or NULL (in order) */
    int64_t n, k;
} wslm_gguf;

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

/* ---- types ---------------------------------------------------------------------------------------- */
static long block_cols(long t) { return (t == GT_Q4_K || t == GT_Q5_K || t == GT_Q6_K) ? 256 : 32; }
static long block_bytes(long t) {
    switch (t) {
    case GT_Q4_0: return 18;
    case GT_Q4_1: return 20;
    case GT_Q5_0: return 22;
    case GT_Q5_1: return 24;
    case GT_Q8_0: return 34;
    case GT_Q4_K: return 144;
    case GT_Q5_K: return 176;
    case GT_Q6_K: return 210;
    default: return 0;
    }
}
static int is_k(long t) { return block_cols(t) == 256; }

/* 1 when this library multiplies blocks of ggml type t */
int wslm_gguf_takes(long t) { return block_bytes(t) > 0; }

/* ---- the activation row rounded to int8 --------------------------------------------------------------
   Q8_0 + sum (32 columns a block): q [K], d [K/32], s [K/32] = d * sum of the block's codes (for the
   types with a minimum, whose dot product needs sum(x)). Q8_K (256 columns): q [K], d [K/256],
   bsum [K/16] int16: the codes' sums per 16 columns (the K-quants' sub-block minimums and Q6_K's -32). */
typedef struct {
    int8_t *q32, *q256;
    float *d32, *s32, *d256;
    int16_t *bsum;
    int32_t *sum32;
} xq_t;

static inline float x_at(const void *x, int bf16, long i) {
    return bf16 ? bf2f(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

static inline int round_i(float v) { return (int)(v >= 0.0f ? v + 0.5f : v - 0.5f); }

static void quantize_run(const void *x, int bf16, long k0, long n, int8_t *q, float *d) {
    float amax = 0.0f;
    for (long i = 0; i < n; i++) { float a = fabsf(x_at(x, bf16, k0 + i)); amax = a > amax ? a : amax; }
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    for (long i = 0; i < n; i++) q[i] = (int8_t)round_i(x_at(x, bf16, k0 + i) * inv);
}

static void quantize_x(const void *x, int bf16, long K, int need32, int need256, xq_t *o) {
    if (need32)
        for (long b = 0; b < K / 32; b++) {
            quantize_run(x, bf16, b * 32, 32, o->q32 + b * 32, o->d32 + b);
            int s = 0;
            for (int i = 0; i < 32; i++) s += o->q32[b * 32 + i];
            o->sum32[b] = s;
            o->s32[b] = o->d32[b] * (float)s;
        }
    if (need256)
        for (long b = 0; b < K / 256; b++) {
            quantize_run(x, bf16, b * 256, 256, o->q256 + b * 256, o->d256 + b);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += o->q256[b * 256 + g * 16 + i];
                o->bsum[b * 16 + g] = (int16_t)s;
            }
        }
}

/* bytes quantize_x needs for one row of K (both forms) */
static size_t xq_bytes(long K) {
    return (size_t)K * 2 + sizeof(float) * (size_t)(K / 32 * 2 + K / 256 + 1) + sizeof(int16_t) * (size_t)(K / 16)
           + sizeof(int32_t) * (size_t)(K / 32) + 64;
}

static void xq_carve(void *mem, long K, xq_t *o) {
    char *p = (char *)mem;
    o->d32 = (float *)p; p += sizeof(float) * (size_t)(K / 32);
    o->s32 = (float *)p; p += sizeof(float) * (size_t)(K / 32);
    o->d256 = (float *)p; p += sizeof(float) * (size_t)(K / 256 + 1);
    o->sum32 = (int32_t *)p; p += sizeof(int32_t) * (size_t)(K / 32);
    o->bsum = (int16_t *)p; p += sizeof(int16_t) * (size_t)(K / 16);
    o->q32 = (int8_t *)p; p += K;
    o->q256 = (int8_t *)p;
}

/* the K-quants' 6-bit scale and minimum of sub-block j (llama.cpp's get_scale_min_k4) */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

/* ---- one weight row . one rounded activation row, per type ------------------------------------------ */
#if defined(__AVX2__) && defined(__FMA__)
#define GG_AVX2 1
static inline __m256i dot_us(__m256i u, __m256i s) {  /* 8 lanes, each the sum of 4 u8 * s8 products */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
static inline __m256i dot_ss(__m256i a, __m256i b) {  /* s8 * s8 the same way: |a| times b with a's sign */
    return dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* 16 bytes of nibbles as 32 bytes: low nibbles (elements 0-15) then high ones (16-31) */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}
/* the 32 bits of qh as 32 bytes, 0x10 where the bit is set (the Q5 types' fifth bit) */
static inline __m256i bits32(const uint8_t *qh) {
    uint32_t v;
    memcpy(&v, qh, 4);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL,
                                            0x0303030303030303LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}
#endif

/* the 32-column types: sum over the row's blocks of d_w d_x (sum q x) (+ m_w d_x sum x) */
static float dot_q4_0(const uint8_t *w, const xq_t *x, long K) {
    long nb = K / 32;
#if defined(GG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.0f;
    for (long b = 0; b < nb; b++, w += 18) {
        float dw = h2f(w);
        __m256i q = nibbles32(w + 2);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * x->d32[b]), _mm256_cvtepi32_ps(dot_us(q, xv)), acc);
        corr += dw * x->s32[b];
    }
    return hsum_ps(acc) - 8.0f * corr;
#else
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += 18) {
        const int8_t *xq = x->q32 + b * 32;
        int s = 0;
        for (int j = 0; j < 16; j++) s += ((w[2 + j] & 15) - 8) * xq[j] + ((w[2 + j] >> 4) - 8) * xq[j + 16];
        acc += h2f(w) * x->d32[b] * (float)s;
    }
    return acc;
#endif
}

static float dot_q4_1(const uint8_t *w, const xq_t *x, long K) {
    long nb = K / 32;
    float mins = 0.0f;
#if defined(GG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++, w += 20) {
        __m256i q = nibbles32(w + 4);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w) * x->d32[b]), _mm256_cvtepi32_ps(dot_us(q, xv)), acc);
        mins += h2f(w + 2) * x->s32[b];
    }
    return hsum_ps(acc) + mins;
#else
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += 20) {
        const int8_t *xq = x->q32 + b * 32;
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[4 + j] & 15) * xq[j] + (w[4 + j] >> 4) * xq[j + 16];
        acc += h2f(w) * x->d32[b] * (float)s;
        mins += h2f(w + 2) * x->s32[b];
    }
    return acc + mins;
#endif
}

/* Q5_0 / Q5_1: the nibbles plus a fifth bit from qh (bit j: element j, bit j + 16: element j + 16) */
static float dot_q5_01(const uint8_t *w, const xq_t *x, long K, int with_min) {
    long nb = K / 32, bs = with_min ? 24 : 22, qs = with_min ? 8 : 6, qh = with_min ? 4 : 2;
    float mins = 0.0f;
#if defined(GG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++, w += bs) {
        __m256i q = _mm256_or_si256(nibbles32(w + qs), bits32(w + qh));
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w) * x->d32[b]), _mm256_cvtepi32_ps(dot_us(q, xv)), acc);
        mins += (with_min ? h2f(w + 2) : -16.0f * h2f(w)) * x->s32[b];
    }
    return hsum_ps(acc) + mins;
#else
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += bs) {
        uint32_t h;
        memcpy(&h, w + qh, 4);
        const int8_t *xq = x->q32 + b * 32;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            int x0 = (w[qs + j] & 15) | (((h >> j) << 4) & 0x10);
            int x1 = (w[qs + j] >> 4) | ((h >> (j + 12)) & 0x10);
            s += x0 * xq[j] + x1 * xq[j + 16];
        }
        acc += h2f(w) * x->d32[b] * (float)s;
        mins += (with_min ? h2f(w + 2) : -16.0f * h2f(w)) * x->s32[b];
    }
    return acc + mins;
#endif
}

static float dot_q8_0(const uint8_t *w, const xq_t *x, long K) {
    long nb = K / 32;
#if defined(GG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w) * x->d32[b]), _mm256_cvtepi32_ps(dot_ss(q, xv)), acc);
    }
    return hsum_ps(acc);
#else
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += 34) {
        const int8_t *q = (const int8_t *)(w + 2), *xq = x->q32 + b * 32;
        int s = 0;
        for (int j = 0; j < 32; j++) s += q[j] * xq[j];
        acc += h2f(w) * x->d32[b] * (float)s;
    }
    return acc;
#endif
}

/* Q4_K / Q5_K: super-blocks of 256 = 8 sub-blocks of 32 with 6-bit scales and minimums:
   d x_d sum_j sc_j (sum q x)_j - dmin x_d sum_j m_j (sum x)_j, the sums over j in integers */
static float dot_q45_k(const uint8_t *w, const xq_t *x, long K, int five) {
    long nb = K / 256, bs = five ? 176 : 144;
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += bs) {
        const uint8_t *sc12 = w + 4, *qh = w + 16, *qs = w + (five ? 48 : 16);
        const int8_t *xq = x->q256 + b * 256;
        const int16_t *bsum = x->bsum + b * 16;
        int sc[8], mn[8], mins = 0;
        for (int j = 0; j < 8; j++) {
            scale_min_k4(j, sc12, &sc[j], &mn[j]);
            mins += mn[j] * (bsum[2 * j] + bsum[2 * j + 1]);
        }
        int isum;
#if defined(GG_AVX2)
        __m256i s = _mm256_setzero_si256();
        const __m256i low = _mm256_set1_epi8(0x0f);
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
            }
            __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(xq + 64 * j)));
            __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 64 * j + 32)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)sc[2 * j])));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)sc[2 * j + 1])));
        }
        isum = hsum_i32(s);
#else
        isum = 0;
        for (int j = 0; j < 4; j++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
                if (five) { lo |= ((qh[l] >> (2 * j)) & 1) << 4; hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4; }
                s0 += lo * xq[64 * j + l];
                s1 += hi * xq[64 * j + 32 + l];
            }
            isum += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
        }
#endif
        float dx = x->d256[b];
        acc += h2f(w) * dx * (float)isum - h2f(w + 2) * dx * (float)mins;
    }
    return acc;
}

/* Q6_K: ql [128], qh [64], 16 int8 scales (one per 16 columns), d; q = 6 bits - 32 */
static float dot_q6_k(const uint8_t *w, const xq_t *x, long K) {
    long nb = K / 256;
    float acc = 0.0f;
    for (long b = 0; b < nb; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192), *xq = x->q256 + b * 256;
        const int16_t *bsum = x->bsum + b * 16;
        int corr = 0;
        for (int g = 0; g < 16; g++) corr += sc[g] * bsum[g];
        int isum;
#if defined(GG_AVX2)
        __m256i s = _mm256_setzero_si256();
        const __m256i low = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(hb, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), three), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), three), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), three), 4));
            for (int i = 0; i < 4; i++) {
                __m256i p = _mm256_maddubs_epi16(q[i], _mm256_loadu_si256((const __m256i *)(xq + 128 * h + 32 * i)));
                const int8_t *g = sc + 8 * h + 2 * i;  /* this vector's two 16-column groups */
                __m256i scv = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(g[0])), _mm_set1_epi16(g[1]), 1);
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scv));
            }
        }
        isum = hsum_i32(s);
#else
        isum = 0;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                int is = l / 16;
                int q1 = (L[l] & 15) | ((H[l] & 3) << 4), q2 = (L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4);
                int q3 = (L[l] >> 4) | (((H[l] >> 4) & 3) << 4), q4 = (L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4);
                const int8_t *xh = xq + 128 * h;
                isum += sc[8 * h + is] * q1 * xh[l] + sc[8 * h + is + 2] * q2 * xh[l + 32]
                        + sc[8 * h + is + 4] * q3 * xh[l + 64] + sc[8 * h + is + 6] * q4 * xh[l + 96];
            }
#endif
        acc += h2f(w + 208) * x->d256[b] * (float)(isum - 32 * corr);
    }
    return acc;
}

static inline float dot_row(long t, const uint8_t *w, const xq_t *x, long K) {
    switch (t) {
    case GT_Q4_0: return dot_q4_0(w, x, K);
    case GT_Q4_1: return dot_q4_1(w, x, K);
    case GT_Q5_0: return dot_q5_01(w, x, K, 0);
    case GT_Q5_1: return dot_q5_01(w, x, K, 1);
    case GT_Q8_0: return dot_q8_0(w, x, K);
    case GT_Q4_K: return dot_q45_k(w, x, K, 0);
    case GT_Q5_K: return dot_q45_k(w, x, K, 1);
    case GT_Q6_K: return dot_q6_k(w, x, K);
    default: return 0.0f;
    }
}

/* ---- rows of a (fused) weight ------------------------------------------------------------------------ */
#ifndef GGUF_AHEAD
#define GGUF_AHEAD 4  /* rows asked for ahead: hardware prefetch alone leaves the loop waiting on memory */
#endif

static void needs(const wslm_gguf *w, int *n32, int *n256) {
    *n32 = *n256 = 0;
    for (long p = 0; p < w->parts; p++) {
        if (is_k(w->type[p])) *n256 = 1;
        else *n32 = 1;
    }
}

/* rows [n0, n1) of w against M rounded activation rows xs[0..M); out [M, n] in bf16 or fp32 */
static void rows_range(const wslm_gguf *w, const xq_t *xs, long M, void *out, int out_bf16, long n0, long n1) {
    long K = w->k, start = 0;
    for (long p = 0; p < w->parts; p++) {
        long t = w->type[p], rb = K / block_cols(t) * block_bytes(t);
        long a = n0 > start ? n0 : start, e = n1 < start + w->rows[p] ? n1 : start + w->rows[p];
        for (long n = a; n < e; n++) {
            const uint8_t *row = w->data[p] + (n - start) * rb;
            if (n + GGUF_AHEAD < e) {
                const char *ahead = (const char *)row + GGUF_AHEAD * rb;
                for (long o = 0; o < rb; o += 64) prefetch(ahead + o);
            }
            long col = w->index ? w->index[n] : n;
            for (long m = 0; m < M; m++) {  /* the row stays in L1 for every activation row */
                float v = dot_row(t, row, xs + m, K);
                if (out_bf16) ((uint16_t *)out)[m * w->n + col] = f2bf(v);
                else ((float *)out)[m * w->n + col] = v;
            }
        }
        start += w->rows[p];
    }
}

/* x [M, K] (bf16 or fp32) @ W.T -> out [M, n] (bf16 or fp32), rows split over threads as cpu_gemv.c's
   products are. Returns 0, -1 out of memory, -2 a type this library does not take. */
int wslm_gguf_mm(const void *wv, const void *x, long M, int x_bf16, void *out, int out_bf16, int threads) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    for (long p = 0; p < w->parts; p++)
        if (!wslm_gguf_takes(w->type[p]) || w->k % block_cols(w->type[p])) return -2;
    long K = w->k;
    size_t per = (xq_bytes(K) + 63) & ~(size_t)63;
    char *mem = (char *)malloc(per * (size_t)M + sizeof(xq_t) * (size_t)M);
    if (!mem) return -1;
    xq_t *xs = (xq_t *)(mem + per * (size_t)M);
    int n32, n256;
    needs(w, &n32, &n256);
    for (long m = 0; m < M; m++) {
        xq_carve(mem + per * (size_t)m, K, xs + m);
        quantize_x((const char *)x + (size_t)(m * K) * (x_bf16 ? 2 : 4), x_bf16, K, n32, n256, xs + m);
    }
    long N = w->n, units = (N + 3) / 4;
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads) if (threads > 1 && units > 1)
#endif
    {
        int t = 0, nt = 1;
#if defined(_OPENMP)
        t = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
        long a = units * t / nt * 4, b = units * (t + 1) / nt * 4;
        rows_range(w, xs, M, out, out_bf16, a, b < N ? b : N);
    }
    (void)threads;
    free(mem);
    return 0;
}

/* a team thread's rows [n0, n1) of one activation row's product, no threads of its own (cpu_layer.c);
   scratch: ROW_SCRATCH_BYTES(K) bytes of the thread's own. Every thread rounds the row the same way. */
int wslm_gguf_rows(const void *wv, const void *x, int x_bf16, void *out, int out_bf16, long n0, long n1,
                   void *scratch) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    xq_t xs;
    int n32, n256;
    if (xq_bytes(w->k) > ROW_SCRATCH_BYTES(w->k)) return -1;
    xq_carve(scratch, w->k, &xs);
    needs(w, &n32, &n256);
    quantize_x(x, x_bf16, w->k, n32, n256, &xs);
    rows_range(w, &xs, 1, out, out_bf16, n0, n1);
    return 0;
}

/* The activation row x [K] fp32 as the kernels see it for a type of `cols`-column blocks (32, or 256 for
   the K-quants): each value its int8 code times its block's scale (tests compare against this). */
void wslm_gguf_round_x(const float *x, long K, long cols, float *y) {
    for (long b = 0; b < K / cols; b++) {
        int8_t q[256];
        float d;
        quantize_run(x, 0, b * cols, cols, q, &d);
        for (long i = 0; i < cols; i++) y[b * cols + i] = (float)q[i] * d;
    }
}

/* 256 where the block dot products have AVX2 loops here, else 0 (the plain ones) */
int wslm_gguf_native(void) {
#if defined(GG_AVX2)
    return 256;
#else
    return 0;
#endif
}
