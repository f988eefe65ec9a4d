"""A chat's attached documents in the chats' SQLite file: the files (a small one's whole text) and the
passages of larger ones with their embeddings (float32 blobs).

Both tables hang off conversations(id) with ON DELETE CASCADE, so deleting a chat (through ChatStore,
whose connection enforces foreign keys) deletes its documents too. This store keeps its own connection to
the same file (WAL); it is used on the GUI thread only (worker threads open their own, read-only)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from wslm.gui.rag import Ingested

READING, WHOLE, EMBEDDED, ERROR = "reading", "whole", "embedded", "error"

SCHEMA = """
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    path TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'reading',
    tokens INTEGER NOT NULL DEFAULT 0,
    text TEXT NOT NULL DEFAULT '',
    embed_url TEXT NOT NULL DEFAULT '',
    embed_model TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS attachments_by_conversation ON attachments(conversation_id, id);
CREATE TABLE IF NOT EXISTS attachment_chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attachment_id INTEGER NOT NULL REFERENCES attachments(id) ON DELETE CASCADE,
    label TEXT NOT NULL,
    text TEXT NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_attachment ON attachment_chunks(attachment_id);
"""


@dataclass
class Attachment:
    id: int
    conversation_id: int
    name: str
    path: str
    status: str  # reading | whole | embedded | error
    tokens: int = 0
    error: str = ""
    embed_url: str = ""  # as set when it was embedded ("": the chat's own server)
    embed_model: str = ""
    chunks: int = 0


COLUMNS = "a.id, a.conversation_id, a.name, a.path, a.status, a.tokens, a.error, a.embed_url, a.embed_model"


class RagStore:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, timeout=10)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(SCHEMA)
        # Files still being read when the app last closed were never finished: say so (attach again).
        self._db.execute("UPDATE attachments SET status = ?, error = ? WHERE status = ?",
                         (ERROR, "The app closed while reading this file: remove it and attach it again.", READING))
        self._db.commit()

    def close(self) -> None:
        self._db.close()

    def add(self, conv_id: int, path: str) -> Attachment:
        """A file being read (status "reading") until finish() or fail()."""
        name = Path(path).name
        cur = self._db.execute("INSERT INTO attachments (conversation_id, name, path, created) VALUES (?, ?, ?, ?)",
                               (conv_id, name, str(path), time.time()))
        self._db.commit()
        return Attachment(int(cur.lastrowid), conv_id, name, str(path), READING)

    def finish(self, att_id: int, result: Ingested, embed_url: str = "", embed_model: str = "") -> bool:
        """Store what reading the file gave; False when the attachment (or its chat) was deleted meanwhile."""
        cur = self._db.execute(
            "UPDATE attachments SET status = ?, tokens = ?, text = ?, embed_url = ?, embed_model = ?, error = '' "
            "WHERE id = ?",
            (result.kind, result.tokens, result.text, embed_url if result.kind == EMBEDDED else "",
             embed_model if result.kind == EMBEDDED else "", att_id))
        if cur.rowcount == 0:
            self._db.rollback()
            return False
        self._db.executemany("INSERT INTO attachment_chunks (attachment_id, label, text, vector) VALUES (?, ?, ?, ?)",
                             [(att_id, p.label, p.text, v) for p, v in zip(result.passages, result.vectors)])
        self._db.commit()
        return True

    def fail(self, att_id: int, error: str) -> None:
        self._db.execute("UPDATE attachments SET status = ?, error = ? WHERE id = ?", (ERROR, error, att_id))
        self._db.commit()

    def remove(self, att_id: int) -> None:
        self._db.execute("DELETE FROM attachments WHERE id = ?", (att_id,))
        self._db.commit()

    def get(self, att_id: int) -> Attachment | None:
        row = self._db.execute(
            f"SELECT {COLUMNS}, (SELECT COUNT(*) FROM attachment_chunks c WHERE c.attachment_id = a.id) "
            "FROM attachments a WHERE a.id = ?", (att_id,)).fetchone()
        return Attachment(*row) if row else None

    def of_chat(self, conv_id: int) -> list[Attachment]:
        rows = self._db.execute(
            f"SELECT {COLUMNS}, (SELECT COUNT(*) FROM attachment_chunks c WHERE c.attachment_id = a.id) "
            "FROM attachments a WHERE a.conversation_id = ? ORDER BY a.id", (conv_id,)).fetchall()
        return [Attachment(*r) for r in rows]

    def chunk_count(self) -> int:
        """All passages in the file (tests: deleting a chat deletes its passages)."""
        return int(self._db.execute("SELECT COUNT(*) FROM attachment_chunks").fetchone()[0])
