"""The coordinator's asyncio runtime: the round loop that wires together the
device registry (`registry.py`), the round policy (`round_policy.py`), the
pure round machine (`rounds.py`, or one per group, `grouped_rounds.py`, as
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
import functools
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import datetime

import numpy as np

from coordinator.current_model import CurrentModel
from coordinator.device_census import DeviceCensus
from coordinator.device_relay import DeviceRelay
from coordinator.errors import ProtocolViolation, Unavailable
from coordinator.events import EventHub
from coordinator.live_state import RoundTimeline, device_counts, live_round, live_state, privacy_budget, stage_changed
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import ServerModel
from coordinator.operator_actions import OperatorActions
from coordinator.peer_reports import ReportPolicy, credential
from coordinator.report_ledger import ReportLedger
from coordinator.grouped_rounds import AnyRound, Grouped
from coordinator.interrupted_charge import InterruptedCharge
from coordinator.registry import ClientSession, DeviceRegistry, StreamEnd, now_timestamp
from coordinator.recovery import recover
from coordinator.relay import TopKAnswer
from coordinator.round_groups import round_groups
from coordinator.round_machines import build_round, plan_groups
from coordinator.round_policy import AdaptiveDeadlines, dp_mechanism_for, round_plan
from coordinator.round_delivery import RoundDelivery
from coordinator.round_outcomes import RoundOutcomes
from coordinator.round_report import PrivacyLedger, round_metrics, round_record
from coordinator.round_tasks import TaskFields
from coordinator.rounds import Action, AggregateReady, Broadcast, LogEvent, PhaseChanged, RoundEnded, Send
from coordinator.selection import eligible_devices, select_cohort
from coordinator.session_reaper import reap_silent_sessions
from coordinator.spent_devices import SpentDevices
from coordinator.unmasking_guard import opens_unmasking, save_then_ask
from coordinator.version_skip import VersionSkip
from coordinator.settings import CoordinatorSettings
from coordinator.store import RoundRecord, RoundState, Store, utc_now
from fedmask_proto.v1 import admin_service_pb2, common_pb2, enrollment_pb2, secagg_pb2, session_pb2
from secagg.errors import SecAggConfigError
from wire.possession import SESSION_NONCE_BYTES
from wire.protocol import CLIENT_MESSAGE_STAGE
from wire.round_task import seconds_to_duration
from wire.secagg_codec import expand_abort


class Coordinator:
    """See the module doc; implements operator_actions.FederationControl."""

    def __init__(self, settings: CoordinatorSettings, *, store: Store, model: ServerModel,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], datetime] = utc_now,
                 rng: random.Random | None = None, token_source: Callable[[int], bytes] = os.urandom,
                 metrics: CoordinatorMetrics | None = None) -> None:
        self.settings = settings
        self.store = store
        self.model = model
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng if rng is not None else random.Random(settings.seed)
        self._token = token_source
        self._changed = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._round_event = asyncio.Event()
        self.registry = DeviceRegistry(
            store, heartbeat_interval=settings.heartbeat_interval, clock=clock, wall_clock=wall_clock,
            on_device_left=self._device_left_round, on_changed=self._registry_changed,
            lookup_interval_s=settings.limits.device_lookup_interval_s,
            max_lookups=settings.limits.max_device_lookups,
        )
        self.deadlines = AdaptiveDeadlines(settings.deadlines, plaintext=settings.debug.insecure_plaintext)
        self.ledger = PrivacyLedger(settings.dp, store)
        self.round: AnyRound | None = None
        self._round_started_at: datetime | None = None
        self._previous_contributors: frozenset[int] = frozenset()
        self.spent = SpentDevices(store)  # devices that answered unmasking on this version (D85)
        s = settings.secagg
        self.peer_reports = ReportLedger(store, ReportPolicy(
            reporters=s.report_reporters, rounds=s.report_rounds, window=s.report_window, window_s=s.report_window_s,
            quarantine_rounds=s.report_quarantine_rounds, quarantine_s=s.report_quarantine_s, quota=s.report_quota,
        ), wall_clock=wall_clock, credential_of=self._credential)
        self._last_round_number = 0
        self.current = CurrentModel(store, model)
        self.skip = VersionSkip(store, self.current, model, grace_s=settings.deadlines.selection, clock=clock)
        self._started = False
        self._stopping = False
        self.rounds_run = 0
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
        self._held = asyncio.Event()  # set when paused / budget_exhausted may have changed
        self._timeline = RoundTimeline()
        self.outcomes = RoundOutcomes(store=store, ledger=self.ledger, events=self.events, metrics=self.metrics,
                                      wall_clock=wall_clock, on_hold=self._held.set)
        self.census = DeviceCensus(self.registry, metrics=self.metrics, events=self.events)
        self._counter: asyncio.Task[None] | None = None
        #: bound ports by listener ("device", "admin", "metrics"), set by server.serve
        self.ports: dict[str, int] = {}
        self._round_base: int | None = None  # the model version the running round started from
        self._rollbacks = 0  # rollbacks in progress: the loop opens no round meanwhile
        self.delivery = RoundDelivery(self.registry, device_ca=settings.secagg.device_ca, wall_clock=wall_clock)

    # ================================================================== lifecycle

    async def start(self) -> None:
        """Crash recovery (coordinator/recovery.py), then resume from the latest
        model version (or initialize and commit the first one on an empty database)."""
        charge = InterruptedCharge(self.ledger, lambda n, shares: dp_mechanism_for(self.settings, n,
                                                                                    self.model.update_dim, shares))
        self.paused = await recover(self.store, charge)  # unfinished rounds aborted (and charged, D94); a pause holds
        self.ledger.reload()
        await self.current.load(self.settings.seed or 0)
        await self.registry.load()
        await self.outcomes.load_budget(paused=self.paused, model_version=self.model_version)
        self._started = True
        self._reaper = asyncio.create_task(reap_silent_sessions(
            self.registry, interval=self.settings.heartbeat_interval, stopping=lambda: self._stopping,
            close_session=self.close_session), name="fedmask-session-reaper")
        self._counter = asyncio.create_task(self.census.run(), name="fedmask-device-counts")
        self.census.changed()

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

    # ================================================================== the round loop

    def _credential(self, device_id: int) -> str:
        rec = self.registry.devices.get(device_id)
        return credential(device_id, None if rec is None else rec.client_id)

    def eligible(self) -> list[int]:
        """Devices selectable now; quarantine (D37) never leaves fewer than the cohort minimum."""
        c = self.settings.cohort
        free = eligible_devices(self.registry.available(self.model.name),
                                busy=set(() if self.round is None else self.round.cohort) | self.spent.devices,
                                previous_contributors=self._previous_contributors,
                                allow_consecutive=c.allow_consecutive)
        out = self.peer_reports.excluded(free, max(c.minimum, 2))
        return [d for d in free if d not in out]

    async def _wait(self, event: asyncio.Event, timeout: float) -> None:
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    async def run(self) -> None:
        """Run rounds until `settings.rounds` are done or shutdown()."""
        if not self._started:
            await self.start()
        limit = self.settings.rounds
        while not self._stopping and (limit is None or self.rounds_run < limit):
            await self._hold()
            if self._stopping:
                break
            try:
                cohort = await self._select()
                if self._stopping:
                    break
                if self.paused or self._rollbacks:  # paused / rolled back during selection: open nothing
                    continue
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

    async def _hold(self) -> None:
        """Wait while an operator paused the federation or the budget is exhausted."""
        while not self._stopping and (self.paused or self.budget_exhausted or self._rollbacks):
            await self._wait(self._held, 1.0)

    async def _select(self) -> list[int] | None:
        c = self.settings.cohort
        minimum = max(c.minimum, 2)
        target = max(c.selected, minimum)
        await self._refresh_exclusions()
        while not self._stopping and len(eligible := self.eligible()) < minimum:
            available = self.registry.available(self.model.name)
            if not await self.skip.step(self.spent, available, eligible=len(eligible), minimum=minimum):  # D94
                self.spent.waiting(available, eligible=len(eligible), minimum=minimum)
                await self._wait(self._changed, 1.0)
            await self._refresh_exclusions()
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
            await self.outcomes.record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES,
                                                  "devices left during selection", base_version=self.model_version)
        return cohort

    async def _refresh_exclusions(self) -> None:  # both read the store (several replicas share it)
        await self.peer_reports.refresh(self._last_round_number + 1)
        await self.spent.refresh(self.model_version)

    def _record(self, r: AnyRound, state: RoundState, *, ended: bool = False,
                metrics: Mapping[str, float] | None = None, timings: Mapping[str, float] | None = None) -> RoundRecord:
        return round_record(r, state, started_at=self._round_started_at or self._wall(),
                            ended_at=self._wall() if ended else None, base_model_version=self._round_base,
                            metrics=metrics, timings=timings)

    async def _run_round(self, cohort: list[int]) -> None:
        session_id = self._token(16)
        plaintext = self.settings.debug.insecure_plaintext
        try:  # the secagg config, the metric layout and the discrete Gaussian (D88) of this cohort, per group (D99)
            config, metrics, mechanism = round_plan(self.settings, len(cohort), self.model.update_dim, session_id,
                                                    self.model.metric_names, plaintext=plaintext)
            groups = round_groups(self.settings.secagg.group_size, cohort, session_id, self.registry.owner)
            plans = plan_groups(self.settings, config, groups, mechanism)
        except (SecAggConfigError, ValueError) as exc:
            number = await asyncio.to_thread(self.store.next_round_number)
            await self.outcomes.record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES, str(exc),
                                                  base_version=self.model_version, cohort_size=len(cohort))
            return
        budget = self.ledger.budget
        if budget is not None:  # priced at the fewest devices a committed group can count
            worst = max([await asyncio.to_thread(self.ledger.epsilon_after, cohort=len(p.members),
                                                 counted=p.config.threshold, mechanism=p.mechanism) for p in plans])
            if worst > budget:
                await self.outcomes.exhaust_budget(worst, paused=self.paused, model_version=self.model_version,
                                                   cohort_size=len(cohort))
                return
        number = await asyncio.to_thread(self.store.next_round_number)
        fields = TaskFields.for_round(self.settings, self.model, self.current, self.model_version or 0, len(cohort), metrics,
                                      mechanism)
        identity = None
        self.delivery.new_round()
        if config.active_adversary:
            identity = {d: self.registry.devices[d].identity_public_key for d in cohort}
        windows = self.deadlines.windows(active=config.active_adversary, cohort=len(cohort))
        r, task_fields = await asyncio.to_thread(lambda: build_round(
            self.settings, number=number, nonce=session_id, plans=plans, minimum=config.threshold,
            deadlines=windows.machine, identity=identity, metrics=metrics, fields=fields))
        self.round = r
        self._round_started_at = self._wall()
        self._round_base = self.model_version
        self._timeline = RoundTimeline()
        log_event("round_started", round=number, cohort=len(cohort), config=r.config.describe(),
                  model=self.model.name, version=self.model_version,
                  deadlines=",".join(f"{k}={v:.2f}" for k, v in windows.machine.items()))
        try:
            await asyncio.to_thread(self.store.save_round_progress, self._record(r, r.phase))
            self._send_tasks(r, windows.task, task_fields)
            self._apply(r.start(self._clock()))
            saved_phase = r.phase
            while r.phase.is_collecting:
                timeout = r.deadline - self._clock()
                if not (r.wants_close or timeout <= 0):
                    await self._wait(self._round_event, timeout)
                    continue
                actions = r.tick(self._clock())
                if opens_unmasking(actions) and r.phase is RoundState.UNMASKING:  # who is asked to unmask is saved before anyone is asked (D94)
                    await save_then_ask(self.store, self._record(r, r.phase), actions, self._apply)
                    saved_phase = r.phase
                else:
                    self._apply(actions)
                if r.phase.is_collecting and r.phase is not saved_phase:
                    saved_phase = r.phase
                    await asyncio.to_thread(self.store.save_round_progress, self._record(r, r.phase))
            self.deadlines.observe(r.completion)
            if r.phase is RoundState.AGGREGATING:
                await self._commit(r)
            if r.phase is RoundState.ABORTED:
                await self.outcomes.save_abort(r, self._record(r, RoundState.ABORTED, ended=True))
                self.outcomes.round_over(r, started_at=self._round_started_at or self._wall())
        except Exception:
            if not r.phase.is_terminal:  # tell the cohort; try to leave a record
                self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, "internal coordinator error", self._clock()))
                with contextlib.suppress(Exception):
                    await self.outcomes.save_abort(r, self._record(r, RoundState.ABORTED, ended=True))
                self.outcomes.round_over(r, started_at=self._round_started_at or self._wall())
            raise
        finally:
            self._last_round_number = max(self._last_round_number, number)
            reports = r.share_reports()
            if reports:
                await self.peer_reports.record(number, reports, survivors=r.share_check_survivors())
            self.round = None
            self.metrics.live_round(survivors=0, threshold=0, cohort=0)
            self._changed.set()

    def _phase_changed(self, phase: RoundState) -> None:
        """The running round entered `phase`: its timeline, the stage event
        (collecting stages and aggregating; the end has its own events) and
        the live gauges."""
        r = self.round
        if r is None or r.phase is not phase:
            return
        closed = self._timeline.open(phase.value, at=self._wall(), deadline_in=r.deadline - self._clock())
        self.metrics.live_round(survivors=len(r.live_devices()), threshold=r.config.threshold, cohort=len(r.cohort))
        if not phase.is_terminal:
            self.events.publish(stage_changed=stage_changed(r, self._timeline, closed))

    def _send_tasks(self, r: AnyRound, deadlines: dict[str, float], fields: tuple[TaskFields, ...]) -> None:
        """Each group's tasks (a round of one instance: one group) to the streams hosting its devices."""
        for m, f in zip(r.machines if isinstance(r, Grouped) else (r,), fields, strict=True):
            self.delivery.send_tasks(m.cohort, functools.partial(f.task, m, deadlines=deadlines),
                                     gone=lambda d: self._apply(r.device_lost(d, self._clock(), "gone before the round task")))

    async def _commit(self, r: AnyRound) -> None:
        result = r.result
        assert result is not None
        t0 = self._clock()
        current = self.current
        async with current.lock:  # a rollback waits for the commit, or the commit sees it
            if self.model_version != self._round_base:
                log_event("commit_failed", logging.WARNING, round=r.number, error="the model was rolled back")
                self._apply(r.commit_failed("the model was rolled back during the round", self._clock()))
                return
            try:
                new_params, version = await current.stepped(result.decoded_mean)
                try:
                    metrics = round_metrics(r, model_name=self.model.name, debug=self.settings.debug)
                except Exception as exc:  # a report must never fail a commit: commit without metrics
                    log_event("metrics_dropped", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
                    metrics = {}
                privacy = await asyncio.to_thread(self.ledger.entry_for, r)
                timings = {**r.timings, RoundState.AGGREGATING.value: self._clock() - t0}
                record = self._record(r, RoundState.COMMITTED, ended=True, metrics=metrics, timings=timings)
                summary = await asyncio.to_thread(self.store.commit_round, record, version, privacy)
                current.adopt(summary.id, new_params, current.step + 1)
            except Exception as exc:  # the model step or the store failed: the round is lost, not the service
                log_event("commit_failed", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
                self._apply(r.commit_failed(f"{type(exc).__name__}", self._clock()))
                return
        self.outcomes.spent(privacy)
        self._previous_contributors = frozenset(result.counted)
        self._apply(r.committed(summary.id, self._clock()))
        self.outcomes.round_over(r, started_at=self._round_started_at or self._wall(), new_version=summary.id)


__all__ = ["ClientSession", "Coordinator", "StreamEnd", "TopKAnswer"]
