"""LM Studio parity (issue 24): the chat's model picker (details, "loaded" badge, Browse… for a .gguf), the
developer view (curl / Python reproducing the chat's request, the last reply's tokens and timings), "start
the server on launch", syntax highlighting and links in replies."""

from __future__ import annotations

import ast
import json
import shlex
import threading
from http.server import ThreadingHTTPServer
from pathlib import PureWindowsPath as Path

import pytest

pytest.importorskip("PySide6")

from test_gui_chat_features import Scripted  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.first_run import _linux_path  # noqa: E402
from wslm.gui.markdown import render_markdown  # noqa: E402
from wslm.gui.model_picker import BROWSE, DetailsRole, LoadedRole  # noqa: E402
from wslm.gui.models_model import picker_details  # noqa: E402
from wslm.gui.settings import Settings, load_settings, save_settings  # noqa: E402
from wslm.gui.syntax import highlight  # noqa: E402
from wslm.gui.theme import LINK, SYNTAX  # noqa: E402

MODELS = [
    {"id": "demo", "path": "/m/demo.gguf", "format": "gguf", "num_params": 135_000_000, "quantization": "Q8_0",
     "size_bytes": 145 * 2**20, "context_length": 8192},
    {"id": "qwen", "repo_id": "Qwen/Qwen2.5-1.5B", "format": "hf", "num_params": 1_540_000_000, "dtype": "bfloat16",
     "size_bytes": 3 * 2**30, "context_length": 32768},
]


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_picker_shows_details_loaded_badge_and_browses_for_a_file(qtbot, store):
    session = ChatSession(store, {"system_prompt": ""})
    panel = ChatPanel(session, Settings(chat_use_server=True))
    qtbot.addWidget(panel)
    panel.set_installed_models(MODELS, serve_choice="demo")
    combo = panel.model_combo
    i = combo.findData("qwen")
    assert combo.itemText(i) == "Qwen/Qwen2.5-1.5B"
    details = combo.itemData(i, DetailsRole)
    assert details == picker_details(MODELS[1]) == "1.5B · bfloat16 · 3.0 GiB · 32,768 ctx"
    assert combo.itemData(combo.findData("demo"), DetailsRole).startswith("135M · Q8_0")
    assert not any(combo.itemData(k, LoadedRole) for k in range(combo.count()))
    assert combo.itemData(combo.count() - 1) == BROWSE  # the last entry browses

    # The server serves qwen: its entry carries the badge.
    panel.set_server("http://127.0.0.1:1/v1", "qwen", "")
    assert combo.itemData(combo.findData("qwen"), LoadedRole) and not combo.itemData(combo.findData("demo"), LoadedRole)
    assert combo.currentData() == "qwen"

    # Browse…: the chosen file is served by its path (as the server sees it), named by its file name.
    switches = []
    panel.model_switch_requested.connect(switches.append)
    panel.server_path = lambda p: _linux_path(Path(p))  # as MainWindow does for a WSL target
    panel.choose_model_file = lambda: ""  # cancelled: nothing changes
    combo.setCurrentIndex(combo.count() - 1)
    panel._model_chosen(combo.count() - 1)
    assert switches == [] and combo.currentData() == "qwen"
    panel.choose_model_file = lambda: "C:\\models\\tiny.Q4_K_M.gguf"
    panel._model_chosen(combo.count() - 1)
    assert switches == ["/mnt/c/models/tiny.Q4_K_M.gguf"]
    j = combo.findData("/mnt/c/models/tiny.Q4_K_M.gguf")
    assert j >= 0 and combo.itemText(j) == "tiny.Q4_K_M.gguf"
    assert combo.itemData(j, DetailsRole) == "Q4_K_M"  # its quantization, from its name (no such file here)
    # Once it is served, the file's entry is the loaded one (and stays listed).
    panel.show_switch("/mnt/c/models/tiny.Q4_K_M.gguf", "ready", "")
    panel.set_server("http://127.0.0.1:1/v1", "/mnt/c/models/tiny.Q4_K_M.gguf", "")
    j = combo.findData("/mnt/c/models/tiny.Q4_K_M.gguf")
    assert combo.currentIndex() == j and combo.itemData(j, LoadedRole)
    assert combo.itemData(combo.count() - 1) == BROWSE
    # The popup draws two lines per model.
    delegate = combo.itemDelegate()
    from PySide6.QtWidgets import QStyleOptionViewItem

    opt = QStyleOptionViewItem()
    opt.fontMetrics = combo.fontMetrics()
    assert delegate.sizeHint(opt, combo.model().index(0, 0)).height() >= 2 * combo.fontMetrics().height()
    combo.showPopup()
    combo.view().grab()  # paints the rows (badge included) without errors
    combo.hidePopup()


@pytest.fixture
def scripted():
    Scripted.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_developer_view_reproduces_the_request(qtbot, store, scripted):
    session = ChatSession(store, {"system_prompt": "Be brief."})
    panel = ChatPanel(session, Settings(chat_use_server=False, chat_base_url=scripted, chat_model="thinker",
                                        system_prompt="Be brief."))
    qtbot.addWidget(panel)
    panel.new_chat()
    panel.top_k.setValue(20)
    panel.input.setPlainText("it's hello")
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel.send()
    dialog = panel.dev_view()
    qtbot.addWidget(dialog)
    # What the chat would send next is what the chat sent (the same builder), plus the reply now.
    sent = Scripted.requests[-1]
    body = session.request_preview()
    assert body["messages"][:2] == sent["messages"] and body["messages"][-1]["role"] == "assistant"
    assert {k: body[k] for k in ("model", "temperature", "top_p", "stream")} == \
        {k: sent[k] for k in ("model", "temperature", "top_p", "stream")}
    assert body.get("top_k") == sent.get("top_k") == 20

    # curl: a shell command whose -d is exactly the body (the quote in "it's" survives the quoting).
    words = shlex.split(dialog.curl)
    assert words[0] == "curl" and words[1] == f"{scripted}/chat/completions"
    assert "Authorization: Bearer $WSLM_API_KEY" in words
    assert json.loads(words[words.index("-d") + 1]) == body
    # Python: valid code for the openai client; non-OpenAI sampling goes in extra_body.
    tree = ast.parse(dialog.python)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "create")
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kwargs["messages"] == body["messages"] and kwargs["model"] == "thinker"
    assert kwargs["extra_body"] == {"top_k": 20} and "top_k" not in kwargs
    assert f"base_url={scripted!r}" in dialog.python and "WSLM_API_KEY" in dialog.python
    # The last reply's tokens and timings (the scripted server says the prompt was 100 tokens).
    text = dialog.stats_label.text()
    assert "Prompt tokens: 100" in text and "Completion tokens: 4" in text and "Time to first token" in text
    dialog.copy(dialog.curl, "curl")
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == dialog.curl
    panel.show_dev_view()  # from the header's </> button
    session.shutdown()


def test_start_server_on_launch(qtbot, tmp_path, monkeypatch, store):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    (tmp_path / "config").mkdir()
    # The setting round-trips through the settings file and the Server panel's checkbox.
    save_settings(Settings(start_server_on_launch=True))
    assert load_settings().start_server_on_launch
    from wslm.gui import main_window
    from wslm.gui.server_panel import ServerPanel

    started = []
    monkeypatch.setattr(ServerPanel, "start", lambda self: started.append(self.model_id()))
    monkeypatch.setattr(main_window.ModelsService, "refresh", lambda self: None)
    for on in (False, True):
        window = main_window.MainWindow(Settings(first_run_done=True, start_server_on_launch=on, model="demo"),
                                        store, watch=False)
        qtbot.addWidget(window)
        assert window.server_panel.start_on_launch.isChecked() == on
        qtbot.wait(50)
        assert started == (["demo"] if on else [])
    window.server_panel.start_on_launch.setChecked(False)
    assert not window.settings.start_server_on_launch


def test_code_blocks_are_highlighted_and_links_look_like_links():
    py = highlight('def f(x):\n    # note\n    return "a" + 1\n', "py")
    assert f'<span style="color:{SYNTAX["keyword"]};">def</span>' in py
    assert f'color:{SYNTAX["comment"]};' in py and "# note" in py
    assert f'<span style="color:{SYNTAX["string"]};">&quot;a&quot;</span>' in py
    assert f'<span style="color:{SYNTAX["number"]};">1</span>' in py
    assert f'<span style="color:{SYNTAX["function"]};">f</span>' in py
    for lang, code, keyword in (("ts", "const x: number = 1 // c", "const"), ("bash", "if true; then echo hi; fi", "fi"),
                                ("json", '{"a": true}', "true"), ("cpp", "int main() { return 0; }", "return"),
                                ("rust", "fn main() { let s = \"x\"; }", "let"), ("go", "func main() {}", "func")):
        out = highlight(code, lang)
        assert f'<span style="color:{SYNTAX["keyword"]};">{keyword}</span>' in out, (lang, out)
    assert "<span" not in highlight("plain <text>", "brainfuck") and "&lt;text&gt;" in highlight("<text>", "")
    assert 'color:' + SYNTAX["comment"] in highlight("/* a\nb */ x", "c")  # block comments span lines
    streaming = highlight('print("unclosed text', "python")  # half a string is not coloured as one
    assert SYNTAX["string"] not in streaming and "&quot;unclosed text" in streaming
    md = render_markdown("```rust\nlet x = 5;\n```\nSee [docs](https://a.org/x) or https://b.org/y.")
    assert f'color:{SYNTAX["keyword"]};">let</span>' in md
    assert f'<a href="https://a.org/x" style="color:{LINK}; text-decoration:underline;">docs</a>' in md
    assert '<a href="https://b.org/y" ' in md and "https://b.org/y</a>." in md  # the full stop is not the link's
