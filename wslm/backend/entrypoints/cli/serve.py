"""`wslm serve`: the OpenAI-compatible server, with `vllm serve`'s flag names. Heavy imports stay in the
handler so that other subcommands do not pay for torch/fastapi."""

from __future__ import annotations

import argparse

from wslm import defaults
from wslm.backend.entrypoints.cli import engine_flags
from wslm.backend.entrypoints.openai.vllm_flags import add_no_effect_flags

# EngineConfig fields whose flags --help lists under "vLLM flags"; the others are in the main list.
VLLM_GROUP_FIELDS = ("task", "tokenizer", "revision", "download_dir", "trust_remote_code", "enforce_eager",
                     "max_logprobs")


def tool_parser_names() -> list[str]:
    from wslm.backend.entrypoints.openai.tool_parsers import (
        TOOL_PARSERS,  # light: the parsers need no torch or fastapi
    )

    return list(TOOL_PARSERS)


def _reasoning_parser_name(name: str) -> str:
    from wslm.backend.entrypoints.openai.reasoning import (
        check_reasoning_parser_name,  # light, as the tool parsers
    )

    try:
        return check_reasoning_parser_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        allow_abbrev=False,  # a misspelt or shortened flag is an error, never silently another flag
        help="run the OpenAI-compatible API server",
        description="Serve a model over an OpenAI-compatible HTTP API (flags as in `vllm serve`). Prints JSON "
        'lines on stdout: {"event": "loading"}, then {"event": "ready", "url": ...} or {"event": "error"}.',
    )
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model, as in `vllm serve MODEL`)")
    p.add_argument("--host", default=defaults.HOST, help=f"address to listen on (default {defaults.HOST})")
    p.add_argument("--port", type=int, default=defaults.PORT,
                   help=f"port to listen on (default {defaults.PORT}; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $WSLM_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) in the API (default: the --model value); the first is reported")
    vllm_group = p.add_argument_group("vLLM flags")
    engine_flags.add_engine_flags(dict.fromkeys(VLLM_GROUP_FIELDS, vllm_group), p, {
        # Text, parsed at start-up (launcher.engine_config): 4k, 4GiB, and a bad value is an error event.
        "max_model_len": {"type": None}, "kv_cache_memory": {"type": None},
        "distributed_executor_backend": {"type": _executor_backend},
    })
    p.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="seconds running requests get to finish after SIGTERM/SIGINT (default 5)")
    p.add_argument("--allowed-origins", default=None,
                   help="browser origins allowed besides this machine's, as a JSON list (vLLM's form) or commas; "
                        "'[\"*\"]' allows any web page (default: loopback pages only)")
    p.add_argument("--allowed-methods", default=None, help='CORS: allowed methods, JSON list (default \'["*"]\')')
    p.add_argument("--allowed-headers", default=None, help='CORS: allowed headers, JSON list (default \'["*"]\')')
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies)")
    p.add_argument("--allowed-hosts", default=None,
                   help="Host header names accepted besides localhost when listening on loopback (e.g. behind a "
                        "proxy); '*' turns the check off")
    p.add_argument("--max-request-body-bytes", type=int, default=None,
                   help="largest request body accepted, in bytes (default 8 MiB; larger: 413)")
    p.add_argument("--max-json-depth", type=int, default=None,
                   help="deepest nesting of arrays/objects in a request body (default 64; deeper: 400)")
    p.add_argument("--max-header-count", "--h11-max-header-count", type=int, default=None,
                   help="most headers in one request (default 100; more: 431)")
    p.add_argument("--max-header-bytes", "--h11-max-incomplete-event-size", type=int, default=None,
                   help="largest request line plus headers, in bytes (default 16 KiB; larger: 431)")
    p.add_argument("--request-head-timeout", type=float, default=None,
                   help="seconds a connection gets to send each request's line and headers (default 10; then 408 "
                        "and the connection is closed)")
    p.add_argument("--max-stop-strings", type=int, default=None,
                   help="most `stop` strings in one request (default 64)")
    p.add_argument("--max-stop-string-length", type=int, default=None,
                   help="longest `stop` string, in characters (default 512)")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"], help="uvicorn's log level")
    _add_vllm_flags(vllm_group)
    add_no_effect_flags(p)  # last: it skips any flag defined above
    p.set_defaults(func=_serve)


def _add_vllm_flags(g: argparse._ArgumentGroup) -> None:
    """vLLM's common `vllm serve` server flags, doing what vLLM's do (the engine's are EngineConfig's fields;
    the ones that cannot apply are in openai/vllm_flags.py: accepted, and logged as having no effect)."""
    g.add_argument("--runner", default=None, choices=["auto", "generate", "pooling"],
                   help="vLLM's newer name for --task: pooling = embed")
    g.add_argument("--generation-config", default="auto",
                   help="default sampling values: auto = the model's generation_config.json (as vLLM), vllm = "
                        "none, or a folder holding a generation_config.json")
    g.add_argument("--override-generation-config", default=None,
                   help='JSON overriding those defaults, e.g. \'{"temperature": 0.5}\'')
    g.add_argument("--enable-log-requests", dest="log_requests", action="store_true", default=False,
                   help="log each request's id, prompt length and sampling parameters")
    g.add_argument("--disable-log-requests", dest="log_requests", action="store_false",
                   help="do not log requests (the default; kept for old vLLM scripts)")
    g.add_argument("--root-path", default=None,
                   help="the path prefix a reverse proxy serves this server under, e.g. /llm")
    g.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="report usage.prompt_tokens_details.cached_tokens (prefix-cache hits)")
    g.add_argument("--enable-force-include-usage", action="store_true",
                   help="send usage on every response, streams too, as if stream_options.include_usage")
    g.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count requests in flight, served at GET /load")
    g.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve GET /tokenizer_info (the tokenizer's configuration and chat template)")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model call tools on its own (tool_choice "auto"); on by default when the chat '
                        "template shows a tool format wslm recognises")
    g.add_argument("--tool-call-parser", default=None, choices=tool_parser_names(),
                   help="how the model writes tool calls (default: picked from the chat template)")
    g.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help='with tool_choice "none", do not show the tools to the chat template')
    g.add_argument("--reasoning-parser", default=None, type=_reasoning_parser_name,
                   help="split <think>...</think> (or harmony's analysis channel) into reasoning_content: "
                        "deepseek_r1, qwen3, openai_gptoss and vLLM's names for the same formats (default: picked "
                        "from the chat template)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="only 1: wslm splits a model over GPUs by tensor parallelism (--tensor-parallel-size)")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="only 1: run one `wslm serve` per GPU (or replica) behind a load balancer instead")
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log line per request")
    g.add_argument("--disable-fastapi-docs", action="store_true", help="no /docs, /redoc or /openapi.json")


def _serve(args: argparse.Namespace) -> int:
    from wslm.backend.entrypoints.openai.launcher import run

    args.model = args.model or args.model_tag or engine_flags.default("model")
    return run(args)


def _executor_backend(value: str) -> str:
    if value in ("uni", "mp", "ray") or ":" in value:
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from uni, mp, ray, package.module:Class)")
