"""A real edge client under the discrete Gaussian (D88), against the fake
coordinator: its devices encode exactly as `dpmech` says, the coordinator's
decoding of the secure sum recovers the sum of their clipped updates plus
the noise of the counted shares, and a device's DP floor is checked against
the noise the mechanism really adds (after rotation and rounding).

Oracles: the synthetic updates the devices compute (`synthetic_updates`,
clipped in L2 here), and `dpmech`'s own privacy_rho for the floor."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from dpmech.calibrate import calibrate, noise_multiplier_of, with_shares
from dpmech.mechanism import privacy_rho
from edge_client.dp_floor import DpFloor
from edge_client.faults import FaultPlan
from edge_client.trainer import synthetic_updates
from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask_proto.v1 import common_pb2, session_pb2
from wire.dp_task import discrete_gaussian_settings

N, DIM, CLIP = 6, 40, 0.5


def _mechanism(devices: int = N, z: float = 1.0):
    return calibrate(dim=DIM, clip=CLIP, noise_multiplier=z, devices=devices, shares=devices, bits=32)


def test_devices_encode_the_discrete_gaussian_and_the_sum_decodes_to_their_clipped_sum(tmp_path: Path) -> None:
    mech = _mechanism()

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, dp_floor=DpFloor()):
            s = await fake.wait_stream()
            res = await fake.run_round(s, vector_length=DIM, hyperparameters={"seed": 3, "scale": 1.0},
                                       mechanism=mech)
            assert res.ok and res.counted_devices == list(range(1, N + 1))
            assert res.config.vector_length == 64 and res.task.dp.update_length == DIM
            raw = synthetic_updates(res.counted_devices, round_number=1, vector_length=DIM, seed=3, scale=1.0)
            clipped = raw * np.minimum(1.0, CLIP / np.linalg.norm(raw, axis=1, keepdims=True))
            assert (np.linalg.norm(raw, axis=1) > CLIP).all()  # every device was clipped, in L2
            error = res.decoded_sum() - clipped.sum(0)
            std = math.sqrt(N * float(mech.sigma2)) / mech.scale  # the noise of 6 shares, per coordinate
            assert np.abs(error).max() < 6 * std and 0.5 * std < error.std() < 1.6 * std

    run_async(go())


def test_with_a_dropout_the_sum_carries_the_counted_shares_only(tmp_path: Path) -> None:
    mech = _mechanism()
    seed = next(sd for sd in range(200)
                if len({d for d in range(1, N + 1) if FaultPlan(drop_rate=0.2, drop_stage="masked-input",
                                                                seed=sd).drop_stage_of(d, 1)}) == 1)

    async def go() -> None:
        async with FakeCoordinator() as fake:
            faults = FaultPlan(drop_rate=0.2, drop_stage="masked-input", seed=seed)
            async with RunningClient(fake, tmp_path, faults=faults, seed=seed, dp_floor=DpFloor()):
                s = await fake.wait_stream()
                res = await fake.run_round(s, vector_length=DIM, hyperparameters={"seed": 3}, mechanism=mech,
                                           first_stage_timeout=3.0, stage_timeout=1.5)
                assert res.ok and len(res.counted_devices) == N - 1
                # what the coordinator's ledger prices: N - 1 shares, a weaker guarantee than N
                assert noise_multiplier_of(privacy_rho(mech, N - 1)) < noise_multiplier_of(privacy_rho(mech, N))

    run_async(go())


def test_the_floor_refuses_too_little_discrete_noise_and_unnoised_metrics(tmp_path: Path) -> None:
    """A coordinator that claims z = 1 but sends each device the share for
    z = 0.5, or asks for metric totals beside the residues: the devices
    withdraw before they advertise anything."""
    mech = _mechanism()
    weak = with_shares(_mechanism(z=0.5), 0.5, N)

    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, dp_floor=DpFloor()):
            s = await fake.wait_stream()
            lying = discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0,
                                               mechanism=weak)
            res = await fake.run_round(s, vector_length=DIM, mechanism=weak, dp=lying, first_stage_timeout=2.0)
            assert not res.ok and res.aborts
            assert all(a.reason == common_pb2.ABORT_REASON_CLIENT_ERROR for a in res.aborts)
            assert "below this device's minimum" in res.aborts[0].detail
            res = await fake.run_round(s, vector_length=DIM, mechanism=mech, metric_names=("devices",),
                                       first_stage_timeout=2.0)
            assert not res.ok and res.aborts and "no metric coordinates" in res.aborts[0].detail

    run_async(go())


def test_the_device_floor_counts_the_sensitivity_after_rotation_and_rounding() -> None:
    """A share calibrated with the unrounded clip (s c) instead of sqrt(B)
    falls short of z at a small scale, and the floor sees it."""
    floor = DpFloor(min_noise_multiplier=1.0)
    mech = dataclasses.replace(_mechanism(), scale=8.0 / CLIP)  # s c = 8: rounding dominates B in 64 coordinates
    naive = dataclasses.replace(mech, sigma2=type(mech.sigma2)(math.ceil((8.0 ** 2) / N)))
    dp = discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0, mechanism=naive)
    why = floor.refusal(dp, N, naive)
    assert why is not None and "below" in why
    honest = with_shares(mech, 1.0, N)
    dp = discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0, mechanism=honest)
    assert floor.refusal(dp, N, honest) is None
