"""The coordinator's asyncio runtime: sessions, device registry, cohort
selection and the round loop around the pure `RoundMachine`.

Everything here runs on one event loop; store calls (blocking SQL) and the
model step go to worker threads. The gRPC servicer only calls:

    await coordinator.enroll(request, client_id=...)          -> EnrollResponse
    session = await coordinator.open_session(hello, client_id=..., peer=...)
    await coordinator.handle(session, client_message)          (per message)
    coordinator.close_session(session, why)                    (stream ended)

and drains `session.outbox` (ServerMessage, or a StreamEnd that ends the
stream with a status). Errors are `coordinator.errors` exceptions.

In-process callers (the admin) relay queries to a device over its stream:

    answer = await coordinator.request_top_k(device_id, k, exclude_seen=True, timeout_s=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import timestamp_pb2

from coordinator.debug import debug_metrics
from coordinator.errors import (
    DeviceNotConnected,
    DeviceRequestError,
    InvalidArgument,
    PermissionDenied,
    ProtocolViolation,
    Unavailable,
    UnknownDevice,
)
from coordinator.logs import log_event
from coordinator.model_host import SYNTHETIC, ServerModel
from coordinator.plaintext import PLAINTEXT_HYPERPARAMETER, PlaintextRoundMachine
from coordinator.relay import DEFAULT_TIMEOUT_S, PendingRequests, TopKAnswer, check_top_k, top_k_answer, top_k_request
from coordinator.rounds import (
    AggregateReady,
    Broadcast,
    LogEvent,
    PhaseChanged,
    RoundEnded,
    RoundMachine,
    RoundPhase,
    Send,
    reason_name,
)
from coordinator.selection import eligible_devices, select_cohort
from coordinator.settings import CoordinatorSettings
from coordinator.store import (
    DeviceRecord,
    DeviceStatus,
    NewModelVersion,
    PrivacyEntry,
    RoundRecord,
    RoundState,
    Store,
    utc_now,
)
from coordinator.store.blobs import pack_parameters, unpack_parameters
from fedmask_proto.v1 import common_pb2, enrollment_pb2, session_pb2
from secagg.config import SecAggConfig
from secagg.errors import ConfigError
from wire import WireError, build_round_task, params_to_proto
from wire.round_task import seconds_to_duration
from wire.secagg_codec import CLIENT_FIELDS, expand_abort

if TYPE_CHECKING:
    from models.privacy import Composition

PROTOCOL_VERSION = "fedmask.v1"
COORDINATOR_VERSION = "0.1.0"
IDENTITY_KEY_BYTES = 32
MAX_ENROLL_DEVICES = 10_000
MAX_LOCAL_ID_CHARS = 256
MAX_ANNOUNCED_DEVICES = 100_000
SILENT_INTERVALS = 3

_PHASE_STATE = {
    RoundPhase.ADVERTISE_KEYS: RoundState.ADVERTISE_KEYS,
    RoundPhase.SHARE_KEYS: RoundState.SHARE_KEYS,
    RoundPhase.MASKED_INPUT: RoundState.MASKED_INPUT,
    RoundPhase.CONSISTENCY_CHECK: RoundState.CONSISTENCY_CHECK,
    RoundPhase.UNMASKING: RoundState.UNMASKING,
    RoundPhase.AGGREGATING: RoundState.AGGREGATING,
}
_STAGE_MESSAGES = tuple(f for f in CLIENT_FIELDS.values())


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Outbox sentinel: end the stream with `code` (OK = graceful)."""

    code: grpc.StatusCode
    detail: str = ""


@dataclass(eq=False)
class ClientSession:
    """One edge-client process's Session stream."""

    sid: int
    client_name: str
    client_id: str | None
    peer: str
    supported_models: frozenset[str]
    last_seen: float
    devices: set[int] = field(default_factory=set)  # accepted, owned by this stream
    available: set[int] = field(default_factory=set)  # subset of devices, selectable now
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False

    def send(self, message: session_pb2.ServerMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)

    def end(self, code: grpc.StatusCode, detail: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(StreamEnd(code, detail))

    def supports(self, model_name: str) -> bool:
        return not self.supported_models or model_name in self.supported_models


def _now_timestamp(wall: Callable[[], datetime]) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(wall())
    return ts


def secagg_config_for(settings: CoordinatorSettings, n: int, vector_length: int, session_id: bytes) -> SecAggConfig:
    """Resolve the secagg policy of the settings for a cohort of n devices.
    graph: "full" -> complete graph; "auto" -> SecAgg+ (secagg picks k and t),
    or the complete graph when secagg finds no sparse (k, t) for so small a
    cohort; K -> Harary graph of degree K (complete if K >= n - 1).
    threshold: the policy applied to the group (k + 1 devices), raised to the
    strict majority secagg requires (2n/3 + 1 on a complete graph in active
    mode); with a sparse "auto" graph, secagg's own t is used."""
    s = settings.secagg
    active = s.signatures
    if s.graph == "full":
        neighbors: Any = "all"
    elif s.graph == "auto":
        neighbors = "auto"
        try:
            auto = SecAggConfig.create(
                num_clients=n, vector_length=vector_length, session_id=session_id, clip=s.clip, neighbors="auto",
                modulus_bits=s.modulus_bits, expected_dropout=s.expected_dropout, active_adversary=active,
            )
            if not auto.is_complete_graph:
                return auto
        except ConfigError:
            pass
        neighbors = "all"  # too small for a sparse graph: Bonawitz with the threshold policy
    else:
        neighbors = int(s.graph)
    k = n - 1 if neighbors == "all" else min(int(neighbors), n - 1)  # K >= n - 1: complete graph
    group = k + 1
    threshold = max(s.threshold_for(group), group // 2 + 1)
    if active and k == n - 1:
        threshold = max(threshold, (2 * n) // 3 + 1)
    return SecAggConfig.create(
        num_clients=n,
        vector_length=vector_length,
        session_id=session_id,
        clip=s.clip,
        neighbors=neighbors,
        threshold=threshold,
        modulus_bits=s.modulus_bits,
        expected_dropout=s.expected_dropout,
        active_adversary=active,
    )


def max_receive_message_bytes(settings: CoordinatorSettings, update_dim: int) -> int:
    """Enough for one MaskedInput (4 * L bytes) or a ShareKeys /
    UnmaskingResponse of the largest cohort, with 25% + 64 KiB headroom;
    at least 4 MiB (gRPC's default)."""
    if settings.max_receive_message_bytes is not None:
        return settings.max_receive_message_bytes
    n = settings.cohort.selected
    masked = 4 * update_dim + 256
    shares = n * (94 + 24)  # EncryptedShare: ciphertext + two varint ids + tags
    unmask = 2 * n * (33 + 16)
    need = max(masked, shares, unmask)
    return max(4 << 20, int(need * 1.25) + (64 << 10))


class Coordinator:
    """See the module doc."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        *,
        store: Store,
        model: ServerModel,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
        rng: random.Random | None = None,
        token_source: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.settings = settings
        self.store = store
        self.model = model
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng if rng is not None else random.Random(settings.seed)
        self._token = token_source
        self._sessions: dict[int, ClientSession] = {}
        self._owner: dict[int, ClientSession] = {}
        self._devices: dict[int, DeviceRecord] = {}
        self._sid = itertools.count(1)
        self._changed = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._round_event = asyncio.Event()
        self.round: RoundMachine | None = None
        self._round_started_at: datetime | None = None
        self._previous_contributors: frozenset[int] = frozenset()
        self._params: dict[str, np.ndarray] = {}
        self._params_proto: common_pb2.ModelParameters | None = None
        self.model_version: int | None = None
        self._step = 0
        # the committed privacy ledger, composed (built from the store at the first DP commit)
        self._composition: Composition | None = None
        self._started = False
        self._stopping = False
        self.rounds_run = 0
        self._reaper: asyncio.Task | None = None
        self._requests = PendingRequests(token=token_source)

    # ================================================================== lifecycle

    async def start(self) -> None:
        """Crash recovery, then resume from the latest model version (or
        initialize and commit the first one on an empty database)."""
        interrupted = await asyncio.to_thread(self.store.mark_interrupted_rounds_aborted)
        if interrupted:
            log_event("rounds_marked_aborted", logging.WARNING, rounds=",".join(map(str, interrupted)))
        latest = await asyncio.to_thread(self.store.latest_model_version, self.model.name)
        want = self.model.parameter_shapes()
        if latest is None:
            params = self.model.init_parameters(self.settings.seed or 0)
            summary = await asyncio.to_thread(
                self.store.add_model_version,
                NewModelVersion(
                    model_name=self.model.name,
                    parameters=pack_parameters(params),
                    hyperparameters={**self.model.hyperparameters(), "step": 0},
                ),
            )
            self._params, self.model_version, self._step = params, summary.id, 0
            log_event("model_initialized", model=self.model.name, version=summary.id)
        else:
            params = unpack_parameters(latest.parameters)
            got = {k: tuple(v.shape) for k, v in params.items()}
            if got != want:
                raise ValueError(
                    f"stored model version {latest.id} of {self.model.name!r} has parameters {got}, "
                    f"but the configured model has {want}: use another database or matching hyperparameters"
                )
            self._params, self.model_version = params, latest.id
            self._step = int(latest.hyperparameters.get("step", 0))
            log_event("model_resumed", model=self.model.name, version=latest.id, step=self._step)
        for rec in await asyncio.to_thread(self.store.list_devices):
            self._devices[rec.id] = rec
        self._started = True
        self._reaper = asyncio.create_task(self._reap_silent_sessions(), name="fedmask-session-reaper")

    async def shutdown(self, reason: str = "coordinator shutting down", retry_after: float = 5.0) -> None:
        """Abort a running round (COORDINATOR_SHUTDOWN), tell every client
        (ServerShutdown) and end their streams. The caller closes the store
        after `run()` returned."""
        if self._stopping:
            return
        self._stopping = True
        self._stop_event.set()
        log_event("shutdown", reason=reason)
        r = self.round
        if r is not None and r.phase.is_collecting:
            self._apply(r.cancel(common_pb2.ABORT_REASON_COORDINATOR_SHUTDOWN, reason, self._clock()))
        self._changed.set()
        self._round_event.set()
        if self._reaper is not None:
            self._reaper.cancel()
        self._requests.fail_all("coordinator shutting down")
        msg = session_pb2.ServerMessage(
            shutdown=session_pb2.ServerShutdown(reason=reason, retry_after=seconds_to_duration(retry_after))
        )
        for s in list(self._sessions.values()):
            s.send(msg)
            s.end(grpc.StatusCode.OK, "shutdown")

    @property
    def stopping(self) -> bool:
        return self._stopping

    # ================================================================== enrolment

    async def enroll(self, request: enrollment_pb2.EnrollRequest, *, client_id: str | None) -> enrollment_pb2.EnrollResponse:
        self._check_running()
        devices = request.devices
        if not devices:
            raise InvalidArgument("EnrollRequest lists no device")
        if len(devices) > MAX_ENROLL_DEVICES:
            raise InvalidArgument(f"EnrollRequest lists {len(devices)} devices (at most {MAX_ENROLL_DEVICES})")
        seen_ids: set[str] = set()
        seen_keys: set[bytes] = set()
        for i, d in enumerate(devices):
            if not d.local_id or len(d.local_id) > MAX_LOCAL_ID_CHARS:
                raise InvalidArgument(f"devices[{i}].local_id is empty or longer than {MAX_LOCAL_ID_CHARS}")
            if d.local_id in seen_ids:
                raise InvalidArgument(f"devices[{i}].local_id {d.local_id!r} appears twice")
            if len(d.identity_public_key) != IDENTITY_KEY_BYTES:
                raise InvalidArgument(f"devices[{i}].identity_public_key must be {IDENTITY_KEY_BYTES} bytes")
            if d.identity_public_key in seen_keys:
                raise InvalidArgument(f"devices[{i}].identity_public_key appears twice")
            seen_ids.add(d.local_id)
            seen_keys.add(bytes(d.identity_public_key))

        from coordinator.store import EnrollmentConflictError

        def work() -> list[tuple[DeviceRecord, bool]]:
            # One store transaction for the whole request: all devices or none.
            try:
                return self.store.enroll_devices(
                    [(bytes(d.identity_public_key), d.local_id) for d in devices], client_id=client_id
                )
            except EnrollmentConflictError as exc:
                d = devices[exc.index]
                what = "is revoked" if exc.reason == exc.REVOKED else "is enrolled by another client"
                raise PermissionDenied(f"device {d.local_id!r} (id {exc.device_id}) {what}") from None

        results = await asyncio.to_thread(work)
        out = enrollment_pb2.EnrollResponse(protocol_version=PROTOCOL_VERSION, coordinator_version=COORDINATOR_VERSION)
        for d, (rec, new) in zip(devices, results, strict=True):
            self._devices[rec.id] = rec
            if rec.status is not DeviceStatus.ACTIVE:
                raise PermissionDenied(f"device {d.local_id!r} (id {rec.id}) is revoked")
            if rec.client_id and client_id and rec.client_id != client_id:
                raise PermissionDenied(f"device {d.local_id!r} (id {rec.id}) is enrolled by another client")
            out.devices.add(local_id=d.local_id, device_id=rec.id, newly_enrolled=new)
        log_event("enrolled", client=request.client_name[:64], devices=len(devices),
                  new=sum(1 for _, n in results if n))
        return out

    # ================================================================== sessions

    def _check_running(self) -> None:
        if not self._started or self._stopping:
            raise Unavailable("the coordinator is starting or shutting down")

    async def open_session(self, hello: session_pb2.Hello, *, client_id: str | None, peer: str = "") -> ClientSession:
        """A new stream sent its Hello: admit its devices (displacing older
        streams that hosted them) and queue the Welcome."""
        self._check_running()
        if hello.protocol_version and hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolViolation(f"protocol_version {hello.protocol_version!r} is not {PROTOCOL_VERSION!r}")
        session = ClientSession(
            sid=next(self._sid),
            client_name=hello.client_name[:128],
            client_id=client_id,
            peer=peer,
            supported_models=frozenset(hello.supported_models),
            last_seen=self._clock(),
        )
        admission = await self._admit(session, hello.available_device_ids)
        self._sessions[session.sid] = session
        session.send(
            session_pb2.ServerMessage(
                welcome=session_pb2.Welcome(
                    protocol_version=PROTOCOL_VERSION,
                    coordinator_version=COORDINATOR_VERSION,
                    heartbeat_interval=seconds_to_duration(self.settings.heartbeat_interval),
                    admission=admission,
                    server_time=_now_timestamp(self._wall),
                )
            )
        )
        log_event("session_opened", session=session.sid, client=session.client_name, peer=peer,
                  accepted=len(admission.accepted_device_ids), rejected=len(admission.rejected))
        self._changed.set()
        return session

    async def _admit(self, session: ClientSession, announced: Iterable[int]) -> session_pb2.DeviceAdmission:
        ids = list(announced)
        if len(ids) > MAX_ANNOUNCED_DEVICES:
            raise ProtocolViolation(f"{len(ids)} devices announced (at most {MAX_ANNOUNCED_DEVICES})")
        if len(set(ids)) != len(ids):
            raise ProtocolViolation("a device is announced twice")
        unknown = [d for d in ids if d not in self._devices]
        if unknown:  # enrolled since start by another path (admin), or never
            for rec in await asyncio.to_thread(self.store.list_devices):
                self._devices[rec.id] = rec
        admission = session_pb2.DeviceAdmission()
        accepted: list[int] = []
        R = session_pb2
        for d in ids:
            rec = self._devices.get(d)
            if rec is None:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_UNKNOWN_DEVICE)
            elif rec.status is not DeviceStatus.ACTIVE:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_REVOKED)
            elif rec.client_id and session.client_id and rec.client_id != session.client_id:
                admission.rejected.add(device_id=d, reason=R.DEVICE_REJECTION_REASON_NOT_OWNED)
            else:
                accepted.append(d)
        for d in accepted:
            old = self._owner.get(d)
            if old is not None and old is not session:
                self._release_device(old, d, "displaced by a newer session")
                if not old.devices:
                    old.end(grpc.StatusCode.ABORTED, "displaced: every device reconnected on a newer session")
                    self._forget_session(old)
                    log_event("session_displaced", session=old.sid, by=session.sid)
            self._owner[d] = session
            session.devices.add(d)
        # The announced list replaces the available set.
        newly_unavailable = session.available - set(accepted)
        session.available = set(accepted)
        for d in newly_unavailable:
            self._device_left_round(d, "became unavailable")
        admission.accepted_device_ids.extend(accepted)
        if accepted:
            await asyncio.to_thread(self.store.mark_devices_seen, accepted)
        return admission

    def _release_device(self, session: ClientSession, device_id: int, why: str) -> None:
        session.devices.discard(device_id)
        session.available.discard(device_id)
        if self._owner.get(device_id) is session:
            del self._owner[device_id]
        self._device_left_round(device_id, why)

    def _device_left_round(self, device_id: int, why: str) -> None:
        r = self.round
        if r is not None and r.phase.is_collecting:
            self._apply(r.device_lost(device_id, self._clock(), why))
            if r.wants_close:
                self._round_event.set()

    def _forget_session(self, session: ClientSession) -> None:
        self._sessions.pop(session.sid, None)
        for d in list(session.devices):
            self._release_device(session, d, "session closed")
        self._changed.set()

    def close_session(self, session: ClientSession, why: str = "stream ended") -> None:
        """The stream ended (either side): its devices drop out of any round."""
        if session.sid not in self._sessions:
            return
        session.closed = True
        self._forget_session(session)
        failed = self._requests.fail_session(session.sid, why)
        log_event("session_closed", session=session.sid, why=why, **({"pending_requests_failed": failed} if failed else {}))

    async def handle(self, session: ClientSession, message: session_pb2.ClientMessage) -> None:
        """One message from the stream after Hello."""
        session.last_seen = self._clock()
        kind = message.WhichOneof("message")
        if kind is None:
            raise ProtocolViolation("empty ClientMessage")
        if kind == "hello":
            raise ProtocolViolation("a second Hello on the stream")
        if kind == "heartbeat":
            session.send(
                session_pb2.ServerMessage(
                    heartbeat=session_pb2.Heartbeat(sequence=message.heartbeat.sequence, sent_at=_now_timestamp(self._wall))
                )
            )
            return
        if kind == "check_in":
            admission = await self._admit(session, message.check_in.available_device_ids)
            session.send(session_pb2.ServerMessage(check_in_ack=admission))
            self._changed.set()
            return
        if kind == "round_metrics":
            self._on_metrics(session, message.round_metrics)
            return
        if kind == "device_response":
            self._requests.resolve(session.sid, message.device_response)
            return
        if kind in _STAGE_MESSAGES:
            self._on_stage_message(session, getattr(message, kind))
            return
        raise ProtocolViolation(f"unexpected message {kind!r}")  # pragma: no cover - all cases above

    def _on_stage_message(self, session: ClientSession, inner: Any) -> None:
        r = self.round
        if isinstance(inner, common_pb2.AbortNotice):
            hosted_in_round = [d for d in session.devices if r is not None and r.ids.has_device(d)]
            notices = expand_abort(inner, sorted(hosted_in_round)) if inner.device_id == 0 else [inner]
        else:
            notices = [inner]
        for m in notices:
            if m.device_id not in session.devices:
                raise ProtocolViolation(f"device {m.device_id} is not hosted by this session")
            if r is None:
                log_event("message_discarded", session=session.sid, device=m.device_id, kind=type(m).__name__,
                          why="no round is running")
                continue
            self._apply(r.handle(m.device_id, m, self._clock()))
        if r is not None and r.wants_close:
            self._round_event.set()

    def _on_metrics(self, session: ClientSession, msg: session_pb2.RoundMetrics) -> None:
        r = self.round
        if r is None:
            log_event("metrics_discarded", session=session.sid, why="no round is running")
            return
        try:
            r.add_metrics(msg, session.devices)
        except WireError as exc:
            log_event("metrics_rejected", logging.WARNING, session=session.sid, round=r.number, why=str(exc))

    async def _reap_silent_sessions(self) -> None:
        interval = self.settings.heartbeat_interval
        limit = SILENT_INTERVALS * interval
        try:
            while not self._stopping:
                await asyncio.sleep(interval / 2)
                now = self._clock()
                for s in list(self._sessions.values()):
                    if now - s.last_seen > limit:
                        s.end(grpc.StatusCode.DEADLINE_EXCEEDED, f"no message for {SILENT_INTERVALS} heartbeat intervals")
                        self.close_session(s, "silent")
        except asyncio.CancelledError:
            pass

    # ================================================================== device requests

    async def request_top_k(self, device_id: int, k: int, *, exclude_seen: bool = True,
                            timeout_s: float = DEFAULT_TIMEOUT_S) -> TopKAnswer:
        """The device's top-k recommendation, computed on the device from its
        private parameters and relayed over the stream hosting it.

        Raises InvalidArgument (k not in 1..n_items, bad timeout, a model
        without items; nothing is sent), UnknownDevice (never enrolled) or
        DeviceNotConnected (no open stream hosts it), DeviceTimeout,
        DeviceDisconnected (its stream closed first), DeviceAnswerError (the
        device answered with an error code), InvalidDeviceAnswer, and
        Unavailable (starting or shutting down)."""
        self._check_running()
        n_items = self.model.n_items
        check_top_k(k, n_items=n_items, timeout_s=timeout_s)
        assert n_items is not None
        session = self._owner.get(device_id)
        if session is None or session.closed:
            raise DeviceNotConnected(device_id) if device_id in self._devices else UnknownDevice(device_id)
        pending = self._requests.open(session.sid, device_id, "top_k")
        t0 = self._clock()
        outcome = "ok"
        try:
            session.send(top_k_request(pending.correlation_id, device_id, k=k, exclude_seen=exclude_seen,
                                       timeout_s=timeout_s))
            response = await self._requests.wait(pending, timeout_s)
            return top_k_answer(response, k=k, n_items=n_items)
        except DeviceRequestError as exc:
            outcome = type(exc).__name__
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            log_event("device_request", session=session.sid, device=device_id, kind="top_k", k=k,
                      exclude_seen=exclude_seen, outcome=outcome, seconds=f"{self._clock() - t0:.3f}")

    # ================================================================== actions

    def _apply(self, actions: Iterable[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                owner = self._owner.get(a.device_id)
                if owner is not None:
                    owner.send(a.message)
            elif isinstance(a, Broadcast):
                seen: set[int] = set()
                for d in a.device_ids:
                    owner = self._owner.get(d)
                    if owner is not None and owner.sid not in seen:
                        seen.add(owner.sid)
                        owner.send(a.message)
            elif isinstance(a, LogEvent):
                log_event(a.event, **a.fields)
            elif isinstance(a, PhaseChanged | AggregateReady | RoundEnded):
                self._round_event.set()

    # ================================================================== the round loop

    def eligible(self) -> list[int]:
        name = self.model.name
        available = (d for s in self._sessions.values() if not s.closed and s.supports(name) for d in s.available)
        busy = () if self.round is None else self.round.cohort
        return eligible_devices(
            available,
            busy=busy,
            previous_contributors=self._previous_contributors,
            allow_consecutive=self.settings.cohort.allow_consecutive,
        )

    async def _wait(self, event: asyncio.Event, timeout: float) -> None:
        if timeout > 0:
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                pass
        event.clear()

    async def run(self) -> None:
        """Run rounds until `settings.rounds` are done or shutdown()."""
        if not self._started:
            await self.start()
        limit = self.settings.rounds
        while not self._stopping and (limit is None or self.rounds_run < limit):
            try:
                cohort = await self._select()
                if self._stopping:
                    break
                if cohort is not None:
                    await self._run_round(cohort)
            except Exception as exc:  # a store outage, a bug: log it, back off, go on
                log_event("round_loop_error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
                logging.getLogger("fedmask.coordinator").debug("round loop error", exc_info=True)
                await self._wait(self._stop_event, 1.0)
            self.rounds_run += 1
            if self.settings.cohort.pause > 0 and not self._stopping:
                await self._wait(self._stop_event, self.settings.cohort.pause)
        log_event("round_loop_stopped", rounds=self.rounds_run)

    async def _select(self) -> list[int] | None:
        c = self.settings.cohort
        minimum = max(c.minimum, 2)
        target = max(c.selected, minimum)
        while not self._stopping and len(self.eligible()) < minimum:
            await self._wait(self._changed, 1.0)
        if self._stopping:
            return None
        window_end = self._clock() + self.settings.deadlines.selection
        while not self._stopping and len(self.eligible()) < target and self._clock() < window_end:
            await self._wait(self._changed, min(1.0, window_end - self._clock()))
        if self._stopping:
            return None
        cohort = select_cohort(self.eligible(), target=target, minimum=minimum, rng=self._rng)
        if cohort is None:
            number = await asyncio.to_thread(self.store.next_round_number)
            await self._record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES, "devices left during selection")
        return cohort

    async def _record_abort_only(self, number: int, reason: int, detail: str, cohort_size: int = 0) -> None:
        now = self._wall()
        rec = RoundRecord(
            number=number, state=RoundState.ABORTED, started_at=now, ended_at=now, cohort_size=cohort_size,
            abort_reason=reason_name(reason), base_model_version=self.model_version,
        )
        await asyncio.to_thread(self.store.abort_round, rec)
        log_event("round_aborted", logging.WARNING, round=number, reason=reason_name(reason), detail=detail)

    def _deadlines(self) -> dict[str, float]:
        d = self.settings.deadlines
        if self.settings.debug.insecure_plaintext:  # one stage: training + upload
            return {RoundPhase.MASKED_INPUT.value: d.training + d.masked_input}
        return {
            RoundPhase.ADVERTISE_KEYS.value: d.training + d.advertise_keys,
            RoundPhase.SHARE_KEYS.value: d.share_keys,
            RoundPhase.MASKED_INPUT.value: d.masked_input,
            RoundPhase.CONSISTENCY_CHECK.value: d.consistency_check,
            RoundPhase.UNMASKING.value: d.unmasking,
        }

    def _dp_settings(self, n: int) -> session_pb2.DpSettings:
        dp = self.settings.dp
        if dp.mode == "none":
            return session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE)
        std = dp.noise_multiplier * dp.clip
        mode = session_pb2.DP_MODE_LOCAL
        if dp.mode == "distributed":
            mode = session_pb2.DP_MODE_DISTRIBUTED
            std = std / math.sqrt(n)
        return session_pb2.DpSettings(mode=mode, clip_norm=dp.clip, noise_multiplier=dp.noise_multiplier, noise_stddev=std)

    def _record(self, r: RoundMachine, state: RoundState, *, ended: bool = False, metrics: Mapping[str, float] | None = None,
                timings: Mapping[str, float] | None = None) -> RoundRecord:
        return RoundRecord(
            number=r.number,
            state=state,
            started_at=self._round_started_at or self._wall(),
            ended_at=self._wall() if ended else None,
            cohort_size=len(r.cohort),
            abort_reason=reason_name(r.abort_reason) if state is RoundState.ABORTED and r.abort_reason is not None else None,
            base_model_version=self.model_version,
            survivors={"selected": list(r.cohort), **r.survivors()},
            dropouts=r.dropout_ids(),
            timings=dict(timings if timings is not None else r.timings),
            metrics=dict(metrics or {}),
        )

    async def _run_round(self, cohort: list[int]) -> None:
        number = await asyncio.to_thread(self.store.next_round_number)
        session_id = self._token(16)
        try:
            config = secagg_config_for(self.settings, len(cohort), self.model.update_dim, session_id)
        except ConfigError as exc:
            await self._record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES, str(exc), len(cohort))
            return
        identity = None
        if config.active_adversary:
            identity = {d: self._devices[d].identity_public_key for d in cohort}
        machine = PlaintextRoundMachine if self.settings.debug.insecure_plaintext else RoundMachine
        r = machine(number=number, config=config, cohort=cohort, deadlines=self._deadlines(), identity_keys=identity)
        self.round = r
        self._round_started_at = self._wall()
        log_event("round_started", round=number, cohort=len(cohort), config=config.describe(),
                  model=self.model.name, version=self.model_version)
        try:
            await asyncio.to_thread(self.store.save_round_progress, self._record(r, _PHASE_STATE[r.phase]))
            self._send_tasks(r)
            self._apply(r.start(self._clock()))
            saved_phase = r.phase
            while r.phase.is_collecting:
                timeout = r.deadline - self._clock()
                if r.wants_close or timeout <= 0:
                    self._apply(r.tick(self._clock()))
                else:
                    await self._wait(self._round_event, timeout)
                    continue
                if r.phase.is_collecting and r.phase is not saved_phase:
                    saved_phase = r.phase
                    await asyncio.to_thread(self.store.save_round_progress, self._record(r, _PHASE_STATE[r.phase]))
            if r.phase is RoundPhase.AGGREGATING:
                await self._commit(r)
            if r.phase is RoundPhase.ABORTED:
                await asyncio.to_thread(self.store.abort_round, self._record(r, RoundState.ABORTED, ended=True))
        except Exception:
            if not r.phase.is_terminal:  # tell the cohort; try to leave a record
                self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, "internal coordinator error", self._clock()))
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.abort_round, self._record(r, RoundState.ABORTED, ended=True))
            raise
        finally:
            self.round = None
            self._changed.set()

    def _send_tasks(self, r: RoundMachine) -> None:
        if self._params_proto is None:
            self._params_proto = params_to_proto(self._params)
        groups: dict[int, list[int]] = {}
        sessions: dict[int, ClientSession] = {}
        for d in r.cohort:
            s = self._owner.get(d)
            if s is None:  # left between selection and now
                self._apply(r.device_lost(d, self._clock(), "gone before the round task"))
                continue
            groups.setdefault(s.sid, []).append(d)
            sessions[s.sid] = s
        hp = {**self.model.hyperparameters(), "round_idx": self._step}
        deadlines = dict(self._deadlines())
        if self.settings.debug.insecure_plaintext:
            hp[PLAINTEXT_HYPERPARAMETER] = True
            deadlines = {RoundPhase.ADVERTISE_KEYS.value: self.settings.deadlines.training,
                         RoundPhase.MASKED_INPUT.value: self.settings.deadlines.masked_input}
        elif not r.config.active_adversary:
            del deadlines[RoundPhase.CONSISTENCY_CHECK.value]
        for sid, devices in groups.items():
            task = build_round_task(
                config=r.config, round_number=r.number, ids=r.ids, devices=devices, model_name=self.model.name,
                model_version=self.model_version or 0, global_parameters=self._params_proto, hyperparameters=hp,
                dp=self._dp_settings(len(r.cohort)), deadlines=deadlines,
            )
            sessions[sid].send(session_pb2.ServerMessage(round_task=task))

    async def _commit(self, r: RoundMachine) -> None:
        result = r.result
        assert result is not None
        t0 = self._clock()
        try:
            new_params = await asyncio.to_thread(self.model.apply_mean, self._params, result.decoded_mean, self._step)
            metrics = self._metrics(r)
            privacy = await asyncio.to_thread(self._privacy_entry, r)
            timings = {**r.timings, RoundPhase.AGGREGATING.value: self._clock() - t0}
            record = self._record(r, RoundState.COMMITTED, ended=True, metrics=metrics, timings=timings)
            version = NewModelVersion(
                model_name=self.model.name,
                parameters=pack_parameters(new_params),
                hyperparameters={**self.model.hyperparameters(), "step": self._step + 1},
            )
            summary = await asyncio.to_thread(self.store.commit_round, record, version, privacy)
        except Exception as exc:  # the model step or the store failed: the round is lost, not the service
            log_event("commit_failed", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
            self._apply(r.commit_failed(f"{type(exc).__name__}", self._clock()))
            return
        if privacy is not None and self._composition is not None:
            self._composition.add(privacy.noise_multiplier, privacy.sampling_rate)
        self._params, self._params_proto = new_params, None
        self.model_version = summary.id
        self._step += 1
        self._previous_contributors = frozenset(result.counted)
        self._apply(r.committed(summary.id, self._clock()))

    def _metrics(self, r: RoundMachine) -> dict[str, float]:
        result = r.result
        assert result is not None
        out: dict[str, float] = {"contributors": float(len(result.counted)), "cohort": float(len(r.cohort))}
        for k, v in r.metric_sums.items():
            out[f"sum.{k}"] = v
        for k, v in r.metric_counts.items():
            out[f"count.{k}"] = float(v)
        for k, v in r.metric_sums.items():
            if r.metric_counts.get(k):
                out[k] = v / r.metric_counts[k]
        if "loss" in r.metric_sums and r.metric_counts.get("examples"):
            out["loss"] = r.metric_sums["loss"] / r.metric_counts["examples"]
        if self.model.name != SYNTHETIC and r.metric_sums:
            from models.evaluation import finalize  # the models' own sum -> mean rules

            merged = {**r.metric_sums, **{k: float(v) for k, v in r.metric_counts.items()}}
            out.update(finalize(merged))
            # edge clients report validation sums as "val_<name>" (e.g. val_sampled_hits@10)
            val = {k.removeprefix("val_"): v for k, v in merged.items() if k.startswith("val_")}
            out.update({f"val_{k}": v for k, v in finalize(val).items()})
        if self.settings.debug.record_sums:
            out.update(debug_metrics(result.encoded_sum, result.decoded_sum, len(result.counted),
                                     self.settings.debug.sum_coordinates))
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def _privacy_entry(self, r: RoundMachine) -> PrivacyEntry | None:
        """Epsilon from models.privacy (dp_accounting). The sampling rate
        q = cohort / active enrolled devices. With distributed noise the sum
        holds the noise of the counted devices only, so the round is
        accounted at z * sqrt(counted / cohort) (dropouts cost privacy, D19);
        the ledger stores that effective multiplier. The cumulative epsilon
        composes every committed round exactly, each at its own (z, q): the
        running composition is built from the ledger once, and extended in
        `_commit` only after the store has committed the round."""
        dp = self.settings.dp
        if dp.mode == "none" or dp.noise_multiplier <= 0:
            return None
        from models.privacy import Composition, composed_epsilon, distributed_noise_multiplier

        population = max(1, sum(1 for rec in self._devices.values() if rec.status is DeviceStatus.ACTIVE))
        q = min(1.0, len(r.cohort) / population)
        z = dp.noise_multiplier
        if dp.mode == "distributed":
            assert r.result is not None
            z = distributed_noise_multiplier(z, planned=len(r.cohort), counted=len(r.result.counted))
        if self._composition is None:
            history = [(e.noise_multiplier, e.sampling_rate) for e in self.store.privacy_ledger()]
            self._composition = Composition(history, delta=dp.delta, accountant=dp.accountant)
        return PrivacyEntry(
            round_number=r.number, epsilon=composed_epsilon([(z, q)], delta=dp.delta, accountant=dp.accountant),
            delta=dp.delta, noise_multiplier=z, sampling_rate=q,
            cumulative_epsilon=self._composition.epsilon_with(z, q),
        )


__all__ = [
    "ClientSession",
    "Coordinator",
    "TopKAnswer",
    "StreamEnd",
    "max_receive_message_bytes",
    "secagg_config_for",
]
