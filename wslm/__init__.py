"""wslm: a local LLM manager for Windows users who run models inside WSL2."""

import os

# OpenMP threads that spin while waiting make a CPU engine up to 10x slower whenever anything else runs
# on the machine (the GUI, a second server, a test client). Must be set before torch loads libgomp, so it
# is set here, for library users too (documented with the WSLM_* variables in wslm/envs.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
