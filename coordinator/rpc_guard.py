"""What every RPC of both listeners runs under (D83): `guard_handlers`
wraps each registered method handler (servicer.register_service calls it,
for the device and the admin listener alike), so no handler can forget it.

- A request message (unary or server-streaming calls) with a 64-bit
  integer outside 0..2^63-1 (wire.id_bounds: no id the coordinator hands
  out is larger) is refused INVALID_ARGUMENT, naming the field, before the
  handler runs; so a device id or a model version the store cannot hold
  never reaches a lookup. The Session stream's messages are checked by the
  servicer as it reads them (servicer.py), with the same rule.
- An exception a handler did not turn into a status (a bug, or a library
  failing under it) ends the RPC INTERNAL with the fixed detail
  "internal error" and is logged here with its traceback. Nothing of the
  exception reaches the peer: without this, grpc.aio answers UNKNOWN with
  "Unexpected <class ...>: <the exception's text>".

Refusals are logged (`rpc_refused`) at most once a second per method and
reason, with the count of those not logged, so a peer repeating them
costs a dictionary lookup, not a log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.message import Message

from coordinator.limits import LogBudget
from coordinator.logs import log_event, logger, sanitize
from wire.id_bounds import MAX_WIRE_ID, out_of_range_field

#: The detail of every INTERNAL answer: fixed, never the exception's text.
INTERNAL_DETAIL = "internal error"
#: Seconds between two log lines of one kind of refusal of one method.
REFUSAL_LOG_INTERVAL_S = 1.0

#: A handler's behaviour as registered: an async function of (the request or
#: the request iterator, the context). grpc's stubs type behaviours as plain
#: functions, hence the loose type; `guarded` awaits what it returns.
Behaviour = Callable[..., Any]
Guarded = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def id_refusal(message: Message) -> str | None:
    """The refusal detail for a message from a peer that carries a 64-bit
    integer out of range (wire.id_bounds), or None when it carries none."""
    where = out_of_range_field(message)
    if where is None:
        return None
    return f"{where}: ids and other 64-bit integers must lie in 0..{MAX_WIRE_ID} (2^63 - 1)"


class _RefusalLog:
    """Rate-limited `rpc_refused` lines, one budget per (method, reason)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._budgets: dict[tuple[str, str], LogBudget] = {}

    def __call__(self, method: str, why: str, context: grpc.aio.ServicerContext[Any, Any], detail: str) -> None:
        budget = self._budgets.setdefault((method, why), LogBudget(REFUSAL_LOG_INTERVAL_S, self._clock))
        suppressed = budget.take()
        if suppressed is None:
            return
        extra = {"suppressed": suppressed} if suppressed else {}
        log_event("rpc_refused", logging.WARNING, method=method, why=why, peer=context.peer(),
                  detail=detail[:200], **extra)


def guarded(method: str, behaviour: Behaviour, *, check_request: bool,
            refusals: _RefusalLog) -> Guarded:
    """`behaviour` (an async handler taking the request, or the request
    iterator, and the context) under the rules of the module doc;
    `check_request` when its first argument is one request message."""

    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if check_request and isinstance(request, Message):
            refusal = id_refusal(request)
            if refusal is not None:
                refusals(method, "id out of range", context, refusal)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, sanitize(refusal))
        try:
            return await behaviour(request, context)
        except grpc.aio.AbortError:  # the handler ended the RPC with its own status
            raise
        except Exception:
            logger.exception("event=rpc_failed method=%s peer=%s", method, context.peer())
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_DETAIL)

    return run


#: The four kinds of method handler: the handler's attribute holding the
#: behaviour, grpc's constructor for a handler of that kind, and whether the
#: request is one message (checked before the behaviour runs; streamed
#: requests are checked by whoever reads them).
_HANDLER_KINDS: tuple[tuple[str, Callable[..., grpc.RpcMethodHandler[Any, Any]], bool], ...] = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, True),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, False),
)


def guard_handler(method: str, handler: grpc.RpcMethodHandler[Any, Any],
                  refusals: _RefusalLog) -> grpc.RpcMethodHandler[Any, Any]:
    """A method handler like `handler` (same kind, same (de)serializers)
    whose behaviour runs `guarded`."""
    for attribute, make_handler, one_request in _HANDLER_KINDS:
        behaviour = getattr(handler, attribute)
        if behaviour is not None:
            return make_handler(guarded(method, behaviour, check_request=one_request, refusals=refusals),
                                handler.request_deserializer, handler.response_serializer)
    raise ValueError(f"{method}: a method handler without a behaviour")


def guard_handlers(service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]], *,
                   clock: Callable[[], float] = time.monotonic) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Every handler of `service` (method name -> handler), guarded."""
    refusals = _RefusalLog(clock)
    return {name: guard_handler(f"{service}/{name}", h, refusals) for name, h in handlers.items()}


__all__ = ["INTERNAL_DETAIL", "guard_handlers", "guarded", "id_refusal"]
