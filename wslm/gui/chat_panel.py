"""Chat panel: conversation list | transcript + input | per-conversation parameters and connection.

A view over ChatSession; the only state kept here is what the widgets show."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QEvent, QModelIndex, QRect, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QStyledItemDelegate,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.attachments import Attachments
from wslm.gui.attachments_view import FILE_FILTER, AttachmentBar, DocumentSettings, paperclip_icon
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.chat_export import export_conversation
from wslm.gui.chat_model import IdRole
from wslm.gui.chat_session import ChatSession, format_stop, parse_stop
from wslm.gui.chat_view import ChatView
from wslm.gui.context_fit import POLICIES
from wslm.gui.dev_view import DevViewDialog
from wslm.gui.elided_label import ElidedLabel
from wslm.gui.model_lister import ModelLister
from wslm.gui.model_picker import (
    BROWSE,
    BROWSE_TEXT,
    DetailsRole,
    LoadedRole,
    LoadingRole,
    ModelPickerDelegate,
)
from wslm.gui.models_model import display_name, is_model_file, picker_details
from wslm.gui.settings import Settings


def _short_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line, Tab moves to the next control (as in a form).

    It grows with its text, from MIN_LINES up to MAX_LINES (and never past CAP_SHARE of the widget set with
    cap_to, so a small window keeps its transcript), then scrolls; it shrinks back as text goes."""

    submitted = Signal()
    MIN_LINES = 2
    MAX_LINES = 10
    CAP_SHARE = 0.4

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)
        self._cap_widget: QWidget | None = None
        self._fitting = False
        self.textChanged.connect(self.fit_height)
        self.fit_height()

    def cap_to(self, widget: QWidget) -> None:
        """Never take more than CAP_SHARE of `widget`'s height (refitted as it resizes)."""
        self._cap_widget = widget
        widget.installEventFilter(self)
        self.fit_height()

    def eventFilter(self, obj, event) -> bool:
        if obj is self._cap_widget and event.type() == QEvent.Type.Resize:
            self.fit_height()
        return super().eventFilter(obj, event)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():  # the text wraps anew
            self.fit_height()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):  # other line height, margins
            self.fit_height()

    def fit_height(self) -> None:
        if self._fitting:
            return
        self._fitting = True
        try:
            line = self.fontMetrics().lineSpacing()
            margins = self.contentsMargins()  # the frame, if the style draws one
            chrome = margins.top() + margins.bottom() + 2 * int(self.document().documentMargin()) + 2
            low = self.MIN_LINES * line + chrome
            high = self.MAX_LINES * line + chrome
            if self._cap_widget is not None and self._cap_widget.height() > 0:
                high = min(high, int(self._cap_widget.height() * self.CAP_SHARE))
            high = max(high, low)
            # The laid-out height of the blocks (wrapped lines count), stopping at the cap: a long paste
            # costs no more than the lines that fit.
            text_h = 0.0
            block = self.document().firstBlock()
            while block.isValid() and chrome + text_h < high:
                text_h += self.blockBoundingRect(block).height()
                block = block.next()
            self.setFixedHeight(max(low, min(high, chrome + int(text_h + 0.999))))
        finally:
            self._fitting = False

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class PickerCombo(QComboBox):
    """The model picker; says when its list opens (the server's loaded models are then read anew)."""

    opening = Signal()

    def showPopup(self) -> None:
        self.opening.emit()
        super().showPopup()


class RenameDelegate(QStyledItemDelegate):
    """The rename box covers the whole row, and is never shorter than a line edit wants: the list's item
    padding would otherwise leave it a text-high strip that clips the letters (top and bottom)."""

    def createEditor(self, parent, option, index):
        editor = QLineEdit(parent)
        editor.setStyleSheet("QLineEdit { padding: 0 6px; border-radius: 5px; }")
        return editor

    def updateEditorGeometry(self, editor, option, index) -> None:
        rect = QRect(option.rect)
        need = editor.sizeHint().height()
        if rect.height() < need:
            rect.setTop(rect.center().y() - need // 2)
            rect.setHeight(need)
        editor.setGeometry(rect)


class ChatPanel(QWidget):
    settings_changed = Signal()
    model_switch_requested = Signal(str)  # an installed model's id: serve it instead (pool load, or restart)
    picker_opened = Signal()  # the model list opens: a moment to read which models the server has loaded
    eject_requested = Signal(str)  # a model the server's pool loaded: unload it (POST /v1/models/unload)
    start_server_requested = Signal()  # the user took the offer to start our server (it was not running)
    notice = Signal(str)  # a brief confirmation (copied, exported) for the status bar

    def __init__(self, session: ChatSession, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self.server_url = ""  # set by the main window while our server is ready
        self.server_model = ""
        self.server_context: int | None = None  # its max_model_len: replies are kept within it
        self.server_key = ""
        self.installed: list[dict] = []  # `models list`, for the picker in wslm-server mode
        self.serve_choice = ""  # the server panel's model (what a start would load)
        self.model_files: list[str] = []  # .gguf files chosen with "Browse…" (served by path)
        self.server_path = lambda path: path  # a chosen file's path as the server sees it (WSL: /mnt/c/…)
        self.switching_to = ""  # a model switch in progress
        # Set by the main window: whether our server switches to a model without a restart (its model pool
        # holds it), so a switch leaves the replies being written alone.
        self.live_switch = lambda model_id: False
        # Set by the main window: whether our server can eject a model now (one its pool loaded, not the
        # model it started with, which stays loaded).
        self.can_eject = lambda model_id: False
        self.loaded_models: set[str] = set()  # what our server has loaded (/v1/models `state`): "loaded" badges
        self.loading_model = ""  # what it is loading
        self.editing_row = -1  # a sent message being edited (Send re-runs the chat from it)
        self.server_state = "stopped"  # our server's state (set by the main window)
        self.server_coming = False  # our server is starting, loading or restarting: it will be ready
        # A request waiting for our server to be ready: (conversation id, row to regenerate or None for
        # "answer the last message"). One at a time: the chat is one conversation with one server.
        self.pending: tuple[int, int | None] | None = None
        self._offered: tuple[int, int | None] | None = None  # what "start it" in the note will then ask
        self._server_note = False  # the note under the transcript is about the server (cleared when ready)
        self._loading_params = True  # widgets being filled from the conversation: not a user edit
        self.lister = ModelLister(self)
        self.lister.listed.connect(self._on_models)
        self.attachments = Attachments(session, settings, parent=self)  # the chats' documents (RAG)
        self.attachments.notice.connect(self._show_error)  # a file that failed, passages left out of a request
        self.attachments.notice_cleared.connect(
            lambda old: self.error_label.hide() if html.escape(old, quote=False) in self.error_label.text() else None)
        self.attachments.usage_changed.connect(self.update_context_meter)
        self.lister.failed.connect(self._show_error)

        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(self._build_list())
        split.addWidget(self._build_center())
        self.params_box = self._build_params()
        split.addWidget(self.params_box)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setStretchFactor(2, 0)
        split.setSizes([210, 700, 260])
        # The chat list and the settings column fold away (drag the handle, or the ⚙ button) on narrow windows.
        split.setCollapsible(0, True)
        split.setCollapsible(1, False)
        split.setCollapsible(2, True)
        split.setHandleWidth(1)
        self.split = split
        self.set_settings_visible(settings.chat_settings_visible)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)

        session.busy_changed.connect(self._on_busy)
        session.current_changed.connect(self._on_current)
        session.reply_failed.connect(self._on_failed)
        self.view.regenerate_requested.connect(self._regenerate)
        self.view.edit_requested.connect(self.edit_message)
        self.view.branch_requested.connect(self.show_branch)
        self.view.continue_requested.connect(self.continue_reply)
        self.view.delete_requested.connect(self.delete_message)
        self.view.notice.connect(self.notice)
        session.conversations.dataChanged.connect(self._on_conversation_changed)
        # The context meter follows what the next request would hold.
        for sig in (session.messages.rowsInserted, session.messages.rowsRemoved, session.messages.modelReset,
                    session.reply_finished, session.busy_changed):
            sig.connect(self.update_context_meter)
        self._apply_connection()
        first = session.conversations.conversation(0)
        if first is not None and not session.messages.conversation_id:
            session.open(first.id)  # reopen the latest chat, as chat apps do
        self._on_current(session.messages.conversation_id)

    # Layout
    def _build_list(self) -> QWidget:
        box = QWidget()
        box.setMinimumWidth(150)
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
        self.list.viewport().installEventFilter(self)  # right-click: a menu, not a move of the highlight
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(RenameDelegate(self.list))
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        return box

    def _build_center(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(8, 10, 8, 10)
        head = QHBoxLayout()
        self.title = ElidedLabel("New chat", objectName="Title")  # a long title gives way to the picker
        self.connection_label = QLabel(objectName="Muted")
        self.settings_button = QPushButton("⚙")
        self.settings_button.setCheckable(True)
        self.settings_button.setToolTip("Show or hide the chat settings (system prompt, sampling, connection)")
        self.settings_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.settings_button.setStyleSheet("QPushButton { padding: 6px 8px; }")  # one glyph: no wide padding
        self.settings_button.toggled.connect(self._settings_toggled)
        # The model picker: installed models (wslm server: choosing one switches the server to it), or the
        # models an OpenAI-compatible URL serves (free text allowed there).
        self.model_combo = PickerCombo()
        self.model_combo.opening.connect(self.picker_opened)
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.setMinimumContentsLength(5)  # grows with the window (stretch below)
        self.model_combo.setToolTip("The model this chat talks to")
        self.model_combo.setItemDelegate(ModelPickerDelegate(self.model_combo))
        self.model_combo.currentTextChanged.connect(self._model_changed)
        self.model_combo.activated.connect(self._model_chosen)
        # Eject (LM Studio's ⏏): unload a model the server's pool holds, to give its memory back. A menu of
        # the loaded models beside the picker: a click in the picker's own list picks the model instead.
        self.eject_button = QToolButton(text="⏏")
        self.eject_button.setToolTip("Eject a model the server has loaded beside its own (frees its memory)")
        self.eject_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.eject_button.setStyleSheet("QToolButton::menu-indicator { image: none; }")
        self.eject_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.eject_button.setMenu(QMenu(self.eject_button))
        self.eject_button.menu().aboutToShow.connect(self.eject_actions)
        self.eject_button.hide()  # until the server has a model to eject
        # Tokens the next request would hold / the model's context (estimated; the server's count when known).
        self.context_meter = QLabel(objectName="Muted")
        head.addWidget(self.title, 1)
        head.addWidget(self.model_combo, 2)
        head.addWidget(self.eject_button)
        head.addWidget(self.context_meter)
        head.addWidget(self.connection_label)
        head.addWidget(self.settings_button)
        lay.addLayout(head)
        self.view = ChatView(self.session.messages)
        lay.addWidget(self.view, 1)
        self.error_label = QLabel(objectName="Muted")
        self.error_label.setWordWrap(True)
        self.error_label.linkActivated.connect(self._on_note_link)
        self.error_label.hide()
        lay.addWidget(self.error_label)
        # Per-chat model: a chat that talked to another installed model offers to switch back to it.
        self.model_hint = QLabel(objectName="Muted")
        self.model_hint.setWordWrap(True)
        self.model_hint.linkActivated.connect(lambda model_id: self.choose_model(model_id))
        self.model_hint.hide()
        lay.insertWidget(1, self.model_hint)
        # A model switch's progress, on a line of its own (the header has no room for a sentence).
        self.switch_note = QLabel(objectName="Muted")
        self.switch_note.setWordWrap(True)
        self.switch_note.hide()
        lay.insertWidget(1, self.switch_note)
        composer = QFrame(objectName="Card")
        stack = QVBoxLayout(composer)
        stack.setContentsMargins(8, 8, 8, 8)
        self.attachment_bar = AttachmentBar(self.attachments)
        stack.addWidget(self.attachment_bar)
        row = QHBoxLayout()
        stack.addLayout(row)
        self.attach_button = QPushButton(paperclip_icon(), "")
        self.attach_button.setToolTip("Attach text, Markdown or PDF files to this chat: the model reads them "
                                      "(small files whole, larger ones the passages nearest to each message)")
        self.attach_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.attach_button.setStyleSheet("QPushButton { padding: 6px 8px; }")
        self.attach_button.clicked.connect(self.attach_dialog)
        attach_col = QVBoxLayout()
        attach_col.addStretch(1)
        attach_col.addWidget(self.attach_button)
        row.addLayout(attach_col)
        self.input = ChatInput()
        self.input.setPlaceholderText("Send a message  (Enter to send, Shift+Enter for a new line)")
        self.input.setStyleSheet("QPlainTextEdit { border: none; background: transparent; }")
        self.input.submitted.connect(self.send)
        self.send_button = QPushButton("Send", objectName="Primary")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.hide()
        # Clicking Send or Stop must leave the keyboard in the message box: a focused button that hides
        # itself hands focus to the next widget in the chain (the system prompt), where typing would land.
        for b in (self.send_button, self.stop_button):
            b.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        buttons = QVBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        lay.addWidget(composer)
        self.input.cap_to(box)
        return box

    def _build_params(self) -> QWidget:
        inner = QWidget()
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(6, 10, 10, 10)
        lay.addWidget(QLabel("System prompt", objectName="Muted"))
        # Presets: named system prompts (kept in the chat store); picking one fills this chat's prompt.
        presets = QHBoxLayout()
        self.preset_combo = QComboBox()
        self.preset_combo.setToolTip("Saved system prompts: pick one for this chat")
        self.preset_combo.activated.connect(self._preset_chosen)
        self.preset_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset_combo.setMinimumContentsLength(4)  # a long preset name must not widen the column
        self.preset_save = QPushButton("Save…")
        self.preset_save.setToolTip("Save this system prompt as a preset")
        self.preset_save.clicked.connect(self._save_preset_dialog)
        self.preset_delete = QPushButton("✕")  # one glyph: the row fits the narrow column
        self.preset_delete.setToolTip("Delete the chosen preset (chats keep their prompt)")
        self.preset_delete.clicked.connect(self._delete_preset)
        for b in (self.preset_save, self.preset_delete):
            b.setStyleSheet("QPushButton { padding: 6px 8px; }")
        presets.addWidget(self.preset_combo, 1)
        presets.addWidget(self.preset_save)
        presets.addWidget(self.preset_delete)
        lay.addLayout(presets)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setFixedHeight(90)
        self.system_prompt.textChanged.connect(self._params_changed)
        self.system_prompt.textChanged.connect(self._sync_preset)
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
        # Optional sampling: at its "off"/"default" value it is left out of the request (the server's applies).
        self.top_k = QSpinBox(minimum=0, maximum=100000, specialValueText="off")
        self.min_p = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.01, decimals=2, specialValueText="off")
        self.repetition_penalty = QDoubleSpinBox(minimum=1.0, maximum=2.0, singleStep=0.05, decimals=2,
                                                 specialValueText="off")
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, specialValueText="random")
        self.stop_strings = QLineEdit(placeholderText="e.g. ###, \\n\\n")
        self.stop_strings.setToolTip("Strings that end the reply: comma-separated; \\n is a new line, \\, a comma")
        self.json_mode = QCheckBox("JSON mode")
        self.json_mode.setToolTip("The reply is one JSON object (response_format json_object)")
        self.reasoning = QComboBox()
        for label, value in (("Model default", None), ("On", True), ("Off", False)):
            self.reasoning.addItem(label, value)
        self.reasoning.setToolTip("Whether a thinking model reasons first (chat_template_kwargs enable_thinking)")
        for w in (self.top_k, self.min_p, self.repetition_penalty, self.seed):
            w.valueChanged.connect(self._params_changed)
        self.stop_strings.textChanged.connect(self._params_changed)
        self.json_mode.toggled.connect(self._params_changed)
        self.reasoning.currentIndexChanged.connect(self._params_changed)
        for w in (self.temperature, self.top_p, self.max_tokens, self.top_k, self.min_p, self.repetition_penalty,
                  self.seed, self.stop_strings, self.reasoning):
            w.setMinimumWidth(60)  # not as wide as their longest value: the column stays narrow
        form.addRow("Top K", self.top_k)
        form.addRow("Min P", self.min_p)
        form.addRow("Repeat penalty", self.repetition_penalty)
        form.addRow("Seed", self.seed)
        form.addRow("Stop", self.stop_strings)
        form.addRow("Reasoning", self.reasoning)
        form.addRow("", self.json_mode)
        lay.addLayout(form)

        lay.addSpacing(10)
        lay.addWidget(QLabel("When the chat is too long", objectName="Muted"))
        self.overflow = QComboBox()
        for key, label in POLICIES.items():
            self.overflow.addItem(label, key)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(self.settings.chat_context_overflow)))
        self.overflow.setToolTip("What is sent when the conversation no longer fits the model's context window: "
                                 "leave out the oldest messages (the system prompt stays), cut out the middle "
                                 "(the first and the newest messages stay), or send nothing and say so")
        self.session.overflow_policy = str(self.overflow.currentData())
        self.overflow.currentIndexChanged.connect(self._overflow_changed)
        lay.addWidget(self.overflow)

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
        refresh = QPushButton("List the URL's models")
        refresh.setToolTip("Ask the server at the URL which models it serves (into the model box above the chat)")
        refresh.clicked.connect(self.refresh_models)
        self.list_button = refresh
        for w in (self.use_server, self.use_custom, self.url, self.key, refresh):
            lay.addWidget(w)
        # The developer view: this chat's request as curl / Python, and the last reply's tokens and timings
        # (here, not in the chat's header: a header button cost the window 40 px of its minimum width).
        lay.addSpacing(10)
        self.dev_button = QPushButton("</> Developer view")
        self.dev_button.setToolTip("This chat's request as curl and Python code, and the last reply's token counts "
                                   "and timings")
        self.dev_button.clicked.connect(self.show_dev_view)
        lay.addWidget(self.dev_button)
        lay.addSpacing(10)
        self.document_settings = DocumentSettings(self.settings)
        self.document_settings.changed.connect(self.settings_changed)
        lay.addWidget(self.document_settings)
        lay.addStretch(1)
        self._fill_presets()
        # The column scrolls: all the parameters do not fit a short window.
        box = QScrollArea()
        box.setWidget(inner)
        box.setWidgetResizable(True)
        box.setFrameShape(QFrame.Shape.NoFrame)
        box.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        box.setMinimumWidth(170)
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
        conv_id = int(index.data(IdRole))
        menu.addAction("Export as Markdown…", lambda: self._export_dialog(conv_id, "md"))
        menu.addAction("Export as JSON…", lambda: self._export_dialog(conv_id, "json"))
        menu.addAction("Delete", lambda: self._delete(index.row()))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def eventFilter(self, obj, event) -> bool:
        if obj is self.list.viewport() and event.type() in (
                QEvent.Type.MouseButtonPress, QEvent.Type.MouseButtonRelease, QEvent.Type.MouseButtonDblClick) \
                and event.button() == Qt.MouseButton.RightButton:
            return True  # the list would move its highlight to a chat it does not open; the menu still comes
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
        src = vars(conv) if conv else self.session.defaults
        self.top_k.setValue(src.get("top_k") or 0)
        self.min_p.setValue(src.get("min_p") or 0.0)
        self.repetition_penalty.setValue(src.get("repetition_penalty") or 1.0)
        self.seed.setValue(-1 if src.get("seed") is None else src["seed"])
        self.stop_strings.setText(format_stop(src.get("stop") or []))
        self.json_mode.setChecked(bool(src.get("json_mode")))
        self.reasoning.setCurrentIndex(max(0, self.reasoning.findData(src.get("reasoning"))))
        self._loading_params = False
        self.update_context_meter()
        row = self.session.conversations.row_of(conv_id) if conv_id else -1
        if row >= 0:
            self.list.setCurrentIndex(self.session.conversations.index(row))
        self.error_label.hide()
        self._show_model_hint()

    def _show_model_hint(self) -> None:
        conv = self.session.current()
        served = self.switching_to or (self.server_model if self.server_url else self.serve_choice)
        chat_model = next((m for m in self.installed if conv and m["id"] == conv.model), None)
        if not self.settings.chat_use_server or chat_model is None or conv.model == served:
            self.model_hint.hide()
            return
        name = html.escape(display_name(chat_model))
        how = "" if self.live_switch(conv.model) else " (the server reloads)"
        self.model_hint.setText(f"This chat was with {name}. <a href='{html.escape(conv.model)}'>Switch to it</a>"
                                f"{how}, or just write: the model above answers.")
        self.model_hint.show()

    def _overflow_changed(self, _index: int) -> None:
        self.session.overflow_policy = self.settings.chat_context_overflow = str(self.overflow.currentData())
        self.settings_changed.emit()

    def _on_conversation_changed(self, top: QModelIndex, bottom: QModelIndex, _roles=()) -> None:
        """A chat was renamed (in the list): the header shows the new title."""
        row = self.session.conversations.row_of(self.session.messages.conversation_id)
        conv = self.session.conversations.conversation(row)
        if conv is not None and top.row() <= row <= bottom.row():
            self.title.setText(conv.title)

    def delete_message(self, row: int) -> None:
        """Delete one message (the transcript's Delete link): from the view and the chat's store."""
        if self.session.busy:
            self._show_error("A reply is being written: stop it first, then delete.")
            return
        if self.editing_row == row:
            self.input.clear()
            self.cancel_edit()
        if self.session.delete_message(row) and self.editing_row > row:
            self.editing_row -= 1

    def _params_changed(self, *_args) -> None:
        if self._loading_params:
            return
        params = {"system_prompt": self.system_prompt.toPlainText(), "temperature": self.temperature.value(),
                  "top_p": self.top_p.value(), "max_tokens": self.max_tokens.value()}
        sampling = {"top_k": self.top_k.value() or None, "min_p": self.min_p.value() or None,
                    "repetition_penalty": self.repetition_penalty.value() if self.repetition_penalty.value() > 1.0
                    else None, "seed": None if self.seed.value() < 0 else self.seed.value(),
                    "stop": parse_stop(self.stop_strings.text()), "json_mode": self.json_mode.isChecked(),
                    "reasoning": self.reasoning.currentData()}
        if self.session.current():
            self.session.update_params(**params, **sampling)
        else:  # no chat yet: these become the defaults for new chats
            self.settings.system_prompt = params["system_prompt"]
            self.settings.temperature = params["temperature"]
            self.settings.top_p = params["top_p"]
            self.settings.max_tokens = params["max_tokens"]
            self.session.defaults.update(params, **sampling)
            self.settings_changed.emit()
        self.update_context_meter()

    # Sending
    def send(self) -> None:
        text = self.input.toPlainText()
        if not text.strip() or self.session.busy:
            return
        if self.switching_to and self.settings.chat_use_server:
            self._show_error("The new model is still loading: send when it is ready (your text is kept).",
                             server=True)
            return
        if not self.session.base_url:
            self._no_server(None if self.editing_row >= 0 else text)
            return
        reading = self.attachments.busy()
        if reading:  # its passages are not stored yet: the message would go without them
            self._show_error(f"Still reading {', '.join(reading)}: send when it is attached (your text is kept).")
            return
        if self.editing_row >= 0:
            if self.session.edit_and_rerun(self.editing_row, text):
                self.input.clear()
                self.cancel_edit()
            self.input.setFocus()
            return
        if self.session.send(text):
            self.input.clear()
            self.title.setText(self.session.current().title)
            self.error_label.hide()
        self.input.setFocus()

    def stop(self) -> None:
        self.session.stop()
        self.input.setFocus()

    # Documents
    def attach_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", FILE_FILTER)
        self.attach_files(paths)

    def attach_files(self, paths: list[str]) -> None:
        """Attach files to the open chat (a new chat when none is open); they are read in the background."""
        if paths:
            self.attachments.attach(paths)
            self.input.setFocus()

    # Waiting for our server
    def _using_our_server(self) -> bool:
        return self.settings.chat_use_server

    def _no_server(self, text: str | None, regen_row: int | None = None) -> None:
        """Send (text) or Retry (regen_row) with nowhere to send to: while our server loads, the request
        waits for it; when it is not running, say so and offer to start it. The text is never dropped."""
        conv_id = self.session.messages.conversation_id
        if not self._using_our_server():
            self._show_error("No URL to send to: set one under Connection (⚙), or switch to the wslm server.")
            return
        if self.server_coming:
            if regen_row is not None:
                self._wait_for_server(conv_id, regen_row)
            elif text is not None:
                self._queue_send(text)
            else:  # editing a sent message: the edit is kept in the box until the server is ready
                self._show_error("The server is still loading: send when it is ready (your text is kept).",
                                 server=True)
            return
        self._offered = (conv_id, regen_row) if regen_row is not None else None
        then = (" and the reply is retried once it is ready" if regen_row is not None
                else " and your message is sent once it is ready" if text is not None else "")
        self._show_error(f"The server is not running: <a href='start'>start it</a>{then} (or use the Server "
                         "panel), or set a URL under Connection. Your text is kept.", server=True, rich=True)

    def _queue_send(self, text: str) -> None:
        if self.pending is not None:
            self._show_error("A message is already waiting for the server: send this one when it is ready "
                             "(your text is kept).", server=True)
            return
        if self.session.queue(text):
            self.input.clear()
            self.title.setText(self.session.current().title)
            self._wait_for_server(self.session.messages.conversation_id, None)

    def _wait_for_server(self, conv_id: int, row: int | None) -> None:
        self.pending = (conv_id, row)
        what = "your message is sent" if row is None else "the reply is retried"
        self._show_note(f"The server is getting ready: {what} as soon as it is.")

    def _on_note_link(self, link: str) -> None:
        if link == "start":
            self.start_server()

    def start_server(self) -> None:
        """Take the offer: start our server, and send what was waiting (the typed text, a retry) when ready."""
        offered, self._offered = self._offered, None
        self.start_server_requested.emit()
        if not self.server_coming:
            self._show_error("The server did not start: the Server panel says why.", server=True)
            return
        text = self.input.toPlainText()
        if offered is not None:
            self._wait_for_server(*offered)
        elif text.strip() and self.editing_row < 0:
            self._queue_send(text)
        else:
            self._show_note("Starting the server…")

    def set_server_state(self, state: str, coming: bool, detail: str = "") -> None:
        """Our server's state; `coming`: it is on its way to ready (starting, loading, restarting)."""
        self.server_state, self.server_coming = state, coming
        if coming or state == "ready" or self.pending is None:
            return
        # It stopped before it was ready: the waiting message stays in the chat, and can go out later.
        self._offered, self.pending = self.pending, None
        why = f" ({detail})" if detail and state == "crashed" else ""
        self._show_error(f"The server stopped before it was ready{html.escape(why)}: <a href='start'>start it "
                         "again</a> to send what was waiting (or use the Server panel).", server=True, rich=True)

    def _server_ready(self) -> None:
        """Our server is ready: the stale "not running" note goes, and what waited for it is sent."""
        if self._server_note:
            self.error_label.hide()
            self._server_note = False
        pending, self.pending = self.pending, None
        self._offered = None
        if pending is None:
            return
        conv_id, row = pending
        if self.session.store.get_conversation(conv_id) is None:
            return  # deleted meanwhile
        self.session.open(conv_id)  # where the message was written (the user may have looked at another chat)
        if row is None:
            self.session.reply_to_last()
        else:
            self.session.regenerate(row)

    # Model switch while replies stream
    def confirm_switch(self, count: int) -> bool:
        """A model switch stops `count` streaming replies: ask first. Tests replace this."""
        answer = QMessageBox.question(
            self, "Switch model",
            "A reply is still being written. Switching the model stops it: the text so far is kept, marked "
            "as interrupted. Switch now?" if count == 1 else
            f"{count} replies are still being written. Switching the model stops them: the text so far is "
            "kept, marked as interrupted. Switch now?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes

    # Editing a sent message
    def edit_message(self, row: int) -> None:
        msg = self.session.messages.message(row)
        if msg is None or msg.role != "user" or self.session.busy:
            return
        self.editing_row = row
        self.input.setPlainText(msg.content)
        self.input.setFocus()
        self._show_error("Editing a sent message: Send asks again from there, as a new branch (the original "
                         "and its replies stay, ‹ 1/2 › on the message); Esc cancels.")

    def cancel_edit(self) -> None:
        if self.editing_row >= 0:
            self.editing_row = -1
            self.error_label.hide()

    # Export
    def _export_dialog(self, conv_id: int, kind: str) -> None:
        conv = self.session.store.get_conversation(conv_id)
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in (conv.title if conv else "chat"))[:60]
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{name}.{kind}",
                                              "Markdown (*.md)" if kind == "md" else "JSON (*.json)")
        if path:
            self.export_chat(conv_id, path)

    def export_chat(self, conv_id: int, path: str) -> None:
        try:
            export_conversation(self.session.store, conv_id, Path(path))
        except (OSError, ValueError) as exc:
            self._show_error(f"Could not export the chat to {path}: {exc}")
            return
        self.notice.emit(f"Exported the chat to {path}")

    def _regenerate(self, row: int) -> None:
        if not self.session.base_url and not self.session.busy:  # Retry with the server gone
            self._no_server(None, regen_row=row)
            return
        self.session.regenerate(row)

    # Branches and Continue
    def show_branch(self, row: int, index: int) -> None:
        if not self.session.show_branch(row, index) and self.session.busy:
            self._show_error("A reply is being written: stop it first, then switch branches.")

    def continue_reply(self, row: int | None = None) -> None:
        """Continue a cut reply (its Continue link)."""
        if not self.session.base_url:
            self._show_error("Nowhere to send to: start the server (Server panel) or set a URL under Connection.")
            return
        why = self.session.continue_reply(row)
        if why:
            self._show_error(why)
        else:
            self.error_label.hide()

    # System-prompt presets
    def _fill_presets(self) -> None:
        combo = self.preset_combo
        combo.blockSignals(True)
        combo.clear()
        combo.addItem("Custom", "")
        for name in self.session.store.presets():
            combo.addItem(name, name)
        combo.blockSignals(False)
        self._sync_preset()

    def _sync_preset(self) -> None:
        """The picker names the preset that the prompt is (Custom once edited away from it)."""
        text = self.system_prompt.toPlainText()
        name = next((n for n, p in self.session.store.presets().items() if p == text), "")
        self.preset_combo.setCurrentIndex(max(0, self.preset_combo.findData(name)))
        self.preset_delete.setEnabled(bool(name))

    def _preset_chosen(self, index: int) -> None:
        name = str(self.preset_combo.itemData(index) or "")
        prompt = self.session.store.presets().get(name)
        if prompt is not None:
            self.system_prompt.setPlainText(prompt)  # saved for the chat as any edit is

    def save_preset(self, name: str) -> None:
        name = name.strip()
        if name:
            self.session.store.save_preset(name, self.system_prompt.toPlainText())
            self._fill_presets()
            self.notice.emit(f"Saved the preset “{name}”")

    def _save_preset_dialog(self) -> None:
        current = str(self.preset_combo.currentData() or "")
        name, ok = QInputDialog.getText(self, "Save system prompt", "Preset name:", text=current)
        if ok:
            self.save_preset(name)

    def _delete_preset(self) -> None:
        name = str(self.preset_combo.currentData() or "")
        if name:
            self.session.store.delete_preset(name)
            self._fill_presets()

    # Context meter
    def update_context_meter(self, *_args) -> None:
        used, window = self.session.context_usage() if self.session.current() else (0, None)
        self.context_meter.setVisible(bool(used))  # an empty chat: no meter, and no gap in the header
        if not used:
            return
        short = _short_count
        color = ""
        if window:
            self.context_meter.setText(f"≈{short(used)} / {short(window)}")
            color = "#f85149" if used >= window else "#d29922" if used >= 0.8 * window else ""
        else:
            self.context_meter.setText(f"≈{short(used)} tokens")
        self.context_meter.setStyleSheet(f"color: {color};" if color else "")
        self.context_meter.setToolTip(
            f"About {used:,} tokens of {window:,} in the model's context (estimated: the chat so far and the "
            "system prompt)" if window else f"About {used:,} tokens so far (the model's context size is not known)")

    def _on_busy(self, busy: bool) -> None:
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)

    # Settings column
    def set_settings_visible(self, visible: bool) -> None:
        self.settings_button.blockSignals(True)
        self.settings_button.setChecked(visible)
        self.settings_button.blockSignals(False)
        self._settings_toggled(visible)

    def dev_view(self) -> DevViewDialog:
        """The developer view for the open chat, built from what its next request would send."""
        return DevViewDialog(self.session.request_preview(), self.session.base_url,
                             self.session.last_reply_stats(), self)

    def show_dev_view(self) -> None:
        dialog = self.dev_view()
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()

    def _settings_toggled(self, visible: bool) -> None:
        self.params_box.setVisible(visible)
        if self.settings.chat_settings_visible != visible:
            self.settings.chat_settings_visible = visible
            self.settings_changed.emit()

    def _on_failed(self, kind: str, message: str) -> None:
        # The message is shown in the transcript; the typed text was saved there too.
        self.error_label.hide()

    def _show_error(self, text: str, server: bool = False, rich: bool = False) -> None:
        """`server`: a note about our server's availability (it goes when the server is ready). `rich`: the
        text is HTML (a link to act on); otherwise it is escaped."""
        self.error_label.setText(f"<span style='color:#f85149;'>⚠</span> {text if rich else html.escape(text, quote=False)}")
        self.error_label.show()
        self._server_note = server

    def _show_note(self, text: str) -> None:
        """Progress, not a problem: waiting for the server."""
        self.error_label.setText(f"<span style='color:#d29922;'>●</span> {html.escape(text, quote=False)}")
        self.error_label.show()
        self._server_note = True

    # Connection
    def set_server(self, url: str, model: str, api_key: str, context_len: int | None = None) -> None:
        """Called when our server becomes ready (url "") when it stops. context_len: its max_model_len."""
        self.server_url, self.server_model, self.server_key = url, model, api_key
        self.server_context = context_len
        self._apply_connection()
        self.update_context_meter()
        if url:
            self._server_ready()

    def refresh_connection(self) -> None:
        """The server's settings changed (its port): the URL shown follows."""
        self._apply_connection()

    def _connection_edited(self, *_args) -> None:
        if self.url.isEnabled():  # the field held the user's own URL (not the server's, shown read-only)
            self.settings.chat_base_url = self.url.text().strip()
        self.settings.chat_use_server = self.use_server.isChecked()
        self.settings.chat_api_key = self.key.text()
        self.settings_changed.emit()
        self._apply_connection()
        if not self.settings.chat_use_server:
            self.refresh_models()

    def _model_changed(self, text: str) -> None:
        if self.settings.chat_use_server:
            return  # the request names what the server serves (set_server), not the picker's label
        self.session.model = text.strip()
        self.settings.chat_model = text.strip()
        self.settings_changed.emit()

    def _model_chosen(self, index: int) -> None:
        """The user picked a model: with our server, switch the server to it (LM Studio's JIT load)."""
        if not self.settings.chat_use_server:
            return
        model_id = str(self.model_combo.itemData(index) or "")
        if model_id == BROWSE:
            self._browse_model()
            return
        served = self.server_model if self.server_url else ""
        streaming = len(self.session.streaming_ids)
        # A model loaded beside the running one (the server's pool) leaves the replies being written alone.
        if model_id and model_id not in (served, self.switching_to) and streaming and not self.live_switch(model_id):
            # The switch stops the server under the replies being written: ask, and keep their text.
            if not self.confirm_switch(streaming):
                self._fill_server_models()  # back to the model that is writing them
                return
            self.session.interrupt("the model was switched")
        conv = self.session.current()
        if model_id and conv is not None and conv.model != model_id:
            self.session.store.update_conversation(conv.id, model=model_id)  # this chat's model from now on
        if model_id and model_id != (self.server_model if self.server_url else "") and model_id != self.switching_to:
            self.model_switch_requested.emit(model_id)

    def choose_model(self, model_id: str) -> None:
        """Pick a model as the user would (tests, other panels)."""
        i = self.model_combo.findData(model_id)
        if i >= 0:
            self.model_combo.setCurrentIndex(i)
            self._model_chosen(i)

    def set_serve_choice(self, model_id: str) -> None:
        """The Server panel's model (what Start loads): the picker shows it while no server is ready, also
        after a failed switch (it showed the model from the last listing, which nothing would load)."""
        if not model_id or model_id == self.serve_choice:
            return
        self.serve_choice = model_id
        if self.settings.chat_use_server and not self.server_url and not self.switching_to:
            self._fill_server_models()
        self._show_model_hint()

    def set_installed_models(self, models: list[dict], serve_choice: str = "") -> None:
        self.installed = [m for m in models if isinstance(m, dict) and m.get("id")]
        if serve_choice:
            self.serve_choice = serve_choice
        if self.settings.chat_use_server:
            self._fill_server_models()
        self._show_model_hint()

    def _fill_server_models(self) -> None:
        selected = self.switching_to or (self.server_model if self.server_url else "") or self.serve_choice
        served = self.server_model if self.server_url else ""
        combo = self.model_combo
        combo.blockSignals(True)
        combo.setEditable(False)
        combo.clear()
        for m in self.installed:
            combo.addItem(display_name(m), m["id"])
            i = combo.count() - 1
            combo.setItemData(i, picker_details(m), DetailsRole)
            combo.setItemData(i, bool(served) and served in (m["id"], m.get("path")) or m["id"] in self.loaded_models,
                              LoadedRole)
            combo.setItemData(i, m["id"] == self.loading_model, LoadingRole)
            combo.setItemData(i, "\n".join(t for t in (display_name(m), str(m.get("path") or ""),
                                                         picker_details(m)) if t), Qt.ItemDataRole.ToolTipRole)
        for extra in [selected, *self.model_files]:
            if extra and combo.findData(extra) < 0:
                combo.addItem(Path(extra.replace("\\", "/")).name if is_model_file(extra) else extra, extra)
                i = combo.count() - 1
                combo.setItemData(i, "file on disk" if is_model_file(extra) else "", DetailsRole)
                combo.setItemData(i, extra == served or extra in self.loaded_models, LoadedRole)
                combo.setItemData(i, extra == self.loading_model, LoadingRole)
                combo.setItemData(i, extra, Qt.ItemDataRole.ToolTipRole)
        combo.addItem(BROWSE_TEXT, BROWSE)  # serve a .gguf from anywhere on disk, by its path
        combo.setItemData(combo.count() - 1, "Pick a model file on disk to serve", Qt.ItemDataRole.ToolTipRole)
        combo.setPlaceholderText("no model")
        i = combo.findData(selected)
        combo.setCurrentIndex(i if i >= 0 else (0 if combo.count() > 1 else -1))  # never "Browse…" itself
        combo.blockSignals(False)

    def choose_model_file(self) -> str:
        """Ask for a .gguf file to serve (tests replace this); "" when cancelled."""
        path, _ = QFileDialog.getOpenFileName(self, "Serve a model file", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        return path

    def _browse_model(self) -> None:
        path = self.choose_model_file()
        if not path:
            self._fill_server_models()  # back to the model that was chosen
            return
        path = self.server_path(path)
        if path not in self.model_files:
            self.model_files.append(path)
        self._fill_server_models()
        i = self.model_combo.findData(path)
        self.model_combo.setCurrentIndex(i)
        self._model_chosen(i)

    def show_switch(self, model_id: str, state: str, detail: str) -> None:
        """Progress of a model switch, where the user chose it."""
        name = next((display_name(m) for m in self.installed if m.get("id") == model_id), model_id)
        self.switching_to = "" if state in ("ready", "crashed") else model_id
        if state in ("ready", "crashed"):
            self.switch_note.hide()
        if state == "crashed":
            self._show_error(f"Could not load {name}: {detail}")
            return
        if state == "ready":
            self.error_label.hide()
            return
        step = {"stopping": "stopping the current model", "stopped": "stopped", "starting": "starting the server",
                "loading": "loading the model"}.get(state, state)
        self._set_connection("#d29922", "switching…")
        self.switch_note.setText(f"<span style='color:#d29922;'>●</span> Switching to {html.escape(name)}: {step}…")
        self.switch_note.show()
        self.view.set_empty_hint(f"Loading {name}… the chat can continue once it is ready.")
        self._fill_server_models()
        self._show_model_hint()

    def set_pool_states(self, loaded: set[str], loading: str = "") -> None:
        """Which models our server has loaded, and which one it is loading (its /v1/models `state`): the
        picker's badges. Marked in place: an open list stays open."""
        self.loaded_models, self.loading_model = set(loaded), loading
        self.eject_button.setVisible(bool(self.ejectable()))
        if not self.settings.chat_use_server:
            return
        served = self.server_model if self.server_url else ""
        combo = self.model_combo
        for i in range(combo.count()):
            model_id = combo.itemData(i)
            if not model_id or model_id == BROWSE:
                continue
            m = next((m for m in self.installed if m["id"] == model_id), {})
            combo.setItemData(i, bool(served) and served in (model_id, m.get("path")) or model_id in self.loaded_models,
                              LoadedRole)
            combo.setItemData(i, model_id == loading, LoadingRole)

    # Ejecting a model (the server's pool)
    def ejectable(self) -> list[str]:
        """The loaded models the server can eject now, in the picker's order (our server only)."""
        if not self.settings.chat_use_server:
            return []
        order = [m["id"] for m in self.installed] + self.model_files
        return sorted((m for m in self.loaded_models if self.can_eject(m)),
                      key=lambda m: (order.index(m) if m in order else len(order), m))

    def eject_actions(self) -> list:
        """The ⏏ menu, built anew as it opens: one "Eject NAME" action per ejectable model."""
        menu = self.eject_button.menu()
        menu.clear()
        for model_id in self.ejectable():
            name = self._model_name(model_id)
            mine = " (this chat's model)" if self.server_url and model_id == self.server_model else ""
            action = menu.addAction(f"Eject {name}{mine}")
            action.setData(model_id)
            action.triggered.connect(lambda _checked=False, m=model_id: self.eject_model(m))
        if menu.isEmpty():
            menu.addAction("No model to eject").setEnabled(False)
        return menu.actions()

    def _model_name(self, model_id: str) -> str:
        return next((display_name(m) for m in self.installed if m.get("id") == model_id), model_id)

    def eject_model(self, model_id: str) -> None:
        """Unload `model_id` from the server. The model this chat talks to is ejected only once confirmed;
        the chat then goes on with the model the server started with."""
        if not self.can_eject(model_id):
            return
        if self.server_url and model_id == self.server_model and not self.confirm_eject(self._model_name(model_id)):
            return
        self.eject_requested.emit(model_id)

    def confirm_eject(self, name: str) -> bool:
        """Ejecting the chat's own model: ask first. Tests replace this."""
        answer = QMessageBox.question(
            self, "Eject model",
            f"This chat talks to {name}. Eject it anyway? Its memory is freed, and the chat goes on with the "
            "model the server started with.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes

    def show_eject(self, model_id: str, error: str = "") -> None:
        """The eject's outcome: a brief word in the status bar, or the server's reason it could not."""
        name = self._model_name(model_id)
        if not error:
            self.notice.emit(f"Ejected {name}: its memory is free")
            return
        said = error.strip().rstrip(".") or "no reason given"
        self._show_error(f"{said}." if model_id in said or name in said else f"Could not eject {name}: {said}.")

    def show_load(self, model_id: str, state: str, error: str = "") -> None:
        """A model loaded beside the running one (the server's pool), where the user picked it: `state` as
        /v1/models says while it loads ("loading", "not-loaded": waiting its turn), then "loaded" or
        "failed" (`error`: the server's words; the chat stays with the model it had)."""
        name = next((display_name(m) for m in self.installed if m.get("id") == model_id), model_id)
        if state in ("loading", "not-loaded"):
            self.switching_to = model_id
            self.loading_model = model_id
            self._set_connection("#d29922", "loading…")
            how = "the server is loading it" if state == "loading" else "waiting for the server to load it"
            self.switch_note.setText(f"<span style='color:#d29922;'>●</span> Loading {html.escape(name)}… ({how}; "
                                     "the current model keeps answering until then)")
            self.switch_note.show()
            self.view.set_empty_hint(f"Loading {name}… the chat can continue once it is ready.")
            self._fill_server_models()
            self._show_model_hint()
            return
        self.switching_to = ""
        if self.loading_model == model_id:
            self.loading_model = ""
        self.switch_note.hide()
        self._apply_connection()  # the picker back on the model the chat talks to (the new one once loaded)
        if state == "failed":
            kept = next((display_name(m) for m in self.installed if m.get("id") == self.server_model),
                        self.server_model)
            conv = self.session.current()
            if conv is not None and conv.model == model_id and self.server_model:
                self.session.store.update_conversation(conv.id, model=self.server_model)  # it never talked to it
            said = error.strip() or "no reason given"
            text = said if model_id in said or name in said else f"Could not load {name}: {said}"
            self._show_error(f"{text.rstrip('.')}.{f' The chat stays with {kept}.' if kept else ''}")
            self._show_model_hint()
        elif not self._server_note:
            self.error_label.hide()

    def _set_connection(self, color: str, text: str) -> None:
        """The dot and a few words beside the picker: shown whole when short ("wslm server"), cut when long
        (a custom URL, whole in the tooltip) so it never sets the window's minimum width."""
        self.connection_label.setText(f"<span style='color:{color};'>●</span> {html.escape(text)}")
        width = self.connection_label.fontMetrics().horizontalAdvance(f"● {text}") + 4
        self.connection_label.setMinimumWidth(min(width, 44))
        self.connection_label.setToolTip(text)

    def _apply_connection(self) -> None:
        use_server = self.settings.chat_use_server
        self.eject_button.setVisible(bool(self.ejectable()))  # our server's models only
        self.url.setEnabled(not use_server)
        self.key.setEnabled(not use_server)
        if use_server:
            # The field shows where the chat goes: our server's URL, on whatever port it runs.
            self.url.setText(self.server_url or f"http://127.0.0.1:{self.settings.port}/v1")
            self.session.set_endpoint(self.server_url, self.server_key, self.server_model or None,
                                      self.server_context)
            self._fill_server_models()
            if self.switching_to:
                pass  # show_switch() keeps the label up to date
            elif self.server_url:
                # The model's name is in the picker beside it; the label says where the chat goes.
                self._set_connection("#3fb950", "wslm server")
                self.connection_label.setToolTip(f"{self.server_model} at {self.server_url}")
                self.view.set_empty_hint(f"Talking to {self.server_model} on the wslm server.")
            else:
                self._set_connection("#8d96a8", "server not running")
                self.view.set_empty_hint("Start the server in the Server panel, or connect to any "
                                         "OpenAI-compatible URL under Connection.")
        else:
            if not self.model_combo.isEditable():
                self.model_combo.clear()
                self.model_combo.setEditable(True)
                self.model_combo.lineEdit().setPlaceholderText("model")
                if self.settings.chat_model:
                    self.model_combo.addItem(self.settings.chat_model)
            self.url.setText(self.settings.chat_base_url)
            url = normalize_base_url(self.settings.chat_base_url)
            self.session.set_endpoint(url, self.settings.chat_api_key, self.model_combo.currentText().strip())
            self._set_connection("#4f9dff", url)
            self.view.set_empty_hint(f"Talking to {url}.")
        self._show_model_hint()

    def refresh_models(self) -> None:
        if self.session.base_url:
            self.lister.fetch(self.session.base_url, self.session.api_key)
        else:
            self._show_error("No URL to ask: type the server's URL (http://host:port/v1) under Connection first.")

    def _on_models(self, ids: list) -> None:
        self._set_models(ids)

    def _set_models(self, ids: list) -> None:
        if self.settings.chat_use_server:
            return  # our server: the picker lists installed models, not what one server serves
        current = self.model_combo.currentText()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        self.model_combo.addItems(ids)
        self.model_combo.setCurrentText(current if current in ids or not ids else ids[0])
        self.model_combo.blockSignals(False)
        self.session.model = self.model_combo.currentText().strip()
