"""Where the chat sends: our wslm server (the Server panel's), or any OpenAI-compatible URL with a key."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QButtonGroup, QLabel, QLineEdit, QPushButton, QRadioButton, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.settings import Settings


class ConnectionBox(QWidget):
    """Signals: edited (the choice, URL or key changed: read use_server()/url_text()/key_text()),
    list_requested ("List the URL's models")."""

    edited = Signal()
    list_requested = Signal()

    def __init__(self, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Connection", objectName="Muted"))
        # Short labels (the column is narrow at the smallest window); the tooltips say it whole.
        self.use_server = QRadioButton("wslm server")
        self.use_server.setToolTip("The server you start in the Server panel")
        self.use_custom = QRadioButton("Another URL")
        self.use_custom.setToolTip("Any OpenAI-compatible server: its URL and key below")
        group = QButtonGroup(self)
        group.addButton(self.use_server)
        group.addButton(self.use_custom)
        (self.use_server if settings.chat_use_server else self.use_custom).setChecked(True)
        self.use_server.toggled.connect(self.edited)
        self.url = QLineEdit(settings.chat_base_url, placeholderText="http://host:port/v1")
        self.key = QLineEdit(settings.chat_api_key, placeholderText="API key (optional)")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        for w in (self.url, self.key):
            w.editingFinished.connect(self.edited)
        self.list_button = QPushButton("List its models")
        self.list_button.setToolTip("Ask the server at the URL which models it serves (into the model box above "
                                    "the chat)")
        self.list_button.clicked.connect(self.list_requested)
        for w in (self.use_server, self.use_custom, self.url, self.key, self.list_button):
            lay.addWidget(w)

    def show_server(self, url: str) -> None:
        """Our server: its URL shown read-only (the field says where the chat goes)."""
        self.url.setEnabled(False)
        self.key.setEnabled(False)
        self.url.setText(url)

    def show_custom(self, url: str) -> None:
        self.url.setEnabled(True)
        self.key.setEnabled(True)
        self.url.setText(url)
