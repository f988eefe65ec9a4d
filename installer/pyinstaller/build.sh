#!/usr/bin/env bash
# Builds the packaged app into DIST (default: dist/ at the repo root): DIST/wslm-gui/wslm-gui(.exe).
# Needs PyInstaller and wslm[gui] in the Python that runs it (PYTHON, default .venv/bin/python):
#   .venv/bin/pip install pyinstaller && installer/pyinstaller/build.sh [DIST]
# On Windows run the same spec from PowerShell: py -m PyInstaller --noconfirm installer\pyinstaller\wslm-gui.spec
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DIST="${1:-$ROOT/dist}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if ! "$PY" -c "import PyInstaller" 2>/dev/null; then
    echo "build: PyInstaller is not installed in $PY; install it: $PY -m pip install pyinstaller" >&2
    exit 1
fi
"$PY" -m PyInstaller --noconfirm --clean --log-level WARN --distpath "$DIST" --workpath "$WORK" \
    "$ROOT/installer/pyinstaller/wslm-gui.spec"
echo "build: $DIST/wslm-gui/"
