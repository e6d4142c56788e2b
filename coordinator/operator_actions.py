"""What the admin listener asks of the running coordinator: its live state,
the operator actions (pause, resume, abort, rollback; each written to the
store's audit log) and top-k by device id or user handle.

`OperatorActions` is mixed into `Coordinator` (service.py): it acts on the
coordinator's runtime state, declared below, on the coordinator's event
loop. The pure parts (the action result, the operator check, the top-k
metric status) are module functions. See docs/decisions.md D40-D44.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from coordinator.errors import (
    DeviceAnswerError,
    DeviceNotConnected,
    DeviceTimeout,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    UnknownDevice,
)
from coordinator.events import EventHub
from coordinator.live_state import RoundTimeline, device_counts, live_round, live_state, privacy_budget
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import ServerModel
from coordinator.registry import DeviceRegistry
from coordinator.relay import TopKAnswer
from coordinator.round_report import PrivacyLedger
from coordinator.rounds import Action, RoundMachine
from coordinator.settings import CoordinatorSettings
from coordinator.store import AuditRecord, DeviceRecord, NewModelVersion, NotFoundError, Store
from coordinator.store.blobs import unpack_parameters
from fedmask_proto.v1 import admin_service_pb2, common_pb2

MAX_OPERATOR_CHARS = 128
MAX_REASON_CHARS = 1024


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


#: DeviceErrorCode suffix -> the error the admin sees (and its top-k metric status).
_DEVICE_CODE_STATUS = {"refused": "refused", "not_ready": "not_ready", "invalid_argument": "invalid_argument",
                       "unknown_device": "unavailable"}


class OperatorActions:
    """The admin-facing methods of `Coordinator` (see the module doc)."""

    # The coordinator's runtime state these methods use (Coordinator.__init__ sets it).
    settings: CoordinatorSettings
    store: Store
    model: ServerModel
    registry: DeviceRegistry
    ledger: PrivacyLedger
    events: EventHub
    metrics: CoordinatorMetrics
    round: RoundMachine | None
    model_version: int | None
    paused: bool
    budget_exhausted: bool
    epsilon_spent: float
    rounds_committed: int
    rounds_aborted: int
    _timeline: RoundTimeline
    _round_base: int | None
    _round_started_at: datetime | None
    _held: asyncio.Event
    _changed: asyncio.Event
    _round_event: asyncio.Event
    _rollbacks: int
    _model_lock: asyncio.Lock
    _params: dict[str, np.ndarray]
    _params_proto: common_pb2.ModelParameters | None
    _step: int
    _wall: Callable[[], datetime]
    _clock: Callable[[], float]

    # Implemented by Coordinator.
    def _check_running(self) -> None:
        raise NotImplementedError

    def _apply(self, actions: Iterable[Action]) -> None:
        raise NotImplementedError

    def device_counts(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    async def request_top_k(self, device_id: int, k: int, *, exclude_seen: bool = True,
                            timeout_s: float = 10.0) -> TopKAnswer:
        raise NotImplementedError

    def live_state(self) -> admin_service_pb2.LiveState:
        """What the coordinator is doing now (GetLiveState); Unavailable
        while starting or shutting down."""
        self._check_running()
        enrolled, revoked, connected, available = self.device_counts()
        r = self.round
        current = None
        if r is not None:
            current = live_round(r, self._timeline, base_version=self._round_base,
                                 started_at=self._round_started_at or self._wall(),
                                 secure=not self.settings.debug.insecure_plaintext)
        return live_state(
            model_name=self.model.name, model_version=self.model_version, paused=self.paused,
            privacy=privacy_budget(spent=self.epsilon_spent, budget=self.ledger.budget, delta=self.settings.dp.delta,
                                   exhausted=self.budget_exhausted, mode=self.settings.dp.mode),
            devices=device_counts(enrolled=enrolled, revoked=revoked, connected=connected, available=available),
            round_=current, as_of=self._wall(), last_sequence=self.events.sequence,
            committed=self.rounds_committed, aborted=self.rounds_aborted,
        )

    async def _audit(self, operator: str, action: str, outcome: str, **details: object) -> AuditRecord:
        return await asyncio.to_thread(self.store.append_audit, operator=operator, action=action, outcome=outcome,
                                       details={k: v for k, v in details.items() if v not in (None, "")})

    def _announce(self, action: str, operator: str) -> None:
        self.metrics.paused.set(1 if self.paused else 0)
        self.events.publish(federation_changed=admin_service_pb2.FederationChanged(
            paused=self.paused, budget_exhausted=self.budget_exhausted, model_version=self.model_version or 0,
            action=action, operator=operator))

    async def pause(self, operator: str, reason: str = "") -> ActionOutcome:
        """No new round opens until `resume` (a running round finishes)."""
        check_operator(operator, reason)
        self._check_running()
        changed = not self.paused
        self.paused = True
        self._held.set()
        entry = await self._audit(operator, "pause", "ok" if changed else "ok: already paused", reason=reason)
        if changed:
            log_event("paused", operator=operator)
            self._announce("pause", operator)
        return ActionOutcome(changed, entry)

    async def resume(self, operator: str, reason: str = "") -> ActionOutcome:
        check_operator(operator, reason)
        self._check_running()
        changed = self.paused
        self.paused = False
        self._held.set()
        self._changed.set()
        entry = await self._audit(operator, "resume", "ok" if changed else "ok: not paused", reason=reason)
        if changed:
            log_event("resumed", operator=operator)
            self._announce("resume", operator)
        return ActionOutcome(changed, entry)

    async def abort_round(self, operator: str, reason: str = "") -> ActionOutcome:
        """Abort the collecting round with AbortReason CANCELLED;
        FailedPrecondition when none is collecting (audited as refused)."""
        check_operator(operator, reason)
        self._check_running()
        r = self.round
        if r is None or not r.phase.is_collecting:
            await self._audit(operator, "abort_round", "refused: no round is collecting", reason=reason)
            raise FailedPrecondition("no round is collecting (nothing to abort)")
        detail = f"cancelled by operator {operator}" + (f": {reason}" if reason else "")
        self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, detail[:500], self._clock()))
        self._round_event.set()
        log_event("round_cancelled", round=r.number, operator=operator)
        entry = await self._audit(operator, "abort_round", "ok", round=r.number, reason=reason)
        self._announce("abort_round", operator)
        return ActionOutcome(True, entry)

    async def rollback(self, version: int, operator: str, reason: str = "") -> ActionOutcome:
        """Store a new model version whose parameters equal `version`'s
        (hyperparameters["rollback_of"] = version) and make it current; a
        collecting round is aborted first (CANCELLED). InvalidArgument
        (version 0, parameters that do not fit the model), NotFound (no
        such version of this model); refusals are audited."""
        check_operator(operator, reason)
        self._check_running()
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
        self._rollbacks += 1  # no round opens until the new version is current
        try:
            r = self.round
            if r is not None and r.phase.is_collecting:
                self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, f"rollback to version {version} by {operator}",
                                     self._clock()))
                self._round_event.set()
            async with self._model_lock:  # after a commit in progress, never during it
                summary = await asyncio.to_thread(self.store.add_model_version, NewModelVersion(
                    model_name=old.model_name, parameters=old.parameters,
                    hyperparameters={**old.hyperparameters, "rollback_of": version},
                ))
                self._params, self._params_proto = params, None
                self.model_version = summary.id
                self._step = int(old.hyperparameters.get("step", 0))
        finally:
            self._rollbacks -= 1
            self._held.set()
        log_event("rolled_back", version=version, new_version=summary.id, operator=operator)
        entry = await self._audit(operator, "rollback", "ok", version=version, new_version=summary.id, reason=reason)
        self._announce("rollback", operator)
        return ActionOutcome(True, entry, summary.id)

    async def device_of_handle(self, handle: str) -> int:
        """The device id of a user handle (its enrolment local_id); NotFound."""
        if not handle:
            raise InvalidArgument("empty user handle")
        for rec in self.registry.devices.values():
            if rec.local_id == handle:
                return rec.id
        found: DeviceRecord | None = await asyncio.to_thread(self.store.get_device_by_local_id, handle)
        if found is None:
            raise NotFound("no device has this user handle")
        return found.id

    async def recommend(self, *, device_id: int | None = None, handle: str | None = None, k: int,
                        exclude_seen: bool = True, timeout_s: float | None = None) -> Recommendation:
        """`request_top_k` for a device named by id or by user handle (one of
        them), with its latency and a fresh recommendation id. Raises as
        `request_top_k`, plus NotFound (unknown handle)."""
        self._check_running()
        if (device_id is None) == (handle is None):
            raise InvalidArgument("name the device by id or by user handle (one of them)")
        limit = self.settings.admin.top_k_timeout_s
        timeout = limit if timeout_s is None else timeout_s
        if not 0 < timeout <= limit:
            raise InvalidArgument(f"timeout must be in (0, {limit:g}] s")
        if handle is not None:
            try:
                device_id = await self.device_of_handle(handle)
            except NotFound:
                self.metrics.top_k("not_found", 0.0)
                raise
        assert device_id is not None
        t0 = self._clock()
        answer = await self.request_top_k(device_id, k, exclude_seen=exclude_seen, timeout_s=timeout)
        rec = self.registry.devices.get(device_id)
        return Recommendation(answer=answer, device_id=device_id, handle=rec.local_id if rec is not None else "",
                              latency_s=self._clock() - t0, recommendation_id=uuid.uuid4().hex)


def top_k_status(exc: BaseException) -> str:
    """The fedmask_topk_requests_total status label of a failed request."""
    if isinstance(exc, UnknownDevice):
        return "not_found"
    if isinstance(exc, DeviceNotConnected):
        return "unavailable"
    if isinstance(exc, DeviceTimeout):
        return "timeout"
    if isinstance(exc, DeviceAnswerError):
        return _DEVICE_CODE_STATUS.get(exc.code, "device_error")
    if isinstance(exc, InvalidArgument):
        return "invalid_argument"
    return "error"


__all__ = ["ActionOutcome", "OperatorActions", "Recommendation", "check_operator", "top_k_status"]
