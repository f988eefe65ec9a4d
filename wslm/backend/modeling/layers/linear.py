"""Linear layers: how a projection keeps its weight (a LinearMethod) and how tensor parallelism splits it.

Two separate concerns, as in vLLM:
- a LinearMethod is the weight format: it creates the layer's parameters, copies checkpoint tensors into
  them, may repack them once loading is done, and multiplies. DenseLinearMethod is plain F.linear; the
  quantized formats (int8/int4, GGUF, AWQ/GPTQ) are further LinearMethods picked by get_linear_method.
- a layer class is the tensor-parallel role: column-parallel layers (QKV, merged gate/up) keep this rank's
  rows, row-parallel layers keep its input columns and sum the ranks' outputs. At TP=1 all of it is a no-op.

Checkpoint tensors reach a layer through layer.load(param, tensor, shard): `shard` names the part of a
fused layer ("q"/"k"/"v", 0/1 for gate/up) or is None for a tensor that already holds every part
(Phi-3's fused qkv_proj / gate_up_proj), which the layer splits itself."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.distributed.parallel_state import get_tp_size, tensor_model_parallel_all_reduce
from wslm.backend.distributed.sharding import (
    local_num_heads,
    local_num_kv_heads,
    shard_dim,
    shard_heads,
    shard_kv_heads,
)


class LinearMethod:
    """A weight format. Subclasses override what differs; the layer calls these and nothing else."""

    def create_weights(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> None:
        """Set the layer's parameters: an output of sum(layer.output_sizes) rows over layer.input_size."""
        raise NotImplementedError

    def load_weight(self, layer: Linear, param: str, offset: int, tensor: torch.Tensor) -> None:
        """Copy a checkpoint tensor (this rank's slice) into rows offset.. of parameter `param`."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Linear) -> None:
        """Called once every part is loaded (repacking, quantizing on the fly). Dense: nothing to do."""

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class DenseLinearMethod(LinearMethod):
    """Full-precision weight [out, in] in the model dtype; one F.linear."""

    def create_weights(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> None:
        out = sum(layer.output_sizes)
        # torch.empty: pages are only touched when the checkpoint's rows are copied in.
        layer.weight = torch.empty(out, layer.input_size, dtype=dtype, device=device)
        layer.bias = torch.empty(out, dtype=dtype, device=device) if layer.has_bias else None

    def load_weight(self, layer: Linear, param: str, offset: int, tensor: torch.Tensor) -> None:
        target = getattr(layer, param)
        if param == "weight" and tensor.shape[-1] != target.shape[-1]:
            raise ValueError(
                f"weight has {tensor.shape[-1]} input columns, the model expects {target.shape[-1]}"
            )
        target[offset : offset + tensor.shape[0]].copy_(tensor)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


def get_linear_method(quantization: str | None = None) -> LinearMethod:
    """The LinearMethod for a checkpoint's weight format (ModelConfig.quantization)."""
    if quantization in (None, "", "none"):
        return DenseLinearMethod()
    raise ValueError(f"quantization={quantization!r} is not supported yet (supported: none).")


class Linear:
    """A replicated projection (every rank holds all of it): output_sizes parts stacked along the output.

    Plain attributes rather than an nn.Module: the engine never trains, and calling a bound method is
    the whole per-call overhead."""

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
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._loaded: set[tuple[str, object]] = set()
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
        if shard is None and len(self.shard_names) > 1:
            for part, piece in zip(self.shard_names, tensor.split(self.checkpoint_sizes(), dim=0)):
                self.load(param, piece, part)
            return
        part = self.shard_names[0] if shard is None else shard
        idx = self.shard_names.index(part)
        piece = self.shard(part, tensor, param)
        self.method.load_weight(self, param, sum(self.output_sizes[:idx]), piece)
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
        return self.method.apply(self, x, self.bias)


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
    """Input columns split across ranks; the partial outputs are summed by one all-reduce (o, down)."""

    def __init__(self, input_size: int, output_size: int, **kw) -> None:
        super().__init__(input_size // get_tp_size(), [output_size], **kw)

    def shard(self, part: object, tensor: torch.Tensor, param: str) -> torch.Tensor:
        return shard_dim(tensor, 1) if param == "weight" else tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = tensor_model_parallel_all_reduce(self.method.apply(self, x))
        return out if self.bias is None else out + self.bias  # bias added once, after the sum
