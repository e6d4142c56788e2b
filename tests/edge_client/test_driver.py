"""The device driver against an in-process fake coordinator (real gRPC on
127.0.0.1, real secagg server states): rounds, dropouts at every stage,
malformed messages, top-k, restarts, reconnects, auth, crash injection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_client.faults import FaultPlan
from edge_client.trainer import synthetic_updates
from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask_proto.v1 import common_pb2, secagg_pb2, session_pb2
from models.registry import build_model
from secagg.stages import Stage
from wire.protocol import PROTOCOL_VERSION

N = 6  # devices hosted by the client (users 1-6 -> device ids 1..6)


def _fedrap_globals(k: int = 4) -> tuple[dict[str, np.ndarray], int]:
    m = build_model("fedrap", explicit=False, n_users=200, n_items=300, overrides={"k": k})
    g = m.init_global(torch.Generator().manual_seed(0))
    return {name: v.numpy() for name, v in g.items()}, m.update_dim


#: Everything a client may send in a round; none of it carries a metric of one device.
KINDS_SENT = {"hello", "proof", "check_in", "heartbeat", "advertise_keys", "share_keys", "share_receipt", "masked_input", "unmasking_response", "abort"}


def _secret_files(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("devices/*/round.fms"))


def test_several_devices_complete_a_synthetic_round_exactly(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path) as rc:
            s = await fake.wait_stream()
            assert s.device_ids == list(range(1, N + 1))
            assert "synthetic" in s.hello.supported_models and s.hello.protocol_version == PROTOCOL_VERSION
            res = await fake.run_round(s, vector_length=32, hyperparameters={"seed": 5}, clip=1.0,
                                       metric_names=("devices",))
            assert res.ok and res.counted_devices == list(range(1, N + 1))
            want = synthetic_updates(res.counted_devices, round_number=1, vector_length=32, seed=5, scale=1.0).sum(0)
            step = res.config.encoding.step
            assert np.abs(res.decoded_sum() - want).max() <= N * step
            assert res.metric_totals() == ({}, {"devices": N})  # from the secure sum only
            assert not [m for m in fake.received if m.WhichOneof("message") not in KINDS_SENT]
            await asyncio.sleep(0.2)
            assert _secret_files(tmp_path) == []  # every round secret wiped after unmasking
            assert [e.outcome for e in rc.client.events] == ["committed"]
        assert rc.exit_code == 0

    run_async(go())


def test_a_fedrap_round_trains_every_selected_device_together(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            g, dim = _fedrap_globals()
            async with RunningClient(fake, tmp_path) as rc:
                s = await fake.wait_stream()
                res = await fake.run_round(
                    s, model_name="fedrap", vector_length=dim, global_parameters=g, clip=0.5,
                    hyperparameters={"k": 4, "local_epochs": 2, "round_idx": 0}, devices=[2, 3, 5],
                    dp=session_pb2.DpSettings(mode=session_pb2.DP_MODE_LOCAL, clip_norm=0.5, noise_stddev=0.001),
                    metric_names=("devices", "examples", "update_norm", "clipped", "val_sampled_hits@10",
                                  "val_sampled_ndcg@10", "val_sampled_count"),
                )
                assert res.ok and res.counted_devices == [2, 3, 5]
                mean = res.decoded_sum() / 3
                assert mean.shape == (dim,) and np.linalg.norm(mean) <= 0.5 + 0.05
                sums, counts = res.metric_totals()
                assert counts["devices"] == 3 and counts["val_sampled_count"] == 3 and counts["examples"] > 0
                assert 0 <= counts["val_sampled_hits@10"] <= 3 and 0 <= counts["clipped"] <= 3
                assert 0 <= sums["val_sampled_ndcg@10"] <= counts["val_sampled_hits@10"] and sums["update_norm"] > 0
                trained = sorted(p.parent.name for p in tmp_path.glob("devices/*/model-fedrap.fms"))
                assert trained == ["user-2", "user-3", "user-5"]
                assert rc.driver is not None

    run_async(go())


def _seed_with_droppers(stage: str, lo: int = 1, hi: int = 2) -> tuple[int, set[int]]:
    for seed in range(200):
        plan = FaultPlan(drop_rate=0.3, drop_stage=stage, seed=seed)
        drops = {d for d in range(1, N + 1) if plan.drop_stage_of(d, 1)}
        if lo <= len(drops) <= hi:
            return seed, drops
    raise AssertionError("no seed")


@pytest.mark.parametrize("stage", ["advertise-keys", "share-keys", "masked-input", "unmasking"])
def test_dropouts_at_each_stage_are_honoured(tmp_path: Path, stage: str) -> None:
    seed, drops = _seed_with_droppers(stage)

    async def go() -> None:
        async with FakeCoordinator() as fake:
            faults = FaultPlan(drop_rate=0.3, drop_stage=stage, seed=seed)
            async with RunningClient(fake, tmp_path, faults=faults, seed=seed):
                s = await fake.wait_stream()
                res = await fake.run_round(s, vector_length=16, first_stage_timeout=2.0, stage_timeout=1.0,
                                           metric_names=("devices",))
                assert res.ok, res.machine.phase
                surv = {k: set(v) for k, v in res.survivors.items()}
                order = ["advertise_keys", "share_keys", "masked_input", "unmasking"]
                cut = order.index(Stage.parse(stage).value)
                for i, k in enumerate(order):
                    if i < cut:
                        assert drops <= surv[k], (k, surv[k])
                    else:
                        assert not drops & surv[k], (k, surv[k])
                alive = set(range(1, N + 1)) - drops
                expected = set(range(1, N + 1)) if stage == "unmasking" else alive
                assert set(res.counted_devices) == expected
                # metrics only of devices that sent a masked input, all of them
                assert res.metric_totals() == ({}, {"devices": len(expected)})
                await asyncio.sleep(0.2)
                assert _secret_files(tmp_path) == []

    run_async(go())


def test_a_malformed_server_message_aborts_only_that_device(tmp_path: Path) -> None:
    victim = 4

    def tamper(p):
        if isinstance(p, secagg_pb2.ForwardedShares) and p.device_id == victim:
            p.shares[0].ciphertext = p.shares[0].ciphertext[:5]  # wire.WireError on the client
        return p

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path) as rc:
            s = await fake.wait_stream()
            res = await fake.run_round(s, vector_length=8, tamper=tamper, stage_timeout=5.0)
            assert res.ok and victim not in res.counted_devices and len(res.counted_devices) == N - 1
            (notice,) = res.aborts
            assert notice.device_id == victim and notice.reason == common_pb2.ABORT_REASON_PROTOCOL_VIOLATION
            assert notice.detail.startswith("malformed_message")
            # the process stays up: the next round has everyone
            res2 = await fake.run_round(s, vector_length=8)
            assert res2.ok and res2.counted_devices == list(range(1, N + 1))
            assert rc.task is not None and not rc.task.done()

    run_async(go())


def test_top_k_requests_are_answered_on_the_device(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            g, dim = _fedrap_globals()
            async with RunningClient(fake, tmp_path):
                s = await fake.wait_stream()
                r0 = await fake.top_k(s, 2, 5)
                assert r0.error.code == session_pb2.DEVICE_ERROR_CODE_NOT_READY
                res = await fake.run_round(s, model_name="fedrap", vector_length=dim, global_parameters=g, clip=0.5,
                                           hyperparameters={"k": 4, "local_epochs": 1}, devices=[1, 2, 3])
                assert res.ok
                r = await fake.top_k(s, 2, 7, exclude_seen=True)
                assert r.device_id == 2 and r.WhichOneof("response") == "top_k"
                assert len(r.top_k.item_ids) == 7 and list(r.top_k.scores) == []  # ranks leave, scores do not (D84)
                assert r.top_k.seen_excluded
                assert r.top_k.model_version == res.task.model_version
                assert (await fake.top_k(s, 6, 5)).error.code == session_pb2.DEVICE_ERROR_CODE_NOT_READY
                assert (await fake.top_k(s, 99, 5)).error.code == session_pb2.DEVICE_ERROR_CODE_UNKNOWN_DEVICE
                assert (await fake.top_k(s, 2, 0)).error.code == session_pb2.DEVICE_ERROR_CODE_INVALID_ARGUMENT

    run_async(go())


def test_restart_keeps_enrolment_and_declines_an_unfinished_round(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            async with RunningClient(fake, tmp_path):
                s = await fake.wait_stream()
                first_ids = s.device_ids
            assert fake.enroll_calls == 1
            # a crash mid-round leaves a round secret behind
            from edge_client.state import ClientStore, RoundSecret

            with ClientStore(tmp_path) as store:
                store.device("user-3").save_round_secret(RoundSecret(b"s" * 16, 1, b"k" * 32))
            assert len(_secret_files(tmp_path)) == 1
            async with RunningClient(fake, tmp_path):
                s2 = await fake.wait_stream()
                assert s2.device_ids == first_ids and fake.enroll_calls == 1  # not enrolled again
                assert _secret_files(tmp_path) == []  # declined
                res = await fake.run_round(s2, vector_length=8)
                assert res.ok and len(res.counted_devices) == N

    run_async(go())


def test_unknown_devices_are_enrolled_again(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            fake.reject_unknown = True  # e.g. the coordinator lost its database
            async with RunningClient(fake, tmp_path, users="1-3"):
                s = await fake.wait_stream()
                for _ in range(100):
                    if any(m.WhichOneof("message") == "check_in" for m in fake.received):
                        break
                    await asyncio.sleep(0.05)
                assert fake.enroll_calls == 2
                (ci,) = [m.check_in for m in fake.received if m.WhichOneof("message") == "check_in"]
                assert sorted(ci.available_device_ids) == [1, 2, 3]
                fake.reject_unknown = False
                await asyncio.sleep(0.1)
                assert s.device_ids == [1, 2, 3]

    run_async(go())


def test_reconnect_after_losing_the_stream_mid_round(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path) as rc:
            s = await fake.wait_stream()
            round_task = asyncio.ensure_future(
                fake.run_round(s, vector_length=8, first_stage_timeout=1.0, stage_timeout=0.3))
            for _ in range(200):  # wait for the devices' AdvertiseKeys (round secrets on disk)
                if sum(m.WhichOneof("message") == "advertise_keys" for m in fake.received) == N:
                    break
                await asyncio.sleep(0.01)
            s.out.put_nowait(None)  # the coordinator drops the stream
            await round_task
            s2 = await fake.wait_stream()
            assert s2 is not s
            await asyncio.sleep(0.1)
            assert _secret_files(tmp_path) == []  # the abandoned round's secrets are wiped
            assert any(e.outcome == "disconnected" for e in rc.client.events)
            res = await fake.run_round(s2, vector_length=8)
            assert res.ok and len(res.counted_devices) == N

    run_async(go())


def test_token_auth(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator(token="sesame") as fake:
            async with RunningClient(fake, tmp_path / "good", users="1-3", token="sesame"):
                s = await fake.wait_stream()
                assert (await fake.run_round(s, vector_length=4)).ok
            bad = RunningClient(fake, tmp_path / "bad", users="1-3", token="wrong")
            async with bad:
                assert bad.task is not None
                await asyncio.wait_for(asyncio.shield(bad.task), 10)
            assert bad.exit_code == 2  # refused credentials are fatal, not retried

    run_async(go())


def test_crash_after_round_exits_after_committing_private_state(tmp_path: Path) -> None:
    codes: list[int] = []
    seen_state: list[bool] = []

    async def go() -> None:
        async with FakeCoordinator() as fake:
            g, dim = _fedrap_globals()

            def fake_exit(code: int) -> None:
                codes.append(code)
                seen_state.append(len(list(tmp_path.glob("devices/*/model-fedrap.fms"))) == 3)
                rc.client.stop()

            rc = RunningClient(fake, tmp_path, users="1-3", faults=FaultPlan(crash_after_round=1, exit=fake_exit))
            async with rc:
                s = await fake.wait_stream()
                res = await fake.run_round(s, model_name="fedrap", vector_length=dim, global_parameters=g, clip=0.5,
                                           hyperparameters={"k": 4, "local_epochs": 1})
                assert res.ok
                assert rc.task is not None
                await asyncio.wait_for(asyncio.shield(rc.task), 10)

    run_async(go())
    assert codes == [75] and seen_state == [True]


def _bad_json(task: session_pb2.RoundTask) -> None:
    task.hyperparameters_json = "{not json"


def _other_catalogue(task: session_pb2.RoundTask) -> None:
    task.model_name = "fedrap"
    task.hyperparameters_json = '{"n_items": 999, "n_users": 943}'


@pytest.mark.parametrize(
    ("task_tamper", "reason"),
    [(_bad_json, common_pb2.ABORT_REASON_PROTOCOL_VIOLATION), (_other_catalogue, common_pb2.ABORT_REASON_MODEL_MISMATCH)],
)
def test_a_bad_round_task_is_declined_and_the_process_stays_up(tmp_path: Path, task_tamper, reason: int) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, users="1-3") as rc:
            s = await fake.wait_stream()
            res = await fake.run_round(s, vector_length=4, task_tamper=task_tamper, first_stage_timeout=5.0)
            assert not res.ok
            (notice,) = res.aborts
            assert notice.device_id == 0 and notice.reason == reason  # all of this client's devices withdraw
            assert (await fake.run_round(s, vector_length=4)).ok
            assert rc.task is not None and not rc.task.done()

    run_async(go())


def test_delay_before_every_stage_reply(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, faults=FaultPlan(delay_ms=150)):
            s = await fake.wait_stream()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            res = await fake.run_round(s, vector_length=4)
            took = loop.time() - t0
            assert res.ok and len(res.counted_devices) == N
            # 4 stage replies per device, each after 150 ms; devices wait concurrently
            assert 0.6 <= took < 0.6 * N

    run_async(go())


def test_mutual_tls(tmp_path: Path) -> None:
    from fedmask.certs import init_pki

    pki = init_pki(tmp_path / "pki", devices=1).layout
    cert, key = pki.device(1)

    async def go() -> None:
        fake = FakeCoordinator()
        await fake.start(tls=(pki.server_key.read_bytes(), pki.server_cert.read_bytes(), pki.ca_cert.read_bytes()))
        async with RunningClient(fake, tmp_path / "s", users="1-3", tls_ca=pki.ca_cert, tls_cert=cert, tls_key=key,
                                 tls_server_name="localhost"):
            s = await fake.wait_stream()
            assert (await fake.run_round(s, vector_length=4)).ok
        await fake.stop()

    run_async(go())
