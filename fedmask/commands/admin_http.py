"""The HTTP server of `fedmask admin`: uvicorn on its httptools protocol,
with the request-head bounds that uvicorn lacks there (D82).

uvicorn's httptools protocol reads a request head of any size (the
httptools parser gathers a header value whole before it hands it on) and
for any time (a connection that sends half a head is kept open). Its h11
protocol bounds the size (`h11_max_incomplete_event_size`) but answers 400
and costs more per request (D76). So `head_limited_protocol` subclasses
the httptools protocol:

- **size.** The bytes a request head arrives in are counted as they arrive;
  past `limits.max_header_bytes` with the head still incomplete, the
  answer is 431 and the connection is closed. What the parser holds of it
  stays below the bound plus one socket read.
- **time.** From its first byte (or from the connection's opening) a head
  has `limits.head_timeout_s` to be complete; past it, 408 and close. The
  time between requests of a kept-alive connection stays uvicorn's
  `timeout_keep_alive`.

The rest of a request's bounds (body, concurrency, time) are the app's
(admin/request_gate.py). `serve` runs the app with these and with
`limits.max_connections` as uvicorn's `limit_concurrency`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from admin.refusal_log import RefusalLog
from admin.settings import AdminSettings, RequestLimits, split_host_port

_log = logging.getLogger("fedmask.admin")


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounds on the request head (see the
    module doc). Subclassed per service by `head_limited_protocol`, which
    sets the bounds."""

    max_head_bytes: int = 16 * 1024
    head_timeout_s: float = 10.0
    refusals: RefusalLog = RefusalLog()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))  # a stream server's transport
        self._in_head = True  # the bytes arriving now belong to a request head
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        counted = self._in_head
        if counted:
            self._head_bytes += len(data)
            self._arm_head_timer()
        super().data_received(data)
        if counted and self._in_head and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._refuse(431, f"request head over {self.max_head_bytes} bytes (limits.max_header_bytes)")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what follows is the next request's head
        self._head_bytes = 0

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_head_timer()  # a pipelined head waits for the answer before it: its time starts after
            return
        if self._in_head and not self.transport.is_closing():
            if self._head_bytes:
                self._refuse(408, f"request head not complete within {self.head_timeout_s:g} s "
                                  "(limits.head_timeout_s)")
            else:  # a connection that never said anything: nothing to answer
                self.transport.close()

    def _refuse(self, status: int, detail: str) -> None:
        self._cancel_head_timer()
        self.refusals(str(status), f"{self.client}: {detail}")
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        body = detail.encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
        self.transport.close()


def head_limited_protocol(limits: RequestLimits) -> type[HeadLimitedProtocol]:
    """The protocol class with `limits`' head bounds."""

    class Limited(HeadLimitedProtocol):
        max_head_bytes = limits.max_header_bytes
        head_timeout_s = limits.head_timeout_s
        refusals = RefusalLog()

    return Limited


def serve(app: Any, settings: AdminSettings, *, log_level: str) -> None:
    """Run `app` on settings.listen_address until a signal stops it."""
    import uvicorn

    host, port = split_host_port(settings.listen_address)
    # access_log off: request lines would carry user handles in paths; /metrics counts requests instead.
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), access_log=False, proxy_headers=False,
                server_header=False, http=head_limited_protocol(settings.limits),
                limit_concurrency=settings.limits.max_connections)


__all__ = ["HeadLimitedProtocol", "head_limited_protocol", "serve"]
