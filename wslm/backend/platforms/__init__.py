"""Platforms: what differs between CPU and CUDA (device choice, dtype, allocator and thread set-up, KV
budget, decode back ends). cpu/ and cuda/ hold each one's parts."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA GPU. Run `wslm doctor`.")
    return device
