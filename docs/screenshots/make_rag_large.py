"""rag-large-file.png: a cited answer from a large attached file, offline, with nothing set up: the app starts
its own server on the demo model (which also serves the shipped embedding model, all-minilm-l6-v2, in its
pool), a ~11 KB notebook with one unique fact is attached to a new chat with the default Documents settings,
and a question about the fact is sent. Nothing is staged: the passages, their embeddings, the request and the
demo model's reply are real (the 135M demo's wording may be poor; the "Sources:" line is what this shows;
the cited passage is unfolded by a click).

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_rag_large.py [OUT_DIR]"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(out: Path) -> Path:
    cfg = Path(tempfile.mkdtemp(prefix="wslm-shots-"))
    os.environ.update(WSLM_CONFIG_DIR=str(cfg), HF_HUB_CACHE=str(cfg / "hf"), WSLM_MODELS_DIR=str(cfg / "models"))
    from PySide6.QtCore import QUrl
    from test_gui_documents import FACT, QUESTION, document

    from wslm.gui.app import make_app, process_events_for
    from wslm.gui.main_window import MainWindow
    from wslm.gui.settings import Settings

    make_app()
    w = MainWindow(Settings(first_run_done=True, target={"kind": "local"}, port=free_port(), max_model_len=2048,
                            serve_extra_args="--kv-cache-memory 128MiB", max_tokens=48, temperature=0.0),
                   watch=False)
    w.resize(1280, 800)
    w.show()
    process_events_for(60, until=lambda: bool(w.server_panel.models))  # `models list`, then the server
    w.server_panel.start()
    process_events_for(300, until=lambda: w.server.state in ("ready", "crashed"))
    w.sidebar.select("chat")
    panel = w.chat_panel
    panel.new_chat()
    notebook = cfg / "notebook.md"
    notebook.write_text(document(24))
    panel.attach_files([str(notebook)])
    process_events_for(120, until=lambda: not panel.attachments.busy())
    panel.input.setPlainText(QUESTION)
    panel.send()
    process_events_for(180, until=lambda: not w.session.busy)
    reply_row = panel.session.messages.rowCount() - 1
    sources = panel.session.messages.messages()[-1].stats.get("sources") or []
    cited = next((i for i, s in enumerate(sources) if FACT in s["text"]), None)
    if cited is not None:
        panel.view._on_link(QUrl(f"src:{reply_row}:{cited}"))
    process_events_for(1)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rag-large-file.png"
    w.grab().save(str(path))
    w.confirm_close = lambda: True
    w.close()
    return path


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent))
