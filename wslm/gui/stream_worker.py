"""Stream one chat completion from an OpenAI-compatible server on a QThread (httpx, SSE).

The GUI thread only receives signals. stop() returns at once: the worker stops reading, closes the
connection (which makes the server abort the request) and reports the partial reply as stopped."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from PySide6.QtCore import QThread, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import describe_http_error, describe_transport_error


@dataclass
class ChatRequest:
    base_url: str
    model: str
    messages: list[dict]
    api_key: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int | None = 1024  # None: up to the end of the model's context (the server works it out)
    extra: dict = field(default_factory=dict)
    # Run by the worker before sending (the chat's documents: embedding the message, picking passages):
    # messages -> (the messages to send, what to report through `prepared`). Blocking, hence not on the GUI thread.
    prepare: Callable[[list[dict]], tuple[list[dict], dict]] | None = None

    def body(self) -> dict:
        return {
            "model": self.model,
            "messages": self.messages,
            "temperature": self.temperature,
            "top_p": self.top_p,
            **({"max_tokens": self.max_tokens} if self.max_tokens is not None else {}),
            "stream": True,
            # vLLM and OpenAI send a final usage chunk with this; servers that ignore it still work.
            "stream_options": {"include_usage": True},
            **self.extra,
        }


class ToolCallAssembler:
    """OpenAI streams a tool call in pieces (index, then id and name, then arguments in chunks)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict] = {}

    def add(self, piece: dict) -> None:
        call = self._calls.setdefault(int(piece.get("index") or 0), {"id": "", "name": "", "arguments": ""})
        call["id"] = piece.get("id") or call["id"]
        fn = piece.get("function") or {}
        call["name"] = fn.get("name") or call["name"]
        call["arguments"] += fn.get("arguments") or ""

    def calls(self) -> list[dict]:
        return [self._calls[i] for i in sorted(self._calls)]


class StreamWorker(QThread):
    delta = Signal(str)
    reasoning = Signal(str)  # delta.reasoning_content: the model's thinking, shown folded above the answer
    first_token = Signal(float)  # seconds from send to the first content
    done = Signal(dict)  # stats: ttft_s, tokens, tokens_per_s, elapsed_s, finish_reason, stopped
    failed = Signal(str, str)  # kind, message (see chat_errors)
    prepared = Signal(dict)  # what request.prepare reported (the documents' passages used), before sending
    sending = Signal(dict)  # the exact body posted (passages included), as it goes out

    def __init__(self, request: ChatRequest, parent=None) -> None:
        super().__init__(parent)
        self.request = request
        self._stop = threading.Event()
        self._response: httpx.Response | None = None

    def stop(self) -> None:
        self._stop.set()
        resp = self._response
        if resp is None:
            return
        # shutdown(), unlike close(), wakes a recv() blocked in the worker thread (e.g. during a long
        # prefill, before any token), and the server sees the connection end at once and aborts.
        try:
            stream = resp.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):  # already closed, or a transport without a socket
            pass

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        req = self.request
        url = req.base_url.rstrip("/") + "/chat/completions"
        headers = {"Accept": "text/event-stream"}
        if req.api_key:
            headers["Authorization"] = f"Bearer {req.api_key}"
        if req.prepare is not None:
            try:
                req.messages, info = req.prepare(req.messages)
            except Exception as exc:  # noqa: BLE001 - said in place of the reply, as any failure
                if not self._stop.is_set():
                    self.failed.emit("documents", str(exc))
                return
            if self._stop.is_set():
                return
            self.prepared.emit(info)
        t0 = time.monotonic()
        ttft = None
        chunks = 0
        usage_tokens = None
        prompt_tokens = None  # the server's count of the prompt: the chat's context meter starts from it
        finish_reason = None
        served_by = ""  # the model that answered (the chunk's "model"): shown under the reply
        tools = ToolCallAssembler()
        body = req.body()  # built once: what the history shows is what is posted
        self.sending.emit(body)
        try:
            timeout = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=5.0)
            with httpx.Client(timeout=timeout) as client:
                with client.stream("POST", url, json=body, headers=headers) as resp:
                    self._response = resp
                    if resp.status_code >= 400:
                        body = resp.read().decode("utf-8", "replace")
                        self.failed.emit(*describe_http_error(resp.status_code, body, req.base_url))
                        return
                    for line in resp.iter_lines():
                        if self._stop.is_set():
                            break
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        try:
                            chunk = json.loads(data)
                        except ValueError:
                            continue
                        if "error" in chunk:  # vLLM reports mid-stream errors as a data event
                            err = chunk["error"]
                            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                            code = err.get("code", 500) if isinstance(err, dict) else 500
                            body = json.dumps({"error": {"message": msg}})
                            self.failed.emit(*describe_http_error(int(code or 500), body, req.base_url))
                            return
                        served_by = chunk.get("model") or served_by
                        if chunk.get("usage"):
                            usage_tokens = chunk["usage"].get("completion_tokens", usage_tokens)
                            prompt_tokens = chunk["usage"].get("prompt_tokens", prompt_tokens)
                        for choice in chunk.get("choices") or []:
                            delta = choice.get("delta") or {}
                            thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                            if thought:
                                if ttft is None:
                                    ttft = time.monotonic() - t0
                                    self.first_token.emit(ttft)
                                chunks += 1
                                self.reasoning.emit(thought)
                            for call in delta.get("tool_calls") or []:
                                tools.add(call)
                            text = delta.get("content") or ""
                            if text:
                                if ttft is None:
                                    ttft = time.monotonic() - t0
                                    self.first_token.emit(ttft)
                                chunks += 1
                                self.delta.emit(text)
                            if choice.get("finish_reason"):
                                finish_reason = choice["finish_reason"]
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the chat
            if not self._stop.is_set():
                self.failed.emit(*describe_transport_error(exc, req.base_url))
                return
        finally:
            self._response = None
        elapsed = time.monotonic() - t0
        tokens = usage_tokens if usage_tokens is not None else chunks
        gen_time = elapsed - (ttft or 0.0)
        self.done.emit({
            "ttft_s": round(ttft, 3) if ttft is not None else None,
            "tokens": tokens,
            "tokens_per_s": round(tokens / gen_time, 1) if gen_time > 0 and tokens > 1 else None,
            "elapsed_s": round(elapsed, 3),
            "finish_reason": "stopped" if self._stop.is_set() else finish_reason,
            "stopped": self._stop.is_set(),
            "model": served_by,
            **({"prompt_tokens": prompt_tokens} if prompt_tokens else {}),
            **({"tool_calls": tools.calls()} if tools.calls() else {}),
        })
