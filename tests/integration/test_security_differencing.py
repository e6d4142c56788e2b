"""A coordinator that differences two rounds, or sends one device another
model, against a real `fedmask client` process at its default floors (D85).

The malicious coordinator is in-process: the edge tests' fake coordinator
(tests/edge_client/edge_fake_coordinator.py), a gRPC server on 127.0.0.1 that
runs the coordinator's own round machine but chooses every RoundTask itself.
The client is a real process hosting devices 1-4 with no security flag
(`client_args(..., dp_floor=True)`: the default DP floor, the default
contribution rule).

- DP floor: a task with DP off, or with a noise below the multiplier it
  claims, is refused (the client withdraws, CLIENT_ERROR, the reason in the
  AbortNotice's detail).
- Binding: a task whose session id does not commit to the model it carries
  is refused (PROTOCOL_VIOLATION); a device given another model under a
  matching session id computes another round context, so nothing it sends
  counts in the round the others run.
- Differencing: with distributed DP at the floor, cohorts {1,2,3,4} then
  {1,2,3} on the same model, step and DP: the second round is refused by the
  devices (each already contributed to that model and task), and no second
  sum exists to difference.
- Differencing consecutive versions, the real attack: FedRAP version v with
  cohort {1,2,3,4}, then v' (v plus a 1e-6 perturbation: another model hash)
  with {1,2,3}, distributed DP at the floor (z = 1, clip 0.1). No device rule
  stops it; the difference of the two decoded sums is compared with device
  4's true update (clipped, before noise). The true update comes from a
  second client process, started with --no-dp-floor and
  --debug-record-inputs on a fresh state, which runs the same attack with DP
  off: training is a pure function of (--seed, round_idx, user, model)
  (models/keyed_random.py), so its device 4 trains the same update, and its
  recorded encoded input of round A is that update before clipping (the
  debug record is taken after noise, so it is only noiseless with DP off).
  There the attack recovers the update (cosine ~1); at the floor the noise
  swamps it. Both figures are printed and asserted.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from integration_harness import Processes, client_args, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edge_client"))
from edge_fake_coordinator import FakeCoordinator  # noqa: E402

from fedmask_proto.v1 import common_pb2, session_pb2  # noqa: E402
from models.registry import build_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

L = 16
PARAMS = {"mean": np.linspace(-1, 1, L).astype(np.float32)}
HYPER = {"round_idx": 7}  # the same curriculum step in both rounds


def distributed(n: int, *, z: float = 1.0, clip: float = 0.1) -> session_pb2.DpSettings:
    return session_pb2.DpSettings(mode=session_pb2.DP_MODE_DISTRIBUTED, clip_norm=clip, noise_multiplier=z,
                                  noise_stddev=z * clip / math.sqrt(n))


def fedrap_model() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """Model version v (FedRAP on the synthetic set's 200 users x 300 items, k=4:
    update_dim 1200) and a consecutive version v' = v plus a tiny perturbation
    (another model hash, so the devices' once-per-(model, task) rule does not
    apply), and the update dimension."""
    m = build_model("fedrap", explicit=False, n_users=200, n_items=300, overrides={"k": 4})
    v = {name: t.numpy() for name, t in m.init_global(torch.Generator().manual_seed(0)).items()}
    rng = np.random.default_rng(1)
    v2 = {name: (a + rng.normal(scale=1e-6, size=a.shape)).astype(a.dtype) for name, a in v.items()}
    return v, v2, m.update_dim


def cosine_and_error(d: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Cosine of the differenced update with the true one, and the L2 error relative to it."""
    return (float(d @ true / (np.linalg.norm(d) * np.linalg.norm(true))),
            float(np.linalg.norm(d - true) / np.linalg.norm(true)))


async def difference(fake: FakeCoordinator, s: Any, dp: tuple[session_pb2.DpSettings | None, ...],
                     kw: dict[str, Any]) -> tuple[np.ndarray, Any]:
    """The attack: round A on version v with cohort {1,2,3,4}, round B on v' with
    {1,2,3}, the same curriculum step; the difference of the two unmasked
    (decoded) sums, and round A's result."""
    v, v2, _ = fedrap_model()
    a = await fake.run_round(s, devices=[1, 2, 3, 4], dp=dp[0], global_parameters=v, **kw)
    assert a.ok and a.counted_devices == [1, 2, 3, 4], a.aborts
    b = await fake.run_round(s, devices=[1, 2, 3], dp=dp[1], global_parameters=v2, **kw)
    assert b.ok and b.counted_devices == [1, 2, 3], b.aborts
    return a.decoded_sum() - b.decoded_sum(), a


def test_a_malicious_coordinator_cannot_difference_rounds_or_split_the_model(procs: Processes,
                                                                               tmp_path: Path) -> None:
    state, opted_out = tmp_path / "client", tmp_path / "opted-out"
    _, _, dim = fedrap_model()
    # the coordinator chooses the hyper-parameters: with the private learning rates near 0, devices
    # 1-3's private state barely moves in round A, so they send (almost) the same update in round B
    # and the difference of the sums is device 4's update plus the noise (the attacker's best case)
    private_lr = {"lr_user": 1e-4, "lr_personal": 1e-4, "lr_bias": 1e-4}
    fedrap: dict[str, Any] = {"model_name": "fedrap", "vector_length": dim, "clip": 1.0,  # the encoding's range
                              "hyperparameters": {"k": 4, "local_epochs": 2, "round_idx": 7, **private_lr},
                              "first_stage_timeout": 30.0, "stage_timeout": 5.0}

    async def at_the_floor() -> np.ndarray:
        """The client at its default floors: refusals, then the attack at z = 1; the differenced update."""
        async with FakeCoordinator() as fake:
            port = int(fake.target.rsplit(":", 1)[1])
            client = procs.start("client", client_args(port, "1-4", state, dataset="synthetic", threads=1,
                                                       dp_floor=True))
            s = await fake.wait_stream(timeout=60)
            await asyncio.to_thread(wait_until, lambda: len(s.device_ids) == 4, 30, what="four devices",
                                    watch=[client])
            kw: dict[str, Any] = {"vector_length": L, "global_parameters": PARAMS, "hyperparameters": HYPER,
                  "first_stage_timeout": 5.0, "stage_timeout": 3.0}

            # DP floor: DP off, and a noise below the multiplier the task claims
            for dp in (session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE),
                       session_pb2.DpSettings(mode=session_pb2.DP_MODE_DISTRIBUTED, clip_norm=0.1,
                                              noise_multiplier=1.0, noise_stddev=1e-6)):
                res = await fake.run_round(s, dp=dp, **kw)
                assert not res.ok, "a task below the devices' DP floor was trained"
                assert [(a.device_id, a.reason) for a in res.aborts] == [(0, common_pb2.ABORT_REASON_CLIENT_ERROR)]
                assert "DP" in res.aborts[0].detail

            # binding: another model than the one the session id commits to
            def other_model(task: session_pb2.RoundTask) -> None:
                task.global_parameters.tensors[0].tensor.data = np.zeros(L, "<f4").tobytes()

            res = await fake.run_round(s, dp=distributed(4), task_tamper=other_model, rebind_tampered=False, **kw)
            assert not res.ok
            assert [a.reason for a in res.aborts] == [common_pb2.ABORT_REASON_PROTOCOL_VIOLATION]
            assert "session id" in res.aborts[0].detail
            # ... and under a session id that matches the other model: the devices' round context
            # differs from the round the coordinator's machine runs, so none of their messages counts
            res = await fake.run_round(s, dp=distributed(4), task_tamper=other_model, **kw)
            assert not res.ok and not res.counted_devices

            # {1,2,3,4} then {1,2,3} on the same model, step and DP settings: refused
            first = await fake.run_round(s, devices=[1, 2, 3, 4], dp=distributed(4), **kw)
            assert first.ok and first.counted_devices == [1, 2, 3, 4], first.aborts
            second = await fake.run_round(s, devices=[1, 2, 3], dp=distributed(3), **kw)
            assert not second.ok, "the devices contributed twice to one model and task"
            assert {a.reason for a in second.aborts} == {common_pb2.ABORT_REASON_CLIENT_ERROR}
            assert all("already contributed" in a.detail for a in second.aborts)
            records = [json.loads(p.read_text()) for p in sorted(state.glob("devices/*/contributions.json"))]
            assert len(records) == 4 and all(len(r["contributions"]) == 1 for r in records)

            # ... but on consecutive versions v, v' nothing on the device stops it: the DP floor
            # is the defence. FedRAP, distributed DP at the floor (z = 1, clip 0.1)
            d, _ = await difference(fake, s, (distributed(4), distributed(3)), fedrap)
            procs.check_alive(client)
            return d

    async def opted_out_client() -> tuple[np.ndarray, np.ndarray]:
        """A client started with --no-dp-floor, its encoded inputs recorded: the attack with DP off;
        the differenced update and device 4's true update (its recorded input in round A)."""
        async with FakeCoordinator() as fake:
            port = int(fake.target.rsplit(":", 1)[1])
            client = procs.start("opted-out", client_args(port, "1-4", opted_out, dataset="synthetic", threads=1,
                                                          debug_record_inputs=True))
            s = await fake.wait_stream(timeout=60)
            await asyncio.to_thread(wait_until, lambda: len(s.device_ids) == 4, 30, what="four devices",
                                    watch=[client])
            d, a = await difference(fake, s, (None, None), fedrap)
            recorded = np.load(opted_out / "debug" / "inputs" / f"round-{a.task.round_number:06d}" / "device-4.npy")
            procs.check_alive(client)
            return d, a.config.encoding.decode_sum(recorded, 1)

    async def both() -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        return await asyncio.gather(at_the_floor(), opted_out_client())

    d_floor, (d_off, true) = asyncio.run(asyncio.wait_for(both(), 100))
    # the devices at the floor trained the same update before clipping and noise: training is a
    # pure function of (--seed, round_idx, user, model) (models/keyed_random.py)
    clipped = true * min(1.0, 0.1 / float(np.linalg.norm(true)))
    cos_off, err_off = cosine_and_error(d_off, true)
    cos, err = cosine_and_error(d_floor, clipped)
    print(f"\ndifferencing, DP off (--no-dp-floor): cosine {cos_off:.4f}, relative error {err_off:.3f}"
          f"\ndifferencing at the DP floor (distributed, z=1, clip 0.1, {dim} coordinates): cosine {cos:.4f}, "
          f"relative error {err:.1f}; |true update| {np.linalg.norm(true):.4f}")
    assert np.abs(true).max() < 1.0  # the encoding's range clipped nothing
    # DP off: the attack recovers device 4's update
    assert cos_off > 0.99 and err_off < 0.1
    # At the floor, d - clipped = N + delta (+ rounding), N the differenced noise: 7 Gaussian
    # shares, per coordinate variance 4 (z c / 2)^2 + 3 (z c / sqrt 3)^2 = 2 (z c)^2 = 0.02, so
    # |N| ~ 0.141 sqrt(chi2_1200) ~ 4.9, while |clipped| <= 0.1 and |delta| is what the DP-off
    # run's error shows (< 0.1 of the update). By Anderson's inequality P(|N + delta| < r) <=
    # P(|N| < r); |N| < 3.5 needs chi2_1200 < 612 (12 standard deviations low, p < 1e-30).
    # Then the error is > (3.5 - 0.01) / 0.1 > 10, and the cosine is at most
    # (|u| + |delta| + |N . u/|u||) / (|N| - |u| - |delta|) < (0.11 + 8 * 0.141) / 3.38 < 0.5
    # unless N's component along the update is beyond 8 standard deviations (p < 1e-15).
    assert cos < 0.5 and err > 10
