"""RMSNorm layers over wslm.kernels.rms_norm: Llama's, Gemma's (1 + w) and per-head q/k norms."""

from __future__ import annotations

import torch

from wslm import kernels


class RMSNorm:
    """HF LlamaRMSNorm. Called with a residual it adds first and returns (normed, sum), fused."""

    def __init__(
        self, eps: float, dtype: torch.dtype, device: torch.device, backend: str | None = None
    ) -> None:
        self.eps = eps
        self.dtype = dtype
        self.device = device
        self.backend = backend
        self.weight: torch.Tensor | None = None

    def load(self, tensor: torch.Tensor) -> None:
        self.weight = tensor.to(device=self.device, dtype=self.dtype)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        be = self.backend or self._bind(x.device)
        return kernels.rms_norm(x, self.weight, self.eps, residual=residual, backend=be)

    def _bind(self, device: torch.device) -> str:
        # The kernel backend, chosen once (by device and WSLM_KERNEL_BACKEND), not re-read on every call.
        self.backend = kernels.selected_backend(device)
        return self.backend


class GemmaRMSNorm(RMSNorm):
    """Gemma scales by (1 + w): folded into the weight once at load, so the same kernel serves."""

    def load(self, tensor: torch.Tensor) -> None:
        self.weight = (1.0 + tensor.float()).to(device=self.device, dtype=self.dtype)


class HeadRMSNorm:
    """Per-head RMSNorm of q or k (Qwen3, Gemma 3): the norm runs over head_dim of each head.
    Takes [T, H * D] (possibly a strided slice of the fused qkv) and returns a contiguous [T, H * D]."""

    def __init__(self, norm: RMSNorm, head_dim: int) -> None:
        self.norm = norm
        self.head_dim = head_dim

    def load(self, tensor: torch.Tensor) -> None:
        self.norm.load(tensor)

    @property
    def weight(self) -> torch.Tensor | None:
        return self.norm.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        return self.norm(x.reshape(-1, self.head_dim)).view(t, -1)
