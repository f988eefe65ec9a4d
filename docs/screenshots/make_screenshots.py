"""Regenerate the README screenshots: a real demo server (CPU is fine), a seeded chat, a model download
from the loopback hub and LAN sharing on against the fake Windows programs of tests/fake_windows.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_screenshots.py [OUT_DIR]

Plain `wslm gui --screenshot DIR` renders whatever the user's own app shows; this script only stages
something worth showing first (docs/screenshots/README.md says which parts are staged). It also writes
model-switch/*.png: the Chat panel's model picker switching the server from the demo to a tiny random
Llama (a real stop, start and reply). Everything lives in a temporary config dir."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

CJK_REPLY = """**列表推导式**（list comprehension）是一种用一行代码创建列表的写法，比 `for` 循环更简洁。

基本形式：

```python
squares = [x * x for x in range(10) if x % 2 == 0]
print(squares)  # [0, 4, 16, 36, 64]
```

要点：
- 方括号里先写*表达式*，再写 `for` 子句
- 可以加 `if` 条件过滤元素
- 结果是一个新的列表，原来的数据不变"""

JS_REPLY = """In JavaScript there is no comprehension syntax, but `filter` and `map` do the same:

```js
const squares = [...Array(10).keys()]
  .filter((x) => x % 2 === 0)
  .map((x) => x * x);
console.log(squares); // [0, 4, 16, 36, 64]
```

| Python | JavaScript |
|---|---|
| `if` clause | `filter()` |
| expression | `map()` |"""


NOTES = """# Kyoto trip notes

## Temples
Kinkaku-ji opens at 9:00; go early, before the tour buses. Fushimi Inari's gates are open all night.

## Food
Nishiki Market closes around 18:00. Try yudofu (simmered tofu) near Nanzen-ji."""

RAG_REPLY = """Per your notes, go to **Kinkaku-ji right at 9:00**, when it opens and before the tour buses
arrive. Fushimi Inari is open all night, so it fits an evening walk instead."""

BRANCH_REPLIES = [
    "A haiku about autumn:\n\n*Red maple leaves fall*\n*onto the temple's stone path*\n*a bell, then silence*",
    "Here is another:\n\n*Cold moon on the pond*\n*a heron lifts from the reeds*\n*ripples reach the shore*",
    "One more, lighter:\n\n*Chestnuts in the fire*\n*grandmother hums an old song*\n*the kettle joins in*",
]


def seed_feature_chats(store) -> tuple[int, int]:
    """A chat answered from an attached document (its "Sources:" line, as the chat stores it) and one whose
    reply was regenerated twice (three branches, the second shown: "‹ 2/3 ›"). Returns their ids."""
    rag = store.create_conversation("When should I visit Kinkaku-ji?")
    store.add_message(rag.id, "user", "When should I visit Kinkaku-ji?")
    source = {"label": "kyoto-notes.md §2", "text": NOTES.split("## Food")[0].split("## Temples")[1].strip(),
              "score": 0.82}
    store.add_message(rag.id, "assistant", RAG_REPLY,
                      stats={"tokens_per_s": 39.4, "tokens": 41, "ttft_s": 0.24, "sources": [source]})
    branch = store.create_conversation("Write a haiku about autumn")
    user = store.add_message(branch.id, "user", "Write a haiku about autumn")
    replies = [store.add_message(branch.id, "assistant", text, parent_id=user.id,
                                 stats={"tokens_per_s": 40.0 + i, "tokens": 30 + i, "ttft_s": 0.2})
               for i, text in enumerate(BRANCH_REPLIES)]
    store.select_branch(replies[1].id)
    return rag.id, branch.id


def feature_shots(w, out: Path) -> list[Path]:
    """rag-chat.png, branches.png and dev-view.png, from the chats seed_feature_chats() made."""
    from wslm.gui.app import process_events_for

    rag, branch = (next(c.id for c in w.store.list_conversations() if c.title.startswith(t))
                   for t in ("When should I visit", "Write a haiku"))
    w.sidebar.select("chat")
    shots = []
    for conv_id, name in ((rag, "rag-chat"), (branch, "branches")):
        w.session.open(conv_id)
        process_events_for(0.5)
        w.chat_panel.view.render()
        process_events_for(0.3)
        path = out / f"{name}.png"
        w.grab().save(str(path))
        shots.append(path)
    dialog = w.chat_panel.dev_view()
    dialog.show()
    process_events_for(0.5)
    path = out / "dev-view.png"
    dialog.grab().save(str(path))
    dialog.close()
    shots.append(path)
    return shots


def settings_shots(w, out: Path) -> list[Path]:
    """settings.png (File → Settings…, General) and settings-api-key.png (the key shown, as after Show)."""
    from wslm.gui.app import process_events_for

    dialog = w.open_settings()
    shots = []
    for page, name in (("General", "settings"), ("API key", "settings-api-key")):
        dialog.show_page(page)
        if page == "API key":
            dialog.api_key.set_revealed(True)
        process_events_for(0.4)
        dialog.grab()
        path = out / f"{name}.png"
        dialog.grab().save(str(path))
        shots.append(path)
    dialog.reject()
    return shots


def seed_chats(cfg: Path) -> None:
    from wslm.gui.chat_store import ChatStore

    (cfg / "data").mkdir(parents=True, exist_ok=True)
    s = ChatStore(cfg / "data" / "chats.sqlite3")
    c0 = s.create_conversation("Plan a weekend in Kyoto", system_prompt="You are a helpful assistant.", max_tokens=48)
    s.add_message(c0.id, "user", "Plan a weekend in Kyoto")
    s.add_message(c0.id, "assistant", "Sure — here is a relaxed two-day plan.",
                  stats={"tokens_per_s": 38.2, "tokens": 212, "ttft_s": 0.18})
    c1 = s.create_conversation("用中文解释 Python 的列表推导式")
    s.add_message(c1.id, "user", "用中文解释 Python 的列表推导式，并给一个例子。")
    s.add_message(c1.id, "assistant", CJK_REPLY, stats={"tokens_per_s": 41.7, "tokens": 143, "ttft_s": 0.21})
    s.add_message(c1.id, "user", "Can you do the same in JavaScript?")
    s.add_message(c1.id, "assistant", JS_REPLY, stats={"tokens_per_s": 40.3, "tokens": 96, "ttft_s": 0.17})
    seed_feature_chats(s)
    s.close()


def main(out: Path) -> None:
    cfg = Path(tempfile.mkdtemp(prefix="wslm-shots-"))
    os.environ.update(WSLM_CONFIG_DIR=str(cfg), HF_HUB_CACHE=str(cfg / "hf"), WSLM_MODELS_DIR=str(cfg / "models"),
                      WSLM_ASSUME_ADMIN="1")
    seed_chats(cfg)
    from fake_windows import install
    from hub_server import FakeHub, make_tiny_gguf

    os.environ["WSLM_WINDOWS_BIN"] = str(install(cfg / "winbin").dir)
    hub = FakeHub().start()
    blob = make_tiny_gguf(cfg / "src" / "a.gguf", "Q4_K_M").read_bytes()
    hub.add_repo("bartowski/Qwen2.5-0.5B-Instruct-GGUF", {"Qwen2.5-0.5B-Instruct-Q4_K_M.gguf": blob + bytes(3_000_000)})
    hub.add_repo("HuggingFaceTB/SmolLM2-360M-Instruct-GGUF", {"smollm2-360m-instruct-q8_0.gguf": blob + bytes(2_000_000)})
    subprocess.run([sys.executable, "-m", "wslm", "models", "pull", "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF",
                    "--endpoint", hub.url, "--json"], check=True, capture_output=True)

    from wslm.gui.app import make_app, process_events_for, screenshot
    from wslm.gui.main_window import MainWindow
    from wslm.gui.settings import Settings

    make_app()
    w = MainWindow(Settings(first_run_done=True, target={"kind": "local"}, port=18555, max_model_len=2048,
                            serve_extra_args="--kv-cache-memory 256MiB"), watch=True)
    w.resize(1280, 800)
    w.show()
    w.share.turn_on()
    process_events_for(30, until=lambda: not w.share.busy and w.share.status.get("enabled"))
    w.server_panel.start()
    process_events_for(300, until=lambda: w.server.state in ("ready", "crashed"))
    kyoto = next(c for c in w.store.list_conversations() if "Kyoto" in c.title)
    w.session.open(kyoto.id)
    w.chat_panel.input.setPlainText("Give me one tip for Kyoto.")
    w.chat_panel.send()
    process_events_for(90, until=lambda: not w.session.busy)
    w.session.open(next(c for c in w.store.list_conversations() if "Python" in c.title).id)
    hub.rate_bps = 150_000
    dialog = w.models_panel.open_download()
    dialog.repo.setText("bartowski/Qwen2.5-0.5B-Instruct-GGUF")
    dialog.pattern.setText("*Q4_K_M.gguf")
    dialog.endpoint.setText(hub.url)
    dialog.start()
    process_events_for(30, until=lambda: dialog.job.progress.fraction > 0.4)
    dialog.hide()
    w.models_panel.table.selectRow(1)
    process_events_for(4)
    discover = w.models_panel.open_discover()  # Discover: search the (loopback) hub, files with fit verdicts
    discover.query.setText("Instruct-GGUF")
    discover.mirror.setText(hub.url)  # the loopback hub, as a mirror
    discover.search()
    process_events_for(30, until=lambda: discover.files.rowCount() > 0 or "⚠" in discover.status.text())
    process_events_for(0.5)
    out.mkdir(parents=True, exist_ok=True)
    discover.grab().save(str(out / "discover.png"))
    print(out / "discover.png")
    discover.hide()
    w.sidebar.select("chat")
    for path in screenshot(w, out):
        print(path)
    for path in feature_shots(w, out):
        print(path)
    for path in settings_shots(w, out):
        print(path)
    for path in switch_sequence(w, cfg, out / "model-switch"):
        print(path)
    w.confirm_close = lambda: True
    w.close()
    hub.stop()


def switch_sequence(w, cfg: Path, out: Path) -> list[Path]:
    """The model switch from the Chat panel, as a sequence of PNGs: picker, (a server without a pool: stopping,
    loading,) ready, reply."""
    from engine_helpers import demo_tokenizer, make_tiny_model

    from wslm.gui.app import process_events_for

    out.mkdir(parents=True, exist_ok=True)
    make_tiny_model(Path(os.environ["WSLM_MODELS_DIR"]) / "tiny-llama", "llama", demo_tokenizer())
    w.models.refresh()
    process_events_for(60, until=lambda: "tiny-llama" in w.models.table.ids())
    w.sidebar.select("chat")
    w.chat_panel.new_chat()
    w.chat_panel.max_tokens.setValue(40)  # short replies: the random model's gibberish would fill the picture
    w.chat_panel.input.setPlainText("Say hi.")
    w.chat_panel.send()
    process_events_for(90, until=lambda: not w.session.busy)
    shots, seen = [], set()

    def shot(name: str) -> None:
        process_events_for(0.3)
        w.grab()
        path = out / f"{len(shots) + 1}-{name}.png"
        w.grab().save(str(path))
        shots.append(path)

    shot("serving-demo")
    w.chat_panel.choose_model("tiny-llama")
    for state in ("stopping", "loading"):
        process_events_for(120, until=lambda s=state: w.server.state == s or w.server.state == "ready")
        if w.server.state == state and state not in seen:
            seen.add(state)
            shot(state)
    process_events_for(180, until=lambda: w.server.state == "ready" and w.server.config.model == "tiny-llama")
    shot("ready")
    w.chat_panel.input.setPlainText("Hello again!")
    w.chat_panel.send()
    process_events_for(90, until=lambda: not w.session.busy)
    shot("reply-from-new-model")
    return shots


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
