"""What the CPU decode back ends (decode_eager.py, decode_compiled.py, decode_native.py) share: the model's
layers as its family describes them (`model.decode_layers()`, modeling/layers/decode_spec.py), checked once
for what all three need, and the few things each derives the same way from a DecodeLayer. Each back end
builds its own form of the layers from these specs, and the weights from their kernel descriptions
(quant/kernel.py); none reads another back end's state."""

from __future__ import annotations

import torch

from wslm import envs
from wslm.backend.modeling.layers.decode_spec import DecodeLayer
from wslm.backend.quant.kernel import WeightKernel, weight_kernel
from wslm.kernels.dispatch import selected_backend

ENV_VAR = "WSLM_CPU_FAST_DECODE"  # off: none of the CPU decode back ends runs (the model's forward serves)
NOT_FAST = "the model does not take the CPU fast decode path"


def decode_specs(model, kv_pool: torch.Tensor) -> list[DecodeLayer] | str:
    """The model's layers for the CPU decode back ends, or why they cannot compute its decode steps."""
    from wslm.backend.distributed.parallel_state import get_tp_size

    if not envs.get(ENV_VAR):
        return f"{ENV_VAR}=0"
    if model.device.type != "cpu" or selected_backend(model.device) != "torch":
        return "not the CPU PyTorch kernels"
    if get_tp_size() != 1:
        return "tensor parallelism"
    if kv_pool.dtype != model.dtype:
        return "a KV cache dtype other than the model's"
    describe = getattr(model, "decode_layers", None)
    specs = describe() if describe is not None else f"{type(model).__name__} describes no decode layers"
    if isinstance(specs, str):
        return specs
    for spec in specs:
        kernel = {kernel_dtype(lin) for lin in linears(spec) if lin is not None} - {model.dtype, None}
        if kernel and (model.dtype != torch.float32 or kernel != {torch.bfloat16}):
            return "weights computing in another dtype"
    return specs


def linears(spec: DecodeLayer) -> tuple:
    """The layer's four projections (the MLP's two None where it runs as it is)."""
    return spec.qkv_proj, spec.o_proj, spec.gate_up_proj, spec.down_proj


def kernel_of(linear) -> WeightKernel | str:
    return weight_kernel(linear.weight)


def kernel_dtype(linear) -> torch.dtype | None:
    """The activations' dtype the layer's products take (None: as they come, or the weight's own apply)."""
    k = kernel_of(linear)
    return None if isinstance(k, str) else k.dtype


def bias_after(linear) -> bool:
    """Whether the layer adds its bias to the finished product (then so must a back end, for the same bits)."""
    return linear.bias is not None and bool(getattr(linear, "bias_after_product", False))


def qk_norm_weight(spec: DecodeLayer) -> torch.Tensor | None:
    """One norm weight over the q|k heads side by side [heads + kv_heads, head_dim]: each head row is normed
    on its own, so stacking the q and k weights per head computes both per-head RMS norms in one op."""
    if spec.q_norm is None:
        return None
    qw, kw = spec.q_norm.weight, spec.k_norm.weight
    return torch.cat([qw.expand(spec.heads, -1), kw.expand(spec.kv_heads, -1)])
