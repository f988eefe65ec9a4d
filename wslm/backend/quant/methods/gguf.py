"""GGUF files (`quantization="gguf"`, found by the .gguf suffix): read tensor by tensor from the memory-mapped
file (gguf_weights.py); the block types kernels compute in place (gguf_blocks.py), others repacked to int4 /
int8. int8 / int4 asked on top apply to the file's dense tensors."""

from __future__ import annotations

from wslm.backend.quant.method import QuantMethod
from wslm.backend.quant.registry import register_method

GROUP_SIZE = 32  # GGUF's 4-bit types are held as int4 codes with groups of 32 columns


class GGUFMethod(QuantMethod):
    name = "gguf"
    description = ("GGUF file: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K computed in the file's own blocks, "
                   "memory-mapped; other types repacked (int4 / int8)")
    label = "GGUF"
    weight_kinds = ("gguf", "int4", "int8")
    prequantized = True
    file_suffixes = (".gguf",)

    def resolve(self, requested: QuantMethod | None) -> str | None:
        # A GGUF file is "gguf" whatever else was asked; int8/int4 apply to its dense tensors (all of them
        # under WSLM_GGUF_DEQUANTIZE=1).
        return requested.name if requested is not None and requested.on_the_fly else self.name

    def group_size(self, quant_config: dict | None) -> int | None:
        return GROUP_SIZE

    def stored_bytes(self, source) -> dict[str, int]:
        """Each weight's bytes in the file, by the name iter_weights yields it under (a stacked MoE tensor's
        bytes shared by its experts). A name not found counts 0 (the load still ends at 100%)."""
        import re

        from wslm.backend.quant.gguf_file import GGUFFile
        from wslm.backend.quant.gguf_weights import _EXPERT_NAMES, hf_name

        reader = GGUFFile(source.gguf_path)
        try:
            arch = str(reader.values.get("general.architecture") or "llama")
            sizes: dict[str, int] = {}
            for t in reader.tensors:
                m = re.fullmatch(r"blk\.(\d+)\.(ffn_\w+_exps)\.weight", t.name)
                if m and m.group(2) in _EXPERT_NAMES:
                    experts = int(t.shape[-1]) if t.shape else 1
                    for e in range(experts):
                        name = f"model.layers.{m.group(1)}.mlp.experts.{e}.{_EXPERT_NAMES[m.group(2)]}.weight"
                        sizes[name] = t.n_bytes // max(1, experts)
                elif (name := hf_name(t.name, arch)) is not None:
                    sizes[name] = t.n_bytes
            return sizes
        finally:
            reader.close()

    def iter_weights(self, source, dtype, no_mmap, read=None):
        # Straight from the file, kept quantized: faster than reading a converted copy back, and the model
        # never exists in full precision (the converted-copy cache keeps only the tokenizer and config).
        from wslm.backend.quant.gguf_weights import iter_gguf_weights

        return iter_gguf_weights(source.gguf_path, dtype, not no_mmap)


METHOD = register_method(GGUFMethod(), {"gguf": ("wslm.backend.quant.gguf_blocks", "GGUFBlockWeight")})
