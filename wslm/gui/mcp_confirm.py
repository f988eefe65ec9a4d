"""The question before a tool call: "Run add on calc?" with its arguments, answered Allow once, Always allow
this tool, or Deny (Esc and closing the window deny)."""

from __future__ import annotations

import json

from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.tool_loop import ALWAYS, DENY, ONCE


class ToolConfirmDialog(QDialog):
    """Non-blocking (open()): `decision` is set and finished() emitted when the user answers."""

    def __init__(self, request: dict, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ToolConfirmDialog")
        self.request = request
        self.decision = DENY
        self.answered = False
        tool, server = str(request.get("tool") or request.get("function")), str(request.get("server") or "")
        self.setWindowTitle(f"Run the tool {tool}?")
        layout = QVBoxLayout(self)
        head = QLabel(f"The model wants to call <b>{tool}</b> on the MCP server <b>{server}</b> with:")
        head.setWordWrap(True)
        layout.addWidget(head)
        args = QPlainTextEdit(json.dumps(request.get("arguments") or {}, indent=2, ensure_ascii=False))
        args.setReadOnly(True)
        args.setMaximumHeight(160)
        layout.addWidget(args)
        note = QLabel("A tool can read or change things on this computer or online: allow only what you expect.")
        note.setWordWrap(True)
        layout.addWidget(note)
        row = QHBoxLayout()
        row.addStretch(1)
        self.once_button = QPushButton("Allow once")
        self.always_button = QPushButton(f"Always allow {tool}")
        self.deny_button = QPushButton("Deny")
        for button, decision in ((self.deny_button, DENY), (self.always_button, ALWAYS), (self.once_button, ONCE)):
            button.clicked.connect(lambda _=False, d=decision: self._answer(d))
            row.addWidget(button)
        self.once_button.setDefault(True)
        layout.addLayout(row)

    def _answer(self, decision: str) -> None:
        self.decision = decision
        self.accept() if decision != DENY else self.reject()


def ask_tool_confirmation(parent: QWidget | None, request: dict, answer) -> ToolConfirmDialog:
    """Show the question (window-modal, not blocking the event loop) and call answer(row, decision) once
    the user has answered. Returns the dialog (tests click its buttons)."""
    dialog = ToolConfirmDialog(request, parent)

    def finished(_code: int) -> None:
        if not dialog.answered:  # once: closing it again (answered on the card meanwhile) says nothing
            dialog.answered = True
            answer(int(request.get("row", -1)), dialog.decision)
            dialog.deleteLater()

    dialog.finished.connect(finished)
    dialog.open()
    return dialog
