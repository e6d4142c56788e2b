"""`groups_by_host`: the groups of a round over gRPC (D99), checked
property by property against its contract."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.round_groups import groups_by_host
from secagg.errors import SecAggConfigError
from secagg.groups import partition_seed

SEED = partition_seed(b"session", 1)


@st.composite
def cohorts(draw: st.DrawFn) -> tuple[list[int], dict[int, int], int]:
    n = draw(st.integers(2, 400))
    devices = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n, unique=True))
    hosts = draw(st.integers(1, n))
    host_of = {d: draw(st.integers(0, hosts - 1)) for d in devices}
    homeless = draw(st.sets(st.sampled_from(devices), max_size=5))
    for d in homeless:
        del host_of[d]
    return devices, host_of, draw(st.integers(2, 60))


@given(cohorts())
def test_groups_partition_the_cohort_keep_hosts_whole_and_reach_g(case: tuple[list[int], dict[int, int], int]) -> None:
    devices, host_of, g = case
    groups = groups_by_host(devices, host_of, group_size=g, seed=SEED)
    flat = [d for grp in groups for d in grp]
    assert sorted(flat) == sorted(devices) and len(flat) == len(set(flat))
    where = {d: j for j, grp in enumerate(groups) for d in grp}
    for d, h in host_of.items():
        assert all(where[e] == where[d] for e, other in host_of.items() if other == h)
    if len(devices) < 2 * g:
        assert len(groups) == 1
    if len(groups) > 1:
        assert min(len(grp) for grp in groups) >= g
    assert all(list(grp) == sorted(grp) for grp in groups)
    shuffled = list(devices)
    random.Random(0).shuffle(shuffled)
    assert groups_by_host(shuffled, host_of, group_size=g, seed=SEED) == groups


@given(n=st.integers(2, 2000), g=st.integers(2, 300))
def test_one_device_per_host_gives_balanced_groups_as_partition_does(n: int, g: int) -> None:
    groups = groups_by_host(range(n), {d: d for d in range(n)}, group_size=g, seed=SEED)
    assert len(groups) == max(1, n // g)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1


def test_the_seed_decides_who_shares_a_group() -> None:
    hosts = {d: d for d in range(100)}
    a = groups_by_host(range(100), hosts, group_size=20, seed=SEED)
    b = groups_by_host(range(100), hosts, group_size=20, seed=partition_seed(b"session", 2))
    assert a != b


def test_bad_input_is_refused() -> None:
    with pytest.raises(SecAggConfigError, match="twice"):
        groups_by_host([1, 1, 2], {}, group_size=2, seed=SEED)
    with pytest.raises(SecAggConfigError, match="group size"):
        groups_by_host([1, 2, 3], {}, group_size=1, seed=SEED)
    with pytest.raises(SecAggConfigError, match="at least 2"):
        groups_by_host([1], {}, group_size=2, seed=SEED)


def _settings(**over):
    from coordinator.settings import CoordinatorSettings

    base = {"listen_address": "127.0.0.1:0", "database_url": "memory://", "cohort.size": 1000,
            "cohort.minimum": 10, "secagg.group_size": 100}
    return CoordinatorSettings.load(overrides={**base, **over})


def test_groups_refuse_the_one_machine_paths_and_say_what_to_change() -> None:
    """The plaintext path has one machine: with groups possible the
    coordinator refuses to start; noise of any kind runs in groups."""
    from coordinator.settings import SettingsError

    with pytest.raises(SettingsError, match=r"debug.insecure_plaintext: set secagg.group_size to 0"):
        _settings(**{"debug.insecure_plaintext": True, "dp.mode": "none"})
    assert _settings(**{"debug.insecure_plaintext": True, "dp.mode": "none", "secagg.group_size": 0})
    assert _settings(**{"dp.mode": "distributed"}).secagg.group_size == 100
    with pytest.raises(SettingsError, match="0 .one instance. or at least 2"):
        _settings(**{"secagg.group_size": 1})
