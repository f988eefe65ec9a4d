"""The tensor-parallel group of this process (vLLM's names). A process that never joined a group is rank 0
of 1, so model code calls these unconditionally and pays nothing when running on one device."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class _TPGroup:
    rank: int = 0
    size: int = 1
    backend: str = ""
    profile: bool = False  # bench/tp.py: time the collectives (synchronizing, so only when asked)
    comm_s: float = 0.0
    comm_calls: int = 0


_TP = _TPGroup()


def get_tp_rank() -> int:
    return _TP.rank


def get_tp_size() -> int:
    return _TP.size


def init_tensor_parallel(rank: int, size: int, init_method: str, backend: str, timeout_s: float = 600) -> None:
    """Join the group: gloo on CPU, nccl on CUDA. init_method is a tcp://host:port both ends can reach."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        backend=backend, init_method=init_method, rank=rank, world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )  # fmt: skip
    _TP.rank, _TP.size, _TP.backend = rank, size, backend


def destroy_tensor_parallel() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _TP.rank, _TP.size, _TP.backend = 0, 1, ""


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (row-parallel outputs, vocab-parallel embedding)."""
    if _TP.size == 1:
        return x
    import torch.distributed as dist

    if not _TP.profile:
        dist.all_reduce(x)
        return x
    with _timed():
        dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's slice along dim (vocab-parallel logits)."""
    if _TP.size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_TP.size)]
    if _TP.profile:
        with _timed():
            dist.all_gather(parts, x)
    else:
        dist.all_gather(parts, x)
    return torch.cat(parts, dim=dim)


class _timed:
    def __enter__(self):
        import time

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        import time

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        _TP.comm_s += time.perf_counter() - self.t
        _TP.comm_calls += 1


def comm_profile(enable: bool | None = None) -> tuple[float, int]:
    """(seconds, calls) spent in collectives since the last call; enable turns the timing on or off."""
    out = (_TP.comm_s, _TP.comm_calls)
    _TP.comm_s, _TP.comm_calls = 0.0, 0
    if enable is not None:
        _TP.profile = enable
    return out


def divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(
            f"tensor_parallel_size={parts} does not divide the model's {what} ({total}). Pick a size that "
            f"divides {total}."
        )
    return total // parts


def check_divisible(mc, size: int, quant_group: int | None = None) -> None:
    """Fail before any worker starts when the model cannot be split size ways, naming the sizes that can.
    quant_group: the checkpoint's 4-bit group width (AWQ/GPTQ, GGUF), which each rank's input columns of a
    row-parallel layer (o, down) must hold whole. The rule is wslm.tp_sizes', which the GUI and `wslm
    doctor` offer sizes by."""
    from wslm.tp_sizes import refusal, tensor_parallel_sizes

    extra = getattr(mc, "extra", None) or {}
    facts = dict(head_dim=mc.head_dim, moe_intermediate_size=extra.get("moe_intermediate_size"),
                 shared_expert_intermediate_size=extra.get("shared_expert_intermediate_size"),
                 quant_group_size=quant_group)  # fmt: skip
    why = refusal(size, mc.num_heads, mc.num_kv_heads, mc.intermediate_size, **facts)
    if not why:
        return
    ok = tensor_parallel_sizes(max(8, size), mc.num_heads, mc.num_kv_heads, mc.intermediate_size, **facts)
    fix = f"Use --tensor-parallel-size {' or '.join(map(str, ok))}"
    if why.startswith("4-bit groups"):
        raise ValueError(f"tensor_parallel_size={size} would split this checkpoint's {why}. {fix}, or a "
                         f"checkpoint with smaller groups.")  # fmt: skip
    widths = [w for w in (mc.intermediate_size, facts["moe_intermediate_size"],
                          facts["shared_expert_intermediate_size"]) if w]  # fmt: skip
    raise ValueError(
        f"tensor_parallel_size={size} does not divide this model evenly ({mc.num_heads} attention heads, "
        f"{mc.num_kv_heads} KV heads, MLP width{'s' if len(widths) > 1 else ''} {', '.join(map(str, widths))})."
        f" {fix}."
    )
