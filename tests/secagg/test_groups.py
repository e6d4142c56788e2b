"""The partition of a round's cohort into secure-aggregation groups
(secagg/groups.py): sizes, coverage, determinism, and clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.errors import SecAggConfigError
from secagg.groups import (
    DEFAULT_GROUP_SIZE,
    group_count,
    group_session_id,
    partition,
    partition_seed,
)

SEED = partition_seed(b"session", 7)


@st.composite
def cohorts(draw: st.DrawFn) -> tuple[list[int], int, bytes]:
    n = draw(st.integers(2, 2_000))
    group_size = draw(st.integers(2, max(2, n)))
    offset = draw(st.integers(0, 10**9))
    stride = draw(st.integers(1, 1_000))
    order = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    ids = [offset + stride * int(i) for i in order]  # distinct, in a random order
    return ids, group_size, draw(st.binary(min_size=32, max_size=32))


@settings(max_examples=150, deadline=None)
@given(cohorts())
def test_groups_are_balanced_at_least_g_and_cover_the_cohort_once(case: tuple[list[int], int, bytes]) -> None:
    ids, g, seed = case
    n = len(ids)
    groups = partition(ids, group_size=g, seed=seed)
    m = n // g if n >= 2 * g else 1
    assert len(groups) == m == group_count(n, g)
    sizes = [len(x) for x in groups]
    assert max(sizes) - min(sizes) <= 1
    if m > 1:
        assert min(sizes) >= g
    flat = [d for x in groups for d in x]
    assert sorted(flat) == sorted(ids)  # every device exactly once
    assert all(list(x) == sorted(x) for x in groups)
    # deterministic, and blind to the order the cohort is listed in
    assert partition(list(reversed(ids)), group_size=g, seed=seed) == groups
    assert partition(iter(ids), group_size=g, seed=seed) == groups


def test_a_cohort_below_two_groups_is_one_group_in_order() -> None:
    assert partition([5, 3, 9], group_size=2, seed=SEED) == ((3, 5, 9),)
    assert partition(range(2 * DEFAULT_GROUP_SIZE - 1), group_size=DEFAULT_GROUP_SIZE, seed=SEED) == (
        tuple(range(2 * DEFAULT_GROUP_SIZE - 1)),
    )
    two = partition(range(2 * DEFAULT_GROUP_SIZE), group_size=DEFAULT_GROUP_SIZE, seed=SEED)
    assert [len(x) for x in two] == [DEFAULT_GROUP_SIZE, DEFAULT_GROUP_SIZE]


def test_the_seed_decides_who_shares_a_group() -> None:
    cohort = range(100)
    seeds = [partition_seed(b"session", r) for r in range(6)]
    assert len({partition(cohort, group_size=10, seed=s) for s in seeds}) == 6
    assert partition_seed(b"session", 1) != partition_seed(b"other", 1)
    # not simply consecutive ids: a group mixes the cohort
    first = partition(cohort, group_size=10, seed=seeds[0])[0]
    assert max(first) - min(first) > 10


def test_group_session_ids_are_distinct_per_group() -> None:
    ids = {group_session_id(b"s", j) for j in range(50)}
    assert len(ids) == 50 and all(i.startswith(b"s/group-") for i in ids)
    with pytest.raises(SecAggConfigError):
        group_session_id(b"s", -1)


@pytest.mark.parametrize(
    ("cohort", "group_size", "seed", "message"),
    [
        ([], 2, SEED, "at least 2 devices"),
        ([4], 2, SEED, "at least 2 devices"),
        ([1, 2, 2], 2, SEED, "device 2 twice"),
        ([1, -3], 2, SEED, "non-negative ints"),
        ([1, True], 2, SEED, "non-negative ints"),
        ([1, 2.0], 2, SEED, "non-negative ints"),
        ("ab", 2, SEED, "iterable of device ids"),
        ([1, 2, 3], 1, SEED, "group size must be an int >= 2"),
        ([1, 2, 3], True, SEED, "group size must be an int >= 2"),
        ([1, 2, 3], 2.5, SEED, "group size must be an int >= 2"),
        ([1, 2, 3], 2, b"short", "32 bytes"),
    ],
)
def test_bad_input_is_refused_clearly(cohort: Any, group_size: Any, seed: Any, message: str) -> None:
    with pytest.raises(SecAggConfigError, match=message):
        partition(cohort, group_size=group_size, seed=seed)


def test_partition_seed_checks_its_arguments() -> None:
    with pytest.raises(SecAggConfigError):
        partition_seed(b"", 0)
    with pytest.raises(SecAggConfigError):
        partition_seed(b"s", -1)
    assert len(partition_seed(b"s", 0)) == 32


def test_one_encoding_per_round_sized_for_the_whole_cohort() -> None:
    """A group's config carries the cohort's encoding: the same scale as a
    single instance of the whole cohort, so any partial sum fits 2^w."""
    from secagg.config import SecAggConfig
    from secagg.encoding import FixedPointEncoding

    cohort = FixedPointEncoding.for_cohort(1_000, clip=2.0, modulus_bits=24)
    group = SecAggConfig.create(num_clients=300, vector_length=3, session_id=b"s", clip=2.0, modulus_bits=24,
                                encoding_clients=1_000)  # fmt: skip
    assert group.encoding.max_level == cohort.max_level == (2**24 - 1) // 1_000
    assert group.encoding.num_clients == 300 and group.encoding.scale == cohort.scale
    alone = SecAggConfig.create(num_clients=300, vector_length=3, session_id=b"s", clip=2.0, modulus_bits=24)
    assert alone.encoding.max_level == (2**24 - 1) // 300 > group.encoding.max_level
    x = np.linspace(-3, 3, 3)
    np.testing.assert_array_equal(group.encoding.encode(x), cohort.encode(x))
    with pytest.raises(SecAggConfigError, match="encoding_clients"):
        SecAggConfig.create(num_clients=300, vector_length=3, session_id=b"s", encoding_clients=299)
    with pytest.raises(SecAggConfigError, match="1..1000"):
        cohort.for_group(1_001)

