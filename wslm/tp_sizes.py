"""Which --tensor-parallel-size values fit a model: pure arithmetic, no torch, so the engine's start-up check
(parallel_state.check_divisible), `wslm doctor` and the GUI (whose Windows bundle carries no backend) apply
one rule and offer exactly the sizes the engine accepts.

How the engine splits (modeling/layers/): attention heads and every MLP width (dense, MoE experts', shared
expert's) are cut into equal parts; KV heads are cut too, or replicated when fewer than the ranks; the
row-parallel layers (o, down) take their input columns in shards, and a 4-bit checkpoint (AWQ/GPTQ, GGUF)
must leave whole quantization groups on each rank (quant_group_size: the format's own answer,
wslm.backend.quant QuantMethod.group_size, which `wslm models list` reports). Routed experts are kept quantized too (layers/moe.py):
their down projections' input width (the experts' width) must leave whole groups as well."""

from __future__ import annotations

# The `wslm models list --json` / `models info --json` fields the rule reads, and its keyword for each.
MODEL_FIELDS = {
    "num_attention_heads": "num_heads",
    "num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "moe_intermediate_size": "moe_intermediate_size",
    "shared_expert_intermediate_size": "shared_expert_intermediate_size",
    "quant_group_size": "quant_group_size",
}


def model_facts(info: dict | None) -> dict:
    """The rule's keywords from a `wslm models list/info` JSON entry (missing facts are not checked)."""
    info = info or {}
    return {kw: info.get(key) for key, kw in MODEL_FIELDS.items() if info.get(key)}


def refusal(size: int, num_heads: int | None = None, num_kv_heads: int | None = None,
            intermediate_size: int | None = None, *, head_dim: int | None = None,
            moe_intermediate_size: int | None = None, shared_expert_intermediate_size: int | None = None,
            quant_group_size: int | None = None) -> str:  # fmt: skip
    """"" when the model splits `size` ways, else why not (a phrase for an error message)."""
    if size < 1:
        return "a size must be 1 or more"
    if num_heads and num_heads % size:
        return f"{num_heads} attention heads"
    if num_kv_heads and (num_kv_heads % size if num_kv_heads >= size else size % num_kv_heads):
        return f"{num_kv_heads} KV heads"
    widths = [w for w in (intermediate_size, moe_intermediate_size, shared_expert_intermediate_size) if w]
    if any(w % size for w in widths):
        return f"MLP width{'s' if len(widths) > 1 else ''} {', '.join(map(str, widths))}"
    if quant_group_size and size > 1:  # one rank holds every group whole
        # Row-parallel input widths held in 4 bits: attention output, dense MLP, routed and shared experts.
        attention = num_heads * head_dim if num_heads and head_dim else None
        quantized = [w for w in (attention, intermediate_size, moe_intermediate_size,
                                 shared_expert_intermediate_size) if w]  # fmt: skip
        if any(w % size or (w // size) % quant_group_size for w in quantized):
            return (f"4-bit groups of {quant_group_size} columns (row-parallel input widths "
                    f"{', '.join(map(str, quantized))} into {size} shards)")  # fmt: skip
    return ""


def fits(size: int, *args: int | None, **facts: int | None) -> bool:
    """The rule the engine enforces at start (parallel_state.check_divisible); arguments as refusal's."""
    return not refusal(size, *args, **facts)


def tensor_parallel_sizes(gpu_count: int, *args: int | None, **facts: int | None) -> list[int]:
    """Sizes from 1 to the GPU count that split the model evenly (all of them when the model is unknown);
    model facts as refusal's arguments."""
    return [n for n in range(1, max(1, gpu_count) + 1) if fits(n, *args, **facts)]
