"""The memory estimate ("needs about X") counts the KV cache the server will take: an fp8 --kv-cache-dtype (one
byte a value) and an explicit --kv-cache-memory (the pool as given, in whole blocks as the server allocates it),
from the catalog to `wslm models list/info` to the GUI, which passes the Server panel's settings."""

from __future__ import annotations

import json

import pytest
from test_models_catalog import run_cli
from test_models_pull import env, warm_metadata, wslm  # noqa: F401 - shared fixtures and runner

from wslm.backend.hub import catalog
from wslm.backend.hub.catalog import find_model

# The demo (SmolLM2-135M): K and V for 30 layers of 3 KV heads of 64 values.
DEMO_KV_VALUES_PER_TOKEN = 2 * 30 * 3 * 64


def in_blocks(size: int, per_token: int) -> int:
    """An explicit pool size as the server allocates it: whole blocks of 16 tokens."""
    block = 16 * per_token
    return size // block * block


@pytest.fixture
def bf16_host(monkeypatch):
    """Estimate as on a bf16 host (the GPU, AVX512-BF16/AMX CPUs), whatever this CPU is, with no RAM cap on the
    pool: the comparison with fp8 is then exact."""
    from wslm.backend.platforms.cpu import kv_sizing

    monkeypatch.setattr(catalog, "runtime_value_bytes", lambda: 2)
    monkeypatch.setattr(kv_sizing, "cpu_kv_cap_bytes", lambda ram=None: 1 << 50)


def test_fp8_halves_the_kv_part_of_a_bf16_estimate(env, bf16_host):  # noqa: F811
    bf16 = find_model("demo", context=4096)
    fp8 = find_model("demo", context=4096, kv_cache_dtype="fp8")
    assert bf16.kv_bytes_per_token == 2 * DEMO_KV_VALUES_PER_TOKEN and fp8.kv_bytes_per_token == DEMO_KV_VALUES_PER_TOKEN
    assert bf16.kv_cache_bytes == 2 * fp8.kv_cache_bytes > 0
    assert bf16.memory_estimate_bytes - fp8.memory_estimate_bytes == fp8.kv_cache_bytes
    assert (bf16.weights_memory_bytes, bf16.runtime_memory_bytes) == (fp8.weights_memory_bytes, fp8.runtime_memory_bytes)
    assert (bf16.estimate_kv_cache_dtype, fp8.estimate_kv_cache_dtype) == ("auto", "fp8")
    # Every fp8 the server accepts is one byte a value (e5m2 too: the estimate does not refuse it).
    for name in ("fp8_e4m3", "fp8_e5m2"):
        assert find_model("demo", context=4096, kv_cache_dtype=name).kv_cache_bytes == fp8.kv_cache_bytes


def test_fp8_is_one_byte_a_value_on_this_host(env):  # noqa: F811
    from wslm.backend.platforms.cpu.kv_sizing import runtime_value_bytes

    auto = find_model("demo", context=2048)
    fp8 = find_model("demo", context=2048, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token == DEMO_KV_VALUES_PER_TOKEN
    assert auto.kv_bytes_per_token == DEMO_KV_VALUES_PER_TOKEN * runtime_value_bytes()


def test_an_explicit_kv_cache_memory_is_the_kv_part(env):  # noqa: F811
    for dtype in ("auto", "fp8"):
        for size in (96 << 20, 3 << 30):  # below the default pool's floor, above its cap: as given all the same
            m = find_model("demo", context=1024, kv_cache_dtype=dtype, kv_cache_memory=size)
            assert m.kv_cache_bytes == in_blocks(size, m.kv_bytes_per_token) > size - 16 * m.kv_bytes_per_token
            assert m.kv_cache_sized_by == "kv_cache_memory"
            assert m.memory_estimate_bytes == m.weights_memory_bytes + m.kv_cache_bytes + m.runtime_memory_bytes
    default = find_model("demo", context=1024)
    assert default.kv_cache_bytes != 3 << 30  # not given: the pool the server sizes itself


def test_the_cli_flags_reach_the_estimate(env):  # noqa: F811
    rc, events, err = wslm("models", "list", "--json", "--context", "2048", "--kv-cache-dtype", "fp8",
                           "--kv-cache-memory", "768MiB", env=env)
    assert rc == 0, err
    demo = next(m for m in events[0]["models"] if m["id"] == "demo")
    pool = in_blocks(768 << 20, DEMO_KV_VALUES_PER_TOKEN)
    assert demo["kv_cache_bytes"] == pool and demo["kv_bytes_per_token"] == DEMO_KV_VALUES_PER_TOKEN
    assert demo["estimate_kv_cache_dtype"] == "fp8" and demo["estimate_context"] == 2048
    assert demo["memory_estimate_bytes"] == demo["weights_memory_bytes"] + pool + demo["runtime_memory_bytes"]
    # Without the flags: as before (the same fields, the default pool at the compute dtype).
    rc, events, err = wslm("models", "list", "--json", "--context", "2048", env=env)
    plain = next(m for m in events[0]["models"] if m["id"] == "demo")
    assert rc == 0 and plain["estimate_kv_cache_dtype"] == "auto" and plain["kv_cache_bytes"] != pool
    assert set(plain) == set(demo)


def test_info_takes_the_flags_and_sizes_read_as_serve_reads_them(env, capsys):  # noqa: F811
    from wslm.backend.entrypoints.openai.launcher import parse_size

    rc, out = run_cli("models", "info", "demo", "--json", "--kv-cache-memory-bytes", "1.5g", capsys=capsys)
    info = json.loads(out)
    assert rc == 0 and info["kv_cache_bytes"] == in_blocks(parse_size("1.5g"), info["kv_bytes_per_token"])
    assert parse_size("1.5g") == int(1.5 * (1 << 30))
    rc, out = run_cli("models", "info", "demo", "--kv-cache-dtype", "fp8", "--kv-cache-memory", "512MiB",
                      capsys=capsys)
    assert rc == 0 and "KV 511.9 MiB" in out and "per token (fp8)" in out  # 2,912 whole blocks
    rc, out = run_cli("models", "list", "--kv-cache-dtype", "fp8", capsys=capsys)
    assert rc == 0 and ", fp8 + overhead" in out
    # What serve refuses, `models list` refuses too, with the flag's name.
    for bad in (["--kv-cache-memory", "lots"], ["--kv-cache-memory", "0"], ["--kv-cache-dtype", "int4"]):
        rc, events, err = wslm("models", "list", "--json", *bad, env=env)
        assert rc == 2 and bad[0] in err, err
    assert "must be a size like 4GiB" in wslm("models", "info", "demo", "--kv-cache-memory", "lots", env=env)[2]


def test_the_gui_passes_the_server_panels_kv_settings():
    pytest.importorskip("PySide6")
    from wslm.gui.models_service import kv_estimate_args

    assert kv_estimate_args("auto", "") == []
    assert kv_estimate_args("fp8", "") == ["--kv-cache-dtype", "fp8"]
    assert kv_estimate_args("auto", "--max-num-seqs 4 --kv-cache-memory 2GiB") == ["--kv-cache-memory", "2GiB",
                                                                                   "--max-num-seqs", "4"]
    assert kv_estimate_args("auto", "--max-num-seqs=8 --max-num-seqs=x") == []  # a count serve would refuse
    # Extra flags come after the panel's on serve's command line: theirs win, in either spelling.
    assert kv_estimate_args("fp8", "--kv-cache-dtype=auto --kv-cache-memory-bytes=512M") == ["--kv-cache-memory", "512M"]
    assert kv_estimate_args("auto", ["--kv-cache-dtype", "fp8_e4m3"]) == ["--kv-cache-dtype", "fp8_e4m3"]
    # A size serve would refuse, a flag without its value, broken quoting: left out (the listing must not fail).
    assert kv_estimate_args("fp8", "--kv-cache-memory lots") == ["--kv-cache-dtype", "fp8"]
    assert kv_estimate_args("auto", "--kv-cache-memory 0") == []
    assert kv_estimate_args("auto", "--kv-cache-memory") == []
    assert kv_estimate_args("fp8", "--chat-template 'broken") == ["--kv-cache-dtype", "fp8"]
    # A speculative draft model the panel would load counts too (prompt lookup, "", adds nothing).
    import json

    args = kv_estimate_args("auto", "", "demo")
    assert args[0] == "--speculative-config" and json.loads(args[1])["model"] == "demo"
    assert kv_estimate_args("auto", "", "") == []


@pytest.mark.timeout(240)
def test_the_models_panel_estimate_follows_the_server_panel(env, qtbot, tmp_path):  # noqa: F811
    """The real `wslm models list` the app runs: the Server panel's KV dtype and an extra --kv-cache-memory
    reach the estimate, and changing them lists again."""
    pytest.importorskip("PySide6")
    from wslm.gui.chat_store import ChatStore
    from wslm.gui.main_window import MainWindow
    from wslm.gui.settings import Settings

    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(Settings(first_run_done=True, kv_cache_dtype="fp8", serve_extra_args="--kv-cache-memory 320MiB"),
                        store, watch=False)
    qtbot.addWidget(window)

    def demo() -> dict:
        return next((m for m in window.models.table.models if m["id"] == "demo"), {})

    qtbot.waitUntil(lambda: bool(demo()), timeout=120_000)
    assert "--kv-cache-dtype fp8 --kv-cache-memory 320MiB" in window.logs.text()  # the command it ran
    assert demo()["estimate_kv_cache_dtype"] == "fp8"
    assert demo()["kv_cache_bytes"] == in_blocks(320 << 20, DEMO_KV_VALUES_PER_TOKEN)
    assert demo()["kv_bytes_per_token"] == DEMO_KV_VALUES_PER_TOKEN
    # Back to auto, no extra flags: listed again, the default pool at the compute dtype.
    qtbot.waitUntil(lambda: not window.models.loading, timeout=30_000)
    window.server_panel.extra.setText("")
    window.server_panel.extra.editingFinished.emit()
    window.server_panel.kv_dtype.setCurrentIndex(window.server_panel.kv_dtype.findData("auto"))
    qtbot.waitUntil(lambda: demo().get("estimate_kv_cache_dtype") == "auto" and not window.models.loading,
                    timeout=120_000)
    assert demo()["kv_cache_bytes"] != in_blocks(320 << 20, DEMO_KV_VALUES_PER_TOKEN) and demo()["kv_bytes_per_token"] > DEMO_KV_VALUES_PER_TOKEN
    window.models.shutdown()
    window.close()
    store.close()
