"""Linear layers: how a projection keeps its weight (a LinearMethod) and how tensor parallelism splits it.

Two separate concerns, as in vLLM:
- a LinearMethod is the weight format: it sets up the layer's parameters, takes checkpoint tensors as
  they arrive, builds the runtime weight once every part is in (fusing q|k|v, repacking, quantizing on
  the fly), and multiplies. DenseLinearMethod is plain F.linear; QuantizedLinearMethod holds the formats of
  wslm.backend.quant (int8/int4, GGUF, AWQ/GPTQ); get_linear_method picks one from ModelConfig.quantization.
- a layer class is the tensor-parallel role: column-parallel layers (QKV, merged gate/up) keep this rank's
  rows, row-parallel layers keep its input columns and sum the ranks' outputs. At TP=1 all of it is a no-op.

Checkpoint tensors reach a layer through layer.load(param, tensor, shard): `shard` names the part of a
fused layer ("q"/"k"/"v", 0/1 for gate/up) or is None for a tensor that already holds every part
(Phi-3's fused qkv_proj / gate_up_proj), which the layer splits itself."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.distributed.parallel_state import get_tp_rank, get_tp_size, tensor_model_parallel_all_reduce
from wslm.backend.distributed.sharding import (
    local_num_heads,
    local_num_kv_heads,
    shard_dim,
    shard_heads,
    shard_kv_heads,
)
from wslm.backend.quant.shard import narrow


class LinearMethod:
    """A weight format. Subclasses override what differs; layers call these and nothing else.

    Loading collects each part's tensor as it arrives (load_weight), then builds the runtime weight once
    every part is there (process_weights_after_loading): a fused layer's parts may come in any order, and
    a quantized format packs the fused weight in one go."""

    def create_weights(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> None:
        """Set up the layer's parameters (no memory yet: the parts arrive with the checkpoint)."""
        layer.weight = None
        layer.bias = None
        layer.params_dtype = dtype
        layer.device = device

    def load_weight(self, layer: Linear, param: str, index: int, tensor) -> None:
        """Keep part `index` of parameter `param` ('weight' or 'bias'): this rank's slice, as read."""
        layer.pending.setdefault(param, {})[index] = self.prepare_part(layer, param, tensor)

    def quantize_whole(self, layer: Linear, param: str, tensor):
        """A checkpoint tensor as it arrives, before any split (formats that quantize on load do it here)."""
        return tensor

    def prepare_part(self, layer: Linear, param: str, tensor):
        return tensor.to(device=layer.device, dtype=layer.params_dtype)

    def process_weights_after_loading(self, layer: Linear) -> None:
        """Every part is in: build the runtime parameters (fuse the parts along the output rows)."""
        for param, parts in layer.pending.items():
            ordered = [parts[i] for i in range(len(parts))]
            setattr(layer, param, self.fuse(layer, param, ordered))
        layer.pending = {}

    def fuse(self, layer: Linear, param: str, parts: list):
        if len(parts) == 1:
            return parts[0]
        view = adjacent_view(parts)
        return view if view is not None else torch.cat(parts, dim=0).contiguous()

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


def adjacent_view(parts: list) -> torch.Tensor | None:
    """The parts stacked along dim 0 without a copy, when they already lie one after another in one storage
    (a memory-mapped safetensors file stores gate_proj then up_proj so): the fused weight stays pages of the
    file. None when they do not."""
    first = parts[0]
    if not all(isinstance(p, torch.Tensor) and p.is_contiguous() and p.dtype == first.dtype
               and p.shape[1:] == first.shape[1:] and p.device == first.device for p in parts):
        return None
    storage = first.untyped_storage().data_ptr()
    for prev, nxt in zip(parts, parts[1:]):
        if (nxt.untyped_storage().data_ptr() != storage
                or nxt.data_ptr() != prev.data_ptr() + prev.numel() * prev.element_size()):
            return None
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


class DenseLinearMethod(LinearMethod):
    """Full-precision weight [out, in] in the model dtype; one F.linear."""

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


class QuantizedLinearMethod(LinearMethod):
    """Weights held quantized (wslm.backend.quant): GGUF files' tensors repacked as read, AWQ/GPTQ, or
    16-bit checkpoints quantized on load (int8 / int4). Biases stay dense."""

    def __init__(self, quantization: str) -> None:
        from wslm.backend.quant.linear import apply_linear

        self.quantization = quantization
        self._apply = apply_linear  # bound once: an import statement per call costs on a CPU decode step

    def quantize_whole(self, layer: Linear, param: str, tensor):
        """int8 / int4 on the fly quantize the checkpoint's whole tensor, before the tensor-parallel
        split: each rank then holds exactly its slice of what one device would (int8 keeps each row's
        scale over all its columns). int4 groups are sized to this rank's input width, so they never
        straddle two ranks."""
        from wslm.backend.quant.linear import quantize_on_load
        from wslm.backend.quant.registry import quantizes_on_load

        if param == "weight" and isinstance(tensor, torch.Tensor) and quantizes_on_load(self.quantization):
            return quantize_on_load(tensor, self.quantization, group_width=layer.input_size)
        return tensor

    def prepare_part(self, layer: Linear, param: str, tensor):
        if param == "weight" and not isinstance(tensor, torch.Tensor):
            return tensor  # packed for the device once the fused weight is whole
        return tensor.to(device=layer.device, dtype=layer.params_dtype)

    def fuse(self, layer: Linear, param: str, parts: list):
        if param != "weight":
            return super().fuse(layer, param, parts)
        from wslm.backend.quant.linear import finalize, fuse_rows

        return finalize(parts[0] if len(parts) == 1 else fuse_rows(parts), layer.device, layer.params_dtype)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._apply(x, layer.weight, bias)


def get_linear_method(quantization: str | None = None) -> LinearMethod:
    """The LinearMethod for a checkpoint's weight format (ModelConfig.quantization)."""
    if quantization in (None, "", "none"):
        return DenseLinearMethod()
    return QuantizedLinearMethod(quantization)


class Linear:
    """A replicated projection (every rank holds all of it): output_sizes parts stacked along the output.

    Plain attributes rather than an nn.Module: the engine never trains, and calling a bound method is
    the whole per-call overhead."""

    lora = None  # the LoRA hook (wslm/backend/lora/layers.py), set per layer with --enable-lora
    # Whether the bias is added to the finished product (rounded as its own op) rather than inside it: what
    # a back end computing this layer its own way must do to give the same bits (modeling/layers/decode_spec.py).
    bias_after_product = False

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        *,
        bias: bool = False,
        method: LinearMethod | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        shard_names: tuple = (0,),
    ) -> None:
        self.input_size = input_size
        self.output_sizes = list(output_sizes)  # this rank's rows of each part
        self.has_bias = bias
        self.method = method or DenseLinearMethod()
        self.shard_names = shard_names  # how checkpoint names address the parts ("q", "k", "v"; 0, 1)
        self.weight = None  # a tensor, or a quantized weight (LinearMethod decides)
        self.bias: torch.Tensor | None = None
        self.pending: dict[str, dict[int, object]] = {}  # parts read so far, by parameter and part index
        self._loaded: set[tuple[str, object]] = set()
        # LoRA adapters served per request (wslm/backend/lora/layers.py): adds each row's delta after the
        # base product, the base weight untouched; None without --enable-lora.
        self.lora = None
        self.method.create_weights(self, dtype, torch.device(device))

    # ---- loading --------------------------------------------------------------------------------
    def shard(self, part: object, tensor: torch.Tensor, param: str) -> torch.Tensor:
        """This rank's slice of one part as it appears in the checkpoint (replicated: all of it)."""
        return tensor

    def checkpoint_sizes(self) -> list[int]:
        """The parts' row counts in the checkpoint (before any tensor-parallel split)."""
        return self.output_sizes

    def load(self, param: str, tensor: torch.Tensor, shard: object = None) -> None:
        """Load `param` ('weight' or 'bias') of part `shard`, or of every part when shard is None."""
        tensor = self.method.quantize_whole(self, param, tensor)
        if shard is None and len(self.shard_names) > 1:  # a fused checkpoint tensor: split it into its parts
            start = 0
            for part, rows in zip(self.shard_names, self.checkpoint_sizes()):
                self.load(param, narrow(tensor, 0, start, rows), part)
                start += rows
            return
        part = self.shard_names[0] if shard is None else shard
        # Quantized weights are sliced in their own format, scales and groups with them (quant/shard.py).
        piece = self.shard(part, tensor, param)
        self.method.load_weight(self, param, self.shard_names.index(part), piece)
        self._loaded.add((param, part))
        if self.is_loaded():
            self.method.process_weights_after_loading(self)

    def is_loaded(self) -> bool:
        want = len(self.shard_names) * (2 if self.has_bias else 1)
        return len(self._loaded) == want

    def missing(self) -> list[str]:
        params = ("weight", "bias") if self.has_bias else ("weight",)
        return [f"{p}[{s}]" for p in params for s in self.shard_names if (p, s) not in self._loaded]

    # ---- forward --------------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.method.apply(self, x, self.bias)
        return out if self.lora is None else self.lora(x, out)


ReplicatedLinear = Linear


class ColumnParallelLinear(Linear):
    """Output rows split across ranks (each part cut into tp equal slices)."""

    def __init__(self, input_size: int, output_sizes: list[int], **kw) -> None:
        tp = get_tp_size()
        self.full_sizes = list(output_sizes)
        super().__init__(input_size, [s // tp for s in output_sizes], **kw)

    def checkpoint_sizes(self) -> list[int]:
        return self.full_sizes

    def shard(self, part: object, tensor: torch.Tensor, param: str) -> torch.Tensor:
        return shard_dim(tensor, 0)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (gate_proj + up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], **kw) -> None:
        kw.setdefault("shard_names", tuple(range(len(output_sizes))))
        super().__init__(input_size, output_sizes, **kw)


class QKVParallelLinear(Linear):
    """q, k and v projections fused; under tensor parallelism each rank keeps its query heads and the
    KV heads they read (replicated when there are fewer KV heads than ranks)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, **kw) -> None:
        self.head_dim = head_dim
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        self.num_heads = local_num_heads(num_heads)
        self.num_kv_heads = local_num_kv_heads(num_kv_heads)
        q, kv = self.num_heads * head_dim, self.num_kv_heads * head_dim
        kw.setdefault("shard_names", ("q", "k", "v"))
        super().__init__(hidden_size, [q, kv, kv], **kw)

    def checkpoint_sizes(self) -> list[int]:
        kv = self.total_num_kv_heads * self.head_dim
        return [self.total_num_heads * self.head_dim, kv, kv]

    def shard(self, part: object, tensor: torch.Tensor, param: str) -> torch.Tensor:
        if part == "q":
            return shard_heads(tensor, self.total_num_heads, self.head_dim)
        return shard_kv_heads(tensor, self.total_num_kv_heads, self.head_dim)


class RowParallelLinear(Linear):
    """Input columns split across ranks; the partial outputs are summed by one all-reduce (o, down).
    reduce_results=False leaves the sum to the caller, which adds more partial outputs first (Qwen2-MoE's
    shared expert beside the routed experts: one all-reduce for both, as vLLM does)."""

    bias_after_product = True  # once, to the ranks' sum

    def __init__(self, input_size: int, output_size: int, *, reduce_results: bool = True, **kw) -> None:
        self.reduce_results = reduce_results
        super().__init__(input_size // get_tp_size(), [output_size], **kw)

    def shard(self, part: object, tensor: torch.Tensor, param: str) -> torch.Tensor:
        return shard_dim(tensor, 1) if param == "weight" else tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.method.apply(self, x)
        if self.lora is not None:
            out = self.lora(x, out)
        if self.reduce_results:
            out = tensor_model_parallel_all_reduce(out)
        elif get_tp_rank() > 0:
            return out  # the bias is added once to the sum: rank 0's share carries it
        return out if self.bias is None else out + self.bias  # bias added once, after the sum
