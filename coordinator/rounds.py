"""The round state machine: pure (events in, actions out), no I/O, no clock.

One `RoundMachine` runs one secure-aggregation round over a fixed cohort.
It drives the `secagg` server states and speaks proto on its edges (through
`wire`), so the asyncio runner only routes messages and persists results.

Phases (`PHASES`: the store's `RoundState`s the machine passes through) and
what moves them:

    ADVERTISE_KEYS --close--> SHARE_KEYS --close--> SHARE_CHECK --close-->
      MASKED_INPUT --close--> [CONSISTENCY_CHECK --close-->] UNMASKING
      --close--> AGGREGATING
      --committed()--> COMMITTED
    any close with too few devices, cancel(), commit_failed() --> ABORTED

ADVERTISE_KEYS starts when the RoundTasks go out (its window includes local
training). A stage closes on `tick(now)` when every device it waits for has
answered or answered-for (dropped), or when its deadline passed; devices
still pending at a deadline are dropped (DEADLINE_MISSED notice).

Events (methods): `handle(device_id, message, now)` one proto stage message
from an authenticated device; `device_lost(device_id, now, reason)` its
session ended or it left the available set; `tick(now)`; `cancel(reason,
detail, now)`; `committed(version, now)`; `commit_failed(detail, now)`.

Round metrics (D35) arrive only inside the masked inputs: the last
`metrics.coordinates` coordinates of every device's vector are its metric
limbs (`wire.round_metrics`), so the unmasked sum carries their totals over
exactly the counted devices (U3). `aggregate_result` splits the sum: the
model part is decoded with the round's fixed-point encoding, or with the
discrete Gaussian (`mechanism`, D88: the residues' sum mod 2^w, rotated back
and unscaled), the metric part is kept as encoded
(`AggregateResult.metric_sums`) for `round_report.round_metrics` to decode
and check. No client message carries metrics.

Actions (returned lists): `Send(device_id, ServerMessage)` to the session
hosting the device; `Broadcast(device_ids, ServerMessage)` once to every
session hosting any of them; `PhaseChanged(phase)`; `AggregateReady(result)`;
`RoundEnded(committed, reason, detail)`; `LogEvent(event, fields)`.

Bad input never raises: a message for another round is discarded (replay
rule); one from an earlier stage of this round is discarded as a replay; a
malformed one (WireError) or one from a later stage drops the device for
this round (PROTOCOL_VIOLATION notice) and the round goes on; secagg's own
checks drop a device the same way (it records the DropReason).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.aggregate import AggregateResult, aggregate_result
from coordinator.store import RoundState
from coordinator.surplus_removal import SurplusRemoval
from dpmech.mechanism import MechanismConfig
from fedmask_proto.v1 import common_pb2, session_pb2
from secagg import messages as sm
from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason
from secagg.server import ServerAborted, ServerAdvertiseKeys, ServerCompleted, ServerState
from secagg.stages import Stage
from wire import RoundIds, WireError
from wire import secagg_codec as codec
from wire.protocol import CLIENT_MESSAGE_STAGE
from wire.round_metrics import EMPTY_LAYOUT, MetricLayout
from wire.secagg_codec import abort_reason_to_proto, drop_notice_reason, reason_name

P = common_pb2


#: The phases a round machine passes through (its `phase`), in order: the
#: store's round states from ADVERTISE_KEYS on, so a phase is recorded as it
#: is (SELECTING and TRAINING are never a machine's).
PHASES: tuple[RoundState, ...] = tuple(s for s in RoundState if s not in (RoundState.SELECTING, RoundState.TRAINING))


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Send:
    device_id: int
    message: session_pb2.ServerMessage


@dataclass(frozen=True, slots=True)
class Broadcast:
    device_ids: tuple[int, ...]
    message: session_pb2.ServerMessage


@dataclass(frozen=True, slots=True)
class PhaseChanged:
    phase: RoundState


@dataclass(frozen=True, slots=True)
class AggregateReady:
    result: AggregateResult


@dataclass(frozen=True, slots=True)
class RoundEnded:
    committed: bool
    reason: int = 0  # proto AbortReason when aborted
    detail: str = ""


@dataclass(frozen=True, slots=True)
class LogEvent:
    event: str
    fields: Mapping[str, Any]


Action = Send | Broadcast | PhaseChanged | AggregateReady | RoundEnded | LogEvent


def _server_message(**kw: Any) -> session_pb2.ServerMessage:
    return session_pb2.ServerMessage(**kw)


# --------------------------------------------------------------------------- the machine


@dataclass
class RoundMachine:
    """See the module doc. Build it, send the RoundTasks, then call `start`."""

    number: int
    config: SecAggConfig
    cohort: Sequence[int]  # device ids; index = secagg id
    deadlines: Mapping[str, float]  # phase value -> seconds (collecting phases)
    identity_keys: Mapping[int, bytes] | None = None  # device id -> Ed25519 raw (active mode)
    metrics: MetricLayout = EMPTY_LAYOUT  # the metric coordinates at the end of every input
    #: The discrete Gaussian the devices encode with (D88); None: the fixed-point encoding.
    mechanism: MechanismConfig | None = None
    #: The discrete Gaussian's rotation key when this is one group of a round in groups (D99).
    rotation_key: bytes = b""

    phase: RoundState = field(init=False, default=RoundState.ADVERTISE_KEYS)
    deadline: float = field(init=False, default=math.inf)
    ids: RoundIds = field(init=False)
    timings: dict[str, float] = field(init=False, default_factory=dict)
    #: phase -> {device id: reason} for every device that left the round there.
    dropouts: dict[str, dict[int, str]] = field(init=False, default_factory=dict)
    result: AggregateResult | None = field(init=False, default=None)
    #: Removable noise (D110): the surplus still to remove once the sum is
    #: complete; the round's `result` follows `surplus_removed`.
    surplus: SurplusRemoval | None = field(init=False, default=None)
    removal_s: float = field(init=False, default=0.0)  # seconds the surplus removal took (part of aggregating)
    abort_reason: int | None = field(init=False, default=None)
    abort_detail: str = field(init=False, default="")
    new_model_version: int | None = field(init=False, default=None)
    #: phase value -> seconds from the stage opening to the last answer it
    #: accepted (the honest completion time the deadline policy learns from).
    completion: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.cohort = tuple(self.cohort)
        self.ids = RoundIds.from_cohort(self.cohort, components=self.config.removable_components)
        if self.config.removable_noise and self.mechanism is None:
            raise ValueError("removable noise needs the discrete Gaussian's mechanism")
        if len(self.cohort) != self.config.num_clients:
            raise ValueError(f"cohort of {len(self.cohort)} for a config of n={self.config.num_clients}")
        keys = None
        if self.config.active_adversary:
            if self.identity_keys is None:
                raise ValueError("active-adversary mode needs the cohort's identity keys")
            keys = {self.ids.secagg(d): self.identity_keys[d] for d in self.cohort}
        self._secagg_identity = keys
        self._server: ServerState = ServerAdvertiseKeys(self.config, self.number, identity_keys=keys)
        self._stage_started = 0.0
        self._out: set[int] = set()  # devices no longer in the round (dropped / notified)
        self._wire_kwargs = {
            "vector_length": self.config.vector_length,
            "modulus_bits": self.config.encoding.modulus_bits,
        }

    # ------------------------------------------------------------------ properties

    @property
    def session_id(self) -> bytes:
        return self.config.session_id

    @property
    def wants_close(self) -> bool:
        """The current stage has nothing left to wait for."""
        return self.phase.is_collecting and not self._server.pending

    @property
    def pending_count(self) -> int:
        """Devices the open stage still waits for (0 outside the stages)."""
        return len(self._server.pending) if self.phase.is_collecting else 0

    def has_device(self, device_id: int) -> bool:
        """Whether the device is in this round's cohort."""
        return self.ids.has_device(device_id)

    def live_devices(self) -> list[int]:
        return [d for d in self.cohort if d not in self._out]

    def survivors(self) -> dict[str, list[int]]:
        """phase value -> device ids that completed that stage."""
        out = {}
        for stage, sids in self._server.record.survivors.items():
            out[Stage(stage).value] = sorted(self.ids.device(s) for s in sids)
        return out

    def share_reports(self) -> dict[int, list[int]]:
        """Share-check reports: reporter device id -> the device ids whose
        relayed shares it could not open (empty before the share check)."""
        return {
            self.ids.device(v): sorted(self.ids.device(u) for u in bad)
            for v, bad in sorted(self._server.record.undecryptable.items())
        }

    def share_check_survivors(self) -> frozenset[int]:
        """Device ids the share check kept (empty before it closed)."""
        return frozenset(self.ids.device(v) for v in self._server.record.u2)

    def dropout_ids(self) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in self.dropouts.items() if v}

    # ------------------------------------------------------------------ events

    def start(self, now: float) -> list[Action]:
        """The RoundTasks went out: open stage 0."""
        self._stage_started = now
        self.deadline = now + self.deadlines[self.phase.value]
        return [PhaseChanged(self.phase), self._log("stage_opened", stage=self.phase.value, devices=len(self.cohort))]

    def _screen(self, device_id: int, message: Any, now: float) -> list[Action] | None:
        """The checks every round-scoped message passes first (also in the
        plaintext machine): the actions that end its handling (discarded,
        or its sender dropped), or None to go on."""
        kind = type(message).__name__
        if message.session_id != self.session_id or message.round_number != self.number:
            return [self._log("message_discarded", device=device_id, kind=kind, why="another round or session")]
        if not self.phase.is_collecting:
            return [self._log("message_discarded", device=device_id, kind=kind, why=f"round is {self.phase.value}")]
        if message.device_id != device_id:
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, "device_id does not match the sender", now)
        if not self.ids.has_device(device_id):
            return [self._log("message_discarded", device=device_id, kind=kind, why="not in this round's cohort")]
        if device_id in self._out:
            return [self._log("message_discarded", device=device_id, kind=kind, why="device already left the round")]
        return None

    def handle(self, device_id: int, message: Any, now: float) -> list[Action]:
        """One stage message (unwrapped proto) from the authenticated
        `device_id` (the runner checked that the session hosts it)."""
        screened = self._screen(device_id, message, now)
        if screened is not None:
            return screened
        kind = type(message).__name__
        stage = CLIENT_MESSAGE_STAGE.get(type(message))
        current = Stage(self.phase.value).order
        if stage is not None and stage.order < current:
            return [self._log("message_discarded", device=device_id, kind=kind, why="replay of an earlier stage")]
        if stage is not None and stage.order > current:
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, f"{kind} during {self.phase.value}", now)
        try:
            msg = codec.client_from_proto(message, self.ids, **self._wire_kwargs)
        except WireError as exc:
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, str(exc), now)
        sid = self.ids.secagg(device_id)
        before = len(self._server.record.rejections)
        self._server, _ = self._server.handle(sid, msg)
        record = self._server.record
        if sid in record.dropped and device_id not in self._out:
            _, why = record.dropped[sid]
            if why is DropReason.CLIENT_ABORTED:
                self._mark_out(device_id, f"client_abort:{reason_name(message.reason)}" if isinstance(message, P.AbortNotice) else "client_abort")
                return [self._log("device_withdrew", device=device_id, stage=self.phase.value)]
            detail = record.rejections[-1].detail if len(record.rejections) > before else why.value
            notice = drop_notice_reason(why)
            assert notice is not None  # only CLIENT_ABORTED has none, handled above
            return self._notify_out(device_id, notice, f"{why.value}: {detail}")
        if len(record.rejections) > before:
            rej = record.rejections[-1]
            return [self._log("message_ignored", device=device_id, kind=kind, why=f"{rej.reason}: {rej.detail}")]
        self.completion[self.phase.value] = now - self._stage_started
        return []

    def device_lost(self, device_id: int, now: float, why: str = "disconnected") -> list[Action]:
        """The device's session ended (or it became unavailable): a dropout
        at the current stage. Its counted masked input, if any, stays counted."""
        if not self.phase.is_collecting or not self.ids.has_device(device_id) or device_id in self._out:
            return []
        sid = self.ids.secagg(device_id)
        self._server, _ = self._server.handle(
            sid, sm.ClientAbort(session_id=self.session_id, round_idx=self.number, device_id=sid, reason=AbortReason.CANCELLED)
        )
        self._mark_out(device_id, why)
        return [self._log("device_lost", device=device_id, stage=self.phase.value, why=why)]

    def tick(self, now: float) -> list[Action]:
        """Close the current stage if it is complete or its deadline passed
        (repeatedly: a stage may open with nobody left to wait for)."""
        actions: list[Action] = []
        while self.phase.is_collecting and (not self._server.pending or now >= self.deadline):
            actions += self._close(now)
        return actions

    def cancel(self, reason: codec.ProtoAbortReason, detail: str, now: float) -> list[Action]:
        """Abort the round (e.g. COORDINATOR_SHUTDOWN): every device still in
        it gets an AbortNotice with `reason`."""
        if self.phase.is_terminal:
            return []
        if self.phase.is_collecting:
            self.timings[self.phase.value] = now - self._stage_started
            self._server, _ = self._server.abort(AbortReason.CANCELLED, detail)
        return self._end_aborted(reason, detail, notify=self.live_devices())

    def surplus_removed(self, result: AggregateResult | None, detail: str = "", *, seconds: float = 0.0
                        ) -> list[Action]:
        """The runner ran `surplus` (off the event loop, in `seconds`): the
        round's result, or None when the removal failed (`detail`: why; the
        round aborts, nothing is released). Nothing happens once the round
        has ended."""
        if self.phase is not RoundState.AGGREGATING or self.surplus is None or self.result is not None:
            return []
        self.surplus = None
        self.removal_s = seconds
        if result is None:
            return self._end_aborted(P.ABORT_REASON_CANCELLED, f"removing the surplus noise failed: {detail}",
                                     notify=self.live_devices())
        self.result = result
        return [AggregateReady(result), self._log("aggregate_ready", counted=len(result.counted))]

    def committed(self, new_model_version: int, now: float) -> list[Action]:
        """The runner committed the round: tell the cohort."""
        if self.phase is not RoundState.AGGREGATING or self.result is None:
            raise RuntimeError(f"committed() in phase {self.phase.value}")
        self.timings[RoundState.AGGREGATING.value] = now - self._stage_started
        self.phase = RoundState.COMMITTED
        self.new_model_version = new_model_version
        msg = _server_message(
            round_committed=session_pb2.RoundCommitted(
                session_id=self.session_id,
                round_number=self.number,
                new_model_version=new_model_version,
                contributors=len(self.result.counted),
            )
        )
        return [
            Broadcast(tuple(self.cohort), msg),
            PhaseChanged(self.phase),
            RoundEnded(True),
            self._log("round_committed", version=new_model_version, contributors=len(self.result.counted)),
        ]

    def commit_failed(self, detail: str, now: float) -> list[Action]:
        if self.phase is not RoundState.AGGREGATING or self.result is None:
            raise RuntimeError(f"commit_failed() in phase {self.phase.value}")
        self.timings[RoundState.AGGREGATING.value] = now - self._stage_started
        return self._end_aborted(P.ABORT_REASON_CANCELLED, f"commit failed: {detail}", notify=self.result.counted)

    # ------------------------------------------------------------------ internals

    def _log(self, event: str, **fields: Any) -> LogEvent:
        return LogEvent(event, {"round": self.number, **fields})

    def _mark_out(self, device_id: int, why: str) -> None:
        self._out.add(device_id)
        self.dropouts.setdefault(self.phase.value, {})[device_id] = why

    def _notice(self, device_id: int, reason: codec.ProtoAbortReason, detail: str) -> Send:
        return Send(
            device_id,
            _server_message(
                abort=P.AbortNotice(
                    session_id=self.session_id, round_number=self.number, device_id=device_id, reason=reason,
                    detail=detail[: codec.MAX_DETAIL_CHARS],
                )
            ),
        )

    def _notify_out(self, device_id: int, reason: codec.ProtoAbortReason, detail: str) -> list[Action]:
        self._mark_out(device_id, reason_name(reason))
        return [
            self._notice(device_id, reason, detail),
            self._log("device_dropped", device=device_id, stage=self.phase.value, reason=reason_name(reason), detail=detail),
        ]

    def _drop(self, device_id: int, reason: codec.ProtoAbortReason, detail: str, now: float) -> list[Action]:
        """Drop a device for cause (tell secagg, notify the device)."""
        if not self.ids.has_device(device_id) or device_id in self._out:
            return [self._log("message_discarded", device=device_id, why=detail)]
        sid = self.ids.secagg(device_id)
        self._server, _ = self._server.handle(
            sid, sm.ClientAbort(session_id=self.session_id, round_idx=self.number, device_id=sid, reason=AbortReason.MALFORMED_MESSAGE)
        )
        return self._notify_out(device_id, reason, detail)

    def _close(self, now: float) -> list[Action]:
        actions: list[Action] = []
        stage = self.phase
        late = [self.ids.device(s) for s in sorted(self._server.pending)]
        for d in late:
            actions += self._notify_out(d, P.ABORT_REASON_DEADLINE_MISSED, f"missed the {stage.value} deadline")
        self._server, outbound = self._server.close()
        self.timings[stage.value] = now - self._stage_started
        self._stage_started = now
        ident = self._secagg_identity
        for m in outbound:
            d = self.ids.device(m.device_id)
            if isinstance(m, sm.ServerAbort):
                if d in self._out:
                    continue
                reason = abort_reason_to_proto(m.reason)
                if isinstance(self._server, ServerAborted):
                    self._out.add(d)  # the whole round ends: not a dropout
                else:
                    self._mark_out(d, reason_name(reason))  # pruned: too few neighbours left
                actions.append(self._notice(d, reason, m.reason.value))
                continue
            if d in self._out:
                continue
            p = codec.server_to_proto(m, self.ids, identity_keys=ident)
            actions.append(Send(d, _server_message(**{codec.SERVER_FIELDS[type(p)]: p})))
        if isinstance(self._server, ServerAborted):
            reason = abort_reason_to_proto(self._server.reason)
            detail = f"{self._server.reason.value} at {self._server.at_stage}: {self._server.detail}"
            return actions + self._end_aborted(reason, detail, notify=())
        if isinstance(self._server, ServerCompleted):
            done = self._server
            counted = tuple(self.ids.device(s) for s in done.counted)
            self.phase = RoundState.AGGREGATING
            self.deadline = math.inf
            if self.config.removable_noise and self.mechanism is not None:
                self.surplus = SurplusRemoval(self.config, self.metrics, self.mechanism, self.rotation_key,
                                              done.encoded_sum, counted, done.removed_seeds)
                return actions + [PhaseChanged(self.phase), self._log(
                    "removing_surplus", counted=len(counted), components=self.surplus.regenerated)]
            self.result = aggregate_result(self.config, self.metrics, done.encoded_sum, counted, self.mechanism,
                                           self.rotation_key)
            return actions + [
                PhaseChanged(self.phase),
                AggregateReady(self.result),
                self._log("aggregate_ready", counted=len(done.counted)),
            ]
        self.phase = RoundState(Stage(self._server.stage).value)
        self.deadline = now + self.deadlines[self.phase.value]
        return actions + [
            PhaseChanged(self.phase),
            self._log("stage_opened", stage=self.phase.value, devices=len(self._server.pending)),
        ]

    def _end_aborted(self, reason: codec.ProtoAbortReason, detail: str, *, notify: Sequence[int]) -> list[Action]:
        actions: list[Action] = [self._notice(d, reason, detail) for d in notify if d not in self._out]
        self._out.update(notify)
        self.phase = RoundState.ABORTED
        self.deadline = math.inf
        self.abort_reason = reason
        self.abort_detail = detail
        return actions + [
            PhaseChanged(self.phase),
            RoundEnded(False, reason, detail),
            self._log("round_aborted", reason=reason_name(reason), detail=detail),
        ]
