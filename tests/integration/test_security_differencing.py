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
  sum exists to difference. What differencing would have given at the DP
  floor (cosine, relative error) is measured and printed.
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

from integration_harness import Processes, client_args, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edge_client"))
from edge_fake_coordinator import FakeCoordinator  # noqa: E402

from fedmask_proto.v1 import common_pb2, session_pb2  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

L = 16
PARAMS = {"mean": np.linspace(-1, 1, L).astype(np.float32)}
HYPER = {"round_idx": 7}  # the same curriculum step in both rounds


def distributed(n: int, *, z: float = 1.0, clip: float = 0.1) -> session_pb2.DpSettings:
    return session_pb2.DpSettings(mode=session_pb2.DP_MODE_DISTRIBUTED, clip_norm=clip, noise_multiplier=z,
                                  noise_stddev=z * clip / math.sqrt(n))


def differencing_at_the_floor(dim: int = 10_000, *, z: float = 1.0, clip: float = 0.1,
                              trials: int = 3) -> tuple[float, float]:
    """What the difference of sums over {1,2,3,4} and {1,2,3} gives for device
    4's update when every device adds its distributed share of the noise at the
    floor (z, clip), in the attacker's best case (devices 1-3 send the same
    update twice): mean cosine and relative L2 error against the true update."""
    rng = np.random.default_rng(0)
    cos, err = [], []
    for _ in range(trials):
        u = rng.normal(size=(4, dim))
        u *= clip / np.linalg.norm(u, axis=1, keepdims=True)  # clipped to the norm
        s1 = (u + rng.normal(scale=z * clip / math.sqrt(4), size=(4, dim))).sum(0)
        s2 = (u[:3] + rng.normal(scale=z * clip / math.sqrt(3), size=(3, dim))).sum(0)
        d, true = s1 - s2, u[3]
        cos.append(float(d @ true / (np.linalg.norm(d) * np.linalg.norm(true))))
        err.append(float(np.linalg.norm(d - true) / np.linalg.norm(true)))
    return float(np.mean(cos)), float(np.mean(err))


def test_a_malicious_coordinator_cannot_difference_rounds_or_split_the_model(procs: Processes,
                                                                               tmp_path: Path) -> None:
    state = tmp_path / "client"

    async def go() -> None:
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

            # differencing: {1,2,3,4} then {1,2,3} on the same model, step and DP settings
            first = await fake.run_round(s, devices=[1, 2, 3, 4], dp=distributed(4), **kw)
            assert first.ok and first.counted_devices == [1, 2, 3, 4], first.aborts
            second = await fake.run_round(s, devices=[1, 2, 3], dp=distributed(3), **kw)
            assert not second.ok, "the devices contributed twice to one model and task"
            assert {a.reason for a in second.aborts} == {common_pb2.ABORT_REASON_CLIENT_ERROR}
            assert all("already contributed" in a.detail for a in second.aborts)
            records = [json.loads(p.read_text()) for p in sorted(state.glob("devices/*/contributions.json"))]
            assert len(records) == 4 and all(len(r["contributions"]) == 1 for r in records)
            procs.check_alive(client)

    asyncio.run(asyncio.wait_for(go(), 100))
    cos, err = differencing_at_the_floor()
    print(f"\ndifferencing at the DP floor (distributed, z=1, 10,000 coordinates): cosine {cos:.4f}, "
          f"relative error {err:.1f}")
    assert cos < 0.1 and err > 10
