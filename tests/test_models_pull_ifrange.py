"""Resuming a pull from a mirror whose ETags are not content hashes (nginx-style "<mtime>-<size>"), when
the file changes between a dropped connection and the resume: wslm sends If-Range, so the changed file
comes back whole and the result is the new version byte for byte, never the old head spliced onto the
new tail (which no checksum could catch)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import FakeHub

ROOT = Path(__file__).resolve().parents[1]
NAME = "data.txt"  # not an LFS pattern: served straight from the resolve URL with the opaque ETag
OLD = random.Random(1).randbytes(300_000)


def _new(size: int) -> bytes:
    return random.Random(2).randbytes(size)


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return dict(os.environ)


@pytest.fixture
def hub():
    with FakeHub() as h:
        h.add_repo("org/mirror", {"config.json": b"{}", NAME: OLD}, opaque_etags=True)
        yield h


def blobs(env: dict[str, str]) -> Path:
    return Path(env["HF_HUB_CACHE"]) / "models--org--mirror" / "blobs"


def change_on_drop(hub: FakeHub, data: bytes) -> None:
    hub.on_drop = lambda name: hub.replace_file("org/mirror", name, data)


def pull(hub: FakeHub, **kw):
    from wslm.backend.hub.download import Puller

    return Puller("org/mirror", patterns=[NAME], endpoint=hub.url, **kw).run()


@pytest.mark.parametrize("new_size", [300_000, 320_000, 250_000], ids=["same-size", "longer", "shorter"])
@pytest.mark.parametrize("if_range", [True, False], ids=["if-range", "if-range-ignored"])
def test_file_changed_between_drop_and_resume_is_not_spliced(hub, env, new_size: int, if_range: bool) -> None:
    old_etag = hub.repos["org/mirror"].files[NAME].etag
    new = _new(new_size)
    hub.honour_if_range = if_range
    hub.drop_at(NAME, 100_000)
    change_on_drop(hub, new)
    done = pull(hub)
    assert (Path(done["path"]) / NAME).read_bytes() == new
    gets = hub.file_requests(NAME)
    assert gets[0].range is None and gets[1].range == "bytes=100000-" and gets[1].if_range == f'"{old_etag}"'
    # If-Range honoured: the whole new file (200); ignored: a 206 of the new version, which wslm refuses.
    assert gets[1].status == (200 if if_range else 206)
    assert gets[-1].range is None and gets[-1].status == 200
    new_etag = hub.repos["org/mirror"].files[NAME].etag
    assert [p.name for p in blobs(env).iterdir()] == [new_etag]  # named by its own ETag, no partial left


def test_cli_pull_of_a_file_changed_mid_download_exits_0_with_the_new_file(hub, env) -> None:
    """The issue as reported: `wslm models pull` kept the old first half, appended the new second half,
    and exited 0."""
    new = _new(300_000)
    hub.drop_at(NAME, 150_000)
    change_on_drop(hub, new)
    p = subprocess.run([sys.executable, "-m", "wslm", "models", "pull", "org/mirror", "--file", NAME, "--endpoint",
                        hub.url, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    done = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")][-1]
    assert done["event"] == "done" and (Path(done["path"]) / NAME).read_bytes() == new


def test_partial_of_a_version_the_mirror_no_longer_has_is_discarded(hub, env) -> None:
    from wslm.backend.hub import pull_state
    from wslm.backend.hub.download import PullError

    old_etag = hub.repos["org/mirror"].files[NAME].etag
    hub.drop_at(NAME, 100_000)
    with pytest.raises(PullError):
        pull(hub, retries=0)
    assert (blobs(env) / f"{old_etag}.incomplete").stat().st_size == 100_000
    assert pull_state.load("org/mirror")["partials"][NAME] == {"etag": old_etag, "validator": f'"{old_etag}"'}
    new = _new(310_000)
    hub.replace_file("org/mirror", NAME, new)  # re-synced while wslm was not running
    done = pull(hub)
    assert (Path(done["path"]) / NAME).read_bytes() == new
    assert hub.file_requests(NAME)[-1].range is None  # nothing of the old version was reused
    assert not list(blobs(env).glob("*.incomplete")) and pull_state.load("org/mirror") is None


@pytest.mark.parametrize("lost_state", [False, True], ids=["recorded", "no-record"])
def test_an_unchanged_file_still_resumes_with_a_range(hub, env, lost_state: bool) -> None:
    from wslm.backend.hub import pull_state
    from wslm.backend.hub.download import PullError

    etag = hub.repos["org/mirror"].files[NAME].etag
    hub.drop_at(NAME, 120_000)
    with pytest.raises(PullError):
        pull(hub, retries=0)
    if lost_state:  # e.g. a partial left by an older wslm: the resolve URL's ETag from HEAD still proves it
        pull_state.clear("org/mirror")
    served = hub.bytes_served(NAME)
    done = pull(hub)
    last = hub.file_requests(NAME)[-1]
    assert (last.range, last.if_range, last.status) == ("bytes=120000-", f'"{etag}"', 206)
    assert hub.bytes_served(NAME) - served == len(OLD) - 120_000
    assert (Path(done["path"]) / NAME).read_bytes() == OLD


def test_lfs_partial_from_the_cdn_resumes_with_the_cdns_etag(env) -> None:
    """Behind a redirect the ETag to send is the CDN's (recorded from its first answer), not the hub's
    X-Linked-Etag."""
    from wslm.backend.hub.download import Puller, PullError

    data = random.Random(3).randbytes(200_000)
    with FakeHub() as hub:
        hub.add_repo("org/mirror", {"config.json": b"{}", "w.bin": data})
        hub.drop_at("w.bin", 50_000)
        with pytest.raises(PullError):
            Puller("org/mirror", patterns=["w.bin"], endpoint=hub.url, retries=0).run()
        done = Puller("org/mirror", patterns=["w.bin"], endpoint=hub.url).run()
        last = hub.file_requests("w.bin")[-1]
        cdn_etag = f'"{hub.repos["org/mirror"].files["w.bin"].sha256}"'
        assert (last.range, last.if_range, last.status) == ("bytes=50000-", cdn_etag, 206)
        assert (Path(done["path"]) / "w.bin").read_bytes() == data
