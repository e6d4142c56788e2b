"""The device-request relay: the requests the coordinator sends to devices
over their session streams, and the answers.

`DeviceRelay` owns the requests in flight (`relay.PendingRequests`) and
does the I/O that relay.py leaves out: it finds the stream hosting the
device, sends the DeviceRequest, waits, checks the answer, and counts and
logs each request. The `Coordinator` composes one and feeds it:

    relay.resolve(session.sid, response)     a DeviceResponse from a stream
    relay.fail_session(sid, why)             a stream closed
    relay.fail_all(why)                      the coordinator stops

and the operator actions (operator_actions.py) ask it:

    answer = await relay.request_top_k(device_id, k, exclude_seen=True, timeout_s=10)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

from coordinator.errors import (
    DeviceAnswerError,
    DeviceNotConnected,
    DeviceRequestError,
    DeviceTimeout,
    InvalidArgument,
    UnknownDevice,
)
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.registry import DeviceRegistry
from coordinator.relay import DEFAULT_TIMEOUT_S, PendingRequests, TopKAnswer, check_top_k, top_k_answer, top_k_request
from fedmask_proto.v1 import session_pb2 as S
from wire.protocol import DEFAULT_MAX_TOP_K

#: DeviceErrorCode -> the fedmask_topk_requests_total status label of a
#: device's error answer (others: "device_error").
DEVICE_ERROR_LABEL: Mapping[int, str] = {
    S.DEVICE_ERROR_CODE_REFUSED: "refused",
    S.DEVICE_ERROR_CODE_NOT_READY: "not_ready",
    S.DEVICE_ERROR_CODE_INVALID_ARGUMENT: "invalid_argument",
    S.DEVICE_ERROR_CODE_UNKNOWN_DEVICE: "unavailable",
}


def top_k_status(exc: BaseException) -> str:
    """The fedmask_topk_requests_total status label of a failed request."""
    if isinstance(exc, UnknownDevice):
        return "not_found"
    if isinstance(exc, DeviceNotConnected):
        return "unavailable"
    if isinstance(exc, DeviceTimeout):
        return "timeout"
    if isinstance(exc, DeviceAnswerError):
        return DEVICE_ERROR_LABEL.get(exc.error_code, "device_error")
    if isinstance(exc, InvalidArgument):
        return "invalid_argument"
    return "error"


class DeviceRelay:
    """See the module doc. `check_running` raises Unavailable while the
    coordinator starts or stops; `n_items` is the model's catalogue size
    (None: a model without items, which answers no top-k query); `max_k`
    the deployment's cap on k (admin.max_top_k, D84). Every method runs on
    the coordinator's event loop."""

    def __init__(self, registry: DeviceRegistry, *, n_items: int | None, metrics: CoordinatorMetrics,
                 clock: Callable[[], float], check_running: Callable[[], None],
                 token: Callable[[int], bytes] = os.urandom, max_k: int = DEFAULT_MAX_TOP_K) -> None:
        self._registry = registry
        self._n_items = n_items
        self.max_k = max_k
        self._metrics = metrics
        self._clock = clock
        self._check_running = check_running
        self._pending = PendingRequests(token=token)

    def __len__(self) -> int:
        """Requests in flight."""
        return len(self._pending)

    def resolve(self, session_sid: int, response: S.DeviceResponse) -> bool:
        """Hand a DeviceResponse from stream `session_sid` to its request
        (see PendingRequests.resolve)."""
        return self._pending.resolve(session_sid, response)

    def fail_session(self, session_sid: int, why: str) -> int:
        """Stream `session_sid` closed: fail its requests (DeviceDisconnected); how many."""
        return self._pending.fail_session(session_sid, why)

    def fail_all(self, why: str) -> int:
        """The coordinator stops: fail every request in flight."""
        return self._pending.fail_all(why)

    def check(self, k: int, timeout_s: float) -> None:
        """InvalidArgument unless a top-k for `k` items with this timeout may
        be sent (relay.check_top_k)."""
        check_top_k(k, n_items=self._n_items, max_k=self.max_k, timeout_s=timeout_s)

    async def request_top_k(self, device_id: int, k: int, *, exclude_seen: bool = True,
                            timeout_s: float = DEFAULT_TIMEOUT_S) -> TopKAnswer:
        """The device's top-k recommendation, computed on the device from its
        private parameters and relayed over the stream hosting it. What the
        device discloses is its own policy's (D84): `exclude_seen` is a
        request, and the answer says what the device did.

        Raises InvalidArgument (k not in 1..min(n_items, max_k), bad timeout,
        a model without items; nothing is sent), UnknownDevice (never
        enrolled) or DeviceNotConnected (no open stream hosts it),
        DeviceTimeout, DeviceDisconnected (its stream closed first),
        DeviceAnswerError (the device answered with an error code),
        InvalidDeviceAnswer, and Unavailable (starting or shutting down)."""
        self._check_running()
        n_items = self._n_items
        self.check(k, timeout_s)
        assert n_items is not None
        session = self._registry.owner(device_id)
        if session is None or session.closed:
            raise DeviceNotConnected(device_id) if await self._registry.enrolled(device_id) else UnknownDevice(device_id)
        pending = self._pending.open(session.sid, device_id, "top_k")
        t0 = self._clock()
        outcome, status = "ok", "ok"
        seen_excluded: bool | None = None
        try:
            session.send(top_k_request(pending.correlation_id, device_id, k=k, exclude_seen=exclude_seen,
                                       timeout_s=timeout_s))
            response = await self._pending.wait(pending, timeout_s)
            answer = top_k_answer(response, k=k, n_items=n_items, exclude_seen=exclude_seen)
            seen_excluded = answer.seen_excluded
            return answer
        except DeviceRequestError as exc:
            outcome = type(exc).__name__
            status = top_k_status(exc)
            raise
        except asyncio.CancelledError:
            outcome = status = "cancelled"
            raise
        finally:
            seconds = self._clock() - t0
            self._metrics.top_k(status, seconds)
            log_event("device_request", session=session.sid, device=device_id, kind="top_k", k=k,
                      exclude_seen=exclude_seen, seen_excluded=seen_excluded, outcome=outcome,
                      seconds=f"{seconds:.3f}")


__all__ = ["DEVICE_ERROR_LABEL", "DeviceRelay", "top_k_status"]
