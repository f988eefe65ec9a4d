"""Progress of one PullJob: overall and per-file bars, speed, ETA, Cancel / Resume."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout

from wslm.gui.download_job import CANCELLED, DONE, FAILED, RUNNING, PullJob
from wslm.gui.format import human_bytes, human_duration


class DownloadProgressView(QFrame):
    def __init__(self, job: PullJob, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self.job = job
        self.title = QLabel(f"<b>{job.repo}</b>" + (f"  <span style='color:#8d96a8;'>{job.file_pattern}</span>"
                                                   if job.file_pattern else ""))
        self.total_bar = QProgressBar(maximum=1000)
        self.file_label = QLabel(objectName="Muted")
        self.file_bar = QProgressBar(maximum=1000)
        self.file_bar.setFixedHeight(10)
        self.file_bar.setTextVisible(False)
        self.info = QLabel(objectName="Muted")
        self.info.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(job.cancel)
        self.resume_button = QPushButton("Resume", objectName="Primary")
        self.resume_button.clicked.connect(job.start)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.resume_button)
        buttons.addWidget(self.cancel_button)
        self.dismiss_button = QPushButton("Dismiss")
        self.dismiss_button.clicked.connect(self.dismiss)
        buttons.addWidget(self.dismiss_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 10, 12, 10)
        lay.addWidget(self.title)
        lay.addWidget(self.total_bar)
        lay.addWidget(self.file_label)
        lay.addWidget(self.file_bar)
        lay.addWidget(self.info)  # its own row: a long error wraps instead of being cut beside the buttons
        lay.addLayout(buttons)
        job.changed.connect(self.refresh)
        self.refresh()

    def dismiss(self) -> None:
        """Remove the card now (not at the next event loop turn), so its layout closes the gap at once."""
        parent_layout = self.parentWidget().layout() if self.parentWidget() else None
        self.hide()
        if parent_layout is not None:
            parent_layout.removeWidget(self)
        self.setParent(None)
        self.deleteLater()

    def refresh(self) -> None:
        p = self.job.progress
        known = p.total_bytes > 0
        # No size yet (starting, or failed before the hub answered): no "0% · 0 B / 0 B" bar.
        self.total_bar.setVisible(known)
        self.total_bar.setValue(int(p.fraction * 1000))
        self.total_bar.setFormat(f"{p.fraction * 100:.0f}%  ·  {human_bytes(p.bytes)} / {human_bytes(p.total_bytes)}")
        # The second bar is the file being fetched right now, and says so; only while it runs.
        show_file = p.state == RUNNING and bool(p.file)
        self.file_bar.setVisible(show_file)
        self.file_label.setVisible(show_file)
        self.file_bar.setValue(int(p.file_fraction * 1000))
        self.file_label.setText(f"Now: {p.file}  {human_bytes(p.file_bytes)} / {human_bytes(p.file_total)}"
                                if p.file else "")
        if p.state == RUNNING and not p.message:
            text = f"{human_bytes(p.speed_bps)}/s · {human_duration(p.eta_s)} left"
        else:
            text = p.message
        color = {FAILED: "#f85149", DONE: "#3fb950"}.get(p.state)
        text = html.escape(text or "")
        self.info.setText(f"<span style='color:{color};'>{text}</span>" if color else text)
        self.cancel_button.setVisible(p.state == RUNNING)
        self.resume_button.setText("Retry" if p.state == FAILED else "Resume")
        self.resume_button.setVisible(p.state in (CANCELLED, FAILED))
        self.dismiss_button.setVisible(p.state in (DONE, CANCELLED, FAILED))
