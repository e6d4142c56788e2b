"""What the admin tests share: a store filled through the store API, API
tokens of each role, the admin app served by uvicorn on a thread, and an
in-process gRPC server implementing fedmask.v1.CoordinatorAdmin over that
store (`FakeCoordinatorAdmin`).

The fake is a real gRPC server on 127.0.0.1 that speaks the proto: the
admin service's client, channel, metadata and status handling run for real.
It stands in for the coordinator's admin listener until the coordinator
serves one; it writes its audit entries into the same store the way the
coordinator does (`append_audit`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import grpc
import httpx
import numpy as np
import uvicorn
from pydantic import SecretStr
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from admin.app import create_app
from admin.auth import token_hash
from admin.settings import AdminSettings, CoordinatorLink, Role, TokenEntry
from coordinator.store import DeviceStatus, NewModelVersion, PrivacyEntry, RoundRecord, RoundState, Store
from coordinator.store.blobs import pack_parameters
from fedmask_proto.v1 import admin_service_pb2 as pb
from fedmask_proto.v1 import admin_service_pb2_grpc as pb_grpc

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
TOKENS = {role: f"{role.value}-token-" + "x" * 32 for role in Role}
ADMIN_CREDENTIAL = "coordinator-admin-credential-0123456789"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
#: Device ids of the fake: 1 answers, 2 not connected, 3 times out, 4 refuses.
ANSWERS, NOT_CONNECTED, SLOW, REFUSES = 1, 2, 3, 4
HANDLES = {"alice": ANSWERS, "bob": NOT_CONNECTED}
N_ITEMS = 50


def headers(role: Role) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def token_entries() -> list[TokenEntry]:
    return [TokenEntry(name=f"{role.value}-1", role=role, sha256=token_hash(t)) for role, t in TOKENS.items()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------- store


@dataclass
class Filled:
    """What `fill_store` wrote."""

    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    running: int = 0
    versions: list[int] = field(default_factory=list)  # version ids, oldest first (initial, then per round)


def fill_store(store: Store, *, rounds: int = 7, validation: bool = True) -> Filled:
    """Devices, an initial model, `rounds` finished rounds (every third
    aborted; the others committed with validation metrics, unless not
    `validation` (as under DP, D36), and a ledger entry) and one running
    round, all through the store API."""
    store.enroll_devices([(bytes([i]) * 32, f"user{i}") for i in range(1, 13)], client_id="client-a")
    store.set_device_status(12, DeviceStatus.REVOKED)
    out = Filled()
    params = {"item_table": np.arange(12, dtype=np.float32).reshape(3, 4)}
    first = store.add_model_version(NewModelVersion(model_name="fedrap", parameters=pack_parameters(params),
                                                    hyperparameters={"k": 4}, created_at=T0))
    out.versions.append(first.id)
    cumulative = 0.0
    for i in range(rounds):
        n = store.next_round_number()
        start = T0 + timedelta(minutes=i)
        common: dict[str, Any] = dict(number=n, started_at=start, ended_at=start + timedelta(seconds=2 + i),
                      cohort_size=10, base_model_version=out.versions[-1],
                      survivors={"selected": list(range(1, 11)), "advertise_keys": list(range(1, 11)),
                                 "share_keys": list(range(1, 10)), "masked_input": list(range(1, 9)),
                                 "unmasking": list(range(1, 9))},
                      dropouts={"share_keys": [10], "masked_input": [9]},
                      timings={"advertise_keys": 0.5, "share_keys": 0.25, "masked_input": 1.0, "unmasking": 0.125})
        if i % 3 == 2:
            store.abort_round(RoundRecord(state=RoundState.ABORTED, abort_reason="too_few_survivors", **common))
            out.aborted.append(n)
            continue
        cumulative += 0.5 + i
        v = store.commit_round(
            RoundRecord(state=RoundState.COMMITTED, metrics={"contributors": 8.0, "cohort": 10.0} | (
                            {"val_sampled_hr@10": 0.1 * (i + 1), "loss": 0.7} if validation else {}),
                        **common),
            NewModelVersion(model_name="fedrap", parameters=pack_parameters({"item_table": params["item_table"] + n}),
                            created_at=start + timedelta(seconds=3)),
            PrivacyEntry(round_number=n, epsilon=0.5 + i, delta=1e-5, noise_multiplier=0.9, sampling_rate=1.0,
                         cumulative_epsilon=cumulative))
        out.committed.append(n)
        out.versions.append(v.id)
    out.running = store.next_round_number()
    store.save_round_progress(RoundRecord(number=out.running, state=RoundState.MASKED_INPUT, started_at=T0 + timedelta(hours=1),
                                          cohort_size=10, base_model_version=out.versions[-1]))
    store.append_audit(operator="ops", action="pause", outcome="ok", at=T0)
    return out


# ------------------------------------------------------- the fake coordinator


def _ts(at: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(at)
    return ts


class FakeCoordinatorAdmin(pb_grpc.CoordinatorAdminServicer):
    """CoordinatorAdmin over a store (see the module docstring)."""

    def __init__(self, store: Store, filled: Filled, *, scripted_failures: bool = True) -> None:
        #: False: devices 2-4 answer like device 1 (no 503/504/403 by design).
        self.scripted_failures = scripted_failures
        self.store = store
        self.filled = filled
        self.paused = False
        self.round_running = True
        #: The live round's open stage.
        self.stage: pb.RoundStage.ValueType = pb.ROUND_STAGE_MASKED_INPUT
        self.model_version = filled.versions[-1]
        self.sequence = 0
        self.watchers: list[asyncio.Queue[pb.AdminEvent]] = []
        self.topk_requests: list[pb.RecommendTopKRequest] = []

    def _check(self, context: Ctx) -> None:
        meta = dict(context.invocation_metadata() or ())
        if meta.get("authorization") != f"Bearer {ADMIN_CREDENTIAL}":
            raise PermissionError

    async def _auth(self, context: Ctx) -> None:
        try:
            self._check(context)
        except PermissionError:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "admin credential required")

    def state(self) -> pb.LiveState:
        s = pb.LiveState(model_name="fedrap", model_version=self.model_version, paused=self.paused,
                         budget_exhausted=False, as_of=_ts(datetime.now(UTC)),
                         last_event_sequence=self.sequence,
                         privacy=pb.PrivacyBudget(epsilon_spent=9.0, epsilon_budget=50.0, delta=1e-5,
                                                  exhausted=False, mode="distributed"),
                         devices=pb.DeviceCounts(enrolled=12, revoked=1, connected=9, available=8))
        if self.round_running:
            order = [pb.ROUND_STAGE_ADVERTISE_KEYS, pb.ROUND_STAGE_SHARE_KEYS, pb.ROUND_STAGE_MASKED_INPUT,
                     pb.ROUND_STAGE_UNMASKING, pb.ROUND_STAGE_AGGREGATING]
            survivors = {pb.ROUND_STAGE_ADVERTISE_KEYS: 10, pb.ROUND_STAGE_SHARE_KEYS: 9}
            stages = []
            for stage in order[:order.index(self.stage) + 1]:
                if stage == self.stage:  # the open stage
                    stages.append(pb.StageProgress(stage=stage, survivors=4, dropouts=0, pending=5, started_at=_ts(T0),
                                                   deadline=_ts(T0 + timedelta(seconds=5))))
                else:
                    stages.append(pb.StageProgress(stage=stage, survivors=survivors.get(stage, 9),
                                                   dropouts=1 if stage == pb.ROUND_STAGE_SHARE_KEYS else 0,
                                                   started_at=_ts(T0),
                                                   duration=Duration(seconds=1) if stage == order[0]
                                                   else Duration(nanos=500_000_000)))
            s.round.CopyFrom(pb.LiveRound(
                number=self.filled.running, stage=self.stage, cohort_size=10, threshold=7,
                neighbour_count=9, live_devices=9, base_model_version=self.model_version,
                started_at=_ts(T0), secure=True, stages=stages))
        return s

    def publish(self, event: pb.AdminEvent) -> None:
        """Send `event` (its sequence and time set here) to every watcher."""
        self.sequence += 1
        event.sequence = self.sequence
        event.at.CopyFrom(_ts(datetime.now(UTC)))
        for q in self.watchers:
            q.put_nowait(event)

    async def GetLiveState(self, request: pb.GetLiveStateRequest, context: Ctx) -> pb.LiveState:
        await self._auth(context)
        return self.state()

    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Ctx) -> AsyncIterator[pb.AdminEvent]:
        await self._auth(context)
        q: asyncio.Queue[pb.AdminEvent] = asyncio.Queue()
        self.watchers.append(q)
        try:
            yield pb.AdminEvent(sequence=self.sequence, snapshot=self.state())
            while True:
                yield await q.get()
        finally:
            self.watchers.remove(q)

    async def RecommendTopK(self, request: pb.RecommendTopKRequest, context: Ctx) -> pb.RecommendTopKResponse:
        await self._auth(context)
        self.topk_requests.append(request)
        target = request.WhichOneof("target")
        device = request.device_id if target == "device_id" else HANDLES.get(request.user_handle, 0)
        if target is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no target")
        if not self.scripted_failures and target == "user_handle":
            device = ANSWERS  # every handle's device answers (the fuzzer's world)
        if target == "user_handle" and device in (0, NOT_CONNECTED):  # as the coordinator: unknown = offline (D84)
            context.set_trailing_metadata((("grpc-retry-pushback-ms", "2000"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no connected device has this user handle")
        if device not in (ANSWERS, NOT_CONNECTED, SLOW, REFUSES):
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown device or user")
        if not 1 <= request.k <= N_ITEMS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"k must be in 1..{N_ITEMS}")
        if not self.scripted_failures:
            device = ANSWERS
        if device == NOT_CONNECTED:
            context.set_trailing_metadata((("grpc-retry-pushback-ms", "3000"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "device not connected")
        if device == SLOW:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the device did not answer in time")
        if device == REFUSES:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the device does not serve recommendations")
        items = [pb.RecommendedItem(item_id=str(100 + i), title=f"Movie {i}", score=1.0 - i / 100, rank=i + 1,
                                    item_index=i) for i in range(request.k)]
        # scores set, as a coordinator built before D84 sent them: the admin service never shows them
        return pb.RecommendTopKResponse(device_id=device, user_handle="alice", items=items,
                                        model_version=self.model_version, latency=Duration(nanos=3_000_000),
                                        recommendation_id=f"rec-{len(self.topk_requests)}", seen_excluded=True)

    async def _act(self, action: str, request: pb.OperatorRequest | pb.RollbackRequest,
                   context: Ctx, changed: bool, *,
                   refused: str | None = None, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION,
                   new_version: int = 0) -> pb.OperatorActionResponse:
        entry = self.store.append_audit(operator=request.operator, action=action,
                                        outcome=f"refused: {refused}" if refused else "ok",
                                        details={"reason": request.reason})
        if refused:
            await context.abort(code, refused)
        return pb.OperatorActionResponse(state=self.state(), changed=changed, audit_id=entry.id,
                                         new_model_version=new_version)

    async def Pause(self, request: pb.OperatorRequest, context: Ctx) -> pb.OperatorActionResponse:
        await self._auth(context)
        changed, self.paused = not self.paused, True
        self.publish(pb.AdminEvent(federation_changed=pb.FederationChanged(paused=True, action="pause",
                                                                            operator=request.operator)))
        return await self._act("pause", request, context, changed)

    async def Resume(self, request: pb.OperatorRequest, context: Ctx) -> pb.OperatorActionResponse:
        await self._auth(context)
        changed, self.paused = self.paused, False
        return await self._act("resume", request, context, changed)

    async def AbortRound(self, request: pb.OperatorRequest, context: Ctx) -> pb.OperatorActionResponse:
        await self._auth(context)
        if not self.round_running:
            return await self._act("abort_round", request, context, False, refused="no round is running")
        self.round_running = False
        return await self._act("abort_round", request, context, True)

    async def Rollback(self, request: pb.RollbackRequest, context: Ctx) -> pb.OperatorActionResponse:
        await self._auth(context)
        if request.version not in self.filled.versions:
            return await self._act("rollback", request, context, False, refused=f"no version {request.version}",
                                   code=grpc.StatusCode.NOT_FOUND)
        old = self.store.get_model_version(request.version)
        new = self.store.add_model_version(NewModelVersion(model_name=old.model_name, parameters=old.parameters,
                                                           hyperparameters={"rollback_of": old.id}))
        self.model_version = new.id
        return await self._act("rollback", request, context, True, new_version=new.id)

    async def RecordRefusal(self, request: pb.RefusalRecord, context: Ctx) -> pb.RecordRefusalResponse:
        await self._auth(context)
        entry = self.store.append_audit(operator=request.operator, action=request.action,
                                        outcome=f"refused: {request.reason}",
                                        details={"role": request.role, "suppressed": request.suppressed})
        return pb.RecordRefusalResponse(audit_id=entry.id)


@dataclass
class Running:
    """The fake on a thread of the test process."""

    port: int
    loop: asyncio.AbstractEventLoop
    servicer: FakeCoordinatorAdmin

    def publish(self, event: pb.AdminEvent) -> None:
        """Publish `event` from the fake's own loop."""
        self.loop.call_soon_threadsafe(self.servicer.publish, event)

    def advance(self, stage: pb.RoundStage.ValueType) -> None:
        """The live round moves to `stage`: the state says so and a StageChanged goes out."""
        def move() -> None:
            self.servicer.stage = stage
            self.servicer.publish(pb.AdminEvent(stage_changed=pb.StageChanged(
                round_number=self.servicer.filled.running, stage=stage, cohort_size=10, threshold=7,
                live_devices=9)))
        self.loop.call_soon_threadsafe(move)


@contextmanager
def fake_coordinator(store: Store, filled: Filled, *, scripted_failures: bool = True) -> Iterator[Running]:
    """The fake CoordinatorAdmin on a free port, on its own thread and loop."""
    port = free_port()
    loop = asyncio.new_event_loop()
    servicer = FakeCoordinatorAdmin(store, filled, scripted_failures=scripted_failures)
    ready = threading.Event()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_CoordinatorAdminServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        stop.append(asyncio.Event())
        ready.set()
        await stop[0].wait()
        await server.stop(grace=0.2)
        # End every RPC still running (an event stream whose caller left) on this loop: left pending, its
        # task and async generator would be finalized by whichever thread's garbage collection finds them,
        # in the middle of that thread's work (once inside a test's ast.parse, which CPython 3.11 then
        # failed with "AST constructor recursion depth mismatch").
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        await loop.shutdown_asyncgens()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert ready.wait(10), "the fake coordinator did not start"
    try:
        yield Running(port, loop, servicer)
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def admin_settings(database_url: str, coordinator_port: int) -> AdminSettings:
    """Settings of an admin service over `database_url` and the fake on `coordinator_port`."""
    link = CoordinatorLink(address=f"127.0.0.1:{coordinator_port}", token=SecretStr(ADMIN_CREDENTIAL),
                           topk_timeout_s=2.0)
    return AdminSettings(database_url=database_url, tokens=token_entries(), coordinator=link)


@contextmanager
def admin_server(settings: AdminSettings) -> Iterator[str]:
    """`fedmask admin`'s app under uvicorn on a thread; yields its base URL."""
    port = free_port()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the admin service did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class World:
    """A filled store, the fake coordinator over it and the admin service."""

    backend: str
    url: str
    store: Store
    filled: Filled
    coordinator: Running
    base: str
    #: One client for the whole world (a new httpx client per request costs ~0.15 s).
    http: httpx.Client


@contextmanager
def world(backend: str, url: str, *, scripted_failures: bool = True, validation: bool = True) -> Iterator[World]:
    """Fill the store at `url` (migrated as the coordinator would; `validation`
    as `fill_store`'s), start the fake coordinator and the admin service over it."""
    from coordinator.store import open_store

    store = open_store(url)
    try:
        filled = fill_store(store, validation=validation)
        with fake_coordinator(store, filled, scripted_failures=scripted_failures) as running, \
                admin_server(admin_settings(url, running.port)) as base:
            with httpx.Client(base_url=base, timeout=20) as http:
                yield World(backend, url, store, filled, running, base, http)
    finally:
        store.close()


@contextmanager
def database(backend: str, tmp: Any, request: Any) -> Iterator[str]:
    """A fresh database URL of `backend` ("sqlite" or "postgresql") that lives
    as long as the context (module-scoped tests share one)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'fedmask.db'}"
        return
    import uuid

    from conftest_pg import _admin

    server = request.getfixturevalue("postgresql_server")
    name = f"fedmask_admin_{uuid.uuid4().hex[:12]}"
    _admin(server, "CREATE DATABASE {}", name)
    try:
        yield str(server.url(name))
    finally:
        _admin(server, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
