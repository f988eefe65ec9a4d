"""`wslm doctor` on fake machines: a fake root (/proc/version, /proc/meminfo, /usr/lib/wsl/lib) and fake
nvidia-smi / ldconfig scripts on PATH that print what the real tools print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wslm.backend.entrypoints.cli import doctor
from wslm.backend.entrypoints.cli.doctor import (
    ERROR,
    LIBCUDA_FIX,
    OK,
    TORCH_CUDA_INSTALL,
    WARN,
    Probe,
    run_checks,
)

ROOT = Path(__file__).resolve().parents[1]
WSL2_VERSION = (
    "Linux version 5.15.153.1-microsoft-standard-WSL2 (root@941d701f84f1) (gcc (GCC) 11.2.0, GNU ld (GNU Binutils) "
    "2.37) #1 SMP Fri Mar 29 23:14:13 UTC 2024\n"
)
WSL1_VERSION = "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com) (gcc version 5.4.0 (GCC) ) #1237-Microsoft\n"
NATIVE_VERSION = (
    "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0)) #45\n"
)
SMI_OK = "NVIDIA GeForce RTX 4090, 24564, 1530, 560.94\n"
SMI_FAIL = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
    "driver is installed and running.\n"
)
LDCONFIG_WITH = "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/wsl/lib/libcuda.so.1\n\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n"
TORCH_CUDA = {"installed": True, "version": "2.5.1+cu124", "cuda_build": "12.4", "cuda_available": True,
              "gpus": [{"name": "NVIDIA GeForce RTX 4090", "total_bytes": 24564 * 2**20}]}  # fmt: skip
TORCH_CPU = {
    "installed": True,
    "version": "2.5.1+cpu",
    "cuda_build": None,
    "cuda_available": False,
    "gpus": [],
}


def script(folder: Path, name: str, stdout: str, rc: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    body = stdout.replace("'", "'\\''")
    path.write_text(f"#!/bin/sh\nprintf '%s' '{body}'\nexit {rc}\n")
    path.chmod(0o755)
    return path


def fake_machine(tmp_path: Path, version: str = WSL2_VERSION, mem_gib: int = 32, libcuda: str | None = "copy",
                 smi: tuple[str, int] | None = (SMI_OK, 0), ldconfig: str | None = LDCONFIG_WITH) -> Path:  # fmt: skip
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "version").write_text(version)
    kb = mem_gib * 1024 * 1024
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       {kb} kB\nMemFree:        {kb // 2} kB\nMemAvailable:   {kb // 2} kB\n"
    )
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text('PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\n')
    lib = root / "usr/lib/wsl/lib"
    if libcuda is not None:
        lib.mkdir(parents=True)
        (lib / "libcuda.so.1.1").write_bytes(b"\x7fELF")
        if libcuda == "copy":  # what the Windows driver ships
            (lib / "libcuda.so.1").write_bytes(b"\x7fELF")
            (lib / "libcuda.so").write_bytes(b"\x7fELF")
        else:
            (lib / "libcuda.so.1").symlink_to("libcuda.so.1.1")
    if smi is not None:
        script(lib if "microsoft" in version.lower() else tmp_path / "bin", "nvidia-smi", smi[0], smi[1])
    if ldconfig is not None:
        script(tmp_path / "bin", "ldconfig", ldconfig)
    return root


def probe(tmp_path: Path, root: Path, torch: dict = TORCH_CUDA, **env) -> Probe:
    return Probe(
        root=root,
        env={"PATH": str(tmp_path / "bin"), **env},
        torch_info=lambda: torch,
        models_dir=tmp_path,
        hf_cache=tmp_path / "hf",
        system="Linux",
    )


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_healthy_wsl2_with_a_gpu(tmp_path):
    root = fake_machine(tmp_path, libcuda="link")
    checks = by_name(run_checks(probe(tmp_path, root, WSL_DISTRO_NAME="Ubuntu")))
    assert (
        checks["os"].status == OK
        and "WSL2" in checks["os"].detail
        and "Ubuntu 24.04.1" in checks["os"].detail
    )
    assert "distro Ubuntu" in checks["os"].detail
    assert checks["torch"].status == OK and "CUDA 12.4" in checks["torch"].detail
    gpu = checks["gpu"]
    assert (
        gpu.status == OK and "RTX 4090" in gpu.detail and "24564 MiB" in gpu.detail and "560.94" in gpu.detail
    )
    assert "/usr/lib/wsl/lib/nvidia-smi" in gpu.detail  # WSL's own copy, not PATH's
    assert (
        gpu.data["gpus"][0]["total_bytes"] == 24564 * 2**20
        and gpu.data["gpus"][0]["used_bytes"] == 1530 * 2**20
    )
    assert checks["memory"].data["total_bytes"] == 32 * 2**30 and checks["disk"].data
    assert checks["libcuda"].status == OK and checks["ldconfig"].status == OK
    assert checks["memory"].status == OK and "32.0 GiB" in checks["memory"].detail
    assert all(c.status != ERROR for c in checks.values())


def test_libcuda_copy_is_detected_with_the_fix(tmp_path):
    root = fake_machine(tmp_path, libcuda="copy")
    c = by_name(run_checks(probe(tmp_path, root)))["libcuda"]
    assert c.status == WARN and "libcuda.so.1 is not a symbolic link" in c.detail
    assert (
        c.fix == LIBCUDA_FIX and "mklink libcuda.so.1 libcuda.so.1.1" in c.fix and "wsl --shutdown" in c.fix
    )


def test_libcuda_missing_from_the_linker_cache(tmp_path):
    root = fake_machine(tmp_path, ldconfig="\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")
    c = by_name(run_checks(probe(tmp_path, root)))["ldconfig"]
    assert c.status == WARN and "sudo ldconfig" in c.fix and "/etc/ld.so.conf.d/" in c.fix


def test_wsl1_is_an_error(tmp_path):
    root = fake_machine(tmp_path, version=WSL1_VERSION)
    c = by_name(run_checks(probe(tmp_path, root, WSL_DISTRO_NAME="Debian")))["os"]
    assert (
        c.status == ERROR
        and "WSL1" in c.detail
        and c.fix == "In PowerShell on Windows: wsl --set-version Debian 2"
    )


def test_wsl_detected_from_the_environment_alone(tmp_path):
    root = fake_machine(tmp_path, version=NATIVE_VERSION, libcuda=None, smi=None)
    assert doctor.wsl_kind(probe(tmp_path, root, WSL_INTEROP="/run/WSL/1_interop")) == "wsl2"
    assert doctor.wsl_kind(probe(tmp_path, root)) is None


def test_cpu_torch_with_a_gpu_present(tmp_path):
    root = fake_machine(tmp_path)
    c = by_name(run_checks(probe(tmp_path, root, torch=TORCH_CPU)))["torch"]
    assert c.status == ERROR and "RTX 4090" in c.detail and c.fix == TORCH_CUDA_INSTALL


def test_cuda_torch_without_a_driver_in_wsl(tmp_path):
    root = fake_machine(tmp_path, smi=(SMI_FAIL, 9))
    broken = {
        **TORCH_CUDA,
        "cuda_available": False,
        "gpus": [],
        "cuda_error": "CUDA driver initialization failed",
    }
    checks = by_name(run_checks(probe(tmp_path, root, torch=broken)))
    assert checks["torch"].status == ERROR and "Windows" in checks["torch"].fix
    assert (
        checks["gpu"].status == ERROR
        and "couldn't communicate with the NVIDIA driver" in checks["gpu"].detail
    )
    assert "wsl --shutdown" in checks["gpu"].fix


def test_no_gpu_in_wsl_and_on_plain_linux(tmp_path):
    root = fake_machine(tmp_path, smi=None, libcuda=None)
    checks = by_name(run_checks(probe(tmp_path, root, torch=TORCH_CPU)))
    assert checks["gpu"].status == WARN and "nvidia.com" in checks["gpu"].fix
    assert checks["libcuda"].status == WARN and "missing" in checks["libcuda"].detail
    native = fake_machine(tmp_path / "native", version=NATIVE_VERSION, smi=None, libcuda=None, ldconfig=None)
    checks = by_name(run_checks(probe(tmp_path / "native", native, torch=TORCH_CPU)))
    assert checks["os"].status == OK and "not WSL" in checks["os"].detail
    assert "libcuda" not in checks and "ldconfig" not in checks
    assert checks["torch"].status == WARN and checks["gpu"].status == WARN


def test_nvidia_smi_on_path_for_native_linux(tmp_path):
    root = fake_machine(tmp_path, version=NATIVE_VERSION, libcuda=None)
    gpu = by_name(run_checks(probe(tmp_path, root)))["gpu"]
    assert gpu.status == OK and str(tmp_path / "bin" / "nvidia-smi") in gpu.detail


def test_little_ram_and_a_windows_drive(tmp_path):
    root = fake_machine(tmp_path, mem_gib=4)
    p = probe(tmp_path, root)
    p.models_dir = Path("/mnt/c/Users/me/models")
    checks = by_name(run_checks(p))
    assert checks["memory"].status == WARN and ".wslconfig" in checks["memory"].fix
    assert checks["disk"].status == WARN and "WSLM_MODELS_DIR=$HOME/.wslm/models" in checks["disk"].fix


def test_demo_model_missing(tmp_path, monkeypatch):
    import wslm.demo

    def missing():
        raise FileNotFoundError("gone")

    monkeypatch.setattr(wslm.demo, "demo_model_path", missing)
    c = doctor.check_demo(probe(tmp_path, fake_machine(tmp_path)))
    assert c.status == WARN and c.fix == wslm.demo.DEMO_INSTALL


def test_embedding_model_missing(tmp_path, monkeypatch):
    import wslm.embed_model

    def missing():
        raise FileNotFoundError("gone")

    monkeypatch.setattr(wslm.embed_model, "embed_model_zip", missing)
    c = doctor.check_embed_model(probe(tmp_path, fake_machine(tmp_path)))
    assert c.status == WARN and c.fix == wslm.embed_model.EMBED_INSTALL and "attached files" in c.detail


def test_cli_exit_code_on_an_error(tmp_path, monkeypatch, capsys):
    import argparse

    monkeypatch.setenv("WSLM_DOCTOR_ROOT", str(fake_machine(tmp_path, version=WSL1_VERSION, smi=None)))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert doctor.cmd_doctor(argparse.Namespace(json=True)) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["checks"][0]["status"] == ERROR


def test_cli_json_and_text(tmp_path):
    healthy = True
    # The real torch here is a CPU build, so the "healthy" machine has no GPU (a GPU would make that an error).
    root = fake_machine(tmp_path, version=WSL2_VERSION, smi=None)
    env = {**os.environ, "WSLM_DOCTOR_ROOT": str(root), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "WSLM_CONFIG_DIR": str(tmp_path / "cfg"), "WSLM_MODELS_DIR": str(tmp_path / "models")}  # fmt: skip
    p = subprocess.run([sys.executable, "-m", "wslm", "doctor", "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    report = json.loads(p.stdout)
    assert report["ok"] is healthy and p.returncode == (0 if healthy else 1)
    names = [c["name"] for c in report["checks"]]
    assert names[:5] == ["os", "python", "packages", "torch", "gpu"] and "libcuda" in names
    for c in report["checks"]:
        assert set(c) >= {"name", "status", "detail", "fix"} and c["status"] in (OK, WARN, ERROR)
        assert c["status"] == OK or c["fix"] or c["name"] == "torch"
    libcuda = next(c for c in report["checks"] if c["name"] == "libcuda")
    assert libcuda["status"] == WARN and "mklink" in libcuda["fix"]
    if healthy:
        human = subprocess.run([sys.executable, "-m", "wslm", "doctor"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert (
            human.returncode == 0
            and "[warn] libcuda" in human.stdout
            and "fix: In an administrator" in human.stdout
        )


def test_two_gpus_offer_tensor_parallel_sizes(tmp_path):
    two = SMI_OK + SMI_OK  # nvidia-smi prints one CSV line per GPU
    root = fake_machine(tmp_path, libcuda="link", smi=(two, 0))
    gpu = by_name(run_checks(probe(tmp_path, root, WSL_DISTRO_NAME="Ubuntu")))["gpu"]
    assert gpu.data["gpu_count"] == 2 and gpu.data["tensor_parallel_sizes"] == [1, 2]
    assert "--tensor-parallel-size up to 2" in gpu.detail


def test_tensor_parallel_sizes_follow_the_model():
    from wslm.tp_sizes import tensor_parallel_sizes

    assert tensor_parallel_sizes(4) == [1, 2, 3, 4]
    assert tensor_parallel_sizes(4, num_heads=32, num_kv_heads=8) == [1, 2, 4]
    assert tensor_parallel_sizes(4, num_heads=9, num_kv_heads=3) == [1, 3]  # the demo model
    assert tensor_parallel_sizes(8, num_heads=32, num_kv_heads=2) == [1, 2, 4, 8]  # KV heads replicated
    assert tensor_parallel_sizes(0) == [1]


def _no_build(cc):
    raise AssertionError(f"built with {cc}")


def test_compiler_check_names_the_package_when_missing(tmp_path):
    """No cc on PATH (a fresh WSL Ubuntu): one line saying the fast CPU path is off, with the apt-get line."""
    from wslm.backend.entrypoints.cli.doctor import check_compiler
    from wslm.kernels.cpu_gemv import INSTALL_FIX

    root = fake_machine(tmp_path)
    c = check_compiler(probe(tmp_path, root), build=_no_build)
    assert c.status == WARN and c.detail.startswith("No C compiler") and "fast CPU path is off" in c.detail
    assert "eagerly" in c.detail and c.fix == INSTALL_FIX and "build-essential" in c.fix
    script(tmp_path / "bin", "g++", "")  # a C++ compiler alone does not build the C kernels
    c = check_compiler(probe(tmp_path, root), build=_no_build)
    assert c.status == WARN and "No C compiler" in c.detail and "eagerly" not in c.detail
    script(tmp_path / "bin", "cc", "")
    c = check_compiler(probe(tmp_path, root), build=lambda cc: None)
    assert c.status == OK and f"C compiler {tmp_path / 'bin' / 'cc'} builds the C kernels" in c.detail
    assert "C++ compiler" in c.detail
    (tmp_path / "bin" / "g++").unlink()
    c = check_compiler(probe(tmp_path, root), build=lambda cc: None)
    assert c.status == WARN and "no C++ compiler" in c.detail and c.fix == INSTALL_FIX
    c = check_compiler(probe(tmp_path, root, WSLM_CPU_KERNELS="0"), build=_no_build)
    assert "C kernels off (WSLM_CPU_KERNELS=0)" in c.detail


def test_compiler_check_reports_a_failing_build(tmp_path, monkeypatch):
    """A cc that cannot build (here: a script that fails like gcc without libc's headers), through the real
    cpu_gemv build into a temporary cache."""
    from wslm.backend.entrypoints.cli.doctor import check_compiler
    from wslm.kernels import cpu_gemv

    monkeypatch.setattr(cpu_gemv, "_cache_dir", lambda: tmp_path / "cache")
    root = fake_machine(tmp_path)
    error = "cpu_gemv.c:1:10: fatal error: stdint.h: No such file or directory"
    script(tmp_path / "bin", "cc", error + "\n", rc=1)
    script(tmp_path / "bin", "g++", "")
    c = check_compiler(probe(tmp_path, root))
    assert c.status == WARN and "cannot build the C kernels" in c.detail and error in c.detail
    assert c.fix == cpu_gemv.INSTALL_FIX
    assert not list((tmp_path / "cache").glob("*.so"))
