"""A model's tokenizer built in a short-lived forked process and sent back pickled, once the server is serving
(a --model-pool model loaded on request): building one holds the GIL for over a second on a busy 2-core
machine (transformers decodes tokenizer.json in Python, then the tokenizers library parses it in Rust, neither
letting go), and meanwhile the event loop and every other model's engine thread wait: in
bench/pool_load_stall.py the first stream of a loaded model during another model's load got its first token
0.8-1.6 s late. Unpickling the built tokenizer holds the GIL for about a third of that.

At start-up nothing else is served, and transformers' tokenizer modules are not imported yet (the parent would
import them again to unpickle): the tokenizer is built in place then (the launcher calls serving() once ready).
Any failure aside (a tokenizer that does not pickle, a process that cannot fork) builds it in place, so the
user sees the same error as without this."""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import sys
from typing import Any

log = logging.getLogger("wslm.engine")

_serving = False


def serving() -> None:
    """The server answers requests from now on: later tokenizers are built aside."""
    global _serving
    _serving = True


def load_tokenizer(source: Any, tokenizer: str | None = None, trust_remote_code: bool = False) -> Any:
    from wslm.backend.loader.model_loader import load_tokenizer as build

    if not _serving or not sys.platform.startswith("linux"):
        return build(source, tokenizer, trust_remote_code)
    try:
        built = _build_aside(source, tokenizer, trust_remote_code)
    except Exception:  # noqa: BLE001 - any trouble aside: build it here (its error is the user's)
        log.debug("Building the tokenizer in a helper process failed; building it here", exc_info=True)
        built = None
    return built if built is not None else build(source, tokenizer, trust_remote_code)


def _build_aside(source: Any, tokenizer: str | None, trust_remote_code: bool) -> Any:
    ctx = mp.get_context("fork")  # the child needs nothing from torch: fork is safe after a model ran here
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(writer, source, tokenizer, trust_remote_code), daemon=True,
                       name="wslm-tokenizer")
    proc.start()
    writer.close()
    try:
        payload = reader.recv_bytes()  # waits with the GIL released
    except EOFError:
        return None
    finally:
        reader.close()
        proc.join(10)
    return pickle.loads(payload) if payload else None


def _child(writer, source: Any, tokenizer: str | None, trust_remote_code: bool) -> None:
    import os

    from wslm.backend.loader.model_loader import load_tokenizer as build

    try:
        payload = pickle.dumps(build(source, tokenizer, trust_remote_code), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - the parent builds it itself and reports the error
        payload = b""
    try:
        writer.send_bytes(payload)
    finally:
        os._exit(0)
