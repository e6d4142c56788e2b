"""What the admin listener asks of the running coordinator besides its
live state: the operator actions (pause, resume, abort, rollback; each
written to the store's audit log, refusals too, and the refusals the admin
service makes at its REST layer) and top-k by device id or user handle.

`OperatorActions` is constructed with its collaborators: the store (audit
log, model versions, user handles), the device registry, the event hub,
the metrics, the device relay (device_relay.py) and a `FederationControl`,
the small protocol through which an action changes the running
federation (hold the round loop, cancel the collecting round, replace the
model). The in-process `FederationControl` is the `Coordinator`
(service.py); a replicated coordinator could give a store-backed one. The
pure parts (the action result, the operator check) are module functions.
Every method runs on the coordinator's event loop. See docs/decisions.md
D40-D44.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from coordinator.device_relay import DeviceRelay
from coordinator.errors import (
    DeviceDisconnected,
    DeviceNotConnected,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    UserNotConnected,
)
from coordinator.events import EventHub
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import ServerModel
from coordinator.registry import DeviceRegistry
from coordinator.relay import TopKAnswer
from coordinator.store import AuditRecord, DeviceRecord, NewModelVersion, NotFoundError, Store
from coordinator.store.blobs import unpack_parameters
from fedmask_proto.v1 import admin_service_pb2

MAX_OPERATOR_CHARS = 128
MAX_REASON_CHARS = 1024
_ACTION_NAME = re.compile(r"[a-z0-9_]{1,64}")


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What an operator action did: whether it changed anything, its audit
    entry, and (rollback) the new model version."""

    changed: bool
    audit: AuditRecord
    new_model_version: int | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A relayed top-k answer with what the admin shows beside it."""

    answer: TopKAnswer
    device_id: int
    handle: str
    latency_s: float
    recommendation_id: str


def check_operator(operator: str, reason: str) -> None:
    """InvalidArgument unless `operator` is 1..128 printable characters and
    `reason` at most 1024."""
    if not operator or len(operator) > MAX_OPERATOR_CHARS or not operator.isprintable():
        raise InvalidArgument(f"operator must be 1..{MAX_OPERATOR_CHARS} printable characters")
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidArgument(f"reason must be at most {MAX_REASON_CHARS} characters")


def check_refusal(operator: str, action: str, reason: str, role: str) -> None:
    """InvalidArgument unless a refusal the admin service reports is well
    formed: the operator as for an action, `action` 1..64 characters of
    a-z, 0-9 and "_", `reason` 1..1024 printable characters, `role` at most 64."""
    check_operator(operator, reason)
    if not _ACTION_NAME.fullmatch(action):
        raise InvalidArgument("action must be 1..64 characters of a-z, 0-9 and '_'")
    if not reason or not reason.isprintable():
        raise InvalidArgument("reason must be 1..1024 printable characters")
    if len(role) > 64 or not role.isprintable():
        raise InvalidArgument("role must be at most 64 printable characters")


class FederationControl(Protocol):
    """What operator actions change in the running federation (D44)."""

    @property
    def paused(self) -> bool: ...

    @property
    def budget_exhausted(self) -> bool: ...

    @property
    def model_version(self) -> int | None:
        """The current model version (None before the start)."""

    def check_running(self) -> None:
        """Raise Unavailable while the coordinator starts or shuts down."""

    def set_paused(self, paused: bool) -> bool:
        """Hold (True) or release the round loop before it selects a cohort
        (a running round finishes); whether that changed anything."""

    def cancel_round(self, detail: str) -> int | None:
        """Cancel the collecting round (AbortReason CANCELLED, `detail`); its
        number, or None when no round is collecting (nothing changes)."""

    def replacing_model(self, cancel_detail: str) -> AbstractAsyncContextManager[None]:
        """Inside: no round opens, a collecting round was cancelled
        (`cancel_detail`), and no commit runs (one in progress finished)."""

    def adopt_model(self, version: int, parameters: dict[str, np.ndarray], step: int) -> None:
        """Make stored model `version` current (inside `replacing_model`)."""


class OperatorActions:
    """See the module doc. `top_k_timeout_s` is admin.top_k_timeout_s, the
    longest (and default) wait for a device's answer."""

    def __init__(self, *, store: Store, registry: DeviceRegistry, events: EventHub, metrics: CoordinatorMetrics,
                 relay: DeviceRelay, control: FederationControl, model: ServerModel, top_k_timeout_s: float,
                 clock: Callable[[], float]) -> None:
        self.store = store
        self.registry = registry
        self.events = events
        self.metrics = metrics
        self.relay = relay
        self.control = control
        self.model = model
        self.top_k_timeout_s = top_k_timeout_s
        self._clock = clock

    async def _audit(self, operator: str, action: str, outcome: str, **details: object) -> AuditRecord:
        return await asyncio.to_thread(self.store.append_audit, operator=operator, action=action, outcome=outcome,
                                       details={k: v for k, v in details.items() if v not in (None, "")})

    def _announce(self, action: str, operator: str) -> None:
        c = self.control
        self.metrics.paused.set(1 if c.paused else 0)
        self.events.publish(federation_changed=admin_service_pb2.FederationChanged(
            paused=c.paused, budget_exhausted=c.budget_exhausted, model_version=c.model_version or 0,
            action=action, operator=operator))

    async def _set_paused(self, paused: bool, operator: str, reason: str) -> ActionOutcome:
        check_operator(operator, reason)
        self.control.check_running()
        changed = self.control.set_paused(paused)
        action = "pause" if paused else "resume"
        entry = await self._audit(operator, action, "ok" if changed else
                                  "ok: already paused" if paused else "ok: not paused", reason=reason)
        if changed:
            log_event("paused" if paused else "resumed", operator=operator)
            self._announce(action, operator)
        return ActionOutcome(changed, entry)

    async def pause(self, operator: str, reason: str = "") -> ActionOutcome:
        """No new round opens until `resume` (a running round finishes)."""
        return await self._set_paused(True, operator, reason)

    async def resume(self, operator: str, reason: str = "") -> ActionOutcome:
        return await self._set_paused(False, operator, reason)

    async def abort_round(self, operator: str, reason: str = "") -> ActionOutcome:
        """Abort the collecting round with AbortReason CANCELLED;
        FailedPrecondition when none is collecting (audited as refused)."""
        check_operator(operator, reason)
        self.control.check_running()
        detail = f"cancelled by operator {operator}" + (f": {reason}" if reason else "")
        number = self.control.cancel_round(detail[:500])
        if number is None:
            await self._audit(operator, "abort_round", "refused: no round is collecting", reason=reason)
            raise FailedPrecondition("no round is collecting (nothing to abort)")
        log_event("round_cancelled", round=number, operator=operator)
        entry = await self._audit(operator, "abort_round", "ok", round=number, reason=reason)
        self._announce("abort_round", operator)
        return ActionOutcome(True, entry)

    async def rollback(self, version: int, operator: str, reason: str = "") -> ActionOutcome:
        """Store a new model version whose parameters equal `version`'s
        (hyperparameters["rollback_of"] = version) and make it current; a
        collecting round is aborted first (CANCELLED). InvalidArgument
        (version 0, parameters that do not fit the model), NotFound (no
        such version of this model); refusals are audited."""
        check_operator(operator, reason)
        self.control.check_running()
        if version < 1:
            raise InvalidArgument("version must be >= 1")
        try:
            old = await asyncio.to_thread(self.store.get_model_version, version)
        except NotFoundError:
            old = None
        if old is None or old.model_name != self.model.name:
            await self._audit(operator, "rollback", "refused: no such version of this model", version=version,
                              reason=reason)
            raise NotFound(f"model version {version} of {self.model.name!r} does not exist")
        params = unpack_parameters(old.parameters)
        if {k: tuple(v.shape) for k, v in params.items()} != self.model.parameter_shapes():
            await self._audit(operator, "rollback", "refused: parameters do not fit the model", version=version,
                              reason=reason)
            raise InvalidArgument(f"model version {version} has parameters that do not fit the configured model")
        async with self.control.replacing_model(f"rollback to version {version} by {operator}"):
            summary = await asyncio.to_thread(self.store.add_model_version, NewModelVersion(
                model_name=old.model_name, parameters=old.parameters,
                hyperparameters={**old.hyperparameters, "rollback_of": version},
            ))
            self.control.adopt_model(summary.id, params, int(old.hyperparameters.get("step", 0)))
        log_event("rolled_back", version=version, new_version=summary.id, operator=operator)
        entry = await self._audit(operator, "rollback", "ok", version=version, new_version=summary.id, reason=reason)
        self._announce("rollback", operator)
        return ActionOutcome(True, entry, summary.id)

    async def record_refusal(self, operator: str, action: str, reason: str, *, role: str = "",
                             suppressed: int = 0) -> AuditRecord:
        """Audit an operator action that the admin service refused at its
        REST layer (a role that may not use the route): outcome "refused:
        <reason>"; the refused caller's name is the operator. InvalidArgument
        for a malformed field (check_refusal)."""
        check_refusal(operator, action, reason, role)
        return await self._audit(operator, action, f"refused: {reason}", by="admin service", role=role,
                                 suppressed=suppressed or None)

    def connected_device_of_handle(self, handle: str) -> int | None:
        """The device id of a user handle (its enrolment local_id) whose
        device an open stream hosts now, else None; InvalidArgument for an
        empty handle. Reads the registry only (every proven device is in it)."""
        if not handle:
            raise InvalidArgument("empty user handle")
        for rec in self.registry.devices.values():
            if rec.local_id == handle:
                session = self.registry.owner(rec.id)
                return rec.id if session is not None and not session.closed else None
        return None

    async def _not_connected(self, handle: str) -> UserNotConnected:
        """The one answer for a handle no connected device has: unknown and
        offline handles alike, by the same path (a registry scan, then one
        store read), so neither the status, the message nor the time tells
        them apart (D84). The store read only labels the metric and the log,
        which the operator sees and a recommender does not."""
        known: DeviceRecord | None = await asyncio.to_thread(self.store.get_device_by_local_id, handle)
        why = "offline" if known is not None else "unknown"
        self.metrics.top_k("unavailable" if known is not None else "not_found", 0.0)
        log_event("top_k_handle_not_connected", why=why, device=known.id if known is not None else "-")
        return UserNotConnected()

    async def recommend(self, *, device_id: int | None = None, handle: str | None = None, k: int,
                        exclude_seen: bool = True, timeout_s: float | None = None) -> Recommendation:
        """`DeviceRelay.request_top_k` for a device named by id or by user handle (one of
        them), with its latency and a fresh recommendation id. Raises as
        `DeviceRelay.request_top_k`, except that a handle no connected device
        has (unknown, or its device offline) raises UserNotConnected."""
        self.control.check_running()
        if (device_id is None) == (handle is None):
            raise InvalidArgument("name the device by id or by user handle (one of them)")
        limit = self.top_k_timeout_s
        timeout = limit if timeout_s is None else timeout_s
        if not 0 < timeout <= limit:
            raise InvalidArgument(f"timeout must be in (0, {limit:g}] s")
        self.relay.check(k, timeout)  # a bad k is a bad k for every handle, known or not
        if handle is not None:
            device_id = self.connected_device_of_handle(handle)
            if device_id is None:
                raise await self._not_connected(handle)
        assert device_id is not None
        t0 = self._clock()
        try:
            answer = await self.relay.request_top_k(device_id, k, exclude_seen=exclude_seen, timeout_s=timeout)
        except DeviceNotConnected as exc:  # its stream closed since the look-up: still no device id to a handle
            if handle is not None and not isinstance(exc, DeviceDisconnected):
                raise UserNotConnected() from None
            raise
        rec = self.registry.devices.get(device_id)
        return Recommendation(answer=answer, device_id=device_id, handle=rec.local_id if rec is not None else "",
                              latency_s=self._clock() - t0, recommendation_id=uuid.uuid4().hex)


__all__ = ["ActionOutcome", "FederationControl", "OperatorActions", "Recommendation", "check_operator",
           "check_refusal"]
