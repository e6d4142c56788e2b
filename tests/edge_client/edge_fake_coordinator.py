"""An in-process fake coordinator for the edge-client tests.

A real grpc.aio server on 127.0.0.1 (generated stubs, `wire` codecs) whose
rounds run the coordinator's own round machine (`coordinator.rounds.RoundMachine`,
or `coordinator.plaintext.PlaintextRoundMachine` for a task marked
insecure-plaintext): the fake only carries messages between the machine and
the one client stream, and lets the clock run (the event loop's) so that a
stage closes when every device answered or at its deadline. What the fake
adds of its own: enrolment and the Session handshake, both with the
coordinator's proof-of-possession checks (`coordinator.possession`: a
signed EnrollChallenge, a SessionChallenge answered by DeviceProofs; only
proven devices are admitted), and knobs for tests
(tamper with server messages or the RoundTask (re-bound to its session id
unless `rebind_tampered=False`, D85), do not commit). It records
every ClientMessage it receives (for the privacy test).

The package `edge_client` never imports `coordinator`; its tests may.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf import duration_pb2

import wire
from coordinator.plaintext import PlaintextRoundMachine
from coordinator.possession import EnrollChallenges, enrollment_refusal, proven_devices
from coordinator.rounds import Action, Broadcast, RoundMachine, Send
from coordinator.store import RoundState
from dpmech.mechanism import MechanismConfig
from fedmask_proto.v1 import common_pb2, coordinator_service_pb2_grpc, enrollment_pb2, secagg_pb2, session_pb2
from secagg.config import SecAggConfig
from secagg.stages import Stage
from wire import secagg_codec
from wire.dp_task import discrete_gaussian_settings
from wire.protocol import PLAINTEXT_HYPERPARAMETER, PROTOCOL_VERSION, SERVER_FIELD_STAGE
from wire.round_binding import DIGEST_BYTES, bind_round_config, cohort_ids, task_digest
from wire.round_metrics import MetricLayout

log = logging.getLogger("fake_coordinator")


@dataclass
class Stream:
    context: Any
    hello: session_pb2.Hello
    nonce: bytes = b""  # the stream's SessionChallenge nonce
    proven: set[int] = field(default_factory=set)  # proved possession on this stream
    announced: list[int] = field(default_factory=list)  # by the Hello, then the last CheckIn
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # round-scoped client messages
    responses: dict = field(default_factory=dict)  # correlation_id -> DeviceResponse
    response_event: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def device_ids(self) -> list[int]:
        """The devices the client announced last that proved possession."""
        return sorted(d for d in self.announced if d in self.proven)

    def send(self, **oneof: Any) -> None:
        self.out.put_nowait(session_pb2.ServerMessage(**oneof))


@dataclass
class RoundResult:
    machine: RoundMachine  # the round's machine, after the round
    counted_devices: list[int]
    aborts: list  # client AbortNotices received
    task: session_pb2.RoundTask

    @property
    def config(self) -> SecAggConfig:
        return self.machine.config

    @property
    def ids(self) -> wire.RoundIds:
        return self.machine.ids

    @property
    def ok(self) -> bool:
        """The aggregate was computed (committed, or left uncommitted on request)."""
        return self.machine.result is not None

    @property
    def survivors(self) -> dict[str, list[int]]:
        """Stage value -> device ids that completed that stage."""
        return self.machine.survivors()

    def decoded_sum(self) -> np.ndarray:
        assert self.machine.result is not None, f"round ended {self.machine.phase.value}"
        return self.machine.result.decoded_sum

    def metric_totals(self) -> tuple[dict[str, float], dict[str, int]]:
        """(real sums, counts) of the round's metrics over the counted devices,
        decoded from the secure sum as the coordinator does."""
        result = self.machine.result
        assert result is not None, f"round ended {self.machine.phase.value}"
        return self.machine.metrics.decode(result.metric_sums, len(result.counted))


class FakeCoordinator(coordinator_service_pb2_grpc.CoordinatorServiceServicer):
    def __init__(self, *, token: str | None = None, heartbeat_s: float = 5.0) -> None:
        self.token = token
        self.heartbeat_s = heartbeat_s
        self.identity: dict[int, bytes] = {}  # device_id -> identity public key
        self._by_key: dict[bytes, int] = {}
        self.enroll_calls = 0
        self.received: list[session_pb2.ClientMessage] = []
        self.streams: list[Stream] = []
        self.stream_ready = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.round_number = 0
        self.reject_unknown = False
        self._returned = 0
        self.challenges = EnrollChallenges(clock=time.monotonic)
        self.nonces: list[bytes] = []  # each stream's SessionChallenge nonce

    # ------------------------------------------------------------ server
    async def start(self, *, tls: tuple[bytes, bytes, bytes] | None = None) -> int:
        """Listen on 127.0.0.1; `tls` = (server key, server cert, client CA) for mTLS."""
        self.server = grpc.aio.server()
        coordinator_service_pb2_grpc.add_CoordinatorServiceServicer_to_server(self, self.server)
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            key, cert, ca = tls
            creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)

    async def __aenter__(self) -> FakeCoordinator:
        """Listening (plain TCP) for the block; stopped after it, whatever happens."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _check_auth(self, context) -> None:
        if self.token is None:
            return
        md = dict(context.invocation_metadata() or ())
        if md.get("authorization") != f"Bearer {self.token}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    # ------------------------------------------------------------ RPCs
    async def EnrollChallenge(self, request, context):
        await self._check_auth(context)
        return enrollment_pb2.EnrollChallengeResponse(challenge=self.challenges.issue())

    async def Enroll(self, request, context):
        await self._check_auth(context)
        self.enroll_calls += 1
        refusal = self.challenges.refusal(bytes(request.challenge))
        if refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if enrollment_refusal(request) is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "a device did not prove possession of its key")
        out = enrollment_pb2.EnrollResponse(protocol_version=PROTOCOL_VERSION, coordinator_version="fake")
        for d in request.devices:
            key = bytes(d.identity_public_key)
            if len(key) != 32:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "identity key must be 32 bytes")
            new = key not in self._by_key
            if new:
                self._by_key[key] = len(self._by_key) + 1
                self.identity[self._by_key[key]] = key
            out.devices.add(local_id=d.local_id, device_id=self._by_key[key], newly_enrolled=new)
        return out

    async def Session(self, request_iterator, context):
        await self._check_auth(context)
        first = await context.read()
        if first is grpc.aio.EOF or first.WhichOneof("message") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be hello")
        self.received.append(first)
        nonce = os.urandom(32)
        self.nonces.append(nonce)
        await context.write(session_pb2.ServerMessage(challenge=session_pb2.SessionChallenge(nonce=nonce)))
        second = await context.read()
        if second is grpc.aio.EOF or second.WhichOneof("message") != "proof":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "second message must be proof")
        self.received.append(second)
        s = Stream(context=context, hello=first.hello, nonce=nonce)
        s.proven = proven = proven_devices(nonce, second.proof.proofs, first.hello.available_device_ids, self.identity)
        admission = session_pb2.DeviceAdmission()
        for d in first.hello.available_device_ids:
            if d not in self.identity or self.reject_unknown:
                admission.rejected.add(device_id=d, reason=session_pb2.DEVICE_REJECTION_REASON_UNKNOWN_DEVICE)
            elif d not in proven:
                admission.rejected.add(device_id=d, reason=session_pb2.DEVICE_REJECTION_REASON_NOT_PROVEN)
            else:
                admission.accepted_device_ids.append(d)
        s.announced = list(first.hello.available_device_ids)
        await context.write(session_pb2.ServerMessage(welcome=session_pb2.Welcome(
            protocol_version=PROTOCOL_VERSION, coordinator_version="fake",
            heartbeat_interval=duration_pb2.Duration(seconds=int(self.heartbeat_s),
                                                     nanos=int((self.heartbeat_s % 1) * 1e9)),
            admission=admission,
        )))
        self.streams.append(s)
        self.stream_ready.set()
        reader = asyncio.ensure_future(self._read(context, s))
        try:
            await self._pump(context, s, reader)
        except (asyncio.CancelledError, grpc.RpcError, ConnectionError):
            pass
        finally:
            reader.cancel()
            s.closed.set()

    async def _pump(self, context, s: Stream, reader: asyncio.Future) -> None:
        while True:
            getter = asyncio.ensure_future(s.out.get())
            done, _ = await asyncio.wait([getter, reader], return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                return
            m = getter.result()
            if m is None:
                return
            await context.write(m)

    async def _read(self, context, s: Stream) -> None:
        while True:
            m = await context.read()
            if m is grpc.aio.EOF:
                return
            self.received.append(m)
            kind = m.WhichOneof("message")
            if kind == "heartbeat":
                s.send(heartbeat=session_pb2.Heartbeat(sequence=m.heartbeat.sequence))
            elif kind == "check_in":
                ids = list(m.check_in.available_device_ids)
                s.proven |= proven_devices(s.nonce, m.check_in.proofs, [d for d in ids if d not in s.proven],
                                           self.identity)
                s.announced = ids
                accepted = [] if self.reject_unknown else s.device_ids
                s.send(check_in_ack=session_pb2.DeviceAdmission(accepted_device_ids=accepted))
            elif kind == "device_response":
                s.responses[m.device_response.correlation_id] = m.device_response
                s.response_event.set()
            elif kind in secagg_codec.CLIENT_FIELDS.values():
                s.inbox.put_nowait(getattr(m, kind))

    async def wait_stream(self, timeout: float = 20.0) -> Stream:
        """The next session stream opened after the ones already returned."""
        async def until() -> Stream:
            while len(self.streams) <= self._returned:
                self.stream_ready.clear()
                await self.stream_ready.wait()
            self._returned += 1
            return self.streams[self._returned - 1]

        return await asyncio.wait_for(until(), timeout)

    # ------------------------------------------------------------ a round
    async def run_round(
        self,
        s: Stream,
        *,
        model_name: str = "synthetic",
        vector_length: int = 16,
        global_parameters: dict[str, np.ndarray] | None = None,
        hyperparameters: dict | None = None,
        clip: float = 1.0,
        devices: list[int] | None = None,
        neighbors: int | str = "all",
        threshold: int | None = None,
        active: bool = False,
        dp: session_pb2.DpSettings | None = None,
        first_stage_timeout: float = 30.0,
        stage_timeout: float = 10.0,
        commit: bool = True,
        tamper: Any = None,
        task_tamper: Any = None,
        rebind_tampered: bool = True,
        metric_names: tuple[str, ...] = (),
        mechanism: MechanismConfig | None = None,
    ) -> RoundResult:
        """One round; `mechanism`: the discrete Gaussian (D88) the devices
        encode with (its settings replace `dp` unless a test passes its own;
        the masked vector is its padded length) and the machine decodes with."""
        devices = sorted(devices if devices is not None else s.device_ids)
        self.round_number += 1
        r = self.round_number
        masked = vector_length if mechanism is None else mechanism.padded_dim
        if mechanism is not None and dp is None:
            dp = discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0,
                                            mechanism=mechanism)
        config = SecAggConfig.create(
            num_clients=len(devices), vector_length=masked, session_id=os.urandom(16), clip=clip,
            neighbors=neighbors, threshold=threshold, active_adversary=active,
        )
        layout = MetricLayout.for_round(metric_names, config.encoding)
        config = dataclasses.replace(config, vector_length=masked + layout.coordinates)
        params = global_parameters if global_parameters is not None else {"mean": np.zeros(vector_length, np.float32)}
        hyper = dict(hyperparameters or {})
        if model_name == "synthetic":
            hyper.setdefault("vector_length", vector_length)
        deadlines = {stage.value: stage_timeout for stage in Stage}
        deadlines[Stage.ADVERTISE_KEYS.value] = first_stage_timeout
        plaintext = bool(hyper.get(PLAINTEXT_HYPERPARAMETER, False))
        if plaintext:  # one stage, whose window includes training
            deadlines[Stage.MASKED_INPUT.value] = first_stage_timeout
        machine_type = PlaintextRoundMachine if plaintext else RoundMachine
        # the session id commits to the task, as the coordinator's does (wire.round_binding, D85)
        config = bind_round_config(config, round_number=r, ids=cohort_ids(devices), model_name=model_name,
                                   model_version=r, global_parameters=params, hyperparameters=hyper, dp=dp,
                                   metrics=layout)
        m = machine_type(number=r, config=config, cohort=devices, deadlines=deadlines,
                         identity_keys={d: self.identity[d] for d in devices} if active else None, metrics=layout,
                         mechanism=mechanism)
        task = wire.build_round_task(
            config=config, round_number=r, ids=m.ids, devices=devices, model_name=model_name, model_version=r,
            global_parameters=params, hyperparameters=hyper, dp=dp,
            deadlines={"advertise_keys": first_stage_timeout, "share_keys": stage_timeout}, metrics=layout,
        )
        if task_tamper is not None:
            task_tamper(task)
            if rebind_tampered:  # the tampered task's own digest, so the device reaches the check a test aims at
                task.session_id = task.session_id[:-DIGEST_BYTES] + task_digest(task)
        certs: dict[int, bytes] = {}  # identity certificates from AdvertiseKeys, relayed in PeerKeys (D33)

        def relay(inner: Any) -> Any:
            if isinstance(inner, secagg_pb2.AdvertisedKeys):
                for peer in inner.peers:
                    peer.identity_certificate = certs.get(peer.device_id, b"")
            return tamper(inner) if tamper is not None else inner

        s.send(round_task=task)
        aborts: list = []
        loop = asyncio.get_running_loop()
        self._apply(s, m.start(loop.time()), relay)
        while m.phase.is_collecting:
            now = loop.time()
            if m.wants_close or now >= m.deadline:
                self._apply(s, m.tick(now), relay)
                continue
            try:
                p = await asyncio.wait_for(s.inbox.get(), m.deadline - now)
            except asyncio.TimeoutError:
                continue
            if isinstance(p, common_pb2.AbortNotice):
                aborts.append(p)
                # as the coordinator does: a client's round abort withdraws each of its devices in the round
                notices: Iterable[Any] = (secagg_codec.expand_abort(p, [d for d in s.device_ids if m.ids.has_device(d)])
                                          if p.device_id == 0 else [p])
            else:
                notices = [p]
            if isinstance(p, secagg_pb2.AdvertiseKeys):
                certs.setdefault(int(p.device_id), bytes(p.identity_certificate))
            for q in notices:
                self._apply(s, m.handle(int(q.device_id), q, loop.time()), relay)
        if m.phase is RoundState.AGGREGATING and commit:
            self._apply(s, m.committed(r + 1, loop.time()), relay)
        counted = list(m.result.counted) if m.result is not None else []
        return RoundResult(m, counted, aborts, task)

    @staticmethod
    def _apply(s: Stream, actions: list[Action], tamper: Any) -> None:
        """The machine's messages onto the one stream (every device is on it);
        `tamper(proto) -> proto | None` sees each server stage message first."""
        for a in actions:
            if not isinstance(a, Send | Broadcast):
                continue
            kind = a.message.WhichOneof("message")
            inner = getattr(a.message, kind)
            if tamper is not None and kind in SERVER_FIELD_STAGE:
                inner = tamper(inner)
                if inner is None:
                    continue
            s.send(**{kind: inner})

    async def top_k(self, s: Stream, device_id: int, k: int, exclude_seen: bool = True,
                    timeout: float = 20.0) -> session_pb2.DeviceResponse:
        cid = os.urandom(8).hex()
        s.send(device_request=session_pb2.DeviceRequest(
            correlation_id=cid, device_id=device_id, top_k=session_pb2.TopKQuery(k=k, exclude_seen=exclude_seen)))

        async def until() -> session_pb2.DeviceResponse:
            while cid not in s.responses:
                s.response_event.clear()
                await s.response_event.wait()
            return s.responses[cid]

        return await asyncio.wait_for(until(), timeout)



# ---------------------------------------------------------------- client helpers


class RunningClient:
    """An EdgeClient serving the fake from a background task (async context manager)."""

    def __init__(self, fake: FakeCoordinator, state_dir, *, users: str = "1-6", dataset: str = "synthetic",
                 backoff=None, **config: Any) -> None:
        from edge_client.app import ClientConfig, EdgeClient
        from edge_client.backoff import Backoff

        from edge_client.contributions import ContributionRule
        from edge_client.dp_floor import DpFloor

        # the fake's rounds run without DP: the devices' DP floor is off unless a test passes its own (D85)
        config.setdefault("dp_floor", DpFloor.off())
        # the fake repeats one task round after round (its model never moves): no contribution rule here
        config.setdefault("contribution_rule", ContributionRule(max_rounds=0, once_per_key=False))
        cfg = ClientConfig(coordinator=fake.target, users=users, state_dir=state_dir, dataset=dataset, **config)
        self.client = EdgeClient(cfg, backoff=backoff or Backoff(base=0.05, cap=0.2))
        self.task: asyncio.Task | None = None
        self.exit_code: int | None = None

    async def __aenter__(self) -> RunningClient:
        self.client.prepare()
        self.task = asyncio.ensure_future(self.client.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client.stop()
        if self.task is not None:
            try:
                self.exit_code = await asyncio.wait_for(self.task, 10)
            finally:
                self.client.close()

    @property
    def driver(self):
        return self.client.driver


def run_async(coro, timeout: float = 60.0):
    """Run a coroutine to completion in a fresh event loop (tests are sync)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
