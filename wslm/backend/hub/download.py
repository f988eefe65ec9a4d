"""Downloading a model repo into the HF cache, resumably.

huggingface_hub answers the metadata questions (repo info, HEAD of each file, error classes) but its own
file download drops the partial file when interrupted. We stream each file ourselves into
blobs/<etag>.incomplete, which survives a lost connection, Ctrl-C or SIGTERM: the next pull sends
`Range: bytes=<size>-` and continues. Finished files are checked against their ETag (sha256 for LFS files,
git's sha1 for small ones), moved to blobs/<etag> and linked from snapshots/<commit>/ the way
huggingface_hub does, so transformers and the engine load them offline.

A resume also sends `If-Range` with the ETag the partial's bytes came with (kept in pull_state), so a
file that changed meanwhile comes back whole (200) and is written from byte 0: a mirror whose ETags are
not content hashes (nothing to verify the result against) never gets two versions spliced together."""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse

from wslm.backend.hub import hf_cache, pull_state
from wslm.backend.hub.quant import GGUFVariant, gguf_variants, pick_variant

log = logging.getLogger(__name__)

EventSink = Callable[[dict], None]
READ_TIMEOUT_S = 30.0
PROGRESS_INTERVAL_S = 0.1  # at most 10 progress events a second
# Files of an HF model folder worth fetching; the rest (original/ checkpoints, ONNX, other frameworks) is skipped.
HF_MODEL_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jinja",
]
_SAFE_ETAG = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,127}$")  # it becomes blobs/<etag>
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class PullError(Exception):
    """A download failure with a stable code for the GUI: not_found, unauthorized, network, disk, checksum,
    unsupported, usage."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class _FileChanged(Exception):
    """The server now has another version of the file than the plan's HEAD saw: fetch its metadata again."""


class Cancelled(BaseException):  # noqa: N818 - BaseException so no library `except Exception` swallows it
    """Raised (from a signal handler or a cancel event) to stop a download, leaving it resumable."""


@dataclass
class RemoteFile:
    name: str
    size: int | None
    etag: str | None = None
    url: str | None = None
    same_host: bool = True
    direct: bool = False  # url is the resolve URL itself (no redirect): its ETag header is `etag`


@dataclass
class PullPlan:
    repo_id: str
    revision: str
    commit: str
    endpoint: str
    files: list[RemoteFile]
    done_id: str
    done_rel_path: str  # relative to the snapshot ("" for the folder itself)
    selected: dict | None = None  # the GGUF picked out of many, and the others on offer
    note: str | None = None
    gated: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)


def parse_repo_spec(spec: str) -> tuple[str, str | None]:
    """'org/repo', 'org/repo:Q4_K_M' or a hub URL -> (repo_id, quant label or None)."""
    spec = spec.strip()
    parsed = urlparse(spec)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        parts = [p for p in parsed.path.split("/") if p]
        spec = "/".join(parts[:2])
    quant = None
    if ":" in spec:
        spec, quant = spec.rsplit(":", 1)
    if not hf_cache.is_valid_repo_id(spec):
        raise PullError(
            f"{spec!r} is not a Hugging Face repo id. Use the name shown on the model's page, e.g. "
            "HuggingFaceTB/SmolLM2-135M-Instruct (optionally :Q4_K_M to pick a GGUF quantization).",
            "usage",
        )
    return spec, quant or None


def select_files(
    files: dict[str, int | None], patterns: list[str] | None, quant: str | None
) -> tuple[list[str], GGUFVariant | None, list[GGUFVariant]]:
    """Which repo files to fetch: those matching --file patterns, else a whole HF model, else one GGUF."""
    variants = gguf_variants(files)
    if patterns:
        chosen = [
            n
            for n in files
            if any(fnmatch.fnmatch(n, p) or fnmatch.fnmatch(n.rsplit("/", 1)[-1], p) for p in patterns)
        ]
        if not chosen:
            shown = ", ".join(sorted(files)[:15]) + (" ..." if len(files) > 15 else "")
            raise PullError(f"No file in the repo matches {' '.join(patterns)}. Files: {shown}", "not_found")
        picked = [v for v in variants if v.name in chosen]
        return sorted(chosen), (picked[0] if len(picked) == 1 else None), variants
    if quant:
        variant = pick_variant(variants, quant)
        if variant is None:
            labels = ", ".join(sorted({v.label or v.name for v in variants})) or "none"
            raise PullError(f"No {quant} GGUF in this repo. Quantizations on offer: {labels}", "not_found")
        return variant.files, variant, variants
    root = {n: s for n, s in files.items() if "/" not in n}
    has_st = any(n.endswith(".safetensors") for n in root)
    has_bin = any(re.fullmatch(r"pytorch_model.*\.bin", n) for n in root)
    if "config.json" in root and (has_st or has_bin):
        pats = HF_MODEL_PATTERNS + ([] if has_st else ["pytorch_model*.bin"])
        chosen = [n for n in root if any(fnmatch.fnmatch(n, p) for p in pats)]
        return sorted(chosen), None, variants
    variant = pick_variant(variants)
    if variant is not None:
        return variant.files, variant, variants
    raise PullError(
        "This repo has neither an HF model (config.json with safetensors weights) nor a .gguf file, so wslm "
        "cannot run it. Pick files by hand with --file PATTERN if you need them anyway.",
        "unsupported",
    )


class _Speed:
    """Transfer speed over the last few seconds (resumed bytes do not count as speed)."""

    def __init__(self, window_s: float = 3.0):
        self.window = window_s
        self.samples: deque[tuple[float, int]] = deque()
        self.transferred = 0

    def add(self, n: int) -> None:
        self.transferred += n
        now = time.monotonic()
        self.samples.append((now, self.transferred))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()

    def bps(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass
class Puller:
    """One `models pull`: plan() asks the hub what to fetch, run() fetches it and returns the done event."""

    spec: str
    patterns: list[str] | None = None
    revision: str | None = None
    endpoint: str | None = None
    token: str | None = None
    cache_dir: Path | None = None
    on_event: EventSink = field(default=lambda e: None)
    cancel: threading.Event | None = None
    retries: int = 5

    def __post_init__(self) -> None:
        self.repo_id, self.quant = parse_repo_spec(self.spec)
        self.endpoint = hf_cache.hub_endpoint(self.endpoint)
        self.cache_dir = self.cache_dir or hf_cache.hub_cache_dir()
        self.repo = hf_cache.cached_repo(self.repo_id, self.cache_dir)
        if self.token is None:
            from huggingface_hub import get_token

            self.token = get_token()
        self._last_emit = 0.0
        self._last_sent: tuple[str, int] | None = None
        self._partials: dict[str, dict] = {}  # pull_state "partials" of this run (see pull_state)
        self._state: dict = {}

    def resume_command(self) -> list[str]:
        """The command line that continues this pull (what `models list` offers for unfinished ones)."""
        cmd = ["wslm", "models", "pull", self.spec.strip()]
        for p in self.patterns or []:
            cmd += ["--file", p]
        if self.revision:
            cmd += ["--revision", self.revision]
        if self.endpoint != hf_cache.DEFAULT_ENDPOINT:
            cmd += ["--endpoint", self.endpoint]
        return cmd

    # --- planning ----------------------------------------------------------------------------------

    def plan(self) -> PullPlan:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self.token or False)
        with self._hub_errors():
            info = api.model_info(self.repo_id, revision=self.revision, files_metadata=True)
        if not info.sha:
            raise PullError(
                f"{self.endpoint} did not say which commit {self.repo_id} is at; is it a Hub mirror?",
                "network",
            )
        siblings = {s.rfilename: s.size for s in (info.siblings or [])}
        names, variant, variants = select_files(siblings, self.patterns, self.quant)
        plan = PullPlan(self.repo_id, self.revision or "main", info.sha, self.endpoint, [], self.repo_id, "",
                        gated=bool(info.gated))  # fmt: skip
        if variant is not None:
            plan.done_id, plan.done_rel_path = f"{self.repo_id}/{variant.name}", variant.name
            if len(variants) > 1:
                others = sorted({v.label or v.name for v in variants if v is not variant})
                plan.selected = {"file": variant.name, "quantization": variant.label, "size": variant.size,
                                 "alternatives": others}  # fmt: skip
                if not self.patterns and not self.quant:
                    plan.note = (f"Picked {variant.label or variant.name} ({variant.name}) out of {len(variants)} "
                                 f"GGUF files; others: {', '.join(others)}. Choose one with --file '*Q8_0*' or "
                                 f"{self.repo_id}:Q8_0.")  # fmt: skip
        # Small files first: with config.json and the shard index in place, an interrupted download is
        # recognisably unfinished (the catalog never offers half a model to the engine).
        for name in sorted(names, key=lambda n: (n.endswith((".safetensors", ".bin", ".gguf")), n)):
            plan.files.append(self._head(name, info.sha, siblings.get(name)))
        return plan

    def _head(self, name: str, commit: str, listed_size: int | None) -> RemoteFile:
        from huggingface_hub import get_hf_file_metadata

        # Before anything is fetched: a mirror listing "../x" or "/etc/x" must never get a write outside the cache.
        if Path(name).is_absolute() or ".." in name.replace("\\", "/").split("/"):
            raise PullError(f"The hub listed an unsafe file name {name!r}; refusing to write it.", "network")
        url = f"{self.endpoint}/{self.repo_id}/resolve/{commit}/{quote(name)}"
        with self._hub_errors(name):
            meta = get_hf_file_metadata(url, token=self.token or False, endpoint=self.endpoint)
        if meta.etag and not _SAFE_ETAG.match(meta.etag):
            raise PullError(
                f"{url} sent an ETag that is not a file name ({meta.etag!r}); is it a Hub mirror?", "network"
            )
        if not meta.etag:
            raise PullError(
                f"{url} has no ETag: {self.endpoint} does not behave like the Hugging Face hub.", "network"
            )
        location = meta.location or url
        same = urlparse(location).netloc == urlparse(url).netloc
        direct = urlparse(location)[:3] == urlparse(url)[:3]
        return RemoteFile(
            name, meta.size if meta.size is not None else listed_size, meta.etag, location, same, direct
        )

    def _hub_errors(self, filename: str | None = None):
        return _HubErrors(self, filename)

    # --- downloading -------------------------------------------------------------------------------

    def run(self, plan: PullPlan | None = None) -> dict:
        plan = plan or self.plan()
        snapshot = self.repo.folder / "snapshots" / plan.commit
        self._partials = (pull_state.load(self.repo_id) or {}).get("partials") or {}
        self._discard_stale_partials(plan)
        have = {f.name: self._present_bytes(f, snapshot) for f in plan.files}
        start = {
            "event": "start", "repo": plan.repo_id, "revision": plan.revision, "commit": plan.commit,
            "endpoint": plan.endpoint, "cache_dir": str(self.cache_dir),
            "files": [{"name": f.name, "size": f.size} for f in plan.files],
            "total_bytes": plan.total_bytes, "resumed_bytes": sum(have.values()),
        }  # fmt: skip
        if plan.selected:
            start["selected"] = plan.selected
        if plan.note:
            start["note"] = plan.note
        self._check_disk(plan, have)
        self.on_event(start)
        hf_cache.write_ref(self.repo, plan.revision, plan.commit)
        self._state = {
            "repo": plan.repo_id, "revision": plan.revision, "commit": plan.commit, "endpoint": plan.endpoint,
            "files": [f.name for f in plan.files], "patterns": self.patterns, "total_bytes": plan.total_bytes,
            "state": "in_progress", "started": time.time(), "command": self.resume_command(),
            "partials": self._partials,
        }  # fmt: skip
        pull_state.save(self.repo_id, self._state)
        speed = _Speed()
        done_before = 0
        for f in plan.files:
            self._fetch(plan, f, snapshot, done_before, speed)
            done_before += f.size or 0
            self.on_event({"event": "file_done", "file": f.name})
        pull_state.clear(self.repo_id)
        path = snapshot / plan.done_rel_path if plan.done_rel_path else snapshot
        return {"event": "done", "id": plan.done_id, "path": str(path), "repo": plan.repo_id, "commit": plan.commit,
                "total_bytes": plan.total_bytes}  # fmt: skip

    def _paths(self, f: RemoteFile, snapshot: Path) -> tuple[Path, Path, Path]:
        blob = self.repo.blobs / f.etag
        return blob, blob.with_name(blob.name + ".incomplete"), snapshot.joinpath(*f.name.split("/"))

    def _present_bytes(self, f: RemoteFile, snapshot: Path) -> int:
        blob, part, pointer = self._paths(f, snapshot)
        if pointer.exists() or blob.exists():
            return f.size or hf_cache.file_size(blob)
        return hf_cache.file_size(part)

    def _check_disk(self, plan: PullPlan, have: dict[str, int]) -> None:
        need = sum(max((f.size or 0) - have[f.name], 0) for f in plan.files)
        probe = self.cache_dir
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if need > free:
            raise PullError(
                f"Not enough disk space in {self.cache_dir}: the download needs {_human(need)} more, "
                f"{_human(free)} is free. Free some space (`wslm models rm ID`) or point HF_HUB_CACHE at a bigger "
                "Linux disk (not /mnt/c: loading from Windows drives is slow).",
                "disk",
            )

    # --- partials: which server version the bytes of each blobs/<etag>.incomplete came from ------------

    def _lock(self, etag: str):
        from huggingface_hub.utils import WeakFileLock

        lock = self.cache_dir / ".locks" / self.repo.folder.name / f"{etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        return WeakFileLock(lock)  # the same lock huggingface_hub takes: two pulls never write one file

    def _remember(self, f: RemoteFile, validator: str | None) -> None:
        """Record the strong ETag the partial's bytes came with (None: no usable one)."""
        if validator is None:
            if self._partials.pop(f.name, None) is None:
                return
        else:
            self._partials[f.name] = {"etag": f.etag, "validator": validator}
        pull_state.save(self.repo_id, self._state)

    def _validator(self, f: RemoteFile) -> str | None:
        """The If-Range value for resuming f's partial, or None when nothing proves which version it holds."""
        rec = self._partials.get(f.name)
        if isinstance(rec, dict) and rec.get("etag") == f.etag and isinstance(rec.get("validator"), str):
            return rec["validator"]
        return f'"{f.etag}"' if f.direct else None

    def _discard_stale_partials(self, plan: PullPlan) -> None:
        """A partial of a version the hub no longer lists (its ETag changed) can never be finished: delete it."""
        current = {f.etag for f in plan.files}
        for f in plan.files:
            rec = self._partials.get(f.name)
            if not isinstance(rec, dict) or rec.get("etag") == f.etag:
                continue
            del self._partials[f.name]
            old = str(rec.get("etag") or "")
            if _SAFE_ETAG.match(old) and old not in current:
                with self._lock(old):
                    (self.repo.blobs / f"{old}.incomplete").unlink(missing_ok=True)
                log.info("%s changed on the hub since the last pull: its partial download was discarded", f.name)

    def _fetch(self, plan: PullPlan, f: RemoteFile, snapshot: Path, done_before: int, speed: _Speed) -> None:
        for _ in range(3):
            blob, part, pointer = self._paths(f, snapshot)
            if pointer.exists():
                return
            blob.parent.mkdir(parents=True, exist_ok=True)
            with self._lock(f.etag):
                if not blob.exists():
                    try:
                        self._stream(plan, f, part, done_before, speed)
                    except _FileChanged:
                        part.unlink(missing_ok=True)
                        self._remember(f, None)
                        log.warning("%s changed on %s during the download: starting it again", f.name, plan.endpoint)
                        fresh = self._head(f.name, plan.commit, None)
                        f.size, f.etag, f.url, f.same_host, f.direct = (fresh.size, fresh.etag, fresh.url,
                                                                          fresh.same_host, fresh.direct)
                        continue
                    self._verify(f, part)
                    os.chmod(part, 0o666 & ~_umask())
                    os.replace(part, blob)
                    self._remember(f, None)
                hf_cache.link_snapshot_file(blob, pointer)
            return
        raise PullError(
            f"{f.name} keeps changing on {plan.endpoint} while it downloads. Try again later.", "network"
        )

    def _stream(self, plan: PullPlan, f: RemoteFile, part: Path, done_before: int, speed: _Speed) -> None:
        import httpx2
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        failures = restarts = 0
        while True:
            offset = hf_cache.file_size(part)
            validator = self._validator(f)
            if offset and f.size is not None and offset == f.size and (validator or _content_hash(f.etag)):
                return
            if offset and (
                (f.size is not None and offset > f.size) or (validator is None and not _content_hash(f.etag))
            ):
                # Too long, or from an unknown version with no checksum to catch a splice: start over.
                part.unlink()
                offset = 0
            headers = build_hf_headers(token=self.token or False)
            if not f.same_host:
                headers.pop("authorization", None)  # signed CDN URL: the token must not leave the hub
            headers["Accept-Encoding"] = "identity"
            if offset:
                headers["Range"] = f"bytes={offset}-"
                if validator:
                    headers["If-Range"] = validator  # changed since? then the whole new file (200), not a range
            got_any = False
            try:
                timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=15.0)
                with get_session().stream(
                    "GET", f.url, headers=headers, timeout=timeout, follow_redirects=True
                ) as r:
                    if r.status_code == 416 and offset and f.size is None:
                        return
                    if r.status_code >= 400:
                        r.read()
                        with self._hub_errors(f.name):
                            hf_raise_for_status(r)
                    mode = "ab"
                    etag = r.headers.get("ETag")
                    if offset and r.status_code == 206 and not _continues(r, offset, f.size, validator):
                        # If-Range ignored and another version's bytes sent: never append those.
                        restarts += 1
                        if restarts > 3:
                            raise PullError(f"{f.url} keeps sending ranges of another version of {f.name}; "
                                            "try again later.", "network")  # fmt: skip
                        part.unlink(missing_ok=True)
                        self._remember(f, None)
                        continue
                    if r.status_code != 206:
                        # The whole body: first request, Range ignored, or the file changed (If-Range).
                        mode, offset = "wb", 0
                        if f.direct and etag and _normalize_etag(etag) != f.etag:
                            raise _FileChanged()
                        self._remember(f, _strong(etag))
                    if f.size is None:
                        total = r.headers.get("Content-Range", "").rsplit("/", 1)[-1]
                        f.size = int(total) if total.isdigit() else _int(r.headers.get("Content-Length"))
                    with open(part, mode) as out:
                        for chunk in r.iter_bytes():
                            if self.cancel is not None and self.cancel.is_set():
                                raise Cancelled()
                            out.write(chunk)
                            offset += len(chunk)
                            got_any = True
                            speed.add(len(chunk))
                            self._progress(plan, f, offset, done_before, speed)
                if f.size is not None and offset < f.size:
                    raise httpx2.RemoteProtocolError(
                        "the server closed the connection before the end of the file"
                    )
                self._progress(plan, f, offset, done_before, speed, force=True)
                return
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise PullError(
                        f"The disk holding {self.cache_dir} is full (while writing {f.name}). Free some space and "
                        "run the same command again: what was downloaded is kept.",
                        "disk",
                    ) from exc
                raise
            except httpx2.TransportError as exc:
                failures = 1 if got_any else failures + 1  # count failures in a row without progress
                if failures > self.retries:
                    have = hf_cache.file_size(part)
                    raise PullError(
                        f"Connection lost while downloading {f.name} ({_human(have)} of {_human(f.size or 0)}): "
                        f"{exc}. Run the same command again to resume; nothing downloaded is lost.",
                        "network",
                    ) from exc
                delay = min(2 ** max(failures - 1, 0), 8)
                log.warning("%s: %s; resuming in %ss", f.name, exc, delay)
                if self.cancel is not None:
                    if self.cancel.wait(delay):
                        raise Cancelled() from None
                else:
                    time.sleep(delay)

    def _progress(self, plan: PullPlan, f: RemoteFile, file_bytes: int, done_before: int, speed: _Speed,
                  force: bool = False) -> None:  # fmt: skip
        now = time.monotonic()
        if (f.name, file_bytes) == self._last_sent or (
            not force and now - self._last_emit < PROGRESS_INTERVAL_S
        ):
            return
        self._last_emit, self._last_sent = now, (f.name, file_bytes)
        bps = speed.bps()
        overall = done_before + file_bytes
        total = plan.total_bytes
        eta = (total - overall) / bps if bps > 0 and total else None
        self.on_event({
            "event": "progress", "file": f.name, "file_bytes": file_bytes, "file_total": f.size,
            "bytes": overall, "total_bytes": total, "speed_bps": round(bps), "eta_s": round(eta, 1) if eta is not None else None,
        })  # fmt: skip

    def _verify(self, f: RemoteFile, part: Path) -> None:
        """Compare the finished file with its ETag; a mismatch means corruption in transit."""
        size = hf_cache.file_size(part)
        if f.size is not None and size != f.size:
            raise PullError(
                f"{f.name}: got {size} bytes, expected {f.size}. Run the command again.", "network"
            )
        etag = (f.etag or "").lower()
        if _HEX64.match(etag):
            h = hashlib.sha256()
        elif _HEX40.match(etag):
            h = hashlib.sha1()
            h.update(b"blob %d\0" % size)  # git's object id
        else:
            return
        with open(part, "rb") as fh:
            while block := fh.read(4 * 1024 * 1024):
                if self.cancel is not None and self.cancel.is_set():
                    raise Cancelled()
                h.update(block)
        if h.hexdigest() != etag:
            part.unlink(missing_ok=True)
            raise PullError(
                f"{f.name} arrived corrupted (checksum does not match the hub's {etag[:12]}...). The bad copy was "
                "deleted; run the same command again to download it afresh.",
                "checksum",
            )


class _HubErrors:
    """Turns huggingface_hub and httpx errors into PullErrors that name the cause and the fix."""

    def __init__(self, puller: Puller, filename: str | None):
        self.p, self.filename = puller, filename

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, (PullError, Cancelled, KeyboardInterrupt)):
            return False
        mapped = self._map(exc)
        if mapped is None:
            return False
        raise mapped from exc

    def _map(self, exc: BaseException) -> PullError | None:
        import httpx2
        from huggingface_hub import errors
        from huggingface_hub.utils import OfflineModeIsEnabled

        p, repo, ep = self.p, self.p.repo_id, self.p.endpoint
        page = f"{ep}/{repo}"
        if isinstance(exc, OfflineModeIsEnabled):
            return PullError(
                "HF_HUB_OFFLINE=1 is set, so nothing can be downloaded. Unset it and run again.", "network"
            )
        if isinstance(exc, errors.GatedRepoError):
            if p.token:
                return PullError(
                    f"{repo} is gated and the token in HF_TOKEN has no access to it. Open {page} while logged in as "
                    "the token's owner, accept the terms (some repos need approval), then run again.",
                    "unauthorized",
                )
            return PullError(
                f"{repo} is gated: it needs a Hugging Face account that accepted its terms. Accept them at {page}, "
                "create a read token at https://huggingface.co/settings/tokens, then run again with "
                "HF_TOKEN=hf_... set.",
                "unauthorized",
            )
        if isinstance(exc, errors.RevisionNotFoundError):
            return PullError(
                f"{repo} has no revision {p.revision!r} on {ep}. Check the branch, tag or commit.",
                "not_found",
            )
        if isinstance(exc, errors.RemoteEntryNotFoundError):
            return PullError(f"{repo} has no file {self.filename!r} at this revision on {ep}.", "not_found")
        if isinstance(exc, errors.RepositoryNotFoundError):
            hint = (
                "the token in HF_TOKEN cannot read it (private repo?)" if p.token
                else "if it is private, set HF_TOKEN to a token that can read it"
            )  # fmt: skip
            return PullError(
                f"Repository {repo} not found on {ep}. Check the name (org/name, as on the model's page); {hint}.",
                "not_found",
            )
        if isinstance(exc, errors.HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else None
            if status == 401:
                msg = "the token in HF_TOKEN is invalid or expired: create a new one at https://huggingface.co/settings/tokens"
                if not p.token:
                    msg = "it needs a login: set HF_TOKEN to a read token from https://huggingface.co/settings/tokens"
                return PullError(f"{ep} refused access to {repo} (401): {msg}.", "unauthorized")
            if status == 403:
                return PullError(
                    f"{ep} refused access to {repo} (403): your token lacks permission. Accept the terms at {page} "
                    "or use a token with read access.",
                    "unauthorized",
                )
            return PullError(
                f"{ep} answered {status} for {repo}: try again later, or use a mirror with --endpoint URL.",
                "network",
            )
        if isinstance(exc, (httpx2.TransportError, httpx2.TooManyRedirects)):
            return PullError(
                f"Cannot reach {ep} ({exc.__class__.__name__}: {exc}). Check the network; if the hub is blocked "
                "where you are, use a mirror: --endpoint URL or HF_ENDPOINT=URL.",
                "network",
            )
        return None


def _content_hash(etag: str | None) -> bool:
    """Whether the ETag is a sha256 or git sha1 that _verify checks the finished file against."""
    return bool(etag) and bool(_HEX64.match(etag.lower()) or _HEX40.match(etag.lower()))


def _normalize_etag(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"')  # as huggingface_hub names blobs


def _strong(etag: str | None) -> str | None:
    """A quoted strong ETag usable in If-Range (RFC 9110 forbids weak ones there), else None."""
    etag = (etag or "").strip()
    return etag if re.fullmatch(r'"[\x21\x23-\x7e]*"', etag) else None


def _continues(r, offset: int, size: int | None, validator: str | None) -> bool:
    """Whether a 206 carries the bytes right after ours, of the version we have (same ETag and length)."""
    etag = _strong(r.headers.get("ETag"))
    if validator and etag and etag != validator:
        return False
    m = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", r.headers.get("Content-Range", ""))
    if m is None or int(m.group(1)) != offset:
        return False
    return size is None or m.group(3) == "*" or int(m.group(3)) == size


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
