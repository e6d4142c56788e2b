"""The session driver: what the client does with each ServerMessage.

Transport-free: `SessionDriver.handle(server_message)` reacts to one message
and puts the ClientMessages to send on `outbox` (an asyncio.Queue the
transport drains in order). CPU work (training, secagg handlers, top-k)
runs in worker threads so heartbeats keep flowing.

One round on this client (docs/wire-notes.md has the stream picture):

1. RoundTask: checked with `wire.parse_round_task`; the selected devices
   that do not drop at advertise-keys train together (`Trainer.train`; the
   new private state is written before anything is sent), each update is
   encoded with the round's fixed-point encoding, and for each device a
   fresh 32-byte round secret is written to its state dir *before* its
   `ClientAdvertiseKeys.start()`; the secret seeds the DRBG from which
   secagg draws every per-round secret of the device.
2. Each stage message is routed to its device (replays and stale rounds are
   discarded), converted by `wire`, handed to the device's secagg state, and
   the reply converted back and sent (after `--delay-ms`).
3. After the client's last MaskedInput: one RoundMetrics with sums over
   the devices that sent one.
4. RoundCommitted / AbortNotice end the round; round secrets are wiped as
   soon as a device's part is over (answered unmasking, aborted, dropped).

A malformed server message (WireError) aborts that device's round: it sends
a ClientAbort (AbortNotice PROTOCOL_VIOLATION) and the process carries on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf import timestamp_pb2

import wire
from edge_client.faults import FaultPlan
from edge_client.state import RoundSecret, StateCorruptError
from edge_client.trainer import SYNTHETIC_MODEL, TaskSpec, Trainer, TrainingError, TrainOutput
from fedmask_proto.v1 import common_pb2, session_pb2
from secagg import messages as sm
from secagg.client import ClientAborted, ClientAdvertiseKeys, ClientCompleted, ClientState
from secagg.errors import AbortReason
from secagg.randomness import DeterministicRandom
from wire import secagg_codec
from wire.protocol import (
    PLAINTEXT_HYPERPARAMETER,
    PROTOCOL_VERSION,
    ROUND_INDEX_HYPERPARAMETER,
    SERVER_FIELD_STAGE,
    coordinator_refusal,
)

log = logging.getLogger("edge_client.session")

SUPPORTED_MODELS = ("fedrap", "fedmmf", "pfedrec", "fedmf", SYNTHETIC_MODEL)
DEFAULT_HEARTBEAT_S = 10.0
ROUND_SECRET_LABEL = b"fedmask/edge_client/round-secret/v1"
_DP_MODES = {
    session_pb2.DP_MODE_NONE: "none",
    session_pb2.DP_MODE_LOCAL: "local",
    session_pb2.DP_MODE_DISTRIBUTED: "distributed",
}
_REASON = {
    "client_error": common_pb2.ABORT_REASON_CLIENT_ERROR,
    "model_mismatch": common_pb2.ABORT_REASON_MODEL_MISMATCH,
    "protocol_violation": common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
    "client_leaving": common_pb2.ABORT_REASON_CLIENT_LEAVING,
}


class FatalSessionError(Exception):
    """The coordinator refuses this client for good (user-facing message)."""


# ============================================================ hosted devices


@dataclass
class Device:
    """A hosted, enrolled device as the driver sees it."""

    device_id: int
    number: int  # user number (1-based) in the dataset
    local_id: str
    identity_key: Ed25519PrivateKey
    store: Any  # edge_client.state.DeviceStore

    @property
    def identity_public(self) -> bytes:
        return self.identity_key.public_key().public_bytes_raw()


@dataclass(eq=False)
class DeviceRound:
    device: Device
    secagg_id: int
    state: ClientState | None = None
    own: sm.AdvertiseKeys | None = None
    identity: dict[int, bytes] = field(default_factory=dict)
    drop_at: str | None = None
    done: bool = False
    sent_masked: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    row: int | None = None  # row in the trained batch


@dataclass(eq=False)
class RoundRun:
    view: wire.RoundTaskView
    devices: dict[int, DeviceRound]
    over: bool = False
    metrics_sent: bool = False
    train: TrainOutput | None = None

    @property
    def key(self) -> tuple[bytes, int]:
        return self.view.session_id, self.view.round_number


@dataclass
class RoundEvent:
    """What the application learns about finished rounds (logs, --crash-after-round, tests)."""

    round_number: int
    outcome: str  # committed | aborted | superseded | disconnected | failed
    devices: int
    detail: str = ""


# ============================================================ the driver


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
    ) -> None:
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
        self.outbox: asyncio.Queue[session_pb2.ClientMessage] = asyncio.Queue()
        self.accepted: set[int] = set()
        self.last_rejections: list[session_pb2.DeviceRejection] = []
        self.heartbeat_interval = DEFAULT_HEARTBEAT_S
        self.retry_after: float | None = None
        self.run: RoundRun | None = None
        self.heartbeats_sent = 0
        self.rounds_seen = 0
        self._bg: set[asyncio.Task] = set()

    # ------------------------------------------------------------ outgoing
    def send(self, **oneof: Any) -> None:
        self.outbox.put_nowait(session_pb2.ClientMessage(**oneof))

    def hello_message(self) -> session_pb2.ClientMessage:
        return session_pb2.ClientMessage(
            hello=session_pb2.Hello(
                client_name=self.client_name,
                protocol_version=PROTOCOL_VERSION,
                available_device_ids=sorted(self.devices),
                supported_models=list(SUPPORTED_MODELS),
                client_version=self.client_version,
            )
        )

    def check_in_message(self, available: Iterable[int] | None = None) -> session_pb2.ClientMessage:
        ids = sorted(self.devices if available is None else available)
        return session_pb2.ClientMessage(check_in=session_pb2.CheckIn(available_device_ids=ids))

    def heartbeat_message(self) -> session_pb2.ClientMessage:
        self.heartbeats_sent += 1
        ts = timestamp_pb2.Timestamp()
        ts.GetCurrentTime()
        return session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=self.heartbeats_sent, sent_at=ts))

    def new_session(self) -> None:
        """A fresh stream: a new outbox (nothing stale is sent on it)."""
        self.outbox = asyncio.Queue()
        self.retry_after = None

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

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        self._bg.discard(t)
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            log.error("internal error in the session driver: %r", exc, exc_info=exc)

    async def idle(self) -> None:
        """Wait until every background task has finished (tests)."""
        while self._bg:
            await asyncio.gather(*list(self._bg), return_exceptions=True)

    # ------------------------------------------------------------ rounds
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
        run = RoundRun(view=view, devices={})
        for device_id, secagg_id in view.devices.items():
            dr = DeviceRound(device=self.devices[device_id], secagg_id=secagg_id)
            dr.drop_at = self.faults.drop_stage_of(device_id, view.round_number)
            run.devices[device_id] = dr
        self.run = run
        log.info(
            "round %d: %d device(s) selected, model %s v%d, secagg %s",
            view.round_number, len(run.devices), view.model_name, view.model_version, view.config.describe(),
        )
        if view.model_name not in SUPPORTED_MODELS:
            self._abort_run(run, common_pb2.ABORT_REASON_MODEL_MISMATCH, f"model {view.model_name!r} not supported")
            return
        plaintext = bool(view.hyperparameters.get(PLAINTEXT_HYPERPARAMETER, False))
        if plaintext and not self.allow_insecure_plaintext:
            log.error("round %d: the coordinator asks for an INSECURE plaintext round; refused "
                      "(only --debug-allow-insecure-plaintext accepts it)", view.round_number)
            self._abort_run(run, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION,
                            "refusing an insecure plaintext round")
            return
        active = []
        for dr in run.devices.values():
            if dr.drop_at == "advertise_keys":
                self._go_silent(run, dr, "advertise_keys")
            else:
                active.append(dr)
        if not active:
            return
        spec = self._task_spec(view)
        try:
            if view.model_name == SYNTHETIC_MODEL:
                out = self.trainer.synthetic_updates(
                    spec, [dr.device.device_id for dr in active], clip=view.config.encoding.clip
                )
            else:
                out = await asyncio.to_thread(self.trainer.train, spec, [dr.device.number for dr in active])
        except TrainingError as e:
            log.error("round %d: cannot train: %s", view.round_number, e)
            self._abort_run(run, _REASON.get(e.reason, common_pb2.ABORT_REASON_CLIENT_ERROR), str(e))
            return
        except Exception as e:  # a bug or resource problem: the process stays up
            log.exception("round %d: training failed", view.round_number)
            self._abort_run(run, common_pb2.ABORT_REASON_CLIENT_ERROR, f"training failed: {type(e).__name__}")
            return
        if run.over or self.run is not run:
            return
        run.train = out
        if view.model_name != SYNTHETIC_MODEL:
            log.info("round %d: trained %d device(s) in %.2fs", view.round_number, len(active), out.seconds)
        upload = self._plaintext_upload if plaintext else self._advertise
        await asyncio.gather(*(upload(run, dr, i, out.updates[i]) for i, dr in enumerate(active)))

    def _task_spec(self, view: wire.RoundTaskView) -> TaskSpec:
        hyper = {k: v for k, v in view.hyperparameters.items() if k != PLAINTEXT_HYPERPARAMETER}
        round_idx = hyper.get(ROUND_INDEX_HYPERPARAMETER, view.round_number)
        return TaskSpec(
            model_name=view.model_name,
            model_version=view.model_version,
            round_number=view.round_number,
            round_idx=int(round_idx) if isinstance(round_idx, int | float) else view.round_number,
            hyperparameters=hyper,
            global_params=view.global_parameters,
            vector_length=view.config.vector_length,
            dp_mode=_DP_MODES.get(view.dp.mode, "none"),
            dp_clip_norm=float(view.dp.clip_norm),
            dp_noise_stddev=float(view.dp.noise_stddev),
        )

    async def _advertise(self, run: RoundRun, dr: DeviceRound, row: int, update: np.ndarray) -> None:
        view = run.view
        dev = dr.device
        async with dr.lock:
            if dr.done or run.over:
                return
            dr.row = row
            encoded = view.config.encoding.encode(np.asarray(update, dtype=np.float64), self.trainer.secure_numpy_rng())
            if self.debug_inputs_dir is not None:
                await asyncio.to_thread(self._record_input, view.round_number, dev.device_id, encoded)
            seed = self.secure_random(32)
            # durable BEFORE the keys exist anywhere else
            await asyncio.to_thread(
                dev.store.save_round_secret, RoundSecret(view.session_id, view.round_number, seed)
            )
            active = view.config.active_adversary
            if active:
                dr.identity[dr.secagg_id] = dev.identity_public
            state = ClientAdvertiseKeys(
                view.config,
                dr.secagg_id,
                view.round_number,
                encoded,
                rand=DeterministicRandom(seed, ROUND_SECRET_LABEL),
                identity_key=dev.identity_key if active else None,
                peer_identity_keys=dr.identity if active else None,
            )
            del encoded
            dr.state, out = state.start()
            dr.own = out[0]  # type: ignore[assignment]
            await self._reply(run, dr, out)

    def _record_input(self, round_number: int, device_id: int, encoded: np.ndarray) -> None:
        """DEBUG ONLY: DIR/round-NNNNNN/device-ID.npy (uint32, what secagg masks)."""
        assert self.debug_inputs_dir is not None
        folder = self.debug_inputs_dir / f"round-{round_number:06d}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".device-{device_id}.npy.tmp"
            with open(tmp, "wb") as f:
                np.save(f, encoded, allow_pickle=False)
            os.replace(tmp, folder / f"device-{device_id}.npy")
        except OSError as e:  # a debug aid never stops a round
            log.warning("cannot record the debug input of device %d: %s", device_id, e)

    async def _plaintext_upload(self, run: RoundRun, dr: DeviceRound, row: int, update: np.ndarray) -> None:
        """INSECURE plaintext round (benchmark baseline, coordinator/plaintext.py):
        the encoded update goes out unmasked in a MaskedInput; no secagg state,
        no round secret. A device set to drop at share-keys or masked-input
        stays silent; later drop stages do not exist in this mode."""
        view = run.view
        async with dr.lock:
            if dr.done or run.over:
                return
            dr.row = row
            if dr.drop_at in ("share_keys", "masked_input"):
                self._go_silent(run, dr, dr.drop_at)
                return
            encoded = view.config.encoding.encode(np.asarray(update, dtype=np.float64), self.trainer.secure_numpy_rng())
            if self.debug_inputs_dir is not None:
                await asyncio.to_thread(self._record_input, view.round_number, dr.device.device_id, encoded)
            msg = sm.MaskedInput(session_id=view.session_id, round_idx=view.round_number, device_id=dr.secagg_id,
                                 vector=encoded)
            await self._reply(run, dr, [msg])
            self._finish_device(run, dr)

    def _route_stage(self, field_name: str, p: Any) -> None:
        run = self.run
        if run is None or run.over or (bytes(p.session_id), p.round_number) != run.key:
            log.debug("discarding %s for another or finished round (%d)", field_name, p.round_number)
            return
        dr = run.devices.get(p.device_id)
        if dr is None:
            log.debug("discarding %s for device %d, not in this round here", field_name, p.device_id)
            return
        self._spawn(self._stage(run, dr, field_name, p))

    async def _stage(self, run: RoundRun, dr: DeviceRound, field_name: str, p: Any) -> None:
        stage = SERVER_FIELD_STAGE[field_name]
        async with dr.lock:
            if dr.done or run.over or dr.state is None:
                return
            if dr.drop_at == stage:
                self._go_silent(run, dr, stage)
                return
            view = run.view
            try:
                if field_name == "advertised_keys":
                    assert dr.own is not None
                    msg, ident = secagg_codec.key_list_from_proto(
                        p, view.ids, dr.own,
                        own_identity_public_key=dr.device.identity_public if view.config.active_adversary else None,
                    )
                    dr.identity.update(ident)
                else:
                    msg = wire.server_from_proto(p, view.ids)
            except wire.WireError as e:
                log.warning("round %d, %s: malformed %s: %s; the device leaves the round",
                            view.round_number, dr.device.local_id, field_name, e)
                state, out = dr.state.abort(AbortReason.MALFORMED_MESSAGE, f"malformed {field_name}: {e}")
                dr.state = state
                await self._reply(run, dr, out, delay=False)
                self._finish_device(run, dr)
                return
            state, out = await asyncio.to_thread(dr.state.handle, msg)
            dr.state = state
            await self._reply(run, dr, out)
            if isinstance(state, ClientAborted):
                log.warning("round %d, %s: left the round: %s (%s)", view.round_number, dr.device.local_id,
                            state.reason.value, state.detail)
                self._finish_device(run, dr)
            elif isinstance(state, ClientCompleted):
                self._finish_device(run, dr)

    async def _reply(self, run: RoundRun, dr: DeviceRound, out: list[sm.Message], *, delay: bool = True) -> None:
        if not out:
            return
        if delay and self.faults.delay_s > 0:
            await asyncio.sleep(self.faults.delay_s)
        if run.over or self.run is not run:
            return
        view = run.view
        for m in out:
            detail = ""
            if isinstance(m, sm.ClientAbort) and isinstance(dr.state, ClientAborted):
                detail = dr.state.detail
            p = wire.client_to_proto(m, view.ids, modulus_bits=view.config.encoding.modulus_bits, detail=detail)
            self.send(**{wire.CLIENT_FIELDS[type(p)]: p})
            if isinstance(m, sm.MaskedInput):
                dr.sent_masked = True
        if any(isinstance(m, sm.MaskedInput) for m in out):
            self._maybe_send_metrics(run)

    def _go_silent(self, run: RoundRun, dr: DeviceRound, stage: str) -> None:
        log.info("round %d, %s: drops at %s (fault injection)", run.view.round_number, dr.device.local_id, stage)
        self._finish_device(run, dr)

    def _finish_device(self, run: RoundRun, dr: DeviceRound) -> None:
        """The device's part in the round is over: forget its secagg state, wipe its secret."""
        if dr.done:
            return
        dr.done = True
        dr.state = None
        dr.own = None
        self._spawn(asyncio.to_thread(
            dr.device.store.clear_round_secret, session_id=run.view.session_id, round_number=run.view.round_number
        ))
        self._maybe_send_metrics(run)

    def _maybe_send_metrics(self, run: RoundRun) -> None:
        """Once every device has sent its masked input or is out: one RoundMetrics
        (sums precomputed at training, so it leaves right after the last MaskedInput)."""
        if run.metrics_sent or run.over or run.train is None:
            return
        if not all(dr.sent_masked or dr.done for dr in run.devices.values()):
            return
        run.metrics_sent = True
        senders = sorted((dr for dr in run.devices.values() if dr.sent_masked), key=lambda d: d.device.device_id)
        rows = [dr.row for dr in senders if dr.row is not None]
        if not rows:
            return
        try:
            sums, counts = run.train.metrics(rows)
        except Exception:
            log.exception("round %d: metrics failed", run.view.round_number)
            return
        self.send(round_metrics=session_pb2.RoundMetrics(
            session_id=run.view.session_id,
            round_number=run.view.round_number,
            device_ids=[dr.device.device_id for dr in senders],
            sums=sums,
            counts=counts,
        ))

    # ------------------------------------------------------------ ends of rounds
    def _send_abort(self, session_id: bytes, round_number: int, device_id: int, reason: int, detail: str) -> None:
        self.send(abort=common_pb2.AbortNotice(
            session_id=session_id, round_number=round_number, device_id=device_id, reason=reason,
            detail=detail[: secagg_codec.MAX_DETAIL_CHARS],
        ))

    def _abort_run(self, run: RoundRun, reason: int, detail: str) -> None:
        """This client withdraws all its devices from the round."""
        self._send_abort(run.view.session_id, run.view.round_number, 0, reason, detail)
        self._end_round(run, "failed", detail)

    def _on_abort(self, p: common_pb2.AbortNotice) -> None:
        run = self.run
        if run is None or run.over or (bytes(p.session_id), p.round_number) != run.key:
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
            self._finish_device(run, dr)

    def _on_committed(self, p: session_pb2.RoundCommitted) -> None:
        run = self.run
        if run is None or run.over or (bytes(p.session_id), p.round_number) != run.key:
            log.debug("RoundCommitted for round %d (not ours or already over)", p.round_number)
            return
        log.info(
            "round %d committed: model v%d from %d contributor(s), %d of ours sent a masked input",
            p.round_number, p.new_model_version, p.contributors,
            sum(1 for dr in run.devices.values() if dr.sent_masked),
        )
        self._end_round(run, "committed", f"model v{p.new_model_version}")

    def _end_round(self, run: RoundRun, outcome: str, detail: str = "") -> None:
        if run.over:
            return
        run.over = True
        for dr in run.devices.values():
            self._finish_device(run, dr)
        run.train = None
        event = RoundEvent(run.view.round_number, outcome, len(run.devices), detail)
        if self.on_round_end is not None:
            self.on_round_end(event)

    def on_disconnect(self) -> None:
        """The stream is gone: the running round is abandoned (wire-notes: no resume)."""
        if self.run is not None and not self.run.over:
            log.warning("round %d abandoned: the session ended", self.run.view.round_number)
            self._end_round(self.run, "disconnected", "stream lost")

    # ------------------------------------------------------------ device requests
    async def _on_device_request(self, req: session_pb2.DeviceRequest) -> None:
        outbox = self.outbox  # answer on the stream that asked, never on a later one
        resp = session_pb2.DeviceResponse(correlation_id=req.correlation_id, device_id=req.device_id)
        dev = self.devices.get(req.device_id)
        kind = req.WhichOneof("request")

        def error(code: int, text: str) -> None:
            resp.error.CopyFrom(session_pb2.DeviceError(code=code, message=text))

        if dev is None:
            error(session_pb2.DEVICE_ERROR_CODE_UNKNOWN_DEVICE, "device not hosted by this client")
        elif kind != "top_k":
            error(session_pb2.DEVICE_ERROR_CODE_UNSUPPORTED, f"request {kind or 'empty'} not supported")
        elif req.top_k.k < 1 or req.top_k.k > self.trainer.n_items:
            error(session_pb2.DEVICE_ERROR_CODE_INVALID_ARGUMENT, f"k must be in 1..{self.trainer.n_items}")
        else:
            try:
                items, scores, version = await asyncio.to_thread(
                    self.trainer.top_k, dev.number, int(req.top_k.k), exclude_seen=bool(req.top_k.exclude_seen)
                )
                resp.top_k.CopyFrom(session_pb2.TopKResult(item_ids=items, scores=scores, model_version=version))
            except LookupError as e:
                error(session_pb2.DEVICE_ERROR_CODE_NOT_READY, str(e))
            except Exception as e:
                log.exception("top-k for %s failed", dev.local_id)
                error(session_pb2.DEVICE_ERROR_CODE_INTERNAL, type(e).__name__)
        outbox.put_nowait(session_pb2.ClientMessage(device_response=resp))


def decline_unfinished_rounds(devices: Mapping[int, Device]) -> int:
    """At start-up: a round secret left on disk means the process stopped
    mid-round. The device declines that round (its secret is wiped; the
    coordinator already counts it as dropped). Returns how many were found."""
    n = 0
    for dev in devices.values():
        try:
            secret = dev.store.load_round_secret()
        except StateCorruptError:
            # what a crash in the middle of the wipe (secure_delete: zeroes, then
            # unlink) leaves behind; the secret is of no use after a restart anyway
            log.warning("%s: unreadable round secret left by a crash; wiping it", dev.local_id)
            dev.store.clear_round_secret()
            n += 1
            continue
        if secret is not None:
            log.warning("%s: declining unfinished round %d after a restart", dev.local_id, secret.round_number)
            dev.store.clear_round_secret()
            n += 1
    return n
