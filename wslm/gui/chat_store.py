"""Conversations and their messages in one SQLite file in wslm.paths.data_dir().

Each write commits at once (WAL journal), so a crash or a killed app loses nothing already shown."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from wslm.paths import data_dir

DB_FILE = "chats.sqlite3"
STREAMING = "streaming"  # in a message's stats while its reply is being written
# The stats of a reply cut short by the app ending mid-stream (shown as a stopped reply).
CUT_STATS = {"stopped": True, "cut": True, "finish_reason": "cut"}

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    temperature REAL NOT NULL DEFAULT 0.7,
    top_p REAL NOT NULL DEFAULT 0.95,
    max_tokens INTEGER NOT NULL DEFAULT 1024,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str = ""
    model: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 1024
    created: float = 0.0
    updated: float = 0.0


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # system | user | assistant
    content: str
    stats: dict = field(default_factory=dict)  # ttft_s, tokens, tokens_per_s, finish_reason
    error: str = ""
    created: float = 0.0


CONV_COLUMNS = "id, title, system_prompt, model, temperature, top_p, max_tokens, created, updated"
MSG_COLUMNS = "id, conversation_id, role, content, stats, error, created"
EDITABLE = {"title", "system_prompt", "model", "temperature", "top_p", "max_tokens"}


def default_db_path() -> Path:
    return data_dir() / DB_FILE


class ChatStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else default_db_path()
        self._db = sqlite3.connect(str(self.path))
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(SCHEMA)
        self._db.commit()
        self.recover_cut_replies()

    def close(self) -> None:
        self._db.close()

    # Conversations
    def create_conversation(self, title: str = "New chat", **params) -> Conversation:
        now = time.time()
        cols = {k: v for k, v in params.items() if k in EDITABLE and k != "title"}
        names = ", ".join(["title", "created", "updated", *cols])
        marks = ", ".join("?" * (3 + len(cols)))
        cur = self._db.execute(
            f"INSERT INTO conversations ({names}) VALUES ({marks})", (title, now, now, *cols.values())
        )
        self._db.commit()
        return self.get_conversation(int(cur.lastrowid))

    def get_conversation(self, conv_id: int) -> Conversation | None:
        row = self._db.execute(f"SELECT {CONV_COLUMNS} FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        return Conversation(*row) if row else None

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches the title or any message text (case-insensitive)."""
        if search:
            like = f"%{search}%"
            rows = self._db.execute(
                f"SELECT {CONV_COLUMNS} FROM conversations WHERE title LIKE ? OR id IN "
                "(SELECT conversation_id FROM messages WHERE content LIKE ?) ORDER BY updated DESC, id DESC",
                (like, like),
            ).fetchall()
        else:
            rows = self._db.execute(
                f"SELECT {CONV_COLUMNS} FROM conversations ORDER BY updated DESC, id DESC"
            ).fetchall()
        return [Conversation(*r) for r in rows]

    def update_conversation(self, conv_id: int, **changes) -> None:
        bad = set(changes) - EDITABLE
        if bad:
            raise ValueError(f"cannot change {sorted(bad)}")
        if not changes:
            return
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._db.execute(
            f"UPDATE conversations SET {sets}, updated = ? WHERE id = ?",
            (*changes.values(), time.time(), conv_id),
        )
        self._db.commit()

    def delete_conversation(self, conv_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
        self._db.commit()

    # Messages
    def add_message(self, conv_id: int, role: str, content: str, stats: dict | None = None, error: str = "") -> Message:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, stats, error, created) VALUES (?, ?, ?, ?, ?, ?)",
            (conv_id, role, content, json.dumps(stats or {}), error, now),
        )
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
        self._db.commit()
        return Message(int(cur.lastrowid), conv_id, role, content, stats or {}, error, now)

    def update_message(self, msg_id: int, content: str | None = None, stats: dict | None = None,
                       error: str | None = None) -> None:
        sets, values = [], []
        for name, value in (("content", content), ("stats", None if stats is None else json.dumps(stats)),
                            ("error", error)):
            if value is not None:
                sets.append(f"{name} = ?")
                values.append(value)
        if sets:
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*values, msg_id))
            self._db.commit()

    # Replies being streamed: saved as they grow, so a killed app keeps what was shown
    def begin_reply(self, msg_id: int) -> None:
        """Mark a reply as being streamed; finish (update_message with its final stats) clears the mark."""
        self.update_message(msg_id, stats={STREAMING: True})

    def save_partial(self, msg_id: int, content: str) -> None:
        self.update_message(msg_id, content=content)

    def recover_cut_replies(self) -> int:
        """Replies still marked as streaming when the store opens were cut by the app being killed (or the
        machine going down) mid-stream: keep their text and mark them cut. Returns how many."""
        rows = self._db.execute(
            "SELECT id, content FROM messages WHERE role = 'assistant' AND stats LIKE ?", (f'%"{STREAMING}": true%',)
        ).fetchall()
        for msg_id, content in rows:
            error = "" if content else "The app was closed before this reply arrived."
            self.update_message(msg_id, stats=dict(CUT_STATS), error=error)
        return len(rows)

    def delete_message(self, msg_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (msg_id,))
        self._db.commit()

    def messages(self, conv_id: int) -> list[Message]:
        rows = self._db.execute(
            f"SELECT {MSG_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,)
        ).fetchall()
        return [Message(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}"), r[5], r[6]) for r in rows]
