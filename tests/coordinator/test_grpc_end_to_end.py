"""The coordinator over real gRPC on 127.0.0.1, with fake edge clients
written only with the stubs, secagg and wire."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any, ClassVar

import grpc
import numpy as np
import pytest
from grpc_health.v1.health import aio as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.debug import encoded_checksum
from coordinator.model_host import build_server_model
from coordinator.server import build_server, set_serving
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import InMemoryStore, RoundRecord, RoundState, open_store
from coordinator.store.blobs import unpack_parameters
from fedmask_proto.v1 import common_pb2, coordinator_service_pb2_grpc, enrollment_pb2, secagg_pb2, session_pb2
from wire import RoundTaskView

from wire import secagg_config_from_proto
from wire.round_metrics import SLOTS, MetricLayout

from coordinator_fakes import FakeClient, FakeDevice, enroll, fake_metric_values

P = common_pb2
L = 16


SHORT = {f"deadlines.{k}": 0.8 for k in ("advertise_keys", "share_keys", "share_check", "masked_input", "unmasking")}
SHORT["deadlines.training"] = 0.2


def make_settings(**over):
    base = {
        "listen_address": "127.0.0.1:0",
        "database_url": "memory://",
        "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": L},
        "cohort.size": 4,
        "cohort.minimum": 3,
        "cohort.over_selection": 0.0,
        "cohort.allow_consecutive": True,
        "deadlines.selection": 0.3,
        # Stages close as soon as every device answered: generous deadlines
        # cost nothing unless a device is silent (then use SHORT, below).
        "deadlines.training": 5.0,
        "deadlines.advertise_keys": 5.0,
        "deadlines.share_keys": 5.0,
        "deadlines.share_check": 5.0,
        "deadlines.masked_input": 5.0,
        "deadlines.consistency_check": 5.0,
        "deadlines.unmasking": 5.0,
        "dp.mode": "none",
        "secagg.graph": "full",
        "secagg.threshold": "majority",
        "debug.record_sums": True,
        "seed": 3,
        "rounds": 1,
    }
    base.update(over)
    return CoordinatorSettings.load(overrides=base)


@contextlib.asynccontextmanager
async def running(settings, store=None):
    store = store or InMemoryStore()
    model = build_server_model(settings.model.name, settings.model.hyperparameters)
    coord = Coordinator(settings, store=store, model=model)
    await coord.start()
    health = health_aio.HealthServicer()
    server, port = await build_server(coord, settings, health)
    await server.start()
    await set_serving(health, True)
    rounds = asyncio.create_task(coord.run())
    try:
        yield coord, f"127.0.0.1:{port}", store, rounds
    finally:
        await coord.shutdown("test over")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rounds, 10)
        await server.stop(0.5)


async def _clients(target, n, groups=2, silent=None, tamper=None, seed=0, metric_limbs=None):
    enrolled = await enroll(target, n, seed=seed)
    devices = [FakeDevice(d, seed=7, silent_at=(silent or {}).get(i), tamper=tamper, identity_key=k,
                          metric_limbs=(metric_limbs or {}).get(i)) for i, (d, k) in enumerate(enrolled)]
    clients = [FakeClient(target, devices[g::groups], name=f"client-{g}") for g in range(groups)]
    for c in clients:
        await c.start()
    for c in clients:
        await asyncio.wait_for(c.welcome.wait(), 5)
    return clients, devices


async def _wait_rounds(rounds_task, timeout=15):
    await asyncio.wait_for(asyncio.shield(rounds_task), timeout)


def test_secure_round_over_grpc_is_exact():
    async def main():
        settings = make_settings(rounds=2)
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 5, groups=2)
            await _wait_rounds(rounds)
            page = store.list_rounds()
            assert [r.state for r in page.items] == [RoundState.COMMITTED, RoundState.COMMITTED]
            for rec in page.items:
                counted = [d for d in devices if d.device_id in rec.survivors["masked_input"]]
                assert len(counted) == 4
                enc = np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64).astype(np.uint32)
                # devices are reseeded per round: recompute this round's encoded inputs
                assert rec.metrics["debug.counted"] == 4
                # the metric totals come out of the secure sum: one "devices" per counted device
                assert rec.metrics["contributors"] == 4 and rec.metrics["count.devices"] == 4
                assert rec.dropouts == {}
                del enc
            last = page.items[0]
            counted = [d for d in devices if d.device_id in last.survivors["masked_input"]]
            enc = np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64).astype(np.uint32)
            assert last.metrics["debug.encoded_checksum"] == encoded_checksum(enc)
            version = store.latest_model_version("synthetic")
            mean = unpack_parameters(version.parameters)["mean"]
            want = np.mean([d.update for d in counted], axis=0)
            assert np.allclose(mean, want, atol=1e-5)
            assert version.hyperparameters["step"] == 2
            await asyncio.wait_for(_until(lambda: all(len(c.committed) == 2 for c in clients)), 5)
            committed = [m for c in clients for m in c.committed]
            assert {m.round_number for m in committed} == {1, 2} and all(m.contributors == 4 for m in committed)
            for c in clients:
                await c.close()

    asyncio.run(main())


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "share_check", "masked_input", "unmasking"])
def test_a_device_drops_at_each_stage(stage):
    async def main():
        settings = make_settings(**{"cohort.size": 5, **SHORT})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 5, groups=2, silent={1: stage})
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED, rec
            late = devices[1]
            assert rec.dropouts == {stage: [late.device_id]}
            assert P.ABORT_REASON_DEADLINE_MISSED in late.aborted
            counted = [d for d in devices if d.device_id in rec.survivors["masked_input"]]
            assert (late in counted) == (stage == "unmasking")
            enc = np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64).astype(np.uint32)
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(enc)
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_too_few_survivors_aborts_and_the_next_round_runs():
    async def main():
        settings = make_settings(rounds=2, **{"cohort.size": 3, "cohort.pause": 0.5, **SHORT})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 3, groups=1, silent={0: "share_keys", 1: "share_keys"})
            await asyncio.wait_for(_until(lambda: store.get_round(1) is not None and store.get_round(1).state.is_terminal), 10)
            assert store.get_round(1).abort_reason == "too_few_survivors"
            # the two silent devices recover for round 2
            for d in devices:
                d.silent_at = None
            await _wait_rounds(rounds)
            assert store.get_round(2).state is RoundState.COMMITTED
            for c in clients:
                await c.close()

    asyncio.run(main())


async def _until(pred, step=0.02):
    while not pred():
        await asyncio.sleep(step)


def test_bad_inputs_drop_the_device_and_the_round_goes_on():
    def tamper(device_id, p):
        if isinstance(p, secagg_pb2.MaskedInput) and device_id == tamper.victim:
            p.masked_vector = p.masked_vector[:-4]
        return p

    async def main():
        settings = make_settings(**{"cohort.size": 5})
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 5)
            tamper.victim = enrolled[2][0]
            devices = [FakeDevice(d, seed=7, tamper=tamper, identity_key=k) for d, k in enrolled]
            client = FakeClient(target, devices)
            await client.start()
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED
            assert rec.dropouts == {"masked_input": [tamper.victim]}
            assert devices[2].aborted == [P.ABORT_REASON_PROTOCOL_VIOLATION]
            await client.close()

    asyncio.run(main())


def test_stream_contract_violations_get_clear_statuses():
    async def main():
        settings = make_settings(rounds=None)
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 2)
            async with grpc.aio.insecure_channel(target) as ch:
                stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)

                async def one(*msgs):
                    async def gen():
                        for m in msgs:
                            yield m
                        await asyncio.sleep(0.3)

                    call = stub.Session(gen())
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        async for _ in call:
                            pass
                    return info.value

                hb = session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=1))
                hello = session_pb2.ClientMessage(hello=session_pb2.Hello(client_name="x", available_device_ids=[enrolled[0][0]]))
                err = await one(hb)
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "hello" in err.details()
                no_proof = session_pb2.ClientMessage(proof=session_pb2.DeviceProofs())  # proves nothing
                err = await one(hello, hb)  # the challenge must be answered first
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "proof" in err.details()
                err = await one(hello, no_proof, session_pb2.ClientMessage())
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "empty" in err.details()
                err = await one(hello, no_proof, no_proof)
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "SessionChallenge" in err.details()
                foreign = session_pb2.ClientMessage(advertise_keys=secagg_pb2.AdvertiseKeys(device_id=enrolled[1][0]))
                err = await one(hello, no_proof, foreign)
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "not hosted" in err.details()
                # Garbage bytes: grpc refuses to deserialize; the coordinator never sees them.
                raw = ch.stream_stream("/fedmask.v1.CoordinatorService/Session",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)

                async def garbage():
                    yield b"\xff\xff\xff\xff garbage"

                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in raw(garbage()):
                        pass
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in info.value.details()
                # Oversized message: refused by the transport.
                huge = session_pb2.ClientMessage(masked_input=secagg_pb2.MaskedInput(masked_vector=b"\0" * (6 << 20)))
                err = await one(hello, no_proof, huge)
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                # Enrolment errors.
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Enroll(enrollment_pb2.EnrollRequest(devices=[
                        enrollment_pb2.DeviceEnrollment(local_id="a", identity_public_key=b"short")]))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                again = await enroll(target, 2)  # idempotent per identity key
                assert [d for d, _ in again] == [d for d, _ in enrolled]
                # Health and reflection.
                h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="fedmask.v1.CoordinatorService"))
                assert h.status == health_pb2.HealthCheckResponse.SERVING
            assert not rounds.done()  # nothing above crashed the round loop

    asyncio.run(main())


def test_displacement_and_welcome_admission():
    async def main():
        settings = make_settings(rounds=None)
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 2)
            ids = [d for d, _ in enrolled]
            key0 = enrolled[0][1]
            old = FakeClient(target, [FakeDevice(ids[0], identity_key=key0)], name="old")
            await old.start()
            await asyncio.wait_for(old.welcome.wait(), 5)
            new = FakeClient(target, [FakeDevice(ids[0], identity_key=key0), FakeDevice(999_999)], name="new")
            await new.start()
            await asyncio.wait_for(new.welcome.wait(), 5)
            welcome = new.received[1].welcome
            assert list(welcome.admission.accepted_device_ids) == [ids[0]]
            assert welcome.admission.rejected[0].reason == session_pb2.DEVICE_REJECTION_REASON_UNKNOWN_DEVICE
            await asyncio.wait_for(_until(lambda: old.status is not None), 5)
            assert old.status == grpc.StatusCode.ABORTED and "displaced" in old.details
            await new.close()

    asyncio.run(main())


def test_shutdown_aborts_the_running_round_and_tells_clients():
    async def main():
        settings = make_settings(rounds=None, **{"deadlines.masked_input": 30.0})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 4, groups=1, silent={0: "masked_input"})
            await asyncio.wait_for(_until(lambda: coord.round is not None and coord.round.phase.value == "masked_input"), 10)
            await coord.shutdown("test shutdown", retry_after=1.0)
            await asyncio.wait_for(rounds, 10)
            rec = store.get_round(1)
            assert rec.state is RoundState.ABORTED and rec.abort_reason == "coordinator_shutdown"
            c = clients[0]
            await asyncio.wait_for(_until(lambda: c.status is not None), 5)
            assert c.status == grpc.StatusCode.OK
            kinds = [m.WhichOneof("message") for m in c.received]
            assert "shutdown" in kinds
            assert any(P.ABORT_REASON_COORDINATOR_SHUTDOWN in d.aborted for d in devices[1:])

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_crash_recovery_resumes_from_the_latest_version(backend, tmp_path):
    async def main():
        store = InMemoryStore() if backend == "memory" else open_store(f"sqlite:///{tmp_path / 'c.db'}")
        settings = make_settings()
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 4, groups=1)
            await _wait_rounds(rounds)
            for c in clients:
                await c.close()
        v1 = store.latest_model_version("synthetic")
        # A crash mid-round leaves a non-terminal round behind.
        store.save_round_progress(RoundRecord(number=2, state=RoundState.SHARE_KEYS, started_at=datetime.now(UTC), cohort_size=4))
        async with running(make_settings(rounds=None), store) as (coord, target, _, rounds):
            assert store.get_round(2).state is RoundState.ABORTED
            assert store.get_round(2).abort_reason == "coordinator_restart"
            assert coord.model_version == v1.id and coord.current.step == 1
            assert store.next_round_number() == 3
        store.close()

    asyncio.run(main())


def test_token_auth_and_heartbeats():
    async def main():
        token = "t" * 24
        settings = make_settings(rounds=None, **{"auth.mode": "token", "auth.token": token})
        async with running(settings) as (coord, target, store, rounds):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await enroll(target, 1)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            md = (("authorization", "Bearer " + token),)
            enrolled = await enroll(target, 1, metadata=md)
            c = FakeClient(target, [FakeDevice(enrolled[0][0], identity_key=enrolled[0][1])], metadata=md)
            await c.start()
            await asyncio.wait_for(c.welcome.wait(), 5)
            c.send(session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=9)))
            await asyncio.wait_for(_until(lambda: any(m.WhichOneof("message") == "heartbeat" for m in c.received)), 5)
            echo = [m.heartbeat for m in c.received if m.WhichOneof("message") == "heartbeat"][0]
            assert echo.sequence == 9 and echo.sent_at.seconds > 0
            await c.close()

    asyncio.run(main())


def test_a_real_model_round_with_dp_commits_model_and_privacy_in_one_go():
    async def main():
        hp = {"n_users": 8, "n_items": 5, "k": 2}
        settings = make_settings(**{
            "model.name": "fedmf", "model.hyperparameters": hp, "dp.mode": "local", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 1.0,
            "dp.clip": 0.1, "debug.record_sums": False,
        })
        async with running(settings) as (coord, target, store, rounds):
            base = unpack_parameters(store.latest_model_version("fedmf").parameters)
            clients, devices = await _clients(target, 4, groups=1)
            task = await asyncio.wait_for(_until(lambda: clients[0].tasks), 10)
            del task
            t = clients[0].tasks[0]
            assert t.dp.mode == session_pb2.DP_MODE_LOCAL and t.dp.noise_stddev == pytest.approx(0.1)
            names = ("devices", "examples", "update_norm", "val_sampled_hits@10", "val_sampled_ndcg@10",
                     "val_sampled_count", "clipped")
            layout = MetricLayout.for_round(names, secagg_config_from_proto(t.secagg, t.session_id).encoding)
            assert tuple(t.metric_names) == names
            assert '"round_idx": 0' in t.hyperparameters_json and t.secagg.vector_length == 10 + layout.coordinates
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED
            # the metric totals: exactly the devices' own values summed (the fakes' values, in slot units)
            values = [fake_metric_values(d.device_id, 1) for d in devices]
            for name in names:
                slot = SLOTS[name]
                total = sum(slot.units(v[name]) for v in values)
                key = f"count.{name}" if slot.is_count else f"sum.{name}"
                assert rec.metrics[key] == pytest.approx(total * slot.unit, abs=1e-9), name
            hits = sum(v["val_sampled_hits@10"] for v in values)
            assert rec.metrics["val_hr@10"] == pytest.approx(hits / 4)
            v = store.latest_model_version("fedmf")
            assert v.round_number == 1 and v.hyperparameters["step"] == 1
            mean = np.mean([d.update for d in devices], axis=0).astype(np.float32)
            want = coord.model.apply_mean(base, mean, 0)  # the model's own server step
            got = unpack_parameters(v.parameters)
            assert set(got) == set(want) and all(np.allclose(got[k], want[k], atol=1e-4) for k in want)
            assert not all(np.allclose(got[k], base[k]) for k in want)
            (entry,) = store.privacy_ledger()
            assert entry.round_number == 1 and entry.sampling_rate == 1.0 and entry.epsilon > 0
            for c in clients:
                await c.close()

    asyncio.run(main())


class FlakyStore(InMemoryStore):
    """Fails the first commit (a database hiccup)."""

    failed = False

    def commit_round(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            from coordinator.store import StoreError

            raise StoreError("database went away")
        return super().commit_round(*args, **kwargs)


def test_a_failed_commit_aborts_the_round_and_the_next_one_commits():
    """The failed commit came after unmasking: its cohort's devices spent their
    contribution to this model version (D85), so the next round on the same
    version commits with the other devices (8 devices, cohorts of 4)."""
    async def main():
        store = FlakyStore()
        v0 = None
        async with running(make_settings(rounds=2), store) as (coord, target, _, rounds):
            v0 = coord.model_version
            clients, devices = await _clients(target, 8, groups=1)
            await _wait_rounds(rounds)
            first, second = store.get_round(1), store.get_round(2)
            assert first.state is RoundState.ABORTED and first.abort_reason == "cancelled"
            assert second.state is RoundState.COMMITTED
            assert len(first.survivors["unmasking"]) == 4 and first.base_model_version == second.base_model_version
            assert not set(first.survivors["unmasking"]) & set(second.survivors["selected"])
            assert store.latest_model_version("synthetic").id != v0
            assert store.latest_model_version("synthetic").hyperparameters["step"] == 1
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_check_in_replaces_the_available_set():
    async def main():
        async with running(make_settings(rounds=None, **{"cohort.minimum": 3, "cohort.size": 3})) as (coord, target, store, rounds):
            enrolled = await enroll(target, 2)
            ids = [d for d, _ in enrolled]
            c = FakeClient(target, [FakeDevice(d, identity_key=k) for d, k in enrolled])
            await c.start()
            await asyncio.wait_for(c.welcome.wait(), 5)
            assert coord.eligible() == ids
            c.send(session_pb2.ClientMessage(check_in=session_pb2.CheckIn(available_device_ids=[ids[1], 424242])))
            await asyncio.wait_for(_until(lambda: any(m.WhichOneof("message") == "check_in_ack" for m in c.received)), 5)
            ack = [m.check_in_ack for m in c.received if m.WhichOneof("message") == "check_in_ack"][0]
            assert list(ack.accepted_device_ids) == [ids[1]] and ack.rejected[0].device_id == 424242
            assert coord.eligible() == [ids[1]]
            assert store.get_round(1) is None  # 1 eligible < minimum 3: no round started
            await c.close()

    asyncio.run(main())


def test_distributed_dp_accounts_for_the_noise_the_dropouts_took_away():
    """Distributed noise: each of the 5 selected devices adds N(0, (z tau)^2 / 5);
    one drops before its masked input, so the sum carries 4/5 of the variance
    and the round must be accounted at z * sqrt(4/5), not z."""
    async def main():
        from models.privacy import composed_epsilon, epsilon

        settings = make_settings(**{"cohort.size": 5, "dp.mode": "distributed", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 1.0,
                                    "dp.clip": 0.1, **SHORT})
        store = InMemoryStore()
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 5, groups=2, silent={1: "masked_input"})
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED and rec.dropouts == {"masked_input": [devices[1].device_id]}
            t = next(t for c in clients for t in c.tasks)
            assert t.dp.mode == session_pb2.DP_MODE_DISTRIBUTED and t.dp.noise_stddev == pytest.approx(0.1 / 5**0.5)
            (entry,) = store.privacy_ledger()
            assert entry.noise_multiplier == pytest.approx((4 / 5) ** 0.5)
            assert entry.epsilon == pytest.approx(composed_epsilon([(entry.noise_multiplier, 1.0)]))
            assert entry.epsilon > epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=1) * 1.05
            assert entry.cumulative_epsilon == pytest.approx(entry.epsilon)
            for c in clients:
                await c.close()
        # a restarted coordinator rebuilds the composition from the ledger and extends it
        async with running(make_settings(**{"cohort.size": 5, "dp.mode": "distributed", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 1.0,
                                            "dp.clip": 0.1}), store) as (coord, target, _, rounds):
            clients, _devices = await _clients(target, 5, groups=1, seed=1)
            await _wait_rounds(rounds)
            first, second = store.privacy_ledger()
            assert second.round_number == 2 and second.noise_multiplier == pytest.approx(1.0)  # no dropout
            want = composed_epsilon([(e.noise_multiplier, e.sampling_rate) for e in (first, second)])
            assert second.cumulative_epsilon == pytest.approx(want)
            assert first.epsilon < second.cumulative_epsilon < first.epsilon + second.epsilon
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_protocol_versions_served_and_refused_with_advice():
    """The rule of wire/protocol.py over gRPC: the current version and an
    empty one are served; an older or newer one is refused at Hello with
    FAILED_PRECONDITION and a message that says which side to upgrade."""
    from wire.protocol import PROTOCOL_VERSION

    async def main():
        settings = make_settings(rounds=None)
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 1)
            async with grpc.aio.insecure_channel(target) as ch:
                stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)

                async def hello(version: str) -> session_pb2.ServerMessage | grpc.aio.AioRpcError:
                    async def gen():
                        yield session_pb2.ClientMessage(hello=session_pb2.Hello(
                            client_name="v", protocol_version=version, available_device_ids=[enrolled[0][0]]))
                        await asyncio.sleep(0.3)

                    try:
                        async for first in stub.Session(gen()):
                            return first
                    except grpc.aio.AioRpcError as err:
                        return err
                    raise AssertionError("stream ended without an answer")

                for served in (PROTOCOL_VERSION, ""):
                    got = await hello(served)  # answered by the challenge (fedmask.v1.1), then the Welcome
                    assert isinstance(got, session_pb2.ServerMessage) and len(got.challenge.nonce) == 32
                v1_0 = await hello("fedmask.v1")  # cannot prove possession: told to upgrade
                assert isinstance(v1_0, grpc.aio.AioRpcError)
                assert v1_0.code() == grpc.StatusCode.FAILED_PRECONDITION and "upgrade the edge client" in v1_0.details()
                old = await hello("fedmask.v0")
                assert isinstance(old, grpc.aio.AioRpcError)
                assert old.code() == grpc.StatusCode.FAILED_PRECONDITION and "upgrade the edge client" in old.details()
                new = await hello("fedmask.v2.1")
                assert isinstance(new, grpc.aio.AioRpcError) and "upgrade the coordinator" in new.details()
                junk = await hello("x" * 10_000)
                assert isinstance(junk, grpc.aio.AioRpcError) and len(junk.details()) < 300
            assert not rounds.done()

    asyncio.run(main())


def test_hostile_metric_coordinates_cost_the_metrics_never_the_round():
    """A device puts negative / huge values in its metric
    coordinates (all bits set: -1 as an int32, 2^32 - 1 as a uint32). The
    round commits, the model aggregate is exactly the counted devices' sum,
    and the round's metrics are marked unavailable instead of being wrong."""
    async def main():
        settings = make_settings(**{"cohort.size": 4, "dp.mode": "local", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 1.0, "dp.clip": 0.1})
        store = InMemoryStore()
        async with running(settings, store) as (coord, target, _, rounds):
            hostile = {2: lambda view: np.full(view.metrics.coordinates, 0xFFFFFFFF, dtype=np.uint32)}
            clients, devices = await _clients(target, 4, groups=2, metric_limbs=hostile)
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED
            assert sorted(rec.survivors["masked_input"]) == sorted(d.device_id for d in devices)
            enc = np.sum([d.encoded for d in devices], axis=0, dtype=np.uint64).astype(np.uint32)
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(enc)
            mean = unpack_parameters(store.latest_model_version("synthetic").parameters)["mean"]
            assert np.allclose(mean, np.mean([d.update for d in devices], axis=0), atol=1e-5)
            assert rec.metrics["metrics_unavailable"] == 1.0
            assert not [k for k in rec.metrics if k.startswith(("count.", "sum.", "val_"))]
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_a_client_still_sending_round_metrics_is_refused():
    """RoundMetrics (ClientMessage field 20, per-client sums in the clear) was
    removed in fedmask.v1.1: a stream that still sends one is ended."""
    async def main():
        settings = make_settings(**{"cohort.size": 10, "cohort.minimum": 10})  # no round: only the refusal is tested
        async with running(settings) as (coord, target, store, rounds):
            clients, _devices = await _clients(target, 3, groups=1)
            entry = b"\x0a\x07devices\x10\x01"  # counts {"devices": 1}
            body = b"\x1a\x01\x01" + b"\x2a" + bytes([len(entry)]) + entry  # device_ids [1], counts
            legacy = session_pb2.ClientMessage.FromString(b"\xa2\x01" + bytes([len(body)]) + body)
            assert legacy.WhichOneof("message") is None and legacy.ByteSize() == len(body) + 3
            clients[0].send(legacy)
            await asyncio.wait_for(_until(lambda: clients[0].status is not None), 5)
            assert clients[0].status not in (None, grpc.StatusCode.OK)
            assert "does not accept" in clients[0].details
            await clients[0].close()

    asyncio.run(main())


def test_idle_enrolments_do_not_lower_the_reported_epsilon():
    """Issue: q was cohort / enrolled devices, so enrolling thousands of
    devices that never connect drove epsilon down while the same devices
    took part in every round. Rounds are now accounted without amplification
    (q = 1, D28): the ledger is the same with or without idle enrolments."""
    async def main():
        from models.privacy import composed_epsilon

        ledgers = []
        for idle in (0, 3000):
            settings = make_settings(**{"cohort.size": 4, "dp.mode": "local", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 1.0,
                                        "dp.clip": 0.1, "rounds": 2})
            store = InMemoryStore()
            async with running(settings, store) as (coord, target, _, rounds):
                if idle:
                    await enroll(target, idle, seed=99)
                clients, _devices = await _clients(target, 4, groups=2)
                await _wait_rounds(rounds)
                ledgers.append(store.privacy_ledger())
                for c in clients:
                    await c.close()
        for ledger in ledgers:
            assert [e.sampling_rate for e in ledger] == [1.0, 1.0]
            assert ledger[-1].cumulative_epsilon == pytest.approx(composed_epsilon([(1.0, 1.0)] * 2))
        assert ledgers[0][-1].cumulative_epsilon == pytest.approx(ledgers[1][-1].cumulative_epsilon)

    asyncio.run(main())


def test_an_operator_revokes_a_device_while_the_federation_runs(tmp_path):
    """`fedmask devices revoke` writes the store; the running coordinator
    applies it within half a heartbeat interval: the device is no longer
    selected or counted, and its next Hello is refused as REVOKED."""
    from typer.testing import CliRunner

    from fedmask.cli import app

    def committed_after(store, number: int) -> list[RoundRecord]:
        return [r for r in store.list_rounds(limit=50).items if r.number > number and r.state is RoundState.COMMITTED]

    async def until(condition, what: str, timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def main():
        url = f"sqlite:///{tmp_path / 'c.db'}"
        # rounds run back to back, so every stream keeps talking (the fake
        # clients send no heartbeats; 3 silent intervals end a stream)
        settings = make_settings(**{"database_url": url, "cohort.size": 3, "cohort.minimum": 3, "rounds": None,
                                    "heartbeat_interval": 2.0})
        store = open_store(url)
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 4, groups=2)
            victim = devices[1].device_id
            await until(lambda: committed_after(store, 0), "a first committed round")
            out = await asyncio.to_thread(CliRunner().invoke, app, ["devices", "revoke", str(victim),
                                                                     "--database-url", url])
            assert out.exit_code == 0 and "revoked" in out.output
            await until(lambda: coord.registry.is_revoked(victim) and coord.registry.owner(victim) is None,
                        "the coordinator to apply the revocation")
            seen = max(r.number for r in store.list_rounds(limit=50).items)
            await until(lambda: committed_after(store, seen + 1), "a round selected after the revocation")
            later = [r for r in store.list_rounds(limit=50).items if r.number > seen + 1]
            assert later and all(victim not in r.survivors.get("selected", []) for r in later)
            again = FakeClient(target, [devices[1]], name="again")
            await again.start()
            await asyncio.wait_for(again.welcome.wait(), 5)
            welcome = next(m.welcome for m in again.received if m.WhichOneof("message") == "welcome")
            assert [r.device_id for r in welcome.admission.rejected] == [victim]
            assert welcome.admission.rejected[0].reason == session_pb2.DEVICE_REJECTION_REASON_REVOKED
            for c in [*clients, again]:
                await c.close()
        store.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_tokens_rotate_without_a_restart(tmp_path):
    """auth.token_file: the coordinator re-reads it when it changes, so an
    operator adds the new token, moves the clients, then removes the old one."""
    from coordinator.auth import bearer_metadata

    old, new = "o" * 24, "n" * 24
    path = tmp_path / "tokens"
    path.write_text(f"# accepted bearer tokens\n{old}\n")

    async def accepted(target: str, token: str) -> bool:
        try:
            await enroll(target, 1, seed=len(token) + ord(token[0]), metadata=bearer_metadata(token))
            return True
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            return False

    async def main():
        settings = make_settings(**{"auth.mode": "token", "auth.token_file": str(path), "rounds": None})
        async with running(settings) as (coord, target, store, rounds):
            assert await accepted(target, old) and not await accepted(target, new)
            path.write_text(f"{old}\n{new}\n")
            await asyncio.sleep(1.1)
            assert await accepted(target, old) and await accepted(target, new)
            path.write_text(f"{new}\n")
            await asyncio.sleep(1.1)
            assert not await accepted(target, old) and await accepted(target, new)
            path.write_text("too-short\n")  # a bad rewrite keeps the last good set
            await asyncio.sleep(1.1)
            assert await accepted(target, new)
            assert not rounds.done()

    asyncio.run(main())


class RecordingDevice(FakeDevice):
    """A FakeDevice that keeps every round's encoded input: (round, device) -> input."""

    encoded_inputs: ClassVar[dict[tuple[int, int], np.ndarray]] = {}

    def on_task(self, view: RoundTaskView) -> list[Any]:
        out = super().on_task(view)
        if self.encoded is not None:
            RecordingDevice.encoded_inputs[(view.round_number, self.device_id)] = self.encoded
        return out


def test_a_device_sealing_garbage_costs_only_itself_and_then_sits_out():
    """Over real gRPC: a device whose ShareKeys carry random
    ciphertexts is reported at the share check, left out of the masking,
    and every round still commits with the honest devices' exact sum; after
    reports from several peers in two rounds it is not selected again."""
    rng = np.random.default_rng(3)

    def garble(device_id, p):
        if isinstance(p, secagg_pb2.ShareKeys) and device_id == garble.hostile:
            for s in p.shares:
                s.ciphertext = rng.bytes(len(s.ciphertext))
        return p

    async def main():
        settings = make_settings(rounds=3, **{"cohort.size": 6, "cohort.minimum": 5})
        async with running(settings) as (coord, target, store, rounds):
            enrolled = await enroll(target, 6)
            garble.hostile = enrolled[0][0]
            devices = [RecordingDevice(d, seed=7, tamper=garble, identity_key=k) for d, k in enrolled]
            encoded = RecordingDevice.encoded_inputs
            client = FakeClient(target, devices)
            await client.start()
            await _wait_rounds(rounds, timeout=30)
            recs = sorted(store.list_rounds().items, key=lambda r: r.number)
            assert [r.state for r in recs] == [RoundState.COMMITTED] * 3
            for rec in recs:  # every round: exactly the honest devices' sum
                honest = [d for d, _ in enrolled[1:]]
                assert rec.survivors["masked_input"] == sorted(honest)
                enc = np.sum([encoded[(rec.number, d)] for d in honest], axis=0, dtype=np.uint64).astype(np.uint32)
                assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(enc)
            for rec in recs[:2]:  # in the cohort, reported, left out before masking
                assert garble.hostile in rec.survivors["share_keys"]
                assert garble.hostile not in rec.survivors["share_check"]
            assert P.ABORT_REASON_DECRYPTION_FAILED in devices[0].aborted
            assert {q.device_id for q in store.list_quarantines()} == {garble.hostile}
            last = recs[2]  # quarantined: not even selected
            assert last.cohort_size == 5 and garble.hostile not in last.survivors["advertise_keys"]
            await client.close()

    asyncio.run(main())


def test_with_round_metrics_off_no_metric_leaves_a_device():
    """`round_metrics = false` (D36): the RoundTask asks for no metric, the
    masked vector is the update alone, and the record holds only what the
    coordinator counts itself."""
    async def main():
        settings = make_settings(round_metrics=False, **{"debug.record_sums": False})
        store = InMemoryStore()
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 4, groups=2)
            await _wait_rounds(rounds)
            task = clients[0].tasks[0]
            assert list(task.metric_names) == [] and task.secagg.vector_length == L
            assert all(d.encoded is not None and d.encoded.shape == (L,) for d in devices)
            rec = store.get_round(1)
            sa = task.secagg  # the round's shape is in the record too (what GET /v1/rounds/{n} shows)
            assert sa.threshold == 3 and sa.neighbour_count == 3
            assert rec.state is RoundState.COMMITTED and rec.metrics == {
                "contributors": 4.0, "cohort": 4.0, "threshold": 3.0, "neighbours": 3.0}
            for c in clients:
                await c.close()

    asyncio.run(main())
