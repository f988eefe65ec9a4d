/* GGUF block weights times many activation rows (prefill, big batches): a tiled integer GEMM.

   cpu_gguf.c's kernels read every weight block from the file's layout for each activation row (a few rows
   at a time): its unpacking (nibbles, fifth bits, 6-bit scales) is paid once per row group. Here a chunk of
   weight rows is unpacked once into a panel in cache, eight weight rows interleaved every 4 columns (one
   byte a code; see unpack_group), then every activation row meets it in register tiles of GG_RG groups of
   8 weight rows x GG_RN activation rows: one DPBUSD of a group's code vector with 4 activation codes
   broadcast leaves each weight row's partial dot product in its own lane, so scales are applied to 8 rows
   in one vector operation and no horizontal sum is needed (the layout llama.cpp's repacked Q4_0x8 / Q4_Kx8
   GEMMs use; this is our own code).

   The activation rows are rounded to int8 exactly as cpu_gguf.c rounds them (Q8_0 per 32 columns for the
   32-column types, Q8_K per 256 for the K-quants), so each output equals the block GEMV's within float32
   rounding: a code vector's dot product is exact integer arithmetic (DPBUSD, and the K-quants' integer
   scales by int32 multiplies), the per-block scales
   and minimums are applied in fp32 (w = d q + m: Q4_0 m = -8 d, Q5_0 -16 d, Q6_K -32 d sc, Q4_K -dmin m_j).
   Q8_0's codes are signed: |w| times x with w's sign (the sign trick). A plain C loop does the same where
   the CPU has no AVX2. */
#include "cpu_kernels.h"
#include "cpu_gguf_blocks.h"

/* ---- activation rows ----------------------------------------------------------------------------------
   q [K] int8 codes. The 32-column types: d [K/32] each block's scale, s [K/32] d times its code sum. The K-quants: d [K/256] each super-block's
   scale, bs [K/16] int16 the code sums of every 16 columns. */
typedef struct {
    int8_t *q;
    float *d, *s;
    int16_t *bs;
} gx_t;

static size_t gx_bytes(long K) { return (size_t)K + sizeof(float) * (size_t)(K / 32) * 9 + 64; }

static void gx_carve(char *p, long K, gx_t *o) {
    o->s = (float *)p;
    o->bs = (int16_t *)p;  /* one form a copy: s (32-column types) or bs (K-quants) */
    p += sizeof(float) * (size_t)(K / 32) * 8;
    o->d = (float *)p; p += sizeof(float) * (size_t)(K / 32);
    o->q = (int8_t *)p;
}

/* cols (32 or 256) values of row x from column k0 as int8 codes and their scale: cpu_gguf.c's
   quantize_run, the same operations in the same order (so the same codes and scale) */
static void gx_round(const void *x, int bf16, long k0, long cols, int8_t *q, float *d) {
    float v[256], amax = 0.0f;
    for (long i = 0; i < cols; i++) v[i] = bf16 ? bf2f(((const uint16_t *)x)[k0 + i]) : ((const float *)x)[k0 + i];
#if defined(__AVX2__)
    __m256 mx = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long i = 0; i < cols; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    __m256 iv = _mm256_set1_ps(inv);
    for (long i = 0; i < cols; i += 8) {
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), iv));
        __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w16, w16));
    }
#else
    for (long i = 0; i < cols; i++) { float a = fabsf(v[i]); amax = a > amax ? a : amax; }
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    for (long i = 0; i < cols; i++) q[i] = (int8_t)nearbyintf(v[i] * inv);
#endif
}

static void gx_row(const void *x, int bf16, long K, long cols, gx_t *o) {
    for (long b = 0; b < K / cols; b++) {
        float d;
        gx_round(x, bf16, b * cols, cols, o->q + b * cols, &d);
        if (cols == 256) {
            o->d[b] = d;
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += o->q[b * 256 + g * 16 + i];
                o->bs[b * 16 + g] = (int16_t)sum;
            }
            continue;
        }
        int sum = 0;
        for (int i = 0; i < 32; i++) sum += o->q[b * 32 + i];
        o->d[b] = d;
        o->s[b] = d * (float)sum;
    }
}

/* ---- weight rows unpacked ---------------------------------------------------------------------------------
   codes [K]: one byte a code, in column order (unsigned; Q8_0's signed) */

static void unpack_codes(long t, const uint8_t *restrict p, long K, uint8_t *restrict codes) {
    long nb = K / block_cols(t), bs = block_bytes(t);
    for (long b = 0; b < nb; b++, p += bs) {
        if (t == GT_Q8_0) {
            memcpy(codes + b * 32, p + 2, 32);
        } else if (t == GT_Q4_0 || t == GT_Q4_1 || t == GT_Q5_0 || t == GT_Q5_1) {
            int five = t == GT_Q5_0 || t == GT_Q5_1, with_min = t == GT_Q4_1 || t == GT_Q5_1;
            long qs = with_min ? (five ? 8 : 4) : (five ? 6 : 2);
            uint32_t h = 0;
            if (five) memcpy(&h, p + (with_min ? 4 : 2), 4);
            uint8_t *c = codes + b * 32;
            for (int j = 0; j < 16; j++) {
                c[j] = (uint8_t)((p[qs + j] & 15) | (five ? (((h >> j) << 4) & 0x10) : 0));
                c[j + 16] = (uint8_t)((p[qs + j] >> 4) | (five ? ((h >> (j + 12)) & 0x10) : 0));
            }
        } else if (t == GT_Q4_K || t == GT_Q5_K) {
            int five = t == GT_Q5_K;
            const uint8_t *qh = p + 16, *qs = p + (five ? 48 : 16);
            for (int j = 0; j < 4; j++) {
                uint8_t *lo = codes + b * 256 + 64 * j, *hi = lo + 32;
                for (int l = 0; l < 32; l++) {
                    lo[l] = (uint8_t)((qs[32 * j + l] & 15) | (five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0));
                    hi[l] = (uint8_t)((qs[32 * j + l] >> 4) | (five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0));
                }
            }
        } else if (t == GT_Q6_K) {
            const uint8_t *ql = p, *qh = p + 128;
            for (int h = 0; h < 2; h++) {
                uint8_t *o = codes + b * 256 + 128 * h;
                const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
                for (int l = 0; l < 32; l++) {
                    o[l] = (uint8_t)((L[l] & 15) | ((H[l] & 3) << 4));
                    o[l + 32] = (uint8_t)((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4));
                    o[l + 64] = (uint8_t)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4));
                    o[l + 96] = (uint8_t)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4));
                }
            }
        }
    }
}

/* ---- eight weight rows interleaved -----------------------------------------------------------------------
   The panel's unit is a group of GG_G = 8 weight rows. Codes first (K * 8 bytes): for every 4 columns the
   8 rows' 4 codes, 32 bytes, one vector; so one DPBUSD of it with 4 activation codes broadcast to every
   lane leaves each row's partial dot product in its own lane: a tile's results come out one per lane, with
   no horizontal sums, and a block's scales are applied to 8 rows in one vector operation. Then the aux
   (from byte K * 8), per block:
   32-column types: sc[8], mn[8] float (w = sc q + mn);
   K-quants (GK_AUX bytes a super-block): d[8], dm[8] float, sc[16][8] int32 (each 16 columns' integer scale),
   mp[8][8] int32, each two int16 minimum factors (columns 32p..32p+15, 32p+16..32p+31): w = d sc q - dm mn.
   Rows past a weight's last are zero codes and scales. */
#define GG_G 8
#define GK_AUX (64 + 512 + 256)

static size_t group_bytes(long t, long K) {
    size_t aux = block_cols(t) == 256 ? (size_t)(K / 256) * GK_AUX : (size_t)(K / 32) * 64;
    return ((size_t)K * 8 + aux + 63) & ~(size_t)63;
}

/* the 8 rows' codes (rows: 8 x K bytes) into the group's layout: an 8 x 8 transpose of 4-byte lanes for
   every 32 columns */
static void interleave_codes(const uint8_t *rows, long K, uint8_t *g) {
#if defined(__AVX2__)
    for (long b = 0; b < K / 32; b++) {
        __m256 r[8], t[8], u[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(rows + i * K + b * 32));
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
            u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
            u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
            u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
        }
        float *o = (float *)(g + b * 256);
        for (int c = 0; c < 4; c++) {
            _mm256_storeu_ps(o + 8 * c, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
            _mm256_storeu_ps(o + 8 * (c + 4), _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
        }
    }
#else
    for (int r = 0; r < GG_G; r++)
        for (long c = 0; c < K / 4; c++) memcpy(g + c * 32 + r * 4, rows + r * K + c * 4, 4);
#endif
}

/* nrows (<= 8) weight rows from src (rb bytes a row) into group g; tmp: 8 rows' codes (8 K bytes) */
static void unpack_group(long t, const uint8_t *src, long rb, int nrows, long K, uint8_t *g, uint8_t *tmp) {
    if (nrows < GG_G) {
        memset(g, 0, group_bytes(t, K));
        memset(tmp + nrows * K, 0, (size_t)(GG_G - nrows) * (size_t)K);
    }
    long nb = K / block_cols(t), bs = block_bytes(t);
    for (int r = 0; r < nrows; r++) {
        const uint8_t *row = src + r * rb;
        unpack_codes(t, row, K, tmp + r * K);
        for (long b = 0; b < nb; b++) {
            const uint8_t *p = row + b * bs;
            if (block_cols(t) == 32) {  /* w = d q + m: Q4_0 m = -8 d, Q5_0 -16 d, Q8_0 0 */
                float *a = (float *)(g + K * 8) + b * 16, d = h2f(p);
                a[r] = d;
                a[8 + r] = t == GT_Q4_1 || t == GT_Q5_1 ? h2f(p + 2) : t == GT_Q4_0 ? -8.0f * d : t == GT_Q5_0 ? -16.0f * d : 0.0f;
                continue;
            }
            uint8_t *a = g + K * 8 + b * GK_AUX;
            int32_t sc[16];
            int16_t mn[16];
            float d, dm;
            if (t == GT_Q6_K) {  /* w = d sc (q - 32), scales every 16 columns */
                d = dm = h2f(p + 208);
                for (int h = 0; h < 16; h++) { sc[h] = (int8_t)p[192 + h]; mn[h] = (int16_t)(32 * sc[h]); }
            } else {  /* Q4_K / Q5_K: w = d sc q - dmin m, scale and minimum every 32 columns */
                d = h2f(p);
                dm = h2f(p + 2);
                for (int j = 0; j < 8; j++) {
                    int c, m;
                    scale_min_k4(j, p + 4, &c, &m);
                    sc[2 * j] = sc[2 * j + 1] = c;
                    mn[2 * j] = mn[2 * j + 1] = (int16_t)m;
                }
            }
            memcpy(a + 4 * r, &d, 4);
            memcpy(a + 32 + 4 * r, &dm, 4);
            for (int h = 0; h < 16; h++) memcpy(a + 64 + h * 32 + 4 * r, sc + h, 4);
            for (int q = 0; q < 8; q++) memcpy(a + 576 + q * 32 + 4 * r, mn + 2 * q, 4);
        }
    }
    interleave_codes(tmp, K, g);
}

/* ---- register tiles ------------------------------------------------------------------------------------
   RG groups (gs bytes apart) x RN activation rows: res[j * RG * 8 + i * 8 + r]. Every output's sum runs
   the same operations in the same order whatever the tile's shape, so a row's result never depends on
   where the tiles fall. */
#ifndef GG_RG
#define GG_RG 2  /* groups of 8 weight rows a tile (at most 2) */
#endif
#ifndef GG_RN
#define GG_RN 6  /* activation rows a tile (at most 6): best of 2-6 on Zen 4, also built as AVX2 */
#endif
#define GAI static inline __attribute__((always_inline))

#if defined(__AVX2__) && defined(__FMA__)
#define GG_AVX2 1
static inline __m256i bc4(const void *p) {  /* 4 bytes to every 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
/* 32-column types: per block, each row's integer dot (8 DPBUSD, Q8_0's signed codes by the sign trick) in
   fp32 times sc d_x, plus mn times the row's d_x-scaled code sum */
GAI void tile32(const uint8_t *g0, long gs, const gx_t *x, long K, float *res, const int RG, const int RN,
                const int sgn) {
    __m256 acc[2][6];
    for (int i = 0; i < RG; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = _mm256_setzero_ps();
    for (long b = 0; b < K / 32; b++) {
        __m256i is[2][6];
        for (int i = 0; i < RG; i++)
            for (int j = 0; j < RN; j++) is[i][j] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            __m256i w[2], aw[2];
            for (int i = 0; i < RG; i++) {
                w[i] = _mm256_loadu_si256((const __m256i *)(g0 + i * gs + (b * 8 + c) * 32));
                if (sgn) aw[i] = _mm256_sign_epi8(w[i], w[i]);
            }
            for (int j = 0; j < RN; j++) {
                __m256i xv = bc4(x[j].q + b * 32 + c * 4);
                for (int i = 0; i < RG; i++)
                    is[i][j] = sgn ? DPBUSD(is[i][j], aw[i], _mm256_sign_epi8(xv, w[i])) : DPBUSD(is[i][j], w[i], xv);
            }
        }
        for (int i = 0; i < RG; i++) {
            const float *a = (const float *)(g0 + i * gs + K * 8) + b * 16;
            __m256 sc = _mm256_loadu_ps(a), mn = _mm256_loadu_ps(a + 8);
            for (int j = 0; j < RN; j++) {
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i][j]), _mm256_mul_ps(sc, _mm256_set1_ps(x[j].d[b])),
                                            acc[i][j]);
                acc[i][j] = _mm256_fmadd_ps(mn, _mm256_set1_ps(x[j].s[b]), acc[i][j]);
            }
        }
    }
    for (int j = 0; j < RN; j++)
        for (int i = 0; i < RG; i++) _mm256_storeu_ps(res + (j * RG + i) * 8, acc[i][j]);
}
/* K-quants: per super-block, each row's integer sum of sc times its SUB-column dots (SUB 32: Q4_K / Q5_K,
   whose scales change every 32 columns; 16: Q6_K), then d d_x times it minus dm d_x times the integer sum
   of the minimum factors times the activation's 16-column code sums */
GAI void tilek(const uint8_t *g0, long gs, const gx_t *x, long K, float *res, const int RG, const int RN,
               const int SUB) {
    __m256 acc[2][6];
    for (int i = 0; i < RG; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = _mm256_setzero_ps();
    for (long b = 0; b < K / 256; b++) {
        __m256i isum[2][6];
        for (int i = 0; i < RG; i++)
            for (int j = 0; j < RN; j++) isum[i][j] = _mm256_setzero_si256();
        for (int s = 0; s < 256 / SUB; s++) {
            __m256i t[2][6];
            for (int i = 0; i < RG; i++)
                for (int j = 0; j < RN; j++) t[i][j] = _mm256_setzero_si256();
            for (int c = 0; c < SUB / 4; c++) {
                long c4 = b * 64 + s * (SUB / 4) + c;
                __m256i w[2];
                for (int i = 0; i < RG; i++) w[i] = _mm256_loadu_si256((const __m256i *)(g0 + i * gs + c4 * 32));
                for (int j = 0; j < RN; j++) {
                    __m256i xv = bc4(x[j].q + c4 * 4);
                    for (int i = 0; i < RG; i++) t[i][j] = DPBUSD(t[i][j], w[i], xv);
                }
            }
            for (int i = 0; i < RG; i++) {
                __m256i sc = _mm256_loadu_si256((const __m256i *)(g0 + i * gs + K * 8 + b * GK_AUX + 64) + s * (SUB / 16));
                for (int j = 0; j < RN; j++) isum[i][j] = _mm256_add_epi32(isum[i][j], _mm256_mullo_epi32(t[i][j], sc));
            }
        }
        __m256i mi[2][6];
        for (int i = 0; i < RG; i++)
            for (int j = 0; j < RN; j++) mi[i][j] = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++) {
            __m256i mp[2];
            for (int i = 0; i < RG; i++)
                mp[i] = _mm256_loadu_si256((const __m256i *)(g0 + i * gs + K * 8 + b * GK_AUX + 576) + p);
            for (int j = 0; j < RN; j++) {
                __m256i bs = bc4(x[j].bs + b * 16 + 2 * p);
                for (int i = 0; i < RG; i++) mi[i][j] = MADD_ACC(mi[i][j], mp[i], bs);
            }
        }
        for (int i = 0; i < RG; i++) {
            const float *a = (const float *)(g0 + i * gs + K * 8 + b * GK_AUX);
            __m256 d = _mm256_loadu_ps(a), dm = _mm256_loadu_ps(a + 8);
            for (int j = 0; j < RN; j++) {
                __m256 dx = _mm256_set1_ps(x[j].d[b]);
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][j]), _mm256_mul_ps(d, dx), acc[i][j]);
                acc[i][j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi[i][j]), _mm256_mul_ps(dm, dx), acc[i][j]);
            }
        }
    }
    for (int j = 0; j < RN; j++)
        for (int i = 0; i < RG; i++) _mm256_storeu_ps(res + (j * RG + i) * 8, acc[i][j]);
}
#else
/* the plain loops: the same sums lane by lane */
GAI void tile32(const uint8_t *g0, long gs, const gx_t *x, long K, float *res, const int RG, const int RN,
                const int sgn) {
    for (int i = 0; i < RG; i++)
        for (int j = 0; j < RN; j++)
            for (int r = 0; r < GG_G; r++) {
                const uint8_t *g = g0 + i * gs;
                const float *a = (const float *)(g + K * 8);
                float acc = 0.0f;
                for (long b = 0; b < K / 32; b++) {
                    int s = 0;
                    for (int l = 0; l < 32; l++) {
                        uint8_t c = g[(b * 8 + l / 4) * 32 + r * 4 + l % 4];
                        s += (sgn ? (int)(int8_t)c : (int)c) * x[j].q[b * 32 + l];
                    }
                    acc += (float)s * (a[b * 16 + r] * x[j].d[b]);
                    acc += a[b * 16 + 8 + r] * x[j].s[b];
                }
                res[(j * RG + i) * 8 + r] = acc;
            }
}
GAI void tilek(const uint8_t *g0, long gs, const gx_t *x, long K, float *res, const int RG, const int RN,
               const int SUB) {
    (void)SUB;
    for (int i = 0; i < RG; i++)
        for (int j = 0; j < RN; j++)
            for (int r = 0; r < GG_G; r++) {
                const uint8_t *g = g0 + i * gs;
                float acc = 0.0f;
                for (long b = 0; b < K / 256; b++) {
                    const uint8_t *a = g + K * 8 + b * GK_AUX;
                    long is = 0, im = 0;
                    for (int l = 0; l < 256; l++) {
                        int32_t sc;
                        memcpy(&sc, a + 64 + (l / 16) * 32 + 4 * r, 4);
                        is += (long)sc * g[(b * 64 + l / 4) * 32 + r * 4 + l % 4] * x[j].q[b * 256 + l];
                    }
                    for (int h = 0; h < 16; h++) {
                        int16_t mn;
                        memcpy(&mn, a + 576 + (h / 2) * 32 + 4 * r + 2 * (h % 2), 2);
                        im += (long)mn * x[j].bs[b * 16 + h];
                    }
                    float d, dm;
                    memcpy(&d, a + 4 * r, 4);
                    memcpy(&dm, a + 32 + 4 * r, 4);
                    acc += (float)is * (d * x[j].d[b]) - (float)im * (dm * x[j].d[b]);
                }
                res[(j * RG + i) * 8 + r] = acc;
            }
}
#endif

typedef void (*tile_fn)(const uint8_t *, long, const gx_t *, long, float *);
#define GG_TILE(RG, RN)                                                                                       \
    static void t32_##RG##_##RN(const uint8_t *g, long gs, const gx_t *x, long K, float *r) {                 \
        tile32(g, gs, x, K, r, RG, RN, 0);                                                                    \
    }                                                                                                         \
    static void t8_##RG##_##RN(const uint8_t *g, long gs, const gx_t *x, long K, float *r) {                  \
        tile32(g, gs, x, K, r, RG, RN, 1);                                                                    \
    }                                                                                                         \
    static void tk_##RG##_##RN(const uint8_t *g, long gs, const gx_t *x, long K, float *r) {                  \
        tilek(g, gs, x, K, r, RG, RN, 32);                                                                    \
    }                                                                                                         \
    static void t6_##RG##_##RN(const uint8_t *g, long gs, const gx_t *x, long K, float *r) {                  \
        tilek(g, gs, x, K, r, RG, RN, 16);                                                                    \
    }
#define GG_TILES_RN(RN) GG_TILE(1, RN) GG_TILE(2, RN)
GG_TILES_RN(1) GG_TILES_RN(2) GG_TILES_RN(3) GG_TILES_RN(4) GG_TILES_RN(5) GG_TILES_RN(6)
#define GG_ROW(P, RG) {P##_##RG##_1, P##_##RG##_2, P##_##RG##_3, P##_##RG##_4, P##_##RG##_5, P##_##RG##_6}
#define GG_KIND(P) {GG_ROW(P, 1), GG_ROW(P, 2)}
static const tile_fn tiles[4][2][6] = {GG_KIND(t32), GG_KIND(t8), GG_KIND(tk), GG_KIND(t6)};

/* ---- the product ----------------------------------------------------------------------------------- */
#ifndef GG_PANEL_BYTES
#define GG_PANEL_BYTES (160 * 1024)  /* one thread's unpacked weight rows: in L2 beside the activations' tiles */
#endif

#ifndef GG_MBLOCK
#define GG_MBLOCK 256  /* Zen 4, 3B shapes: 256 over 128 +3-10% at 512 and 2048 rows (one unpack fewer) */
#endif

typedef struct {  /* a run of weight rows of one part */
    long part, r0, r1, start;  /* rows [r0, r1) of the fused weight; start: the part's first row */
} gg_chunk;

/* weight rows c times activation rows [m_lo, m_hi); panel: the chunk's groups, tmp: unpack_group's */
static void do_chunk(const wslm_gguf *w, const gg_chunk *c, const gx_t *xs32, const gx_t *xs256, long m_lo,
                     long m_hi, uint8_t *panel, uint8_t *tmp, void *out, int out_bf16) {
    long K = w->k, t = w->type[c->part], rb = K / block_cols(t) * block_bytes(t);
    long nr = c->r1 - c->r0, ng = (nr + GG_G - 1) / GG_G, gs = (long)group_bytes(t, K);
    for (long gi = 0; gi < ng; gi++) {
        long r = gi * GG_G;
        unpack_group(t, w->data[c->part] + (c->r0 - c->start + r) * rb, rb, nr - r < GG_G ? (int)(nr - r) : GG_G, K,
                     panel + gi * gs, tmp);
    }
    const gx_t *xs = block_cols(t) == 256 ? xs256 : xs32;
    int kind = t == GT_Q6_K ? 3 : block_cols(t) == 256 ? 2 : t == GT_Q8_0;
    float res[GG_RN * 2 * GG_G];
    for (long m0 = m_lo; m0 < m_hi; m0 += GG_RN) {
        int rn = m_hi - m0 < GG_RN ? (int)(m_hi - m0) : GG_RN;
        for (long g0 = 0; g0 < ng; g0 += GG_RG) {
            int rg = ng - g0 < GG_RG ? (int)(ng - g0) : GG_RG;
            tiles[kind][rg - 1][rn - 1](panel + g0 * gs, gs, xs + m0, K, res);
            for (int j = 0; j < rn; j++)
                for (int i = 0; i < rg * GG_G; i++) {
                    long row = (g0 * GG_G + i);
                    if (row >= nr) break;
                    long n = c->r0 + row, col = w->index ? w->index[n] : n;
                    size_t at = (size_t)(m0 + j) * (size_t)w->n + (size_t)col;
                    float v = res[j * rg * GG_G + i];
                    if (out_bf16) ((uint16_t *)out)[at] = f2bf(v);
                    else ((float *)out)[at] = v;
                }
        }
    }
}

/* 1 when wslm_gguf_gemm takes weight w (every part a type it knows, K whole blocks) */
int wslm_gguf_gemm_takes(const void *wv) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    if (w->parts < 1 || w->parts > GGUF_PARTS) return 0;
    for (long p = 0; p < w->parts; p++)
        if (!block_bytes(w->type[p]) || w->k % block_cols(w->type[p])) return 0;
    return 1;
}

/* x [M, K] (bf16 or fp32) @ W.T -> out [M, n] (bf16 or fp32), W a cpu_gguf.c weight. Chunks of weight rows
   are split over threads. Returns 0, -1 out of memory, -2 a weight it does not take. */
int wslm_gguf_gemm(const void *wv, const void *x, long M, int x_bf16, void *out, int out_bf16, int threads) {
    const wslm_gguf *w = (const wslm_gguf *)wv;
    if (!wslm_gguf_gemm_takes(wv)) return -2;
    long K = w->k;
    int n32 = 0, n256 = 0;
    for (long p = 0; p < w->parts; p++) *(block_cols(w->type[p]) == 256 ? &n256 : &n32) = 1;
    size_t per = (gx_bytes(K) + 63) & ~(size_t)63;
    int forms = n32 + n256;
    char *mem = (char *)malloc(per * (size_t)M * (size_t)forms + sizeof(gx_t) * (size_t)M * 2);
    if (!mem) return -1;
    gx_t *xs32 = (gx_t *)(mem + per * (size_t)M * (size_t)forms), *xs256 = xs32 + M;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && M > 1)
#endif
    for (long m = 0; m < M; m++) {
        const char *row = (const char *)x + (size_t)(m * K) * (x_bf16 ? 2 : 4);
        int f = 0;
        if (n32) { gx_carve(mem + per * ((size_t)m * forms + f++), K, xs32 + m); gx_row(row, x_bf16, K, 32, xs32 + m); }
        if (n256) { gx_carve(mem + per * ((size_t)m * forms + f), K, xs256 + m); gx_row(row, x_bf16, K, 256, xs256 + m); }
    }
    /* chunks of rows a panel holds (whole tiles of GG_RG groups), never across parts */
    long count = 0, start = 0, panel_bytes = 0, rows[GGUF_PARTS];
    for (long p = 0; p < w->parts; p++) {
        long gb = (long)group_bytes(w->type[p], K), tile = GG_G * GG_RG;
        rows[p] = GG_PANEL_BYTES / gb / GG_RG * tile;
        if (rows[p] < tile) rows[p] = tile;
        if (rows[p] / GG_G * gb > panel_bytes) panel_bytes = rows[p] / GG_G * gb;
        count += (w->rows[p] + rows[p] - 1) / rows[p];
    }
    gg_chunk *chunks = (gg_chunk *)malloc(sizeof(gg_chunk) * (size_t)(count ? count : 1));
    if (!chunks) { free(mem); return -1; }
    count = 0;
    for (long p = 0; p < w->parts; p++) {
        for (long r = 0; r < w->rows[p]; r += rows[p])
            chunks[count++] = (gg_chunk){p, start + r, start + (r + rows[p] < w->rows[p] ? r + rows[p] : w->rows[p]),
                                         start};
        start += w->rows[p];
    }
    int failed = 0;
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads) if (threads > 1 && count > 1)
#endif
    {
        int t = 0, nt = 1;
#if defined(_OPENMP)
        t = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
        uint8_t *panel = (uint8_t *)malloc((size_t)panel_bytes + (size_t)K * 8 + 128);
        if (!panel) {
#if defined(_OPENMP)
#pragma omp atomic write
#endif
            failed = 1;
        } else {
            /* activation rows a block at a time, so that the block's int8 copy stays in cache while every
               chunk of this thread's weight rows meets it (each chunk unpacked again per block, which costs
               ~10% of the products at 128 rows a block) */
            long mb = M <= 2 * GG_MBLOCK ? M : GG_MBLOCK;
            for (long m0 = 0; m0 < M; m0 += mb)
                for (long c = count * t / nt; c < count * (t + 1) / nt; c++)
                    do_chunk(w, chunks + c, xs32, xs256, m0, m0 + mb < M ? m0 + mb : M, panel,
                             panel + panel_bytes + 64, out, out_bf16);
            free(panel);
        }
    }
    (void)threads;
    free(chunks);
    free(mem);
    return failed ? -1 : 0;
}

/* sizeof the weight struct this file reads (cpu_gguf_gemm.py checks it against cpu_gguf.py's GGUFStruct) */
long wslm_gguf_gemm_struct_bytes(void) { return (long)sizeof(wslm_gguf); }

/* 256 where the tiles run AVX2 code here, 0 where they run the plain loop */
int wslm_gguf_gemm_native(void) {
#if defined(GG_AVX2)
    return 256;
#else
    return 0;
#endif
}
