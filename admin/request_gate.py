"""The admin service's outermost middleware: what one request may cost,
checked before its token and before a route reads its body (D82).

A pure ASGI middleware (a BaseHTTPMiddleware would read the body first),
in front of every route, by the request's route (matched here, before the
router runs, against the routes as their routers declare them; a request
without a body only against the few routes outside the concurrency and
time bounds):

- **Body.** A route takes at most its body bound: 0 for a route without a
  body parameter, `limits.max_body_bytes` for one with (the operator
  actions) and for a request no route serves (its 404 / 405 comes before
  its body, which uvicorn then reads and drops). A Content-Length above
  it, or any body declared to a route that takes none (Content-Length > 0
  or a Transfer-Encoding), is 413 before a byte of it is read. A chunked
  body is counted on the ASGI receive channel: past the bound the gate
  answers 413 itself and the route sees the client gone
  (`http.disconnect`), so it never holds more than the bound plus one read.
- **Concurrency.** At most `limits.max_concurrent_requests` requests are in
  the app at once; one more is 503 with Retry-After at once. Event streams
  (StreamingResponse routes) are apart: their slots are
  admin/stream_slots.py's; so is /healthz (no I/O: a liveness probe must
  not fail because the service is busy).
- **Time.** A request (event streams apart) still unanswered after
  `limits.request_timeout_s` is ended: 503 if no answer started, else the
  connection is closed (the answer would be cut anyway).

Every refusal is a problem document with `Connection: close` (the rest of
what the client sends is never read), counted in
fedmask_admin_refused_requests_total{reason}, and logged at most once a
second per reason with the count of those not logged. The request head's
own bounds (size, time) are checked earlier, in uvicorn's protocol
(fedmask/commands/admin_http.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from fastapi.routing import APIRoute
from starlette.responses import StreamingResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from admin.refusal_log import RefusalLog
from admin.settings import RequestLimits


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """What a route may receive: `body_bytes` of body at most. A `counted`
    request takes one of the concurrent slots; a `bounded` one has
    request_timeout_s to finish."""

    body_bytes: int
    counted: bool = True
    bounded: bool = True


#: A request without a body, on a route that is counted and bounded.
_NO_BODY = RoutePolicy(0)
#: Answered from memory, without I/O: never refused as busy (a liveness
#: probe must not fail because the service is busy, or it gets restarted).
UNCOUNTED_PATHS = frozenset({"/healthz"})


def route_policies(routes: Iterable[BaseRoute], max_body_bytes: int) -> list[tuple[BaseRoute, RoutePolicy]]:
    """Each route's policy: a FastAPI route with a body parameter may take
    `max_body_bytes`, every other route none; a route answering a
    StreamingResponse (an event stream) is neither counted nor bounded (its
    slots are admin/stream_slots.py's), nor is UNCOUNTED_PATHS counted."""
    table: list[tuple[BaseRoute, RoutePolicy]] = []
    for route in routes:
        if isinstance(route, APIRoute):
            body = max_body_bytes if route.body_field is not None else 0
            stream = isinstance(route.response_class, type) and issubclass(route.response_class, StreamingResponse)
            table.append((route, RoutePolicy(body, counted=not stream and route.path not in UNCOUNTED_PATHS,
                                              bounded=not stream)))
        else:
            table.append((route, RoutePolicy(0)))
    return table


def policy_of(table: Sequence[tuple[BaseRoute, RoutePolicy]], scope: Scope, otherwise: RoutePolicy) -> RoutePolicy:
    """The policy of the route that will serve `scope` (path and method);
    `otherwise` for a request no route serves (the router answers 404 or
    405 without reading its body)."""
    for route, policy in table:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return policy
    return otherwise


def _framing(headers: Sequence[tuple[bytes, bytes]]) -> tuple[bytes | None, bool]:
    """(Content-Length, whether a Transfer-Encoding is given) of a request."""
    length: bytes | None = None
    chunked = False
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


def declares_body(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether the request has a body (HTTP/1.1: a Content-Length other than
    0, or a Transfer-Encoding)."""
    length, chunked = _framing(headers)
    return chunked or (length is not None and length.strip() != b"0")


def declared_body_refusal(headers: Sequence[tuple[bytes, bytes]], limit: int) -> str | None:
    """Why the request's headers alone make its body too large for `limit`
    bytes (None: they do not)."""
    length, chunked = _framing(headers)
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            return "its Content-Length is not a number"
        if size > limit:
            return f"its body of {size} bytes is over this route's {limit}" if limit else "this route takes no body"
    if chunked and limit == 0:
        return "this route takes no body"
    return None


@dataclass(slots=True)
class _Exchange:
    """One request as the gate sees it."""

    received: int = 0  # body bytes passed to the app
    started: bool = False  # an answer started (the app's or the gate's)
    refused: bool = False  # the gate answered (or gave up): the app's sends are dropped


class RequestGate:
    """See the module doc. `routes()` gives the app's routes (read once, on
    the first request, when every router is included); `on_refused(reason)`
    counts a refusal."""

    def __init__(self, app: ASGIApp, *, limits: RequestLimits, routes: Callable[[], Iterable[BaseRoute]],
                 retry_after_s: int, on_refused: Callable[[str], None] = lambda reason: None,
                 log: RefusalLog | None = None) -> None:
        self.app = app
        self.limits = limits
        self._routes = routes
        self._table: list[tuple[BaseRoute, RoutePolicy]] | None = None
        #: the routes whose policy differs from a body-less request's usual one (counted and bounded):
        #: all a request without a body is matched against (a few, not every route, per request)
        self._special: list[tuple[BaseRoute, RoutePolicy]] = []
        #: a request no route serves may carry what any route may take: its 404 / 405 answer comes first
        self._no_route = RoutePolicy(limits.max_body_bytes)
        self._retry_after = str(retry_after_s).encode()
        self._on_refused = on_refused
        self._log = log or RefusalLog()
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._table is None:
            self._table = route_policies(self._routes(), self.limits.max_body_bytes)
            self._special = [(r, p) for r, p in self._table if not (p.counted and p.bounded)]
        if declares_body(scope["headers"]):
            policy = policy_of(self._table, scope, self._no_route)
        else:  # no body to bound: only whether it is counted and bounded depends on the route
            policy = policy_of(self._special, scope, _NO_BODY)
        why = declared_body_refusal(scope["headers"], policy.body_bytes)
        if why is not None:
            await self._refuse(send, scope, 413, "body", f"request body refused: {why} (limits.max_body_bytes)")
            return
        if not policy.counted:
            await self._run(scope, receive, send, policy)
            return
        if self.in_flight >= self.limits.max_concurrent_requests:
            await self._refuse(send, scope, 503, "busy", f"{self.limits.max_concurrent_requests} requests are being "
                               "served (limits.max_concurrent_requests); retry later",
                               [(b"retry-after", self._retry_after)])
            return
        self.in_flight += 1
        try:
            await self._run(scope, receive, send, policy)
        finally:
            self.in_flight -= 1

    async def _run(self, scope: Scope, receive: Receive, send: Send, policy: RoutePolicy) -> None:
        """The app, with its body counted and, unless streaming, its time bounded."""
        ex = _Exchange()

        async def counted_receive() -> Message:
            if ex.refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                ex.received += len(message.get("body", b""))
                if ex.received > policy.body_bytes:
                    ex.refused = True
                    if not ex.started:
                        ex.started = True
                        await self._refuse(send, scope, 413, "body", "request body refused: over this route's "
                                           f"{policy.body_bytes} bytes (limits.max_body_bytes)")
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            if ex.refused:
                return  # the gate answered already
            if message["type"] == "http.response.start":
                ex.started = True
            await send(message)

        if not policy.bounded:
            await self.app(scope, counted_receive, tracked_send)
            return
        deadline = asyncio.timeout(self.limits.request_timeout_s)
        try:
            async with deadline:
                await self.app(scope, counted_receive, tracked_send)
        except TimeoutError:
            if not deadline.expired():
                raise  # the route's own, not the request's time: its error handling answers
            ex.refused = True
            detail = f"the request took over {self.limits.request_timeout_s:g} s (limits.request_timeout_s)"
            if not ex.started:
                await self._refuse(send, scope, 503, "time", detail, [(b"retry-after", self._retry_after)])
            else:  # returning with the answer unfinished makes uvicorn close the connection
                self._on_refused("time")
                self._log("time", detail + "; answer cut")

    async def _refuse(self, send: Send, scope: Scope, status: int, reason: str, detail: str,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self._on_refused(reason)
        self._log(reason, f"{scope.get('method', '')} {str(scope.get('path', ''))[:100]}: {detail}")
        body = json.dumps({"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
                           "detail": detail}).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), *headers]})
        await send({"type": "http.response.body", "body": body})


__all__ = ["UNCOUNTED_PATHS", "declares_body", "RequestGate", "RoutePolicy", "declared_body_refusal", "policy_of",
           "route_policies"]
