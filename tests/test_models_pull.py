"""`wslm models pull` against the loopback hub: real `python -m wslm` processes, real HTTP, real HF cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_server import FakeHub, make_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = "model.safetensors"
_TINY: dict[str, Path] = {}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    if "llama" not in _TINY:
        _TINY["llama"] = make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    return _TINY["llama"]


@pytest.fixture
def hub(tiny_llama):
    with FakeHub() as h:
        h.add_repo("org/tiny", tiny_llama)
        yield h


@pytest.fixture(scope="session")
def warm_metadata(tmp_path_factory) -> Path:
    """The demo GGUF's header, read once: GGUFReader takes seconds on its 49k-token vocabulary."""
    if "metadata" not in _TINY:  # memoized: each module importing this fixture gets its own copy of it
        folder = tmp_path_factory.mktemp("warm-config")
        code = "from wslm.backend.hub.catalog import find_model; find_model('demo')"
        env = {**os.environ, "WSLM_CONFIG_DIR": str(folder)}
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        _TINY["metadata"] = folder / "data" / "gguf-metadata.json"
    return _TINY["metadata"]


@pytest.fixture
def env(tmp_path, monkeypatch, warm_metadata) -> dict[str, str]:
    """A private HF cache, models folder and config dir, for this process and the CLI it starts."""
    (tmp_path / "config" / "data").mkdir(parents=True)
    if warm_metadata.exists():
        shutil.copy(warm_metadata, tmp_path / "config" / "data" / "gguf-metadata.json")
    for var in (
        "HF_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_OFFLINE",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_HUB_CACHE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return dict(os.environ)


def wslm(*args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, list[dict], str]:
    """Run `python -m wslm ARGS`; returns the exit code, stdout parsed as JSON lines, and stderr."""
    p = subprocess.run(
        [sys.executable, "-m", "wslm", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return p.returncode, events, p.stderr


def wslm_text(*args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, "-m", "wslm", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stdout, p.stderr


def blob_dir(env: dict[str, str], repo: str = "org/tiny") -> Path:
    return Path(env["HF_HUB_CACHE"]) / ("models--" + repo.replace("/", "--")) / "blobs"


def test_pull_reports_progress_and_lands_in_the_hf_cache(hub, env, tiny_llama):
    t0 = time.monotonic()
    rc, events, err = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    elapsed = time.monotonic() - t0
    assert rc == 0, err
    start, done = events[0], events[-1]
    assert start["event"] == "start" and start["repo"] == "org/tiny" and start["revision"] == "main"
    names = {f["name"] for f in start["files"]}
    assert {"config.json", WEIGHTS, "tokenizer.json"} <= names
    assert start["total_bytes"] == sum(f["size"] for f in start["files"]) > 400_000
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and all(
        set(e) >= {"file", "file_bytes", "file_total", "bytes", "total_bytes", "speed_bps", "eta_s"}
        for e in progress
    )
    assert [e["bytes"] for e in progress] == sorted(e["bytes"] for e in progress)
    assert progress[-1]["bytes"] == start["total_bytes"]
    assert len(progress) <= 10 * elapsed + 2 * len(names)  # throttled (plus one final event per file)
    assert sorted(e["file"] for e in events if e["event"] == "file_done") == sorted(names)
    assert done["event"] == "done" and done["id"] == "org/tiny"
    path = Path(done["path"])
    assert (path / "config.json").is_file() and (path / WEIGHTS).is_symlink()
    assert (path / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()

    # huggingface_hub and transformers find it offline, as the engine will.
    from huggingface_hub import snapshot_download

    assert Path(snapshot_download("org/tiny", local_files_only=True, cache_dir=env["HF_HUB_CACHE"])) == path
    from wslm.backend.hub import resolve_model

    assert resolve_model("org/tiny") == path

    rc, listed, _ = wslm("models", "list", "--json", env=env)
    entry = next(m for m in listed[0]["models"] if m["id"] == "org/tiny")
    assert entry["source"] == "hf-cache" and entry["format"] == "hf" and entry["supported"] is True
    assert entry["architecture"] == "LlamaForCausalLM" and entry["context_length"] == 256

    # A second pull finds everything in place and downloads nothing.
    served = hub.bytes_served(WEIGHTS)
    rc, events, _ = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0 and events[0]["resumed_bytes"] == events[0]["total_bytes"]
    assert hub.bytes_served(WEIGHTS) == served


def test_dropped_connection_resumes_on_the_next_run(hub, env, tiny_llama):
    size = (tiny_llama / WEIGHTS).stat().st_size
    hub.drop_at(WEIGHTS, 200_000)
    rc, events, _ = wslm(
        "models", "pull", "org/tiny", "--endpoint", hub.url, "--json", "--retries", "0", env=env
    )
    assert rc == 1
    error = events[-1]
    assert error["event"] == "error" and error["code"] == "network"
    assert "again to resume" in error["message"]
    partial = list(blob_dir(env).glob("*.incomplete"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size <= 200_000
    kept = partial[0].stat().st_size

    served_before = hub.bytes_served(WEIGHTS)
    rc, events, err = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err
    assert events[0]["resumed_bytes"] >= kept
    last_get = hub.file_requests(WEIGHTS)[-1]
    assert last_get.range == f"bytes={kept}-" and last_get.status == 206
    assert hub.bytes_served(WEIGHTS) - served_before == size - kept  # only the rest came over the wire
    weights = Path(events[-1]["path"]) / WEIGHTS
    assert (
        hashlib.sha256(weights.read_bytes()).digest()
        == hashlib.sha256((tiny_llama / WEIGHTS).read_bytes()).digest()
    )
    assert not list(blob_dir(env).glob("*.incomplete"))


def test_a_drop_is_retried_within_the_same_run(hub, env):
    hub.drop_at(WEIGHTS, 100_000)
    rc, events, err = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err
    gets = hub.file_requests(WEIGHTS)
    assert len(gets) == 2 and gets[1].range is not None and gets[1].range.startswith("bytes=")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_cancels_cleanly_and_the_pull_resumes(hub, env, sig):
    hub.rate_bps = 150_000  # ~3 s for the weights: time to interrupt
    proc = subprocess.Popen(
        [sys.executable, "-m", "wslm", "models", "pull", "org/tiny", "--endpoint", hub.url, "--json"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    try:
        for line in proc.stdout:
            lines.append(json.loads(line))
            e = lines[-1]
            if e["event"] == "progress" and e["file"] == WEIGHTS and e["file_bytes"] > 30_000:
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    lines += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert proc.returncode == 130, err
    assert lines[-1] == {"event": "cancelled"}
    partial = list(blob_dir(env).glob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size > 30_000
    kept = partial[0].stat().st_size
    snapshot = next((Path(env["HF_HUB_CACHE"]) / "models--org--tiny" / "snapshots").iterdir())
    assert not (snapshot / WEIGHTS).exists()  # no half file is ever visible to a loader

    hub.rate_bps = None
    rc, events, err = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err
    assert hub.file_requests(WEIGHTS)[-1].range == f"bytes={kept}-"
    assert (Path(events[-1]["path"]) / WEIGHTS).is_file()


def test_mirror_from_hf_endpoint_and_the_flag_wins(hub, env):
    rc, events, err = wslm("models", "pull", "org/tiny", "--json", env={**env, "HF_ENDPOINT": hub.url})
    assert rc == 0, err and events[0]["endpoint"] == hub.url
    with FakeHub() as other:
        other.add_repo("org/other", {"config.json": b"{}", "tiny.gguf": b"GGUF"})
        rc, events, err = wslm(
            "models",
            "pull",
            "org/other",
            "--endpoint",
            other.url,
            "--json",
            env={**env, "HF_ENDPOINT": hub.url},
        )
        assert rc == 0, err
        assert events[0]["endpoint"] == other.url and other.file_requests("tiny.gguf")


def test_missing_repo_revision_and_file(hub, env):
    rc, events, _ = wslm("models", "pull", "org/nope", "--endpoint", hub.url, "--json", env=env)
    assert rc == 1 and events[-1]["event"] == "error" and events[-1]["code"] == "not_found"
    assert "org/nope" in events[-1]["message"] and "not found" in events[-1]["message"]
    rc, events, _ = wslm(
        "models", "pull", "org/tiny", "--revision", "v9", "--endpoint", hub.url, "--json", env=env
    )
    assert rc == 1 and events[-1]["code"] == "not_found" and "v9" in events[-1]["message"]
    rc, events, _ = wslm(
        "models", "pull", "org/tiny", "--file", "*.gguf", "--endpoint", hub.url, "--json", env=env
    )
    assert rc == 1 and events[-1]["code"] == "not_found" and "config.json" in events[-1]["message"]
    # Plain text for people: the cause on stderr.
    rc, _, err = wslm("models", "pull", "org/nope", "--endpoint", hub.url, env=env)
    assert rc == 1 and "Repository org/nope not found" in err


def test_gated_repo_needs_a_token_with_access(hub, env, tiny_llama):
    hub.add_repo("org/gated", tiny_llama, gated=True)
    hub.tokens |= {"hf_reader", "hf_approved"}
    hub.gated_access["org/gated"] = {"hf_approved"}
    rc, events, _ = wslm("models", "pull", "org/gated", "--endpoint", hub.url, "--json", env=env)
    assert rc == 1 and events[-1]["code"] == "unauthorized"
    assert "HF_TOKEN" in events[-1]["message"] and f"{hub.url}/org/gated" in events[-1]["message"]
    assert any(r.status == 401 for r in hub.requests)

    rc, events, _ = wslm(
        "models", "pull", "org/gated", "--endpoint", hub.url, "--json", env={**env, "HF_TOKEN": "hf_reader"}
    )
    assert rc == 1 and events[-1]["code"] == "unauthorized" and "no access" in events[-1]["message"]

    rc, events, _ = wslm(
        "models", "pull", "org/gated", "--endpoint", hub.url, "--json", env={**env, "HF_TOKEN": "hf_bad"}
    )
    assert rc == 1 and events[-1]["code"] == "unauthorized" and "invalid" in events[-1]["message"]

    rc, events, err = wslm(
        "models", "pull", "org/gated", "--endpoint", hub.url, "--json", env={**env, "HF_TOKEN": "hf_approved"}
    )
    assert rc == 0, err
    # The token goes to the hub, never to the CDN host the LFS redirect points at.
    assert all(
        r.auth == "Bearer hf_approved" for r in hub.requests if "/resolve/" in r.path and r.status == 200
    )
    assert all(r.auth is None for r in hub.requests if r.path.startswith("/cdn/"))


def test_unreachable_hub_and_bad_usage(env):
    rc, events, _ = wslm("models", "pull", "org/tiny", "--endpoint", "http://127.0.0.1:9", "--json", env=env)
    assert rc == 1 and events[-1]["code"] == "network" and "--endpoint" in events[-1]["message"]
    rc, events, _ = wslm("models", "pull", "not a repo!", "--json", env=env)
    assert rc == 2 and events[-1]["code"] == "usage"
    rc, _, _ = wslm("models", "pull", env=env)
    assert rc == 2
    rc, _, _ = wslm("models", env=env)
    assert rc == 2


def test_corrupted_download_is_caught_and_discarded(hub, env):
    hub.corrupt.add(WEIGHTS)
    rc, events, _ = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 1 and events[-1]["code"] == "checksum"
    assert not list(blob_dir(env).glob("*.incomplete"))
    hub.corrupt.clear()
    rc, _, err = wslm("models", "pull", "org/tiny", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err


def test_not_enough_disk_space_is_refused_up_front(hub, env, monkeypatch):
    import shutil

    from wslm.backend.hub.download import Puller, PullError

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    events = []
    with pytest.raises(PullError) as info:
        Puller("org/tiny", endpoint=hub.url, on_event=events.append).run()
    assert info.value.code == "disk" and "HF_HUB_CACHE" in str(info.value)
    assert not events and not hub.file_requests(WEIGHTS)


def test_cancel_event_for_in_process_callers(hub, env):
    """The GUI-side API: a threading.Event stops the download between chunks, resumable like a signal."""
    import threading

    from wslm.backend.hub.download import Cancelled, Puller

    hub.rate_bps = 200_000
    cancel = threading.Event()

    def on_event(e):
        if e["event"] == "progress" and e["file"] == WEIGHTS:
            cancel.set()

    with pytest.raises(Cancelled):
        Puller("org/tiny", endpoint=hub.url, on_event=on_event, cancel=cancel).run()
    assert list(blob_dir(env).glob("*.incomplete"))
    hub.rate_bps = None
    done = Puller("org/tiny", endpoint=hub.url).run()
    assert done["id"] == "org/tiny" and hub.file_requests(WEIGHTS)[-1].range


def test_a_server_that_ignores_range_still_gives_a_whole_file(hub, env, tiny_llama):
    from wslm.backend.hub.download import Puller, PullError

    hub.drop_at(WEIGHTS, 100_000)
    with pytest.raises(PullError):
        Puller("org/tiny", endpoint=hub.url, retries=0).run()
    hub.honour_range = False
    done = Puller("org/tiny", endpoint=hub.url).run()
    assert hub.file_requests(WEIGHTS)[-1].status == 200  # the whole body again, written from the start
    assert (Path(done["path"]) / WEIGHTS).read_bytes() == (tiny_llama / WEIGHTS).read_bytes()


def test_revisions_by_tag_and_commit(hub, env, tiny_llama):
    from wslm.backend.hub.download import Puller

    sha = hub.add_repo("org/tagged", tiny_llama, tags=("v1.0",))
    done = Puller("org/tagged", revision="v1.0", endpoint=hub.url).run()
    repo = Path(env["HF_HUB_CACHE"]) / "models--org--tagged"
    assert (repo / "refs" / "v1.0").read_text() == sha and Path(done["path"]).name == sha
    assert all(f"/resolve/{sha}/" in r.path for r in hub.requests if "/resolve/" in r.path)  # pinned to the commit
    shutil.rmtree(repo)
    done = Puller("org/tagged", revision=sha, endpoint=hub.url).run()
    assert not (repo / "refs").exists() and Path(done["path"]).name == sha
    from wslm.backend.hub import resolve_model

    assert resolve_model("org/tagged") == Path(done["path"])  # no refs/main: the snapshot there is used
