"""uvicorn's h11 protocol with two guards on the request head, which uvicorn leaves to TCP segmentation:

- size: h11 bounds only a head that is still incomplete (so 140 KB of headers in one read passed, the same
  bytes in 4 KB reads got a 400). Here a head still arriving is refused with 431 as soon as it passes
  --max-header-count / --max-header-bytes; one that came whole is refused by http_limits.HeaderLimitMiddleware.
- time: uvicorn's keep-alive timeout starts after a response, so a connection that never finishes its first
  request head (slowloris) was held forever. Each head must arrive within --request-head-timeout: a connection
  that sent nothing is closed, one that sent part of a head gets 408 first.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from wslm.backend.entrypoints.openai.errors import APIError
from wslm.backend.entrypoints.openai.http_limits import HTTPLimits, head_too_large

log = logging.getLogger("wslm.server")

# h11's own bound on an incomplete head: above ours by more than one read (asyncio reads at most 256 KiB),
# so that ours, which gives the 431, always fires first.
_H11_SLACK = 512 * 2**10
_LINGER_S = 2.0  # after a refusal: read and drop what the client still sends, so that it sees the answer


def h11_max_incomplete_event_size(limits: HTTPLimits) -> int:
    return limits.max_header_bytes + _H11_SLACK


def protocol_class(limits: HTTPLimits) -> type[asyncio.Protocol]:
    """The protocol uvicorn.Config(http=...) takes, bound to these limits."""
    return type("WslmH11Protocol", (HeadLimitedH11Protocol,), {"limits": limits})


class HeadLimitedH11Protocol(H11Protocol):
    limits: HTTPLimits = HTTPLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # of the request head being received (while h11 waits for one)
        self._head_lines = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is timed out too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered already; dropped until the close
        in_head = self.conn.their_state is h11.IDLE
        if in_head:
            # Only bytes that arrive while no head is complete count: a body's bytes come after the head.
            self._head_bytes += len(data)
            self._head_lines += data.count(b"\n")
            if self._head_timer is None:
                self._arm_head_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_bytes = self._head_lines = 0  # a head arrived (or h11 refused it with a 400)
            self._cancel_head_timer()
            return
        if in_head and not self.transport.is_closing():
            # Still no complete head: refuse it as soon as it is too large, not when it ends.
            error = head_too_large(max(self._head_lines - 1, 0), self._head_bytes, self.limits)
            if error is not None:
                self._refuse(error)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.request_head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes == 0:
            self.transport.close()  # nothing to answer: a pre-opened or abandoned connection
            return
        log.debug("%s:%s sent no complete request head in %.0f s: 408", *(self.client or ("?", 0)),
                  self.limits.request_head_timeout)
        self._refuse(APIError(f"The request head did not arrive within {self.limits.request_head_timeout:g} s "
                              "(--request-head-timeout).", 408, code="request_timeout"))

    def _refuse(self, error: APIError) -> None:
        """Answer `error` and close. Written directly: h11 has no request to answer yet."""
        self._refused = True
        self._cancel_head_timer()
        body = json.dumps(error.body()).encode()
        phrase = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}.get(error.status_code, b"Error")
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (error.status_code, phrase, len(body), body))
        # Close after a short linger: closing with unread input would send a reset, which can make the
        # client lose the answer.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)
