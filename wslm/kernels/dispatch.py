"""Which implementation of the kernels runs: the Triton kernels or the PyTorch references.

`backend=None` picks Triton for CUDA tensors (when triton imports) and PyTorch otherwise; the env var
WSLM_KERNEL_BACKEND=triton|torch overrides that choice. Triton is imported only here, lazily, so that
`import wslm.kernels` works where triton is missing (Windows, minimal installs)."""

from __future__ import annotations

import functools
import os

import torch

from wslm import envs

BACKENDS = ("triton", "torch")
ENV_VAR = "WSLM_KERNEL_BACKEND"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def triton_version() -> str | None:
    """The installed triton's version, or None when it does not import."""
    try:
        import triton
    except Exception:  # ImportError, or a broken install raising something else
        return None
    return triton.__version__


def _env_backend() -> str | None:
    return envs.get(ENV_VAR)  # EnvError (a ValueError) names the variable and 'triton' or 'torch'


def selected_backend(device: torch.device | str | None) -> str:
    """The backend `backend=None` resolves to for tensors on `device`: "triton" or "torch"."""
    forced = _env_backend()
    if forced is not None:
        return forced
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and triton_version() is not None:
        return "triton"
    return "torch"


def resolve(backend: str | None, device: torch.device) -> str:
    """Validates an explicit `backend` argument, or picks one; raises a clear error when it cannot run."""
    if backend is None:
        backend = selected_backend(device)
    elif backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not a kernel backend: use 'triton', 'torch' or None.")
    if backend == "triton":
        if triton_version() is None:
            raise RuntimeError(
                "The triton kernel backend was asked for but triton does not import here. Install it "
                f"(pip install triton, Linux only) or use the PyTorch kernels ({ENV_VAR}=torch)."
            )
        if device.type != "cuda" and not _interpreting():
            raise RuntimeError(
                f"The triton kernel backend needs CUDA tensors, got tensors on {device}. Use the PyTorch "
                f"kernels ({ENV_VAR}=torch), or set TRITON_INTERPRET=1 to run Triton's (slow) interpreter."
            )
    return backend


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def device_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability the Triton launch configs plan for (wslm.kernels.configs): the device's,
    or the smallest checked card's under the interpreter."""
    if device.type != "cuda":
        from wslm.kernels.configs import INTERPRETER_CAPABILITY

        return INTERPRETER_CAPABILITY
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


def backend_description(device: torch.device | str | None) -> str:
    """One line for the engine's start-up log: which kernels run, and why."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    try:
        backend = selected_backend(dev)
    except ValueError as exc:
        return f"kernels: invalid {ENV_VAR} ({exc})"
    why = f"{ENV_VAR}={envs.raw(ENV_VAR)}" if _env_backend() else "auto"
    if backend == "triton":
        version = triton_version()
        if version is None:
            return f"kernels: triton requested ({why}) but triton does not import; calls will fail"
        where = str(dev)
        if dev.type == "cuda" and torch.cuda.is_available():
            where += f" ({torch.cuda.get_device_name(dev)})"
        elif _interpreting():
            where += ", TRITON_INTERPRET=1"
        return f"kernels: triton {version} on {where} [{why}]"
    reason = "" if dev.type != "cuda" else " (triton not importable)" if triton_version() is None else ""
    return f"kernels: PyTorch {torch.__version__} reference on {dev}{reason} [{why}]"
