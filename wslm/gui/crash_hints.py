"""Guess why the backend died from its exit code and last log lines, and say what to do about it in the
app's own terms: which field of the Server panel to change, not which command-line flag to pass."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CrashCause:
    title: str  # the crash box's headline, e.g. "The port is taken"
    advice: str  # what to do, naming the field to change
    field: str = ""  # Server panel field to point at: model, port, context, gpu, api_key, target, extra, speculative


# (needles in the error or log, cause); first match wins, so the specific ones come first.
CAUSES: list[tuple[tuple[str, ...], CrashCause]] = [
    (("out of memory", "cuda oom", "outofmemoryerror", "no gpu memory left"),
     CrashCause("The GPU ran out of memory", "Lower “GPU memory share” or “Context length” above, or pick a "
                "smaller model in the Model box.", "gpu")),
    (("address already in use", "errno 98", "port is already in use", "is already in use",
      "only one usage of each socket"),
     CrashCause("The port is taken", "Another program (or another wslm server) listens on this port: change "
                "“Port” above, or stop that program.", "port")),
    (("speculative", "draft model"),  # before "not found"/"not supported": a draft's problem is the draft's
     CrashCause("Speculative decoding could not start", "Pick another “Draft” (prompt lookup needs no model; a "
                "draft model must be a smaller model of the same family, sharing its tokenizer) or switch "
                "“Speculative decoding” off.", "speculative")),
    (("no module named",),
     CrashCause("wslm is incomplete on the target", "wslm's Python packages are missing on the target: run the "
                "installer (install.sh) inside the distro.", "target")),
    (("command not found", "no such file or directory: 'wslm'", "wslm: not found"),
     CrashCause("wslm is not installed on the target", "Run the installer (install.sh) inside the distro, or "
                "pick another target with “Change…”.", "target")),
    (("was not found", "no such model", "not found in", "no model named", "model not found", "unknown model",
      "is not a model"),
     CrashCause("Model not found", "Pick an installed model in the Model box above, or download this one in "
                "the Models panel.", "model")),
    (("the kv cache budget",),  # CPU: the pool (sized from free RAM, or a --kv-cache-memory flag) is too small
     CrashCause("No room for the KV cache", "Free some RAM, remove a small --kv-cache-memory from “Extra flags”, "
                "or pick a smaller model.", "extra")),
    (("maximum context", "max_model_len", "max-model-len"),
     CrashCause("The context length does not fit", "Lower “Context length” above, or set it to “model "
                "default”.", "context")),
    (("no distribution with the supplied name", "wsl_e_distro_not_found"),
     CrashCause("That WSL distro does not exist", "Pick another target with “Change…”.", "target")),
    (("unsupported architecture", "not supported"),
     CrashCause("This model is not supported", "The wslm engine cannot run this model's architecture: pick "
                "another model in the Model box.", "model")),
    (("unrecognized arguments", "invalid choice", "invalid int value", "invalid float value"),
     CrashCause("A flag was not accepted", "Check “Extra flags” above.", "extra")),
    (("api key", "api-key"), CrashCause("API key problem", "Check “API key” above.", "api_key")),
]


# A log record below ERROR (the engine's and uvicorn's logging), with or without its own timestamp.
_CHATTER = re.compile(r"^(\[?(\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d([.,]\d+)?\]?\s+)?(DEBUG|INFO|WARNING|WARN)\b")


def error_lines(lines: list[str]) -> list[str]:
    """The lines that may say why the run failed. Left out: the `$ wslm serve ...` command the app echoes,
    INFO/WARNING log records ("max_model_len 512" in the KV cache line), argparse's usage block, and a
    traceback's source lines: they name flags and settings that were merely set, not what went wrong."""
    out: list[str] = []
    in_block = False  # inside a usage block or a traceback frame: its indented lines are quoted code
    for line in lines:
        text = line.strip()
        if not text or line.startswith("$ ") or _CHATTER.match(text):
            in_block = False
            continue
        if text.startswith(("usage:", 'File "')):
            in_block = True
            continue
        if in_block and line[:1].isspace():
            continue
        in_block = False
        out.append(line)
    return out


def crash_cause(exit_code: int, lines: list[str], error_message: str = "") -> CrashCause:
    text = "\n".join([error_message, *error_lines(lines)]).lower()
    for needles, cause in CAUSES:
        if any(n in text for n in needles):
            return cause
    if exit_code == 127:
        return CAUSES[3][1]
    if exit_code in (-9, 137):
        return CrashCause("The server was killed", "Out of memory in Linux, or killed by hand: pick a smaller "
                          "model or lower “Context length”.", "model")
    if exit_code == -1:
        return CrashCause("The server could not be started", "Check the target (“Change…”).", "target")
    return CrashCause("The server stopped unexpectedly", f"It exited with code {exit_code}; the log lines "
                      "below say why.")


def likely_cause(exit_code: int, lines: list[str], error_message: str = "") -> str:
    """One sentence (for places without a headline, such as a failed `models list`)."""
    cause = crash_cause(exit_code, lines, error_message)
    return f"{cause.title}: {cause.advice}"
