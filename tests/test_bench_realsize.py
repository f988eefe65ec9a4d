"""bench/realsize.py still runs end to end: a two-layer random GGUF (hidden 256, the demo's tokenizer) is
written, loaded by wslm in a child process as `wslm serve` would, decoded, prefilled and measured, and the
JSON records come out as bench/summarize.py reads them. No timing is asserted (speed lives in bench/).
llama.cpp is left out: its venv (WSLM_LLAMA_PYTHON) is not part of the test environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    pytest.importorskip("gguf")
    try:
        from wslm.demo import demo_model_path

        demo_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("realsize")
    out = tmp / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WSLM_BENCH_CACHE": str(tmp / "cache"),
           "WSLM_CACHE_DIR": os.environ.get("WSLM_CACHE_DIR", str(tmp / "wslm-cache"))}  # fmt: skip
    cmd = [sys.executable, str(BENCH / "realsize.py"), "--quick", "--models", "tiny", "--quants", "F16",
           "--engines", "wslm", "--threads", "1", "--metrics", "decode_0", "prefill_512", "load_warm", "memory",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_records_for_every_metric(results):
    metrics = {r["metric"] for r in results}
    assert {"decode_0", "prefill_512", "rss_after_load", "peak_during_load"} <= metrics
    assert "load_warm" in metrics or "load_first" in metrics  # a first load (tokenizer conversion) is kept apart
    for r in results:
        assert r["engine"] == "wslm" and r["model"] == "tiny" and r["quant"] == "F16" and r["threads"] == 1
        assert r["value"] > 0 and r["date"] and r["machine"] and r["commit"] and r["loadavg"] is not None


def test_decode_has_its_roofline(results):
    decode = next(r for r in results if r["metric"] == "decode_0")
    assert decode["bandwidth_bytes_per_s"] > 1e8 and decode["copy_bytes_per_s"] > 1e8
    assert decode["bandwidth_of"].startswith("read")  # a decode reads its weights: the roofline is read bandwidth
    # the tiny file: 2 layers of hidden 256 plus the tied 49152 x 256 embedding, in F16
    assert 25e6 < decode["read_bytes_per_token"] < 35e6
    assert decode["held_bytes"] > 0 and decode["roofline_pct"] > 0


def test_memory_split(results):
    rss = next(r for r in results if r["metric"] == "rss_after_load")
    assert rss["file_backed"] + rss["anonymous"] <= rss["value"] * 1.01
    peak = next(r for r in results if r["metric"] == "peak_during_load")
    assert peak["value"] >= rss["value"] * 0.9


def test_summary_table(results, tmp_path):
    sys.path.insert(0, str(BENCH))
    import summarize

    (tmp_path / "r.json").write_text(json.dumps(results))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nnotes kept\n")
    summarize.write(doc, summarize.table(summarize.load(tmp_path)))
    text = doc.read_text()
    assert "notes kept" in text and "| decode tok/s, empty context | tiny F16 | 1 |" in text
    summarize.write(doc, summarize.table(summarize.load(tmp_path)))  # rewriting replaces the table, once
    assert doc.read_text().count(summarize.START) == 1
