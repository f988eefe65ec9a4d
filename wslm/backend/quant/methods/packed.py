"""What AWQ and GPTQ checkpoints share: 4-bit codes packed in int32 words with per-group scales and zeros,
config.json's quantization_config naming bits and group_size, repacked at load to int4 (packed_checkpoint.py)."""

from __future__ import annotations

from wslm.backend.quant.method import QuantMethod

DEFAULT_GROUP_SIZE = 128  # configs that do not say their group_size


class PackedInt4Method(QuantMethod):
    prequantized = True
    weight_kinds: tuple[str, ...] = ("int4",)

    def group_size(self, quant_config: dict | None) -> int | None:
        q = quant_config or {}
        return int(q.get("group_size", q.get("q_group_size", DEFAULT_GROUP_SIZE)))

    def check_checkpoint(self, quant_config: dict) -> None:
        q, upper = quant_config, (self.name or "").upper()
        bits = q.get("bits") or q.get("w_bit")
        if bits is not None and int(bits) != 4:
            raise ValueError(f"This {upper} checkpoint has {bits}-bit weights; wslm runs 4-bit AWQ/GPTQ only. Use "
                             "the model's 4-bit AWQ/GPTQ build, a GGUF, or the unquantized repo with --quantization int8.")
        if self.group_size(q) <= 0:
            raise ValueError(f"{upper} checkpoints without groups (group_size {self.group_size(q)}) are not "
                             "supported yet. Use a grouped build of the model (group_size 128 is usual) or a GGUF.")

    def to_codes(self, parts: dict, quant_config: dict):
        """One linear's pieces (qweight, qzeros, scales, maybe g_idx) as int4.Int4Codes."""
        raise NotImplementedError

    def parts_complete(self, parts: dict) -> bool:
        """Whether a linear's pieces are all there (more may still come: GPTQ's g_idx)."""
        return all(p in parts for p in ("qweight", "qzeros", "scales"))

    def parts_enough(self, parts: dict) -> bool:
        """Whether the pieces left at the end of the checkpoint make a linear (GPTQ saved without g_idx)."""
        return False

    def iter_weights(self, source, dtype, no_mmap, read):
        from wslm.backend.quant.packed_checkpoint import repack
        from wslm.backend.quant.registry import read_quant_config

        return repack(read(), self, read_quant_config(source.folder))
