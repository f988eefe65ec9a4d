"""Why an engine core process stopped, in words a user can act on (core_client.MPClient reports it to every
request the core was running, and to the server log).

A core that dies by SIGKILL was most often ended by the kernel's out-of-memory killer; the kernel counts
those kills in /proc/vmstat (`oom_kill`, Linux 4.13+), so a count that rose since the core started says so
(the count is machine-wide: another program's kill at the same moment reads the same, hence "most likely").
A crash in native code (SIGSEGV, SIGBUS, SIGILL, SIGABRT) and an exit with a code are named as such."""

from __future__ import annotations

import signal

_NATIVE_CRASH = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT, signal.SIGFPE}

OOM_FIX = ("Give the model less memory: lower --kv-cache-memory (CPU) or --gpu-memory-utilization (GPU) or "
           "--max-model-len, serve a smaller or more quantized model, lower --max-loaded-models, or free memory "
           "(under WSL2, raise `memory=` in %UserProfile%\\.wslconfig).")


def oom_kill_count() -> int | None:
    """The kernel's count of out-of-memory kills since boot; None where it cannot be read."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def exit_text(exitcode: int | None) -> str:
    """"killed by SIGKILL", "exit code 1", ... from a multiprocessing exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def death_cause(exitcode: int | None, oom_kills_at_start: int | None) -> tuple[str, bool]:
    """(the cause in words, whether it was most likely out of memory)."""
    text = exit_text(exitcode)
    if exitcode == -signal.SIGKILL:
        now = oom_kill_count()
        if now is not None and oom_kills_at_start is not None and now > oom_kills_at_start:
            return (f"{text}: most likely the kernel's out-of-memory killer (the machine ran out of memory; "
                    f"{now - oom_kills_at_start} out-of-memory kill(s) since the core started)"), True
        return f"{text}: by another program, or by the kernel's out-of-memory killer", False
    if exitcode is not None and exitcode < 0 and -exitcode in _NATIVE_CRASH:
        return f"{text}: a crash in native code (a kernel or driver bug)", False
    return text, False


def death_message(exitcode: int | None, oom_kills_at_start: int | None, reported: str | None = None) -> str:
    """What a request the dead core was running is told (HTTP 503, code engine_dead): the cause and the fix.
    reported: the cause the core sent itself before it exited, if any."""
    cause, oom = death_cause(exitcode, oom_kills_at_start)
    if reported:
        oom = oom or "out of memory" in reported.lower() or "OutOfMemory" in reported
        cause = f"{reported}; {cause}"
    fix = OOM_FIX + " " if oom else ""
    return (f"The model's engine core process stopped ({cause}); its requests failed. {fix}The next request "
            "starts the model's core again; if it keeps stopping, the server log (stderr) says why.")
