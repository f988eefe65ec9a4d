"""Chat panel: conversation list | transcript + input | per-conversation parameters and connection.

A view over ChatSession; the only state kept here is what the widgets show."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.chat_model import IdRole
from wslm.gui.chat_session import ChatSession
from wslm.gui.chat_view import ChatView
from wslm.gui.model_lister import ModelLister
from wslm.gui.settings import Settings


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ChatPanel(QWidget):
    settings_changed = Signal()

    def __init__(self, session: ChatSession, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self.server_url = ""  # set by the main window while our server is ready
        self.server_model = ""
        self.server_key = ""
        self._loading_params = True  # widgets being filled from the conversation: not a user edit
        self.lister = ModelLister(self)
        self.lister.listed.connect(self._on_models)
        self.lister.failed.connect(lambda err: self.model_combo.setToolTip(f"Could not list models: {err}"))

        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(self._build_list())
        split.addWidget(self._build_center())
        split.addWidget(self._build_params())
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setStretchFactor(2, 0)
        split.setSizes([230, 700, 270])
        split.setChildrenCollapsible(False)
        split.setHandleWidth(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)

        session.busy_changed.connect(self._on_busy)
        session.current_changed.connect(self._on_current)
        session.reply_failed.connect(self._on_failed)
        self.view.regenerate_requested.connect(self._regenerate)
        self._apply_connection()
        first = session.conversations.conversation(0)
        if first is not None and not session.messages.conversation_id:
            session.open(first.id)  # reopen the latest chat, as chat apps do
        self._on_current(session.messages.conversation_id)

    # Layout
    def _build_list(self) -> QWidget:
        box = QWidget()
        box.setMinimumWidth(190)
        lay = QVBoxLayout(box)
        lay.setContentsMargins(10, 10, 6, 10)
        self.new_button = QPushButton("＋  New chat")
        self.new_button.setObjectName("Primary")
        self.new_button.clicked.connect(self.new_chat)
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.session.conversations.set_search)
        self.list = QListView()
        self.list.setModel(self.session.conversations)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.clicked.connect(self._open_index)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._list_menu)
        self.list.installEventFilter(self)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        return box

    def _build_center(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(8, 10, 8, 10)
        head = QHBoxLayout()
        self.title = QLabel("New chat", objectName="Title")
        self.connection_label = QLabel(objectName="Muted")
        head.addWidget(self.title, 1)
        head.addWidget(self.connection_label)
        lay.addLayout(head)
        self.view = ChatView(self.session.messages)
        lay.addWidget(self.view, 1)
        self.error_label = QLabel(objectName="Muted")
        self.error_label.setWordWrap(True)
        self.error_label.hide()
        lay.addWidget(self.error_label)
        composer = QFrame(objectName="Card")
        row = QHBoxLayout(composer)
        row.setContentsMargins(8, 8, 8, 8)
        self.input = ChatInput()
        self.input.setPlaceholderText("Send a message  (Enter to send, Shift+Enter for a new line)")
        self.input.setFixedHeight(76)
        self.input.setStyleSheet("QPlainTextEdit { border: none; background: transparent; }")
        self.input.submitted.connect(self.send)
        self.send_button = QPushButton("Send", objectName="Primary")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.clicked.connect(self.session.stop)
        self.stop_button.hide()
        buttons = QVBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        lay.addWidget(composer)
        return box

    def _build_params(self) -> QWidget:
        box = QWidget()
        box.setMinimumWidth(240)
        lay = QVBoxLayout(box)
        lay.setContentsMargins(6, 10, 10, 10)
        lay.addWidget(QLabel("System prompt", objectName="Muted"))
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setFixedHeight(90)
        self.system_prompt.textChanged.connect(self._params_changed)
        lay.addWidget(self.system_prompt)
        form = QFormLayout()
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.max_tokens = QSpinBox(minimum=1, maximum=131072, singleStep=128)
        for w in (self.temperature, self.top_p, self.max_tokens):
            w.valueChanged.connect(self._params_changed)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top P", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        lay.addLayout(form)

        lay.addSpacing(10)
        lay.addWidget(QLabel("Connection", objectName="Muted"))
        self.use_server = QRadioButton("wslm server (Server panel)")
        self.use_custom = QRadioButton("Any OpenAI-compatible URL")
        group = QButtonGroup(self)
        group.addButton(self.use_server)
        group.addButton(self.use_custom)
        (self.use_server if self.settings.chat_use_server else self.use_custom).setChecked(True)
        self.use_server.toggled.connect(self._connection_edited)
        self.url = QLineEdit(self.settings.chat_base_url, placeholderText="http://host:port/v1")
        self.key = QLineEdit(self.settings.chat_api_key, placeholderText="API key (optional)")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        for w in (self.url, self.key):
            w.editingFinished.connect(self._connection_edited)
        model_row = QHBoxLayout()
        self.model_combo = QComboBox(editable=True)
        self.model_combo.lineEdit().setPlaceholderText("model")  # (QComboBox.setPlaceholderText would unselect)
        if self.settings.chat_model:
            self.model_combo.addItem(self.settings.chat_model)
        self.model_combo.currentTextChanged.connect(self._model_changed)
        refresh = QPushButton("List")
        refresh.setToolTip("Ask the server which models it serves")
        refresh.clicked.connect(self.refresh_models)
        model_row.addWidget(self.model_combo, 1)
        model_row.addWidget(refresh)
        for w in (self.use_server, self.use_custom, self.url, self.key):
            lay.addWidget(w)
        lay.addLayout(model_row)
        lay.addStretch(1)
        return box

    # Conversations
    def new_chat(self) -> None:
        self.session.new_conversation()
        self.list.setCurrentIndex(self.session.conversations.index(0))
        self.input.setFocus()

    def _open_index(self, index: QModelIndex) -> None:
        self.session.open(int(index.data(IdRole)))

    def _list_menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(index))
        menu.addAction("Delete", lambda: self._delete(index.row()))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def eventFilter(self, obj, event) -> bool:
        if obj is self.list and event.type() == QEvent.Type.KeyPress and event.key() == Qt.Key.Key_Delete:
            idx = self.list.currentIndex()
            if idx.isValid():
                self._delete(idx.row())
                return True
        return super().eventFilter(obj, event)

    def _delete(self, row: int, confirm: bool = True) -> None:
        conv = self.session.conversations.conversation(row)
        if conv is None:
            return
        if confirm and QMessageBox.question(self, "Delete chat", f"Delete “{conv.title}” and all its messages?") \
                != QMessageBox.StandardButton.Yes:
            return
        self.session.delete_conversation(row)

    def _on_current(self, conv_id: int) -> None:
        conv = self.session.current()
        self._loading_params = True
        self.title.setText(conv.title if conv else "New chat")
        self.system_prompt.setPlainText(conv.system_prompt if conv else self.settings.system_prompt)
        self.temperature.setValue(conv.temperature if conv else self.settings.temperature)
        self.top_p.setValue(conv.top_p if conv else self.settings.top_p)
        self.max_tokens.setValue(conv.max_tokens if conv else self.settings.max_tokens)
        self._loading_params = False
        row = self.session.conversations.row_of(conv_id) if conv_id else -1
        if row >= 0:
            self.list.setCurrentIndex(self.session.conversations.index(row))
        self.error_label.hide()

    def _params_changed(self, *_args) -> None:
        if self._loading_params:
            return
        params = {"system_prompt": self.system_prompt.toPlainText(), "temperature": self.temperature.value(),
                  "top_p": self.top_p.value(), "max_tokens": self.max_tokens.value()}
        if self.session.current():
            self.session.update_params(**params)
        else:  # no chat yet: these become the defaults for new chats
            self.settings.system_prompt = params["system_prompt"]
            self.settings.temperature = params["temperature"]
            self.settings.top_p = params["top_p"]
            self.settings.max_tokens = params["max_tokens"]
            self.session.defaults.update(params)
            self.settings_changed.emit()

    # Sending
    def send(self) -> None:
        text = self.input.toPlainText()
        if not text.strip() or self.session.busy:
            return
        if not self.session.base_url:
            self._show_error("No server to talk to: start one in the Server panel, or set a URL under Connection.")
            return
        if self.session.send(text):
            self.input.clear()
            self.title.setText(self.session.current().title)
            self.error_label.hide()

    def _regenerate(self, row: int) -> None:
        self.session.regenerate(row)

    def _on_busy(self, busy: bool) -> None:
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)

    def _on_failed(self, kind: str, message: str) -> None:
        # The message is shown in the transcript; the typed text was saved there too.
        self.error_label.hide()

    def _show_error(self, text: str) -> None:
        self.error_label.setText(f"<span style='color:#f85149;'>⚠</span> {text}")
        self.error_label.show()

    # Connection
    def set_server(self, url: str, model: str, api_key: str) -> None:
        """Called when our server becomes ready (url "") when it stops."""
        self.server_url, self.server_model, self.server_key = url, model, api_key
        self._apply_connection()

    def _connection_edited(self, *_args) -> None:
        self.settings.chat_use_server = self.use_server.isChecked()
        self.settings.chat_base_url = self.url.text().strip()
        self.settings.chat_api_key = self.key.text()
        self.settings_changed.emit()
        self._apply_connection()
        if not self.settings.chat_use_server:
            self.refresh_models()

    def _model_changed(self, text: str) -> None:
        self.session.model = text.strip()
        if not self.settings.chat_use_server:
            self.settings.chat_model = text.strip()
            self.settings_changed.emit()

    def _apply_connection(self) -> None:
        use_server = self.settings.chat_use_server
        self.url.setEnabled(not use_server)
        self.key.setEnabled(not use_server)
        if use_server:
            self.session.set_endpoint(self.server_url, self.server_key, self.server_model or None)
            if self.server_model:
                self._set_models([self.server_model])
            if self.server_url:
                self.connection_label.setText(f"<span style='color:#3fb950;'>●</span> wslm server · {self.server_model}")
                self.view.set_empty_hint(f"Talking to {self.server_model} on the wslm server.")
            else:
                self.connection_label.setText("<span style='color:#8d96a8;'>●</span> server not running")
                self.view.set_empty_hint("Start the server in the Server panel, or connect to any "
                                         "OpenAI-compatible URL under Connection.")
        else:
            url = normalize_base_url(self.settings.chat_base_url)
            self.session.set_endpoint(url, self.settings.chat_api_key, self.model_combo.currentText().strip())
            self.connection_label.setText(f"<span style='color:#4f9dff;'>●</span> {url}")
            self.view.set_empty_hint(f"Talking to {url}.")

    def refresh_models(self) -> None:
        if self.session.base_url:
            self.lister.fetch(self.session.base_url, self.session.api_key)

    def _on_models(self, ids: list) -> None:
        self._set_models(ids)

    def _set_models(self, ids: list) -> None:
        current = self.model_combo.currentText()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        self.model_combo.addItems(ids)
        self.model_combo.setCurrentText(current if current in ids or not ids else ids[0])
        self.model_combo.blockSignals(False)
        self.session.model = self.model_combo.currentText().strip()
