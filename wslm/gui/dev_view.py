"""The chat's developer view (LM Studio's "</>"): the open chat's request as a curl command and as Python
(openai client) code that reproduce it, and the last reply's token counts and timings.

The snippet builders are plain functions (no Qt) so they can be tested and reused."""

from __future__ import annotations

import json
import pprint

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.format import human_duration

KEY_VAR = "WSLM_API_KEY"  # the placeholder: the key itself never goes into a snippet that gets pasted around
# What the openai client takes as keyword arguments; the rest (vLLM's sampling, chat template switches) goes
# in extra_body.
OPENAI_ARGS = {"model", "messages", "temperature", "top_p", "max_tokens", "stream", "stream_options", "stop",
               "seed", "response_format", "n", "presence_penalty", "frequency_penalty", "logprobs", "tools",
               "tool_choice"}


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

    def __init__(self, body: dict, base_url: str, stats: dict, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Developer view: this chat's request")
        self.resize(760, 560)
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
        note = QLabel(f"The API key is read from ${KEY_VAR} (set it to the server's key, if it has one). "
                      "Passages from attached documents are picked when a message is sent, so they are not "
                      "in this request.", objectName="Muted", wordWrap=True)
        rows = stats_lines(stats)
        self.stats_label = QLabel(objectName="Muted", wordWrap=True)
        self.stats_label.setText("Last reply: " + "  ·  ".join(f"{k}: {v}" for k, v in rows) if rows
                                 else "Last reply: none yet in this chat.")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.tabs, 1)
        lay.addWidget(self.stats_label)
        lay.addWidget(note)
        lay.addWidget(buttons)
        self.copied = ""

    def copy(self, text: str, name: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied = name
        self.setWindowTitle(f"Developer view: {name} copied")
