"""The chat store's message tree (branches, the active path, deletes), an old chat file opened by this
version, per-chat sampling parameters and system-prompt presets. SQLite only: no Qt."""

from __future__ import annotations

import json
import sqlite3

from wslm.gui.chat_export import to_json
from wslm.gui.chat_session import format_stop, parse_stop, sampling_extra
from wslm.gui.chat_store import ChatStore, is_cut_short

# The schema as the first release wrote it (no branches, no sampling columns, no presets).
OLD_SCHEMA = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '', temperature REAL NOT NULL DEFAULT 0.7, top_p REAL NOT NULL DEFAULT 0.95,
    max_tokens INTEGER NOT NULL DEFAULT 1024, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL, content TEXT NOT NULL, stats TEXT NOT NULL DEFAULT '{}', error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL);
"""


def contents(store: ChatStore, conv_id: int) -> list[str]:
    return [m.content for m in store.messages(conv_id)]


def test_branches_keep_the_old_path_and_switch(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    conv = store.create_conversation("t")
    q = store.add_message(conv.id, "user", "q")  # parent: the end of the shown path
    a1 = store.add_message(conv.id, "assistant", "a1")
    q2 = store.add_message(conv.id, "user", "q2")
    store.add_message(conv.id, "assistant", "a2")
    assert contents(store, conv.id) == ["q", "a1", "q2", "a2"] and q2.parent_id == a1.id
    # Regenerate a1: a sibling under q, shown from now on; what followed a1 is kept.
    b1 = store.add_message(conv.id, "assistant", "b1", parent_id=q.id)
    assert b1.siblings == [a1.id, b1.id]
    path = store.messages(conv.id)
    assert [m.content for m in path] == ["q", "b1"] and path[1].siblings == [a1.id, b1.id]
    store.select_branch(a1.id)
    assert contents(store, conv.id) == ["q", "a1", "q2", "a2"]
    # Edit the first message: a new root.
    e = store.add_message(conv.id, "user", "q edited", parent_id=None)
    store.add_message(conv.id, "assistant", "e1")
    assert contents(store, conv.id) == ["q edited", "e1"] and store.messages(conv.id)[0].siblings == [q.id, e.id]
    store.select_branch(q.id)  # each branch keeps its own choice below it
    assert contents(store, conv.id) == ["q", "a1", "q2", "a2"]
    assert len(store.all_messages(conv.id)) == 7

    # Delete one message: what followed it moves up; a deleted leaf shows its sibling instead.
    store.delete_message(q2.id)
    assert contents(store, conv.id) == ["q", "a1", "a2"]
    store.select_branch(b1.id)
    store.delete_message(b1.id)
    assert contents(store, conv.id) == ["q", "a1", "a2"]
    # Delete a branch: the message and everything after it.
    store.delete_branch(a1.id)
    assert contents(store, conv.id) == ["q"] and len(store.all_messages(conv.id)) == 3
    store.delete_branch(q.id)
    assert contents(store, conv.id) == ["q edited", "e1"]
    store.close()


def test_an_old_chat_file_opens_with_its_versions_as_branches(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO conversations (title, temperature, created, updated) VALUES ('old', 0.3, 1, 1)")
    versions = [{"content": "v1", "stats": {"tokens": 1}}, {"content": "v2", "stats": {"tokens": 2}},
                {"content": "v3", "stats": {"tokens": 3}}]
    rows = [("user", "hi", {}), ("assistant", "v2", {"tokens": 2, "versions": versions, "version": 1}),
            ("user", "more", {}), ("assistant", "sure", {"finish_reason": "length"})]
    for i, (role, content, stats) in enumerate(rows):
        db.execute("INSERT INTO messages (conversation_id, role, content, stats, created) VALUES (1, ?, ?, ?, ?)",
                   (role, content, json.dumps(stats), 10.0 + i))
    db.commit()
    db.close()

    store = ChatStore(path)
    conv = store.get_conversation(1)
    assert conv.temperature == 0.3 and conv.top_k is None and conv.stop == [] and conv.reasoning is None
    shown = store.messages(1)
    assert [m.content for m in shown] == ["hi", "v2", "more", "sure"]
    reply = shown[1]
    assert "versions" not in reply.stats and reply.stats["tokens"] == 2
    branches = {m.id: m for m in store.all_messages(1)}
    assert [branches[i].content for i in reply.siblings] == ["v1", "v2", "v3"]  # their ‹ 1/3 › order
    assert branches[reply.siblings[2]].stats == {"tokens": 3}
    store.select_branch(reply.siblings[0])
    assert contents(store, 1) == ["hi", "v1"]
    store.select_branch(reply.siblings[1])
    store.add_message(1, "user", "new")  # the chat goes on as before
    assert contents(store, 1) == ["hi", "v2", "more", "sure", "new"]
    store.close()
    again = ChatStore(path)  # opened again: migrated once, not twice
    assert contents(again, 1) == ["hi", "v2", "more", "sure", "new"] and len(again.all_messages(1)) == 7
    again.close()


def test_sampling_parameters_per_chat(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    conv = store.create_conversation("t", top_k=40, stop=["###"])
    assert conv.top_k == 40 and conv.stop == ["###"] and sampling_extra(conv) == {"top_k": 40, "stop": ["###"]}
    store.update_conversation(conv.id, min_p=0.1, seed=0, json_mode=True, reasoning=False, stop=[])
    conv = store.get_conversation(conv.id)
    assert sampling_extra(conv) == {"top_k": 40, "min_p": 0.1, "seed": 0, "response_format": {"type": "json_object"},
                                    "chat_template_kwargs": {"enable_thinking": False}}
    params = json.loads(to_json(conv, []))["parameters"]
    assert params["seed"] == 0 and params["reasoning"] is False and params["json_mode"] and "stop" not in params
    store.update_conversation(conv.id, top_k=None, min_p=None, seed=None, json_mode=False, reasoning=None)
    assert sampling_extra(store.get_conversation(conv.id)) == {}
    assert sampling_extra(None) == {}
    store.close()


def test_stop_strings_round_trip():
    assert parse_stop(r"###, \n\n, a\,b, , \\x") == ["###", "\n\n", "a,b", "\\x"]
    for stops in (["###", "\n\n", "a,b", "\\x", "\t"], []):
        assert parse_stop(format_stop(stops)) == stops


def test_cut_short():
    assert is_cut_short({"stopped": True}) and is_cut_short({"finish_reason": "length"})
    assert is_cut_short({"interrupted": "the model was switched"}) and is_cut_short({"cut": True})
    assert not is_cut_short({"finish_reason": "stop"}) and not is_cut_short({})


def test_system_prompt_presets(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    assert store.presets() == {}
    store.save_preset("b coder", "Write code.")
    store.save_preset("A pirate", "Arr.")
    store.save_preset("b coder", "Write good code.")  # saving a name again replaces it
    assert list(store.presets().items()) == [("A pirate", "Arr."), ("b coder", "Write good code.")]
    store.delete_preset("A pirate")
    store.close()
    again = ChatStore(tmp_path / "c.sqlite3")
    assert again.presets() == {"b coder": "Write good code."}
    again.close()
