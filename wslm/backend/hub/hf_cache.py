"""The Hugging Face cache layout, read and written without importing huggingface_hub (so `models list` stays
fast), following huggingface_hub's own rules:

    $HF_HUB_CACHE/models--org--name/
        blobs/<etag>               file contents, named by ETag (sha256 for LFS files, git sha1 otherwise)
        blobs/<etag>.incomplete    a download in progress (wslm keeps it between runs to resume)
        refs/<revision>            commit hash a branch or tag points to
        snapshots/<commit>/<file>  relative symlinks into blobs/
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
REPO_ID_RE = re.compile(r"^(?:[A-Za-z0-9][\w.\-]*/)?[A-Za-z0-9][\w.\-]*$")
DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (read at call time)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(env["HF_HUB_CACHE"])).expanduser()
    if env.get("HUGGINGFACE_HUB_CACHE"):  # the older name, still honoured by huggingface_hub
        return Path(os.path.expandvars(env["HUGGINGFACE_HUB_CACHE"])).expanduser()
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(env["HF_HOME"])).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def hub_endpoint(endpoint: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The hub or mirror to talk to: the --endpoint flag, else HF_ENDPOINT, else huggingface.co."""
    env = os.environ if env is None else env
    return (endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def is_valid_repo_id(repo_id: str) -> bool:
    return bool(REPO_ID_RE.match(repo_id)) and ".." not in repo_id and not repo_id.endswith(".git")


def repo_folder_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def repo_id_from_folder(name: str) -> str | None:
    if not name.startswith("models--"):
        return None
    return name[len("models--") :].replace("--", "/")


@dataclass(frozen=True)
class CachedRepo:
    repo_id: str
    folder: Path  # models--org--name

    @property
    def blobs(self) -> Path:
        return self.folder / "blobs"

    def ref(self, revision: str) -> str | None:
        """Commit hash for a branch/tag (or the revision itself when it is a commit with a snapshot)."""
        if COMMIT_RE.match(revision):
            return revision if (self.folder / "snapshots" / revision).is_dir() else None
        try:
            return (self.folder / "refs" / revision).read_text().strip() or None
        except OSError:
            return None

    def snapshot(self, revision: str | None = None) -> Path | None:
        """The snapshot folder for a revision; without one: refs/main, else the newest snapshot."""
        if revision:
            commit = self.ref(revision)
            return self.folder / "snapshots" / commit if commit else None
        commit = self.ref("main")
        if commit and (self.folder / "snapshots" / commit).is_dir():
            return self.folder / "snapshots" / commit
        snapshots = [p for p in (self.folder / "snapshots").glob("*") if p.is_dir()]
        return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None

    def incomplete_bytes(self) -> int:
        """Bytes sitting in unfinished downloads (resumable with `wslm models pull`)."""
        total = 0
        for p in self.blobs.glob("*.incomplete"):
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return total


def cached_repo(repo_id: str, cache_dir: Path | None = None) -> CachedRepo:
    cache_dir = hub_cache_dir() if cache_dir is None else cache_dir
    return CachedRepo(repo_id, cache_dir / repo_folder_name(repo_id))


def iter_cached_repos(cache_dir: Path | None = None) -> Iterator[CachedRepo]:
    """Model repos in the cache (datasets and spaces are skipped)."""
    cache_dir = hub_cache_dir() if cache_dir is None else cache_dir
    try:
        entries = sorted(cache_dir.iterdir())
    except OSError:
        return
    for entry in entries:
        repo_id = repo_id_from_folder(entry.name)
        if repo_id and entry.is_dir():
            yield CachedRepo(repo_id, entry)


def snapshot_files(snapshot: Path) -> list[str]:
    """Repo-relative names of the files present in a snapshot (dangling links left out)."""
    names = []
    for root, _dirs, files in os.walk(snapshot):
        for f in files:
            p = Path(root) / f
            if p.exists():
                names.append(p.relative_to(snapshot).as_posix())
    return sorted(names)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size  # follows the snapshot symlink to its blob
    except OSError:
        return 0


def write_ref(repo: CachedRepo, revision: str, commit: str) -> None:
    """Record which commit a branch/tag points to (atomically, like huggingface_hub)."""
    if revision == commit:
        return
    ref = repo.folder / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.exists() and ref.read_text() == commit:
        return
    tmp = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def link_snapshot_file(blob: Path, pointer: Path) -> None:
    """Point snapshots/<commit>/<file> at its blob with a relative symlink (a copy where links fail)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        import shutil

        shutil.copyfile(blob, pointer)
