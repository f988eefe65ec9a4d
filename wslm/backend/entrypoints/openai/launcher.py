"""Start `wslm serve`: bind the port, load the model, run uvicorn, and report progress as JSON lines on
stdout for the GUI ({"event": "loading" | "load_progress" | "ready" | "error", ...}). Everything else (logs, library chatter)
goes to stderr, so stdout stays machine-readable.

Shutdown: SIGTERM/SIGINT stop new requests; running ones get --shutdown-timeout seconds to finish, then are
aborted, and their streams still end cleanly (a finish chunk and `data: [DONE]`). A signalled exit is 0."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
from argparse import Namespace
from typing import Any, TextIO

from wslm import envs
from wslm.backend.entrypoints.cli import engine_flags
from wslm.backend.entrypoints.openai import vllm_flags
from wslm.backend.frontend.chat import read_template

log = logging.getLogger("wslm.server")

_events: TextIO | None = None


def emit(event: str, **fields: Any) -> None:
    """One JSON line on the real stdout, flushed at once (the GUI reads line by line)."""
    stream = _events or sys.stdout
    try:
        stream.write(json.dumps({"event": event, **fields}) + "\n")
        stream.flush()
    except (OSError, ValueError):  # the reader (GUI) went away: keep serving, just log it
        log.warning("could not write the %s event to stdout", event)


def _claim_stdout() -> None:
    """Keep fd 1 for our JSON lines only: anything else that prints (libraries, C code) goes to stderr."""
    global _events
    if _events is not None:
        return
    try:
        sys.stdout.flush()
        _events = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    except OSError:  # no real fds (embedded use): print where we can
        _events = sys.stdout


class StartupError(Exception):
    """A failure before the server listens, with the message the user sees."""


def parse_size(text: str | None) -> int | None:
    """Bytes from "4GiB", "512M", "1.5g" or a plain number, read as the engine reads sizes (binary units)."""
    if text is None or str(text).strip() == "":
        return None
    from wslm.backend.platforms.cpu.kv_sizing import parse_bytes

    try:
        value = parse_bytes(str(text))
    except (ValueError, KeyError):
        value = 0
    if value <= 0:
        raise StartupError(f"--kv-cache-memory must be a size like 4GiB, 512MiB or a number of bytes, got {text!r}.")
    return value


def parse_model_len(text: str | None) -> int | None:
    """An int, or vLLM's shorthand: 4k = 4000, 4K = 4096."""
    if text is None:
        return None
    s = str(text).strip()
    try:
        if s.endswith("k"):
            return int(float(s[:-1]) * 1000)
        if s.endswith("K"):
            return int(float(s[:-1]) * 1024)
        return int(s)
    except ValueError:
        raise StartupError(f"--max-model-len must be a number of tokens like 2048 or 4k, got {text!r}.") from None


def engine_config(args: Namespace):
    from wslm.backend.config import EngineConfig

    try:
        read_template(args.chat_template)  # the engine's own reading of it: a missing file fails fast here
    except FileNotFoundError as exc:
        raise StartupError(f"--chat-template: no such file {args.chat_template!r}. Pass a path to a Jinja file "
                           "or the template text itself.") from exc
    kwargs = engine_flags.given(args)  # by field name: every engine flag is an EngineConfig field
    for name, parse in (("max_model_len", parse_model_len), ("kv_cache_memory", parse_size)):
        if name in kwargs:
            kwargs[name] = parse(kwargs[name])
    kwargs["task"] = _task(args)
    try:
        from wslm.backend.spec_decode.config import fold_legacy_flags

        spec = fold_legacy_flags(kwargs.get("speculative_config"), getattr(args, "speculative_model", None),
                                 getattr(args, "num_speculative_tokens", None),
                                 getattr(args, "ngram_prompt_lookup_max", None),
                                 getattr(args, "ngram_prompt_lookup_min", None))
        if spec is not None:
            kwargs["speculative_config"] = spec
        return EngineConfig(**kwargs)
    except ValueError as exc:
        raise StartupError(str(exc)) from exc


def _task(args: Namespace) -> str:
    """--task, or vLLM's newer --runner (pooling: embed, or score for a cross-encoder)."""
    runner = getattr(args, "runner", None)
    if runner in ("generate", "pooling"):
        return runner
    task = getattr(args, "task", "auto") or "auto"
    return "embed" if task == "embedding" else task


def bind(host: str, port: int) -> socket.socket:
    """Bind (not listen yet: clients are refused, not left hanging, while the model loads)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"Port {port} on {host} is already in use (is another `wslm serve` or another program using it?). "
                f"Stop that program, or pick another port with --port, e.g. --port {port + 1 if port else 8001}."
            ) from exc
        if exc.errno == errno.EACCES:
            raise StartupError(f"No permission to listen on port {port}: ports below 1024 need root. "
                               "Pick another with --port, e.g. --port 8000.") from exc
        if exc.errno in (errno.EADDRNOTAVAIL, getattr(errno, "EAI_NONAME", -2)):
            raise StartupError(f"Cannot listen on {host}: it is not an address of this machine. "
                               "Use --host 127.0.0.1 (this machine) or --host 0.0.0.0 (all interfaces).") from exc
        raise StartupError(f"Cannot listen on {host}:{port}: {exc}. Pick another with --host/--port.") from exc
    except (socket.gaierror, UnicodeError) as exc:
        sock.close()
        raise StartupError(f"--host {host!r} is not a valid address ({exc}). Use e.g. --host 127.0.0.1.") from exc
    sock.set_inheritable(True)
    return sock


def _progress_event(report: dict) -> None:
    emit("load_progress", **report)


def load_engine(config: Any):
    """The engine, its weights' load progress reported as {"event": "load_progress", "percent", "bytes",
    "total_bytes", "mb_per_s", "elapsed_s", "model"} lines on stdout (loader/load_progress.py) meanwhile."""
    from wslm.backend.frontend.engine_factory import create_engine
    from wslm.backend.loader import load_progress

    load_progress.add_listener(_progress_event)
    try:
        return create_engine(config, core_process=envs.WSLM_CORE_PROCESS)
    except (ValueError, FileNotFoundError) as exc:
        raise StartupError(str(exc)) from exc
    except MemoryError as exc:
        raise StartupError(f"Out of memory while loading {config.model!r}. Try a smaller --max-model-len or "
                           "--kv-cache-memory, or a smaller model.") from exc
    except Exception as exc:  # noqa: BLE001 - any load failure must reach the GUI as a message
        log.exception("loading the model failed")
        raise StartupError(f"Could not load the model {config.model!r}: {type(exc).__name__}: {exc}") from exc
    finally:
        load_progress.remove_listener(_progress_event)


def _log_config(level: str) -> dict:
    from uvicorn.config import LOGGING_CONFIG

    cfg = json.loads(json.dumps(LOGGING_CONFIG))
    for handler in cfg["handlers"].values():
        handler["stream"] = "ext://sys.stderr"  # uvicorn sends access lines to stdout by default
    return cfg


_COMPILER_LOGGERS = ("torch._inductor", "torch._dynamo")


class _CompilerNoise(logging.Filter):
    """torch's compiler logs each autotuning choice that does not build (up to ~1,200 "C++ compile error"
    lines at ERROR) and then uses another choice: nothing the user must act on. Its records are kept at
    debug level; the first error is mentioned in one line. A compile that fails as a whole is logged by the
    engine (decode keeps running eagerly)."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug
        self.told = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_COMPILER_LOGGERS):
            return True
        if self.debug:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return True
        if record.levelno >= logging.ERROR and not self.told:
            self.told = True
            log.info("torch's compiler reported errors while compiling (e.g. autotuning candidates that do not "
                     "build; others are used): they are logged at debug level only (--uvicorn-log-level debug).")
        return False


def quiet_compiler_logs(debug: bool) -> _CompilerNoise:
    """Put _CompilerNoise on every handler that torch's compiler records reach: torch's own (its loggers do
    not propagate) and the root's."""
    import torch  # noqa: F401 - its import installs the handlers filtered here

    noise = _CompilerNoise(debug)
    loggers = [logging.getLogger()]
    for name in list(logging.root.manager.loggerDict):
        if name == "torch" or name.startswith(_COMPILER_LOGGERS):
            loggers.append(logging.getLogger(name))
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, _CompilerNoise) for f in handler.filters):
                handler.addFilter(noise)
    return noise


def run(args: Namespace) -> int:
    _claim_stdout()
    emit("loading", model=args.model, pid=os.getpid())  # the pid: a GUI can stop us while we load
    sock = None
    try:
        try:
            import uvicorn  # noqa: F401

            from wslm.backend.entrypoints.openai.app import build_app  # noqa: F401 - fail early if fastapi is missing
        except ImportError as exc:
            raise StartupError(f"The server needs FastAPI and uvicorn ({exc}). Install them with: "
                               "pip install 'wslm[backend]'") from exc
        if not 0 <= args.port <= 65535:
            raise StartupError(f"--port must be in 0..65535, got {args.port}.")
        if args.shutdown_timeout < 0:
            raise StartupError(f"--shutdown-timeout must not be negative, got {args.shutdown_timeout}.")
        check_limit_flags(args)
        check_parallel_flags(args)
        check_model_pool_flags(args)
        check_lora_flags(args)
        check_ssl_flags(args)
        use_hf_token(args)
        vllm_flags.log_no_effect(args)
        generation_defaults = load_generation_defaults(args)
        config = engine_config(args)
        sock = bind(args.host, args.port)
        quiet_compiler_logs(getattr(args, "uvicorn_log_level", "info") in ("debug", "trace")
                            or log.isEnabledFor(logging.DEBUG))
        engine = load_engine(pool_engine_config(config, args))
        check_lora_tensors(args, engine)
    except StartupError as exc:
        if sock is not None:
            sock.close()
        emit("error", message=str(exc))
        return 1
    args.generation_defaults = generation_defaults
    return _serve(args, engine, sock)


def load_generation_defaults(args: Namespace) -> dict:
    """--generation-config / --override-generation-config, read before the (slow) model load."""
    from wslm.backend.entrypoints.openai import generation_config

    try:
        return generation_config.default_sampling(args)
    except ValueError as exc:
        raise StartupError(str(exc)) from exc


def request_limits(args: Namespace, engine: Any):
    """The engine's per-request limits with the server's stop-list flags; the engine checks with the same."""
    import dataclasses

    limits = getattr(engine, "limits", None)
    if limits is None:
        return None
    changes = {k: v for k in ("max_stop_strings", "max_stop_string_length") if (v := getattr(args, k, None)) is not None}
    engine.limits = dataclasses.replace(limits, **changes)
    return engine.limits


def check_parallel_flags(args: Namespace) -> None:
    """vLLM's pipeline and data parallelism: accepted at 1 (launch scripts often spell it out), refused above."""
    if getattr(args, "pipeline_parallel_size", 1) != 1:
        raise StartupError(f"--pipeline-parallel-size {args.pipeline_parallel_size} is not supported: wslm splits a "
                           "model over GPUs with tensor parallelism. Use --tensor-parallel-size instead.")
    if getattr(args, "data_parallel_size", 1) != 1:
        raise StartupError(f"--data-parallel-size {args.data_parallel_size} is not supported: start one `wslm serve` "
                           "per replica (each on its own --port) behind a load balancer.")


def check_ssl_flags(args: Namespace) -> None:
    """--ssl-keyfile/--ssl-certfile (vLLM's, passed to uvicorn): both or neither, and loadable, so that a bad
    file is a start-up error naming it instead of a server that never answers."""
    import ssl

    key, cert, ca = (getattr(args, k, None) for k in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"))
    if not key and not cert:
        if ca or getattr(args, "ssl_cert_reqs", 0):
            raise StartupError("--ssl-ca-certs and --ssl-cert-reqs need HTTPS: pass --ssl-keyfile and --ssl-certfile.")
        return
    if not (key and cert):
        raise StartupError("HTTPS needs both --ssl-keyfile (the private key) and --ssl-certfile (the certificate), "
                           "as PEM files.")
    for flag, path in (("--ssl-keyfile", key), ("--ssl-certfile", cert), ("--ssl-ca-certs", ca)):
        if path and not os.path.isfile(path):
            raise StartupError(f"{flag}: no such file {path!r}.")
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        if ca:
            context.load_verify_locations(ca)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise StartupError(f"Cannot use --ssl-certfile {cert!r} with --ssl-keyfile {key!r}: {exc}. Pass a PEM "
                           "certificate and the unencrypted private key that belongs to it.") from exc


def use_hf_token(args: Namespace) -> None:
    """--hf-token TOKEN: the hub calls of this process (tokenizer or config by repo id) use it; a bare
    --hf-token means the token `huggingface-cli login` stored, which huggingface_hub reads anyway."""
    token = getattr(args, "hf_token", None)
    if isinstance(token, str) and token.strip():
        os.environ["HF_TOKEN"] = token.strip()
    args.hf_token = None  # never kept where a log or an error report could show it


def check_limit_flags(args: Namespace) -> None:
    from wslm.backend.entrypoints.openai.security import parse_list

    try:
        args.allowed_origins_list = parse_list(getattr(args, "allowed_origins", None), "--allowed-origins")
        args.allowed_hosts_list = parse_list(getattr(args, "allowed_hosts", None), "--allowed-hosts")
        args.cors_methods = parse_list(getattr(args, "allowed_methods", None), "--allowed-methods") or ["*"]
        args.cors_headers = parse_list(getattr(args, "allowed_headers", None), "--allowed-headers") or ["*"]
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    for flag in ("max_request_body_bytes", "max_json_depth", "max_stop_strings", "max_stop_string_length",
                 "max_header_count", "max_header_bytes"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise StartupError(f"--{flag.replace('_', '-')} must be at least 1, got {value}.")
    timeout = getattr(args, "request_head_timeout", None)
    if timeout is not None and not 0 < timeout < float("inf"):
        raise StartupError(f"--request-head-timeout must be a positive number of seconds, got {timeout}.")


def http_limits_from(args: Namespace):
    from wslm.backend.entrypoints.openai.http_limits import HTTPLimits

    names = ("max_request_body_bytes", "max_json_depth", "max_header_count", "max_header_bytes",
             "request_head_timeout")
    return HTTPLimits(**{k: v for k in names if (v := getattr(args, k, None)) is not None})


def _serve(args: Namespace, engine: Any, sock: socket.socket) -> int:
    import uvicorn

    from wslm.backend.entrypoints.openai import security
    from wslm.backend.entrypoints.openai.app import build_app
    from wslm.backend.entrypoints.openai.http_protocol import h11_max_incomplete_event_size, protocol_class
    from wslm.backend.entrypoints.openai.parser_choice import choose_parsers
    from wslm.backend.entrypoints.openai.serving_base import ServerState
    from wslm.backend.frontend import tokenizer_aside
    from wslm.backend.frontend.async_engine import AsyncEngine
    from wslm.backend.frontend.chat import template_text
    from wslm.backend.frontend.metrics import ServerMetrics

    names = list(args.served_model_name or [args.model])
    metrics = ServerMetrics(names[0])
    api_key = args.api_key or envs.WSLM_API_KEY or envs.VLLM_API_KEY
    model_name = str(getattr(engine, "model_name", "") or args.model)
    defaults = getattr(args, "generation_defaults", None) or {}
    if defaults:
        log.info("Default sampling parameters from the model's generation config (--generation-config %s; "
                 "a request's own values win): %s", getattr(args, "generation_config", "auto"), defaults)
    template = getattr(engine, "chat_template", None) or getattr(engine.tokenizer, "chat_template", None)
    parsers = choose_parsers(args, template_text(template))  # a dict of named templates: all of them
    state = ServerState(
        engine=AsyncEngine(engine, metrics, log_requests=bool(getattr(args, "log_requests", False))),
        tokenizer=engine.tokenizer,
        served_model_names=names,
        max_model_len=int(engine.model_config.max_model_len),
        model_path=model_name,
        api_key=api_key,
        metrics=metrics,
        aliases={model_name, args.model} - set(names),
        vocab_size=getattr(engine.model_config, "vocab_size", None),
        limits=request_limits(args, engine),
        allowed_origins=args.allowed_origins_list,
        allowed_hosts=args.allowed_hosts_list,
        cors=(args.cors_methods, args.cors_headers, bool(getattr(args, "allow_credentials", False))),
        bound_host=sock.getsockname()[0],
        enable_prompt_tokens_details=bool(getattr(args, "enable_prompt_tokens_details", False)),
        enable_force_include_usage=bool(getattr(args, "enable_force_include_usage", False)),
        enable_per_request_metrics=bool(getattr(args, "enable_per_request_metrics", False)),
        enable_server_load_tracking=bool(getattr(args, "enable_server_load_tracking", False)),
        enable_tokenizer_info_endpoint=bool(getattr(args, "enable_tokenizer_info_endpoint", False)),
        return_tokens_as_token_ids=bool(getattr(args, "return_tokens_as_token_ids", False)),
        default_sampling=defaults,
        task=getattr(engine, "task", "generate"),
        chat_template=getattr(engine, "chat_template", None),
        **parsers,
        http_limits=http_limits_from(args),
        response_role=getattr(args, "response_role", None) or "assistant",
        max_stored_responses=getattr(args, "max_stored_responses", 1000),
        guard_utility_endpoints=bool(api_key) and not security.is_loopback(sock.getsockname()[0])
        and not getattr(args, "public_utility_endpoints", False),
    )
    state.model_pool = make_model_pool(args, state)  # None without --model-pool
    state.engine.restarter = core_restarter(args, engine, state)  # its core starts again if it dies
    state.lora = make_lora_registry(args, state)  # None without --enable-lora
    app = build_app(state, root_path=getattr(args, "root_path", None) or "",
                    docs=not getattr(args, "disable_fastapi_docs", False))
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    tls = bool(getattr(args, "ssl_certfile", None))
    url = f"{'https' if tls else 'http'}://{shown_host}:{port}"

    warning = security.exposure_warning(host, api_key)

    def on_ready() -> None:
        log.info("wslm serving %s at %s/v1%s", names[0], url, " (API key required)" if api_key else "")
        if warning:
            log.warning("%s\n%s\n%s", "!" * 100, "WARNING: " + warning, "!" * 100)
        extra = {"warning": warning} if warning else {}
        tokenizer_aside.serving()  # models loaded from now on build their tokenizer off the GIL
        emit("ready", url=url, host=host, port=port, model=names[0], pid=os.getpid(),
             max_model_len=state.max_model_len, api_key_required=bool(api_key), task=state.task, **extra)
        start_background_compile(engine)

    def on_signal() -> None:
        state.engine.begin_drain(args.shutdown_timeout)
        if state.model_pool is not None:
            state.model_pool.begin_drain(args.shutdown_timeout)

    config = uvicorn.Config(
        app,
        log_config=_log_config(args.uvicorn_log_level),
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=int(args.shutdown_timeout) + 15,
        timeout_keep_alive=5,
        # h11 always (httptools has no hook for the head limits and timeout): uvicorn's, with those guards.
        http=protocol_class(state.http_limits),
        h11_max_incomplete_event_size=h11_max_incomplete_event_size(state.http_limits),
        access_log=not getattr(args, "disable_uvicorn_access_log", False),
        # vLLM's TLS flags, as vLLM passes them to uvicorn (check_ssl_flags checked the files).
        ssl_keyfile=getattr(args, "ssl_keyfile", None),
        ssl_certfile=getattr(args, "ssl_certfile", None),
        ssl_ca_certs=getattr(args, "ssl_ca_certs", None),
        ssl_cert_reqs=int(getattr(args, "ssl_cert_reqs", 0) or 0),
    )
    server = _Server(config, on_ready, on_signal)
    died: list[str] = []

    def on_death(why: str) -> None:
        # /health already answers 503; stop listening and exit non-zero so that whoever runs us (the GUI's
        # auto-restart, systemd, a script) sees it, instead of a server that takes requests it cannot serve.
        died.append(why)
        log.error("The engine stopped (%s): the server exits.", why)
        emit("error", message=f"The engine stopped ({why}); the server exited. Restart it; its log (stderr) "
                              "has the details.")
        state.engine.draining = True
        server.should_exit = True

    state.engine.on_death = on_death
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn exits this way when the app fails its start-up
        server.started = False
    if not server.started:
        emit("error", message="The HTTP server could not start; see the log above (stderr).")
        return 1
    return 1 if died else 0


# --- --model-pool: more models behind the port, loaded on request (model_pool.py) ---------------------------

# Flags that describe the --model model and not the others: a pool model uses its own files' values.
_MODEL_SPECIFIC = ("tokenizer", "chat_template", "revision", "quantization", "max_model_len", "served_model_name",
                   "tool_call_parser", "reasoning_parser", "task", "runner", "num_gpu_blocks_override", "lora_path",
                   "enable_lora")


def check_model_pool_flags(args: Namespace) -> None:
    """--model-pool, --max-loaded-models, --model-ttl, --model-load-timeout: checked before the slow load,
    each pool model found on disk (a typo is a start-up error, not a 500 on the first request)."""
    from wslm.backend.entrypoints.openai.model_pool import parse_keep_alive, parse_pool_spec
    from wslm.backend.loader.model_source import resolve_model

    specs = getattr(args, "model_pool", None) or []
    try:
        args.model_ttl_seconds = parse_keep_alive(getattr(args, "model_ttl", "300"), "--model-ttl")
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    timeout = getattr(args, "model_load_timeout", 600.0)
    if not 0 < timeout < float("inf"):
        raise StartupError(f"--model-load-timeout must be a positive number of seconds, got {timeout}.")
    args.model_pool_all = "all" in specs
    args.model_pool_specs = []
    if not specs:
        return
    if getattr(args, "max_loaded_models", 2) < 2:
        raise StartupError(f"--max-loaded-models must be at least 2 with --model-pool (the --model model stays "
                           f"loaded, and one more is loaded on request), got {args.max_loaded_models}.")
    names: set[str] = set()
    for spec in specs:
        if spec == "all":
            continue
        name, model = parse_pool_spec(spec)
        if name in names:
            raise StartupError(f"--model-pool names `{name}` twice; give each model its own name (NAME=MODEL).")
        names.add(name)
        try:
            resolve_model(model)
        except FileNotFoundError as exc:
            raise StartupError(f"--model-pool {spec}: {exc}") from exc
        args.model_pool_specs.append((name, model))


def check_lora_flags(args: Namespace) -> None:
    """--lora-modules (implies --enable-lora): each adapter checked before the slow load (a folder with
    adapter_config.json and its weights, rank within --max-lora-rank, a name of its own); served per request
    over the one --model base (wslm/backend/lora). The base may be held quantized: it is never changed."""
    from wslm.backend.entrypoints.openai.serving_lora import parse_lora_module

    args.lora_specs = []  # (name, path, base model name) for make_lora_registry
    specs = getattr(args, "lora_modules", None) or []
    if specs:
        args.enable_lora = True
    if not getattr(args, "enable_lora", False):
        return
    if (getattr(args, "tensor_parallel_size", 1) or 1) > 1:
        raise StartupError("--enable-lora needs --tensor-parallel-size 1: adapters are served on one device.")
    from wslm.backend.loader.lora import check_adapter

    taken = {name for name, _ in args.model_pool_specs} | set(getattr(args, "served_model_name", None) or [args.model])
    for spec in specs:
        try:
            name, path, base = parse_lora_module(spec)
        except ValueError as exc:
            raise StartupError(f"{exc}") from None
        if name in taken:
            raise StartupError(f"--lora-modules: the name `{name}` is taken already; give each adapter its own.")
        try:
            check_adapter(path, getattr(args, "max_lora_rank", None) or 16)
        except (ValueError, OSError) as exc:
            raise StartupError(f"--lora-modules {name}: {exc}.") from exc
        taken.add(name)
        args.lora_specs.append((name, path, base))


def make_lora_registry(args: Namespace, state: Any) -> Any:
    """The server's LoRA adapters (serving_lora.LoraRegistry) with --enable-lora, else None."""
    if not getattr(args, "enable_lora", False):
        return None
    from wslm.backend.entrypoints.openai.serving_lora import LoraRegistry

    pool = state.model_pool.names() if state.model_pool is not None else []
    processor = getattr(getattr(state.engine, "engine", None), "processor", None)
    registry = LoraRegistry(state.model_name, getattr(args, "max_lora_rank", None) or 16,
                            set(state.served_model_names) | set(pool), getattr(processor, "lora_checker", None))
    for name, path, base in getattr(args, "lora_specs", []):
        registry.add(name, path, base)  # checked against the model already (check_lora_tensors)
    return registry


def check_lora_tensors(args: Namespace, engine: Any) -> None:
    """Each --lora-modules adapter's tensors against the loaded model (layer count, shapes), as a start-up
    error naming the adapter; the same check a request's adapter gets (lora/checks.py)."""
    from wslm.backend.lora.request import LoRARequest

    checker = getattr(getattr(engine, "processor", None), "lora_checker", None)
    for i, (name, path, _) in enumerate(getattr(args, "lora_specs", []) if checker is not None else []):
        try:
            checker(LoRARequest(name, 1_000_000 + i, path))  # an id no served adapter gets
        except ValueError as exc:
            raise StartupError(f"--lora-modules {name}: {exc}.") from exc


def local_models(exclude: str) -> list[tuple[str, str]]:
    """`--model-pool all`: every runnable model `wslm models list` shows, by its id, but the --model one."""
    from pathlib import Path

    from wslm.backend.hub.catalog import list_models
    from wslm.backend.loader.model_source import resolve_model

    try:
        source = resolve_model(exclude)
        skip = source.gguf_path or source.folder
    except FileNotFoundError:
        skip = None
    return [(m.id, m.id) for m in list_models() if m.supported and m.complete and Path(m.path) != skip]


def pool_engine_config(config: Any, args: Namespace) -> Any:
    """With --model-pool on a GPU, --gpu-memory-utilization is what all loaded models use together: each one
    takes an equal share, u / --max-loaded-models of the card (weights and KV cache), on top of what is in use
    when it loads (the engine's budget is u times the card minus all memory in use), never beyond u. On CPU
    each model's KV cache is --kv-cache-memory (or the default sized from the RAM free when it loads)."""
    if not getattr(args, "model_pool_specs", None) and not getattr(args, "model_pool_all", False):
        return config
    if config.num_gpu_blocks_override is not None or str(config.device) == "cpu":
        return config
    import torch

    if not torch.cuda.is_available():
        return config
    device = torch.device(config.device if str(config.device).startswith("cuda") else "cuda")
    free, total = torch.cuda.mem_get_info(device)
    share = config.gpu_memory_utilization / max(1, getattr(args, "max_loaded_models", 2))
    used = (total - free) / total
    util = min(config.gpu_memory_utilization, used + share)
    log.info("--model-pool: %s gets %.0f%% of the GPU (--gpu-memory-utilization %.2f shared by "
             "--max-loaded-models %d); %.0f%% was in use before it.", config.model, 100 * (util - used),
             config.gpu_memory_utilization, getattr(args, "max_loaded_models", 2), 100 * used)
    import dataclasses

    return dataclasses.replace(config, gpu_memory_utilization=util)


def pool_model_args(args: Namespace, model: str, name: str) -> Namespace:
    """The flags for a pool model: the server's, minus those that describe the --model model."""
    margs = Namespace(**vars(args))
    for key in _MODEL_SPECIFIC:
        if hasattr(margs, key):
            setattr(margs, key, None)
    margs.model, margs.served_model_name = model, [name]
    if getattr(margs, "generation_config", "auto") not in ("auto", "vllm"):
        margs.generation_config = "auto"  # a folder given for the --model model
    return margs


def make_model_pool(args: Namespace, default: Any) -> Any:
    """The ModelPool for --model-pool (None without it): its loader builds a pool model's ServerState the
    way _serve builds the default one, sharing the server-wide settings."""
    if not getattr(args, "model_pool_specs", None) and not getattr(args, "model_pool_all", False):
        return None
    import dataclasses

    from wslm.backend.entrypoints.openai.model_pool import ModelPool
    from wslm.backend.entrypoints.openai.parser_choice import choose_parsers
    from wslm.backend.frontend.async_engine import AsyncEngine
    from wslm.backend.frontend.chat import template_text
    from wslm.backend.frontend.metrics import ServerMetrics

    def load(model: str, name: str) -> Any:
        margs = pool_model_args(args, model, name)
        defaults = load_generation_defaults(margs)
        engine = load_engine(pool_engine_config(engine_config(margs), args))
        template = getattr(engine, "chat_template", None) or getattr(engine.tokenizer, "chat_template", None)
        metrics = ServerMetrics(name)
        state = dataclasses.replace(
            default,
            engine=AsyncEngine(engine, metrics, log_requests=bool(getattr(args, "log_requests", False))),
            tokenizer=engine.tokenizer,
            served_model_names=[name],
            max_model_len=int(engine.model_config.max_model_len),
            model_path=str(getattr(engine, "model_name", "") or model),
            metrics=metrics,
            aliases=set(),
            vocab_size=getattr(engine.model_config, "vocab_size", None),
            limits=request_limits(margs, engine),
            default_sampling=defaults,
            task=getattr(engine, "task", "generate"),
            chat_template=getattr(engine, "chat_template", None),
            **choose_parsers(margs, template_text(template)),
            server_load=0,
            model_pool=None,
        )
        if hasattr(default, "responses"):  # one /v1/responses store: GET /v1/responses/{id} finds any model's
            from wslm.backend.entrypoints.openai.serving_responses import store_of

            state.responses = store_of(default)
        start_background_compile(engine)
        return state

    specs = list(args.model_pool_specs)
    if args.model_pool_all:
        known = {name for name, _ in specs}
        specs += [(n, m) for n, m in local_models(args.model) if n not in known]
    pool = ModelPool(default, load, specs, max_loaded=args.max_loaded_models, ttl=args.model_ttl_seconds,
                     load_timeout=args.model_load_timeout,
                     refresh=(lambda: args.model_pool_specs + local_models(args.model)) if args.model_pool_all else None)
    log.info("--model-pool: %d more models servable on request (%s); at most %d loaded at once, unloaded after "
             "%s idle.", len(pool.entries), ", ".join(pool.entries) or "none yet",
             args.max_loaded_models, "never" if args.model_ttl_seconds is None else f"{args.model_ttl_seconds:g} s")
    return pool


def core_restarter(args: Namespace, engine: Any, state: Any) -> Any:
    """The --model model's core process starts again on the next request after it died, as a pooled model is
    reloaded (frontend/core_restart.py); None when its core runs in this process (WSLM_CORE_PROCESS=0): a
    death then still stops the server. The flags are read again, so that a GPU share is measured anew."""
    from wslm.backend.frontend.core_restart import CoreRestarter, restartable

    if not restartable(engine):
        return None
    import dataclasses

    def config_for() -> Any:  # the first core's flags, with the GPU share of a --model-pool measured now
        share = pool_engine_config(engine_config(args), args).gpu_memory_utilization
        return dataclasses.replace(engine.config, gpu_memory_utilization=share)

    pool = state.model_pool
    return CoreRestarter(engine, state.model_name, state.metrics, config_for=config_for,
                         lock=pool.load_lock if pool is not None else None)


def start_background_compile(engine: Any) -> None:
    """Once the server answers: start what the engine compiles in the background (the CPU decode step for
    batches), so that the first concurrent requests find it compiled (or compiling) instead of starting it.
    Never in the way of serving: a failure is logged and eager steps keep serving."""
    start = getattr(engine, "start_background_compile", None)
    if start is None:
        return
    try:
        start()
    except Exception:  # noqa: BLE001 - an optimisation only
        log.exception("could not start the background compile; decode keeps running eagerly")


def _make_server_class():
    import uvicorn

    class Server(uvicorn.Server):
        def __init__(self, config: Any, on_ready, on_signal) -> None:
            super().__init__(config)
            self._on_ready = on_ready
            self._on_signal = on_signal

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit:
                self._on_ready()

        def handle_exit(self, sig: int, frame: Any) -> None:
            self._on_signal()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # As uvicorn's, minus re-raising the signal afterwards: a signalled, clean shutdown exits 0.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = [signal.SIGINT, signal.SIGTERM]
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config: Any, on_ready, on_signal):  # noqa: N802 - reads as a class at the call site
    return _make_server_class()(config, on_ready, on_signal)
