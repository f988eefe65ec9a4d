"""`wslm serve`: the OpenAI-compatible server, with `vllm serve`'s flag names. Heavy imports stay in the
handler so that other subcommands do not pay for torch/fastapi."""

from __future__ import annotations

import argparse

from wslm import defaults
from wslm.backend.entrypoints.cli import engine_flags
from wslm.backend.entrypoints.cli.serve_args import ServeArgumentParser
from wslm.backend.entrypoints.openai.vllm_flags import (
    add_no_effect_flags,
    add_not_supported_flags,
    add_structured_output_flags,
)

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
        'lines on stdout: {"event": "loading"}, {"event": "load_progress", "percent": ...} while the weights load, then '
        '{"event": "ready", "url": ...} or {"event": "error"}.',
    )
    # vLLM's --config FILE and --flag_with_underscores (serve_args.py); the subparsers action made p.
    p.__class__ = ServeArgumentParser
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model, as in `vllm serve MODEL`)")
    p.add_argument("--host", default=defaults.HOST, help=f"address to listen on (default {defaults.HOST})")
    p.add_argument("--port", type=int, default=defaults.PORT,
                   help=f"port to listen on (default {defaults.PORT}; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $WSLM_API_KEY); listening beyond "
                        "loopback, on /tokenize, /detokenize, /metrics, /load and /docs too")
    p.add_argument("--public-utility-endpoints", action="store_true",
                   help="with --api-key on a non-loopback --host, leave /tokenize, /detokenize, /tokenizer_info, "
                        "/metrics, /load, /docs, /redoc and /openapi.json open without the key (as vLLM always "
                        "does; on loopback they are open anyway)")
    p.add_argument("--ssl-keyfile", default=None, metavar="FILE",
                   help="serve HTTPS with this private key (PEM; with --ssl-certfile)")
    p.add_argument("--ssl-certfile", default=None, metavar="FILE",
                   help="serve HTTPS with this certificate chain (PEM; with --ssl-keyfile)")
    p.add_argument("--ssl-ca-certs", default=None, metavar="FILE",
                   help="CA certificates (PEM) that client certificates are checked against (--ssl-cert-reqs)")
    p.add_argument("--ssl-cert-reqs", type=int, default=0, choices=[0, 1, 2],
                   help="client certificates, as Python's ssl module: 0 none (default), 1 optional, 2 required")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) in the API (default: the --model value); the first is reported")
    vllm_group = p.add_argument_group("vLLM flags")
    engine_flags.add_engine_flags(dict.fromkeys(VLLM_GROUP_FIELDS, vllm_group), p, {
        # Text, parsed at start-up (launcher.engine_config): 4k, 4GiB, and a bad value is an error event.
        "max_model_len": {"type": None}, "kv_cache_memory": {"type": None},
        "distributed_executor_backend": {"type": _executor_backend},
        "enable_lora": {"action": argparse.BooleanOptionalAction},  # vLLM's --[no-]enable-lora
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
    p.add_argument("--max-stored-responses", type=_count, default=1000,
                   help="most /v1/responses responses kept in memory for previous_response_id, GET and cancel "
                        "(default 1000, least recently used out first; 0: none stored)")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"], help="uvicorn's log level")
    _add_model_pool_flags(p)
    _add_lora_flags(p)
    _add_vllm_flags(vllm_group)
    add_no_effect_flags(p)  # last: it skips any flag defined above
    add_not_supported_flags(p)
    p.set_defaults(func=_serve)


def _add_vllm_flags(g: argparse._ArgumentGroup) -> None:
    """vLLM's common `vllm serve` server flags, doing what vLLM's do (the engine's are EngineConfig's fields;
    the ones that cannot apply are in openai/vllm_flags.py: accepted, and logged as having no effect)."""
    g.add_argument("--config", default=None, metavar="FILE",
                   help="a YAML file of flags (keys are flag names without the dashes, e.g. max_model_len: 4096); "
                        "flags on the command line win")
    g.add_argument("--hf-token", nargs="?", const=True, default=None, metavar="TOKEN",
                   help="Hugging Face token for the hub (gated or private repos); without a value, the token of "
                        "`huggingface-cli login`. Never logged; $HF_TOKEN keeps it out of the process list")
    g.add_argument("--response-role", default="assistant",
                   help='the role of replies in /v1/chat/completions (default "assistant"; with '
                        "add_generation_prompt false, the last message's role, as vLLM)")
    add_structured_output_flags(g)
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
    g.add_argument("--enable-per-request-metrics", action="store_true",
                   help="add vLLM's `metrics` object (time to first token, queue and decode time, mean inter-token "
                        "latency, tokens/s) to each one-stream answer; on streams, to the final usage chunk")
    g.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count requests in flight, served at GET /load")
    g.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve GET /tokenizer_info (the tokenizer's configuration and chat template)")
    g.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help='logprob tokens as "token_id:N" (unambiguous for tokens that are not whole characters) '
                        "unless a request sets return_tokens_as_token_ids")
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


def _add_model_pool_flags(p: argparse.ArgumentParser) -> None:
    """Several models behind one port, loaded on request (openai/model_pool.py; docs/model-pool.md). The names
    follow Ollama's (OLLAMA_MAX_LOADED_MODELS, keep_alive) and LM Studio's (JIT loading, idle TTL)."""
    p.add_argument("--model-pool", nargs="+", default=None, metavar="MODEL",
                   help="more models this server loads when a request names them: names as `wslm models list` "
                        "shows them, paths, HF repo ids in the cache, or NAME=MODEL; `all`: every local model. The "
                        "--model model stays loaded and is the default (default: none, one model)")
    p.add_argument("--max-loaded-models", type=int, default=2, metavar="N",
                   help="with --model-pool, most models loaded at once, the --model one included (default 2); one "
                        "more unloads the least recently used idle one. On a GPU each gets an equal share of "
                        "--gpu-memory-utilization")
    p.add_argument("--model-ttl", default="300", metavar="SECONDS",
                   help="with --model-pool, how long a model loaded on request stays loaded after its last request: "
                        "seconds or a duration like 5m (default 300, Ollama's keep_alive default); -1: until "
                        "evicted; 0: unload after each request. A request's `keep_alive` overrides it")
    p.add_argument("--model-load-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="with --model-pool, how long a request waits for its model to load before a 503 with "
                        "Retry-After (the load goes on; default 600)")


def _add_lora_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's --lora-modules (--enable-lora, --max-loras, --max-lora-rank and --max-cpu-loras are engine
    flags): each adapter served by name per request over the one base (wslm/backend/lora)."""
    p.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help="LoRA adapters (PEFT folders) on the --model model, each served under its NAME: NAME=PATH "
                        "or vLLM's JSON {\"name\": ..., \"path\": ..., \"base_model_name\": ...}. Served per "
                        "request over the one --model base (implies --enable-lora; --max-loras resident at once)")


def _serve(args: argparse.Namespace) -> int:
    from wslm.backend.entrypoints.openai.launcher import run

    args.model = args.model or args.model_tag or engine_flags.default("model")
    code = run(args)
    from wslm.backend.entrypoints.cli.fast_exit import exit_now

    exit_now(code)  # the shutdown is done: skip the interpreter's slow teardown (fast_exit.py says why)


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {value!r}")
    return n


def _executor_backend(value: str) -> str:
    if value in ("uni", "mp", "ray") or ":" in value:
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from uni, mp, ray, package.module:Class)")
