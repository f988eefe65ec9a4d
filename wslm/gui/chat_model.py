"""Qt list models over the chat store: the conversation list and the messages of one conversation."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt
from PySide6.QtGui import QColor

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.chat_store import ChatStore, Conversation, Message

IdRole = Qt.ItemDataRole.UserRole + 1
RoleRole = Qt.ItemDataRole.UserRole + 2
StatsRole = Qt.ItemDataRole.UserRole + 3
ErrorRole = Qt.ItemDataRole.UserRole + 4
StreamingRole = Qt.ItemDataRole.UserRole + 5
BusyRole = Qt.ItemDataRole.UserRole + 6


class ConversationListModel(QAbstractListModel):
    """Conversations, newest first, filtered by a search string."""

    def __init__(self, store: ChatStore, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self._items: list[Conversation] = []
        self._search = ""
        self._busy: set[int] = set()  # chats streaming a reply (shown with a dot, possibly in the background)
        self.refresh()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        conv = self._items[index.row()]
        busy = conv.id in self._busy
        if role == Qt.ItemDataRole.DisplayRole:
            return f"● {conv.title}" if busy else conv.title
        if role == Qt.ItemDataRole.EditRole:
            return conv.title
        if role == IdRole:
            return conv.id
        if role == BusyRole:
            return busy
        if role == Qt.ItemDataRole.ForegroundRole and busy:
            return QColor(theme.ACCENT)
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{conv.title} (writing a reply…)" if busy else conv.title
        return None

    def set_busy(self, conv_id: int, busy: bool) -> None:
        (self._busy.add if busy else self._busy.discard)(conv_id)
        row = self.row_of(conv_id)
        if row >= 0:
            self.dataChanged.emit(self.index(row), self.index(row))

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        return super().flags(index) | Qt.ItemFlag.ItemIsEditable

    def setData(self, index: QModelIndex, value, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if role != Qt.ItemDataRole.EditRole or not index.isValid():
            return False
        return self.rename(index.row(), str(value))

    def conversation(self, row: int) -> Conversation | None:
        return self._items[row] if 0 <= row < len(self._items) else None

    def row_of(self, conv_id: int) -> int:
        return next((i for i, c in enumerate(self._items) if c.id == conv_id), -1)

    def set_search(self, text: str) -> None:
        self._search = text.strip()
        self.refresh()

    def refresh(self) -> None:
        self.beginResetModel()
        self._items = self.store.list_conversations(self._search)
        self.endResetModel()

    def create(self, **params) -> Conversation:
        conv = self.store.create_conversation(**params)
        self.beginInsertRows(QModelIndex(), 0, 0)
        self._items.insert(0, conv)
        self.endInsertRows()
        return conv

    def rename(self, row: int, title: str) -> bool:
        title = title.strip()
        conv = self.conversation(row)
        if conv is None or not title:
            return False
        self.store.update_conversation(conv.id, title=title)
        conv.title = title
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)
        return True

    def delete(self, row: int) -> None:
        conv = self.conversation(row)
        if conv is None:
            return
        self.store.delete_conversation(conv.id)
        self.beginRemoveRows(QModelIndex(), row, row)
        del self._items[row]
        self.endRemoveRows()

    def touch(self, conv_id: int) -> None:
        """A conversation got a message: move it to the top, as the store now orders it."""
        row = self.row_of(conv_id)
        if row > 0:
            self.beginMoveRows(QModelIndex(), row, row, QModelIndex(), 0)
            self._items.insert(0, self._items.pop(row))
            self.endMoveRows()
        fresh = self.store.get_conversation(conv_id)
        row = self.row_of(conv_id)
        if fresh and row >= 0:
            self._items[row] = fresh
            self.dataChanged.emit(self.index(row), self.index(row))


class MessageListModel(QAbstractListModel):
    """The messages of the current conversation; the streaming reply grows in place."""

    def __init__(self, store: ChatStore, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.conversation_id = 0
        self._items: list[Message] = []
        self.streaming_row = -1

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        msg = self._items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return msg.content
        if role == RoleRole:
            return msg.role
        if role == StatsRole:
            return msg.stats
        if role == ErrorRole:
            return msg.error
        if role == IdRole:
            return msg.id
        if role == StreamingRole:
            return index.row() == self.streaming_row
        return None

    def messages(self) -> list[Message]:
        return list(self._items)

    def message(self, row: int) -> Message | None:
        return self._items[row] if 0 <= row < len(self._items) else None

    def load(self, conv_id: int) -> None:
        self.beginResetModel()
        self.conversation_id = conv_id
        self._items = self.store.messages(conv_id) if conv_id else []
        self.streaming_row = -1
        self.endResetModel()

    def append(self, role: str, content: str, error: str = "", images: list | None = None) -> int:
        """Add a message after the last one shown (a new branch there when that one had replies); `images`:
        content_parts.ChatImage sent with it."""
        parent = self._items[-1].id if self._items else None
        msg = self.store.add_message(self.conversation_id, role, content, error=error, parent_id=parent,
                                     images=images)
        row = len(self._items)
        self.beginInsertRows(QModelIndex(), row, row)
        self._items.append(msg)
        self.endInsertRows()
        return row

    def cut_view(self, row: int) -> None:
        """Stop showing `row` and after, keeping them in the store: the next append starts a new branch at
        `row` (edit, regenerate), and the old one stays one flip away."""
        if row >= len(self._items):
            return
        self.beginRemoveRows(QModelIndex(), row, len(self._items) - 1)
        del self._items[row:]
        self.endRemoveRows()

    def show_branch(self, row: int, msg_id: int) -> None:
        """Show the branch `msg_id` (a sibling of the message at `row`) from `row` on, as the store keeps it."""
        self.store.select_branch(msg_id)
        self._reload_from(row)

    def _reload_from(self, row: int) -> None:
        fresh = self.store.messages(self.conversation_id)
        if row < len(self._items):
            self.beginRemoveRows(QModelIndex(), row, len(self._items) - 1)
            del self._items[row:]
            self.endRemoveRows()
        if row < len(fresh):
            self.beginInsertRows(QModelIndex(), row, len(fresh) - 1)
            self._items.extend(fresh[row:])
            self.endInsertRows()

    def attach_stream(self, message: Message) -> None:
        """Show `message` (a reply still streaming in memory) in place of its saved copy, as the
        streaming row."""
        row = next((i for i, m in enumerate(self._items) if m.id == message.id), -1)
        if row < 0:
            return
        self._items[row] = message
        self.streaming_row = row
        self.dataChanged.emit(self.index(row), self.index(row))

    def touch_row(self, row: int) -> None:
        """The message changed in memory (its streaming reasoning): repaint it."""
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)

    def append_text(self, row: int, text: str) -> None:
        """Streamed delta: kept in memory; written to SQLite by finish() (not per token)."""
        self._items[row].content += text
        idx = self.index(row)
        self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DisplayRole])

    def finish(self, row: int, stats: dict | None = None, error: str = "") -> None:
        msg = self._items[row]
        if stats is not None:
            msg.stats = stats
        msg.error = error
        self.store.update_message(msg.id, content=msg.content, stats=msg.stats, error=error)
        if self.streaming_row == row:
            self.streaming_row = -1
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)

    def remove_row(self, row: int) -> None:
        """Delete one message (from SQLite too); what followed it moves up in its place."""
        if not 0 <= row < len(self._items):
            return
        self.beginRemoveRows(QModelIndex(), row, row)
        self.store.delete_message(self._items[row].id)
        del self._items[row]
        if self.streaming_row > row:
            self.streaming_row -= 1
        self.endRemoveRows()
        if self.streaming_row < 0:  # the path goes on with what followed it, or with a sibling branch
            self._reload_from(row)

    def remove_from(self, row: int) -> None:
        """Delete `row` and everything after it, every branch from there included."""
        if row >= len(self._items):
            return
        self.store.delete_branch(self._items[row].id)
        self._reload_from(row)  # a sibling of the deleted, if any, now shows there
