"""Fake devices and a fake edge client for the coordinator tests.

`FakeDevice` is one honest device: real secagg client states, the `wire`
codec, a random update, and its identity key (which proves possession at
enrolment and on every stream, fedmask.v1.1). `FakeClient` hosts several
devices on one real gRPC Session stream (written only with the stubs, secagg, wire and dpmech, as the
edge client must be). Both can be told to go silent at a stage or to
tamper with their messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from fedmask_proto.v1 import (
    common_pb2,
    coordinator_service_pb2_grpc,
    enrollment_pb2,
    secagg_pb2,
    session_pb2,
)
from dpmech.field import to_unsigned
from dpmech.mechanism import encode as dp_encode
from dpmech.removable_encoding import encode as removable_encode
from dpmech.removable_encoding import new_seeds
from secagg import identity
from secagg.client import ClientAdvertiseKeys, ClientState
from secagg.messages import AdvertiseKeys
from secagg.randomness import DeterministicRandom
from wire import RoundTaskView, parse_round_task
from wire import secagg_codec as codec
from wire.possession import enrollment_payload, session_payload
from wire.protocol import PROTOCOL_VERSION

# The server message that asks a device for each stage's message.
TRIGGER_STAGE = {
    "round_task": "advertise_keys",
    "advertised_keys": "share_keys",
    "forwarded_shares": "share_check",
    "masking_request": "masked_input",
    "consistency_check_request": "consistency_check",
    "unmasking_request": "unmasking",
}
_INNER_STAGE = {
    secagg_pb2.AdvertisedKeys: "share_keys",
    secagg_pb2.ForwardedShares: "share_check",
    secagg_pb2.MaskingRequest: "masked_input",
    secagg_pb2.ConsistencyCheckRequest: "consistency_check",
    secagg_pb2.UnmaskingRequest: "unmasking",
}

Tamper = Callable[[int, Any], Any]


def fake_metric_values(device_id: int, round_number: int) -> dict[str, float]:
    """An honest device's own metric values (any names of wire.round_metrics.SLOTS), reproducible from the ids."""
    rng = np.random.default_rng((device_id, round_number, 7))
    hit = float(rng.integers(0, 2))
    ratings = float(rng.integers(1, 20))
    return {
        "devices": 1.0,
        "examples": float(rng.integers(1, 500)),
        "update_norm": float(rng.uniform(0, 30)),
        "clipped": float(rng.integers(0, 2)),
        "val_sampled_hits@10": hit,
        "val_sampled_ndcg@10": hit * float(rng.uniform(0.2, 1.0)),
        "val_sampled_count": 1.0,
        "val_sse": float(rng.uniform(0, 4)) * ratings,
        "val_sae": float(rng.uniform(0, 2)) * ratings,
        "val_rating_count": ratings,
    }


def identity_private(device_seed: int):
    return identity.generate_identity(DeterministicRandom(device_seed, "identity"))


@dataclass(eq=False)
class FakeDevice:
    device_id: int
    seed: int = 0
    silent_at: str | None = None  # a stage name: never answer from there on
    tamper: Tamper | None = None  # (device_id, outgoing proto) -> proto or None
    #: a hostile device's own metric coordinates (raw uint32, any values) instead of honest limbs
    metric_limbs: Callable[[RoundTaskView], np.ndarray] | None = None
    identity_key: Any = None
    state: ClientState | None = None
    view: RoundTaskView | None = None
    own: AdvertiseKeys | None = None
    peer_identity: dict[int, bytes] = field(default_factory=dict)
    encoded: np.ndarray | None = None
    update: np.ndarray | None = None
    aborted: list[int] = field(default_factory=list)  # proto reasons received
    silent: bool = False
    certificate: bytes = b""  # identity certificate (DER) sent with AdvertiseKeys (D33)
    advertised: list[Any] = field(default_factory=list)  # AdvertisedKeys received
    component_seeds: tuple[bytes, ...] = ()  # removable noise (D110): the seeds of components 1..n-t

    def _out(self, msgs) -> list[Any]:
        out = []
        for m in msgs:
            p = codec.client_to_proto(m, self.view.ids, modulus_bits=self.view.config.encoding.modulus_bits)
            if isinstance(p, secagg_pb2.AdvertiseKeys):
                p.identity_certificate = self.certificate
            if self.tamper is not None:
                p = self.tamper(self.device_id, p)
                if p is None:
                    continue
            out.append(p)
        return out

    def on_task(self, view: RoundTaskView) -> list[Any]:
        self.view = view
        self.silent = self.silent_at == "advertise_keys"
        if self.silent:
            return []
        cfg = view.config
        rng = np.random.default_rng((self.seed, view.round_number, self.device_id))
        self.update = rng.uniform(-cfg.encoding.clip, cfg.encoding.clip, view.update_length)
        if self.metric_limbs is not None:
            limbs = np.asarray(self.metric_limbs(view), dtype=np.uint32)
        else:
            limbs = view.metrics.encode(fake_metric_values(self.device_id, view.round_number))
        self.component_seeds = ()
        if view.removable is not None and view.mechanism is not None:  # removable noise (D110), as the edge client's
            self.component_seeds = new_seeds(view.removable, DeterministicRandom(self.seed, f"c-{self.device_id}"))
            residues = to_unsigned(removable_encode(self.update, view.mechanism, view.rotation_seed, rng,
                                                    view.removable, self.component_seeds), view.mechanism.bits)
            self.encoded = np.concatenate([residues.astype(np.uint32), limbs])
        elif view.mechanism is not None:  # the discrete Gaussian (D88): the device's residues, as the edge client's
            residues = to_unsigned(dp_encode(self.update, view.mechanism, view.rotation_seed, rng), view.mechanism.bits)
            self.encoded = np.concatenate([residues.astype(np.uint32), limbs])
        else:
            self.encoded = np.concatenate([cfg.encoding.encode(self.update, rng), limbs])
        self.peer_identity = {}
        self.state = ClientAdvertiseKeys(
            cfg, view.devices[self.device_id], view.round_number, self.encoded,
            rand=DeterministicRandom(self.seed, f"dev-{self.device_id}-{view.round_number}"),
            identity_key=self.identity_key if cfg.active_adversary else None,
            peer_identity_keys=self.peer_identity if cfg.active_adversary else None,
            removable_seeds=self.component_seeds,
        )
        self.state, msgs = self.state.start()
        self.own = msgs[0]
        return self._out(msgs)

    def on_message(self, inner: Any) -> list[Any]:
        if self.view is None:
            return []
        if inner.session_id != self.view.session_id or inner.round_number != self.view.round_number:
            return []
        if isinstance(inner, common_pb2.AbortNotice):
            self.aborted.append(inner.reason)
            if self.state is not None:
                self.state, _ = self.state.handle(codec.server_abort_from_proto(inner, self.view.ids))
            return []
        if self.state is None:
            return []
        stage = _INNER_STAGE.get(type(inner))
        if self.silent or (stage is not None and stage == self.silent_at):
            self.silent = True
            return []
        if isinstance(inner, secagg_pb2.AdvertisedKeys):
            self.advertised.append(inner)
            own_pub = identity.public_bytes(self.identity_key) if self.identity_key is not None else None
            msg, ident = codec.key_list_from_proto(inner, self.view.ids, self.own, own_identity_public_key=own_pub)
            self.peer_identity.update(ident)
        else:
            msg = codec.server_from_proto(inner, self.view.ids)
        self.state, replies = self.state.handle(msg)
        return self._out(replies)


def parse_task_for(task: session_pb2.RoundTask, hosted) -> RoundTaskView:
    return parse_round_task(task, hosted=hosted)


class FakeClient:
    """One edge-client process on a real Session stream."""

    def __init__(self, target: str, devices: list[FakeDevice], *, name: str = "fake",
                 metadata: tuple = (), heartbeat: float | None = None) -> None:
        self.target = target
        self.devices = {d.device_id: d for d in devices}
        self.name = name
        self.metadata = metadata
        self.heartbeat = heartbeat
        self.received: list[session_pb2.ServerMessage] = []
        self.committed: list[session_pb2.RoundCommitted] = []
        self.tasks: list[session_pb2.RoundTask] = []
        self.status: grpc.StatusCode | None = None
        self.details: str = ""
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.welcome = asyncio.Event()
        self.channel: grpc.aio.Channel | None = None
        #: Answers DeviceRequests when set (None: the request is left unanswered).
        self.on_device_request: Callable[[session_pb2.DeviceRequest], session_pb2.DeviceResponse | None] | None = None
        self.nonce = b""

    async def start(self) -> None:
        self.channel = grpc.aio.insecure_channel(
            self.target, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self._task = asyncio.create_task(self._run())

    def send(self, msg: session_pb2.ClientMessage) -> None:
        self._queue.put_nowait(msg)

    def send_inner(self, inner: Any) -> None:
        field_name = codec.CLIENT_FIELDS[type(inner)]
        self.send(session_pb2.ClientMessage(**{field_name: inner}))

    async def _requests(self):
        yield session_pb2.ClientMessage(
            hello=session_pb2.Hello(client_name=self.name, protocol_version=PROTOCOL_VERSION,
                                    available_device_ids=sorted(self.devices))
        )
        while True:
            msg = await self._queue.get()
            if msg is None:
                return
            yield msg

    async def _run(self) -> None:
        stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(self.channel)
        call = stub.Session(self._requests(), metadata=self.metadata)
        try:
            async for msg in call:
                self.received.append(msg)
                self._on(msg)
            self.status = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            self.status = exc.code()
            self.details = exc.details() or ""
        except asyncio.CancelledError:
            self.status = grpc.StatusCode.CANCELLED

    def proofs(self, ids) -> list[session_pb2.DeviceProof]:
        """Proofs over this stream's nonce by the devices' own identity keys
        (a device without a key sends none)."""
        return [session_pb2.DeviceProof(device_id=d, signature=identity.sign(
                    self.devices[d].identity_key, session_payload(self.nonce, d)))
                for d in sorted(ids) if self.devices[d].identity_key is not None]

    def _on(self, msg: session_pb2.ServerMessage) -> None:
        kind = msg.WhichOneof("message")
        if kind == "challenge":
            self.nonce = bytes(msg.challenge.nonce)
            self.send(session_pb2.ClientMessage(proof=session_pb2.DeviceProofs(proofs=self.proofs(self.devices))))
            return
        if kind == "welcome":
            self.welcome.set()
            return
        if kind == "round_task":
            self.tasks.append(msg.round_task)
            view = parse_round_task(msg.round_task, hosted=self.devices)
            for d in view.devices:
                for p in self.devices[d].on_task(view):
                    self.send_inner(p)
            return
        if kind == "round_committed":
            self.committed.append(msg.round_committed)
            return
        if kind == "device_request":
            answer = self.on_device_request(msg.device_request) if self.on_device_request is not None else None
            if answer is not None:
                self.send(session_pb2.ClientMessage(device_response=answer))
            return
        if kind == "abort":
            inner = msg.abort
            targets = [inner.device_id] if inner.device_id else list(self.devices)
            for n in codec.expand_abort(inner, targets):
                if n.device_id in self.devices:
                    self.devices[n.device_id].on_message(n)
            return
        if kind in ("advertised_keys", "forwarded_shares", "masking_request", "consistency_check_request", "unmasking_request"):
            inner = getattr(msg, kind)
            dev = self.devices.get(inner.device_id)
            if dev is not None:
                for p in dev.on_message(inner):
                    self.send_inner(p)

    async def close(self) -> None:
        self._queue.put_nowait(None)
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self.channel is not None:
            await self.channel.close()

    async def kill(self) -> None:
        """Vanish without a goodbye (cancel the call)."""
        if self._task is not None:
            self._task.cancel()
        if self.channel is not None:
            await self.channel.close()


def signed_enroll_request(challenge: bytes, keys, *, client_name: str = "fake",
                          local_ids=None) -> enrollment_pb2.EnrollRequest:
    """An EnrollRequest whose devices prove possession of `keys` over `challenge`."""
    lids = local_ids or [f"user-{i}" for i in range(len(keys))]
    return enrollment_pb2.EnrollRequest(client_name=client_name, challenge=challenge, devices=[
        enrollment_pb2.DeviceEnrollment(
            local_id=lid, identity_public_key=identity.public_bytes(k),
            possession_signature=identity.sign(k, enrollment_payload(challenge, client_name, lid,
                                                                     identity.public_bytes(k))))
        for lid, k in zip(lids, keys, strict=True)])


async def enroll_keys(stub, keys, *, metadata: tuple = (), client_name: str = "fake",
                      local_ids=None) -> enrollment_pb2.EnrollResponse:
    """Ask `stub` for a challenge, then enrol `keys` with their proofs."""
    got = await stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), metadata=metadata)
    return await stub.Enroll(signed_enroll_request(got.challenge, keys, client_name=client_name,
                                                   local_ids=local_ids), metadata=metadata)


async def enroll(target: str, n: int, *, seed: int = 0, metadata: tuple = ()) -> list[tuple[int, Any]]:
    """Enrol n devices; returns [(device_id, identity private key)]."""
    keys = [identity_private(seed * 100_000 + i) for i in range(n)]
    async with grpc.aio.insecure_channel(target) as ch:
        # handles are unique in the federation (D41): qualify them by the seed
        resp = await enroll_keys(coordinator_service_pb2_grpc.CoordinatorServiceStub(ch), keys, metadata=metadata,
                                 local_ids=[f"user-{seed}-{i}" for i in range(n)])
    return [(d.device_id, k) for d, k in zip(resp.devices, keys, strict=True)]
