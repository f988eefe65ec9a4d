"""Guess why the backend died from its exit code and last log lines, and say what to do about it."""

from __future__ import annotations

HINTS: list[tuple[tuple[str, ...], str]] = [
    (("out of memory", "cuda oom", "outofmemoryerror"),
     "The GPU ran out of memory: lower the GPU memory share or the context length, or pick a smaller model."),
    (("address already in use", "errno 98", "port is already in use", "only one usage of each socket"),
     "The port is taken by another program: choose another port, or stop that program."),
    (("no module named",),
     "wslm's Python packages are incomplete on the target: run the installer (install.sh) inside the distro."),
    (("command not found", "no such file or directory: 'wslm'", "wslm: not found"),
     "wslm is not installed on the target: run the installer (install.sh) inside the distro."),
    (("not found in", "no model named", "model not found", "unknown model"),
     "The model is not on the target: download it in the Models panel, or pick another one."),
    (("maximum context", "max_model_len", "max-model-len"),
     "The context length does not fit: lower it, or leave it empty to use the model's own."),
    (("no distribution with the supplied name", "wsl_e_distro_not_found"),
     "That WSL distro does not exist: pick another target (see `wsl --list`)."),
    (("unsupported architecture", "not supported"),
     "This model's architecture is not supported by the wslm engine: pick a supported model."),
    (("api key", "api-key"), "Check the API key setting."),
]


def likely_cause(exit_code: int, lines: list[str], error_message: str = "") -> str:
    text = "\n".join([error_message, *lines]).lower()
    for needles, hint in HINTS:
        if any(n in text for n in needles):
            return hint
    if exit_code == 127:
        return "wslm is not installed on the target: run the installer (install.sh) inside the distro."
    if exit_code in (-9, 137):
        return "The process was killed (out of memory in Linux, or killed by hand). Try a smaller model."
    if exit_code == -1:
        return "The backend could not be started. Check the target in the first-run settings."
    return f"The backend exited with code {exit_code}; see the log lines above."
