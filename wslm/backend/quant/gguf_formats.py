"""Which GGUF storage types the engine keeps in which runtime form (gguf_weights.py, sizes.py)."""

# Same codes and scales; exact in float32 (WSLM_QUANT_FLOAT32=1), scales and zeros rounded to bf16 by default.
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
# Re-quantized to int8 per row by default (no fewer bits than the source; error at most half a row step,
# rowmax/254), the file's values in float32 under WSLM_QUANT_FLOAT32=1. docs/benchmarks.md measures both.
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "Q3_K")
DENSE_TYPES = ("F32", "F16", "BF16")
