/* The GGUF block types the CPU kernels multiply in place, and the weight they are handed: shared by
   cpu_gguf.c (GEMV, decode) and cpu_gguf_gemm.c (GEMM, prefill); cpu_gguf.py's GGUFStruct fills the struct. */
#ifndef WSLM_CPU_GGUF_BLOCKS_H
#define WSLM_CPU_GGUF_BLOCKS_H
#include <stdint.h>

/* ggml's type numbers */
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

static inline long block_cols(long t) { return (t == GT_Q4_K || t == GT_Q5_K || t == GT_Q6_K) ? 256 : 32; }
static inline long block_bytes(long t) {
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
#endif
