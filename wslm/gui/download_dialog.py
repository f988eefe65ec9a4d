"""Download a model: repo id, file pattern (which GGUF quant), mirror endpoint; then live progress."""

from __future__ import annotations

import re

from PySide6.QtCore import QEvent, Signal
from PySide6.QtWidgets import QDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.download_job import PullJob
from wslm.gui.download_view import DownloadProgressView

REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MIRROR_PLACEHOLDER = "optional mirror, e.g. https://hf-mirror.com"


def endpoint_problem(endpoint: str) -> str:
    """What is wrong with a Mirror endpoint field's text ("" when it is usable; empty means the hub)."""
    if endpoint and not endpoint.startswith(("http://", "https://")):
        return "The mirror endpoint must start with http:// or https://"
    return ""


class DownloadDialog(QDialog):
    job_started = Signal(object)  # PullJob
    endpoint_used = Signal(str)  # the Mirror endpoint a download started with: the app remembers it

    def __init__(self, make_job, endpoint: str = "", parent=None) -> None:
        """`make_job(repo, pattern, endpoint) -> PullJob` comes from the models panel (it knows the target)."""
        super().__init__(parent)
        self.setWindowTitle("Download a model")
        self.setMinimumWidth(520)
        self.make_job = make_job
        self.job: PullJob | None = None
        self.progress_view: DownloadProgressView | None = None
        self.repo = QLineEdit(placeholderText="e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        self.pattern = QLineEdit(placeholderText="optional, e.g. *Q4_K_M.gguf")
        self.endpoint = QLineEdit(endpoint, placeholderText=MIRROR_PLACEHOLDER)
        form = QFormLayout()
        form.addRow("Repository", self.repo)
        form.addRow("File pattern", self.pattern)
        form.addRow("Mirror endpoint", self.endpoint)
        self.error = QLabel(objectName="Muted")
        self.error.setWordWrap(True)
        self.start_button = QPushButton("Download", objectName="Primary")
        self.start_button.clicked.connect(self.start)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        # Enter in a field downloads: without a default button QDialog presses the first auto-default one,
        # which was Close.
        self.start_button.setDefault(True)
        close.setAutoDefault(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.error, 1)
        buttons.addWidget(close)
        buttons.addWidget(self.start_button)
        self.lay = QVBoxLayout(self)
        self.lay.addLayout(form)
        self.lay.addLayout(buttons)

    def start(self) -> PullJob | None:
        repo = self.repo.text().strip()
        if not REPO_RE.match(repo):
            self.error.setText("<span style='color:#f85149;'>Enter a repository id like owner/name.</span>")
            return None
        endpoint = self.endpoint.text().strip()
        if problem := endpoint_problem(endpoint):
            self.error.setText(f"<span style='color:#f85149;'>{problem}</span>")
            return None
        self.error.setText("")
        self.endpoint_used.emit(endpoint)
        self.job = self.make_job(repo, self.pattern.text(), endpoint)
        if self.progress_view is not None:  # a second download: one card, the latest
            self.progress_view.dismiss()
        self.progress_view = DownloadProgressView(self.job, self)
        self.lay.insertWidget(1, self.progress_view)
        self.start_button.setEnabled(False)
        self.job.finished.connect(lambda _state: self.start_button.setEnabled(True))
        self.job.start()
        self.job_started.emit(self.job)
        return self.job

    def event(self, event: QEvent) -> bool:
        handled = super().event(event)
        if event.type() == QEvent.Type.LayoutRequest:  # the card appeared, or its text changed
            self._fit_height()
        return handled

    def _fit_height(self) -> None:
        """Grow to what the card needs (a wrapped error, the buttons under it): a dialog does not grow by
        itself when a word-wrapped label gets longer, and the card was squeezed until "Retry" read "Retrv"."""
        need = self.lay.totalHeightForWidth(self.width()) if self.lay.hasHeightForWidth() else -1
        need = max(need, self.lay.totalMinimumSize().height())
        if self.minimumHeight() != need:
            self.setMinimumHeight(need)
        if self.height() < need:
            self.resize(self.width(), need)
