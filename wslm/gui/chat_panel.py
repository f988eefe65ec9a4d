"""Chat panel: chat list | header, transcript, notes and composer | settings column. It assembles the parts
and decides what their requests do; each part is a view with its own file:

- chat_list_view.ChatListView: New chat, search, the conversations (rename, export, delete)
- chat_header.ChatHeader: title, model_picker.ModelPicker (with ⏏), context meter, connection dot, ⚙
- chat_view.ChatView: the transcript (links: copy, edit, regenerate, branches, continue, delete)
- composer.Composer: attachments' chips, images' thumbnails (image_strip), 🖼 and 📎, the message box, Send / Stop
- chat_params.ChatParams: presets, system prompt, sampling, overflow policy
- connection_box.ConnectionBox, DocumentSettings, "Developer view" (dev_view.DevViewDialog)
- chat_sending.ChatSending: Send, Regenerate, and waiting for our server; the notes around the transcript
- chat_switch.ModelSwitching: the connection, the picker's choices, server switches, the pool's loads and ejects

ChatSending and ModelSwitching are mixins of ChatPanel (the controller's code, in files of their own).

State lives in ChatSession (conversations, messages, streaming) and Settings."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QModelIndex, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QFrame,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.attachments import Attachments
from wslm.gui.attachments_view import FILE_FILTER, DocumentSettings
from wslm.gui.chat_export import export_conversation
from wslm.gui.chat_header import ChatHeader
from wslm.gui.chat_images import IMAGE_FILTER, is_image_path
from wslm.gui.chat_list_view import ChatListView
from wslm.gui.chat_params import ChatParams
from wslm.gui.chat_sending import ChatSending
from wslm.gui.chat_session import ChatSession
from wslm.gui.chat_switch import ModelSwitching
from wslm.gui.chat_view import ChatView
from wslm.gui.composer import Composer, local_files
from wslm.gui.connection_box import ConnectionBox
from wslm.gui.content_parts import IMAGE_TOKEN_ESTIMATE
from wslm.gui.dev_view import DevViewDialog, RequestHistory
from wslm.gui.image_draft import ImageDraft
from wslm.gui.image_strip import BubbleImages, show_full_image
from wslm.gui.rag_store import WHOLE
from wslm.gui.settings import Settings
from wslm.gui.spec_metrics import SpecMeter
from wslm.gui.wheel_guard import guard_wheel


class SettingsColumn(QScrollArea):
    """The settings column: never narrower than what it holds (with room for its scroll bar)."""

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        inner = self.widget()
        if inner is not None:
            hint.setWidth(max(170, inner.minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width()))
        return hint


class ChatPanel(ModelSwitching, ChatSending, QWidget):
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
        self.editing_row = -1  # a sent message being edited (Send re-runs the chat from it)
        self.attachments = Attachments(session, settings, parent=self)  # the chats' documents (RAG)
        self.attachments.notice.connect(self._show_error)  # a file that failed, passages left out of a request
        self.attachments.notice_cleared.connect(
            lambda old: self.error_label.hide() if html.escape(old, quote=False) in self.error_label.text() else None)
        self.attachments.usage_changed.connect(self.update_context_meter)
        session.has_documents = lambda conv_id: bool(self.attachments.store.of_chat(conv_id))
        self.history = RequestHistory(session, self)  # the developer view's per-request log
        self.spec_meter = SpecMeter(session, self)  # speculative decoding's acceptance, from /metrics
        self.image_draft = ImageDraft(self)  # the next message's images (composer thumbnails)
        self.image_draft.failed.connect(self._show_error)
        self.setAcceptDrops(True)  # image files (and documents) dropped anywhere on the chat

        self.chat_list = ChatListView(session.conversations)
        self.chat_list.new_chat_requested.connect(self.new_chat)
        self.chat_list.open_requested.connect(session.open)
        self.chat_list.delete_requested.connect(session.delete_conversation)
        self.chat_list.export_requested.connect(self._export_dialog)
        self.new_button, self.search, self.list = self.chat_list.new_button, self.chat_list.search, self.chat_list.list

        center = QWidget()
        lay = QVBoxLayout(center)
        lay.setContentsMargins(8, 10, 8, 10)
        self.header = ChatHeader()
        h = self.header
        self.title, self.context_meter, self.connection_label = h.title, h.context_meter, h.connection_label
        self.settings_button, self.picker = h.settings_button, h.picker
        self.model_combo, self.eject_button = h.picker.combo, h.picker.eject_button
        self.settings_button.toggled.connect(self._settings_toggled)
        lay.addWidget(h)
        self._init_notes(lay)  # the model hint, switch note (above the transcript) and error line
        self.view = ChatView(session.messages)
        self.view.add_message_part(BubbleImages(self.view))  # a user message's images, as thumbnails
        self.view.add_link_handler("image", lambda arg: show_full_image(self, session.messages, arg))
        self.composer = Composer(self.attachments, images=self.image_draft)
        c = self.composer
        self.input, self.send_button, self.stop_button = c.input, c.send_button, c.stop_button
        self.attach_button, self.attachment_bar = c.attach_button, c.attachment_bar
        c.send_requested.connect(self.send)
        c.stop_requested.connect(self.stop)
        c.attach_requested.connect(self.attach_dialog)
        c.image_requested.connect(self.image_dialog)
        c.files_dropped.connect(self.add_files)
        c.image_pasted.connect(self.image_draft.add_qimage)
        self.image_button = c.image_button
        lay.insertWidget(lay.count() - 1, self.view, 1)  # between the notes above and the error line below
        lay.addWidget(c)
        self.input.cap_to(center)
        # Tab goes as the eye does: the transcript's links, the note under it ("start it"), the composer.
        QWidget.setTabOrder(self.view, self.error_label)
        QWidget.setTabOrder(self.error_label, self.attach_button)

        self.params_box = self._build_column()
        split = QSplitter(Qt.Orientation.Horizontal, self)
        for i, w in enumerate((self.chat_list, center, self.params_box)):
            split.addWidget(w)
            split.setStretchFactor(i, 1 if i == 1 else 0)
        split.setSizes([210, 700, 260])
        # The chat list and the settings column fold away (drag the handle, or the ⚙ button) on narrow windows.
        split.setCollapsible(0, True)
        split.setCollapsible(1, False)
        split.setCollapsible(2, True)
        split.setHandleWidth(1)
        self.split = split
        self.set_settings_visible(settings.chat_settings_visible)
        out = QVBoxLayout(self)
        out.setContentsMargins(0, 0, 0, 0)
        out.addWidget(split)

        self._init_switching()  # the picker's wiring and the connection
        session.busy_changed.connect(c.set_busy)
        session.current_changed.connect(self._on_current)
        session.reply_failed.connect(lambda _kind, _msg: self.error_label.hide())  # shown in the transcript
        self.view.regenerate_requested.connect(self._regenerate)
        self.view.edit_requested.connect(self.edit_message)
        self.view.branch_requested.connect(self.show_branch)
        self.view.continue_requested.connect(self.continue_reply)
        self.view.delete_requested.connect(self.delete_message)
        self.view.notice.connect(self.notice)
        session.conversations.dataChanged.connect(self._on_conversation_changed)
        # The context meter follows what the next request would hold: the chat, the draft, the files.
        for sig in (session.messages.rowsInserted, session.messages.rowsRemoved, session.messages.modelReset,
                    session.reply_finished, session.busy_changed, self.input.textChanged,
                    self.attachments.model.modelReset, self.attachments.model.rowsInserted,
                    self.attachments.model.rowsRemoved, self.attachments.model.dataChanged,
                    self.image_draft.rowsInserted, self.image_draft.rowsRemoved, self.image_draft.modelReset):
            sig.connect(self.update_context_meter)
        self._apply_connection()
        first = session.conversations.conversation(0)
        if first is not None and not session.messages.conversation_id:
            session.open(first.id)  # reopen the latest chat, as chat apps do
        self._on_current(session.messages.conversation_id)

    def _build_column(self) -> QWidget:
        inner = QWidget()
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(4, 10, 6, 10)
        self.params = ChatParams(self.session.store, self.settings.chat_context_overflow)
        self.params.edited.connect(self._params_edited)
        self.params.overflow_changed.connect(self._overflow_changed)
        self.params.notice.connect(self.notice)
        self.session.overflow_policy = self.params.overflow_policy()
        p = self.params
        self.preset_combo, self.preset_save, self.preset_delete = p.preset_combo, p.preset_save, p.preset_delete
        self.system_prompt, self.temperature, self.top_p, self.max_tokens = (p.system_prompt, p.temperature,
                                                                             p.top_p, p.max_tokens)
        self.top_k, self.min_p, self.repetition_penalty, self.seed = p.top_k, p.min_p, p.repetition_penalty, p.seed
        self.stop_strings, self.json_mode, self.reasoning, self.overflow = (p.stop_strings, p.json_mode,
                                                                            p.reasoning, p.overflow)
        lay.addWidget(p)
        lay.addSpacing(10)
        self.connection = ConnectionBox(self.settings)
        self.connection.edited.connect(self._connection_edited)
        self.connection.list_requested.connect(self.refresh_models)
        self.use_server, self.use_custom = self.connection.use_server, self.connection.use_custom
        self.url, self.key, self.list_button = self.connection.url, self.connection.key, self.connection.list_button
        lay.addWidget(self.connection)
        # The developer view: this chat's requests as curl / Python, their timings and tokens (here, not in
        # the chat's header: a header button cost the window 40 px of its minimum width).
        lay.addSpacing(10)
        self.dev_button = QPushButton("</> Developer")
        self.dev_button.setToolTip("This chat's request as curl and Python code, the exact prompts sent and each "
                                   "reply's token counts and timings")
        self.dev_button.clicked.connect(self.show_dev_view)
        lay.addWidget(self.dev_button)
        lay.addSpacing(10)
        self.document_settings = DocumentSettings(self.settings)
        self.document_settings.changed.connect(self.settings_changed)
        self.document_settings.changed.connect(self.update_context_meter)
        lay.addWidget(self.document_settings)
        lay.addStretch(1)
        # The column scrolls: all the parameters do not fit a short window. The wheel scrolls it, never a
        # value under the pointer (unless that box has the focus).
        box = SettingsColumn()
        box.setWidget(inner)
        box.setWidgetResizable(True)
        box.setFrameShape(QFrame.Shape.NoFrame)
        box.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # A narrow column wraps a form's long rows (the field under its label) rather than clipping them, and
        # is never narrower than what it holds: nothing is cut off ("Sa" for "Save…") at the smallest window.
        for form in inner.findChildren(QFormLayout):
            form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
            form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self._wheel_guard = guard_wheel(inner)
        return box

    # Conversations
    def new_chat(self) -> None:
        self.session.new_conversation()
        self.chat_list.select_row(0)
        self.input.setFocus()

    def _delete(self, row: int, confirm: bool = True) -> None:
        self.chat_list.delete(row, confirm)

    def _on_current(self, conv_id: int) -> None:
        conv = self.session.current()
        self.title.setText(conv.title if conv else "New chat")
        src = vars(conv) if conv else {"system_prompt": self.settings.system_prompt,
                                       "temperature": self.settings.temperature, "top_p": self.settings.top_p,
                                       "max_tokens": self.settings.max_tokens, **self.session.defaults}
        self.params.set_values(src)
        self.update_context_meter()
        self.chat_list.select_row(self.session.conversations.row_of(conv_id) if conv_id else -1)
        self.error_label.hide()
        self._show_model_hint()

    def _on_conversation_changed(self, top: QModelIndex, bottom: QModelIndex, _roles=()) -> None:
        """A chat was renamed (in the list): the header shows the new title."""
        row = self.session.conversations.row_of(self.session.messages.conversation_id)
        conv = self.session.conversations.conversation(row)
        if conv is not None and top.row() <= row <= bottom.row():
            self.title.setText(conv.title)

    def _params_edited(self, params: dict) -> None:
        if self.session.current():
            self.session.update_params(**params)
        else:  # no chat yet: these become the defaults for new chats
            for key in ("system_prompt", "temperature", "top_p", "max_tokens"):
                setattr(self.settings, key, params[key])
            self.session.defaults.update(params)
            self.settings_changed.emit()
        self.update_context_meter()

    def _preset_chosen(self, index: int) -> None:
        self.params.apply_preset(str(self.preset_combo.itemData(index) or ""))

    def save_preset(self, name: str) -> None:
        self.params.save_preset(name)

    def _overflow_changed(self, policy: str) -> None:
        self.session.overflow_policy = self.settings.chat_context_overflow = policy
        self.settings_changed.emit()

    # Messages
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

    def edit_message(self, row: int) -> None:
        msg = self.session.messages.message(row)
        if msg is None or msg.role != "user" or self.session.busy:
            return
        self.editing_row = row
        self.composer.set_text(msg.content)
        self.image_draft.set_images(msg.images)  # its images come back too: Send sends them again
        self._show_error("Editing a sent message: Send asks again from there, as a new branch (the original "
                         "and its replies stay, ‹ 1/2 › on the message); Esc cancels.")

    def cancel_edit(self) -> None:
        if self.editing_row >= 0:
            self.editing_row = -1
            self.error_label.hide()

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

    # Documents
    def attach_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", FILE_FILTER)
        self.attach_files(paths)

    def image_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", IMAGE_FILTER)
        self.add_files(paths)

    def add_files(self, paths: list[str]) -> None:
        """Files dropped or pasted on the chat: images go with the next message (read off the GUI thread),
        other files are attached as documents."""
        images = [p for p in paths if is_image_path(p)]
        if images:
            self.image_draft.add_files(images)
            self.input.setFocus()
        self.attach_files([p for p in paths if not is_image_path(p)])

    def dragEnterEvent(self, event) -> None:
        if local_files(event.mimeData()) or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        mime = event.mimeData()
        files = local_files(mime)
        if files:
            self.add_files(files)
        elif mime.hasImage():
            self.image_draft.add_qimage(mime.imageData(), "dropped image")
        else:
            return
        event.acceptProposedAction()

    def attach_files(self, paths: list[str]) -> None:
        """Attach files to the open chat (a new chat when none is open); they are read in the background."""
        if paths:
            self.attachments.attach(paths)
            self.input.setFocus()

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

    # Context meter
    def update_context_meter(self, *_args) -> None:
        """What the next request would hold: the chat so far, the system prompt, the draft in the message
        box, and the attached files that go whole (their size as the fit check counts them)."""
        conv = self.session.current()
        used, window = self.session.context_usage() if conv else (0, self.session.effective_context())
        parts = ["the chat so far and the system prompt"]
        draft = self.input.toPlainText().strip()
        if draft:
            used += max(1, len(draft.encode()) // 4)
            parts.append("your draft")
        pictures = self.image_draft.rowCount()
        if pictures:
            used += pictures * IMAGE_TOKEN_ESTIMATE
            parts.append("your images")
        files = sum(a.tokens for a in self.attachments.model.attachments() if a.status == WHOLE) if conv else 0
        if files:
            used += files
            parts.append("attached files")
        self.header.set_context(used, window, ", ".join(parts))

    # Settings column and developer view
    def set_settings_visible(self, visible: bool) -> None:
        self.settings_button.blockSignals(True)
        self.settings_button.setChecked(visible)
        self.settings_button.blockSignals(False)
        self._settings_toggled(visible)

    def _settings_toggled(self, visible: bool) -> None:
        self.params_box.setVisible(visible)
        if self.settings.chat_settings_visible != visible:
            self.settings.chat_settings_visible = visible
            self.settings_changed.emit()

    def dev_view(self) -> DevViewDialog:
        """The developer view for the open chat, built from what its next request would send, with the
        requests this chat sent (newest first)."""
        return DevViewDialog(self.session.request_preview(), self.session.base_url,
                             self.session.last_reply_stats(), self,
                             history=self.history.for_conversation(self.session.messages.conversation_id),
                             spec=self.spec_meter)

    def show_dev_view(self) -> None:
        dialog = self.dev_view()
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()

    def confirm(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(self, title, text, QMessageBox.StandardButton.Yes |
                                      QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes
