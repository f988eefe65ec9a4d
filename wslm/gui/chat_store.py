"""Conversations and their messages in one SQLite file in wslm.paths.data_dir().

Each write commits at once (WAL journal), so a crash or a killed app loses nothing already shown.

Messages form a tree (parent_id): editing a message or regenerating a reply adds a sibling, a new branch,
and keeps the old one. Each message remembers which child is shown (active_child; the conversation its
first message: active_root), so the chat is the active path from the root, and a branch keeps its own
choices when flipped away from and back to."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from wslm.gui.content_parts import ChatImage
from wslm.paths import data_dir

DB_FILE = "chats.sqlite3"
STREAMING = "streaming"  # in a message's stats while its reply is being written
# The stats of a reply cut short by the app ending mid-stream (shown as a stopped reply).
CUT_STATS = {"stopped": True, "cut": True, "finish_reason": "cut"}


def is_cut_short(stats: dict) -> bool:
    """A reply that ended before the model did (stopped, interrupted, cut by the app closing, at max tokens):
    Continue can ask for the rest."""
    return bool(stats.get("stopped") or stats.get("cut") or stats.get("interrupted")) \
        or stats.get("finish_reason") == "length"

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
-- Images sent with a message (the bytes as sent, a PNG thumbnail), in the chat's file: a reopened chat shows
-- them and sends them again with its history. Deleting the message deletes them.
CREATE TABLE IF NOT EXISTS message_images (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    mime TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    width INTEGER NOT NULL DEFAULT 0,
    height INTEGER NOT NULL DEFAULT 0,
    data BLOB NOT NULL,
    thumb BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS images_by_message ON message_images(message_id, position);
CREATE TABLE IF NOT EXISTS system_presets (
    name TEXT PRIMARY KEY,
    prompt TEXT NOT NULL,
    updated REAL NOT NULL
);
"""
# Columns added after the first release: added (ALTER TABLE) to a file that lacks them, new files included,
# so an old chat file opens as it is. NULL in a sampling column: not set, left out of the request.
ADDED_COLUMNS = (
    ("conversations", "active_root", "INTEGER"),
    ("conversations", "top_k", "INTEGER"),
    ("conversations", "min_p", "REAL"),
    ("conversations", "repetition_penalty", "REAL"),
    ("conversations", "seed", "INTEGER"),
    ("conversations", "stop", "TEXT"),  # a JSON list of strings
    ("conversations", "json_mode", "INTEGER"),
    ("conversations", "reasoning", "INTEGER"),  # 1 on, 0 off, NULL the model's default
    ("messages", "parent_id", "INTEGER"),
    ("messages", "active_child", "INTEGER"),
    ("system_presets", "params", "TEXT"),  # a JSON object: the preset's sampling (temperature, top_p, ...)
)
AFTER_LAST = -1  # add_message's default parent: the last message of the shown path


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
    # Optional sampling (None/empty/False: not sent, the server's default applies).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    json_mode: bool = False
    reasoning: bool | None = None  # chat_template_kwargs.enable_thinking


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # system | user | assistant
    content: str
    stats: dict = field(default_factory=dict)  # ttft_s, tokens, tokens_per_s, finish_reason
    error: str = ""
    created: float = 0.0
    parent_id: int | None = None
    siblings: list[int] = field(default_factory=list)  # ids of the branches at this point (itself included), oldest first
    images: list[ChatImage] = field(default_factory=list)  # sent with a user's message (content parts)


SAMPLING = ("top_k", "min_p", "repetition_penalty", "seed", "stop", "json_mode", "reasoning")
CONV_COLUMNS = "id, title, system_prompt, model, temperature, top_p, max_tokens, created, updated, " + ", ".join(SAMPLING)
MSG_COLUMNS = "id, conversation_id, role, content, stats, error, created, parent_id, active_child"
EDITABLE = {"title", "system_prompt", "model", "temperature", "top_p", "max_tokens", *SAMPLING}


def _conversation(row) -> Conversation:
    *base, top_k, min_p, rep, seed, stop, json_mode, reasoning = row
    return Conversation(*base, top_k=top_k, min_p=min_p, repetition_penalty=rep, seed=seed,
                        stop=json.loads(stop) if stop else [], json_mode=bool(json_mode),
                        reasoning=None if reasoning is None else bool(reasoning))


def _column_value(name: str, value):
    if name == "stop":
        return json.dumps(list(value)) if value else None
    if name in ("json_mode", "reasoning") and value is not None:
        return int(bool(value))
    return value


def _message(r) -> Message:
    return Message(r[0], r[1], r[2], r[3], json.loads(r[4] or "{}"), r[5], r[6], r[7])


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
        self._migrate()
        # After _migrate: an old file has the column only from there. Deletes look children up by it.
        self._db.execute("CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id)")
        self._db.commit()
        self.recover_cut_replies()

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        """Add what a file from an older version lacks, in one transaction (a crash half-way would leave
        messages without parents): the columns, the links of its linear chats, its regenerated versions."""
        missing = [(t, c, d) for t, c, d in ADDED_COLUMNS
                   if c not in {r[1] for r in self._db.execute(f"PRAGMA table_info({t})")}]
        if not missing:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for table, column, decl in missing:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            if any(c == "parent_id" for _, c, _ in missing):
                self._link_old_chats()
            self._db.commit()
        except BaseException:
            self._db.rollback()
            raise

    def _link_old_chats(self) -> None:
        """Chats written before branches were a list: each message's parent is the one before it. A reply
        regenerated then kept its versions in its stats; they become sibling branches."""
        rows = self._db.execute("SELECT id, conversation_id, stats, created FROM messages ORDER BY conversation_id, id").fetchall()
        prev: dict[int, int] = {}
        for msg_id, conv_id, _stats, _created in rows:
            parent = prev.get(conv_id)
            if parent is None:
                self._db.execute("UPDATE conversations SET active_root = ? WHERE id = ?", (msg_id, conv_id))
            else:
                self._db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (parent, msg_id))
                self._db.execute("UPDATE messages SET active_child = ? WHERE id = ?", (msg_id, parent))
            prev[conv_id] = msg_id
        for msg_id, conv_id, stats_text, created in rows:
            stats = json.loads(stats_text or "{}")
            versions = stats.pop("versions", None)
            if not versions:
                continue
            shown = int(stats.pop("version", len(versions) - 1))
            parent = self._db.execute("SELECT parent_id FROM messages WHERE id = ?", (msg_id,)).fetchone()[0]
            for i, version in enumerate(versions):
                if i == shown:
                    continue
                # Siblings are ordered by creation: the versions keep their ‹ i/n › places around the shown one.
                self._db.execute(
                    "INSERT INTO messages (conversation_id, role, content, stats, error, created, parent_id) "
                    "VALUES (?, 'assistant', ?, ?, '', ?, ?)",
                    (conv_id, version.get("content", ""), json.dumps(version.get("stats") or {}),
                     created + (i - shown) * 1e-3, parent))
            self._db.execute("UPDATE messages SET stats = ? WHERE id = ?", (json.dumps(stats), msg_id))

    # Conversations
    def create_conversation(self, title: str = "New chat", **params) -> Conversation:
        now = time.time()
        cols = {k: _column_value(k, v) for k, v in params.items() if k in EDITABLE and k != "title"}
        names = ", ".join(["title", "created", "updated", *cols])
        marks = ", ".join("?" * (3 + len(cols)))
        cur = self._db.execute(
            f"INSERT INTO conversations ({names}) VALUES ({marks})", (title, now, now, *cols.values())
        )
        self._db.commit()
        return self.get_conversation(int(cur.lastrowid))

    def get_conversation(self, conv_id: int) -> Conversation | None:
        row = self._db.execute(f"SELECT {CONV_COLUMNS} FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        return _conversation(row) if row else None

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
        return [_conversation(r) for r in rows]

    def empty_conversation(self) -> int | None:
        """The newest conversation without a message (a "New chat" never written in), None when none."""
        row = self._db.execute(
            "SELECT id FROM conversations c WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id) "
            "ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return int(row[0]) if row else None

    def update_conversation(self, conv_id: int, **changes) -> None:
        bad = set(changes) - EDITABLE
        if bad:
            raise ValueError(f"cannot change {sorted(bad)}")
        if not changes:
            return
        sets = ", ".join(f"{k} = ?" for k in changes)
        self._db.execute(
            f"UPDATE conversations SET {sets}, updated = ? WHERE id = ?",
            (*(_column_value(k, v) for k, v in changes.items()), time.time(), conv_id),
        )
        self._db.commit()

    def delete_conversation(self, conv_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
        self._db.commit()

    # Messages
    def add_message(self, conv_id: int, role: str, content: str, stats: dict | None = None, error: str = "",
                    parent_id: int | None = AFTER_LAST, images: list[ChatImage] | None = None) -> Message:
        """Add a message under `parent_id` (None: a first message; AFTER_LAST: after the shown path's last)
        and show it: it becomes its parent's active child, so a second child is a new branch."""
        if parent_id == AFTER_LAST:
            path = self.messages(conv_id, images=False)
            parent_id = path[-1].id if path else None
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, stats, error, created, parent_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conv_id, role, content, json.dumps(stats or {}), error, now, parent_id),
        )
        msg_id = int(cur.lastrowid)
        self._db.executemany(
            "INSERT INTO message_images (message_id, position, mime, name, width, height, data, thumb) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(msg_id, i, im.mime, im.name, im.width, im.height, im.data, im.thumb) for i, im in enumerate(images or [])])
        self._set_active(conv_id, parent_id, msg_id)
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
        self._db.commit()
        return Message(msg_id, conv_id, role, content, stats or {}, error, now, parent_id,
                       self._children(conv_id, parent_id), list(images or []))

    def _with_images(self, messages: list[Message]) -> list[Message]:
        """Fill in the messages' images (one query for the chat)."""
        if not messages:
            return messages
        by_id = {m.id: m for m in messages}
        marks = ", ".join("?" * len(by_id))
        for msg_id, mime, name, w, h, data, thumb in self._db.execute(
                f"SELECT message_id, mime, name, width, height, data, thumb FROM message_images "
                f"WHERE message_id IN ({marks}) ORDER BY message_id, position", list(by_id)):
            by_id[msg_id].images.append(ChatImage(mime, bytes(data), name, bytes(thumb), w, h))
        return messages

    def _children(self, conv_id: int, parent_id: int | None) -> list[int]:
        return [r[0] for r in self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY created, id",
            (conv_id, parent_id))]

    def _set_active(self, conv_id: int, parent_id: int | None, child_id: int | None) -> None:
        if parent_id is None:
            self._db.execute("UPDATE conversations SET active_root = ? WHERE id = ?", (child_id, conv_id))
        else:
            self._db.execute("UPDATE messages SET active_child = ? WHERE id = ?", (child_id, parent_id))

    def select_branch(self, msg_id: int) -> None:
        """Show the branch that `msg_id` starts (its parent's active child from now on)."""
        row = self._db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
        if row:
            self._set_active(row[0], row[1], msg_id)
            self._db.commit()

    def siblings(self, msg_id: int) -> list[int]:
        row = self._db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
        return self._children(*row) if row else []

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
        # An MCP tool call still asking or running (tool_loop) when the app ended: it never finished.
        calls = self._db.execute("SELECT id, stats FROM messages WHERE role = 'tool' AND (stats LIKE ? OR stats LIKE ?)",
                                 ('%"state": "confirm"%', '%"state": "running"%')).fetchall()
        for msg_id, stats in calls:
            self.update_message(msg_id, content="The app was closed before this tool call finished.",
                                stats={**json.loads(stats or "{}"), "state": "cancelled"})
        return len(rows)

    def delete_message(self, msg_id: int) -> None:
        """Delete one message; its children move up to its parent, so the rest of the chat stays (and the
        path shown goes on with what followed it)."""
        row = self._db.execute("SELECT conversation_id, parent_id, active_child FROM messages WHERE id = ?",
                               (msg_id,)).fetchone()
        if row is None:
            return
        conv_id, parent_id, active = row
        kids = self._children(conv_id, msg_id)
        self._db.execute("UPDATE messages SET parent_id = ? WHERE parent_id = ?", (parent_id, msg_id))
        if self._active(conv_id, parent_id) == msg_id:
            self._set_active(conv_id, parent_id, active if active in kids else (kids[-1] if kids else None))
        self._db.execute("DELETE FROM messages WHERE id = ?", (msg_id,))
        self._db.commit()

    def delete_branch(self, msg_id: int) -> None:
        """Delete a message and everything that follows it, in every branch."""
        row = self._db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (msg_id,)).fetchone()
        if row is None:
            return
        conv_id, parent_id = row
        doomed, todo = [], [msg_id]
        while todo:
            doomed += todo
            marks = ", ".join("?" * len(todo))
            todo = [r[0] for r in self._db.execute(f"SELECT id FROM messages WHERE parent_id IN ({marks})", todo)]
        if self._active(conv_id, parent_id) == msg_id:
            self._set_active(conv_id, parent_id, None)  # the newest sibling left, if any
        self._db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
        self._db.commit()

    def _active(self, conv_id: int, parent_id: int | None) -> int | None:
        if parent_id is None:
            row = self._db.execute("SELECT active_root FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        else:
            row = self._db.execute("SELECT active_child FROM messages WHERE id = ?", (parent_id,)).fetchone()
        return row[0] if row else None

    def messages(self, conv_id: int, images: bool = True) -> list[Message]:
        """The chat as shown: the path from the first message through each one's active child (the newest
        child where none was chosen), each message with its siblings (the other branches there) and, unless
        `images` is False (only the path wanted), its images."""
        rows = self._db.execute(
            f"SELECT {MSG_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY created, id", (conv_id,)
        ).fetchall()
        children: dict[int | None, list] = {}
        for r in rows:
            children.setdefault(r[7], []).append(r)
        root = self._active(conv_id, None)
        path, kids, chosen = [], children.get(None, []), root
        while kids:
            r = next((k for k in kids if k[0] == chosen), kids[-1])
            msg = _message(r)
            msg.siblings = [k[0] for k in kids]
            path.append(msg)
            kids, chosen = children.get(r[0], []), r[8]
        return self._with_images(path) if images else path

    def all_messages(self, conv_id: int) -> list[Message]:
        """Every message of every branch, oldest first."""
        rows = self._db.execute(
            f"SELECT {MSG_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,)
        ).fetchall()
        return self._with_images([_message(r) for r in rows])

    # System-prompt presets
    def presets(self) -> dict[str, str]:
        """Saved system prompts by name, in name order."""
        rows = self._db.execute("SELECT name, prompt FROM system_presets ORDER BY name COLLATE NOCASE").fetchall()
        return dict(rows)

    def preset_params(self, name: str) -> dict:
        """A preset's sampling parameters (temperature, top_p, max_tokens, top_k, ...), {} for a preset saved
        with its prompt only."""
        row = self._db.execute("SELECT params FROM system_presets WHERE name = ?", (name,)).fetchone()
        try:
            params = json.loads(row[0]) if row and row[0] else {}
        except ValueError:
            return {}
        return {k: v for k, v in params.items() if k in EDITABLE - {"title", "system_prompt", "model"}} \
            if isinstance(params, dict) else {}

    def save_preset(self, name: str, prompt: str, params: dict | None = None) -> None:
        """Save (or replace) a preset: its system prompt and, like LM Studio's, its sampling parameters."""
        self._db.execute(
            "INSERT INTO system_presets (name, prompt, updated, params) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET prompt = excluded.prompt, updated = excluded.updated, "
            "params = excluded.params",
            (name, prompt, time.time(), json.dumps(params) if params else None))
        self._db.commit()

    def delete_preset(self, name: str) -> None:
        self._db.execute("DELETE FROM system_presets WHERE name = ?", (name,))
        self._db.commit()
