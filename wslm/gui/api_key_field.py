"""An API key field a user can read, copy and regenerate: masked by default, Show reveals it, Copy puts it on
the clipboard (a masked QLineEdit copies nothing on Ctrl+C, by Qt's design), Generate makes a new one.

Used by the Server panel and the Settings dialog alike."""

from __future__ import annotations

import secrets

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QPushButton, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)

KEY_PREFIX = "sk-wslm-"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(24)


class ApiKeyField(QWidget):
    """The key's line edit (`edit`) with Show/Hide, Copy and Generate buttons."""

    edited = Signal()  # the key changed by the user: typed (editing finished) or generated
    copied = Signal(str)  # a word for the status bar ("API key copied")

    def __init__(self, key: str = "", placeholder: str = "none (anyone on this machine can connect)",
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.edit = QLineEdit(key, placeholderText=placeholder)
        self.edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.edit.setCursorPosition(0)
        self.edit.setAccessibleName("API key")
        self.show_button = QPushButton("Show")
        self.show_button.setCheckable(True)
        self.show_button.setToolTip("Show the key as text (it can then be selected and copied with Ctrl+C)")
        self.show_button.toggled.connect(self.set_revealed)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the key to the clipboard")
        self.copy_button.clicked.connect(self.copy)
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("Make a new random key (clients need the new one; restart the server to "
                                        "apply it)")
        self.generate_button.clicked.connect(self.generate)
        self.edit.editingFinished.connect(self.edited)
        self.edit.textChanged.connect(lambda t: self.copy_button.setEnabled(bool(t.strip())))
        self.copy_button.setEnabled(bool(key.strip()))
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        lay.addWidget(self.edit, 1)
        for b in (self.show_button, self.copy_button, self.generate_button):
            lay.addWidget(b)
        self.setFocusProxy(self.edit)

    def text(self) -> str:
        return self.edit.text().strip()

    def set_text(self, key: str) -> None:
        """Set without announcing it as the user's edit."""
        self.edit.setText(key)
        self.edit.setCursorPosition(0)

    def revealed(self) -> bool:
        return self.edit.echoMode() == QLineEdit.EchoMode.Normal

    def set_revealed(self, shown: bool) -> None:
        self.edit.setEchoMode(QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password)
        self.show_button.setText("Hide" if shown else "Show")
        if self.show_button.isChecked() != shown:
            self.show_button.setChecked(shown)

    def copy(self) -> None:
        key = self.text()
        if not key:
            return
        QGuiApplication.clipboard().setText(key)
        self.copied.emit("API key copied to the clipboard")

    def generate(self) -> None:
        self.edit.setText(new_api_key())
        self.edit.setCursorPosition(0)
        self.edited.emit()
