"""The KV pool sized by need (issue 36): --max-num-seqs sequences of --max-model-len tokens, in whole blocks,
capped by a share of memory, explicit settings winning; the server's start log and `wslm models info` give the
same number. And load progress: a real `wslm serve` of the demo logs progress that reaches 100% and says it in
`load_progress` JSON lines, which the GUI's loading state shows."""

from __future__ import annotations

import json
import re

import pytest
from test_models_catalog import run_cli
from test_server_helpers import ServerProcess

from wslm.backend.platforms.cpu import kv_sizing
from wslm.backend.platforms.cpu.kv_sizing import CPU_KV_CAP, CPU_KV_MIN, cpu_kv_cap_bytes, plan_kv_pool

GiB = 1 << 30
POOL_LINE = re.compile(r"KV cache pool: [0-9.]+ GiB \((\d+) bytes\) = (\d+) blocks")
PROGRESS_LINE = re.compile(r"Loading weights of .*?:\s+(\d+)% \(\d+ of \d+ MB, \d+ MB/s\)")


def test_the_pool_is_what_the_batch_can_use_in_whole_blocks():
    plan = plan_kv_pool(1000, 1000, max_num_seqs=3, block_size=16, cap_bytes=GiB)
    assert plan.source == "need" and plan.num_blocks == 3 * 63  # 1,000 tokens take 63 blocks of 16
    assert plan.bytes == 3 * 63 * 16 * 1000 and plan.max_concurrency == pytest.approx(3 * 1008 / 1000)
    assert "sized by need: 3 sequences x 1000 tokens" in plan.describe()


def test_a_need_over_the_cap_gets_the_cap_and_says_how_many_sequences_fit():
    plan = plan_kv_pool(46080, 8192, max_num_seqs=128, block_size=16, cap_bytes=GiB)
    assert plan.source == "cap" and plan.num_blocks == GiB // (16 * 46080) and plan.bytes <= GiB
    assert plan.max_concurrency == pytest.approx(plan.num_blocks * 16 / 8192)
    line = plan.describe()
    assert f"({plan.bytes} bytes)" in line and "capped at 1.00 GiB" in line and "--kv-cache-memory" in line
    assert f"Maximum concurrency for 8192 tokens per request: {plan.max_concurrency:.2f}x" in line


def test_explicit_settings_win_in_order():
    per_token, seq = 4096, 2048
    assert plan_kv_pool(per_token, seq, 2, cap_bytes=1 << 40).source == "need"
    env = plan_kv_pool(per_token, seq, 2, cpu_kvcache_space_gib=0.5)
    assert env.source == "WSLM_CPU_KVCACHE_SPACE" and env.bytes == GiB // 2
    given = plan_kv_pool(per_token, seq, 2, kv_cache_memory=100 << 20, cpu_kvcache_space_gib=0.5)
    assert given.source == "kv_cache_memory" and given.num_blocks == (100 << 20) // (16 * per_token)
    blocks = plan_kv_pool(per_token, seq, 2, kv_cache_memory=100 << 20, num_blocks_override=7)
    assert blocks.source == "num_gpu_blocks_override" and blocks.num_blocks == 7


def test_the_cpu_cap_is_a_share_of_the_ram_within_bounds(monkeypatch):
    assert cpu_kv_cap_bytes(4 * GiB) == int(4 * GiB * kv_sizing.KV_RAM_FRACTION)
    assert cpu_kv_cap_bytes(256 * GiB) == CPU_KV_CAP
    assert cpu_kv_cap_bytes(100 << 20) == CPU_KV_MIN
    monkeypatch.setattr(kv_sizing, "total_ram", lambda: 8 * GiB)
    assert plan_kv_pool(1 << 20, 1 << 20).cap_bytes == cpu_kv_cap_bytes(8 * GiB)  # the default cap: this RAM's


@pytest.fixture(scope="module")
def served():
    srv = ServerProcess("--port", "0", "--max-model-len", "1024", "--max-num-seqs", "3",
                        "--uvicorn-log-level", "warning")
    srv.stop()
    return srv


def test_start_log_and_models_info_give_the_same_pool(served, capsys):
    log = served.stderr()
    found = POOL_LINE.search(log)
    assert found, log[-3000:]
    assert "sized by need: 3 sequences x 1024 tokens" in log and "Maximum concurrency for 1024 tokens" in log
    rc, out = run_cli("models", "info", "demo", "--json", "--context", "1024", "--max-num-seqs", "3",
                      capsys=capsys)
    info = json.loads(out)
    assert rc == 0 and info["kv_cache_bytes"] == int(found.group(1)) and info["kv_cache_blocks"] == int(found.group(2))
    assert info["kv_cache_sized_by"] == "need" and info["estimate_max_num_seqs"] == 3
    assert info["kv_cache_max_concurrency"] == 3.0
    rc, out = run_cli("models", "info", "demo", "--context", "1024", "--max-num-seqs", "3", capsys=capsys)
    assert rc == 0 and f"({found.group(1)} bytes, {found.group(2)} blocks), sized by need" in out


def test_the_load_logs_progress_to_100_percent(served):
    percents = [int(p) for p in PROGRESS_LINE.findall(served.stderr())]
    assert percents and percents[-1] == 100 and percents == sorted(percents), percents
    events = [e for e in served.events if e["event"] == "load_progress"]
    assert events and events[-1]["percent"] == 100.0 and events[-1]["bytes"] == events[-1]["total_bytes"] > 0
    assert all(e["mb_per_s"] >= 0 and e["model"] for e in events)
    # Every stdout line before ready is JSON the GUI reads: loading, then progress, then ready.
    kinds = [e["event"] for e in served.events]
    assert kinds[0] == "loading" and kinds[-1] == "ready" and set(kinds[1:-1]) == {"load_progress"}


def test_the_gui_loading_state_shows_the_servers_progress_lines(served, qtbot):
    pytest.importorskip("PySide6")
    from wslm.gui.log_model import LogModel
    from wslm.gui.server_controller import LOADING, ServerController
    from wslm.gui.server_panel import ServerPanel
    from wslm.gui.settings import Settings

    controller = ServerController(LogModel())
    panel = ServerPanel(controller, Settings(first_run_done=True))
    qtbot.addWidget(panel)
    lines = [json.loads(line) for line in served.stdout_lines]  # the real server's stdout, as JsonProcess parses it
    controller._on_event(lines[0])  # loading
    assert controller.state == LOADING
    first = next(e for e in lines if e["event"] == "load_progress")
    controller._on_event(first)
    assert panel.detail.text() == f"Loading {first['model']}… {first['percent']:.0f}% ({first['mb_per_s']:.0f} MB/s)"
    for event in lines[1:]:
        if event["event"] == "load_progress":
            controller._on_event(event)
    assert re.fullmatch(r"Loading .+… 100% \(\d+ MB/s\)", panel.detail.text()), panel.detail.text()
    assert panel.badge.text() == panel.state_text(LOADING)


@pytest.mark.parametrize("step_s,steps", [(0.01, 100), (0.1, 1000)])  # a fast load (1 s), a slow one (100 s)
def test_progress_reports_at_most_every_half_second_or_tenth(step_s, steps):
    from wslm.backend.loader.load_progress import LoadProgress, add_listener, remove_listener

    now, reports = [0.0], []
    add_listener(reports.append)
    try:
        progress = LoadProgress(steps * 10, "m", clock=lambda: now[0])
        for _ in range(steps):
            now[0] += step_s
            progress.advance(10)
        progress.finish()
    finally:
        remove_listener(reports.append)
    assert reports[0]["percent"] == 0.0 and reports[-1]["percent"] == 100.0
    assert reports[-1]["bytes"] == steps * 10 and reports[-1]["mb_per_s"] == round(steps * 10 / (steps * step_s) / 1e6, 1)
    for a, b in zip(reports[1:-2], reports[2:-1]):
        assert b["elapsed_s"] - a["elapsed_s"] >= 0.5 - 1e-9 or b["percent"] - a["percent"] >= 10 - 1e-9, (a, b)
    assert len(reports) <= 2 + max(10, steps * step_s / 0.5)


def test_the_models_panel_shows_the_pool_of_the_start_log(served, qtbot, capsys):
    """The GUI's estimate is `wslm models list/info --json`'s (the Models panel shows it): the same pool."""
    pytest.importorskip("PySide6")
    from wslm.gui.format import human_bytes
    from wslm.gui.log_model import LogModel
    from wslm.gui.models_panel import ModelsPanel
    from wslm.gui.models_service import ModelsService

    pool = int(POOL_LINE.search(served.stderr()).group(1))
    rc, out = run_cli("models", "info", "demo", "--json", "--context", "1024", "--max-num-seqs", "3", capsys=capsys)
    service = ModelsService(LogModel())
    panel = ModelsPanel(service)
    qtbot.addWidget(panel)
    service.table.set_models([json.loads(out)])
    panel.table.selectRow(0)
    assert f"{human_bytes(pool)} KV cache at 1,024 tokens (x3 full-length chats)" in panel.details.text()


def test_cpu_pool_is_zero_and_resident_only_where_written():
    """allocate_pool on CPU: the kernel's zero pages, resident as blocks are written (a start does not zero
    the whole pool, and a pool few chats fill does not hold its size in RAM)."""
    import torch

    from wslm.backend.platforms.kv_cache import allocate_pool

    def anon() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))

    before = anon()
    pool = allocate_pool((4, 2, 1024, 16, 8, 128), torch.bfloat16, torch.device("cpu"))  # 256 MiB
    assert pool.shape == (4, 2, 1024, 16, 8, 128) and pool.dtype == torch.bfloat16
    assert anon() - before < (16 << 20)
    pool[1, 0, 7] = 2.5  # one block of one layer's keys
    assert pool[1, 0, 7].eq(2.5).all() and pool[1, 0, 8].eq(0).all() and pool[3, 1, 1023].eq(0).all()
    assert anon() - before < (32 << 20)
