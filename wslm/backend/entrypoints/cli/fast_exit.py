"""End `wslm serve` once it has shut down, without the interpreter's teardown.

After a background CPU compile (even one cancelled at exit) the teardown is garbage collection over the
millions of objects dynamo, inductor and sympy made: 7-11 s after a SIGTERM during the compile of the demo
model on 2 cores (the log already said "Finished server process"), longer than the desktop app waited before
it SIGKILLed a server that had shut down cleanly. What exit still needs is done here, in the order
Py_Finalize does it: threading's exit hooks (a running compile is cancelled: decode_compiled.py), the atexit
handlers (logging's flush among them), the streams flushed; then os._exit."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # joins non-daemon threads and runs threading's exit hooks, as exit would
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
