"""Resource monitor: CPU/RAM from psutil, GPU from nvidia-smi on the target (a stand-in printing the real
CSV format: there is no GPU here), feeding the server panel's plots and the models panel's fit hint."""

from __future__ import annotations

import os
import stat
import sys

import pytest

pytest.importorskip("PySide6")

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.metrics import ThroughputMeter, metric, parse_prometheus  # noqa: E402
from wslm.gui.resource_monitor import parse_nvidia_smi  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

# `nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,name --format=csv,noheader,nounits`
NVIDIA_SMI_OUT = "37, 20480, 143771, NVIDIA H200\n"


def test_parse_nvidia_smi():
    assert parse_nvidia_smi(NVIDIA_SMI_OUT) == {"gpu_util": 37.0, "vram_used_mib": 20480.0,
                                                "vram_total_mib": 143771.0, "gpu_name": "NVIDIA H200",
                                                "gpu_count": 1}
    assert parse_nvidia_smi("[N/A], [N/A], [N/A], X\n") is None
    assert parse_nvidia_smi("") is None


def test_parse_metrics_and_throughput():
    text = ('# HELP wslm:kv_cache_usage_perc KV\n# TYPE wslm:kv_cache_usage_perc gauge\n'
            'wslm:kv_cache_usage_perc{model_name="demo"} 0.25\n'
            'wslm:generation_tokens_total{model_name="demo"} 1200\n'
            'vllm:num_requests_running{model_name="x"} 3\n')
    values = parse_prometheus(text)
    assert metric(values, "kv_cache_usage_perc") == 0.25 and metric(values, "num_requests_running") == 3
    meter = ThroughputMeter()
    assert meter.update(10.0, 1000) is None and meter.update(12.0, 1200) == 100.0


def test_monitor_feeds_plots_and_fit_hint(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({NVIDIA_SMI_OUT!r})\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    window = MainWindow(Settings(first_run_done=True), ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    window.monitor._timer.setInterval(100)
    with qtbot.waitSignal(window.monitor.gpu_sample, timeout=10_000):
        window.monitor.start()
    qtbot.waitUntil(lambda: len(window.server_panel.plots["cpu"].values) >= 2, timeout=5000)
    window.monitor.stop()
    plots = window.server_panel.plots
    assert 0 <= plots["cpu"].values[-1] <= 100 and 0 < plots["ram"].values[-1] < 100
    assert plots["gpu"].values[-1] == 37.0 and "H200" in plots["gpu"].caption
    assert plots["vram"].values[-1] == pytest.approx(100 * 20480 / 143771)
    table = window.models.table
    assert table.vram_total_bytes == 143771 * 2**20
    qtbot.waitUntil(lambda: not window.models.loading, timeout=60_000)
    row = table.ids().index("demo")
    assert table.data(table.index(row, 7)) == "yes"  # 0.6 GB fits easily in 140 GB
    window.close()


def test_no_gpu_is_said_plainly(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi anywhere
    window = MainWindow(Settings(first_run_done=True), ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.monitor.gpu_unavailable, timeout=10_000):
        window.monitor._tick()
    assert "nvidia-smi" in window.server_panel.plots["gpu"].note
    assert window.models.table.no_gpu
    window.close()
