"""A Hugging Face hub on loopback, speaking the API the way huggingface_hub 2.x calls it, for download tests
(wslm's `models pull`, and the GUI's model page).

Served:
  GET  /api/models/{repo}[/revision/{rev}]      model info: sha, gated, private, siblings (sizes, blobId, lfs
                                                 with ?blobs=true)
  GET  /api/models?search=Q&limit=N             search: public repos whose id contains Q
  GET  /api/models/{repo}/tree/{rev}[/{path}]   file tree (?recursive=true)
  HEAD|GET /{repo}/resolve/{rev}/{file}          small files: 200 + ETag (git sha1), X-Repo-Commit,
                                                 Content-Length, Accept-Ranges; LFS files: 302 to a "CDN" on
                                                 another host name (localhost) with X-Linked-Etag (sha256) and
                                                 X-Linked-Size, like the real hub
  GET  /cdn/{sha256}                             the LFS bytes, Range -> 206
Range is honoured as real servers do: with `If-Range: "<etag>"` only while that is the file's current
strong ETag, otherwise the whole body comes back (200).
Errors carry the hub's headers: 401/404 X-Error-Code RepoNotFound, 401/403 GatedRepo, 404 RevisionNotFound,
404 EntryNotFound. Faults for tests: drop the connection at a byte position of a file (`drop_at`, then
`on_drop`), send slowly (`rate_bps`), change a file under the same commit (`replace_file`) the way a plain
mirror does, with ETags that are not content hashes (`add_repo(..., opaque_etags=True)`: nginx-style
"<mtime>-<size>").

    with FakeHub() as hub:
        hub.add_repo("org/tiny", folder)          # or a {name: bytes} dict
        hub.url                                    # http://127.0.0.1:PORT

Standalone: python tests/hub_server.py org/tiny=/path/to/folder [...]  (prints {"url": ...}, serves until
killed)."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_PATTERNS = ("*.safetensors", "*.gguf", "*.bin", "*.pt", "*.pth", "*.model")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_mtime = [1_700_000_000]  # a clock for opaque ETags: every new file version gets a later "mtime"


@dataclass
class RepoFile:
    data: bytes
    lfs: bool
    opaque: bool = False  # ETag "<mtime>-<size>" (hex), as nginx sends, instead of a content hash
    sha1: str = ""
    sha256: str = ""
    opaque_etag: str = ""

    def __post_init__(self) -> None:
        self.sha1 = git_blob_sha1(self.data)
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        if self.opaque:
            _mtime[0] += 1
            self.opaque_etag = f"{_mtime[0]:x}-{len(self.data):x}"

    @property
    def etag(self) -> str:
        """What the resolve URL reports (ETag, or X-Linked-Etag for LFS files)."""
        if self.opaque:
            return self.opaque_etag
        return self.sha256 if self.lfs else self.sha1


@dataclass
class Repo:
    repo_id: str
    sha: str
    files: dict[str, RepoFile]
    gated: bool = False
    private: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> sha


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    auth: str | None
    status: int = 0
    sent: int = 0  # body bytes actually written
    file: str | None = None
    if_range: str | None = None


class FakeHub:
    def __init__(self, host: str = "127.0.0.1", cdn_host: str = "localhost"):
        self.repos: dict[str, Repo] = {}
        self.tokens: set[str] = set()  # tokens that exist (others get 401 "invalid credentials")
        self.gated_access: dict[str, set[str]] = {}  # repo -> tokens that accepted its terms
        self.rate_bps: int | None = None  # throttle file bodies
        self.requests: list[Request] = []
        self._drops: dict[str, list[int]] = {}  # file name -> byte positions at which to drop, once each
        self.corrupt: set[str] = set()  # files whose bytes get flipped in transit
        self.honour_range = True  # False: answer Range with the whole file (200), as some proxies do
        self.honour_if_range = True  # False: ignore If-Range (Range alone decides), as some servers do
        self.on_drop: Callable[[str], None] | None = None  # called with the file name after each drop
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self  # type: ignore[attr-defined]
        self.host, self.port = host, self._server.server_address[1]
        self.cdn_host = cdn_host
        self._thread: threading.Thread | None = None

    # --- set-up ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeHub:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes] | Path | str,
        *,
        gated: bool = False,
        private: bool = False,
        lfs_patterns: tuple[str, ...] = LFS_PATTERNS,
        tags: tuple[str, ...] = (),
        opaque_etags: bool = False,
    ) -> str:
        """Serve a repo (a folder or a {name: bytes} dict); returns its commit sha."""
        if not isinstance(files, dict):
            root = Path(files)
            files = {
                p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            }
        repo_files = {n: RepoFile(d, any(fnmatch(n, p) for p in lfs_patterns), opaque_etags) for n, d in files.items()}
        digest = hashlib.sha1(repo_id.encode())
        for n in sorted(repo_files):
            digest.update(n.encode() + repo_files[n].sha1.encode())
        sha = digest.hexdigest()
        refs = {"main": sha, **{t: sha for t in tags}}
        self.repos[repo_id] = Repo(repo_id, sha, repo_files, gated=gated, private=private, refs=refs)
        return sha

    def replace_file(self, repo_id: str, filename: str, data: bytes) -> None:
        """Change a file in place, commit unchanged, as on a mirror that re-syncs a file (new ETag)."""
        old = self.repos[repo_id].files[filename]
        self.repos[repo_id].files[filename] = RepoFile(data, old.lfs, old.opaque)

    def drop_at(self, filename: str, position: int) -> None:
        """Cut the connection once, when a download of `filename` reaches byte `position`."""
        with self._lock:
            self._drops.setdefault(filename, []).append(position)

    def bytes_served(self, filename: str) -> int:
        return sum(r.sent for r in self.requests if r.file == filename and r.method == "GET")

    def file_requests(self, filename: str, method: str = "GET") -> list[Request]:
        return [r for r in self.requests if r.file == filename and r.method == method]

    # --- helpers for the handler -------------------------------------------------------------------

    def _take_drop(self, filename: str, start: int, end: int) -> int | None:
        with self._lock:
            for pos in sorted(self._drops.get(filename, [])):
                if start <= pos < end:
                    self._drops[filename].remove(pos)
                    return pos
        return None

    def _find_blob(self, sha256: str) -> tuple[str, RepoFile] | None:
        for repo in self.repos.values():
            for name, f in repo.files.items():
                if f.sha256 == sha256:
                    return name, f
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep test output quiet
        pass

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[attr-defined]

    # --- plumbing ----------------------------------------------------------------------------------

    def _record(self) -> Request:
        req = Request(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"),
                      if_range=self.headers.get("If-Range"))
        with self.hub._lock:
            self.hub.requests.append(req)
        return req

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    def _send(self, req: Request, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json") -> None:  # fmt: skip
        req.status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Request-Id", f"Root=fake-{id(req):x}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            req.sent = len(body)

    def _error(
        self, req: Request, status: int, code: str | None, message: str, extra: dict | None = None
    ) -> None:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(req, status, json.dumps({"error": message}).encode(), headers)

    def _repo_access(self, req: Request, repo_id: str) -> Repo | None:
        """The repo if this request may see it; otherwise the error is sent and None returned."""
        token = self._token()
        if token is not None and token not in self.hub.tokens:
            self._error(req, 401, None, "Invalid credentials in Authorization header")
            return None
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and token is None):
            # The hub answers 401 to anonymous callers and 404 to logged-in ones, RepoNotFound either way.
            self._error(req, 401 if token is None else 404, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _revision(self, req: Request, repo: Repo, rev: str) -> str | None:
        sha = repo.refs.get(rev) or (rev if rev == repo.sha else None)
        if sha is None:
            self._error(req, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return sha

    # --- routes ------------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        self._route()

    def do_HEAD(self) -> None:  # noqa: N802
        self._route()

    def _route(self) -> None:
        req = self._record()
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        try:
            if path.rstrip("/") == "/api/models":
                return self._search(req, query)
            if path.startswith("/api/models/"):
                return self._api_model(req, path[len("/api/models/") :], query)
            if path.startswith("/cdn/"):
                return self._cdn(req, path[len("/cdn/") :])
            if "/resolve/" in path:
                repo_id, rest = path.lstrip("/").split("/resolve/", 1)
                rev, _, filename = rest.partition("/")
                return self._resolve(req, repo_id, rev, filename)
            self._error(req, 404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _search(self, req: Request, query: dict) -> None:
        """GET /api/models?search=Q&limit=N: public repos whose id contains Q (case-insensitive), as the hub lists."""
        words = query.get("search", [""])[0].lower()
        limit = int(query.get("limit", ["20"])[0])
        found = [{"id": r.repo_id, "modelId": r.repo_id, "downloads": 1000 - i, "likes": 0, "private": False,
                  "pipeline_tag": "text-generation", "tags": ["text-generation"], "library_name": "transformers"}
                 for i, r in enumerate(sorted(self.hub.repos.values(), key=lambda r: r.repo_id))
                 if words in r.repo_id.lower() and not r.private]
        self._send(req, 200, json.dumps(found[:limit]).encode())

    def _api_model(self, req: Request, rest: str, query: dict) -> None:
        rev, sub = "main", None
        if "/tree/" in rest:
            rest, tail = rest.split("/tree/", 1)
            rev, _, sub = tail.partition("/")
            sub = sub or ""
        elif "/revision/" in rest:
            rest, rev = rest.split("/revision/", 1)
        repo = self._repo_access(req, rest)
        if repo is None:
            return
        sha = self._revision(req, repo, rev)
        if sha is None:
            return
        if sub is not None:
            return self._tree(req, repo, sub, query)
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for name, f in sorted(repo.files.items()):
            s: dict = {"rfilename": name}
            if blobs:
                s.update(size=len(f.data), blobId=f.sha1)
                if f.lfs:
                    s["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}
            siblings.append(s)
        org = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id, "modelId": repo.repo_id,
            "author": org, "sha": sha, "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z", "private": repo.private,
            "gated": "manual" if repo.gated else False, "disabled": False, "downloads": 0, "likes": 0,
            "library_name": "transformers", "tags": ["text-generation"], "pipeline_tag": "text-generation",
            "siblings": siblings, "spaces": [], "usedStorage": sum(len(f.data) for f in repo.files.values()),
        }  # fmt: skip
        self._send(req, 200, json.dumps(info).encode())

    def _tree(self, req: Request, repo: Repo, sub: str, query: dict) -> None:
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        entries, dirs = [], set()
        for name, f in sorted(repo.files.items()):
            if not name.startswith(prefix):
                continue
            rel = name[len(prefix) :]
            if "/" in rel and not recursive:
                dirs.add(prefix + rel.split("/", 1)[0])
                continue
            for i in range(1, rel.count("/") + 1):
                dirs.add(prefix + "/".join(rel.split("/")[:i]))
            e = {"type": "file", "oid": f.sha1, "size": len(f.data), "path": name}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            entries.append(e)
        entries = [
            {"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)
        ] + entries
        self._send(req, 200, json.dumps(entries).encode())

    def _resolve(self, req: Request, repo_id: str, rev: str, filename: str) -> None:
        req.file = filename
        repo = self._repo_access(req, repo_id)
        if repo is None:
            return
        sha = self._revision(req, repo, rev)
        if sha is None:
            return
        if repo.gated:
            token = self._token()
            if token is None or token not in self.hub.gated_access.get(repo_id, set()):
                msg = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
                    if token is None
                    else f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit https://huggingface.co/{repo_id} to ask for access."
                )  # fmt: skip
                return self._error(req, 401 if token is None else 403, "GatedRepo", msg)
        f = repo.files.get(filename)
        if f is None:
            return self._error(
                req, 404, "EntryNotFound", f'{filename} does not exist on "{rev}"', {"X-Repo-Commit": sha}
            )
        common = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            location = f"http://{self.hub.cdn_host}:{self.hub.port}/cdn/{f.sha256}?filename={quote(filename)}"
            headers = {**common, "Location": location, "ETag": f'"{f.sha1}"', "X-Linked-Etag": f'"{f.etag}"',
                       "X-Linked-Size": str(len(f.data))}  # fmt: skip
            return self._send(req, 302, b"", headers, content_type="text/plain; charset=utf-8")
        self._body(req, filename, f.data, {**common, "ETag": f'"{f.etag}"'})

    def _cdn(self, req: Request, sha256: str) -> None:
        found = self.hub._find_blob(sha256)
        if found is None:
            return self._error(req, 404, None, "NoSuchKey")
        name, f = found
        req.file = name
        self._body(req, name, f.data, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"})

    def _body(self, req: Request, filename: str, data: bytes, headers: dict) -> None:
        """Send a file (or its requested Range), throttled and cut short as the test asked."""
        size, start, end = len(data), 0, len(data)
        status = 200
        rng = self.headers.get("Range") if self.hub.honour_range else None
        if_range = self.headers.get("If-Range") if self.hub.honour_if_range else None
        if rng and if_range is not None and if_range != headers.get("ETag"):
            # RFC 9110 13.1.5: the range only while If-Range is the current (strong) ETag, else the whole
            # representation. A date in If-Range never matches here: no Last-Modified is sent.
            rng = None
        if rng:
            try:
                unit, spec = rng.split("=", 1)
                a, _, b = spec.partition("-")
                start = int(a) if a else size - int(b)
                end = min(int(b) + 1, size) if (a and b) else size
                if unit != "bytes" or start >= size or start < 0:
                    raise ValueError
            except ValueError:
                req.status = 416
                return self._send(req, 416, b"", {"Content-Range": f"bytes */{size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        req.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        if filename in self.hub.corrupt:
            data = bytes(b ^ 0xFF for b in data)
        drop = self.hub._take_drop(filename, start, end)
        stop = drop if drop is not None else end
        pos, step = start, 16 * 1024
        while pos < stop:
            chunk = data[pos : min(pos + step, stop)]
            self.wfile.write(chunk)
            self.wfile.flush()
            pos += len(chunk)
            req.sent += len(chunk)
            if self.hub.rate_bps:
                time.sleep(len(chunk) / self.hub.rate_bps)
        if drop is not None:
            # Vanish mid-body, the way a dropped Wi-Fi or a proxy timeout does.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            if self.hub.on_drop is not None:
                self.hub.on_drop(filename)


# --- tiny models for the hub to serve -----------------------------------------------------------------


def make_tiny_llama(folder: Path, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """A real, loadable Llama checkpoint of ~110K parameters with a byte-level BPE tokenizer (~450 KB)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hi there, hello world. the quick brown fox jumps"] * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return folder


def make_tiny_gguf(path: Path, file_type: str = "Q4_K_M", arch: str = "llama", context: int = 512,
                   ffn: int | None = None, expert_ffn: int | None = None) -> Path:  # fmt: skip
    """A small GGUF with real header metadata (architecture, context, file type, a vocabulary, tensors).
    Its tensors are F32/F16 whatever `file_type` says: enough for metadata, not for generating.
    ffn / expert_ffn: the MLP and MoE expert widths, when a test needs them."""
    import numpy as np
    from gguf import GGUFWriter, LlamaFileType

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(path, arch)
    w.add_name(path.stem)
    w.add_context_length(context)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if ffn:
        w.add_feed_forward_length(ffn)
    if expert_ffn:
        w.add_expert_feed_forward_length(expert_ffn)
    w.add_file_type(LlamaFileType[f"MOSTLY_{file_type}" if file_type != "F32" else "ALL_F32"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "</s>", "hi"])
    w.add_tensor("token_embd.weight", np.zeros((3, 64), np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str]) -> int:
    hub = FakeHub()
    for arg in argv:
        repo_id, _, folder = arg.partition("=")
        hub.add_repo(repo_id, Path(folder))
    hub.start()
    print(json.dumps({"url": hub.url}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
