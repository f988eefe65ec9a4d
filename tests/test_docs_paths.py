"""Every repository path that README.md and docs/ name exists (issue 33 item 5): backticked paths under the
project's folders and relative link targets. Docs that name a file which moved or never landed are caught
here, not by a reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("wslm", "tests", "bench", "docs", "installer", ".ci")
# `wslm/backend/quant/int4.py`, `bench/realsize.py`, `tests/test_x.py::test_y` (the file part), `docs/x.md#y`.
_FOLDER = "|".join(re.escape(f) for f in FOLDERS)
TICKED = re.compile(r"`((?:" + _FOLDER + r")/[\w./-]+?)(?:::[\w\[\]-]+|#[\w-]+)?`")
LINKED = re.compile(r"\]\(([^)\s]+)\)")
# A bare source file name in backticks (`decode_compiled.py`): some file of the repository has that name.
SOURCE = re.compile(r"`(?:[\w.-]+/)*([\w-]+\.(?:py|c|h|sh|ps1))`")
# Files of other projects the docs cite by name (vLLM's own tests, llama.cpp's tools).
FOREIGN = re.compile(r"^(openai|serve)/|^test_logprob_token_ids_validation\.py$|^convert_hf_to_gguf\.py$")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _named(doc: Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    out = {m.group(1) for m in TICKED.finditer(text)}
    for m in LINKED.finditer(text):
        target = m.group(1).split("#", 1)[0]
        if target and not re.match(r"^[a-z]+:", target):  # http:, https:, mailto: are not ours to check
            out.add(str((doc.parent / target).resolve().relative_to(ROOT)) if not target.startswith("/") else target)
    return out


def test_every_named_path_exists():
    missing = []
    for doc in _docs():
        for name in sorted(_named(doc)):
            path = name.rstrip("/.")
            if any(c in path for c in "*{}<>") or path.endswith("/NAME"):
                continue  # patterns and placeholders
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert missing == []


def test_every_named_source_file_exists():
    """Bare names too: architecture.md once named cpu_compiled.py and decoder_pooling.py long after they
    were renamed. Names of other projects' files are listed in FOREIGN."""
    have = {p.name for p in ROOT.rglob("*") if not {".venv", ".git", "node_modules"} & set(p.parts)}
    missing = []
    for doc in _docs():
        for m in SOURCE.finditer(doc.read_text(encoding="utf-8")):
            whole = m.group(0).strip("`")
            if m.group(1) not in have and not FOREIGN.search(whole):
                missing.append(f"{doc.relative_to(ROOT)}: {whole}")
    assert missing == []
