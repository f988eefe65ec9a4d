"""GPT-OSS (gpt-oss-20b / -120b): Llama-shaped attention with q/k/v/o biases and a learned sink logit per
head (layers/attention.py's `sinks`), layers alternating a sliding window (128 tokens) and full attention,
YaRN rope; a MoE MLP whose router has a bias and softmaxes over the top-k logits only, and whose experts
have biases and a clamped SwiGLU, (up + 1) * gate * sigmoid(alpha * gate) with gate <= limit and
|up| <= limit, gate and up interleaved in one [hidden, 2 * inner] matrix per expert (HF's layout, kept).

The harmony chat format's analysis channel goes to reasoning_content through the openai_gptoss reasoning
parser (server/reasoning/gpt_oss.py). Not yet: MXFP4 experts kept quantized (the `*_blocks` / `*_scales`
pairs of the released checkpoints are dequantized to the model dtype on load, so gpt-oss-20b takes ~40 GB),
tensor parallelism, a Triton path for the experts (they run grouped in PyTorch on every device), and tool
calls in harmony's commentary channel."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

import torch

from wslm.backend.distributed.parallel_state import get_tp_size
from wslm.backend.modeling.layers.linear import ReplicatedLinear, RowParallelLinear
from wslm.backend.modeling.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, Loaders


class GptOssAttention(LlamaAttention):
    def __init__(self, model, layer_idx: int, **kw) -> None:
        if get_tp_size() > 1:  # the sinks and the experts are not split across ranks yet
            raise ValueError("GPT-OSS does not run under tensor parallelism in wslm yet: use --tensor-parallel-size 1.")
        super().__init__(model, layer_idx, **kw)
        cfg = model.cfg
        self.device = model.device
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=True,
                                        method=model.linear_method, dtype=model.dtype, device=model.device)  # fmt: skip

    def loaders(self, prefix: str, fused_qkv: bool = False) -> Loaders:
        out = super().loaders(prefix, fused_qkv)
        out[f"{prefix}.o_proj.bias"] = partial(self.o_proj.load, "bias")
        out[f"{prefix}.sinks"] = self._load_sinks
        return out

    def _load_sinks(self, tensor: torch.Tensor) -> None:
        self.attn.sinks = tensor.to(device=self.device, dtype=torch.float32).contiguous()


class GptOssExperts:
    """Router and experts. Tokens are grouped by expert (one pair of matmuls per active expert), as
    kernels.fused_moe does for Qwen's experts, with the biases and the clamped SwiGLU in between."""

    def __init__(self, model) -> None:
        cfg, extra = model.cfg, model.cfg.extra
        num_experts, hidden, inner = extra["num_local_experts"], cfg.hidden_size, cfg.intermediate_size
        self.top_k = extra["num_experts_per_tok"]
        self.alpha, self.limit = extra["swiglu_alpha"], extra["swiglu_limit"]
        kw = dict(dtype=model.dtype, device=model.device)
        self.router = ReplicatedLinear(hidden, [num_experts], bias=True, **kw)
        self.params = {
            "gate_up_proj": torch.empty(num_experts, hidden, 2 * inner, **kw),
            "gate_up_proj_bias": torch.empty(num_experts, 2 * inner, **kw),
            "down_proj": torch.empty(num_experts, inner, hidden, **kw),
            "down_proj_bias": torch.empty(num_experts, hidden, **kw),
        }

    def loaders(self, prefix: str) -> Loaders:
        out: Loaders = {
            f"{prefix}.router.weight": partial(self.router.load, "weight"),
            f"{prefix}.router.bias": partial(self.router.load, "bias"),
        }
        for name in self.params:
            out[f"{prefix}.experts.{name}"] = partial(self._load, name)
        return out

    def _load(self, name: str, tensor: torch.Tensor) -> None:
        dst = self.params[name]
        if tuple(tensor.shape) != tuple(dst.shape):
            raise ValueError(f"experts.{name}: checkpoint shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(tensor)

    def _swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate = gate_up[:, ::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.params["down_proj"].shape[0]).tolist()
        tokens = order // self.top_k
        w = weights.reshape(-1)[order]
        p = self.params
        per_slot = torch.empty(flat.numel(), x.shape[1], dtype=x.dtype, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            h = x.index_select(0, tokens[start:end]) @ p["gate_up_proj"][expert] + p["gate_up_proj_bias"][expert]
            y = self._swiglu(h) @ p["down_proj"][expert] + p["down_proj_bias"][expert]
            per_slot[order[start:end]] = y * w[start:end, None]
            start = end
        return per_slot.view(x.shape[0], self.top_k, -1).sum(dim=1)


class GptOssDecoderLayer(LlamaDecoderLayer):
    def __init__(self, model, layer_idx: int) -> None:
        super().__init__(model, layer_idx)
        self.self_attn = GptOssAttention(model, layer_idx)
        self.mlp = GptOssExperts(model)

    def loaders(self, prefix: str, fused: bool = False) -> Loaders:
        return {
            **self.self_attn.loaders(f"{prefix}.self_attn"),
            **self.mlp.loaders(f"{prefix}.mlp"),
            f"{prefix}.input_layernorm.weight": self.input_layernorm.load,
            f"{prefix}.post_attention_layernorm.weight": self.post_attention_layernorm.load,
        }


def _dequantize_mxfp4(weights: Iterable[tuple[str, object]], dtype: torch.dtype) -> Iterator[tuple[str, object]]:
    """The released checkpoints' MXFP4 experts (`<name>_blocks` + `<name>_scales`) as dense `<name>`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        base, _, kind = name.rpartition("_")
        if kind not in ("blocks", "scales") or not base.endswith(("gate_up_proj", "down_proj")):
            yield name, tensor
            continue
        pair = pending.setdefault(base, {})
        pair[kind] = tensor
        if len(pair) == 2:
            from transformers.integrations.mxfp4 import convert_moe_packed_tensors

            del pending[base]
            yield base, convert_moe_packed_tensors(pair["blocks"], pair["scales"], dtype=dtype)


class GptOssForCausalLM(LlamaForCausalLM):
    layer_cls = GptOssDecoderLayer

    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        extra = {
            "num_local_experts": int(hf_config.num_local_experts),
            "num_experts_per_tok": int(hf_config.num_experts_per_tok),
            "swiglu_alpha": float(getattr(hf_config, "swiglu_alpha", 1.702)),
            "swiglu_limit": float(getattr(hf_config, "swiglu_limit", 7.0)),
        }
        return {"extra": extra, "qkv_bias": True}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_dequantize_mxfp4(weights, self.dtype))
