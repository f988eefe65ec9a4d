"""`wslm models list|pull|rm|info`: for people (tables, a progress line) and for the GUI (--json)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="list, download, inspect and remove models")
    sub = models.add_subparsers(dest="models_command", metavar="ACTION")
    models.set_defaults(func=lambda args: _usage(models))

    p = sub.add_parser("list", help="models on this machine (HF cache, models folder, demo)")
    p.add_argument("--json", action="store_true", help='one JSON line: {"models": [...]}')
    p.add_argument(
        "--context", type=_positive, metavar="N",
        help="context length for the memory estimate (default: each model's own, as `wslm serve` uses)",
    )
    p.add_argument("--all", action="store_true", help="also list unfinished downloads")
    _estimate_flags(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("pull", help="download a model from the Hugging Face hub (or a mirror)")
    p.add_argument(
        "repo", metavar="REPO", help="org/name, optionally org/name:Q4_K_M to pick a GGUF quantization"
    )
    p.add_argument(
        "--file", action="append", metavar="PATTERN", help="only files matching this glob (repeatable)"
    )
    p.add_argument("--revision", metavar="R", help="branch, tag or commit (default main)")
    p.add_argument(
        "--endpoint",
        metavar="URL",
        help="hub mirror to download from (default: HF_ENDPOINT or huggingface.co)",
    )
    p.add_argument(
        "--retries", type=int, default=5, metavar="N", help="reconnect this many times in a row (default 5)"
    )
    p.add_argument("--json", action="store_true", help="JSON-lines progress events on stdout")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("search", help="find models on the hub (or a mirror) with their files and sizes")
    p.add_argument("query")
    p.add_argument("--endpoint", default=None, help="hub mirror (default: HF_ENDPOINT or huggingface.co)")
    p.add_argument("--limit", type=_positive, default=20)
    p.add_argument("--json", action="store_true", help='one JSON line: {"models": [...]}')
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("rm", help="delete a model from disk")
    p.add_argument("id", metavar="ID", help="an id from `wslm models list`")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("info", help="details of one model")
    p.add_argument("id", metavar="ID", help="an id from `wslm models list` or a cached repo id")
    p.add_argument("--context", type=_positive, metavar="N", help="context length for the memory estimate")
    _estimate_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)


def _estimate_flags(p: argparse.ArgumentParser) -> None:
    """The `wslm serve` flags that change how much memory its KV cache takes, named and read as serve
    reads them, so the estimate is for the server those flags start."""
    from wslm.backend.config import KV_CACHE_DTYPES

    p.add_argument(
        "--speculative-config", metavar="JSON", default=None,
        help="serve's --speculative-config: a draft model it names counts in the estimate (its weights, and its "
             "keys and values in every block of the KV pool)",
    )

    p.add_argument(
        "--kv-cache-dtype", choices=(*KV_CACHE_DTYPES, "fp8_e5m2"), default="auto",
        help="the KV cache's dtype for the memory estimate (fp8: one byte per value; default auto: the compute dtype)",
    )
    p.add_argument(
        "--kv-cache-memory", "--kv-cache-memory-bytes", type=_size, metavar="SIZE", default=None,
        help="the KV pool's size for the memory estimate, like 4GiB or 512MiB (default: what serve reserves itself)",
    )
    p.add_argument(
        "--max-num-seqs", type=_positive, metavar="N", default=None,
        help="sequences in one batch, for the memory estimate: the default KV pool holds this many full-length "
             "ones within its cap (default: serve's, 128)",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _size(text: str) -> int:
    """--kv-cache-memory as `wslm serve` reads it (launcher.parse_size): bytes, or binary units."""
    from wslm.backend.platforms.cpu.kv_sizing import parse_bytes

    try:
        value = parse_bytes(text)
    except (ValueError, KeyError):
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a size like 4GiB, 512MiB or a number of bytes, got {text!r}")
    return value


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _print_json(obj: Any) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (GUI closed): nothing left to tell
        pass


def _json_error(message: str, code: str) -> None:
    _print_json({"error": {"message": message, "code": code}})


def human_size(n: float | None) -> str:
    """Binary units, named as such (MiB, GiB), as the GUI writes them (wslm.gui.format.human_bytes)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


# --- list / info -------------------------------------------------------------------------------------


def cmd_search(args: argparse.Namespace) -> int:
    import os

    from wslm.backend.hub.search import search_models

    try:
        found = search_models(args.query, args.endpoint, args.limit, os.environ.get("HF_TOKEN"))
    except Exception as exc:  # noqa: BLE001 - network and HTTP errors become one message
        msg = f"Hub search failed ({type(exc).__name__}: {exc}). Check the network, or set a mirror endpoint."
        print(json.dumps({"event": "error", "message": msg}) if args.json else f"error: {msg}", file=sys.stdout
              if args.json else sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"models": found}))
    else:
        for m in found:
            print(f"{m['id']}  ({len(m['files'])} files, {human_size(m['total_bytes'])})")
    return 0


def _estimate_kwargs(args: argparse.Namespace) -> dict:
    """The serve flags _estimate_flags added, as list_models / find_model take them."""
    return dict(kv_cache_dtype=args.kv_cache_dtype, kv_cache_memory=args.kv_cache_memory,
                max_num_seqs=args.max_num_seqs, speculative_config=args.speculative_config)  # fmt: skip


def _error(args: argparse.Namespace, message: str, code: str, rc: int = EXIT_ERROR) -> int:
    """A refused command: a JSON error line with --json, else the message on stderr; returns rc."""
    if args.json:
        _json_error(message, code)
    else:
        print(message, file=sys.stderr)
    return rc


def cmd_list(args: argparse.Namespace) -> int:
    from wslm.backend.hub.catalog import list_models, resume_hint

    try:
        everything = list_models(context=args.context, include_partial=True, **_estimate_kwargs(args))
    except ValueError as exc:  # a speculative config serve would refuse, or a draft that is not here
        return _error(args, str(exc), "invalid_argument")
    models = [m for m in everything if m.complete or args.all]
    if args.json:
        _print_json({"models": [m.to_dict() for m in models]})
        return EXIT_OK
    unfinished = [m for m in everything if not m.complete and not args.all]
    if not models:
        print("No models yet. Download one with: wslm models pull HuggingFaceTB/SmolLM2-360M-Instruct")
        return EXIT_OK
    rows = [("ID", "FORMAT", "ARCH", "PARAMS", "QUANT", "SIZE", "CONTEXT", "MEMORY*", "STATUS")]
    for m in models:
        status = "ok" if m.supported else ("partial" if not m.complete else "unsupported")
        rows.append((
            m.id, m.format, (m.architecture or "-").removesuffix("ForCausalLM") + ("+vision" if m.mmproj else ""),
            human_count(m.num_params),
            m.quantization or m.dtype or "-", human_size(m.size_bytes), str(m.context_length or "-"),
            human_size(m.memory_estimate_bytes), status,
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    at = f"{args.context} tokens" if args.context else "each model's own context"
    kv = f", {human_size(args.kv_cache_memory)} of it" if args.kv_cache_memory else ""
    kv += f", {args.kv_cache_dtype}" if args.kv_cache_dtype != "auto" else ""
    draft = next((m.draft_model for m in models if m.draft_model), None)
    kv += f", with draft model {draft} beside each" if draft else ""
    print(f"\n* memory: weights + the KV cache `wslm serve` reserves at {at}{kv} + overhead (--context N, "
          "--kv-cache-dtype, --kv-cache-memory, --max-num-seqs to change)")
    for m in models:
        if not m.supported and m.unsupported_reason:
            print(f"  {m.id}: {m.unsupported_reason}")
    for m in unfinished:
        hint = resume_hint(m.pull, m.repo_id or m.id)
        print(f"Unfinished download: {m.id} ({human_size(m.partial_bytes)} so far); resume with: {hint}")
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from wslm.backend.hub.catalog import find_model, resume_hint

    try:
        info = find_model(args.id, context=args.context, **_estimate_kwargs(args))
    except ValueError as exc:  # a speculative config serve would refuse, or a draft that is not here
        return _error(args, str(exc), "invalid_argument")
    if info is None:
        msg = f"No model {args.id!r} on this machine. See `wslm models list`, or download it: wslm models pull {args.id}"
        return _error(args, msg, "not_found")
    if args.json:
        _print_json(info.to_dict())
        return EXIT_OK
    d = info.to_dict()
    labels = [
        ("id", "ID"), ("path", "Path"), ("source", "Source"), ("format", "Format"), ("architecture", "Architecture"),
        ("name", "Name"), ("revision", "Revision"),
    ]  # fmt: skip
    for key, label in labels:
        if d.get(key):
            print(f"{label + ':':16}{d[key]}")
    print(f"{'Parameters:':16}{human_count(info.num_params)} ({info.num_params or '?'})")
    print(f"{'Weights:':16}{info.quantization or info.dtype or '-'}, {human_size(info.size_bytes)} on disk")
    print(f"{'Context:':16}{info.context_length or '-'} tokens")
    if info.kv_bytes_per_token:
        fp8 = f" ({args.kv_cache_dtype})" if args.kv_cache_dtype != "auto" else ""
        print(f"{'KV cache:':16}{human_size(info.kv_bytes_per_token)} per token{fp8}")
    if info.memory_estimate_bytes:
        print(f"{'Memory:':16}needs about {human_size(info.memory_estimate_bytes)} at {info.estimate_context} "
              f"tokens (weights {human_size(info.weights_memory_bytes)}, KV {human_size(info.kv_cache_bytes)}, "
              f"runtime {human_size(info.runtime_memory_bytes)})")  # fmt: skip
    if info.draft_model:
        print(f"{'Draft model:':16}{info.draft_model}: weights {human_size(info.draft_weights_memory_bytes)}, KV "
              f"{human_size(info.draft_kv_bytes_per_token)} per token (counted in the pool's blocks)")
    if info.kv_cache_blocks:
        print(f"{'KV pool:':16}{human_size(info.kv_cache_bytes)} ({info.kv_cache_bytes} bytes, {info.kv_cache_blocks} "
              f"blocks), sized by {info.kv_cache_sized_by} for {info.estimate_max_num_seqs} sequences; maximum "
              f"concurrency for {info.estimate_context} tokens per request: {info.kv_cache_max_concurrency:.2f}x")
    print(f"{'Chat template:':16}{'yes' if info.has_chat_template else 'no'}")
    print(f"{'Supported:':16}{'yes' if info.supported else 'no: ' + str(info.unsupported_reason)}")
    if info.partial_bytes:
        hint = resume_hint(info.pull, info.repo_id or info.id)
        print(f"{'Unfinished:':16}{human_size(info.partial_bytes)} downloaded; resume with: {hint}")
    if info.files:
        print("Files:")
        for f in info.files[:50]:
            print(f"  {f}")
        if len(info.files) > 50:
            print(f"  ... {len(info.files) - 50} more")
    return EXIT_OK


# --- rm ----------------------------------------------------------------------------------------------


def cmd_rm(args: argparse.Namespace) -> int:
    from wslm.backend.hub.catalog import RemoveError, find_model, remove_model

    info = find_model(args.id)
    if info is None:
        return _error(
            args, f"No model {args.id!r} on this machine. See `wslm models list` for the ids.", "not_found"
        )
    if not args.yes:
        if not sys.stdin.isatty():
            return _error(
                args, f"Not removing {info.id} without confirmation: pass --yes.", "usage", EXIT_USAGE
            )
        answer = input(
            f"Delete {info.id} ({human_size(info.size_bytes + info.partial_bytes)}) at {info.path}? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing removed.")
            return EXIT_OK
    try:
        removed, freed = remove_model(info.id)
    except RemoveError as exc:
        return _error(args, str(exc), "not_removable")
    except OSError as exc:
        return _error(
            args, f"Could not delete {info.path}: {exc}. Check the permissions of that folder.", "disk"
        )
    if args.json:
        _print_json({"removed": removed.id, "path": removed.path, "freed_bytes": freed})
    else:
        print(f"Removed {removed.id} ({human_size(freed)} freed).")
    return EXIT_OK


# --- pull --------------------------------------------------------------------------------------------


class _HumanPullOutput:
    """A progress line on stderr for terminals; plain lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.width = 0

    def __call__(self, e: dict) -> None:
        kind = e["event"]
        if kind == "start":
            total = human_size(e["total_bytes"])
            commit = (e.get("commit") or "")[:7]
            print(f"Pulling {e['repo']} ({e['revision']} @ {commit}): {len(e['files'])} files, {total}")
            if e.get("resumed_bytes") and e["resumed_bytes"] >= e["total_bytes"]:
                print("  already downloaded")
            elif e.get("resumed_bytes"):
                print(f"  resuming: {human_size(e['resumed_bytes'])} already here")
            if e.get("note"):
                print(f"  {e['note']}")
            sys.stdout.flush()
        elif kind == "progress" and self.tty:
            pct = 100 * e["bytes"] / e["total_bytes"] if e["total_bytes"] else 0
            eta = f"  ETA {_eta(e['eta_s'])}" if e.get("eta_s") is not None else ""
            line = (f"  {e['file'][-40:]}  {pct:5.1f}%  {human_size(e['bytes'])}/{human_size(e['total_bytes'])}"
                    f"  {human_size(e['speed_bps'])}/s{eta}")  # fmt: skip
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
            sys.stderr.flush()
        elif kind == "file_done":
            self._clear()
            print(f"  done: {e['file']}", flush=True)
        elif kind == "done":
            self._clear()
            print(f"Done: {e['id']}\n  {e['path']}\n  Run it: wslm serve --model {e['id']}")
        elif kind == "error":
            self._clear()
            print(f"Error: {e['message']}", file=sys.stderr)
        elif kind == "cancelled":
            self._clear()
            print("Cancelled. Run the same command again to resume.", file=sys.stderr)

    def _clear(self) -> None:
        if self.tty and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            self.width = 0


def _eta(seconds: float) -> str:
    s = int(seconds)
    return (
        f"{s // 3600}h{s % 3600 // 60:02d}m"
        if s >= 3600
        else f"{s // 60}m{s % 60:02d}s"
        if s >= 60
        else f"{s}s"
    )


def cmd_pull(args: argparse.Namespace) -> int:
    from wslm.backend.hub.download import Cancelled, Puller, PullError

    emit = _print_json if args.json else _HumanPullOutput()
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request is noise here

    def on_signal(signum, frame):  # noqa: ARG001
        # Ignore repeats while cleaning up; raising interrupts even a blocking socket read.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Cancelled()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        puller = Puller(args.repo, patterns=args.file, revision=args.revision, endpoint=args.endpoint,
                        on_event=emit, retries=max(args.retries, 0))  # fmt: skip
        emit(puller.run())
        return EXIT_OK
    except Cancelled:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        emit({"event": "cancelled"})
        return EXIT_CANCELLED
    except PullError as exc:
        emit({"event": "error", "message": str(exc), "code": exc.code})
        return EXIT_USAGE if exc.code == "usage" else EXIT_ERROR
    except OSError as exc:
        emit(
            {
                "event": "error",
                "message": f"{exc}. Nothing downloaded is lost; fix it and run again.",
                "code": "disk",
            }
        )
        return EXIT_ERROR
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
