"""`vllm serve` flags that cannot apply to wslm, accepted so that vLLM launch scripts run unchanged.

Each one is logged once at start-up with why it has no effect: a flag is never dropped silently, and a
truly unknown flag stays argparse's "unrecognized arguments" error. Flags that do something here (the
flags of cli/serve.py) are never listed; a flag another module already defined is skipped, so this table
can never clash with a real implementation added later.

NOT_SUPPORTED's flags would change what is served in a way wslm cannot do: given (with a value that matters),
`wslm serve` stops at once with one line saying why and what to do instead (exit 2, as argparse's errors),
rather than argparse's bare "unrecognized arguments" or serving something else than asked."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("wslm.server")

# flag -> (kind, why it has no effect). kind: "value" (takes one argument), "flag" (store_true) or "bool"
# (vLLM's --x / --no-x pair).
NO_EFFECT: dict[str, tuple[str, str]] = {
    "--swap-space": ("value", "preempted sequences are recomputed (mostly from the prefix cache), never swapped "
                              "to CPU memory"),
    "--disable-log-stats": ("flag", "wslm logs no periodic stats lines; GET /metrics is always served"),
    "--tokenizer-mode": ("value", "the model's Hugging Face tokenizer (fast when it has one) is always used"),
    "--load-format": ("value", "weights are read from safetensors, .bin or GGUF, whichever the model has"),
    "--max-seq-len-to-capture": ("value", "CUDA graphs are captured for decode batches, whatever the length"),
    "--disable-custom-all-reduce": ("flag", "tensor parallel uses torch.distributed's all-reduce only"),
    "--disable-frontend-multiprocessing": ("flag", "the HTTP server and the engine loop share one process"),
    "--enable-chunked-prefill": ("bool", "chunked prefill is always on (--max-num-batched-tokens sets the chunk)"),
    "--max-parallel-loading-workers": ("value", "weights are loaded by one reader"),
    "--code-revision": ("value", "wslm runs its own model code and never downloads a model's Python code"),
    "--scheduling-policy": ("value", "requests are scheduled first come, first served"),
    "--tool-parser-plugin": ("value", "vLLM parser plugins are not loaded; wslm's own parsers are hermes, "
                                      "llama3_json, mistral, openai, pythonic and qwen3_coder (--tool-call-parser)"),
    "--enable-reasoning": ("flag", "reasoning is split whenever a --reasoning-parser is given or picked from the "
                                   "chat template"),
    "--tokenizer-revision": ("value", "the tokenizer is read at the model's --revision (or from --tokenizer)"),
    "--max-log-len": ("value", "request log lines (--enable-log-requests) show a prompt's length, never its text"),
    "--enable-request-id-headers": ("flag", "the response body's id names the request; no X-Request-Id header"),
    "--chat-template-content-format": ("value", "message content reaches the chat template as one string (text "
                                                "parts joined), vLLM's 'string' format"),
    "--use-v2-block-manager": ("flag", "vLLM removed it too; the block manager is always wslm's own"),
    "--num-lookahead-slots": ("value", "vLLM removed it too; speculation takes --speculative-config"),
    "--num-scheduler-steps": ("value", "vLLM removed it too; the scheduler runs every step"),
    "--disable-async-output-proc": ("flag", "vLLM removed it too; outputs are processed after each step"),
    "--tokenizer-pool-size": ("value", "vLLM removed it too; prompts are tokenized in the server's worker threads"),
    "--mm-processor-cache-gb": ("value", "not used by wslm (images: --limit-mm-per-prompt, --max-image-bytes, --max-image-pixels; no audio or video)"),
    "--disable-mm-preprocessor-cache": ("flag", "not used by wslm (images: --limit-mm-per-prompt, --max-image-bytes, --max-image-pixels; no audio or video)"),
    "--allowed-local-media-path": ("value", "not used by wslm (images: --limit-mm-per-prompt, --max-image-bytes, --max-image-pixels; no audio or video)"),
    "--otlp-traces-endpoint": ("value", "no OpenTelemetry tracing; GET /metrics has the latencies"),
    "--collect-detailed-traces": ("value", "no OpenTelemetry tracing; GET /metrics has the latencies"),
    "--compilation-config": ("value", "wslm picks its own compilation (CUDA graphs on GPU, the compiled decode "
                                      "step on CPU); --enforce-eager turns both off"),
    "--cuda-graph-sizes": ("list", "CUDA graphs are captured for wslm's own decode batch sizes"),
    "--max-cudagraph-capture-size": ("value", "CUDA graphs are captured for wslm's own decode batch sizes"),
    "--async-scheduling": ("bool", "each step is scheduled after the previous one's output"),
    "--max-num-partial-prefills": ("value", "--long-prefill-token-threshold bounds prefill work per step"),
    "--disable-cascade-attn": ("bool", "wslm's attention kernels have no cascade mode"),
    "--calculate-kv-scales": ("bool", "an fp8 KV cache (--kv-cache-dtype fp8) stores values unscaled"),
    "--attention-backend": ("value", "wslm picks its own attention kernels (Triton, torch or C) for the device"),
    "--model-impl": ("value", "wslm runs its own model code for every architecture it serves"),
    "--config-format": ("value", "the model's config.json (or the GGUF header) is read as Hugging Face's"),
    "--model-loader-extra-config": ("value", "weights are read by wslm's own loader"),
    "--safetensors-load-strategy": ("value", "safetensors files are memory-mapped and read one tensor at a time"),
    "--prefix-caching-hash-algo": ("value", "prefix-cache blocks are keyed by their token ids"),
    "--enable-log-outputs": ("flag", "request logs (--enable-log-requests) never show generated text"),
    "--log-error-stack": ("flag", "failed requests always log their traceback on the server"),
    "--enable-mfu-metrics": ("flag", "GET /metrics has no model-FLOPs-utilisation gauge"),
    "--expand-tools-even-if-tool-choice-none": ("flag", 'tools are shown to the chat template with tool_choice "none" '
                                                        "unless --exclude-tools-when-tool-choice-none"),
    "--api-server-count": ("value", "one HTTP server process serves every request"),
    "--data-parallel-size-local": ("value", "data parallelism is one `wslm serve` per replica (--data-parallel-size)"),
    "--data-parallel-address": ("value", "data parallelism is one `wslm serve` per replica (--data-parallel-size)"),
    "--data-parallel-rpc-port": ("value", "data parallelism is one `wslm serve` per replica (--data-parallel-size)"),
    "--data-parallel-backend": ("value", "data parallelism is one `wslm serve` per replica (--data-parallel-size)"),
    "--lora-dtype": ("value", "an adapter's A and B are kept in the model's dtype (scaled in float32 first)"),
    "--fully-sharded-loras": ("bool", "LoRA adapters run on one device (--tensor-parallel-size 1)"),
    "--enable-ssl-refresh": ("flag", "the certificate is read at start: restart the server after renewing it"),
}

_QLORA = ("a QLoRA base (bitsandbytes 4-bit) is not loaded here; serve its adapter with --lora-modules over the "
          "16-bit base, or over a GGUF / int4 copy of it (the base is never changed)")
_CONFIG = "the model's config.json is used as it is: change it in a copy of the model folder instead"

# flag -> (kind as NO_EFFECT's, why it cannot be honoured here and what to do instead). The --no- form of a
# "bool" flag is accepted silently (it asks for what wslm does anyway), as is a value in HARMLESS.
NOT_SUPPORTED: dict[str, tuple[str, str]] = {
    "--qlora-adapter-name-or-path": ("value", _QLORA),
    "--cpu-offload-gb": ("value", "wslm keeps a model's weights on one device; for a model larger than the GPU's "
                                  "memory serve a smaller quantized file (GGUF, int4) or run it on the CPU "
                                  "(--device cpu)"),
    "--enable-sleep-mode": ("bool", "there are no /sleep and /wake_up endpoints: stop the server to free its memory"),
    "--kv-transfer-config": ("value", "the KV cache is never transferred between servers (no disaggregated "
                                      "prefill)"),
    "--kv-offloading-size": ("value", "the KV cache stays in one pool; preempted requests are recomputed"),
    "--rope-scaling": ("value", _CONFIG),
    "--rope-theta": ("value", _CONFIG),
    "--hf-overrides": ("value", _CONFIG),
    "--disable-sliding-window": ("bool", "sliding-window models always attend through their window"),
    "--skip-tokenizer-init": ("bool", "the server renders prompts and detokenizes replies, so it needs the "
                                      "tokenizer"),
    "--middleware": ("list", "no ASGI middleware is loaded by import path; put a reverse proxy in front instead"),
    "--tool-server": ("value", "no built-in tool servers; pass tools in each request"),
    "--enable-expert-parallel": ("bool", "no expert parallelism; --tensor-parallel-size splits a model over GPUs"),
    "--enable-eplb": ("bool", "no expert parallelism; --tensor-parallel-size splits a model over GPUs"),
    "--headless": ("flag", "wslm serve always serves HTTP"),
    "--worker-cls": ("value", "wslm runs its own workers"),
}
# Values that ask for nothing wslm does not do (launch scripts spell defaults out): accepted silently.
HARMLESS: dict[str, tuple[str, ...]] = {"--cpu-offload-gb": ("0", "0.0"), "--hf-overrides": ("{}",)}
# Short spellings vLLM has for some of these flags (`-O3` is --compilation-config 3).
ALIASES: dict[str, tuple[str, ...]] = {"--compilation-config": ("-O",)}

STRUCTURED_BACKENDS = ("auto", "xgrammar")


def add_no_effect_flags(parser: argparse.ArgumentParser) -> None:
    """Add NO_EFFECT's flags to `wslm serve` (after its real flags: any already defined is left alone)."""
    group = parser.add_argument_group("accepted for vLLM compatibility (no effect in wslm; logged at start)")
    for flag, (kind, why) in NO_EFFECT.items():
        if flag in parser._option_string_actions:
            continue
        dest = _dest(flag)
        help_text = f"no effect: {why}"
        names = (flag, *ALIASES.get(flag, ()))
        if kind == "value":
            group.add_argument(*names, dest=dest, default=None, metavar="VALUE", help=help_text)
        elif kind == "list":
            group.add_argument(flag, dest=dest, default=None, nargs="+", metavar="VALUE", help=help_text)
        elif kind == "flag":
            group.add_argument(flag, dest=dest, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)


class NotSupportedAction(argparse.Action):
    """A NOT_SUPPORTED flag: one line saying why and exit 2, unless its value asks for nothing new."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "", harmless: tuple[str, ...] = (),
                 **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.why = why
        self.harmless = harmless

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if (option_string or "").startswith("--no-") or (isinstance(values, str) and values.strip() in self.harmless):
            return
        not_supported(parser, option_string or self.option_strings[0], self.why)


def not_supported(parser: argparse.ArgumentParser, flag: str, why: str) -> None:
    """Stop with one line (no usage block: the flag was understood, it just cannot be honoured)."""
    parser.exit(2, f"{parser.prog}: error: {flag} is not supported: {why}.\n")


def add_not_supported_flags(parser: argparse.ArgumentParser) -> None:
    """Add NOT_SUPPORTED's flags (after the real ones: any already defined is left alone)."""
    group = parser.add_argument_group("vLLM flags wslm cannot honour (a start-up error saying why)")
    for flag, (kind, why) in NOT_SUPPORTED.items():
        if flag in parser._option_string_actions:
            continue
        names = [flag] + (["--no-" + flag[2:]] if kind == "bool" else [])
        nargs = {"value": None, "list": "+"}.get(kind, 0)
        group.add_argument(*names, dest=_dest(flag), action=NotSupportedAction, why=why, nargs=nargs,
                           harmless=HARMLESS.get(flag, ()), default=None, help=f"not supported: {why}")


class StructuredBackendAction(argparse.Action):
    """--guided-decoding-backend / --structured-outputs-config.backend: wslm's structured output is xgrammar's,
    so auto and xgrammar (with vLLM's old `xgrammar:option` suffixes) are accepted; another engine is a
    one-line error."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name = str(values).split(":", 1)[0].strip().lower()
        if name not in STRUCTURED_BACKENDS:
            not_supported(parser, f"{option_string} {values}",
                          "structured output (json_schema, regex, grammar, choice) always runs on xgrammar here; "
                          "pass auto or xgrammar, or leave the flag out")
        setattr(namespace, self.dest, name)


class StructuredConfigAction(argparse.Action):
    """--structured-outputs-config JSON (vLLM's newer form): its backend is checked as above; the other keys
    are kept for the start-up log (they have no effect here)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import json

        try:
            config = json.loads(values)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            parser.exit(2, f"{parser.prog}: error: {option_string} must be a JSON object such as "
                           f"'{{\"backend\": \"xgrammar\"}}', got {values!r}.\n")
        if "backend" in config:
            StructuredBackendAction(self.option_strings, "structured_outputs_backend")(
                parser, namespace, str(config["backend"]), f"{option_string} backend")
        setattr(namespace, self.dest, {k: v for k, v in config.items() if k != "backend"})


def add_structured_output_flags(group) -> None:
    group.add_argument("--structured-outputs-config.backend", "--guided-decoding-backend",
                       dest="structured_outputs_backend", action=StructuredBackendAction, default=None,
                       metavar="NAME", help="auto or xgrammar: structured output runs on xgrammar (other vLLM "
                                            "backends are refused with why)")
    group.add_argument("--structured-outputs-config", dest="structured_outputs_config",
                       action=StructuredConfigAction, default=None, metavar="JSON",
                       help='vLLM\'s structured output settings as JSON; "backend" as above, other keys have no '
                            "effect (logged)")


def log_no_effect(args: argparse.Namespace) -> list[str]:
    """One log line per NO_EFFECT flag the user gave; returns the flags logged."""
    given = []
    for flag, (_, why) in NO_EFFECT.items():
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        if isinstance(value, list):
            value = " ".join(value)
        shown = flag if value is True else f"{flag} {value}" if value is not False else "--no-" + flag[2:]
        log.warning("%s has no effect in wslm: %s.", shown, why)
        given.append(flag)
    extra = getattr(args, "structured_outputs_config", None)
    if extra:
        log.warning("--structured-outputs-config %s has no effect in wslm: structured output runs on xgrammar "
                    "with its own settings.", ", ".join(sorted(extra)))
        given.append("--structured-outputs-config")
    return given


def _dest(flag: str) -> str:
    return "vllm_" + flag[2:].replace("-", "_")
