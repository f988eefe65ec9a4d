"""The chat's developer view (LM Studio's "</>"): the open chat's request as a curl command and as Python
(openai client) code that reproduce it, the last reply's token counts and timings, and a history of the
requests the chat sent (the last HISTORY_SIZE of the app: each one's exact body, passages from attached
documents included, the prompt as the model read it, its tokens and timings).

The snippet builders are plain functions (no Qt) so they can be tested and reused."""

from __future__ import annotations

import json
import pprint
import time
from collections import deque
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.content_parts import elide_images
from wslm.gui.format import human_duration
from wslm.gui.speculative import acceptance_text

KEY_VAR = "WSLM_API_KEY"  # the placeholder: the key itself never goes into a snippet that gets pasted around
# What the openai client takes as keyword arguments; the rest (vLLM's sampling, chat template switches) goes
# in extra_body.
OPENAI_ARGS = {"model", "messages", "temperature", "top_p", "max_tokens", "stream", "stream_options", "stop",
               "seed", "response_format", "n", "presence_penalty", "frequency_penalty", "logprobs", "tools",
               "tool_choice"}


HISTORY_SIZE = 50


@dataclass
class SentRequest:
    """One request the chat sent: its exact body, and how it ended (stats, error) once it has."""

    conv_id: int
    message_id: int
    body: dict
    sent_at: float = field(default_factory=time.time)
    stats: dict = field(default_factory=dict)
    error: str = ""
    ended: bool = False


class RequestHistory(QObject):
    """The last HISTORY_SIZE requests the chats sent (newest last), from the session's request_sent and
    request_ended signals. In memory: a developer's log, not part of the chats."""

    changed = Signal()

    def __init__(self, session, parent=None) -> None:
        super().__init__(parent)
        self.entries: deque[SentRequest] = deque(maxlen=HISTORY_SIZE)
        session.request_sent.connect(self._sent)
        session.request_ended.connect(self._ended)

    def _sent(self, conv_id: int, message_id: int, body: dict) -> None:
        self.entries.append(SentRequest(conv_id, message_id, elide_images(body)))
        self.changed.emit()

    def _ended(self, conv_id: int, message_id: int, stats: dict, error: str) -> None:
        entry = next((e for e in reversed(self.entries) if e.message_id == message_id and not e.ended), None)
        if entry is not None:
            entry.stats, entry.error, entry.ended = dict(stats), error, True
            self.changed.emit()

    def for_conversation(self, conv_id: int) -> list[SentRequest]:
        """This chat's requests, newest first."""
        return [e for e in reversed(self.entries) if e.conv_id == conv_id]


def prompt_text(body: dict) -> str:
    """The messages of a request as the model reads them: each role, then its content (passages included)."""
    parts = []
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"[{m.get('role', '?')}]\n{content or ''}")
    return "\n\n".join(parts)


def history_label(entry: SentRequest) -> str:
    """One line for the history list: when, the model, tokens in/out, the time to the first token."""
    s = entry.stats
    bits = [time.strftime("%H:%M:%S", time.localtime(entry.sent_at)), str(entry.body.get("model") or "")]
    if not entry.ended:
        bits.append("running…")
    elif entry.error:
        bits.append("failed")
    else:
        if s.get("prompt_tokens") is not None:
            bits.append(f"{int(s['prompt_tokens']):,} in")
        if s.get("tokens") is not None:
            bits.append(f"{int(s['tokens']):,} out")
        if s.get("ttft_s") is not None:
            bits.append(f"TTFT {float(s['ttft_s']):.2f} s")
    return " · ".join(b for b in bits if b)


def _endpoint(base_url: str) -> str:
    return (base_url or "http://127.0.0.1:8000/v1").rstrip("/") + "/chat/completions"


def curl_command(body: dict, base_url: str) -> str:
    """A POSIX shell command (bash, WSL, macOS) that sends `body` as the chat does."""
    data = json.dumps(body, indent=2, ensure_ascii=False).replace("'", "'\\''")
    return (f"curl {_endpoint(base_url)} \\\n"
            '  -H "Content-Type: application/json" \\\n'
            f'  -H "Authorization: Bearer ${KEY_VAR}" \\\n'
            f"  -d '{data}'")


def python_snippet(body: dict, base_url: str) -> str:
    """Python with the openai client: the same request, streamed and printed as it comes."""
    args = {k: v for k, v in body.items() if k in OPENAI_ARGS}
    extra = {k: v for k, v in body.items() if k not in OPENAI_ARGS}
    if extra:
        args["extra_body"] = extra
    lines = []
    for key, value in args.items():
        text = pprint.pformat(value, indent=1, width=96, sort_dicts=False).replace("\n", "\n    ")
        lines.append(f"    {key}={text},")
    stream = bool(body.get("stream"))
    tail = ('for chunk in response:\n'
            '    if chunk.choices and chunk.choices[0].delta.content:\n'
            '        print(chunk.choices[0].delta.content, end="", flush=True)\n'
            '    if chunk.usage:\n'
            '        print("\\n", chunk.usage)\n') if stream else (
            'print(response.choices[0].message.content)\n'
            'print(response.usage)\n')
    return ("import os\n\n"
            "from openai import OpenAI  # pip install openai\n\n"
            f'client = OpenAI(base_url={(base_url or "http://127.0.0.1:8000/v1")!r}, '
            f'api_key=os.environ.get("{KEY_VAR}", "none"))\n'
            "response = client.chat.completions.create(\n" + "\n".join(lines) + "\n)\n" + tail)


def stats_lines(stats: dict) -> list[tuple[str, str]]:
    """The last reply's figures, as (label, value) rows; what the server did not report is left out."""
    rows = []
    if stats.get("model"):
        rows.append(("Model", str(stats["model"])))
    if stats.get("prompt_tokens") is not None:
        rows.append(("Prompt tokens", f"{int(stats['prompt_tokens']):,}"))
    if stats.get("tokens") is not None:
        rows.append(("Completion tokens", f"{int(stats['tokens']):,}"))
    if stats.get("ttft_s") is not None:
        rows.append(("Time to first token", f"{float(stats['ttft_s']):.2f} s"))
    if stats.get("elapsed_s") is not None:
        rows.append(("Total time", human_duration(float(stats["elapsed_s"]))
                     if float(stats["elapsed_s"]) >= 60 else f"{float(stats['elapsed_s']):.2f} s"))
    if stats.get("tokens_per_s") is not None:
        rows.append(("Speed", f"{float(stats['tokens_per_s']):.1f} tok/s"))
    if stats.get("finish_reason"):
        rows.append(("Finish reason", str(stats["finish_reason"])))
    return rows


class DevViewDialog(QDialog):
    """Read-only code to copy; built from what the chat would send now (not live-updated)."""

    def __init__(self, body: dict, base_url: str, stats: dict, parent=None,
                 history: list[SentRequest] | None = None, spec=None) -> None:
        """`spec`: a spec_metrics.SpecMeter, for the speculative-decoding acceptance line (kept up to date)."""
        super().__init__(parent)
        self.setWindowTitle("Developer view: this chat's request")
        self.resize(760, 560)
        body = elide_images(body)  # images' base64 shortened: the text views stay quick
        self.curl = curl_command(body, base_url)
        self.python = python_snippet(body, base_url)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.tabs = QTabWidget()
        self.editors: dict[str, QPlainTextEdit] = {}
        for name, text in (("curl", self.curl), ("Python", self.python)):
            page = QWidget()
            lay = QVBoxLayout(page)
            edit = QPlainTextEdit(text, readOnly=True)
            edit.setFont(mono)
            edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            copy = QPushButton(f"Copy {name}")
            copy.clicked.connect(lambda _c=False, t=text, n=name: self.copy(t, n))
            row = QHBoxLayout()
            row.addStretch(1)
            row.addWidget(copy)
            lay.addWidget(edit, 1)
            lay.addLayout(row)
            self.editors[name] = edit
            self.tabs.addTab(page, name)
        self.history = list(history or [])
        self.tabs.addTab(self._history_page(mono), f"History ({len(self.history)})")
        note = QLabel(f"The API key is read from ${KEY_VAR} (set it to the server's key, if it has one). "
                      "Passages from attached documents are picked when a message is sent, so they are not "
                      "in this request: History shows each request as it was sent, passages included.",
                      objectName="Muted", wordWrap=True)
        rows = stats_lines(stats)
        self.stats_label = QLabel(objectName="Muted", wordWrap=True)
        self.stats_label.setText("Last reply: " + "  ·  ".join(f"{k}: {v}" for k, v in rows) if rows
                                 else "Last reply: none yet in this chat.")
        # Speculative decoding's acceptance (accepted/draft tokens), hidden until the server's /metrics was read.
        self.spec = spec
        self.spec_label = QLabel(objectName="Muted", wordWrap=True)
        self.spec_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._show_spec()
        if spec is not None:
            spec.changed.connect(self._show_spec)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.tabs, 1)
        lay.addWidget(self.stats_label)
        lay.addWidget(self.spec_label)
        lay.addWidget(note)
        lay.addWidget(buttons)
        self.copied = ""

    def _show_spec(self) -> None:
        s = self.spec
        text = acceptance_text(s.last, s.total, s.available) if s is not None else ""
        self.spec_label.setText(text)
        self.spec_label.setVisible(bool(text))

    def _history_page(self, mono) -> QWidget:
        """The chat's requests, newest first: pick one to see its body, its prompt and its figures."""
        page = QWidget()
        lay = QVBoxLayout(page)
        split = QSplitter(Qt.Orientation.Vertical)
        self.history_list = QListWidget()
        for entry in self.history:
            item = QListWidgetItem(history_label(entry))
            self.history_list.addItem(item)
        self.history_tabs = QTabWidget()
        self.history_body = QPlainTextEdit(readOnly=True)
        self.history_prompt = QPlainTextEdit(readOnly=True)
        self.history_stats = QPlainTextEdit(readOnly=True)
        for name, edit in (("Request", self.history_body), ("Prompt sent", self.history_prompt),
                           ("Timings and tokens", self.history_stats)):
            edit.setFont(mono)
            self.history_tabs.addTab(edit, name)
        split.addWidget(self.history_list)
        split.addWidget(self.history_tabs)
        split.setSizes([120, 360])
        lay.addWidget(split, 1)
        if not self.history:
            lay.addWidget(QLabel("No request sent from this chat since the app started.", objectName="Muted"))
        self.history_list.currentRowChanged.connect(self.show_request)
        if self.history:
            self.history_list.setCurrentRow(0)
        return page

    def show_request(self, row: int) -> None:
        if not 0 <= row < len(self.history):
            return
        entry = self.history[row]
        self.history_body.setPlainText(json.dumps(entry.body, indent=2, ensure_ascii=False))
        self.history_prompt.setPlainText(prompt_text(entry.body))
        rows = stats_lines(entry.stats)
        if entry.error:
            rows.append(("Error", entry.error))
        self.history_stats.setPlainText("\n".join(f"{k}: {v}" for k, v in rows) if rows
                                        else "Still running." if not entry.ended else "No figures reported.")

    def copy(self, text: str, name: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied = name
        self.setWindowTitle(f"Developer view: {name} copied")
