"""Which GGUF storage types the engine keeps in which runtime form (gguf_weights.py, sizes.py)."""

# Same codes and scales; exact in float32 (WSLM_QUANT_FLOAT32=1), scales and zeros rounded to bf16 by default.
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
# Re-quantized to int8 per row by default (no fewer bits than the source; error at most half a row step,
# rowmax/254), the file's values in float32 under WSLM_QUANT_FLOAT32=1. docs/benchmarks.md measures both.
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "Q3_K")
DENSE_TYPES = ("F32", "F16", "BF16")
# Kept as the file's own blocks on CPU (gguf_blocks.py, issue 36): name -> (ggml type id, columns per block,
# bytes per block). These come before INT4_TYPES / INT8_TYPES wherever a CPU engine loads them.
BLOCK_FORMATS = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210),
}  # fmt: skip
