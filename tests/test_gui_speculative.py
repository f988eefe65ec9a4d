"""Speculative decoding in the app (issue 35): the Server panel's switch and draft picker build exactly the
--speculative-config `wslm serve` gets (remembered in the settings); the developer view shows the acceptance
rate from the server's /metrics counters read before and after each request (a loopback server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.settings import Settings, load_settings, save_settings  # noqa: E402
from wslm.gui.speculative import SpecCounts, acceptance_text, spec_counts  # noqa: E402

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
MODELS = [{"id": "demo", "path": "/models/demo"}, {"id": "qwen-0.5b", "path": "/models/qwen-0.5b"},
          {"id": "qwen-7b", "path": "/models/qwen-7b"}]


@pytest.fixture
def server_panel(qtbot, tmp_path, monkeypatch):
    from wslm.gui.log_model import LogModel
    from wslm.gui.server_controller import ServerController
    from wslm.gui.server_panel import ServerPanel

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))

    def make(settings: Settings) -> ServerPanel:
        p = ServerPanel(ServerController(LogModel()), settings)
        qtbot.addWidget(p)
        p.set_models(MODELS)
        return p
    return make


def _spec_args(args: list[str]) -> list[str]:
    return [a for i, a in enumerate(args) if a == "--speculative-config" or (i and args[i - 1] == "--speculative-config")]


def test_switch_and_draft_build_the_exact_flag_and_are_remembered(server_panel, qtbot, tmp_path):
    settings = Settings(first_run_done=True, model="qwen-7b")
    p = server_panel(settings)
    box = p.speculative
    assert _spec_args(p.config().serve_args()) == [] and not box.draft.isEnabled()  # off by default
    qtbot.mouseClick(box.switch, Qt.MouseButton.LeftButton)
    assert _spec_args(p.config().serve_args()) == ["--speculative-config", NGRAM]
    assert settings.speculative_decoding and settings.speculative_draft == ""
    # The draft picker: prompt lookup, then the installed models but the one being served.
    ids = [box.draft.itemData(i) for i in range(box.draft.count())]
    assert ids == ["", "demo", "qwen-0.5b"] and box.draft.itemText(0) == "Prompt lookup (no draft model)"
    box.draft.setCurrentIndex(ids.index("qwen-0.5b"))
    assert _spec_args(p.config().serve_args()) == [
        "--speculative-config", '{"model": "/models/qwen-0.5b", "num_speculative_tokens": 4}']
    assert settings.speculative_draft == "qwen-0.5b"
    # Remembered: a new panel from the saved settings offers the same.
    path = tmp_path / "gui.json"
    save_settings(settings, path)
    again = server_panel(load_settings(path))
    assert again.speculative.enabled() and again.speculative.draft_id() == "qwen-0.5b"
    assert again.config().serve_args() == p.config().serve_args()
    # Serving the draft itself: it cannot draft for itself, prompt lookup instead.
    again.set_model("qwen-0.5b")
    assert again.settings.speculative_draft == "" and again.speculative.draft_id() == "" and "qwen-0.5b" not in [
        again.speculative.draft.itemData(i) for i in range(again.speculative.draft.count())]
    # The extra flags' own --speculative-config wins.
    p.extra.setText("--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'")
    args = p.config().serve_args()
    assert args.count("--speculative-config") == 1 and args[-1] == '{"method": "ngram", "num_speculative_tokens": 2}'
    p.extra.setText("")
    box.draft.setCurrentIndex(0)
    if __import__("os").environ.get("WSLM_SCREENSHOTS"):
        from test_gui_images import themed_shot

        p.resize(900, 620)
        p.show()
        qtbot.waitExposed(p)
        qtbot.mouseClick(p.speculative.switch, Qt.MouseButton.LeftButton) if not box.enabled() else None
        themed_shot(p.speculative.parentWidget(), "speculative-toggle.png", 800)


def test_counters_parse_from_prometheus_text():
    text = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{model_name="demo"} 120.0
vllm:spec_decode_num_draft_tokens_total{model_name="other"} 8.0
vllm:spec_decode_num_accepted_tokens_total{model_name="demo"} 90.0
vllm:num_requests_running{model_name="demo"} 1.0
"""
    before = spec_counts(text)
    assert before == SpecCounts(128.0, 90.0)
    after = spec_counts(text.replace(" 120.0", " 140.0").replace(" 90.0", " 105.0"))
    assert (after - before) == SpecCounts(20.0, 15.0) and (after - before).rate == 0.75
    assert (before - after) == before  # a restarted server: counted from its start
    assert spec_counts("vllm:num_requests_running 1.0\n") is None
    assert acceptance_text(after - before, after, True) == (
        "Speculative decoding: last request 15/20 draft tokens accepted (75%); "
        "overall 105/148 draft tokens accepted (71%).")
    assert "off" in acceptance_text(None, None, False) and acceptance_text(None, None, None) == ""


class Metrics(BaseHTTPRequestHandler):
    """Chat completions (SSE) and /metrics; each request drafts 8 tokens and 6 are accepted."""

    draft, accepted, spec, step = 100, 50, True, 1
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        cls = type(self)
        with cls.lock:
            lines = ["# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 0.0"]
            if cls.spec:
                lines += [f'vllm:spec_decode_num_draft_tokens_total{{model_name="demo"}} {cls.draft}.0',
                          f'vllm:spec_decode_num_accepted_tokens_total{{model_name="demo"}} {cls.accepted}.0']
        raw = ("\n".join(lines) + "\n").encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        with type(self).lock:  # the tokens are counted as they are decoded, after the request came in
            type(self).draft += 8 * type(self).step
            type(self).accepted += 6 * type(self).step
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())


def test_developer_view_shows_the_acceptance_rate(qtbot, tmp_path):
    Metrics.draft, Metrics.accepted, Metrics.spec, Metrics.step = 100, 50, True, 1
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    p = ChatPanel(session, Settings(chat_use_server=False, system_prompt="", chat_model="demo",
                                    chat_base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1"))
    qtbot.addWidget(p)
    try:
        meter = p.spec_meter
        for text in ("one", "two"):
            with qtbot.waitSignal(meter.changed, timeout=10000):
                p.input.setPlainText(text)
                p.send()
            qtbot.waitUntil(lambda: not session.busy, timeout=5000)
        # The second request's reading before it is the first one's after: exact.
        assert meter.last == SpecCounts(8, 6) and meter.total == SpecCounts(116, 62)
        dialog = p.dev_view()
        assert dialog.spec_label.isVisibleTo(dialog)
        assert "last request 6/8 draft tokens accepted (75%)" in dialog.spec_label.text()
        assert "overall 62/116" in dialog.spec_label.text()
        # The server restarted without speculative decoding (counters at zero, or none): "off".
        Metrics.draft = Metrics.accepted = Metrics.step = 0
        with qtbot.waitSignal(meter.changed, timeout=10000):
            p.input.setPlainText("zero")
            p.send()
        qtbot.waitUntil(lambda: not session.busy, timeout=5000)
        assert meter.available is False and "off" in dialog.spec_label.text()
        Metrics.spec = False
        with qtbot.waitSignal(meter.changed, timeout=10000):
            p.input.setPlainText("three")
            p.send()
        assert "off" in dialog.spec_label.text() and meter.available is False
        dialog.close()
    finally:
        session.shutdown()
        store.close()
        httpd.shutdown()
        httpd.server_close()
        QApplication.processEvents()


def test_a_draft_that_fails_points_at_the_draft_field():
    from wslm.gui.crash_hints import crash_cause

    cause = crash_cause(1, ["ValueError: the draft model /models/x has another tokenizer than the model "
                            "(vocabulary 32000 vs 49152): a draft model must share it."])
    assert cause.field == "speculative" and "Draft" in cause.advice
    cause = crash_cause(1, ["error: --speculative-config: draft model 'qwen-0.5b' was not found"])
    assert cause.field == "speculative"
