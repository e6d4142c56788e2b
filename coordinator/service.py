"""The coordinator's asyncio runtime: its start and shutdown, the device
sessions, the routing of their stage messages and of the machines' actions,
the admin's view and control, and the round loop (round_loop.py, the
`InProcessRounds` mixin) that wires together the device registry
(`registry.py`), the round policy (`round_policy.py`), the pure round
machine (`rounds.py`, or one per group, `grouped_rounds.py`, as
`round_machines.py` builds it), the round report (`round_report.py`) and
the model it serves (`current_model.py`). Everything here runs on one event
loop; store calls (blocking SQL) and the model step go to worker threads.
The gRPC servicer only calls:

    coordinator.enroll_challenge()                             -> EnrollChallengeResponse
    await coordinator.enroll(request, client_id=...)          -> EnrollResponse
    coordinator.check_hello(hello)                             (before the SessionChallenge)
    coordinator.session_nonce()                                -> the stream's challenge nonce
    session = await coordinator.open_session(hello, nonce=..., proofs=..., client_id=..., peer=...)
    await coordinator.handle(session, client_message)          (per message)
    coordinator.close_session(session, why)                    (stream ended)

and drains `session.outbox` (ServerMessage, or a StreamEnd that ends the
stream with a status). Errors are `coordinator.errors` exceptions.

It composes `relay` (device_relay.py), `actions` (operator_actions.py; it
is their `FederationControl`), `outcomes` (round_outcomes.py: round ends, the
epsilon budget, D42), `census` (device_census.py), `delivery`
(round_delivery.py: messages to streams, D33), `spent` (spent_devices.py:
who already contributed to this version, D85) and `skip` (version_skip.py:
past a version a dead coordinator spent, D94); unmasking_guard.py saves who
is asked to unmask before anyone is asked (D94). The admin servicer gets
`actions`, `live_state` and the event hub."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime

import numpy as np

from coordinator.current_model import CurrentModel
from coordinator.device_census import DeviceCensus
from coordinator.device_relay import DeviceRelay
from coordinator.errors import ProtocolViolation, Unavailable
from coordinator.events import EventHub
from coordinator.live_state import device_counts, live_round, live_state, privacy_budget
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import ServerModel
from coordinator.operator_actions import OperatorActions
from coordinator.peer_reports import ReportPolicy, credential
from coordinator.possession import EnrollChallenges
from coordinator.report_ledger import ReportLedger
from coordinator.interrupted_charge import InterruptedCharge
from coordinator.registry import ClientSession, DeviceRegistry, StreamEnd, now_timestamp
from coordinator.recovery import recover
from coordinator.relay import TopKAnswer
from coordinator.round_policy import AdaptiveDeadlines, dp_mechanism_for
from coordinator.round_delivery import RoundDelivery
from coordinator.round_loop import InProcessRounds
from coordinator.round_outcomes import RoundOutcomes
from coordinator.round_report import PrivacyLedger
from coordinator.rounds import Action, AggregateReady, Broadcast, LogEvent, PhaseChanged, RoundEnded, Send
from coordinator.session_reaper import reap_silent_sessions
from coordinator.spent_devices import SpentDevices
from coordinator.version_skip import VersionSkip
from coordinator.settings import CoordinatorSettings
from coordinator.store import Store, utc_now
from coordinator.store.url import serves_replicas
from fedmask_proto.v1 import admin_service_pb2, common_pb2, enrollment_pb2, secagg_pb2, session_pb2
from wire.possession import SESSION_NONCE_BYTES
from wire.protocol import CLIENT_MESSAGE_STAGE
from wire.round_task import seconds_to_duration
from wire.secagg_codec import expand_abort


class Coordinator(InProcessRounds):
    """See the module doc; implements operator_actions.FederationControl.
    The round loop (`run`, `eligible`, the running `round`) is its
    `InProcessRounds` mixin (round_loop.py)."""

    def __init__(self, settings: CoordinatorSettings, *, store: Store, model: ServerModel,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], datetime] = utc_now,
                 rng: random.Random | None = None, token_source: Callable[[int], bytes] = os.urandom,
                 metrics: CoordinatorMetrics | None = None) -> None:
        super().__init__()  # the round loop's state and wake-ups, before any part that sets one
        self.settings = settings
        self.store = store
        self.model = model
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng if rng is not None else random.Random(settings.seed)
        self._token = token_source
        self.registry = DeviceRegistry(
            store, heartbeat_interval=settings.heartbeat_interval, clock=clock, wall_clock=wall_clock,
            on_device_left=self._device_left_round, on_changed=self._registry_changed,
            lookup_interval_s=settings.limits.device_lookup_interval_s,
            max_lookups=settings.limits.max_device_lookups,
        )
        self.deadlines = AdaptiveDeadlines(settings.deadlines, plaintext=settings.debug.insecure_plaintext)
        self.ledger = PrivacyLedger(settings.dp, store)
        self.spent = SpentDevices(store)  # devices that answered unmasking on this version (D85)
        s = settings.secagg
        self.peer_reports = ReportLedger(store, ReportPolicy(
            reporters=s.report_reporters, rounds=s.report_rounds, window=s.report_window, window_s=s.report_window_s,
            quarantine_rounds=s.report_quarantine_rounds, quarantine_s=s.report_quarantine_s, quota=s.report_quota,
        ), wall_clock=wall_clock, credential_of=self._credential)
        self.current = CurrentModel(store, model)
        self.skip = VersionSkip(store, self.current, model, grace_s=settings.deadlines.selection, clock=clock)
        self._started = False
        self._stopping = False
        self._reaper: asyncio.Task[None] | None = None
        admin = settings.admin
        self.events = EventHub(queue_size=admin.watcher_queue, max_watchers=admin.max_watchers, wall_clock=wall_clock)
        self.metrics = metrics if metrics is not None else CoordinatorMetrics()
        self.relay = DeviceRelay(self.registry, n_items=model.n_items, metrics=self.metrics, clock=clock,
                                 check_running=self.check_running, token=token_source, max_k=admin.max_top_k)
        self.actions = OperatorActions(store=store, registry=self.registry, events=self.events, metrics=self.metrics,
                                       relay=self.relay, control=self, model=model,
                                       top_k_timeout_s=admin.top_k_timeout_s, clock=clock)
        self.paused = False
        self.outcomes = RoundOutcomes(store=store, ledger=self.ledger, events=self.events, metrics=self.metrics,
                                      wall_clock=wall_clock, on_hold=self._held.set)
        self.census = DeviceCensus(self.registry, metrics=self.metrics, events=self.events)
        self._counter: asyncio.Task[None] | None = None
        #: bound ports by listener ("device", "admin", "metrics"), set by server.serve
        self.ports: dict[str, int] = {}
        self._rollbacks = 0  # rollbacks in progress: the loop opens no round meanwhile
        self.delivery = RoundDelivery(self.registry, device_ca=settings.secagg.device_ca, wall_clock=wall_clock)

    # ================================================================== lifecycle

    async def start(self, *, lead: bool = True) -> None:
        """`take_over()` when `lead` (a process that leads from the start),
        then load the registry and start serving devices. An active replica
        (D109) starts with `lead=False`: it serves devices whether or not it
        leads, and calls `take_over()` each time it becomes the leader."""
        if lead:
            await self.take_over()
        if serves_replicas(self.settings.database_url):
            # a store several replicas share: its tier secret MACs the enrolment
            # challenges, on the wall clock, so any replica verifies them (D109)
            secret = await asyncio.to_thread(self.store.tier_secret)
            self.registry.challenges = EnrollChallenges(clock=lambda: self._wall().timestamp(), tier_secret=secret)
        await self.registry.load()
        self._started = True
        self._reaper = asyncio.create_task(reap_silent_sessions(
            self.registry, interval=self.settings.heartbeat_interval, stopping=lambda: self._stopping,
            close_session=self.close_session), name="fedmask-session-reaper")
        self._counter = asyncio.create_task(self.census.run(), name="fedmask-device-counts")
        self.census.changed()

    async def take_over(self) -> None:
        """What a leader takes over (fenced by its lease, where the store has
        one): crash recovery (coordinator/recovery.py: unfinished rounds
        aborted and charged, D94; an operator's pause holds), the ledger,
        the latest model version (or the first one, initialized and
        committed on an empty database), and the budget."""
        charge = InterruptedCharge(self.ledger, lambda n, shares: dp_mechanism_for(self.settings, n,
                                                                                    self.model.update_dim, shares))
        self.paused = await recover(self.store, charge)
        self.ledger.reload()
        await self.current.load(self.settings.seed or 0)
        await self.outcomes.load_budget(paused=self.paused, model_version=self.model_version)

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
        if self._counter is not None:
            self._counter.cancel()
        self._held.set()
        self.events.close()
        self.relay.fail_all("coordinator shutting down")
        self.registry.end_all(session_pb2.ServerMessage(
            shutdown=session_pb2.ServerShutdown(reason=reason, retry_after=seconds_to_duration(retry_after))
        ))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def check_running(self) -> None:
        if not self._started or self._stopping:
            raise Unavailable("the coordinator is starting or shutting down")

    # ================================================================== the admin's view and control

    def live_state(self) -> admin_service_pb2.LiveState:
        """What the coordinator is doing now (GetLiveState); Unavailable
        while starting or shutting down."""
        self.check_running()
        enrolled, revoked, connected, available = self.census.counts()
        r, o = self.round, self.outcomes
        current = None
        if r is not None:
            current = live_round(r, self._timeline, base_version=self._round_base,
                                 started_at=self._round_started_at or self._wall(),
                                 secure=not self.settings.debug.insecure_plaintext)
        return live_state(
            model_name=self.model.name, model_version=self.model_version, paused=self.paused,
            privacy=privacy_budget(spent=o.epsilon_spent, budget=self.ledger.budget, delta=self.settings.dp.delta,
                                   exhausted=o.budget_exhausted, mode=self.settings.dp.mode),
            devices=device_counts(enrolled=enrolled, revoked=revoked, connected=connected, available=available),
            round_=current, as_of=self._wall(), last_sequence=self.events.sequence,
            committed=o.rounds_committed, aborted=o.rounds_aborted,
        )

    @property
    def model_version(self) -> int | None:
        return self.current.version

    @property
    def budget_exhausted(self) -> bool:
        return self.outcomes.budget_exhausted

    @property
    def holding(self) -> bool:
        """No round may open now: an operator paused the federation, the
        budget is exhausted, or a rollback is replacing the model."""
        return self.paused or self.budget_exhausted or self._rollbacks > 0

    def set_paused(self, paused: bool) -> bool:
        changed = paused != self.paused
        self.paused = paused
        self._held.set()
        if not paused:
            self._changed.set()
        return changed

    def cancel_round(self, detail: str) -> int | None:
        r = self.round
        if r is None or not r.phase.is_collecting:
            return None
        self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, detail, self._clock()))
        self._round_event.set()
        return r.number

    @contextlib.asynccontextmanager
    async def replacing_model(self, cancel_detail: str) -> AsyncIterator[None]:
        self._rollbacks += 1  # no round opens until the new version is current
        try:
            self.cancel_round(cancel_detail)
            async with self.current.lock:  # after a commit in progress, never during it
                yield
        finally:
            self._rollbacks -= 1
            self._held.set()

    def adopt_model(self, version: int, parameters: dict[str, np.ndarray], step: int) -> None:
        self.current.adopt(version, parameters, step)

    # ================================================================== devices and sessions

    def enroll_challenge(self) -> enrollment_pb2.EnrollChallengeResponse:
        self.check_running()
        return self.registry.enroll_challenge()

    async def enroll(self, request: enrollment_pb2.EnrollRequest, *, client_id: str | None) -> enrollment_pb2.EnrollResponse:
        self.check_running()
        return await self.registry.enroll(request, client_id=client_id)

    def check_hello(self, hello: session_pb2.Hello) -> None:
        """Refuse a Hello before its challenge (version rule; see DeviceRegistry.check_hello)."""
        self.check_running()
        self.registry.check_hello(hello)

    def session_nonce(self) -> bytes:
        """A fresh SessionChallenge nonce (from the coordinator's randomness)."""
        return self._token(SESSION_NONCE_BYTES)

    async def open_session(self, hello: session_pb2.Hello, *, nonce: bytes,
                           proofs: Iterable[session_pb2.DeviceProof] = (),
                           client_id: str | None, peer: str = "") -> ClientSession:
        """A new stream sent its Hello and its proofs to `nonce` (see DeviceRegistry.open)."""
        self.check_running()
        return await self.registry.open(hello, nonce=nonce, proofs=proofs, client_id=client_id, peer=peer)

    def close_session(self, session: ClientSession, why: str = "stream ended") -> None:
        """The stream ended (either side): its devices drop out of any round,
        its pending device requests fail."""
        if not self.registry.close(session, why):
            return
        failed = self.relay.fail_session(session.sid, why)
        log_event("session_closed", session=session.sid, why=why, **({"pending_requests_failed": failed} if failed else {}))

    def _credential(self, device_id: int) -> str:
        """The client credential a device's share-decryption reports count under (D37)."""
        rec = self.registry.devices.get(device_id)
        return credential(device_id, None if rec is None else rec.client_id)

    def _registry_changed(self) -> None:
        self._changed.set()
        self.census.changed()

    def _device_left_round(self, device_id: int, why: str) -> None:
        r = self.round
        if r is not None and r.phase.is_collecting:
            self._apply(r.device_lost(device_id, self._clock(), why))
            if r.wants_close:
                self._round_event.set()

    async def handle(self, session: ClientSession, message: session_pb2.ClientMessage) -> None:
        """One message from the stream after Hello."""
        session.last_seen = self._clock()
        kind = message.WhichOneof("message")
        if kind is None:  # also a kind this protocol removed, e.g. RoundMetrics (field 20, before fedmask.v1.1)
            raise ProtocolViolation("empty ClientMessage, or a kind this coordinator does not accept")
        if kind == "hello":
            raise ProtocolViolation("a second Hello on the stream")
        if kind == "proof":
            raise ProtocolViolation("DeviceProofs only answer the SessionChallenge (later proofs travel in CheckIn)")
        if kind == "heartbeat":
            beat = session_pb2.Heartbeat(sequence=message.heartbeat.sequence, sent_at=now_timestamp(self._wall))
            session.send(session_pb2.ServerMessage(heartbeat=beat))
            return
        if kind == "check_in":
            admission = await self.registry.admit(session, message.check_in.available_device_ids,
                                                  message.check_in.proofs)
            session.send(session_pb2.ServerMessage(check_in_ack=admission))
            self._changed.set()
            return
        if kind == "device_response":
            self.relay.resolve(session.sid, message.device_response)
            return
        inner = getattr(message, kind)
        if type(inner) in CLIENT_MESSAGE_STAGE or isinstance(inner, common_pb2.AbortNotice):
            self._on_stage_message(session, inner)
            return
        raise ProtocolViolation(f"unexpected message {kind!r}")  # pragma: no cover - all cases above

    def _on_stage_message(self, session: ClientSession, inner: object) -> None:
        r = self.round
        notices: list[object]
        if isinstance(inner, common_pb2.AbortNotice) and inner.device_id == 0:
            hosted_in_round = [d for d in session.devices if r is not None and r.has_device(d)]
            notices = list(expand_abort(inner, sorted(hosted_in_round)))
        else:
            notices = [inner]
        for m in notices:
            device_id = int(getattr(m, "device_id"))
            if device_id not in session.devices:
                if self.registry.is_revoked(device_id):  # revoked mid-round: its messages no longer count
                    log_event("message_discarded", session=session.sid, device=device_id, why="device revoked")
                    continue
                raise ProtocolViolation(f"device {device_id} is not hosted by this session")
            if r is None:
                log_event("message_discarded", session=session.sid, device=device_id, kind=type(m).__name__,
                          why="no round is running")
                continue
            if isinstance(m, secagg_pb2.AdvertiseKeys) and r.has_device(device_id):
                why = self.delivery.certificate_refusal(device_id, m, active=r.config.active_adversary)
                if why is not None:  # a protocol violation of that device only (D33)
                    log_event("identity_certificate_refused", logging.WARNING, round=r.number,
                              device=device_id, why=why)
                    self._apply(r.device_lost(device_id, self._clock(), f"identity certificate: {why}"))
                    continue
            if isinstance(m, secagg_pb2.MaskedInput):
                self.metrics.update_bytes.inc(m.ByteSize())
            self._apply(r.handle(device_id, m, self._clock()))
        if r is not None and r.wants_close:
            self._round_event.set()

    # ================================================================== actions

    def _apply(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.delivery.send(a.device_id, a.message)
            elif isinstance(a, Broadcast):
                self.delivery.broadcast(a.device_ids, a.message)
            elif isinstance(a, LogEvent):
                log_event(a.event, **a.fields)
            elif isinstance(a, PhaseChanged):
                self._phase_changed(a.phase)
                self._round_event.set()
            elif isinstance(a, AggregateReady | RoundEnded):
                self._round_event.set()


__all__ = ["ClientSession", "Coordinator", "StreamEnd", "TopKAnswer"]
