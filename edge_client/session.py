"""The session driver: what the client does with each ServerMessage.

Transport-free: `SessionDriver.handle(server_message)` reacts to one message
and puts the ClientMessages to send on `outbox` (an asyncio.Queue the
transport drains in order). CPU work (training, secagg handlers, top-k)
runs in worker threads so heartbeats keep flowing. The driver only
dispatches; each job has its module:

    edge_client.round_run      one round's state and shared steps (encoding
                               with the metric limbs, replies, a device's
                               end, the round's end)
    edge_client.secure_update  the secure path: round secret, AdvertiseKeys,
                               stage replies through the secagg client states
    edge_client.plaintext      the INSECURE plaintext path (opt-in only)
    edge_client.trainer        training the selected devices as one batch
    edge_client.queries        DeviceRequests (top-k), answered on the device

One round on this client (docs/wire-notes.md has the stream picture):

1. RoundTask: checked with `wire.parse_round_task`; a running round is
   superseded; an unsupported model or an unwanted plaintext round makes the
   client withdraw its devices (AbortNotice for device 0). The selected
   devices that do not drop at advertise-keys train together (the new
   private state is written before anything is sent), then each device's
   update goes out by the secure path (or the plaintext one).
2. Each stage message is routed to its device (replays and stale rounds are
   discarded) and answered by the secure path.
3. Round metrics go out only inside each device's masked input (D35).
4. RoundCommitted / AbortNotice end the round (or a device's part of it).

A malformed server message (WireError) aborts that device's round: it sends
a ClientAbort (AbortNotice PROTOCOL_VIOLATION) and the process carries on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cryptography import x509
from google.protobuf import timestamp_pb2

import wire
from edge_client import plaintext, queries, secure_update
from edge_client.devices import Device
from edge_client.cohort_floor import CohortFloor
from edge_client.contributions import ContributionRule, Contributions
from edge_client.dp_floor import DpFloor
from edge_client.faults import FaultPlan
from edge_client.path_choice import coordinator_bound, plaintext_rows
from edge_client.recommend_policy import RecommendationPolicy
from edge_client.round_run import DeviceRound, RoundEvent, RoundIO, RoundRun
from edge_client.task import SYNTHETIC_MODEL, task_spec
from edge_client.trainer import Trainer, TrainingError, TrainOutput, UnreadablePrivateState
from fedmask_proto.v1 import common_pb2, session_pb2
from secagg import identity
from secagg.stages import Stage
from wire import secagg_codec
from wire.lanes import LaneQueue
from wire.possession import session_payload
from wire.round_binding import binding_refusal, training_key
from wire.protocol import PLAINTEXT_HYPERPARAMETER, PROTOCOL_VERSION, SERVER_FIELD_STAGE, coordinator_refusal

log = logging.getLogger("edge_client.session")

SUPPORTED_MODELS = Trainer.supported_models  # a user-device client's (a platform client: PlatformTrainer's)
DEFAULT_HEARTBEAT_S = 10.0

#: Threads computing the hosted devices' secure aggregation (RoundIO.compute_pool).
#: One: that work is Python under the GIL, so more threads add no throughput on
#: the 2-core machine, and every extra busy thread delays the event loop's turn
#: at the GIL, hence reading the stream (a top-k request waits behind the
#: round's messages). File I/O (round secrets) stays on the default executor,
#: so a slow fsync never holds the computation up. `fedmask bench admin`
#: measures the effect (D76).
SECAGG_THREADS = 1


def new_outbox() -> LaneQueue[session_pb2.ClientMessage]:
    """A stream's outbox: answers to device requests (top-k) overtake a round's
    bulk messages (a process's masked inputs), wire/lanes.py."""
    return LaneQueue(lambda m: m.WhichOneof("message") == "device_response")


class FatalSessionError(Exception):
    """The coordinator refuses this client for good (user-facing message)."""


class SessionDriver:
    def __init__(
        self,
        *,
        client_name: str,
        client_version: str,
        devices: Iterable[Device],
        trainer: Trainer,
        faults: FaultPlan | None = None,
        on_round_end: Callable[[RoundEvent], None] | None = None,
        secure_random: Callable[[int], bytes] = os.urandom,
        debug_inputs_dir: Path | None = None,
        allow_insecure_plaintext: bool = False,
        cohort_floor: CohortFloor | None = None,
        dp_floor: DpFloor | None = None,
        contribution_rule: ContributionRule | None = None,
        recommendations: RecommendationPolicy | None = None,
        device_ca: x509.Certificate | None = None,
        unprotected_plaintext_j_bound: float | None = None,
    ) -> None:
        #: UNPROTECTED updates (FedMMF hybrid rounds, D64): this client's own cap
        #: on J under which a device may send its update in plaintext; None: never.
        self.unprotected_plaintext_j_bound = unprotected_plaintext_j_bound
        self.cohort_floor = cohort_floor or CohortFloor()
        #: The least DP the devices train under (D85; --min-dp, --min-noise-multiplier).
        self.dp_floor = dp_floor or DpFloor()
        #: One contribution per (model, task), so many per window (D85; --max-rounds-per-hour).
        self.contribution_rule = contribution_rule or ContributionRule()
        #: What the devices disclose for a top-k request (D84; --no-serve-recommendations,
        #: --max-top-k, --recommend-seen-items).
        self.recommendations = recommendations or RecommendationPolicy()
        #: The device CA this client trusts for its peers' identity keys
        #: (D33); with one, rounds without signatures are refused.
        self.device_ca = device_ca
        self.client_name = client_name
        self.client_version = client_version
        self.devices: dict[int, Device] = {d.device_id: d for d in devices}
        self.trainer = trainer
        self.faults = faults or FaultPlan()
        self.on_round_end = on_round_end
        self.secure_random = secure_random
        # DEBUG ONLY (tests, benchmarks; loopback): each device's encoded input
        # per round is written here, so the aggregate can be checked exactly.
        self.debug_inputs_dir = debug_inputs_dir
        # INSECURE (benchmark baseline): answer plaintext rounds (no masks).
        self.allow_insecure_plaintext = allow_insecure_plaintext
        self.outbox: asyncio.Queue[session_pb2.ClientMessage] = new_outbox()
        self.accepted: set[int] = set()
        #: This stream's SessionChallenge nonce and the devices proven on it.
        self.nonce: bytes = b""
        self.proven: set[int] = set()
        self.last_rejections: list[session_pb2.DeviceRejection] = []
        self.heartbeat_interval = DEFAULT_HEARTBEAT_S
        self.retry_after: float | None = None
        self.run: RoundRun | None = None
        self.heartbeats_sent = 0
        self.rounds_seen = 0
        self._bg: set[asyncio.Task[Any]] = set()
        #: one thread answering device requests (top-k), apart from the round's work
        self._query_pool: ThreadPoolExecutor | None = None
        #: the devices' secure-aggregation computation (RoundIO.compute_pool)
        self._compute_pool = ThreadPoolExecutor(max_workers=SECAGG_THREADS, thread_name_prefix="fedmask-secagg")

    # ------------------------------------------------------------ outgoing
    def send(self, **oneof: Any) -> None:
        self.outbox.put_nowait(session_pb2.ClientMessage(**oneof))

    def hello_message(self) -> session_pb2.ClientMessage:
        return session_pb2.ClientMessage(
            hello=session_pb2.Hello(
                client_name=self.client_name,
                protocol_version=PROTOCOL_VERSION,
                available_device_ids=sorted(self.devices),
                supported_models=list(self.trainer.supported_models),
                client_version=self.client_version,
            )
        )

    def check_in_message(self, available: Iterable[int] | None = None) -> session_pb2.ClientMessage:
        """A CheckIn announcing `available` (default: every hosted device),
        with proofs for the devices not proven on this stream yet."""
        ids = sorted(self.devices if available is None else available)
        return session_pb2.ClientMessage(check_in=session_pb2.CheckIn(
            available_device_ids=ids, proofs=self._proofs([d for d in ids if d not in self.proven])))

    def _proofs(self, ids: Iterable[int]) -> list[session_pb2.DeviceProof]:
        """Each device's signature over this stream's nonce (none before the
        challenge); the devices count as proven on this stream from now."""
        if not self.nonce:
            return []
        out = []
        for d in ids:
            dev = self.devices.get(d)
            if dev is None or dev.identity_key is None:
                continue
            out.append(session_pb2.DeviceProof(
                device_id=d, signature=identity.sign(dev.identity_key, session_payload(self.nonce, d))))
            self.proven.add(d)
        return out

    def on_challenge(self, c: session_pb2.SessionChallenge) -> None:
        """The coordinator's SessionChallenge: every hosted device proves
        possession of its identity key over the stream's nonce."""
        self.nonce = bytes(c.nonce)
        self.proven = set()
        self.send(proof=session_pb2.DeviceProofs(proofs=self._proofs(sorted(self.devices))))

    def heartbeat_message(self) -> session_pb2.ClientMessage:
        self.heartbeats_sent += 1
        ts = timestamp_pb2.Timestamp()
        ts.GetCurrentTime()
        return session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=self.heartbeats_sent, sent_at=ts))

    def new_session(self) -> None:
        """A fresh stream: a new outbox (nothing stale is sent on it)."""
        self.outbox = new_outbox()
        self.retry_after = None
        self.nonce = b""
        self.proven = set()

    # ------------------------------------------------------------ welcome
    def on_welcome(self, w: session_pb2.Welcome) -> None:
        refusal = coordinator_refusal(w.protocol_version)
        if refusal is not None:
            raise FatalSessionError(refusal)
        if w.HasField("heartbeat_interval"):
            sec = w.heartbeat_interval.seconds + w.heartbeat_interval.nanos / 1e9
            if sec > 0:
                self.heartbeat_interval = sec
        self.on_admission(w.admission)
        log.info(
            "session open with coordinator %s: %d of %d devices admitted, heartbeat every %.1fs",
            w.coordinator_version or "?", len(self.accepted), len(self.devices), self.heartbeat_interval,
        )

    def on_admission(self, a: session_pb2.DeviceAdmission) -> None:
        self.accepted = {d for d in a.accepted_device_ids if d in self.devices}
        self.last_rejections = list(a.rejected)
        for r in a.rejected:
            dev = self.devices.get(r.device_id)
            name = dev.local_id if dev else str(r.device_id)
            log.warning(
                "coordinator rejects device %s (id %d): %s",
                name, r.device_id, session_pb2.DeviceRejectionReason.Name(r.reason).removeprefix("DEVICE_REJECTION_REASON_").lower()
                if r.reason in session_pb2.DeviceRejectionReason.values() else r.reason,
            )

    # ------------------------------------------------------------ dispatch
    async def handle(self, msg: session_pb2.ServerMessage) -> None:
        kind = msg.WhichOneof("message")
        if kind is None:
            log.warning("empty ServerMessage ignored")
        elif kind == "challenge":
            self.on_challenge(msg.challenge)
        elif kind == "welcome":
            self.on_welcome(msg.welcome)
        elif kind == "check_in_ack":
            self.on_admission(msg.check_in_ack)
        elif kind == "heartbeat":
            pass
        elif kind == "shutdown":
            ra = msg.shutdown.retry_after
            self.retry_after = ra.seconds + ra.nanos / 1e9 if msg.shutdown.HasField("retry_after") else None
            log.warning("coordinator shutting down (%s); reconnecting later", msg.shutdown.reason or "no reason given")
        elif kind == "round_task":
            self._spawn(self._on_round_task(msg.round_task))
        elif kind in SERVER_FIELD_STAGE:
            self._route_stage(kind, getattr(msg, kind))
        elif kind == "abort":
            self._on_abort(msg.abort)
        elif kind == "round_committed":
            self._on_committed(msg.round_committed)
        elif kind == "device_request":
            self._spawn(self._on_device_request(msg.device_request))
        else:  # a newer coordinator's message kind
            log.debug("ignoring unknown server message %s", kind)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task[Any]) -> None:
        self._bg.discard(t)
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            log.error("internal error in the session driver: %r", exc, exc_info=exc)

    async def idle(self) -> None:
        """Wait until every background task has finished (tests)."""
        while self._bg:
            await asyncio.gather(*list(self._bg), return_exceptions=True)

    # ------------------------------------------------------------ rounds
    def _round_io(self) -> RoundIO:
        return RoundIO(
            send=self.send, spawn=self._spawn, faults=self.faults, secure_random=self.secure_random,
            secure_numpy_rng=self.trainer.secure_numpy_rng, debug_inputs_dir=self.debug_inputs_dir,
            device_ca=self.device_ca, compute_pool=self._compute_pool, contribution_rule=self.contribution_rule,
        )

    async def _on_round_task(self, task: session_pb2.RoundTask) -> None:
        self.rounds_seen += 1
        try:
            view = wire.parse_round_task(task, hosted=self.devices)
        except wire.WireError as e:
            log.error("malformed RoundTask for round %d ignored: %s", task.round_number, e)
            if task.session_id:
                self._send_abort(task.session_id, task.round_number, 0,
                                 common_pb2.ABORT_REASON_PROTOCOL_VIOLATION, f"malformed round task: {e}")
            return
        if self.run is not None and not self.run.over:
            self._end_round(self.run, "superseded", "a new RoundTask arrived")
        run = RoundRun(view=view, io=self._round_io())
        for device_id, secagg_id in view.devices.items():
            dr = DeviceRound(device=self.devices[device_id], secagg_id=secagg_id)
            dr.drop_at = self.faults.drop_stage_of(device_id, view.round_number)
            run.devices[device_id] = dr
        self.run = run
        log.info(
            "round %d: %d device(s) selected, model %s v%d, secagg %s",
            view.round_number, len(run.devices), view.model_name, view.model_version, view.config.describe(),
        )
        if view.model_name not in self.trainer.supported_models:
            self._abort_run(run, common_pb2.ABORT_REASON_MODEL_MISMATCH, f"model {view.model_name!r} not supported")
            return
        # hashing the model runs off the event loop
        unbound, run.training_key = await asyncio.to_thread(lambda: (binding_refusal(task), training_key(task)))
        if run.over:  # superseded meanwhile
            return
        if unbound is not None:  # a task the other devices of the round may not have got (D85)
            log.error("round %d: %s; this client's devices withdraw", view.round_number, unbound)
            self._abort_run(run, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION, unbound)
            return
        refusal = (self.cohort_floor.refusal(view.config)
                   or self.dp_floor.refusal(view.dp, view.config.num_clients, view.mechanism))
        if refusal is None and self.device_ca is not None and not view.config.active_adversary:
            # without signatures no identity key is checked, so the device CA would protect nothing
            refusal = "the round has no identity signatures, and this client requires them (--device-ca)"
        if refusal is not None:
            log.error("round %d: %s; this client's devices withdraw", view.round_number, refusal)
            self._abort_run(run, common_pb2.ABORT_REASON_CLIENT_ERROR, refusal)
            return
        if view.dp.mode != session_pb2.DP_MODE_NONE and view.mechanism is None:  # the float Gaussian (D88)
            log.warning("round %d: DP with float Gaussian noise: its epsilon is approximate", view.round_number)
        insecure = bool(view.hyperparameters.get(PLAINTEXT_HYPERPARAMETER, False))
        if insecure and not self.allow_insecure_plaintext:
            log.error("round %d: the coordinator asks for an INSECURE plaintext round; refused "
                      "(only --debug-allow-insecure-plaintext accepts it)", view.round_number)
            self._abort_run(run, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
                            "refusing an insecure plaintext round")
            return
        if insecure and view.metrics.coordinates:
            log.error("round %d: a plaintext round asks for per-device metrics, which would travel in the "
                      "clear; refused", view.round_number)
            self._abort_run(run, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
                            "refusing metrics in a plaintext round")
            return
        active = []
        for dr in run.devices.values():
            if dr.drop_at == Stage.ADVERTISE_KEYS:
                run.go_silent(dr, Stage.ADVERTISE_KEYS)
            elif not insecure and not self._may_contribute(run, dr):
                continue
            else:
                active.append(dr)
        if not active:
            return
        out = await self._train(run, active)
        if out is None or run.over:
            return
        run.train = out
        plain = [insecure] * len(active)
        bound = coordinator_bound(view.hyperparameters)
        if not insecure and bound is not None:  # a hybrid round: each device chooses its path (D64)
            plain = plaintext_rows(out.privacy_indicator, len(active), coordinator=bound,
                                   own=self.unprotected_plaintext_j_bound)
            if any(plain):
                log.warning("round %d: %d of %d device(s) send UNPROTECTED plaintext updates (J <= %g)",
                            view.round_number, sum(plain), len(active),
                            min(bound, self.unprotected_plaintext_j_bound or 0.0))
        await asyncio.gather(*(
            (plaintext.upload if plain[i] else secure_update.advertise)(run, dr, i, out.updates[i])
            for i, dr in enumerate(active)
        ))

    def _may_contribute(self, run: RoundRun, dr: DeviceRound) -> bool:
        """False (and the device withdraws alone) when its contribution record
        refuses the round's training key (D85); it is checked again, and
        recorded, before the device answers unmasking."""
        rule = self.contribution_rule
        if rule is None:
            return True
        why = Contributions(dr.device.store.folder, rule).refusal(run.training_key, time.time())
        if why is None:
            return True
        log.error("round %d, %s: %s; the device withdraws", run.view.round_number, dr.device.local_id, why)
        self._send_abort(run.view.session_id, run.view.round_number, dr.device.device_id,
                         common_pb2.ABORT_REASON_CLIENT_ERROR, why)
        run.finish_device(dr)
        return False

    async def _train(self, run: RoundRun, active: list[DeviceRound]) -> TrainOutput | None:
        """The batch's updates (row i = active[i]); None when the client
        withdrew its devices because it cannot train the round. A device
        whose private state is unreadable stands down alone (the file is
        named in the log): it leaves `active`, and the rest train."""
        view = run.view
        spec = task_spec(view)
        try:
            if view.model_name == SYNTHETIC_MODEL:
                return await asyncio.to_thread(  # off the event loop, as training is
                    self.trainer.synthetic_updates, spec, [dr.device.device_id for dr in active],
                    clip=view.config.encoding.clip)
            try:
                out = await asyncio.to_thread(self.trainer.train, spec, [dr.device.number for dr in active])
            except UnreadablePrivateState as e:
                for dr in [d for d in active if d.device.number in e.unreadable]:
                    log.error("round %d, %s: %s; this device withdraws", view.round_number, dr.device.local_id,
                              e.unreadable[dr.device.number])
                    self._send_abort(view.session_id, view.round_number, dr.device.device_id,
                                     common_pb2.ABORT_REASON_CLIENT_ERROR, "unreadable private state")
                    run.finish_device(dr)
                active[:] = [d for d in active if d.device.number not in e.unreadable]
                if not active:
                    return None
                out = await asyncio.to_thread(self.trainer.train, spec, [dr.device.number for dr in active])
        except TrainingError as e:
            log.error("round %d: cannot train: %s", view.round_number, e)
            self._abort_run(run, e.reason.value, str(e))
            return None
        except Exception as e:  # a bug or resource problem: the process stays up
            log.exception("round %d: training failed", view.round_number)
            self._abort_run(run, common_pb2.ABORT_REASON_CLIENT_ERROR, f"training failed: {type(e).__name__}")
            return None
        log.info("round %d: trained %d device(s) in %.2fs", view.round_number, len(active), out.seconds)
        return out

    def _route_stage(self, field_name: str, p: Any) -> None:
        run = self.run
        if run is None or not run.is_for(p.session_id, p.round_number):
            log.debug("discarding %s for another or finished round (%d)", field_name, p.round_number)
            return
        dr = run.devices.get(p.device_id)
        if dr is None:
            log.debug("discarding %s for device %d, not in this round here", field_name, p.device_id)
            return
        self._spawn(secure_update.answer_stage(run, dr, field_name, p))

    # ------------------------------------------------------------ ends of rounds
    def _send_abort(self, session_id: bytes, round_number: int, device_id: int, reason: secagg_codec.ProtoAbortReason, detail: str) -> None:
        self.send(abort=common_pb2.AbortNotice(
            session_id=session_id, round_number=round_number, device_id=device_id, reason=reason,
            detail=detail[: secagg_codec.MAX_DETAIL_CHARS],
        ))

    def _abort_run(self, run: RoundRun, reason: secagg_codec.ProtoAbortReason, detail: str) -> None:
        """This client withdraws all its devices from the round."""
        self._send_abort(run.view.session_id, run.view.round_number, 0, reason, detail)
        self._end_round(run, "failed", detail)

    def _on_abort(self, p: common_pb2.AbortNotice) -> None:
        run = self.run
        if run is None or not run.is_for(p.session_id, p.round_number):
            log.debug("discarding AbortNotice for another or finished round (%d)", p.round_number)
            return
        reason = common_pb2.AbortReason.Name(p.reason) if p.reason in common_pb2.AbortReason.values() else str(p.reason)
        reason = reason.removeprefix("ABORT_REASON_").lower()
        if p.device_id == 0:
            log.warning("round %d aborted by the coordinator: %s %s", p.round_number, reason, p.detail)
            self._end_round(run, "aborted", f"{reason}: {p.detail}")
            return
        dr = run.devices.get(p.device_id)
        if dr is not None and not dr.done:
            log.info("round %d, %s: excluded by the coordinator: %s", p.round_number, dr.device.local_id, reason)
            run.finish_device(dr)

    def _on_committed(self, p: session_pb2.RoundCommitted) -> None:
        run = self.run
        if run is None or not run.is_for(p.session_id, p.round_number):
            log.debug("RoundCommitted for round %d (not ours or already over)", p.round_number)
            return
        log.info(
            "round %d committed: model v%d from %d contributor(s), %d of ours sent a masked input",
            p.round_number, p.new_model_version, p.contributors,
            sum(1 for dr in run.devices.values() if dr.sent_masked),
        )
        self._end_round(run, "committed", f"model v{p.new_model_version}")

    def _end_round(self, run: RoundRun, outcome: str, detail: str = "") -> None:
        event = run.end(outcome, detail)
        if event is not None and self.on_round_end is not None:
            self.on_round_end(event)

    def on_disconnect(self) -> None:
        """The stream is gone: the running round is abandoned (wire-notes: no resume)."""
        if self.run is not None and not self.run.over:
            log.warning("round %d abandoned: the session ended", self.run.view.round_number)
            self._end_round(self.run, "disconnected", "stream lost")

    # ------------------------------------------------------------ device requests
    async def _on_device_request(self, req: session_pb2.DeviceRequest) -> None:
        outbox = self.outbox  # answer on the stream that asked, never on a later one
        if self._query_pool is None:
            self._query_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedmask-queries")
        # a worker of its own: the default executor's queue holds a round's per-device crypto
        # (tens of jobs), and a top-k behind it would wait for all of them
        resp = await asyncio.get_running_loop().run_in_executor(
            self._query_pool, functools.partial(queries.answer, req, dict(self.devices), self.trainer,
                                                policy=self.recommendations))
        outbox.put_nowait(session_pb2.ClientMessage(device_response=resp))

