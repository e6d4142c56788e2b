"""One round on this client: its state and the steps every update path shares.

`RoundRun` is the round as this client sees it (the checked RoundTask, one
`DeviceRound` per selected device, the trained batch); the secure path
(`edge_client.secure_update`) and the INSECURE plaintext path
(`edge_client.plaintext`) both go through its steps:

- `encode(dr, update)`: what the device masks: the round's fixed-point
  encoding of its update (stochastic rounding from os.urandom) followed by
  its own metric values as integer limbs, in the slots the RoundTask names
  (`wire.round_metrics`, D35; a device whose metrics cannot be computed
  puts zeros there, which the coordinator sees as unavailable metrics);
  under the discrete Gaussian (D88) the mechanism's residues instead,
  `dpmech.mechanism.encode` step for step (L2 clip, the round's rotation,
  scale, rounding under the device's own norm bound, noise sampled exactly
  from os.urandom, mod 2^w), and no metric at all;
  recorded for debugging when the driver was given a debug-inputs folder;
- `reply(dr, messages)`: secagg messages to proto, onto the outbox (after the
  fault plan's delay); nothing is sent once the round is over;
- `finish_device(dr)`: the device's part is over (answered, aborted,
  dropped): its secagg state is forgotten and its round secret wiped;
- no metric is ever sent on its own: the only copy of a device's metrics
  that leaves it is inside its masked input;
- `end(outcome)`: the round is over for every device here.

A run never outlives its round: the driver ends it before the next one
starts, so `over` is the one test of "is this still the current round".
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from cryptography import x509

import wire
from dpmech.field import to_unsigned
from dpmech.mechanism import encode as dp_encode
from dpmech.random_source import SystemBytes
from dpmech.removable_encoding import encode as removable_encode
from edge_client.contributions import ContributionRule
from edge_client.devices import Device
from edge_client.faults import FaultPlan, forged_metric_limbs
from edge_client.state import DIR_MODE, FILE_MODE
from edge_client.trainer import TrainOutput
from fedmask_proto.v1 import secagg_pb2, session_pb2
from secagg import messages as sm
from secagg.client import ClientAborted, ClientState
from secagg.stages import Stage

log = logging.getLogger("edge_client.session")

T = TypeVar("T")


@dataclass(frozen=True)
class RoundIO:
    """What a round needs from the session driver (the same for every round)."""

    send: Callable[..., None]  # send(**oneof): one ClientMessage onto the current outbox
    spawn: Callable[[Coroutine[Any, Any, Any]], object]  # run a coroutine in the background
    faults: FaultPlan
    secure_random: Callable[[int], bytes]  # round secrets
    secure_numpy_rng: Callable[[], np.random.Generator]  # stochastic rounding of the encoding
    debug_inputs_dir: Path | None = None  # DEBUG ONLY: record every encoded input here
    #: The device CA this client was configured with (D33): in active mode
    #: every peer's identity certificate must verify against it.
    device_ca: x509.Certificate | None = None
    #: Where the devices' secure-aggregation computation runs (key generation,
    #: decoding, state steps, encoding; `RoundRun.compute`): one thread by default
    #: (session.py SECAGG_THREADS), apart from the default executor's file I/O.
    #: None: the loop's default executor.
    compute_pool: Executor | None = None
    #: At most one contribution per training key and so many per window (D85);
    #: None: no record is kept (tests of the round mechanics only).
    contribution_rule: ContributionRule | None = None


@dataclass(eq=False)
class DeviceRound:
    device: Device
    secagg_id: int
    state: ClientState | None = None
    own: sm.AdvertiseKeys | None = None
    identity: dict[int, bytes] = field(default_factory=dict)
    drop_at: Stage | None = None
    done: bool = False
    sent_masked: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    row: int | None = None  # row in the trained batch
    certificate: bytes = b""  # the device's identity certificate (DER), sent with its AdvertiseKeys


@dataclass
class RoundEvent:
    """What the application learns about finished rounds (logs, --crash-after-round, tests)."""

    round_number: int
    outcome: str  # committed | aborted | superseded | disconnected | failed
    devices: int
    detail: str = ""


@dataclass(eq=False)
class RoundRun:
    view: wire.RoundTaskView
    io: RoundIO
    devices: dict[int, DeviceRound] = field(default_factory=dict)  # device id -> its part
    over: bool = False
    train: TrainOutput | None = None
    #: wire.round_binding.training_key of the task: what a contribution is counted against (D85)
    training_key: bytes = b""

    @property
    def key(self) -> tuple[bytes, int]:
        return self.view.session_id, self.view.round_number

    def is_for(self, session_id: bytes, round_number: int) -> bool:
        """A server message for this round, and the round still running here."""
        return not self.over and (bytes(session_id), round_number) == self.key

    async def compute(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the compute pool (RoundIO.compute_pool), off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.io.compute_pool, functools.partial(fn, *args))

    # ------------------------------------------------------------ encoding
    async def encode(self, dr: DeviceRound, update: np.ndarray, component_seeds: Sequence[bytes] = ()) -> np.ndarray:
        # the rng is drawn here, in device order; the encoding (stochastic rounding of
        # a whole model, milliseconds per device) runs off the event loop, which must
        # stay free to read the stream (a top-k request waits behind a busy loop)
        rng = self.io.secure_numpy_rng()
        if self.view.mechanism is not None:  # the discrete Gaussian: its residues, no metric limbs (D88)
            encoded = await self.compute(discrete_gaussian_input, self.view, np.asarray(update, dtype=np.float64), rng,
                                         component_seeds)
        else:
            model = await self.compute(self.view.config.encoding.encode, np.asarray(update, dtype=np.float64), rng)
            encoded = np.concatenate([model, self._metric_limbs(dr)])
        if self.io.debug_inputs_dir is not None:
            await asyncio.to_thread(
                record_input, self.io.debug_inputs_dir, self.view.round_number, dr.device.device_id, encoded
            )
        return encoded

    def _metric_limbs(self, dr: DeviceRound) -> np.ndarray:
        layout = self.view.metrics
        if self.io.faults.garbage_metrics:  # fault injection: a hostile device
            return np.full(layout.coordinates, 0xFFFFFFFF, dtype=np.uint32)
        values: dict[str, float] = {}
        if layout.coordinates and self.train is not None and dr.row is not None:
            try:
                values = self.train.device_metrics(dr.row)
            except Exception:  # a metric must never cost the update: zeros, seen as unavailable
                log.exception("round %d, %s: metrics failed", self.view.round_number, dr.device.local_id)
        if self.io.faults.forged_metrics:  # fault injection: a hostile device writing its own limbs
            return forged_metric_limbs(layout, layout.encode(values), dict(self.io.faults.forged_metrics))
        return layout.encode(values)

    # ------------------------------------------------------------ replies
    async def reply(self, dr: DeviceRound, out: list[sm.Message], *, delay: bool = True) -> None:
        await self.send_encoded(dr, self.encode_replies(dr, out), delay=delay)

    def encode_replies(self, dr: DeviceRound, out: list[sm.Message]) -> list[Any]:
        """The protos of a device's secagg replies, in order. Pure but for the
        fault plan's garbage shares; safe on a worker thread while the device's
        lock is held (it reads dr.state and dr.certificate only)."""
        view = self.view
        protos: list[Any] = []
        for m in out:
            if isinstance(m, sm.ShareKeys) and self.io.faults.garbage_shares:  # fault injection: a hostile device
                m = dataclasses.replace(m, shares=tuple((u, os.urandom(len(b))) for u, b in m.shares))
            detail = ""
            if isinstance(m, sm.ClientAbort) and isinstance(dr.state, ClientAborted):
                detail = dr.state.detail
            p = wire.client_to_proto(m, view.ids, modulus_bits=view.config.encoding.modulus_bits, detail=detail)
            if isinstance(p, secagg_pb2.AdvertiseKeys) and view.config.active_adversary:
                p.identity_certificate = dr.certificate
            protos.append(p)
        return protos

    async def send_encoded(self, dr: DeviceRound, protos: list[Any], *, delay: bool = True) -> None:
        """Put `encode_replies`' protos on the outbox (after the fault plan's delay;
        nothing once the round is over)."""
        if not protos:
            return
        if delay and self.io.faults.delay_s > 0:
            await asyncio.sleep(self.io.faults.delay_s)
        if self.over:
            return
        for p in protos:
            self.io.send(**{wire.CLIENT_FIELDS[type(p)]: p})
            if isinstance(p, secagg_pb2.MaskedInput):
                dr.sent_masked = True

    # ------------------------------------------------------------ a device's end
    def go_silent(self, dr: DeviceRound, stage: Stage) -> None:
        log.info("round %d, %s: drops at %s (fault injection)", self.view.round_number, dr.device.local_id, stage)
        self.finish_device(dr)

    def finish_device(self, dr: DeviceRound) -> None:
        """The device's part in the round is over: forget its secagg state, wipe its secret."""
        if dr.done:
            return
        dr.done = True
        dr.state = None
        dr.own = None
        self.io.spawn(asyncio.to_thread(
            dr.device.store.clear_round_secret, session_id=self.view.session_id, round_number=self.view.round_number
        ))

    # ------------------------------------------------------------ the round's end
    def end(self, outcome: str, detail: str = "") -> RoundEvent | None:
        """Over for every device here; the event to report (None if it already ended)."""
        if self.over:
            return None
        self.over = True
        for dr in self.devices.values():
            self.finish_device(dr)
        self.train = None
        return RoundEvent(self.view.round_number, outcome, len(self.devices), detail)


def discrete_gaussian_input(view: wire.RoundTaskView, update: np.ndarray, rng: np.random.Generator,
                            component_seeds: Sequence[bytes] = ()) -> np.ndarray:
    """A device's masked input under the discrete Gaussian (D88): its update
    through `dpmech.mechanism.encode` with the round's mechanism and
    rotation seed, the noise drawn exactly from the operating system's
    CSPRNG (a fresh `SystemBytes`), as residues mod 2^w in uint32 words.
    With removable noise (D110) every component is added
    (`dpmech.removable_encoding.encode`), component k from
    `component_seeds[k - 1]`. `rng` only randomises the rounding (not part
    of the guarantee)."""
    mechanism = view.mechanism
    if mechanism is None:
        raise ValueError("the round does not run the discrete Gaussian")
    if view.removable is not None:
        centred = removable_encode(update, mechanism, view.rotation_seed, rng, view.removable, component_seeds,
                                   noise=SystemBytes())
        return to_unsigned(centred, mechanism.bits).astype(np.uint32)
    if component_seeds:
        raise ValueError("component seeds given for a round without removable noise")
    centred = dp_encode(update, mechanism, view.rotation_seed, rng, noise=SystemBytes())
    return to_unsigned(centred, mechanism.bits).astype(np.uint32)


def _private_dir(path: Path) -> None:
    """`path` and its missing parents made owner-only (DIR_MODE, like the
    state dir); `path` itself tightened if it exists (an older release made
    them 0755)."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(d, DIR_MODE)  # mkdir's mode passes through the umask
    os.chmod(path, DIR_MODE)


def record_input(folder: Path, round_number: int, device_id: int, encoded: np.ndarray) -> None:
    """DEBUG ONLY: FOLDER/round-NNNNNN/device-ID.npy (uint32, what secagg masks);
    a failure is logged, never raised (a debug aid never stops a round).
    The encoded input is the device's update in the clear, as private as its
    state: the folders are 0700 and the files 0600, whatever the umask."""
    sub = folder / f"round-{round_number:06d}"
    try:
        _private_dir(folder)
        _private_dir(sub)
        tmp = sub / f".device-{device_id}.npy.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)  # a temp file a crash left behind keeps its old mode otherwise
            np.save(f, encoded, allow_pickle=False)
        os.replace(tmp, sub / f"device-{device_id}.npy")
    except OSError as e:
        log.warning("cannot record the debug input of device %d: %s", device_id, e)
