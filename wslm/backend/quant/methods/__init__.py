"""The built-in weight formats, one file each (each registers its QuantMethod on import; registry.py imports
them all). Their kernels and runtime weight classes live beside them in wslm/backend/quant/: int8.py, int4.py
(shared by every 4-bit format), gguf_blocks.py."""
