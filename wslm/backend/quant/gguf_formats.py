"""Which GGUF storage types the engine keeps in which runtime form (gguf_weights.py, sizes.py)."""

INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # same codes and scales: exact
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "Q3_K")  # no fewer bits than the source
DENSE_TYPES = ("F32", "F16", "BF16")
