"""The coordinator's admin service (fedmask.v1.CoordinatorAdmin) over real
gRPC on 127.0.0.1: its own listener and credential, live state and the
event stream through real rounds of fake devices, operator actions with
their audit log, the top-k relay by device id and by user handle, the
epsilon budget (also across a restart on the same SQLite file), and the
Prometheus endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1.health import aio as health_aio
from prometheus_client.parser import text_string_to_metric_families

from coordinator.live_state import STAGE
from coordinator.model_host import build_server_model
from coordinator.server import build_admin_server, build_server, set_serving, start_metrics_server
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import InMemoryStore, RoundState, Store, open_store
from coordinator.store.blobs import unpack_parameters
from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import admin_service_pb2_grpc, common_pb2, coordinator_service_pb2_grpc, enrollment_pb2
from fedmask_proto.v1 import session_pb2 as S
from wire.protocol import PROTOCOL_VERSION

from coordinator.model_host import SyntheticModel
from coordinator_fakes import FakeClient, FakeDevice, enroll, enroll_keys, identity_private

L = 16
#: The collecting stages of a round of these tests, in order (no consistency check: no signatures).
ROUND_STAGES = [p for p in RoundState if p.is_collecting and p is not RoundState.CONSISTENCY_CHECK]
ADMIN_TOKEN = "admin-token-0123456789abcdef"
DEVICE_TOKEN = "device-token-0123456789abcdef"


@dataclass
class CatalogueModel(SyntheticModel):
    """The synthetic model with a catalogue, so top-k queries are allowed."""

    items: int = 20

    @property
    def n_items(self) -> int:
        return self.items


def make_settings(**over: Any) -> CoordinatorSettings:
    base: dict[str, Any] = {
        "listen_address": "127.0.0.1:0",
        "database_url": "memory://",
        "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": L},
        "cohort.size": 3,
        "cohort.minimum": 3,
        "cohort.over_selection": 0.0,
        "cohort.allow_consecutive": True,
        "deadlines.selection": 0.2,
        **{f"deadlines.{k}": 5.0 for k in ("training", "advertise_keys", "share_keys", "masked_input",
                                           "consistency_check", "unmasking")},
        "dp.mode": "none",
        "secagg.graph": "full",
        "secagg.threshold": "majority",
        "seed": 3,
        "admin.listen": "127.0.0.1:0",
        "admin.auth": "none",
    }
    base.update(over)
    return CoordinatorSettings.load(overrides=base)


class Running:
    def __init__(self, coord: Coordinator, target: str, admin_target: str, store: Store,
                 rounds: asyncio.Task[None]) -> None:
        self.coord, self.target, self.admin_target, self.store, self.rounds = coord, target, admin_target, store, rounds


@contextlib.asynccontextmanager
async def running(settings: CoordinatorSettings, store: Store | None = None, model: Any = None,
                  close_store: bool = False) -> AsyncIterator[Running]:
    store = store if store is not None else InMemoryStore()
    model = model or build_server_model(settings.model.name, settings.model.hyperparameters)
    coord = Coordinator(settings, store=store, model=model)
    await coord.start()
    health = health_aio.HealthServicer()
    server, port = await build_server(coord, settings, health)
    admin, admin_port, admin_health = await build_admin_server(coord, settings)
    await server.start()
    await admin.start()
    await set_serving(health, True)
    rounds = asyncio.create_task(coord.run())
    try:
        yield Running(coord, f"127.0.0.1:{port}", f"127.0.0.1:{admin_port}", store, rounds)
    finally:
        await coord.shutdown("test over")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rounds, 10)
        await admin.stop(0.2)
        await server.stop(0.2)
        if close_store:
            store.close()


async def clients_for(target: str, n: int, *, seed: int = 0, silent_at: str | None = None,
                      groups: int = 1) -> tuple[list[FakeClient], list[FakeDevice]]:
    enrolled = await enroll(target, n, seed=seed)
    devices = [FakeDevice(d, seed=7, silent_at=silent_at, identity_key=k) for d, k in enrolled]
    clients = [FakeClient(target, devices[g::groups], name=f"client-{seed}-{g}") for g in range(groups)]
    for c in clients:
        await c.start()
    for c in clients:
        await asyncio.wait_for(c.welcome.wait(), 5)
    return clients, devices


async def until(predicate: Any, timeout: float = 10.0) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(loop(), timeout)


async def until_async(probe: Any, want: Any, timeout: float = 10.0) -> None:
    """Wait until `await probe()` returns `want`."""
    async def loop() -> None:
        while await probe() != want:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(loop(), timeout)


def admin_stub(channel: grpc.aio.Channel) -> admin_service_pb2_grpc.CoordinatorAdminAsyncStub:
    return admin_service_pb2_grpc.CoordinatorAdminStub(channel)


async def read_event(call: Any) -> A.AdminEvent:
    """The next event of a WatchEvents call (grpc.aio types read() as object)."""
    event = await call.read()
    assert isinstance(event, A.AdminEvent), event
    return event


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


# ---------------------------------------------------------------- credentials


def test_token_credentials_stay_on_their_own_listener(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(f"# the admin token\n{ADMIN_TOKEN}\n")
    settings = make_settings(**{"auth.mode": "token", "auth.token": DEVICE_TOKEN, "admin.auth": "token",
                                "admin.token_file": str(token_file)})

    async def main() -> None:
        async with running(settings) as r:
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                admin = admin_stub(ch)
                state = await admin.GetLiveState(A.GetLiveStateRequest(), metadata=bearer(ADMIN_TOKEN))
                assert state.model_name == "synthetic" and state.model_version == 1
                for md in ((), bearer(DEVICE_TOKEN), bearer(ADMIN_TOKEN + "x")):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await admin.GetLiveState(A.GetLiveStateRequest(), metadata=md)
                    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
                # rotation without a restart: the file is re-read when it changes
                new_token = "rotated-admin-token-" + "z" * 20
                token_file.write_text(f"{new_token}\n")
                await asyncio.sleep(1.1)

                async def code(token: str) -> grpc.StatusCode:
                    try:
                        await admin.GetLiveState(A.GetLiveStateRequest(), metadata=bearer(token))
                        return grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as exc:
                        return exc.code()

                await until_async(lambda: code(new_token), grpc.StatusCode.OK)
                assert await code(ADMIN_TOKEN) is grpc.StatusCode.UNAUTHENTICATED
                token_file.write_text(f"{new_token}\n{ADMIN_TOKEN}\n")  # back, for the device-listener checks
                await until_async(lambda: code(ADMIN_TOKEN), grpc.StatusCode.OK)
            async with grpc.aio.insecure_channel(r.target) as ch:
                device = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)
                request = enrollment_pb2.EnrollRequest(client_name="c", devices=[
                    enrollment_pb2.DeviceEnrollment(local_id="u-1", identity_public_key=b"\x01" * 32)])
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await device.Enroll(request, metadata=bearer(ADMIN_TOKEN))
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "admin credential" in (info.value.details() or "")
                signed = await enroll_keys(device, [identity_private(1)], metadata=bearer(DEVICE_TOKEN), local_ids=["u-1"])
                assert signed.devices[0].device_id >= 1
                # the device listener does not serve the admin service at all
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await admin_stub(ch).GetLiveState(A.GetLiveStateRequest(), metadata=bearer(DEVICE_TOKEN))
                assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED

    asyncio.run(main())


def test_mtls_admin_role_certificates(tmp_path: Path) -> None:
    from fedmask.certs import PkiLayout, init_pki, issue_admin

    init_pki(tmp_path / "pki", devices=1)
    layout = PkiLayout(tmp_path / "pki")
    admin_cert, admin_key = issue_admin(tmp_path / "pki", "ops")
    device_cert, device_key = layout.device(1)
    settings = make_settings(**{
        "tls.cert": str(layout.server_cert), "tls.key": str(layout.server_key),
        "tls.client_ca": str(layout.ca_cert), "tls.require_client_cert": True, "auth.mode": "mtls",
        "admin.auth": "mtls",
    })

    def creds(cert: Path, key: Path) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(layout.ca_cert.read_bytes(), key.read_bytes(), cert.read_bytes())

    async def main() -> None:
        async with running(settings) as r:
            opts = [("grpc.ssl_target_name_override", "localhost")]
            admin_target = r.admin_target.replace("127.0.0.1", "localhost")
            async with grpc.aio.secure_channel(admin_target, creds(admin_cert, admin_key), options=opts) as ch:
                state = await admin_stub(ch).GetLiveState(A.GetLiveStateRequest())
                assert state.model_version == 1
            async with grpc.aio.secure_channel(admin_target, creds(device_cert, device_key), options=opts) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await admin_stub(ch).GetLiveState(A.GetLiveStateRequest())
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
            target = r.target.replace("127.0.0.1", "localhost")
            request = enrollment_pb2.EnrollRequest(client_name="c", devices=[
                enrollment_pb2.DeviceEnrollment(local_id="u-1", identity_public_key=b"\x01" * 32)])
            async with grpc.aio.secure_channel(target, creds(admin_cert, admin_key), options=opts) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await coordinator_service_pb2_grpc.CoordinatorServiceStub(ch).Enroll(request)
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
            hello = S.ClientMessage(hello=S.Hello(client_name="c", protocol_version=PROTOCOL_VERSION,
                                                  available_device_ids=[1]))

            async def first_reply(channel: grpc.aio.Channel, *, write: bool = True) -> S.ServerMessage:
                # write=False sends nothing until the server has answered: a stream the guard refuses
                # at once then ends with the guard's status. A write racing that refusal can make
                # grpc.aio report INTERNAL ("Failed execute_batch") instead: a failed write overwrites the status.
                async def requests() -> AsyncIterator[S.ClientMessage]:
                    if not write:
                        await asyncio.sleep(30)
                    yield hello
                    await asyncio.sleep(5)

                call = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel).Session(requests())
                try:
                    reply = await asyncio.wait_for(call.read(), 10)
                finally:
                    call.cancel()
                assert isinstance(reply, S.ServerMessage), reply
                return reply

            async with grpc.aio.secure_channel(target, creds(device_cert, device_key), options=opts) as ch:
                response = await enroll_keys(coordinator_service_pb2_grpc.CoordinatorServiceStub(ch),
                                             [identity_private(1)], local_ids=["u-1"])
                assert response.devices[0].device_id >= 1
                first = await first_reply(ch)  # the Session stream goes through the guard too
                assert first.WhichOneof("message") == "challenge"  # possession proof asked for (D32)
            async with grpc.aio.secure_channel(target, creds(admin_cert, admin_key), options=opts) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await first_reply(ch, write=False)
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED

    asyncio.run(main())


def test_admin_settings_refuse_a_token_flag_source_mix_and_clear_tokens() -> None:
    from coordinator.settings import SettingsError

    with pytest.raises(SettingsError, match="exactly one of admin.token"):
        make_settings(**{"admin.auth": "token"})
    with pytest.raises(SettingsError, match="in clear"):
        make_settings(**{"admin.auth": "token", "admin.token": ADMIN_TOKEN, "admin.listen": "0.0.0.0:0",
                         "listen_address": "127.0.0.1:0"})
    with pytest.raises(SettingsError, match="loopback"):
        make_settings(**{"admin.listen": "0.0.0.0:0"})
    with pytest.raises(SettingsError, match="epsilon_budget needs DP noise"):
        make_settings(**{"dp.epsilon_budget": 5.0})
    with pytest.raises(SettingsError) as info:
        make_settings(**{"admin.auth": "token", "admin.token": "short"})
    assert "short" not in str(info.value)  # secrets are redacted in errors


# ---------------------------------------------------------------- live state, events


async def collect(call: Any, out: list[A.AdminEvent], stop: Any) -> None:
    async for event in call:
        out.append(event)
        if stop(out):
            return


def test_events_deliver_every_stage_in_order_and_live_state_follows() -> None:
    settings = make_settings(rounds=2)

    async def main() -> None:
        async with running(settings) as r:
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                admin = admin_stub(ch)
                events: list[A.AdminEvent] = []
                def enough(ev: list[A.AdminEvent]) -> bool:  # device counts are coalesced: they may come last
                    return (sum(e.WhichOneof("event") == "round_committed" for e in ev) == 2
                            and any(e.device_counts.connected == 3 for e in ev))

                watch = asyncio.create_task(collect(admin.WatchEvents(A.WatchEventsRequest()), events, enough))
                await until(lambda: bool(events))
                clients, devices = await clients_for(r.target, 3)
                await asyncio.wait_for(watch, 15)
                assert events[0].WhichOneof("event") == "snapshot"
                seqs = [e.sequence for e in events[1:]]
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gaps, in order
                assert events[0].sequence == seqs[0] - 1
                stages = [(e.stage_changed.round_number, A.RoundStage.Name(e.stage_changed.stage))
                          for e in events if e.WhichOneof("event") == "stage_changed"]
                order = [A.RoundStage.Name(STAGE[p.value]) for p in ROUND_STAGES] + ["ROUND_STAGE_AGGREGATING"]
                assert stages == [(1, s) for s in order] + [(2, s) for s in order]
                changed = [e.stage_changed for e in events if e.WhichOneof("event") == "stage_changed"]
                assert all(c.threshold == 2 and c.cohort_size == 3 for c in changed)
                closed = [c.closed for c in changed if c.HasField("closed")]
                assert [c.survivors for c in closed[:len(ROUND_STAGES)]] == [3] * len(ROUND_STAGES)
                done = [e.round_committed for e in events if e.WhichOneof("event") == "round_committed"]
                assert [(d.round_number, d.contributors, d.new_model_version) for d in done] == [(1, 3, 2), (2, 3, 3)]
                counts = [e.device_counts for e in events if e.WhichOneof("event") == "device_counts"]
                assert counts and counts[-1].connected == 3 and counts[-1].enrolled == 3
                await asyncio.wait_for(asyncio.shield(r.rounds), 5)
                state = await admin.GetLiveState(A.GetLiveStateRequest())
                assert (state.model_version, state.rounds_committed_since_start, state.paused) == (3, 2, False)
                assert not state.HasField("round") and state.devices.connected == 3
                assert state.last_event_sequence >= seqs[-1]
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_live_state_shows_the_open_stage_with_its_deadline_and_survivors() -> None:
    settings = make_settings(**{"deadlines.masked_input": 30.0})

    async def main() -> None:
        async with running(settings) as r:
            clients, _ = await clients_for(r.target, 3, silent_at="masked_input")
            await until(lambda: r.coord.round is not None and r.coord.round.phase.value == "masked_input")
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                state = await admin_stub(ch).GetLiveState(A.GetLiveStateRequest())
            live = state.round
            assert (live.number, A.RoundStage.Name(live.stage), live.cohort_size, live.threshold) == (
                1, "ROUND_STAGE_MASKED_INPUT", 3, 2)
            before = ROUND_STAGES[:ROUND_STAGES.index(RoundState.MASKED_INPUT)]
            assert [s.stage for s in live.stages] == [STAGE[p.value] for p in (*before, RoundState.MASKED_INPUT)]
            assert [s.survivors for s in live.stages[:len(before)]] == [3] * len(before)
            open_stage = live.stages[-1]
            assert open_stage.pending == 3 and open_stage.HasField("deadline")
            remaining = open_stage.deadline.ToDatetime().timestamp() - state.as_of.ToDatetime().timestamp()
            assert 20 < remaining <= 30.5
            assert live.stages[0].HasField("duration") and not open_stage.HasField("duration")
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_a_watcher_that_falls_behind_is_dropped_and_others_go_on() -> None:
    settings = make_settings(**{"admin.watcher_queue": 2})

    async def main() -> None:
        async with running(settings) as r:
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                admin = admin_stub(ch)
                slow = admin.WatchEvents(A.WatchEventsRequest())
                first = await read_event(slow)
                assert first.WhichOneof("event") == "snapshot"
                await until(lambda: r.coord.events.watchers == 1)
                hub = r.coord.events
                for i in range(3):  # in one step of the loop: the servicer cannot drain in between
                    hub.publish(federation_changed=A.FederationChanged(action=f"test-{i}"))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    while True:
                        await slow.read()
                assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert hub.dropped == 1 and hub.watchers == 0
                # a new watcher is served, and publishing never waited on the slow one
                again = admin.WatchEvents(A.WatchEventsRequest())
                assert (await read_event(again)).WhichOneof("event") == "snapshot"
                hub.publish(federation_changed=A.FederationChanged(action="after"))
                assert (await read_event(again)).federation_changed.action == "after"
                again.cancel()

    asyncio.run(main())


# ---------------------------------------------------------------- operator actions


def test_pause_resume_abort_and_rollback_are_applied_and_audited() -> None:
    settings = make_settings(**{"deadlines.masked_input": 30.0})

    async def main() -> None:
        async with running(settings) as r:
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                admin = admin_stub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await admin.AbortRound(A.OperatorRequest(operator="alice"))
                assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await admin.Pause(A.OperatorRequest(operator=""))
                assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                paused = await admin.Pause(A.OperatorRequest(operator="alice", reason="maintenance"))
                assert paused.changed and paused.state.paused
                assert not (await admin.Pause(A.OperatorRequest(operator="alice"))).changed
                clients, _ = await clients_for(r.target, 3, silent_at="masked_input")
                await asyncio.sleep(0.8)  # devices are eligible, but no round opens while paused
                assert r.coord.round is None and r.store.list_rounds().items == ()
                resumed = await admin.Resume(A.OperatorRequest(operator="bob"))
                assert resumed.changed and not resumed.state.paused
                await until(lambda: r.coord.round is not None and r.coord.round.phase.value == "masked_input")
                aborted = await admin.AbortRound(A.OperatorRequest(operator="bob", reason="stuck"))
                assert aborted.changed
                await until(lambda: (rec := r.store.get_round(1)) is not None and rec.state is RoundState.ABORTED)
                assert (rec := r.store.get_round(1)) is not None and rec.abort_reason == "cancelled"
                # the notices travel after the record is written: wait for them
                await until(lambda: all(common_pb2.ABORT_REASON_CANCELLED in d.aborted for c in clients
                                        for d in c.devices.values()))
                # pause again so the rollback is not raced by new rounds
                await admin.Pause(A.OperatorRequest(operator="bob"))
                current = r.coord.model_version
                assert current is not None
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await admin.Rollback(A.RollbackRequest(operator="carol", version=999))
                assert info.value.code() is grpc.StatusCode.NOT_FOUND
                rolled = await admin.Rollback(A.RollbackRequest(operator="carol", version=1, reason="bad model"))
                assert rolled.new_model_version == rolled.state.model_version and rolled.new_model_version > current
                new, old = r.store.get_model_version(rolled.new_model_version), r.store.get_model_version(1)
                assert new.parameters == old.parameters and new.hyperparameters["rollback_of"] == 1
                assert np.array_equal(r.coord.current.parameters["mean"], unpack_parameters(old.parameters)["mean"])
                audit = list(reversed(r.store.list_audit(limit=20).items))
                assert [(e.operator, e.action, e.outcome) for e in audit] == [
                    ("alice", "abort_round", "refused: no round is collecting"),
                    ("alice", "pause", "ok"),
                    ("alice", "pause", "ok: already paused"),
                    ("bob", "resume", "ok"),
                    ("bob", "abort_round", "ok"),
                    ("bob", "pause", "ok"),
                    ("carol", "rollback", "refused: no such version of this model"),
                    ("carol", "rollback", "ok"),
                ]
                assert audit[1].details == {"reason": "maintenance"}
                assert audit[-1].details == {"version": 1, "new_version": rolled.new_model_version,
                                             "reason": "bad model"}
                assert rolled.audit_id == audit[-1].id
            for c in clients:
                await c.close()

    asyncio.run(main())


@dataclass
class SlowStepModel(SyntheticModel):
    """The synthetic model whose server step takes a while (a commit in progress)."""

    def apply_mean(self, params: Any, mean: Any, step: int) -> Any:
        import time

        time.sleep(0.5)
        return super().apply_mean(params, mean, step)


def test_a_rollback_during_a_commit_waits_for_it_and_then_wins() -> None:
    settings = make_settings(rounds=1)

    async def main() -> None:
        async with running(settings, model=SlowStepModel(vector_length=L)) as r:
            clients, _ = await clients_for(r.target, 3)
            await until(lambda: r.coord.round is not None and r.coord.round.phase.value == "aggregating")
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                rolled = await admin_stub(ch).Rollback(A.RollbackRequest(operator="ops", version=1))
            committed = r.store.get_round(1)
            assert committed is not None and committed.state is RoundState.COMMITTED
            assert committed.base_model_version == 1
            versions = [v.id for v in r.store.list_model_versions().items]
            assert versions == [3, 2, 1] and rolled.new_model_version == 3 == r.coord.model_version
            assert r.store.get_model_version(3).parameters == r.store.get_model_version(1).parameters
            for c in clients:
                await c.close()

    asyncio.run(main())


# ---------------------------------------------------------------- top-k relay


def test_top_k_by_device_id_and_by_user_handle_with_every_error() -> None:
    settings = make_settings(**{"admin.top_k_timeout_s": 5.0})
    catalogue = {3: ("1003", "Toy Story (1995)"), 7: ("1007", ""), 1: ("1001", "GoldenEye (1995)")}
    refusing = silent = 0

    def answer(req: S.DeviceRequest) -> S.DeviceResponse | None:
        if req.device_id == refusing:
            return S.DeviceResponse(correlation_id=req.correlation_id, device_id=req.device_id,
                                    error=S.DeviceError(code=S.DEVICE_ERROR_CODE_REFUSED, message="no"))
        if req.device_id == silent:
            return None
        items = [3, 7, 1][: req.top_k.k]
        return S.DeviceResponse(correlation_id=req.correlation_id, device_id=req.device_id, top_k=S.TopKResult(
            item_ids=items, scores=[0.9, 0.5, 0.1][: len(items)], model_version=4,
            dataset_item_ids=[catalogue[i][0] for i in items], titles=[catalogue[i][1] for i in items]))

    async def main() -> None:
        nonlocal refusing, silent
        async with running(settings, model=CatalogueModel(vector_length=L, items=20)) as r:
            clients, devices = await clients_for(r.target, 3, seed=5)
            ok, refusing, silent = (d.device_id for d in devices)
            clients[0].on_device_request = answer
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                admin = admin_stub(ch)
                by_id = await admin.RecommendTopK(A.RecommendTopKRequest(device_id=ok, k=3, exclude_seen=True))
                assert [(i.item_id, i.title, i.rank, i.item_index) for i in by_id.items] == [
                    ("1003", "Toy Story (1995)", 1, 3), ("1007", "", 2, 7), ("1001", "GoldenEye (1995)", 3, 1)]
                # the device sent scores (as one built before D84 does): they go no further
                assert [i.score for i in by_id.items] == [0.0, 0.0, 0.0] and by_id.seen_excluded
                assert (by_id.device_id, by_id.user_handle, by_id.model_version) == (ok, "user-5-0", 4)
                assert len(by_id.recommendation_id) == 32 and by_id.latency.ToTimedelta().total_seconds() >= 0
                by_handle = await admin.RecommendTopK(A.RecommendTopKRequest(user_handle="user-5-0", k=2))
                assert [i.item_id for i in by_handle.items] == ["1003", "1007"]
                assert by_handle.recommendation_id != by_id.recommendation_id

                async def code_of(request: A.RecommendTopKRequest) -> tuple[grpc.StatusCode, Any]:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await admin.RecommendTopK(request)
                    return info.value.code(), info.value.trailing_metadata()

                unknown = A.RecommendTopKRequest(user_handle="nobody", k=3)
                assert (await code_of(unknown))[0] is grpc.StatusCode.UNAVAILABLE
                assert (await code_of(A.RecommendTopKRequest(device_id=999, k=3)))[0] is grpc.StatusCode.NOT_FOUND
                assert (await code_of(A.RecommendTopKRequest(device_id=ok, k=0)))[0] is grpc.StatusCode.INVALID_ARGUMENT
                assert (await code_of(A.RecommendTopKRequest(device_id=ok, k=21)))[0] is grpc.StatusCode.INVALID_ARGUMENT
                assert (await code_of(A.RecommendTopKRequest(k=3)))[0] is grpc.StatusCode.INVALID_ARGUMENT
                assert (await code_of(A.RecommendTopKRequest(device_id=refusing, k=3)))[0] is \
                    grpc.StatusCode.PERMISSION_DENIED
                short = A.RecommendTopKRequest(device_id=silent, k=3)
                short.timeout.FromMilliseconds(200)
                assert (await code_of(short))[0] is grpc.StatusCode.DEADLINE_EXCEEDED
                await clients[0].close()
                await until(lambda: r.coord.registry.owner(ok) is None)
                code, trailer = await code_of(A.RecommendTopKRequest(device_id=ok, k=3))
                assert code is grpc.StatusCode.UNAVAILABLE
                assert dict(trailer or ())["grpc-retry-pushback-ms"] == "2000"

                # an offline user's handle and an unknown one answer alike: status, details, retry hint (D84)
                async def failure(request: A.RecommendTopKRequest) -> tuple[Any, ...]:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await admin.RecommendTopK(request)
                    return info.value.code(), info.value.details(), dict(info.value.trailing_metadata() or ())

                offline = await failure(A.RecommendTopKRequest(user_handle="user-5-0", k=3))
                assert offline == await failure(unknown)
                assert offline[:2] == (grpc.StatusCode.UNAVAILABLE, "no connected device has this user handle")
                assert offline[2]["grpc-retry-pushback-ms"] == "2000"

    asyncio.run(main())


def test_a_taken_user_handle_is_refused_at_enrolment() -> None:
    settings = make_settings()

    async def main() -> None:
        async with running(settings) as r:
            async with grpc.aio.insecure_channel(r.target) as ch:
                stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)
                await enroll_keys(stub, [identity_private(1)], client_name="a", local_ids=["alice"])
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await enroll_keys(stub, [identity_private(2)], client_name="b", local_ids=["alice"])
                assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "user handle" in (info.value.details() or "")

    asyncio.run(main())


# ---------------------------------------------------------------- epsilon budget


def test_the_epsilon_budget_stops_the_federation_at_the_right_round_also_after_a_restart(tmp_path: Path) -> None:
    from models.privacy import composed_epsilon

    after = [composed_epsilon([(1.0, 1.0)] * n, delta=1e-5) for n in (1, 2, 3)]
    budget = (after[1] + after[2]) / 2  # two rounds fit, a third would exceed it
    url = f"sqlite:///{tmp_path / 'fedmask.db'}"
    settings = make_settings(**{"database_url": url, "dp.mode": "local", "dp.noise_multiplier": 1.0,
                                "dp.epsilon_budget": budget})

    async def main() -> None:
        async with running(settings, store=open_store(url), close_store=True) as r:
            clients, _ = await clients_for(r.target, 3)
            await until(lambda: r.coord.budget_exhausted and r.coord.outcomes.rounds_aborted == 1)
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                state = await admin_stub(ch).GetLiveState(A.GetLiveStateRequest())
            assert state.budget_exhausted and state.privacy.exhausted
            assert state.privacy.epsilon_spent == pytest.approx(after[1])
            assert state.privacy.epsilon_budget == pytest.approx(budget)
            rounds = sorted(r.store.list_rounds().items, key=lambda x: x.number)
            assert [(x.state, x.abort_reason) for x in rounds] == [
                (RoundState.COMMITTED, None), (RoundState.COMMITTED, None), (RoundState.ABORTED, "budget_exhausted")]
            assert [round(e.cumulative_epsilon, 6) for e in r.store.privacy_ledger()] == [
                round(a, 6) for a in after[:2]]
            for c in clients:
                await c.close()
        # a restart on the same database: exhausted at once, no round opens
        async with running(settings, store=open_store(url), close_store=True) as r:
            assert r.coord.budget_exhausted
            events: list[A.AdminEvent] = []
            async with grpc.aio.insecure_channel(r.admin_target) as ch:
                call = admin_stub(ch).WatchEvents(A.WatchEventsRequest())
                events.append(await read_event(call))
                clients, _ = await clients_for(r.target, 3, seed=1)
                await asyncio.sleep(1.0)
                call.cancel()
            assert events[0].snapshot.budget_exhausted
            assert r.coord.round is None and r.coord.rounds_run == 0
            assert len(r.store.list_rounds().items) == 3  # no new record either
            for c in clients:
                await c.close()

    asyncio.run(main())


# ---------------------------------------------------------------- metrics


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_prometheus_metrics_are_scraped_after_real_rounds() -> None:
    settings = make_settings(rounds=2, **{"metrics.listen": "127.0.0.1:0"})

    async def main() -> None:
        async with running(settings) as r:
            httpd, port = start_metrics_server(r.coord.metrics, "127.0.0.1:0")
            try:
                clients, _ = await clients_for(r.target, 3)
                await asyncio.wait_for(asyncio.shield(r.rounds), 15)
                await asyncio.sleep(COUNTS_SETTLE)
                m = await asyncio.to_thread(scrape, port)
                assert m[("fedmask_rounds_total", (("outcome", "committed"),))] == 2
                assert m[("fedmask_round_duration_seconds_count", ())] == 2
                assert m[("fedmask_stage_duration_seconds_count", (("stage", "masked_input"),))] == 2
                assert m[("fedmask_connected_devices", ())] == 3
                assert m[("fedmask_enrolled_devices", ())] == 3
                assert m[("fedmask_update_bytes_total", ())] > 2 * 3 * L * 4
                assert m[("fedmask_live_round_threshold", ())] == 0  # no round runs now
                assert m[("fedmask_epsilon_budget", ())] == 0
                labels = {k for (_, pairs) in m for k, _ in pairs}
                assert labels <= {"outcome", "stage", "reason", "status", "le"}  # never a device or a user
                for c in clients:
                    await c.close()
            finally:
                httpd.shutdown()
                httpd.server_close()

    asyncio.run(main())


COUNTS_SETTLE = 0.4
