"""engine/core_death.py: a dead core process's cause and fix in words (the server's 503 `engine_dead` text)."""

from __future__ import annotations

import signal

from wslm.backend.engine import core_death
from wslm.backend.engine.core_death import death_cause, death_message, exit_text, oom_kill_count


def test_exit_codes_and_signals_are_named():
    assert exit_text(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_text(3) == "exit code 3"
    assert exit_text(-200) == "killed by signal 200"
    assert exit_text(None) == "still running"
    cause, oom = death_cause(-signal.SIGSEGV, None)
    assert "SIGSEGV" in cause and "native code" in cause and not oom


def test_sigkill_reads_as_out_of_memory_only_when_the_kernels_count_rose(monkeypatch):
    monkeypatch.setattr(core_death, "oom_kill_count", lambda: 7)
    cause, oom = death_cause(-signal.SIGKILL, 5)
    assert oom and "out-of-memory killer" in cause and "2 out-of-memory kill(s)" in cause
    message = death_message(-signal.SIGKILL, 5)
    assert "--kv-cache-memory" in message and "starts the model's core again" in message
    cause, oom = death_cause(-signal.SIGKILL, 7)  # no new kill: someone's kill -9
    assert not oom and "another program" in cause
    assert "--kv-cache-memory" not in death_message(-signal.SIGKILL, 7)


def test_the_cores_own_report_comes_first():
    message = death_message(1, None, "OutOfMemoryError: CUDA out of memory")
    assert message.index("CUDA out of memory") < message.index("exit code 1") and "--kv-cache-memory" in message


def test_the_kernels_oom_count_is_read_here():
    assert isinstance(oom_kill_count(), int)  # Linux 4.13+ (/proc/vmstat)
