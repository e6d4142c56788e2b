"""Requests relayed to a device over its session stream (the pure part).

The admin asks for something only the device can compute (top-k
recommendations from its private parameters); the coordinator sends a
DeviceRequest on the Session stream hosting the device and waits for the
DeviceResponse with the same correlation_id (session.proto). It never sees
the device's private state, only the answer.

    pending = registry.open(session_sid, device_id, "top_k")    # a fresh correlation id
    session.send(top_k_request(pending.correlation_id, device_id, k=..., exclude_seen=..., timeout_s=...))
    response = await registry.wait(pending, timeout_s)           # DeviceTimeout, DeviceDisconnected
    answer = top_k_answer(response, k=k, n_items=n_items, exclude_seen=...)  # DeviceAnswerError, InvalidDeviceAnswer

The session's receive loop calls `registry.resolve(session_sid, response)`
(an answer that matches nothing, typically one arriving after its timeout,
is logged and dropped), and closing a stream calls
`registry.fail_session(sid, why)`, which fails its pending requests with
DeviceDisconnected. No I/O here: `DeviceRelay` (device_relay.py) owns the
`PendingRequests` and does the sending.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.errors import (
    DeviceAnswerError,
    DeviceDisconnected,
    DeviceTimeout,
    InvalidArgument,
    InvalidDeviceAnswer,
    Unavailable,
)
from coordinator.limits import MAX_ITEM_TEXT, MAX_PENDING, MAX_TIMEOUT_S
from coordinator.logs import log_event
from fedmask_proto.v1 import session_pb2
from wire.round_task import seconds_to_duration

DEFAULT_TIMEOUT_S = 10.0
_CORRELATION_BYTES = 16


@dataclass(frozen=True, slots=True)
class TopKAnswer:
    """A device's top-k recommendation: item ids (dense, 0-based, as in the
    model's item table), best first, and the global model version the
    device's model was last updated from. `dataset_item_ids` and `titles`
    are what the device mapped its dense ids to (the dataset's own ids;
    titles "" where the dataset ships none): empty, or one per item.
    `seen_excluded`: whether the device left out its user's seen items (its
    policy decides, D84). No scores: they never go further than the relay."""

    device_id: int
    item_ids: tuple[int, ...]
    model_version: int
    seen_excluded: bool
    dataset_item_ids: tuple[str, ...] = ()
    titles: tuple[str, ...] = ()


@dataclass(eq=False, slots=True)
class PendingRequest:
    correlation_id: str
    session_sid: int
    device_id: int
    kind: str
    future: asyncio.Future


class PendingRequests:
    """Requests sent to devices and not answered yet, by correlation id.

    Correlation ids are "N-HEX": a counter and 16 bytes from `token`
    (inject it for deterministic tests). Every method runs on the event loop of the futures.
    """

    def __init__(self, *, token: Callable[[int], bytes] = os.urandom, max_pending: int = MAX_PENDING) -> None:
        self._token = token
        self._max = max_pending
        self._pending: dict[str, PendingRequest] = {}
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, correlation_id: object) -> bool:
        return correlation_id in self._pending

    def open(self, session_sid: int, device_id: int, kind: str) -> PendingRequest:
        """Register a request about to be sent on session `session_sid`."""
        if len(self._pending) >= self._max:
            raise Unavailable(f"{len(self._pending)} device requests in flight (at most {self._max})")
        # the counter makes it unique, the random part unguessable by other streams
        cid = f"{next(self._seq)}-{self._token(_CORRELATION_BYTES).hex()}"
        p = PendingRequest(cid, session_sid, device_id, kind, asyncio.get_running_loop().create_future())
        self._pending[cid] = p
        return p

    def resolve(self, session_sid: int, response: session_pb2.DeviceResponse) -> bool:
        """Hand an answer to its waiting request. Only the stream the request
        went out on may answer it, for the device it was sent to. Returns
        whether it matched; an answer that does not is logged and dropped."""
        p = self._pending.get(response.correlation_id)
        why = None
        if p is None:
            why = "no pending request (answered after its timeout, or never asked)"
        elif p.session_sid != session_sid:
            why = f"the request went out on session {p.session_sid}"
        elif p.device_id != response.device_id:
            why = f"the request was for device {p.device_id}"
        if why is not None:
            log_event("device_response_unmatched", session=session_sid, device=response.device_id,
                      correlation=response.correlation_id[:64], why=why)
            return False
        assert p is not None
        del self._pending[p.correlation_id]
        if not p.future.done():
            p.future.set_result(response)
        return True

    def forget(self, pending: PendingRequest) -> None:
        """Stop waiting for `pending` (timed out or the caller gave up)."""
        if self._pending.get(pending.correlation_id) is pending:
            del self._pending[pending.correlation_id]
        if not pending.future.done():
            pending.future.cancel()

    def fail_session(self, session_sid: int, why: str) -> int:
        """The stream closed: fail its pending requests (DeviceDisconnected).
        Returns how many."""
        return self._fail([p for p in self._pending.values() if p.session_sid == session_sid], why)

    def fail_all(self, why: str) -> int:
        """The coordinator stops: fail every pending request."""
        return self._fail(list(self._pending.values()), why)

    def _fail(self, requests: list[PendingRequest], why: str) -> int:
        for p in requests:
            del self._pending[p.correlation_id]
            if not p.future.done():
                p.future.set_exception(DeviceDisconnected(p.device_id, why))
        return len(requests)

    async def wait(self, pending: PendingRequest, timeout_s: float) -> session_pb2.DeviceResponse:
        """The answer to `pending`; DeviceTimeout after `timeout_s`,
        DeviceDisconnected when its stream closes first. The request is
        forgotten however this ends (also when the caller is cancelled)."""
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
        except TimeoutError:
            raise DeviceTimeout(pending.device_id, timeout_s) from None
        finally:
            self.forget(pending)


# ---------------------------------------------------------------- top-k


def check_top_k(k: int, *, n_items: int | None, max_k: int, timeout_s: float) -> None:
    """Validate a top-k query before anything is sent (InvalidArgument):
    k in 1..min(n_items, max_k), the deployment's cap (admin.max_top_k, D84)."""
    if n_items is None:
        raise InvalidArgument("top-k queries need a recommender model; this coordinator runs one without items")
    most = min(n_items, max_k)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= most:
        raise InvalidArgument(f"k must be an integer in 1..{most} (the model's {n_items} items, at most "
                              f"{max_k} by this deployment), got {k!r}")
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise InvalidArgument(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}], got {timeout_s!r}")


def top_k_request(correlation_id: str, device_id: int, *, k: int, exclude_seen: bool,
                  timeout_s: float) -> session_pb2.ServerMessage:
    return session_pb2.ServerMessage(
        device_request=session_pb2.DeviceRequest(
            correlation_id=correlation_id,
            device_id=device_id,
            timeout=seconds_to_duration(timeout_s),
            top_k=session_pb2.TopKQuery(k=k, exclude_seen=exclude_seen),
        )
    )


def device_error_code(code: int) -> str:
    """DEVICE_ERROR_CODE_NOT_READY -> "not_ready" (unknown values: "code_N")."""
    if code in session_pb2.DeviceErrorCode.values():
        return session_pb2.DeviceErrorCode.Name(session_pb2.DeviceErrorCode.ValueType(code)).removeprefix("DEVICE_ERROR_CODE_").lower()
    return f"code_{code}"


def top_k_answer(response: session_pb2.DeviceResponse, *, k: int, n_items: int, exclude_seen: bool) -> TopKAnswer:
    """The checked TopKResult of a DeviceResponse (session.proto contract:
    at most k distinct ids of the catalogue; scores none, or, from a device
    built before D84, one per item and descending, checked and dropped). A
    DeviceError becomes DeviceAnswerError; a broken contract
    InvalidDeviceAnswer. `exclude_seen` is what the request asked: a device
    that does not say whether it left out seen items did as asked, and one
    that says it kept them when asked to leave them out breaks the contract."""
    device = response.device_id
    kind = response.WhichOneof("response")
    if kind == "error":
        code = response.error.code
        raise DeviceAnswerError(device, device_error_code(code), response.error.message[:500], error_code=code)
    if kind != "top_k":
        raise InvalidDeviceAnswer(device, f"expected top_k, got {kind or 'an empty response'}")
    r = response.top_k
    items, scores = tuple(int(i) for i in r.item_ids), tuple(float(s) for s in r.scores)
    if scores and len(items) != len(scores):
        raise InvalidDeviceAnswer(device, f"{len(items)} item ids but {len(scores)} scores")
    if len(items) > k:
        raise InvalidDeviceAnswer(device, f"{len(items)} items for k={k}")
    if any(i >= n_items for i in items) or len(set(items)) != len(items):
        raise InvalidDeviceAnswer(device, f"item ids must be distinct and below {n_items}")
    if any(math.isnan(s) for s in scores) or any(a < b for a, b in zip(scores, scores[1:], strict=False)):
        raise InvalidDeviceAnswer(device, "scores are not in descending order")
    dataset_ids, titles = tuple(r.dataset_item_ids), tuple(r.titles)
    for name, values in (("dataset_item_ids", dataset_ids), ("titles", titles)):
        if values and len(values) != len(items):
            raise InvalidDeviceAnswer(device, f"{len(values)} {name} for {len(items)} items")
        if any(len(v) > MAX_ITEM_TEXT for v in values):
            raise InvalidDeviceAnswer(device, f"{name} longer than {MAX_ITEM_TEXT} characters")
    if titles and not dataset_ids:
        raise InvalidDeviceAnswer(device, "titles without dataset_item_ids")
    seen_excluded = r.seen_excluded if r.HasField("seen_excluded") else exclude_seen
    if exclude_seen and not seen_excluded:  # a policy narrows what a request allows, never widens it
        raise InvalidDeviceAnswer(device, "seen items were asked to be left out, the device says it kept them")
    return TopKAnswer(device_id=device, item_ids=items, model_version=int(r.model_version),
                      seen_excluded=seen_excluded, dataset_item_ids=dataset_ids, titles=titles)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_PENDING",
    "MAX_TIMEOUT_S",
    "PendingRequest",
    "PendingRequests",
    "TopKAnswer",
    "check_top_k",
    "device_error_code",
    "top_k_answer",
    "top_k_request",
]
