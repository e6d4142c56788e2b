"""Devices enforce their own minimum cohort and threshold (the coordinator
chooses both; a device withdraws from a round below its floor)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from edge_client.cohort_floor import CohortFloor
from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask_proto.v1 import common_pb2
from secagg.config import SecAggConfig


def _config(n: int, threshold: int, neighbors: int | Literal["all"] = "all") -> SecAggConfig:
    return SecAggConfig.create(num_clients=n, vector_length=4, session_id=b"s" * 16, neighbors=neighbors,
                               threshold=threshold)


def test_the_floor_refuses_small_cohorts_and_low_thresholds() -> None:
    floor = CohortFloor()
    assert floor.refusal(_config(5, 3)) is None
    refusal = floor.refusal(_config(2, 2))
    assert refusal is not None and "cohort of 2" in refusal
    strict = CohortFloor(min_cohort=3, min_threshold=0.66)
    low = strict.refusal(_config(9, 5))
    assert low is not None and "threshold 5" in low
    assert strict.refusal(_config(9, 7)) is None
    assert CohortFloor(min_threshold=0.66).refusal(_config(20, 3, neighbors=4)) is not None  # 3 of a group of 5
    assert CohortFloor(min_threshold=0.66).refusal(_config(20, 4, neighbors=4)) is None
    with pytest.raises(ValueError):
        CohortFloor(min_cohort=1)
    with pytest.raises(ValueError):
        CohortFloor(min_threshold=0.4)


def test_a_client_withdraws_from_a_cohort_below_its_floor(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            async with RunningClient(fake, tmp_path) as rc:
                s = await fake.wait_stream()
                res = await fake.run_round(s, devices=[1, 2], threshold=2)
                assert not res.ok
                assert {(a.device_id, a.reason) for a in res.aborts} == {(0, common_pb2.ABORT_REASON_CLIENT_ERROR)}
                ok = await fake.run_round(s, devices=[1, 2, 3])
                assert ok.ok and ok.counted_devices == [1, 2, 3]
                assert rc.driver is not None

    run_async(go())


def test_the_floor_applies_to_the_devices_group_not_the_cohort() -> None:
    """In a round in groups (D87) a device's instance is its group: a group
    of 2 of a 1,000-device cohort is refused by a floor of 3, and the
    threshold checked is the group's."""
    import numpy as np

    from secagg.grouped_round import group_configs, run_grouped_round

    group = SecAggConfig.create(num_clients=2, vector_length=4, session_id=b"g", encoding_clients=1_000)
    refusal = CohortFloor().refusal(group)
    assert refusal is not None and "cohort of 2 (the secure sum this device is asked into: its group)" in refusal
    assert CohortFloor(min_cohort=2).refusal(group) is None
    weak = SecAggConfig.create(num_clients=9, vector_length=4, session_id=b"g", threshold=5, encoding_clients=1_000)
    assert "threshold 5 of the 9" in (CohortFloor(min_threshold=0.66).refusal(weak) or "")
    # in process: a coordinator puts device 0 with one other; both hold the default floor and withdraw
    groups = ((0, 1), (2, 3, 4, 5, 6))
    floor = CohortFloor()
    out = run_grouped_round(np.ones((7, 4)), groups=groups, configs=group_configs(groups, vector_length=4,
                            session_id=b"f"), refuse=lambda _p, cfg: floor.refusal(cfg))  # fmt: skip
    assert set(out.refused) == {0, 1} and out.counted == (2, 3, 4, 5, 6) and out.exact
