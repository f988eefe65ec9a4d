"""Discover: search the hub (through the mirror when one is set) for models the engine runs, see each
weight file's quantization, size and whether it fits this machine's GPU or RAM, download with one click;
recommended picks for the memory there is."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import defaults
from wslm.gui import theme
from wslm.gui.cli_process import JsonProcess
from wslm.gui.download_dialog import MIRROR_PLACEHOLDER, endpoint_problem
from wslm.gui.format import human_bytes
from wslm.wsl_bridge.launcher import Target

GIB = 1 << 30
OVERHEAD = 512 << 20  # KV pool and runtime beside the weights (the server's CPU default starts at 64 MiB)
# (smallest memory in GiB it is picked for, repo): well-known instruct models the engine runs.
RECOMMENDED = [
    (0, "HuggingFaceTB/SmolLM2-360M-Instruct"),
    (0, "Qwen/Qwen3-0.6B-GGUF"),
    (4, "Qwen/Qwen3-1.7B-GGUF"),
    (6, "bartowski/Llama-3.2-3B-Instruct-GGUF"),
    (8, "Qwen/Qwen3-4B-GGUF"),
    (12, "Qwen/Qwen3-8B-GGUF"),
    (24, "Qwen/Qwen3-14B-GGUF"),
]


def fit_verdict(size_bytes: int, vram_bytes: int | None, gpu_share: float, ram_bytes: int | None) -> tuple[str, str]:
    """(text, color) for one weight file: fits the GPU, runs on the CPU from RAM, or is too big."""
    need = size_bytes + OVERHEAD
    if vram_bytes and need <= vram_bytes * gpu_share:
        return "fits GPU", theme.OK
    if ram_bytes and need <= ram_bytes * 0.7:
        return ("fits RAM (CPU)" if not vram_bytes else "too big for GPU · fits RAM"), theme.WARN
    return "too big", theme.ERROR


def recommended(vram_bytes: int | None, ram_bytes: int | None) -> list[str]:
    memory_gib = max(vram_bytes or 0, (ram_bytes or 0) // 2) / GIB
    picks = [repo for need, repo in RECOMMENDED if need <= memory_gib]
    return picks[-4:]  # the largest few that fit


class DiscoverDialog(QDialog):
    download_requested = Signal(str, str)  # repo, file pattern ("" = the whole checkpoint)
    endpoint_changed = Signal(str)  # the Mirror endpoint field, once used: the app remembers it

    def __init__(self, target: Target, endpoint: str = "", vram_bytes: int | None = None,
                 gpu_share: float = defaults.GPU_MEMORY_UTILIZATION,
                 ram_bytes: int | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Discover models")
        self.resize(860, 520)
        self.target = target
        self.endpoint = endpoint
        self.vram_bytes, self.gpu_share, self.ram_bytes = vram_bytes, gpu_share, ram_bytes
        self.results: list[dict] = []
        self._proc: JsonProcess | None = None
        self.query = QLineEdit(placeholderText="Search the hub, e.g. qwen3 gguf")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search", objectName="Primary")
        self.search_button.clicked.connect(self.search)
        top = QHBoxLayout()
        top.addWidget(self.query, 1)
        top.addWidget(self.search_button)
        # The same Mirror endpoint as the Download dialog's (remembered by the app): search and download
        # go through it, e.g. where huggingface.co cannot be reached.
        self.mirror = QLineEdit(endpoint, placeholderText=MIRROR_PLACEHOLDER)
        self.mirror.setToolTip("Searches and downloads go through this endpoint; empty: huggingface.co")
        mirror_row = QHBoxLayout()
        mirror_row.addWidget(QLabel("Mirror endpoint", objectName="Muted"))
        mirror_row.addWidget(self.mirror, 1)
        self.status = QLabel("Search huggingface.co or the mirror set above.", objectName="Muted")
        self.status.setWordWrap(True)
        picks = recommended(vram_bytes, ram_bytes)
        self.picks = QLabel("Recommended for this machine: " + " · ".join(
            f'<a href="{html.escape(p)}">{html.escape(p)}</a>' for p in picks))
        self.picks.linkActivated.connect(lambda repo: (self.query.setText(repo), self.search()))
        self.list = QListWidget()
        self.list.currentRowChanged.connect(self._show_files)
        self.files = QTableWidget(0, 4)
        self.files.setHorizontalHeaderLabels(["File", "Quant", "Size", "Fits?"])
        self.files.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.files.verticalHeader().hide()
        self.files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2, 3):  # the verdict ("too big for GPU · fits RAM") is read whole, the file name gives way
            self.files.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.files.doubleClicked.connect(lambda _i: self.download())
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.list)
        split.addWidget(self.files)
        split.setSizes([300, 540])
        self.download_button = QPushButton("⬇  Download", objectName="Primary")
        self.download_button.clicked.connect(self.download)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        bottom = QHBoxLayout()
        bottom.addStretch(1)
        bottom.addWidget(close)
        bottom.addWidget(self.download_button)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addLayout(mirror_row)
        lay.addWidget(self.picks)
        lay.addWidget(self.status)
        lay.addWidget(split, 1)
        lay.addLayout(bottom)

    def search(self) -> None:
        text = self.query.text().strip()
        if not text or (self._proc and self._proc.running):
            return
        endpoint = self.mirror.text().strip()
        if problem := endpoint_problem(endpoint):
            self.status.setText(f"<span style='color:{theme.ERROR};'>⚠ {problem} (“Mirror endpoint” above)</span>")
            return
        if endpoint != self.endpoint:
            self.endpoint = endpoint
            self.endpoint_changed.emit(endpoint)
        args = ["models", "search", text, "--json"] + (["--endpoint", endpoint] if endpoint else [])
        proc = JsonProcess(self)
        got: list[dict] = []
        proc.event.connect(got.append)
        proc.finished.connect(lambda code, tail: self._found(code, tail, got))
        self._proc = proc
        self.status.setText(f"Searching for “{html.escape(text)}”…")
        proc.start(self.target.wslm_argv(args))

    def _found(self, code: int, tail: str, events: list[dict]) -> None:
        payload = next((e for e in events if isinstance(e.get("models"), list)), None)
        if code != 0 or payload is None:
            err = next((e.get("message") for e in events if e.get("event") == "error"), "") or tail.strip()[-300:]
            where = f"{self.endpoint} (“Mirror endpoint” above)" if self.endpoint else \
                "huggingface.co: if it cannot be reached from here, set a “Mirror endpoint” above"
            self.status.setText(f"<span style='color:{theme.ERROR};'>⚠ {html.escape(err or 'search failed')}</span>"
                                f"<br>Searched {html.escape(where)}.")
            return
        self.results = payload["models"]
        self.list.clear()
        for m in self.results:
            item = QListWidgetItem(f"{m['id']}\n{len(m['files'])} file(s) · {m.get('downloads', 0):,} downloads")
            self.list.addItem(item)
        self.status.setText(f"{len(self.results)} model(s) with weights the engine can load"
                            if self.results else "Nothing found: try other words.")
        if self.results:
            self.list.setCurrentRow(0)

    def _show_files(self, row: int) -> None:
        self.files.setRowCount(0)
        if not (0 <= row < len(self.results)):
            return
        for f in self.results[row]["files"]:
            r = self.files.rowCount()
            self.files.insertRow(r)
            text, color = fit_verdict(int(f["size_bytes"]), self.vram_bytes, self.gpu_share, self.ram_bytes)
            cells = [f["name"], f.get("quantization") or ("16-bit" if f.get("format") == "hf" else "—"),
                     human_bytes(f["size_bytes"]), text]
            for c, value in enumerate(cells):
                item = QTableWidgetItem(value)
                if c == 3:
                    item.setForeground(QColor(color))
                self.files.setItem(r, c, item)
        self.files.selectRow(0)

    def download(self) -> None:
        row, file_row = self.list.currentRow(), self.files.currentRow()
        if not (0 <= row < len(self.results)) or file_row < 0:
            # Said, not silently ignored: the button looked like it did nothing.
            self.status.setText(f"<span style='color:{theme.WARN};'>Nothing to download yet: search for a model, "
                                "then pick one of its files.</span>" if not self.results else
                                f"<span style='color:{theme.WARN};'>Pick a file in the list to download.</span>")
            return
        f = self.results[row]["files"][file_row]
        self.download_requested.emit(self.results[row]["id"], "" if f.get("format") == "hf" else f["name"])
        self.status.setText(f"Downloading {html.escape(self.results[row]['id'])}: see the Models panel.")
