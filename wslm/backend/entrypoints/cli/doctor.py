"""`wslm doctor`: what is wrong with this set-up, and the exact command that fixes each problem.

Every check reads the machine through a Probe (file-system root, environment, PATH lookups, commands, the
torch query), so tests point it at a fake /proc/version, a fake nvidia-smi script and so on. The CLI honours
WSLM_DOCTOR_ROOT as that root, to check a mounted system (or a test fixture) from outside."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wslm import envs

OK, WARN, ERROR = "ok", "warn", "error"
GIB = 1024**3
WSL_LIB = "usr/lib/wsl/lib"
TORCH_CUDA_INSTALL = "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"
WINDOWS_DRIVER = (
    "Install the current NVIDIA driver for Windows (https://www.nvidia.com/Download/index.aspx): it brings "
    "WSL's GPU support; do not install a Linux NVIDIA driver inside WSL. Then run in PowerShell: wsl --shutdown"
)
LIBCUDA_FIX = (
    "In an administrator Command Prompt on Windows (where /usr/lib/wsl/lib really lives): "
    "cd C:\\Windows\\System32\\lxss\\lib && del libcuda.so libcuda.so.1 && "
    "mklink libcuda.so.1 libcuda.so.1.1 && mklink libcuda.so libcuda.so.1.1 ; then: wsl --shutdown"
)


@dataclass
class Check:
    name: str
    status: str  # ok | warn | error
    detail: str
    fix: str | None = None
    data: dict | None = None  # numbers for the GUI (GPU memory, free disk, RAM), where a check has them

    def to_dict(self) -> dict:
        return asdict(self)


def _run(cmd: list[str], timeout: float = 15.0, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return p.returncode, p.stdout, p.stderr


def _torch_info() -> dict:
    """What torch says about CUDA; {'installed': False} without torch."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising OSError on a missing .so
        return {"installed": False, "error": str(exc)}
    info: dict = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "gpus": [],
    }
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        for i in range(torch.cuda.device_count() if info["cuda_available"] else 0):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": props.name, "total_bytes": int(props.total_memory)})
    except Exception as exc:  # a driver mismatch raises here rather than returning False
        info["cuda_available"] = False
        info["cuda_error"] = str(exc)
    return info


@dataclass
class Probe:
    """How the checks see the machine; every part can be replaced in tests."""

    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    run: Callable[..., tuple[int, str, str]] = _run
    torch_info: Callable[[], dict] = _torch_info
    models_dir: Path | None = None
    hf_cache: Path | None = None
    system: str = field(default_factory=platform.system)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def read(self, absolute: str) -> str:
        try:
            return self.path(absolute).read_text(errors="replace")
        except OSError:
            return ""

    def which(self, name: str) -> str | None:
        search = self.env.get("PATH", os.defpath) + os.pathsep + "/sbin:/usr/sbin"
        return shutil.which(name, path=search)


# --- the checks --------------------------------------------------------------------------------------


def wsl_kind(probe: Probe) -> str | None:
    """'wsl2', 'wsl1' or None (not WSL)."""
    version = probe.read("/proc/version")
    if "microsoft" not in version.lower() and not (
        probe.env.get("WSL_DISTRO_NAME") or probe.env.get("WSL_INTEROP")
    ):
        return None
    # WSL2 kernels are "...-microsoft-standard-WSL2"; WSL1 reports e.g. "4.4.0-19041-Microsoft".
    if "wsl2" in version.lower() or "microsoft-standard" in version.lower() or probe.env.get("WSL_INTEROP"):
        return "wsl2"
    return "wsl1" if "Microsoft" in version else "wsl2"


def check_os(probe: Probe) -> Check:
    if probe.system != "Linux":
        return Check("os", ERROR, f"{probe.system}: wslm's backend runs on Linux, inside WSL2 on Windows.",
                     "From Windows: wsl --install -d Ubuntu, then run wslm inside it.")  # fmt: skip
    release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', probe.read("/etc/os-release"), re.M))
    distro = release.get("PRETTY_NAME") or "Linux"
    kernel = (
        probe.read("/proc/version").split(" (")[0].removeprefix("Linux version ").strip()
        or platform.release()
    )
    kind = wsl_kind(probe)
    name = probe.env.get("WSL_DISTRO_NAME")
    if kind == "wsl1":
        fix = f"In PowerShell on Windows: wsl --set-version {name or '<distro>'} 2"
        return Check("os", ERROR, f"{distro} on WSL1 (kernel {kernel}): GPUs need WSL2.", fix)
    if kind == "wsl2":
        where = f", distro {name}" if name else ""
        return Check("os", OK, f"{distro} on WSL2{where} (kernel {kernel})")
    return Check("os", OK, f"{distro}, not WSL (kernel {kernel})")


def check_python(probe: Probe) -> Check:
    v = sys.version_info
    detail = f"Python {platform.python_version()} ({sys.executable})"
    if v < (3, 10):
        return Check("python", ERROR, detail + ": wslm needs 3.10 or newer.",
                     "sudo apt install python3.11 python3.11-venv, then re-run wslm's installer")  # fmt: skip
    return Check("python", OK, detail)


def check_packages(probe: Probe) -> Check:
    import importlib.util

    names = ["transformers", "huggingface_hub", "gguf", "safetensors", "fastapi", "uvicorn"]
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        return Check(
            "packages",
            ERROR,
            "missing: " + ", ".join(missing),
            f"{sys.executable} -m pip install 'wslm[backend]'",
        )
    return Check("packages", OK, "backend packages installed")


def check_torch(probe: Probe, t: dict, smi: list[dict] | None) -> Check:
    if not t.get("installed"):
        return Check(
            "torch", ERROR, f"torch is not installed ({t.get('error', '')})".strip(), TORCH_CUDA_INSTALL
        )
    detail = f"torch {t['version']}" + (
        f" (CUDA {t['cuda_build']})" if t.get("cuda_build") else " (CPU-only build)"
    )
    if t.get("cuda_available"):
        return Check("torch", OK, f"{detail}, {len(t['gpus'])} GPU(s) usable")
    if not t.get("cuda_build"):
        if smi:
            return Check("torch", ERROR, f"{detail}: this build cannot use the {smi[0]['name']} that is present.",
                         TORCH_CUDA_INSTALL)  # fmt: skip
        return Check("torch", WARN, f"{detail}, no GPU: models run on the CPU (slowly).", None)
    why = f": {t['cuda_error']}" if t.get("cuda_error") else ""
    fix = (
        WINDOWS_DRIVER
        if wsl_kind(probe)
        else "Install or update the NVIDIA driver (sudo ubuntu-drivers install), then reboot"
    )
    return Check("torch", ERROR, f"{detail} but CUDA is not available{why}", fix)


def query_nvidia_smi(probe: Probe) -> tuple[str | None, list[dict] | None, str | None]:
    """(the nvidia-smi used, its GPUs, an error): WSL's own copy first, then PATH."""
    wsl_smi = probe.path("/usr/lib/wsl/lib/nvidia-smi")
    exe = str(wsl_smi) if wsl_smi.is_file() else probe.which("nvidia-smi")
    if exe is None:
        return None, None, None
    query = "--query-gpu=name,memory.total,memory.used,driver_version"
    rc, out, err = probe.run([exe, query, "--format=csv,noheader,nounits"])
    if rc != 0:
        return exe, None, (err or out).strip().splitlines()[0] if (err or out).strip() else f"exit code {rc}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append(
                {
                    "name": parts[0],
                    "total_mib": _num(parts[1]),
                    "used_mib": _num(parts[2]),
                    "driver": parts[3],
                }
            )
    return exe, gpus, None if gpus else "no GPU in its output"


def check_gpu(probe: Probe, t: dict, exe: str | None, smi: list[dict] | None, smi_error: str | None) -> Check:
    wsl = wsl_kind(probe)
    if smi:
        parts = [
            f"{g['name']}, {g['total_mib']} MiB ({g['used_mib']} MiB in use), driver {g['driver']}"
            for g in smi
        ]
        gpus = [{"name": g["name"], "total_bytes": (g["total_mib"] or 0) * 2**20,
                 "used_bytes": (g["used_mib"] or 0) * 2**20, "driver": g["driver"]} for g in smi]  # fmt: skip
        return Check(
            "gpu", OK, "; ".join(parts) + f" [{exe}]" + _tp_hint(len(gpus)), data=_gpu_data(gpus, exe)
        )
    if t.get("gpus"):
        parts = [f"{g['name']}, {g['total_bytes'] // 2**20} MiB" for g in t["gpus"]]
        return Check("gpu", OK, "; ".join(parts) + " (torch)" + _tp_hint(len(t["gpus"])),
                     data=_gpu_data(t["gpus"], "torch"))  # fmt: skip
    if exe and smi_error:
        fix = ("In PowerShell: wsl --shutdown, then reopen the distro. If it persists: " + WINDOWS_DRIVER) if wsl else (
            "Reinstall the NVIDIA driver (sudo ubuntu-drivers install) and reboot"
        )  # fmt: skip
        return Check("gpu", ERROR, f"nvidia-smi failed: {smi_error}", fix)
    if wsl:
        return Check(
            "gpu", WARN, "no NVIDIA GPU visible in WSL (no /usr/lib/wsl/lib/nvidia-smi)", WINDOWS_DRIVER
        )
    return Check(
        "gpu", WARN, "no NVIDIA GPU found (nvidia-smi is not installed): models run on the CPU", None
    )


def _gpu_data(gpus: list[dict], source: str | None) -> dict:
    from wslm.tp_sizes import tensor_parallel_sizes

    return {"gpus": gpus, "source": source, "gpu_count": len(gpus),
            "tensor_parallel_sizes": tensor_parallel_sizes(len(gpus))}  # fmt: skip


def _tp_hint(count: int) -> str:
    if count < 2:
        return ""
    return f". {count} GPUs: a model too big for one can be split with --tensor-parallel-size up to {count}"


def check_libcuda(probe: Probe) -> Check | None:
    """WSL ships libcuda.so.1 as a copy, not a link: ldconfig complains on every apt run, and the loader can
    pick a stale copy."""
    lib = probe.path("/" + WSL_LIB)
    if not wsl_kind(probe) and not lib.is_dir():
        return None
    so1 = lib / "libcuda.so.1"
    if not so1.exists() and not so1.is_symlink():
        return Check(
            "libcuda", WARN, f"/{WSL_LIB}/libcuda.so.1 is missing: no GPU driver reaches WSL.", WINDOWS_DRIVER
        )
    if not so1.is_symlink():
        return Check(
            "libcuda", WARN,
            f"/{WSL_LIB}/libcuda.so.1 is not a symbolic link (ldconfig says so on every apt install): the Windows "
            "driver ships copies of libcuda.so* instead of links.",
            LIBCUDA_FIX,
        )  # fmt: skip
    return Check("libcuda", OK, f"/{WSL_LIB}/libcuda.so.1 -> {os.readlink(so1)}")


def check_ldconfig(probe: Probe) -> Check | None:
    """Triton finds libcuda through `ldconfig -p`; WSL's folder must be in the linker cache."""
    if not wsl_kind(probe):
        return None
    exe = probe.which("ldconfig")
    if exe is None:
        return None
    rc, out, _ = probe.run([exe, "-p"])
    if rc != 0:
        return None
    if re.search(r"libcuda\.so\.1 .*=> .*/wsl/lib/", out):
        return Check("ldconfig", OK, "libcuda.so.1 is in the linker cache (Triton will find it)")
    return Check(
        "ldconfig", WARN, "libcuda.so.1 from /usr/lib/wsl/lib is not in the linker cache: Triton kernels cannot load.",
        "echo /usr/lib/wsl/lib | sudo tee /etc/ld.so.conf.d/ld.wsl.conf && sudo ldconfig",
    )  # fmt: skip


# Shared libraries Qt's xcb platform plugin loads (Qt 6.5+), with the Debian/Ubuntu package of each: a missing
# one stops the GUI with "could not load the Qt platform plugin xcb", naming only libxcb-cursor0.
QT_XCB_LIBS = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
}


def _gui_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("PySide6") is not None


def check_qt_xcb(probe: Probe, gui_installed: Callable[[], bool] = _gui_installed) -> Check | None:
    """With the GUI extra on Linux: the X11 libraries Qt needs, named by package (from `ldconfig -p`)."""
    if probe.system != "Linux" or not gui_installed():
        return None
    exe = probe.which("ldconfig")
    if exe is None:
        return None
    rc, out, _ = probe.run([exe, "-p"])
    if rc != 0:
        return None
    have = {line.strip().split(" ", 1)[0] for line in out.splitlines() if line.strip()}
    missing = [pkg for lib, pkg in QT_XCB_LIBS.items() if lib not in have]
    if not missing:
        return Check(
            "qt_xcb",
            OK,
            "Qt's X11 (xcb) libraries are installed: the GUI can open a window",
            data={"missing": []},
        )
    return Check(
        "qt_xcb", WARN,
        f"The GUI (wslm gui) cannot open a window under X11: Qt's xcb plugin needs {', '.join(missing)}.",
        f"sudo apt-get install -y {' '.join(missing)}", data={"missing": missing},
    )  # fmt: skip


def _build_c_kernels(cc: str) -> str | None:
    from wslm.kernels import cpu_gemv

    return cpu_gemv.check_build(cc)


def check_compiler(probe: Probe, build: Callable[[str], str | None] = _build_c_kernels) -> Check | None:
    """Compilers for the fast CPU path: a C compiler builds the C decode kernels (wslm/kernels/cpu_gemv.py:
    int4/int8 rows and one-call decode steps), tried here for real (so a broken toolchain shows, and the
    server then finds the library built); a C++ one compiles the decode step for batches
    (wslm/backend/platforms/cpu/decode_compiled.py, ~1.4-2.5x faster). Without them CPU decoding runs on
    torch's eager kernels."""
    if probe.system != "Linux":
        return None
    from wslm.kernels.cpu_gemv import ENV_VAR, INSTALL_FIX

    def first(*names: str | None) -> str | None:
        return next((probe.which(n) for n in names if n and probe.which(n)), None)

    cc, cxx = first(probe.env.get("CC"), "cc", "gcc", "clang"), first("g++", "c++", "clang++")
    off = probe.env.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off")
    error = None if cc is None or off else build(cc)
    if cc is None or error:
        why = "No C compiler" if cc is None else f"{cc} cannot build the C kernels ({error})"
        eager = "" if cxx else "; no C++ compiler either, so the decode step runs eagerly"
        return Check("compiler", WARN, f"{why}: the fast CPU path is off, CPU decoding runs on torch's slower "
                     f"kernels{eager}.", INSTALL_FIX)  # fmt: skip
    kernels = f"C kernels off ({ENV_VAR}=0)" if off else f"C compiler {cc} builds the C kernels"
    if cxx is None:
        return Check(
            "compiler", WARN,
            f"{kernels}, but no C++ compiler: on CPU the decode step of batches runs eagerly (compiled, the demo "
            "model decodes ~2.5x faster at 32 chats).",
            INSTALL_FIX,
        )  # fmt: skip
    return Check("compiler", OK, f"{kernels}; C++ compiler {cxx}: the CPU decode step is compiled in the background")


def check_disk(probe: Probe) -> Check:
    from wslm.backend.hub.hf_cache import hub_cache_dir
    from wslm.paths import models_dir

    places = {
        "models folder": probe.models_dir or models_dir(),
        "HF cache": probe.hf_cache or hub_cache_dir(probe.env),
    }
    details, status, fixes, seen = [], OK, [], set()
    free_bytes: dict[str, int] = {}
    for label, path in places.items():
        probe_path = Path(path)
        while not probe_path.exists() and probe_path != probe_path.parent:
            probe_path = probe_path.parent
        usage = shutil.disk_usage(probe_path)
        free_bytes[str(path)] = usage.free
        if re.match(r"^/mnt/[a-z]/", str(path)):
            status = WARN if status == OK else status
            var = (
                "WSLM_MODELS_DIR=$HOME/.wslm/models"
                if label == "models folder"
                else "HF_HUB_CACHE=$HOME/.cache/huggingface/hub"
            )
            fixes.append(
                f"echo 'export {var}' >> ~/.bashrc  (a Windows drive loads models several times slower)"
            )
        dev = probe_path.stat().st_dev
        details.append(
            f"{label} {path}: {usage.free / GIB:.1f} GiB free" + (" (same disk)" if dev in seen else "")
        )
        seen.add(dev)
        if usage.free < 1 * GIB:
            status = ERROR
        elif usage.free < 10 * GIB and status == OK:
            status = WARN
        if usage.free < 10 * GIB:
            fixes.append(f"free space on {path}: wslm models list, then wslm models rm ID")
    return Check(
        "disk", status, "; ".join(details), " ; ".join(dict.fromkeys(fixes)) or None, data=free_bytes
    )


def check_memory(probe: Probe) -> Check:
    info = {k: int(v) * 1024 for k, v in re.findall(r"^(\w+):\s+(\d+) kB", probe.read("/proc/meminfo"), re.M)}
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    if not total:
        return Check("memory", WARN, "cannot read /proc/meminfo")
    detail = f"{total / GIB:.1f} GiB RAM, {avail / GIB if avail else 0:.1f} GiB available"
    data = {"total_bytes": total, "available_bytes": avail}
    wsl = wsl_kind(probe)
    if total < 8 * GIB:
        fix = (
            "WSL gets half of Windows' RAM by default: in %UserProfile%\\.wslconfig put [wsl2] and memory=16GB, "
            "then in PowerShell: wsl --shutdown"
        ) if wsl else "Add RAM or use smaller models (GGUF Q4_K_M)"  # fmt: skip
        return Check("memory", WARN, detail + ": little for loading models", fix, data)
    if avail is not None and avail < 2 * GIB:
        return Check(
            "memory",
            WARN,
            detail + ": almost none free",
            "Close other programs (or `wsl --shutdown` idle distros)",
            data,
        )
    return Check("memory", OK, detail, data=data)


def check_demo(probe: Probe) -> Check:
    from wslm.demo import DEMO_INSTALL, demo_model_path

    try:
        path = demo_model_path()
    except FileNotFoundError:
        return Check(
            "demo_model", WARN, "the demo model (SmolLM2-135M-Instruct) is not installed", DEMO_INSTALL
        )
    return Check("demo_model", OK, f"demo model at {path}")


def check_embed_model(probe: Probe) -> Check:
    """The shipped embedding model (documents attached in the desktop app's chats are embedded with it)."""
    from wslm.embed_model import EMBED_INSTALL, embed_model_zip

    try:
        path = embed_model_zip()
    except FileNotFoundError:
        return Check("embedding_model", WARN, "the embedding model (all-MiniLM-L6-v2) is not installed: the desktop "
                     "app cannot search large attached files without another embedding server", EMBED_INSTALL)
    return Check("embedding_model", OK, f"embedding model (all-MiniLM-L6-v2) in {path}")


def check_hub(probe: Probe) -> Check:
    from wslm.backend.hub.hf_cache import hub_endpoint

    endpoint = hub_endpoint(None, probe.env)
    token = "HF_TOKEN set" if probe.env.get("HF_TOKEN") else "no HF_TOKEN (needed only for gated models)"
    if probe.env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return Check(
            "hub", WARN, f"HF_HUB_OFFLINE is set: downloads are off ({endpoint})", "unset HF_HUB_OFFLINE"
        )
    return Check("hub", OK, f"downloads from {endpoint}; {token}")


def run_checks(probe: Probe | None = None) -> list[Check]:
    probe = probe or Probe()
    checks = [check_os(probe), check_python(probe), check_packages(probe)]
    t = probe.torch_info()
    exe, smi, smi_error = query_nvidia_smi(probe)
    checks += [check_torch(probe, t, smi), check_gpu(probe, t, exe, smi, smi_error)]
    optional = (check_libcuda(probe), check_ldconfig(probe), check_qt_xcb(probe), check_compiler(probe))
    checks += [c for c in optional if c is not None]
    checks += [check_disk(probe), check_memory(probe), check_demo(probe), check_embed_model(probe),
               check_hub(probe)]
    return checks


def _num(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


# --- CLI ---------------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor", help="check this set-up (WSL, GPU, CUDA, disk, RAM) and say how to fix it"
    )
    p.add_argument("--json", action="store_true", help='one JSON line: {"checks": [...], "ok": bool}')
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    root = envs.WSLM_DOCTOR_ROOT
    checks = run_checks(Probe(root=root) if root else Probe())
    ok = not any(c.status == ERROR for c in checks)
    try:
        _report(checks, ok, args.json)
    except BrokenPipeError:  # the reader stopped listening; the exit code still tells
        pass
    return 0 if ok else 1


def _report(checks: list[Check], ok: bool, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"checks": [c.to_dict() for c in checks], "ok": ok}), flush=True)
    else:
        marks = {OK: "[ ok ]", WARN: "[warn]", ERROR: "[FAIL]"}
        for c in checks:
            print(f"{marks[c.status]} {c.name:11} {c.detail}")
            if c.fix and c.status != OK:
                print(f"{'':19}fix: {c.fix}")
        problems = sum(c.status != OK for c in checks)
        print("\nAll good." if not problems else f"\n{problems} problem(s); errors stop wslm from working." if not ok
              else f"\n{problems} warning(s); wslm will work.")  # fmt: skip
