"""File → Settings… (Ctrl+,): the app-wide settings in one place. Pages: General (default model, start the
server on launch, models folder, theme), API key (show / copy / regenerate), Documents (where attached
documents are embedded, how much of a file goes in whole), MCP (a page other parts fill: add_page()).

The dialog edits a copy; OK or Apply writes the changed fields into the app's Settings and emits `applied`
with their names, and the main window makes the panels follow (and saves). Cancel changes nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.api_key_field import ApiKeyField
from wslm.gui.models_folder import default_models_dir_text
from wslm.gui.models_model import display_name
from wslm.gui.settings import Settings
from wslm.gui.theme import THEMES

# The fields this dialog edits (Settings' names).
FIELDS = ("model", "start_server_on_launch", "models_dir", "theme", "api_key", "rag_embed_base_url",
          "rag_embed_model", "rag_embed_api_key", "rag_whole_file_tokens", "rag_top_k")

MCP_PLACEHOLDER = "MCP servers (tools the model may call in the chat) are set up on this page."


def _muted(text: str) -> QLabel:
    label = QLabel(text, objectName="Muted", wordWrap=True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class SettingsDialog(QDialog):
    applied = Signal(list)  # the names of the Settings fields that changed
    notice = Signal(str)  # a brief word for the status bar ("API key copied")

    def __init__(self, settings: Settings, models: list | None = None, parent: QWidget | None = None,
                 backend_path: Callable[[str], str] | None = None) -> None:
        """`backend_path`: a folder chosen with Browse… as the backend sees it (C:\\x -> /mnt/c/x under WSL)."""
        super().__init__(parent)
        self.backend_path = backend_path or (lambda path: path)
        self.setWindowTitle("Settings — wslm")
        self.settings = settings
        self.pages: dict[str, QWidget] = {}
        self.nav = QListWidget(objectName="Nav")
        self.nav.setFixedWidth(150)
        self.nav.setAccessibleName("Settings pages")
        self.stack = QStackedWidget()
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)

        self._build_general(models or [])
        self._build_api_key()
        self._build_documents()
        placeholder = QWidget()
        lay = QVBoxLayout(placeholder)
        lay.addWidget(_muted(MCP_PLACEHOLDER))
        lay.addStretch(1)
        self.add_page("MCP", placeholder)
        self.mcp_placeholder = placeholder

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                        | QDialogButtonBox.StandardButton.Apply)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.buttons.button(QDialogButtonBox.StandardButton.Apply).clicked.connect(self.apply)
        body = QHBoxLayout()
        body.addWidget(self.nav)
        body.addWidget(self.stack, 1)
        outer = QVBoxLayout(self)
        outer.addLayout(body, 1)
        outer.addWidget(self.buttons)
        self.nav.setCurrentRow(0)
        self.resize(720, 460)

    # Pages
    def add_page(self, title: str, widget: QWidget) -> None:
        """Add a page (shown in the list on the left); a page of the same title is replaced (the MCP page's
        placeholder, say)."""
        old = self.pages.get(title)
        if old is not None:
            index = self.stack.indexOf(old)
            self.stack.removeWidget(old)
            old.deleteLater()
            self.stack.insertWidget(index, widget)
        else:
            self.stack.addWidget(widget)
            self.nav.addItem(title)
        self.pages[title] = widget
        if self.nav.currentRow() >= 0:
            self.stack.setCurrentIndex(self.nav.currentRow())

    def show_page(self, title: str) -> None:
        for row in range(self.nav.count()):
            if self.nav.item(row).text() == title:
                self.nav.setCurrentRow(row)
                return

    def _page(self, title: str, intro: str) -> QFormLayout:
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.addWidget(QLabel(title, objectName="Title"))
        lay.addWidget(_muted(intro))
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        lay.addLayout(form)
        lay.addStretch(1)
        self.add_page(title, page)
        return form

    def _build_general(self, models: list) -> None:
        s = self.settings
        form = self._page("General", "What the app does when it opens, and where models live.")
        self.model = QComboBox()
        self.model.setAccessibleName("Default model")
        self.model.setToolTip("The model the server loads when it starts (the Server panel's Model)")
        for m in models:
            model_id = m.get("id", "") if isinstance(m, dict) else str(m)
            if model_id:
                label = display_name(m) if isinstance(m, dict) else model_id
                self.model.addItem(label if label == model_id else f"{label}  ({model_id})", model_id)
        if self.model.findData(s.model) < 0:
            self.model.addItem(s.model, s.model)
        self.model.setCurrentIndex(self.model.findData(s.model))
        self.start_on_launch = QCheckBox("Start the server when wslm opens")
        self.start_on_launch.setChecked(s.start_server_on_launch)
        self.models_dir = QLineEdit(s.models_dir, placeholderText=f"default: {default_models_dir_text()}")
        self.models_dir.setAccessibleName("Models folder")
        self.models_dir.setToolTip("Where `wslm models pull` saves models and the server finds them (a folder on "
                                   "the backend's side: a Linux path under WSL, e.g. /home/me/models)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_models_dir)
        line = QHBoxLayout()
        line.addWidget(self.models_dir, 1)
        line.addWidget(browse)
        row = QVBoxLayout()  # the note under its field: a label-less form row of its own leaves a gap
        row.addLayout(line)
        row.addWidget(_muted("A new folder applies to the model list at once and to the server at its next "
                             "start; models already downloaded stay where they are."))
        self.theme = QComboBox()
        self.theme.setAccessibleName("Theme")
        for name, label in THEMES.items():
            self.theme.addItem(label, name)
        self.theme.setCurrentIndex(max(0, self.theme.findData(s.theme)))
        form.addRow("Default model", self.model)
        form.addRow("", self.start_on_launch)
        form.addRow("Models folder", row)
        form.addRow("Theme", self.theme)

    def _browse_models_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Models folder", self.models_dir.text())
        if path:
            self.models_dir.setText(self.backend_path(path))

    def _build_api_key(self) -> None:
        form = self._page("API key", "The key clients must send (Authorization: Bearer <key>) to use the server. "
                                     "Empty: no key, anyone who can reach the port can use it. A new key takes "
                                     "effect when the server (re)starts. The developer view's examples read it "
                                     "from the WSLM_API_KEY environment variable: set that to the key shown here.")
        self.api_key = ApiKeyField(self.settings.api_key)
        self.api_key.copied.connect(self.notice)
        form.addRow("API key", self.api_key)

    def _build_documents(self) -> None:
        s = self.settings
        form = self._page("Documents", "Files attached to a chat: a small one goes in whole; a larger one is cut "
                                       "into passages, embedded, and each message gets the most similar ones.")
        self.embed_url = QLineEdit(s.rag_embed_base_url, placeholderText="the chat's server")
        self.embed_url.setToolTip("The OpenAI-compatible server that embeds attached documents (/v1/embeddings); "
                                  "empty: the chat's own server")
        self.embed_model = QLineEdit(s.rag_embed_model, placeholderText="the chat's model")
        self.embed_model.setToolTip("The embedding model's name on that server")
        self.embed_key = QLineEdit(s.rag_embed_api_key, placeholderText="API key (optional)")
        self.embed_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.whole = QSpinBox(minimum=0, maximum=200_000, singleStep=500, value=s.rag_whole_file_tokens)
        self.whole.setSuffix(" tokens")
        self.whole.setToolTip("A file up to this size (estimated) goes into the chat whole, without embeddings")
        self.top_k = QSpinBox(minimum=1, maximum=50, value=s.rag_top_k)
        self.top_k.setToolTip("How many of the most similar passages each message gets")
        form.addRow("Embed with (URL)", self.embed_url)
        form.addRow("Embedding model", self.embed_model)
        form.addRow("Key", self.embed_key)
        form.addRow("Whole file ≤", self.whole)
        form.addRow("Passages a message", self.top_k)

    # Values
    def values(self) -> dict:
        """What the dialog shows, by Settings field name."""
        return {
            "model": str(self.model.currentData() or self.model.currentText()).strip() or "demo",
            "start_server_on_launch": self.start_on_launch.isChecked(),
            "models_dir": self.models_dir.text().strip(),
            "theme": str(self.theme.currentData() or "dark"),
            "api_key": self.api_key.text(),
            "rag_embed_base_url": self.embed_url.text().strip(),
            "rag_embed_model": self.embed_model.text().strip(),
            "rag_embed_api_key": self.embed_key.text(),
            "rag_whole_file_tokens": self.whole.value(),
            "rag_top_k": self.top_k.value(),
        }

    def apply(self) -> list[str]:
        """Write the changed values into the settings; emit `applied` with their names (none: no signal)."""
        before = dataclasses.asdict(self.settings)
        changed = [name for name, value in self.values().items() if before.get(name) != value]
        for name in changed:
            setattr(self.settings, name, self.values()[name])
        if changed:
            self.applied.emit(changed)
        return changed

    def accept(self) -> None:
        self.apply()
        super().accept()
