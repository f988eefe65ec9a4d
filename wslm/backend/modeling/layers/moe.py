"""Mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE): a router picks the top-k experts of each token, the
experts run grouped through wslm.kernels.fused_moe (PyTorch: tokens sorted by expert, one matmul per
active expert; CUDA: the Triton grouped GEMM).

Routing follows HF: softmax over the router logits in float32, top-k, renormalised when the config's
norm_topk_prob says so, then cast to the model dtype. Experts are stored stacked, w13 [E, 2 * I, H]
(gate rows then up rows, HF's gate_up_proj) and w2 [E, H, I], filled as the checkpoint's per-expert
tensors arrive.

Quantized models (GGUF, AWQ/GPTQ, int8/int4 on load) keep their experts quantized: w13 and w2 are then
lists of one weight per expert in wslm.backend.quant's runtime forms (Int4Weight / Int8Weight, the same
classes and kernels as the dense layers), each expert's gate|up fused by rows as a dense MLP's are, and
kernels.fused_moe runs each active expert's own quantized matmul over its sorted tokens. A file whose
experts are dense (GGUF F16/F32) is stacked again once loaded, so it keeps the Triton grouped GEMM.

Tensor parallelism follows vLLM's default: every rank holds every expert, cut along the expert's inner
width I (w13 column-parallel, w2 row-parallel), and the ranks' partial outputs are summed by one
all-reduce after the top-k combine. Quantized experts are sliced in their own format (quant/shard.py);
4-bit down projections need whole groups per rank (wslm.tp_sizes refuses the sizes that would not). Each rank thus does 1/N of every token's expert work whatever the
routing, with the same collective as a dense MLP; expert parallelism (whole experts per rank) would leave
ranks idle when the router favours a few experts and needs a token exchange on top."""

from __future__ import annotations

from functools import partial

import torch

from wslm import kernels
from wslm.backend.distributed.parallel_state import divide, get_tp_size, tensor_model_parallel_all_reduce
from wslm.backend.distributed.sharding import shard_dim
from wslm.backend.modeling.layers.activation import get_act_and_mul
from wslm.backend.modeling.layers.linear import ReplicatedLinear


class FusedMoE:
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        norm_topk_prob: bool,
        hidden_act: str = "silu",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        backend: str | None = None,
        reduce_results: bool = True,
        quantization: str | None = None,
    ) -> None:
        self.num_experts = num_experts
        self.top_k = top_k
        # This rank's slice of each expert's inner width (all of it at TP=1).
        self.intermediate_size = divide(intermediate_size, get_tp_size(), "MoE expert width")
        intermediate_size = self.intermediate_size
        # False: the caller adds more partial sums (Qwen2-MoE's shared expert) and all-reduces once.
        self.reduce_results = reduce_results
        self.norm_topk_prob = norm_topk_prob
        self.backend = backend
        self.act_and_mul = get_act_and_mul(hidden_act)
        self.gate = ReplicatedLinear(hidden_size, [num_experts], dtype=dtype, device=device)  # the router
        self.hidden_size = hidden_size
        self.quantization = quantization
        self.dtype, self.device = dtype, torch.device(device)
        self.w13: torch.Tensor | list
        self.w2: torch.Tensor | list
        if quantization is None:
            self.w13 = torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype, device=device)
            self.w2 = torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype, device=device)
        else:  # one weight per expert, in whatever form its tensors arrive (never a 16-bit stack first)
            self.w13, self.w2 = [None] * num_experts, [None] * num_experts
        self._pending: dict[int, dict[str, object]] = {}  # an expert's gate / up until both are in
        self._loaded: set[tuple[int, str]] = set()

    def loaders(self, prefix: str, fused: bool = False) -> dict:
        out = {f"{prefix}.gate.weight": partial(self.gate.load, "weight")}
        for e in range(self.num_experts):
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{prefix}.experts.{e}.{name}.weight"] = partial(self._load_expert, e, name)
        return out

    def _load_expert(self, expert: int, name: str, tensor) -> None:
        if self.quantization is not None:
            self._load_quantized_expert(expert, name, tensor)
            return
        tensor = shard_dim(tensor, 1 if name == "down_proj" else 0)  # this rank's inner-width slice
        inter = self.intermediate_size
        dst = {
            "gate_proj": self.w13[expert, :inter],
            "up_proj": self.w13[expert, inter:],
            "down_proj": self.w2[expert],
        }[name]
        if tuple(tensor.shape) != tuple(dst.shape):
            raise ValueError(f"expert {expert} {name}: checkpoint shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(tensor)
        self._loaded.add((expert, name))

    def _load_quantized_expert(self, expert: int, name: str, tensor) -> None:
        from wslm.backend.quant.linear import finalize, fuse_rows, quantize_on_load
        from wslm.backend.quant.registry import quantizes_on_load

        down = name == "down_proj"
        if isinstance(tensor, torch.Tensor) and quantizes_on_load(self.quantization):
            # Quantized whole, then split, as Linear.quantize_whole does: int4 groups sized to this rank's
            # input width so they never straddle two ranks.
            tensor = quantize_on_load(tensor, self.quantization, group_width=self.intermediate_size if down else None)
        tensor = shard_dim(tensor, 1 if down else 0)
        inter = self.intermediate_size
        want = (self.hidden_size, inter) if down else (inter, self.hidden_size)
        if tuple(tensor.shape) != want:
            raise ValueError(f"expert {expert} {name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        if down:
            self.w2[expert] = finalize(tensor, self.device, self.dtype)
        else:
            parts = self._pending.setdefault(expert, {})
            parts[name] = tensor
            if len(parts) == 2:  # gate rows then up rows, one matmul (fuse_rows meets mixed formats at int8)
                fused = fuse_rows([parts["gate_proj"], parts["up_proj"]])
                self.w13[expert] = finalize(fused, self.device, self.dtype)
                del self._pending[expert]
        self._loaded.add((expert, name))
        if len(self._loaded) == 3 * self.num_experts:
            self._restack_dense()

    def _restack_dense(self) -> None:
        """Experts that arrived dense (a GGUF with F16 experts) go back to one stacked tensor each, the
        form the Triton grouped GEMM takes."""
        if all(isinstance(w, torch.Tensor) for w in (*self.w13, *self.w2)):
            self.w13, self.w2 = torch.stack(self.w13), torch.stack(self.w2)

    @property
    def nbytes(self) -> int:
        """Bytes the experts hold (each quantized weight's packed codes and scales)."""
        weights = [self.w13, self.w2] if isinstance(self.w13, torch.Tensor) else [*self.w13, *self.w2]
        return sum(w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes for w in weights)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights [T, k] in x's dtype, topk_ids [T, k])."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = kernels.fused_moe(x, self.w13, self.w2, weights, ids, self.act_and_mul, backend=self.backend)
        return tensor_model_parallel_all_reduce(out) if self.reduce_results else out
