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
#include "cpu_gguf_blocks.h"

/* ---- types: cpu_gguf_blocks.h ------------------------------------------------------------------------ */
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
    int16_t *bsum, *bsum32;
    int32_t *sum32;
} xq_t;

static inline float x_at(const void *x, int bf16, long i) {
    return bf16 ? bf2f(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* n (a multiple of 8) values of x from column k0 as int8 codes q and their scale d = max |x| / 127; codes
   rounded to nearest, ties to even (the AVX2 loop's cvtps and the plain loop's nearbyintf agree) */
static void quantize_run(const void *x, int bf16, long k0, long n, int8_t *q, float *d) {
    float amax = 0.0f;
#if defined(__AVX2__)
    float v[256];
    for (long i = 0; i < n; i++) v[i] = x_at(x, bf16, k0 + i);
    __m256 mx = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    __m256 iv = _mm256_set1_ps(inv);
    for (long i = 0; i < n; i += 8) {
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), iv));
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w16, w16));
    }
#else
    for (long i = 0; i < n; i++) { float a = fabsf(x_at(x, bf16, k0 + i)); amax = a > amax ? a : amax; }
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    for (long i = 0; i < n; i++) q[i] = (int8_t)nearbyintf(x_at(x, bf16, k0 + i) * inv);
#endif
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
            for (int j = 0; j < 8; j++) o->bsum32[b * 8 + j] = (int16_t)(o->bsum[b * 16 + 2 * j] + o->bsum[b * 16 + 2 * j + 1]);
        }
}

/* bytes quantize_x needs for one row of K (both forms) */
static size_t xq_bytes(long K) {
    return (size_t)K * 2 + sizeof(float) * (size_t)(K / 32 * 2 + K / 256 + 1) + sizeof(int16_t) * (size_t)(K / 16 + K / 32)
           + sizeof(int32_t) * (size_t)(K / 32) + 64;
}

static void xq_carve(void *mem, long K, xq_t *o) {
    char *p = (char *)mem;
    o->d32 = (float *)p; p += sizeof(float) * (size_t)(K / 32);
    o->s32 = (float *)p; p += sizeof(float) * (size_t)(K / 32);
    o->d256 = (float *)p; p += sizeof(float) * (size_t)(K / 256 + 1);
    o->sum32 = (int32_t *)p; p += sizeof(int32_t) * (size_t)(K / 32);
    o->bsum = (int16_t *)p; p += sizeof(int16_t) * (size_t)(K / 16);
    o->bsum32 = (int16_t *)p; p += sizeof(int16_t) * (size_t)(K / 32);
    o->q32 = (int8_t *)p; p += K;
    o->q256 = (int8_t *)p;
}

/* ---- one weight row . one rounded activation row, per type ------------------------------------------ */
#if defined(__AVX2__) && defined(__FMA__)
#define GG_AVX2 1
static inline __m256i dot_us(__m256i u, __m256i s) {  /* 8 lanes, each the sum of 4 u8 * s8 products */
#if defined(GG_VNNI)
    return DPBUSD(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* the 4-bit codes lo (x[0..15]) and hi (x[16..31]) of a block against xl and xh: 8 lanes of 4-product sums */
static inline __m256i dot_nibbles(__m256i lo, __m256i hi, __m256i xl, __m256i xh) {
#if defined(GG_VNNI)
    return DPBUSD(DPBUSD(_mm256_setzero_si256(), lo, xl), hi, xh);
#else
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)),
                             _mm256_set1_epi16(1));
#endif
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

/* The K-quants' 12 bytes of 6-bit scales and minimums as 16 bytes: the 8 scales, then the 8 minimums
   (scale_min_k4 for all eight at once, on 32-bit words) */
static inline __m128i k4_scales_mins(const uint8_t *q) {
    /* lanes [u0, u2, u1, u2] and [u0, u0, u1, u1] of the 12 bytes' words u0..u2 (16 bytes read: the
       block's codes follow them) */
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 6), _mm_setr_epi32(0, 0x03030303, 0, 0x03030303));
    return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}
/* a shuffle that fills every 16-bit lane with lane i of a vector of 8 16-bit values (in both halves) */
static inline __m256i k_pick16(int i) {
    return _mm256_set1_epi16((short)(((2 * i + 1) << 8) | (2 * i)));
}
/* Q6_K: 16-bit lanes 0-7 take value 2i of 8, lanes 8-15 value 2i + 1 (one vector's two 16-column groups) */
static inline __m256i k_pick16_pair(int i) {
    return _mm256_setr_m128i(_mm_set1_epi16((short)(((4 * i + 1) << 8) | (4 * i))),
                             _mm_set1_epi16((short)(((4 * i + 3) << 8) | (4 * i + 2))));
}
#endif

/* Each takes NR weight rows rb bytes apart and writes their dot products with the rounded row to res.
   Several rows at once load each activation block once for all of them, and their independent sums keep
   the multiply-adds from waiting on one another (one row alone: one fp32 chain, 4 cycles a block). */
#define NR 4
#define AI static inline __attribute__((always_inline))
#ifndef GGUF_AHEAD
#define GGUF_AHEAD 2  /* the 4-row kernels: prefetch the group of NR rows this many groups ahead */
#endif
#ifndef GGUF_PF
#define GGUF_PF 2048  /* the one-row kernels: prefetch this many bytes ahead of the block being read */
#endif
/* The bytes [p, p + n) asked for, a line at a time, as the loops read at the same pace: hardware prefetch
   follows one long stream well, but not the four short ones of four rows read side by side (each row of a
   3B model is only 27 lines), and a burst of a hundred prefetches at a group's start overflows the
   core's miss buffers (the loop waited on memory at half the repacked kernels' speed). */
AI void prefetch_run(const uint8_t *p, long n) {
    for (long o = 0; o < n; o += 64) prefetch(p + o);
}
#ifndef GGUF_AHEAD_LOCALITY
/* The 4-row kernels' group ahead goes to L2 (prefetcht1), not L1: a group of 8B rows is 36-128 KB, two
   groups ahead do not fit L1, and the lines fetched there pushed out the ones in use. Zen 4, one thread
   (bench/gguf_kernels.py): Q4_0 8B 15-16 -> 19-24 GB/s, Q8_0 14-15 -> 20-28; the one-row K-quant kernels,
   2 KB ahead, measured worse with it at 2 threads and keep L1. */
#define GGUF_AHEAD_LOCALITY 2
#endif
/* the 4-row kernels' group ahead */
AI void prefetch_ahead(const uint8_t *p, long n) {
#if defined(__GNUC__)
    for (long o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, GGUF_AHEAD_LOCALITY);
#else
    prefetch_run(p, n);
#endif
}

#if defined(GG_AVX2)
/* 4 rows' 8-lane integer sums -> their 4 totals (exact) */
AI __m128i sum4_i32(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}
/* Four rows' sums of (4-bit codes . x) for one 32-column block, exact, as 4 partial sums each: two rows a
   vector (one row's 16 code bytes per 128-bit half), so each nibble split and multiply serves two rows.
   p: row 0's 16 code bytes, the others rb apart; xl, xh: the block's x[0..15] and x[16..31] in both
   halves. -> [row 0: 4 sums | row 1: 4 sums], [row 2 | row 3], scaled in these lanes (spread4) and
   reduced once per row (sum4x2), not per block. */
AI void q4x4_parts(const uint8_t *p, long rb, __m256i xl, __m256i xh, __m256i *m01, __m256i *m23) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i m[2];
    for (int i = 0; i < 2; i++) {
        const uint8_t *a = p + 2 * i * rb;
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                            _mm_loadu_si128((const __m128i *)(a + rb)), 1);
        m[i] = dot_nibbles(_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low), xl, xh);
    }
    *m01 = m[0];
    *m23 = m[1];
}
/* four rows' scales [d0 d1 d2 d3] in q4x4_parts' lanes: [d0 x4 | d1 x4], [d2 x4 | d3 x4] */
AI void spread4(__m128 d, __m256 *s01, __m256 *s23) {
    __m256 w = _mm256_castps128_ps256(d);
    *s01 = _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    *s23 = _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
}
/* [row 0 x4 | row 1 x4], [row 2 x4 | row 3 x4] -> the four rows' totals */
AI __m128 sum4x2(__m256 a01, __m256 a23) {
    __m256 h = _mm256_hadd_ps(a01, a23);  /* [r0 r0 r2 r2 | r1 r1 r3 r3] */
    h = _mm256_hadd_ps(h, h);             /* [r0 r2 r0 r2 | r1 r3 r1 r3] */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
/* the fp16 pairs (d, m) at p, p + stride, ...: four rows' d and m */
AI void f16_pairs4(const uint8_t *p, long stride, __m128 *d, __m128 *m) {
    /* 128-bit loads and unpacks, not four scalar loads and inserts (which starved the loop of issue slots) */
    __m128i r01 = _mm_unpacklo_epi32(_mm_loadu_si128((const __m128i *)p), _mm_loadu_si128((const __m128i *)(p + stride)));
    __m128i r23 = _mm_unpacklo_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * stride)),
                                     _mm_loadu_si128((const __m128i *)(p + 3 * stride)));
    __m256 f = _mm256_cvtph_ps(_mm_unpacklo_epi64(r01, r23));  /* d0 m0 d1 m1 d2 m2 d3 m3 */
    __m128 a = _mm256_castps256_ps128(f), b = _mm256_extractf128_ps(f, 1);
    *d = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    *m = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}
/* the fp16 values at p, p + stride, p + 2 stride, p + 3 stride (16 bytes read at each: the blocks' codes
   follow their scales) */
AI __m128 f16x4(const uint8_t *p, long stride) {
    __m128i r01 = _mm_unpacklo_epi16(_mm_loadu_si128((const __m128i *)p), _mm_loadu_si128((const __m128i *)(p + stride)));
    __m128i r23 = _mm_unpacklo_epi16(_mm_loadu_si128((const __m128i *)(p + 2 * stride)),
                                     _mm_loadu_si128((const __m128i *)(p + 3 * stride)));
    return _mm_cvtph_ps(_mm_unpacklo_epi32(r01, r23));
}
#endif

/* the 32-column types: sum over the row's blocks of d_w d_x (sum q x) (+ m_w d_x sum x). AVX2: the four
   rows' integer sums of a block reduced together (exact), then scaled as one vector of four. */
AI void dot_q4_0(const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res) {
    long nb = K / 32;
#if defined(GG_AVX2)
    __m256 acc01 = _mm256_setzero_ps(), acc23 = _mm256_setzero_ps();
    __m128 corr = _mm_setzero_ps();
    (void)nr;
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 18;
        prefetch_ahead(w + GGUF_AHEAD * NR * rb + b * NR * 18, NR * 18);
        const __m128i *xb = (const __m128i *)(x->q32 + b * 32);
        __m256i m01, m23;
        q4x4_parts(p + 2, rb, _mm256_broadcastsi128_si256(_mm_loadu_si128(xb)),
                   _mm256_broadcastsi128_si256(_mm_loadu_si128(xb + 1)), &m01, &m23);
        __m128 dw = f16x4(p, rb);
        __m256 s01, s23;
        spread4(_mm_mul_ps(dw, _mm_set1_ps(x->d32[b])), &s01, &s23);
        acc01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m01), s01, acc01);
        acc23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m23), s23, acc23);
        corr = _mm_fmadd_ps(dw, _mm_set1_ps(x->s32[b]), corr);
    }
    _mm_storeu_ps(res, _mm_fnmadd_ps(_mm_set1_ps(8.0f), corr, sum4x2(acc01, acc23)));
#else
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (long b = 0; b < nb; b++, p += 18) {
            const int8_t *xq = x->q32 + b * 32;
            int s = 0;
            for (int j = 0; j < 16; j++) s += ((p[2 + j] & 15) - 8) * xq[j] + ((p[2 + j] >> 4) - 8) * xq[j + 16];
            acc += h2f(p) * x->d32[b] * (float)s;
        }
        res[r] = acc;
    }
#endif
}

/* Q4_1, Q5_0, Q5_1: codes q (4 or 5 bits, unsigned) and w = d q + m (Q5_0: m = -16 d) */
AI void dot_q451(const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res, long bs, long qs, long qh,
                 int with_min) {
    long nb = K / 32;
#if defined(GG_AVX2)
    __m128 acc = _mm_setzero_ps(), mins = _mm_setzero_ps();
    __m256 acc01 = _mm256_setzero_ps(), acc23 = _mm256_setzero_ps();
    (void)nr;
    for (long b = 0; b < nb; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        const uint8_t *p = w + b * bs;
        prefetch_ahead(w + GGUF_AHEAD * NR * rb + b * NR * bs, NR * bs);
        __m128 dw, mw, sx = _mm_set1_ps(x->s32[b]);
        if (!qh) {  /* Q4_1: two rows a vector, their sums scaled in their lanes (as Q4_0) */
            const __m128i *xb = (const __m128i *)(x->q32 + b * 32);
            __m256i m01, m23;
            q4x4_parts(p + qs, rb, _mm256_broadcastsi128_si256(_mm_loadu_si128(xb)),
                       _mm256_broadcastsi128_si256(_mm_loadu_si128(xb + 1)), &m01, &m23);
            f16_pairs4(p, rb, &dw, &mw);
            __m256 s01, s23;
            spread4(_mm_mul_ps(dw, _mm_set1_ps(x->d32[b])), &s01, &s23);
            acc01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m01), s01, acc01);
            acc23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m23), s23, acc23);
        } else {
            __m256i pr[4];
            for (int r = 0; r < 4; r++)
                pr[r] = dot_us(_mm256_or_si256(nibbles32(p + r * rb + qs), bits32(p + r * rb + qh)), xv);
            __m128i isum = sum4_i32(pr[0], pr[1], pr[2], pr[3]);
            dw = f16x4(p, rb);
            mw = with_min ? f16x4(p + 2, rb) : _mm_mul_ps(_mm_set1_ps(-16.0f), dw);
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, _mm_set1_ps(x->d32[b])), acc);
        }
        mins = _mm_fmadd_ps(mw, sx, mins);
    }
    if (!qh) acc = sum4x2(acc01, acc23);
    _mm_storeu_ps(res, _mm_add_ps(acc, mins));
#else
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f, mins = 0.0f;
        for (long b = 0; b < nb; b++, p += bs) {
            uint32_t h = 0;
            if (qh) memcpy(&h, p + qh, 4);
            const int8_t *xq = x->q32 + b * 32;
            int s = 0;
            for (int j = 0; j < 16; j++) {
                int x0 = (p[qs + j] & 15) | (((h >> j) << 4) & 0x10);
                int x1 = (p[qs + j] >> 4) | ((h >> (j + 12)) & 0x10);
                s += x0 * xq[j] + x1 * xq[j + 16];
            }
            acc += h2f(p) * x->d32[b] * (float)s;
            mins += (with_min ? h2f(p + 2) : -16.0f * h2f(p)) * x->s32[b];
        }
        res[r] = acc + mins;
    }
#endif
}

AI void dot_q8_0(const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res) {
    long nb = K / 32;
#if defined(GG_AVX2)
    __m128 acc = _mm_setzero_ps();
    (void)nr;
    for (long b = 0; b < nb; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q32 + b * 32));
        const uint8_t *p = w + b * 34;
        prefetch_ahead(w + GGUF_AHEAD * NR * rb + b * NR * 34, NR * 34);
        __m256i pr[4];
        for (int r = 0; r < 4; r++) pr[r] = dot_ss(_mm256_loadu_si256((const __m256i *)(p + r * rb + 2)), xv);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sum4_i32(pr[0], pr[1], pr[2], pr[3])),
                           _mm_mul_ps(f16x4(p, rb), _mm_set1_ps(x->d32[b])), acc);
    }
    _mm_storeu_ps(res, acc);
#else
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (long b = 0; b < nb; b++, p += 34) {
            const int8_t *q = (const int8_t *)(p + 2), *xq = x->q32 + b * 32;
            int s = 0;
            for (int j = 0; j < 32; j++) s += q[j] * xq[j];
            acc += h2f(p) * x->d32[b] * (float)s;
        }
        res[r] = acc;
    }
#endif
}

#if defined(GG_AVX2)
/* The K-quants one row at a time: a row's blocks are one run of memory and the next row follows it, so
   reading row after row is a single stream (prefetched GGUF_PF bytes ahead); the activation row comes from
   L1 for each. Per super-block: integer sums weighted by the 6-bit (Q6_K: 8-bit) sub-block scales in the
   lanes, one fp32 multiply-add, the minimums' sums in a second accumulator. */
AI float hsum4_ps(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}
AI float dot1_q45_k(const uint8_t *w, const xq_t *x, long nb, int five) {
    const long bs = five ? 176 : 144;
    const __m256i low = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 mins = _mm_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * bs, *qs = p + (five ? 48 : 16);
        prefetch_run(p + GGUF_PF, bs);
        const int8_t *xq = x->q256 + b * 256;
        __m128i xsum32 = _mm_loadu_si128((const __m128i *)(x->bsum32 + b * 8));
        int32_t dm;
        memcpy(&dm, p, 4);
        __m128 dmx = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dm)), _mm_set1_ps(x->d256[b]));  /* d dx, dmin dx */
        __m128i scm = k4_scales_mins(p + 4);  /* bytes 0-7: the 8 scales, 8-15: the 8 minimums */
        __m128i mn = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(scm, scm)), xsum32);
        mins = _mm_fmadd_ps(_mm_shuffle_ps(dmx, dmx, 0x55), _mm_cvtepi32_ps(mn), mins);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
            }
            __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(xq + 64 * j)));
            __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 64 * j + 32)));
            s0 = MADD_ACC(s0, plo, _mm256_shuffle_epi8(sc16, k_pick16(2 * j)));
            s1 = MADD_ACC(s1, phi, _mm256_shuffle_epi8(sc16, k_pick16(2 * j + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dmx), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc) - hsum4_ps(mins);
}
AI float dot1_q6_k(const uint8_t *w, const xq_t *x, long nb) {
    const __m256i low = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210, *ql = p, *qh = p + 128;
        prefetch_run(p + GGUF_PF, 210);
        const int8_t *xq = x->q256 + b * 256, *sc = (const int8_t *)(p + 192);
        __m128i sc8x = _mm_loadu_si128((const __m128i *)sc);
        /* the -32 of every code: 32 sum_g sc_g bsum_g, in the lanes' sums */
        __m256i s = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8x),
                                                        _mm256_loadu_si256((const __m256i *)(x->bsum + b * 16))), 5);
        s = _mm256_sub_epi32(_mm256_setzero_si256(), s);
        __m256i s1 = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8x, sc8x) : sc8x));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(hb, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), three), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), three), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), three), 4));
            for (int i = 0; i < 4; i++) {
                __m256i pr = _mm256_maddubs_epi16(q[i], _mm256_loadu_si256((const __m256i *)(xq + 128 * h + 32 * i)));
                if (i & 1) s1 = MADD_ACC(s1, pr, _mm256_shuffle_epi8(sc16, k_pick16_pair(i)));
                else s = MADD_ACC(s, pr, _mm256_shuffle_epi8(sc16, k_pick16_pair(i)));
            }
        }
        uint16_t hd;
        memcpy(&hd, p + 208, 2);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(hd) * x->d256[b]), _mm256_cvtepi32_ps(_mm256_add_epi32(s, s1)),
                              acc);
    }
    return hsum_ps(acc);
}
#endif

/* Q4_K / Q5_K: super-blocks of 256 = 8 sub-blocks of 32 with 6-bit scales and minimums:
   d x_d sum_j sc_j (sum q x)_j - dmin x_d sum_j m_j (sum x)_j, the sums over j in integers */
AI void dot_q45_k(const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res, int five) {
    long nb = K / 256, bs_k = five ? 176 : 144;
#if defined(GG_AVX2)
    for (int r = 0; r < nr; r++) res[r] = dot1_q45_k(w + r * rb, x, nb, five);
    (void)bs_k;
#else
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (long b = 0; b < nb; b++, p += bs_k) {
            const uint8_t *sc12 = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
            const int8_t *xq = x->q256 + b * 256;
            const int16_t *bsum = x->bsum + b * 16;
            int sc[8], mn[8], m = 0, isum = 0;
            for (int j = 0; j < 8; j++) {
                scale_min_k4(j, sc12, &sc[j], &mn[j]);
                m += mn[j] * (bsum[2 * j] + bsum[2 * j + 1]);
            }
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
            float dx = x->d256[b];
            acc += h2f(p) * dx * (float)isum - h2f(p + 2) * dx * (float)m;
        }
        res[r] = acc;
    }
#endif
}

/* Q6_K: ql [128], qh [64], 16 int8 scales (one per 16 columns), d; q = 6 bits - 32 */
AI void dot_q6_k(const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res) {
    long nb = K / 256;
#if defined(GG_AVX2)
    for (int r = 0; r < nr; r++) res[r] = dot1_q6_k(w + r * rb, x, nb);
#else
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * rb;
        float acc = 0.0f;
        for (long b = 0; b < nb; b++, p += 210) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192), *xq = x->q256 + b * 256;
            const int16_t *bsum = x->bsum + b * 16;
            int corr = 0, isum = 0;
            for (int g = 0; g < 16; g++) corr += sc[g] * bsum[g];
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
            acc += h2f(p + 208) * x->d256[b] * (float)(isum - 32 * corr);
        }
        res[r] = acc;
    }
#endif
}

AI void dot_n(long t, const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res) {
    switch (t) {
    case GT_Q4_0: dot_q4_0(w, rb, nr, x, K, res); break;
    case GT_Q4_1: dot_q451(w, rb, nr, x, K, res, 20, 4, 0, 1); break;
    case GT_Q5_0: dot_q451(w, rb, nr, x, K, res, 22, 6, 2, 0); break;
    case GT_Q5_1: dot_q451(w, rb, nr, x, K, res, 24, 8, 4, 1); break;
    case GT_Q8_0: dot_q8_0(w, rb, nr, x, K, res); break;
    case GT_Q4_K: dot_q45_k(w, rb, nr, x, K, res, 0); break;
    case GT_Q5_K: dot_q45_k(w, rb, nr, x, K, res, 1); break;
    case GT_Q6_K: dot_q6_k(w, rb, nr, x, K, res); break;
    default: for (int r = 0; r < nr; r++) res[r] = 0.0f;
    }
}

/* nr (<= NR) consecutive rows of one type. The 32-column types always run NR rows' code: a last group of
   fewer takes each row as NR copies of itself (rb = 0), so a row's bits never depend on how rows are
   grouped or split. */
static void dot_rows(long t, const uint8_t *w, long rb, int nr, const xq_t *x, long K, float *res) {
    if (nr == NR || is_k(t)) { dot_n(t, w, rb, nr, x, K, res); return; }  /* the K-quants: a row at a time */
    for (int r = 0; r < nr; r++) {
        float one[NR];
        dot_n(t, w + r * rb, 0, NR, x, K, one);
        res[r] = one[0];
    }
}

/* ---- several activation rows per weight block (a sequence's speculative rows) --------------------------
   The same arithmetic as the one-row kernels above, op for op for each activation row (so each row's result
   is bit for bit what dot_n gives it), but every weight block is unpacked once for all of the rows: the
   nibbles, fifth bits and scales are the larger part of a block's work, and M rows of one sequence share
   them. MMAX rows at most a call (rows_range's tile). */
#define MMAX 8
#if defined(GG_AVX2)
/* Q4_0 and Q4_1 (dot_q4_0, and dot_q451's qh == 0 path), NR weight rows */
AI void dotm_q4(const uint8_t *w, long rb, const xq_t *x, long M, long K, float (*res)[NR], int q41) {
    long nb = K / 32, bs = q41 ? 20 : 18, qs = q41 ? 4 : 2;
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 acc01[MMAX], acc23[MMAX];
    __m128 side[MMAX];  /* q4_0: corr; q4_1: mins */
    for (long m = 0; m < M; m++) acc01[m] = acc23[m] = _mm256_setzero_ps(), side[m] = _mm_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * bs;
        prefetch_ahead(w + GGUF_AHEAD * NR * rb + b * NR * bs, NR * bs);
        __m256i lo[2], hi[2];
        for (int i = 0; i < 2; i++) {
            const uint8_t *a = p + qs + 2 * i * rb;
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                _mm_loadu_si128((const __m128i *)(a + rb)), 1);
            lo[i] = _mm256_and_si256(v, low);
            hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        __m128 dw, mw = _mm_setzero_ps();
        if (q41) f16_pairs4(p, rb, &dw, &mw);
        else dw = f16x4(p, rb);
        __m256 dw01, dw23;  /* spread before the multiply: the same lane products, moved once for all rows */
        spread4(dw, &dw01, &dw23);
        for (long m = 0; m < M; m++) {
            const __m128i *xb = (const __m128i *)(x[m].q32 + b * 32);
            __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb));
            __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb + 1));
            __m256i m01 = dot_nibbles(lo[0], hi[0], xl, xh), m23 = dot_nibbles(lo[1], hi[1], xl, xh);
            __m256 dx = _mm256_set1_ps(x[m].d32[b]), s01 = _mm256_mul_ps(dw01, dx), s23 = _mm256_mul_ps(dw23, dx);
            acc01[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m01), s01, acc01[m]);
            acc23[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m23), s23, acc23[m]);
            side[m] = _mm_fmadd_ps(q41 ? mw : dw, _mm_set1_ps(x[m].s32[b]), side[m]);
        }
    }
    for (long m = 0; m < M; m++) {
        __m128 a = sum4x2(acc01[m], acc23[m]);
        _mm_storeu_ps(res[m], q41 ? _mm_add_ps(a, side[m]) : _mm_fnmadd_ps(_mm_set1_ps(8.0f), side[m], a));
    }
}

/* Q8_0 (dot_q8_0), NR weight rows */
AI void dotm_q8_0(const uint8_t *w, long rb, const xq_t *x, long M, long K, float (*res)[NR]) {
    long nb = K / 32;
    __m128 acc[MMAX];
    for (long m = 0; m < M; m++) acc[m] = _mm_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 34;
        prefetch_ahead(w + GGUF_AHEAD * NR * rb + b * NR * 34, NR * 34);
        __m256i wv[4], wa[4];
        for (int r = 0; r < 4; r++) {
            wv[r] = _mm256_loadu_si256((const __m256i *)(p + r * rb + 2));
            wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
        }
        __m128 dw = f16x4(p, rb);
        for (long m = 0; m < M; m++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x[m].q32 + b * 32));
            __m256i pr[4];
            for (int r = 0; r < 4; r++) pr[r] = dot_us(wa[r], _mm256_sign_epi8(xv, wv[r]));
            acc[m] = _mm_fmadd_ps(_mm_cvtepi32_ps(sum4_i32(pr[0], pr[1], pr[2], pr[3])),
                                  _mm_mul_ps(dw, _mm_set1_ps(x[m].d32[b])), acc[m]);
        }
    }
    for (long m = 0; m < M; m++) _mm_storeu_ps(res[m], acc[m]);
}

/* Q4_K / Q5_K (dot1_q45_k), one weight row */
AI void dotm1_q45_k(const uint8_t *w, const xq_t *x, long M, long nb, int five, float *res, long stride) {
    const long bs = five ? 176 : 144;
    const __m256i low = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc[MMAX];
    __m128 mins[MMAX];
    for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps(), mins[m] = _mm_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * bs, *qs = p + (five ? 48 : 16);
        prefetch_run(p + GGUF_PF, bs);
        int32_t dm;
        memcpy(&dm, p, 4);
        __m128 dmh = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
        __m128i scm = k4_scales_mins(p + 4);
        __m128i mn16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scm, scm));
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)(p + 16)) : _mm256_setzero_si256();
        __m256i q[8], scp[8];
        for (int j = 0; j < 4; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
            }
            q[2 * j] = lo, q[2 * j + 1] = hi;
            scp[2 * j] = _mm256_shuffle_epi8(sc16, k_pick16(2 * j));
            scp[2 * j + 1] = _mm256_shuffle_epi8(sc16, k_pick16(2 * j + 1));
        }
        for (long m = 0; m < M; m++) {
            const int8_t *xq = x[m].q256 + b * 256;
            __m128i xsum32 = _mm_loadu_si128((const __m128i *)(x[m].bsum32 + b * 8));
            __m128 dmx = _mm_mul_ps(dmh, _mm_set1_ps(x[m].d256[b]));
            __m128i mn = _mm_madd_epi16(mn16, xsum32);
            mins[m] = _mm_fmadd_ps(_mm_shuffle_ps(dmx, dmx, 0x55), _mm_cvtepi32_ps(mn), mins[m]);
            __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                __m256i plo = _mm256_maddubs_epi16(q[2 * j], _mm256_loadu_si256((const __m256i *)(xq + 64 * j)));
                __m256i phi = _mm256_maddubs_epi16(q[2 * j + 1], _mm256_loadu_si256((const __m256i *)(xq + 64 * j + 32)));
                s0 = MADD_ACC(s0, plo, scp[2 * j]);
                s1 = MADD_ACC(s1, phi, scp[2 * j + 1]);
            }
            acc[m] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dmx), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc[m]);
        }
    }
    for (long m = 0; m < M; m++) res[m * stride] = hsum_ps(acc[m]) - hsum4_ps(mins[m]);
}

/* Q6_K (dot1_q6_k), one weight row */
AI void dotm1_q6_k(const uint8_t *w, const xq_t *x, long M, long nb, float *res, long stride) {
    const __m256i low = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3);
    __m256 acc[MMAX];
    for (long m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *p = w + b * 210, *ql = p, *qh = p + 128;
        prefetch_run(p + GGUF_PF, 210);
        const int8_t *sc = (const int8_t *)(p + 192);
        __m128i sc8x = _mm_loadu_si128((const __m128i *)sc);
        __m256i sc8w = _mm256_cvtepi8_epi16(sc8x);
        __m256i q[8], scp[8];
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_unpackhi_epi64(sc8x, sc8x) : sc8x));
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(hb, three), 4));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), three), 4));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), three), 4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), three), 4));
            for (int i = 0; i < 4; i++) scp[4 * h + i] = _mm256_shuffle_epi8(sc16, k_pick16_pair(i));
        }
        uint16_t hd;
        memcpy(&hd, p + 208, 2);
        float dh = _cvtsh_ss(hd);
        for (long m = 0; m < M; m++) {
            const int8_t *xq = x[m].q256 + b * 256;
            __m256i s = _mm256_slli_epi32(_mm256_madd_epi16(sc8w, _mm256_loadu_si256((const __m256i *)(x[m].bsum + b * 16))), 5);
            s = _mm256_sub_epi32(_mm256_setzero_si256(), s);
            __m256i s1 = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++) {
                    __m256i pr = _mm256_maddubs_epi16(q[4 * h + i], _mm256_loadu_si256((const __m256i *)(xq + 128 * h + 32 * i)));
                    if (i & 1) s1 = MADD_ACC(s1, pr, scp[4 * h + i]);
                    else s = MADD_ACC(s, pr, scp[4 * h + i]);
                }
            acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(dh * x[m].d256[b]), _mm256_cvtepi32_ps(_mm256_add_epi32(s, s1)), acc[m]);
        }
    }
    for (long m = 0; m < M; m++) res[m * stride] = hsum_ps(acc[m]);
}

/* 1 where dot_rows_m below shares the blocks' unpacking (else it runs dot_rows per activation row) */
static int has_m(long t) { return t == GT_Q4_0 || t == GT_Q4_1 || t == GT_Q8_0 || t == GT_Q4_K || t == GT_Q5_K || t == GT_Q6_K; }

/* dot_rows for M (<= MMAX) activation rows: res[m][r], each row's bits dot_rows's */
static void dot_rows_m(long t, const uint8_t *w, long rb, int nr, const xq_t *x, long M, long K, float (*res)[NR]) {
    if (is_k(t)) {
        for (int r = 0; r < nr; r++) {
            if (t == GT_Q6_K) dotm1_q6_k(w + r * rb, x, M, K / 256, &res[0][r], NR);
            else dotm1_q45_k(w + r * rb, x, M, K / 256, t == GT_Q5_K, &res[0][r], NR);
        }
        return;
    }
    if (nr == NR) {
        if (t == GT_Q8_0) dotm_q8_0(w, rb, x, M, K, res);
        else dotm_q4(w, rb, x, M, K, res, t == GT_Q4_1);
        return;
    }
    for (int r = 0; r < nr; r++) {  /* a last group of fewer: each row as NR copies of itself (dot_rows) */
        float one[MMAX][NR];
        if (t == GT_Q8_0) dotm_q8_0(w + r * rb, 0, x, M, K, one);
        else dotm_q4(w + r * rb, 0, x, M, K, one, t == GT_Q4_1);
        for (long m = 0; m < M; m++) res[m][r] = one[m][0];
    }
}
#else
static int has_m(long t) { (void)t; return 0; }
static void dot_rows_m(long t, const uint8_t *w, long rb, int nr, const xq_t *x, long M, long K, float (*res)[NR]) {
    (void)t, (void)w, (void)rb, (void)nr, (void)x, (void)M, (void)K, (void)res;
}
#endif

/* ---- rows of a (fused) weight ------------------------------------------------------------------------ */
static void needs(const wslm_gguf *w, int *n32, int *n256) {
    *n32 = *n256 = 0;
    for (long p = 0; p < w->parts; p++) {
        if (is_k(w->type[p])) *n256 = 1;
        else *n32 = 1;
    }
}

/* rows [n0, n1) of w against M rounded activation rows xs[0..M); out [M, n] in bf16 or fp32. Blocked for
   the caches: a chunk of CHUNK weight rows (tens of KB, kept in L2 and read from memory once) meets the
   activation rows MTILE at a time (their int8 copies stay in L1), NR weight rows a pass. */
#ifndef GGUF_CHUNK
#define GGUF_CHUNK 32
#endif
#ifndef GGUF_MTILE
#define GGUF_MTILE 8
#endif
static void rows_range(const wslm_gguf *w, const xq_t *xs, long M, void *out, int out_bf16, long n0, long n1) {
    long K = w->k, start = 0;
    for (long p = 0; p < w->parts; p++) {
        long t = w->type[p], rb = K / block_cols(t) * block_bytes(t);
        long a = n0 > start ? n0 : start, e = n1 < start + w->rows[p] ? n1 : start + w->rows[p];
        for (long c = a; c < e; c += GGUF_CHUNK) {
            long ce = c + GGUF_CHUNK < e ? c + GGUF_CHUNK : e;
            for (long m0 = 0; m0 < M; m0 += GGUF_MTILE) {
                long m1 = m0 + GGUF_MTILE < M ? m0 + GGUF_MTILE : M;
                for (long n = c; n < ce; n += NR) {
                    int nr = ce - n < NR ? (int)(ce - n) : NR;
                    const uint8_t *rows = w->data[p] + (n - start) * rb;
                    if (m1 - m0 > 1 && m1 - m0 <= MMAX && has_m(t)) {  /* the blocks unpacked once */
                        float resm[MMAX][NR];
                        dot_rows_m(t, rows, rb, nr, xs + m0, m1 - m0, K, resm);
                        for (long m = m0; m < m1; m++)
                            for (int r = 0; r < nr; r++) {
                                long col = w->index ? w->index[n + r] : n + r;
                                if (out_bf16) ((uint16_t *)out)[m * w->n + col] = f2bf(resm[m - m0][r]);
                                else ((float *)out)[m * w->n + col] = resm[m - m0][r];
                            }
                        continue;
                    }
                    for (long m = m0; m < m1; m++) {
                        float res[NR];
                        dot_rows(t, rows, rb, nr, xs + m, K, res);
                        for (int r = 0; r < nr; r++) {
                            long col = w->index ? w->index[n + r] : n + r;
                            if (out_bf16) ((uint16_t *)out)[m * w->n + col] = f2bf(res[r]);
                            else ((float *)out)[m * w->n + col] = res[r];
                        }
                    }
                }
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

/* A team's product of M activation rows in two phases (cpu_layer.c's verification step): each thread rounds
   its share of the rows into a shared buffer (wslm_gguf_quant, wslm_gguf_xq_size bytes a row), and after a
   barrier takes its weight rows for all M (wslm_gguf_rows_q), each chunk of blocks met by every row while in
   cache, as wslm_gguf_mm does. */
size_t wslm_gguf_xq_size(long K) { return (xq_bytes(K) + 63) & ~(size_t)63; }

void wslm_gguf_quant(const void *wv, const void *x, int x_bf16, void *buf) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    xq_t xs;
    int n32, n256;
    xq_carve(buf, w->k, &xs);
    needs(w, &n32, &n256);
    quantize_x(x, x_bf16, w->k, n32, n256, &xs);
}

/* bufs: M rows per bytes apart (at least wslm_gguf_xq_size(K)), M <= 16 */
int wslm_gguf_rows_q(const void *wv, const void *bufs, size_t per, long M, void *out, int out_bf16, long n0, long n1) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    xq_t xs[16];
    if (M < 1 || M > 16 || per < xq_bytes(w->k)) return -2;
    for (long m = 0; m < M; m++) xq_carve((char *)bufs + per * (size_t)m, w->k, xs + m);
    rows_range(w, xs, M, out, out_bf16, n0, n1);
    return 0;
}

/* ---- prefill: rows dequantized for a GEMM ----------------------------------------------------------
   Many activation rows (a prompt) are compute-bound; without VNNI an int8 dot costs ~3 instructions per 32
   products beside the blocks' unpacking, while a float32 (or bf16) GEMM library multiplies 16-32 a cycle.
   So the caller dequantizes a slice of weight rows once (here) and hands it to torch's GEMM for all rows.
   Values: gguf-py's dequantization exactly (fp32 products of the fp16 scales and the codes). */
static void dequant_row(long t, const uint8_t *p, long K, float *y) {
    long nb = K / block_cols(t), bs = block_bytes(t);
    for (long b = 0; b < nb; b++, p += bs) {
        if (t == GT_Q8_0) {
            float d = h2f(p);
            for (int j = 0; j < 32; j++) y[b * 32 + j] = (float)((const int8_t *)(p + 2))[j] * d;
        } else if (t == GT_Q4_0 || t == GT_Q4_1 || t == GT_Q5_0 || t == GT_Q5_1) {
            int five = t == GT_Q5_0 || t == GT_Q5_1, with_min = t == GT_Q4_1 || t == GT_Q5_1;
            long qs = with_min ? (five ? 8 : 4) : (five ? 6 : 2);
            uint32_t h = 0;
            if (five) memcpy(&h, p + (with_min ? 4 : 2), 4);
            float d = h2f(p), m = with_min ? h2f(p + 2) : 0.0f;
            int off = with_min ? 0 : (five ? 16 : 8);
            for (int j = 0; j < 16; j++) {
                int x0 = (p[qs + j] & 15) | (five ? (((h >> j) << 4) & 0x10) : 0);
                int x1 = (p[qs + j] >> 4) | (five ? ((h >> (j + 12)) & 0x10) : 0);
                y[b * 32 + j] = (float)(x0 - off) * d + m;
                y[b * 32 + j + 16] = (float)(x1 - off) * d + m;
            }
        } else if (t == GT_Q4_K || t == GT_Q5_K) {
            int five = t == GT_Q5_K;
            const uint8_t *qh = p + 16, *qs = p + (five ? 48 : 16);
            float d = h2f(p), dmin = h2f(p + 2);
            for (int j = 0; j < 4; j++) {
                int sc0, m0, sc1, m1;
                scale_min_k4(2 * j, p + 4, &sc0, &m0);
                scale_min_k4(2 * j + 1, p + 4, &sc1, &m1);
                float d0 = d * (float)sc0, d1 = d * (float)sc1, n0 = dmin * (float)m0, n1 = dmin * (float)m1;
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
                    if (five) { lo |= ((qh[l] >> (2 * j)) & 1) << 4; hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4; }
                    y[b * 256 + 64 * j + l] = d0 * (float)lo - n0;
                    y[b * 256 + 64 * j + 32 + l] = d1 * (float)hi - n1;
                }
            }
        } else if (t == GT_Q6_K) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                    int is = l / 16;
                    float *o = y + b * 256 + 128 * h;
                    o[l] = d * (float)sc[8 * h + is] * (float)(((L[l] & 15) | ((H[l] & 3) << 4)) - 32);
                    o[l + 32] = d * (float)sc[8 * h + is + 2] * (float)(((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = d * (float)sc[8 * h + is + 4] * (float)(((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = d * (float)sc[8 * h + is + 6] * (float)(((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32);
                }
        }
    }
}

/* stored rows [n0, n1) of w as fp32 rows of out [n1 - n0, K] (in stored order: the caller places them by
   w's index), split over threads */
int wslm_gguf_dequant(const void *wv, long n0, long n1, float *out, int threads) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    long K = w->k;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n1 - n0 > 1)
#endif
    for (long n = n0; n < n1; n++) {
        long start = 0, p = 0;
        while (p < w->parts - 1 && n >= start + w->rows[p]) start += w->rows[p++];
        long t = w->type[p], rb = K / block_cols(t) * block_bytes(t);
        dequant_row(t, w->data[p] + (n - start) * rb, K, out + (n - n0) * K);
    }
    (void)threads;
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
