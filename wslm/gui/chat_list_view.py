"""The chat list on the left: New chat, search, the conversations (rename in place, right-click menu:
rename, export, delete; Delete key deletes). A view over the session's ConversationListModel."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QRect, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyledItemDelegate,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_model import IdRole


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


class ChatListView(QWidget):
    """Signals: new_chat_requested, open_requested(conv id), delete_requested(row) (already confirmed),
    export_requested(conv id, "md"|"json")."""

    new_chat_requested = Signal()
    open_requested = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)

    def __init__(self, conversations, parent=None) -> None:
        super().__init__(parent)
        self.conversations = conversations
        self.setMinimumWidth(150)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 6, 10)
        self.new_button = QPushButton("＋  New chat")
        self.new_button.setObjectName("Primary")
        self.new_button.clicked.connect(self.new_chat_requested)
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(conversations.set_search)
        self.list = QListView()
        self.list.setAccessibleName("Chats")
        self.list.setModel(conversations)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.clicked.connect(self._open_index)
        self.list.activated.connect(self._open_index)  # Enter on the highlighted chat (keyboard)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.installEventFilter(self)
        self.list.viewport().installEventFilter(self)  # right-click: a menu, not a move of the highlight
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.setItemDelegate(RenameDelegate(self.list))
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)

    def select_row(self, row: int) -> None:
        """Highlight the open chat (it does not open it again)."""
        if row >= 0:
            self.list.setCurrentIndex(self.conversations.index(row))

    def _open_index(self, index: QModelIndex) -> None:
        self.open_requested.emit(int(index.data(IdRole)))

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(index))
        conv_id = int(index.data(IdRole))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(conv_id, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(conv_id, "json"))
        menu.addAction("Delete", lambda: self.delete(index.row()))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def eventFilter(self, obj, event) -> bool:
        if obj is self.list.viewport() and event.type() in (
                QEvent.Type.MouseButtonPress, QEvent.Type.MouseButtonRelease, QEvent.Type.MouseButtonDblClick) \
                and event.button() == Qt.MouseButton.RightButton:
            return True  # the list would move its highlight to a chat it does not open; the menu still comes
        if obj is self.list and event.type() == QEvent.Type.KeyPress and event.key() == Qt.Key.Key_Delete:
            idx = self.list.currentIndex()
            if idx.isValid():
                self.delete(idx.row())
                return True
        return super().eventFilter(obj, event)

    def delete(self, row: int, confirm: bool = True) -> None:
        conv = self.conversations.conversation(row)
        if conv is None:
            return
        if confirm and QMessageBox.question(self, "Delete chat", f"Delete “{conv.title}” and all its messages?") \
                != QMessageBox.StandardButton.Yes:
            return
        self.delete_requested.emit(row)
