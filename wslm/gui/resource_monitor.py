"""Samples CPU and RAM (psutil, non-blocking calls) and the GPU (nvidia-smi on the target, a QProcess)."""

from __future__ import annotations

import psutil
from PySide6.QtCore import QObject, QProcess, QTimer, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.wsl_bridge.launcher import Target

NVIDIA_QUERY = ["--query-gpu=utilization.gpu,memory.used,memory.total,name", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> dict | None:
    """First GPU's use (%) and VRAM (MiB) from nvidia-smi's CSV, and how many GPUs there are; None when
    there is none."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            try:
                gpus.append({"gpu_util": float(parts[0]), "vram_used_mib": float(parts[1]),
                             "vram_total_mib": float(parts[2]), "gpu_name": parts[3] if len(parts) > 3 else ""})
            except ValueError:
                continue
    return {**gpus[0], "gpu_count": len(gpus)} if gpus else None


class ResourceMonitor(QObject):
    sample = Signal(dict)  # cpu, ram, ram_used_gib, ram_total_gib
    gpu_sample = Signal(dict)  # gpu_util, vram_used_mib, vram_total_mib, gpu_name
    gpu_unavailable = Signal(str)

    def __init__(self, interval_ms: int = 1000, parent=None) -> None:
        super().__init__(parent)
        self.target = Target.local()
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._tick)
        self._gpu: QProcess | None = None
        self._gpu_ok = True
        self._ticks = 0
        psutil.cpu_percent(None)  # primes the counter: the first real call then measures since now

    def set_target(self, target: Target) -> None:
        self.target = target
        self._gpu_ok = True

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        mem = psutil.virtual_memory()
        self.sample.emit({"cpu": psutil.cpu_percent(None), "ram": mem.percent,
                          "ram_used_gib": (mem.total - mem.available) / 2**30, "ram_total_gib": mem.total / 2**30})
        self._ticks += 1
        if self._gpu_ok and self._ticks % 2 == 1 and self._gpu is None:
            self._query_gpu()

    def _query_gpu(self) -> None:
        argv = self.target.program_argv("nvidia-smi", NVIDIA_QUERY)
        proc = QProcess(self)
        proc.finished.connect(lambda code, _status, p=proc: self._gpu_done(p, code))
        proc.errorOccurred.connect(lambda err, p=proc: self._gpu_error(p, err))
        self._gpu = proc
        proc.start(argv[0], argv[1:])

    def _gpu_done(self, proc: QProcess, code: int) -> None:
        text = bytes(proc.readAllStandardOutput().data()).decode("utf-8", "replace")
        proc.deleteLater()
        self._gpu = None
        result = parse_nvidia_smi(text) if code == 0 else None
        if result:
            self.gpu_sample.emit(result)
        else:
            self._gpu_ok = False
            self.gpu_unavailable.emit("No NVIDIA GPU found on the target (nvidia-smi failed)")

    def _gpu_error(self, proc: QProcess, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            proc.deleteLater()
            self._gpu = None
            self._gpu_ok = False
            self.gpu_unavailable.emit("No NVIDIA GPU: nvidia-smi is not installed on the target")
