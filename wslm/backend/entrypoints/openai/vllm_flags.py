"""`vllm serve` flags that cannot apply to wslm, accepted so that vLLM launch scripts run unchanged.

Each one is logged once at start-up with why it has no effect: a flag is never dropped silently, and a
truly unknown flag stays argparse's "unrecognized arguments" error. Flags that do something here (the
flags of serve_cli.py) are never listed; a flag another module already defined is skipped, so this table
can never clash with a real implementation added later."""

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
}


def add_no_effect_flags(parser: argparse.ArgumentParser) -> None:
    """Add NO_EFFECT's flags to `wslm serve` (after its real flags: any already defined is left alone)."""
    group = parser.add_argument_group("accepted for vLLM compatibility (no effect in wslm; logged at start)")
    for flag, (kind, why) in NO_EFFECT.items():
        if flag in parser._option_string_actions:
            continue
        dest = _dest(flag)
        help_text = f"no effect: {why}"
        if kind == "value":
            group.add_argument(flag, dest=dest, default=None, metavar="VALUE", help=help_text)
        elif kind == "flag":
            group.add_argument(flag, dest=dest, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)


def log_no_effect(args: argparse.Namespace) -> list[str]:
    """One log line per NO_EFFECT flag the user gave; returns the flags logged."""
    given = []
    for flag, (_, why) in NO_EFFECT.items():
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        shown = flag if value is True else f"{flag} {value}" if value is not False else "--no-" + flag[2:]
        log.warning("%s has no effect in wslm: %s.", shown, why)
        given.append(flag)
    return given


def _dest(flag: str) -> str:
    return "vllm_" + flag[2:].replace("-", "_")
