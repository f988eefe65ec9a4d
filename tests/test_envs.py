"""wslm/envs.py: one table of the WSLM_* variables, docs/environment.md generated from it, typed parsing
with errors that name the variable, and no reads around it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from wslm import envs

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "environment.md"
NAME = re.compile(r"WSLM_[A-Z0-9_]+")
# WSLM_* strings in wslm/ that are not environment variables.
NOT_VARIABLES = {"WSLM_CPU_KERNELS_H", "WSLM_CPU_GGUF_BLOCKS_H"}  # the C headers' include guards
# Files that may read a WSLM_* variable without envs (none: test-only variables are read under tests/).
DIRECT_READS_ALLOWED: set[str] = set()
DIRECT_READ = re.compile(r"""(os\.environ(\.get)?\s*[\[(]|os\.getenv\()\s*("WSLM_|'WSLM_|ENV_VAR|CFLAGS_VAR)""")


def _sources(*roots: str) -> dict[str, str]:
    out = {}
    for root in roots:
        base = ROOT / root
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in files:
            if p.suffix in (".py", ".c", ".h", ".sh", ".ps1") and "__pycache__" not in p.parts:
                out[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8", errors="replace")
    return out


def test_doc_block_is_generated_from_the_table():
    text = DOC.read_text(encoding="utf-8")
    assert envs.BEGIN_MARK in text and envs.END_MARK in text
    assert envs.render_doc(text) == text, "run: python -m wslm.envs --write docs/environment.md"


def test_cli_check_and_markdown():
    run = [sys.executable, "-m", "wslm.envs"]
    assert subprocess.run([*run, "--check", str(DOC)], cwd=ROOT).returncode == 0
    out = subprocess.run([*run, "--markdown"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out == envs.markdown_table()


def test_every_wslm_name_in_the_package_is_in_the_table():
    found = {m for text in _sources("wslm").values() for m in NAME.findall(text)}
    missing = found - set(envs.BY_NAME) - NOT_VARIABLES
    assert not missing, f"add these to wslm/envs.py's VARIABLES: {sorted(missing)}"


def test_every_table_entry_is_used_somewhere():
    text = "\n".join(_sources("wslm", "tests", "setup.sh", "installer", "bench").values())
    unused = [v.name for v in envs.VARIABLES if v.name.startswith("WSLM_") and text.count(v.name) < 1]
    assert not unused


def test_the_table_is_well_formed():
    for v in envs.VARIABLES:
        assert v.type in envs.TYPES and v.section in envs.SECTIONS and v.sides, v.name
        assert set(v.sides) <= set(envs.SIDES), v.name
        assert "\n" not in v.doc, v.name
        assert v.parse(None) == v.default, v.name
    assert len(envs.BY_NAME) == len(envs.VARIABLES)


def test_no_direct_reads_outside_envs():
    hits = [f"{path}:{text[: m.start()].count(chr(10)) + 1}"
            for path, text in _sources("wslm").items()
            if path != "wslm/envs.py" and path not in DIRECT_READS_ALLOWED
            for m in DIRECT_READ.finditer(text)]
    assert not hits, f"read these through wslm.envs: {hits}"


def test_values_are_read_at_access_time(monkeypatch):
    monkeypatch.delenv("WSLM_SMALL_STEP_ROWS", raising=False)
    assert envs.WSLM_SMALL_STEP_ROWS == 1
    monkeypatch.setenv("WSLM_SMALL_STEP_ROWS", " 4 ")
    assert envs.WSLM_SMALL_STEP_ROWS == 4 and envs.get("WSLM_SMALL_STEP_ROWS") == 4
    monkeypatch.setenv("WSLM_SMALL_STEP_ROWS", "")  # blank counts as unset
    assert envs.WSLM_SMALL_STEP_ROWS == 1 and not envs.is_set("WSLM_SMALL_STEP_ROWS")
    with pytest.raises(AttributeError):
        envs.WSLM_NO_SUCH_THING  # noqa: B018
    with pytest.raises(KeyError, match="add it to wslm/envs.py"):
        envs.get("WSLM_NO_SUCH_THING")


@pytest.mark.parametrize(("name", "raw", "value"), [
    ("WSLM_GGUF_CACHE", "0", False), ("WSLM_GGUF_CACHE", "No", False), ("WSLM_GGUF_CACHE", "on", True),
    ("WSLM_CPU_COMPILE", "auto", None), ("WSLM_CPU_COMPILE", "1", True), ("WSLM_CPU_COMPILE", "off", False),
    ("WSLM_KERNEL_BACKEND", "Triton", "triton"), ("WSLM_CPU_KVCACHE_SPACE", "0.5", 0.5),
    ("WSLM_INT4_DENSE_ROWS", "0", 0), ("WSLM_CPU_KERNELS_CFLAGS", " -march=haswell ", "-march=haswell"),
    ("WSLM_MODELS_DIR", "~/m", Path.home() / "m"),
])
def test_typed_parsing(monkeypatch, name, raw, value):
    monkeypatch.setenv(name, raw)
    assert envs.get(name) == value


@pytest.mark.parametrize(("name", "raw", "allowed"), [
    ("WSLM_SMALL_STEP_ROWS", "two", "a whole number >= 0"),
    ("WSLM_INT8_DENSE_ROWS", "-1", "a whole number >= 0"),
    ("WSLM_GGUF_CACHE", "maybe", "1 or 0"),
    ("WSLM_CPU_COMPILE", "sometimes", "auto, 1 or 0"),
    ("WSLM_KERNEL_BACKEND", "cuda", "'triton' or 'torch'"),
    ("WSLM_CPU_KVCACHE_SPACE", "lots", "a number above 0"),
    ("WSLM_CPU_KVCACHE_SPACE", "0", "a number above 0"),
])
def test_bad_values_name_the_variable_and_what_it_takes(monkeypatch, name, raw, allowed):
    monkeypatch.setenv(name, raw)
    with pytest.raises(envs.EnvError) as info:
        envs.get(name)
    message = str(info.value)
    assert message.startswith(f"{name}={raw!r} is not valid") and allowed in message and "unset it" in message
    assert isinstance(info.value, ValueError)


def test_readers_go_through_envs(monkeypatch, tmp_path):
    from wslm import paths
    from wslm.wsl_bridge import winexec

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("WSLM_DATA_DIR", raising=False)
    assert paths.config_dir() == tmp_path / "c" and paths.data_dir() == tmp_path / "c" / "data"
    monkeypatch.setenv("WSLM_WINDOWS_BIN", str(tmp_path))
    assert winexec.fake_bin_dir() == tmp_path and winexec.is_windows()
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    assert winexec.is_admin()
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "yes please")
    with pytest.raises(envs.EnvError, match="WSLM_ASSUME_ADMIN"):
        winexec.is_admin()


def test_envs_and_defaults_are_import_cheap():
    """The GUI and the bridge import them: no torch, no wslm.backend."""
    code = ("import sys, wslm.envs, wslm.defaults; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy') or m.startswith('wslm.backend')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
