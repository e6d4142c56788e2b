"""Rounds in groups over real gRPC (D99): each group its own SecAgg(+)
instance and session id, a stream's devices in one group, the groups' sums
added exactly and decoded once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from coordinator.debug import encoded_checksum
from coordinator.store import RoundState
from coordinator.store.blobs import unpack_parameters
from dpmech.quantize import clip_l2
from fedmask_proto.v1 import common_pb2, session_pb2

from test_grpc_end_to_end import SHORT, _clients, _until, _wait_rounds, make_settings, running

P = common_pb2


def _counted_sum(devices, rec) -> np.ndarray:
    """The oracle: the plaintext sum of the counted devices' encoded inputs."""
    counted = [d for d in devices if d.device_id in rec.survivors["masked_input"]]
    total = np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64)
    return np.asarray(total & np.uint64(0xFFFFFFFF), dtype=np.uint32)


def test_rounds_in_three_groups_over_grpc_are_exact_and_keep_streams_whole():
    async def main():
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 6, "secagg.group_size": 4, "rounds": 2})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 12, groups=6)
            await _wait_rounds(rounds, timeout=30)
            page = store.list_rounds()
            assert [r.state for r in page.items] == [RoundState.COMMITTED, RoundState.COMMITTED]
            last = page.items[0]
            assert last.metrics["groups"] == 3 and last.metrics["contributors"] == 12
            assert last.metrics["debug.encoded_checksum"] == encoded_checksum(_counted_sum(devices, last))
            mean = unpack_parameters(store.latest_model_version("synthetic").parameters)["mean"]
            assert np.allclose(mean, np.mean([d.update for d in devices], axis=0), atol=1e-5)
            # each client got one task per round: its two devices, in a group of 4 encoded for the 12
            sessions: dict[int, set[bytes]] = {}
            for c in clients:
                assert len(c.tasks) == 2
                for t in c.tasks:
                    assert len(t.assignments) == 2
                    assert t.secagg.cohort_size == 4 and t.secagg.encoding_cohort_size >= 12
                    sessions.setdefault(t.round_number, set()).add(bytes(t.session_id))
            assert all(len(s) == 3 for s in sessions.values())  # three groups, three session ids a round
            await asyncio.wait_for(_until(lambda: all(len(c.committed) == 2 for c in clients)), 5)
            assert all(m.contributors == 4 for c in clients for m in c.committed)  # each group's own count
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_a_group_that_falls_below_its_threshold_costs_only_its_devices():
    """Both devices of one client go silent at masked input: their group of
    4 keeps 2, below its threshold of 3, and aborts; the round commits the
    other 8 devices' sum exactly, since 8 meet the threshold one instance
    over the 12 would have (7, a majority). The cohort minimum, the devices
    a round needs to start (here all 12), is not a commit minimum."""
    async def main():
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 12, "secagg.group_size": 4, **SHORT})
        async with running(settings) as (coord, target, store, rounds):
            # _clients deals device i to client i % 6: devices 0 and 6 share client 0
            clients, devices = await _clients(target, 12, groups=6, silent={0: "masked_input", 6: "masked_input"})
            await _wait_rounds(rounds, timeout=30)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED, rec
            assert rec.metrics["contributors"] == 8
            silent = [devices[0], devices[6]]
            told = [d for d in devices if P.ABORT_REASON_TOO_FEW_SURVIVORS in d.aborted]
            assert len(told) == 2 and not set(told) & set(silent)  # the silent pair's two group mates
            # the record's masked-input survivors are the counted devices, as in a round of one instance
            assert len(rec.survivors["masked_input"]) == 8
            assert not {d.device_id for d in silent + told} & set(rec.survivors["masked_input"])
            assert {d.device_id for d in silent + told} == set(rec.dropouts["masked_input"])
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(_counted_sum(devices, rec))
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_groups_with_the_discrete_gaussian_share_the_rounds_rotation():
    """Local discrete-Gaussian noise in a round in groups: every group's task
    carries the round's one rotation key, so the groups' residues add and
    decode to the mean of the clipped updates (within the noise)."""
    async def main():
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 6, "secagg.group_size": 4,
                                    "dp.mode": "local", "dp.mechanism": "discrete-gaussian", "dp.clip": 1.0,
                                    "dp.noise_multiplier": 0.05, "debug.record_sums": False})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 12, groups=6)
            await _wait_rounds(rounds, timeout=30)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED, rec
            keys = {bytes(t.dp.rotation_key) for c in clients for t in c.tasks}
            sessions = {bytes(t.session_id) for c in clients for t in c.tasks}
            assert len(keys) == 1 and len(next(iter(keys))) == 16 and len(sessions) == 3
            assert all(t.dp.mechanism == session_pb2.DP_MECHANISM_DISCRETE_GAUSSIAN for c in clients for t in c.tasks)
            mean = unpack_parameters(store.latest_model_version("synthetic").parameters)["mean"]
            want = np.mean(clip_l2(np.stack([d.update for d in devices]), 1.0), axis=0)
            # noise of the mean: 0.05 / sqrt(12) per coordinate; a rotation that differed between
            # groups would leave errors of the order of the updates themselves (about 0.25)
            assert np.max(np.abs(mean - want)) < 0.08, np.max(np.abs(mean - want))
            (entry,) = store.privacy_ledger()
            assert entry.round_number == 1 and entry.epsilon > 0
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_distributed_noise_is_split_within_each_group_and_the_round_priced_at_its_worst_group():
    """Float distributed noise in a round of three groups of 4: every device
    adds z * clip / sqrt(4), its group's share; one device silent at masked
    input leaves its group's sum with 3 shares, sqrt(3/4) of z, and the
    ledger keeps each group and prices the round at that group."""
    async def main():
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 6, "secagg.group_size": 4,
                                    "dp.mode": "distributed", "dp.mechanism": "gaussian-float", "dp.clip": 0.1,
                                    "dp.noise_multiplier": 1.0, "debug.record_sums": False, **SHORT})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 12, groups=6, silent={0: "masked_input"})
            await _wait_rounds(rounds, timeout=30)
            rec = store.get_round(1)
            assert rec.state is RoundState.COMMITTED, rec
            assert {round(t.dp.noise_stddev, 12) for c in clients for t in c.tasks} == {0.05}
            (entry,) = store.privacy_ledger()
            assert sorted((g.size, g.counted) for g in entry.groups) == [(4, 3), (4, 4), (4, 4)]
            assert sorted(g.noise_multiplier for g in entry.groups) == pytest.approx([0.75 ** 0.5, 1.0, 1.0])
            assert entry.noise_multiplier == pytest.approx(0.75 ** 0.5)
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_the_discrete_gaussians_shares_follow_each_groups_size():
    """14 devices on 7 streams of 2 at G = 4: groups of 6, 4 and 4. Each
    group's devices split sigma^2 among their own group: a device of the
    group of 6 draws 4/6 of the variance a device of a group of 4 draws, at
    the one scale of the round."""
    async def main():
        settings = make_settings(**{"cohort.size": 14, "cohort.minimum": 6, "secagg.group_size": 4,
                                    "dp.mode": "distributed", "dp.mechanism": "discrete-gaussian", "dp.clip": 1.0,
                                    "dp.noise_multiplier": 1.0, "debug.record_sums": False})
        async with running(settings) as (coord, target, store, rounds):
            clients, devices = await _clients(target, 14, groups=7)
            await _wait_rounds(rounds, timeout=30)
            assert store.get_round(1).state is RoundState.COMMITTED
            by_size = {t.secagg.cohort_size: (t.dp.noise_variance_numerator / t.dp.noise_variance_denominator,
                                              t.dp.scale) for c in clients for t in c.tasks}
            assert sorted(by_size) == [4, 6]
            assert by_size[6][1] == by_size[4][1]  # one scale
            assert by_size[6][0] / by_size[4][0] == pytest.approx(4 / 6, rel=1e-6)
            (entry,) = store.privacy_ledger()
            assert sorted(g.size for g in entry.groups) == [4, 4, 6]
            assert all(g.noise_multiplier == pytest.approx(1.0, rel=1e-3) for g in entry.groups)
            for c in clients:
                await c.close()

    asyncio.run(main())
