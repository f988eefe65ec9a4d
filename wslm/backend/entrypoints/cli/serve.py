"""`wslm serve`: the OpenAI-compatible server, with `vllm serve`'s flag names. Heavy imports stay in the
handler so that other subcommands do not pay for torch/fastapi."""

from __future__ import annotations

import argparse


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
        help="run the OpenAI-compatible API server",
        description="Serve a model over an OpenAI-compatible HTTP API (flags as in `vllm serve`). Prints JSON "
        'lines on stdout: {"event": "loading"}, then {"event": "ready", "url": ...} or {"event": "error"}.',
    )
    p.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model, as in `vllm serve MODEL`)")
    p.add_argument("--model", default=None, help='"demo" (default), a HF folder, a .gguf file or a model id')
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $WSLM_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) in the API (default: the --model value); the first is reported")
    p.add_argument("--max-model-len", default=None, help="context length in tokens (e.g. 4096 or 4k)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="most sequences in one batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="while streams decode, prefill tokens per step at most this (fairness; default: "
                        "max-num-batched-tokens / 8)")
    p.add_argument("--fanout-per-step", type=int, default=None,
                   help="new sequences one request (n > 1) may start per step (fairness; default 16)")
    p.add_argument("--block-size", type=int, default=16, help="KV-cache block size in tokens")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="CUDA: share of the GPU to use")
    p.add_argument("--kv-cache-memory", default=None, help="KV-cache size: bytes, or like 4GiB / 512MiB")
    p.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    p.add_argument("--quantization", "-q", default=None, choices=["gguf", "awq", "gptq", "int8", "int4"],
                   help="weights format; a GGUF file or an AWQ/GPTQ checkpoint needs no flag; int8/int4 quantize "
                   "a 16-bit checkpoint while loading")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="auto: the model dtype; fp8 (e4m3): one byte per cached value, twice the tokens in the same "
                        "memory (vLLM's flag; e5m2 is not supported)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split the model over N GPUs (or N CPU processes) with torch.distributed")
    p.add_argument("--distributed-executor-backend", choices=["mp", "ray"], default=None,
                   help="mp: one process per rank on this machine (default); ray: ranks on a Ray cluster")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV cache of shared prompt prefixes (default: on)")
    p.add_argument("--chat-template", default=None, help="a Jinja chat template, or a path to one")
    p.add_argument("--seed", type=int, default=0, help="random seed")
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
    p.add_argument("--max-stop-strings", type=int, default=None,
                   help="most `stop` strings in one request (default 64)")
    p.add_argument("--max-stop-string-length", type=int, default=None,
                   help="longest `stop` string, in characters (default 512)")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"], help="uvicorn's log level")
    _add_vllm_flags(p)
    p.set_defaults(func=_serve)


def _add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's common `vllm serve` flags, doing what vLLM's do (the ones that cannot apply are in
    server/vllm_flags.py: accepted, and logged as having no effect)."""
    from wslm.backend.entrypoints.openai.vllm_flags import add_no_effect_flags

    g = p.add_argument_group("vLLM flags")
    g.add_argument("--task", default="auto", choices=["auto", "generate", "embed", "embedding", "score"],
                   help="generate (text), embed (/v1/embeddings) or score (/rerank, /score: cross-encoders); "
                        "auto: from the checkpoint (vLLM's --task)")
    g.add_argument("--runner", default=None, choices=["auto", "generate", "pooling"],
                   help="vLLM's newer name for --task: pooling = embed")
    g.add_argument("--tokenizer", default=None, help="a tokenizer folder or repo id other than the model's")
    g.add_argument("--revision", default=None,
                   help="which snapshot of a repo id in the HF cache to serve: a branch, tag or commit")
    g.add_argument("--download-dir", default=None,
                   help="the Hugging Face cache folder to find repo ids in (default: the usual HF cache)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the model repo's own code for its config and tokenizer")
    g.add_argument("--enforce-eager", action="store_true", help="run eagerly: no CUDA graphs, no compiled CPU decode step")
    g.add_argument("--max-logprobs", type=int, default=20,
                   help="most top logprobs a request may ask for (default 20; -1: the whole vocabulary)")
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
    add_no_effect_flags(p)


def _serve(args: argparse.Namespace) -> int:
    from wslm.backend.entrypoints.openai.launcher import run

    args.model = args.model or args.model_tag or "demo"
    return run(args)
