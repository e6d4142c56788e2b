"""A round in groups fed a piece at a time (secagg/group_stream.py).

Property: for random cohorts, group sizes and ways of cutting the cohort
into pieces (any order), the streamed round's committed sum equals, bit for
bit, (a) an independent oracle, the plain integer sum over every position p
of encode(x_p) rounded with the generator (seed, p), and (b) the round run
over the whole table at once (`run_grouped_round`, or `run_round` for one
group); every position is counted once. A part of a cohort (a simulation
rank's devices at their cohort positions) equals its `run_grouped_round`
and the oracle keyed by cohort position. Fed group by group (`order()`), it
never holds more than one group's rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secagg import SecAggConfig
from secagg.group_stream import GroupStream
from secagg.grouped_round import GroupedOutcome, group_configs, run_grouped_round
from secagg.groups import partition, partition_seed
from secagg.inprocess import RoundOutcome, run_round


def _round(n: int, group_size: int, length: int, round_idx: int) -> tuple[Any, ...]:
    groups = partition(range(n), group_size=group_size, seed=partition_seed(b"stream", round_idx))
    if len(groups) == 1:
        configs: tuple[SecAggConfig, ...] = (SecAggConfig.create(num_clients=n, vector_length=length,
                                                                 session_id=b"stream", clip=2.0, neighbors="all"),)
    else:
        configs = group_configs(groups, vector_length=length, session_id=b"stream", clip=2.0, neighbors="all")
    return groups, configs


def _oracle(x: np.ndarray, configs: tuple[SecAggConfig, ...], seed: int) -> np.ndarray:
    """The plain sum of every device's encoding, rounded with (seed, position)."""
    enc = configs[0].encoding
    total = np.zeros(x.shape[1], dtype=np.uint64)
    for p in range(x.shape[0]):
        total += enc.encode(x[p], np.random.default_rng((seed, p)))
    assert int(total.max(initial=0)) < (1 << enc.modulus_bits)  # the cohort's encoding never wraps
    return total.astype(np.uint32)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 24), group_size=st.integers(2, 8), length=st.integers(1, 5), round_idx=st.integers(0, 2**20),
       seed=st.integers(0, 2**31), cuts=st.integers(1, 6), data=st.data())
def test_a_streamed_round_equals_the_round_over_the_whole_table(n: int, group_size: int, length: int, round_idx: int,
                                                                 seed: int, cuts: int, data: st.DataObject) -> None:
    groups, configs = _round(n, group_size, length, round_idx)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3.0, 3.0, size=(n, length)).astype(np.float32)  # some beyond the clip
    stream = GroupStream(groups=groups, configs=configs, vector_length=length, round_idx=round_idx, seed=seed,
                         wire=False)
    order = data.draw(st.permutations(range(n)))
    bounds = sorted(data.draw(st.lists(st.integers(0, n), min_size=cuts, max_size=cuts)))
    for a, b in zip([0, *bounds], [*bounds, n], strict=True):
        stream.add(order[a:b], x[order[a:b]])
    got = stream.finish()

    assert got.ok and got.exact
    assert got.counted == tuple(range(n))
    assert got.encoded_sum is not None and got.sum is not None
    assert np.array_equal(got.encoded_sum, _oracle(x, configs, seed))
    whole: RoundOutcome | GroupedOutcome
    if len(groups) == 1:
        whole = run_round(x, config=configs[0], round_idx=round_idx, seed=seed, wire=False)
    else:
        whole = run_grouped_round(x, groups=groups, configs=configs, round_idx=round_idx, seed=seed, wire=False)
    assert whole.encoded_sum is not None and whole.sum is not None
    assert np.array_equal(got.encoded_sum, whole.encoded_sum)
    assert np.array_equal(got.sum, whole.sum)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 16), extra=st.integers(0, 30), group_size=st.integers(2, 6), length=st.integers(1, 4),
       first_group=st.integers(0, 9), seed=st.integers(0, 2**31), data=st.data())
def test_a_part_of_a_cohort_equals_its_grouped_round(n: int, extra: int, group_size: int, length: int,
                                                     first_group: int, seed: int, data: st.DataObject) -> None:
    """A rank's devices (D93): n of a cohort of n + extra, at any cohort positions;
    every group, a lone one too, keyed as `run_grouped_round` keys it."""
    cohort = n + extra
    positions = sorted(data.draw(st.lists(st.integers(0, cohort - 1), min_size=n, max_size=n, unique=True)))
    groups = partition(range(n), group_size=group_size, seed=partition_seed(b"part", seed))
    configs = tuple(SecAggConfig.create(num_clients=len(g), vector_length=length, session_id=b"part-%d" % j,
                                        clip=2.0, neighbors="all", encoding_clients=cohort)
                    for j, g in enumerate(groups))  # fmt: skip
    x = np.random.default_rng(seed).uniform(-3.0, 3.0, size=(n, length)).astype(np.float32)
    stream = GroupStream(groups=groups, configs=configs, vector_length=length, round_idx=5, seed=seed, wire=False,
                         cohort_positions=positions, first_group=first_group)
    order = stream.order()
    for a in range(0, n, 3):
        stream.add(order[a:a + 3], x[order[a:a + 3]])
    got = stream.finish()
    whole = run_grouped_round(x, groups=groups, configs=configs, round_idx=5, seed=seed, wire=False,
                              positions=positions, first_group=first_group)
    enc = configs[0].encoding
    oracle = np.zeros(length, dtype=np.uint64)
    for p in range(n):  # each device alone, rounded with (seed, its cohort position)
        oracle += enc.encode(x[p], np.random.default_rng((seed, positions[p])))
    assert got.ok and got.exact and got.counted == tuple(range(n))
    assert got.encoded_sum is not None and whole.encoded_sum is not None
    assert got.expected_encoded_sum is not None and whole.expected_encoded_sum is not None
    assert np.array_equal(got.encoded_sum, oracle.astype(np.uint32))
    assert np.array_equal(got.encoded_sum, whole.encoded_sum)
    assert np.array_equal(got.expected_encoded_sum, whole.expected_encoded_sum)
    assert stream.peak_rows_held <= max(len(g) for g in groups) + 2


def test_cohort_positions_must_match_the_devices() -> None:
    groups, configs = _round(6, 3, 2, 0)
    with pytest.raises(ValueError, match="5 cohort positions for 6"):
        GroupStream(groups=groups, configs=configs, vector_length=2, wire=False, cohort_positions=range(5))


@pytest.mark.parametrize("n,group_size", [(30, 5), (9, 5)])
def test_fed_group_by_group_it_holds_one_group_at_a_time(n: int, group_size: int) -> None:
    groups, configs = _round(n, group_size, 3, 7)
    stream = GroupStream(groups=groups, configs=configs, vector_length=3, round_idx=7, seed=1, wire=False)
    order = stream.order()
    assert sorted(order.tolist()) == list(range(n))
    x = np.random.default_rng(0).uniform(-1, 1, size=(n, 3))
    for a in range(0, n, 4):  # pieces of 4 cut across the groups
        stream.add(order[a:a + 4], x[order[a:a + 4]])
    assert stream.peak_rows_held <= max(len(g) for g in groups) + 3
    assert stream.rows_held == 0
    assert stream.finish().counted == tuple(range(n))


def test_residues_sum_mod_2w() -> None:
    groups, configs = _round(12, 4, 4, 3)
    bits = configs[0].encoding.modulus_bits
    x = np.random.default_rng(5).integers(0, 1 << bits, size=(12, 4), dtype=np.uint64).astype(np.uint32)
    stream = GroupStream(groups=groups, configs=configs, vector_length=4, round_idx=3, seed=2, wire=False)
    stream.add(range(12)[::-1], x[::-1])
    got = stream.finish()
    want = (x.astype(np.uint64).sum(axis=0) & np.uint64((1 << bits) - 1)).astype(np.uint32)
    assert got.exact and got.residues and got.encoded_sum is not None
    assert np.array_equal(got.encoded_sum, want)


def test_bad_pieces_are_refused_before_anything_is_kept() -> None:
    groups, configs = _round(10, 5, 2, 1)
    stream = GroupStream(groups=groups, configs=configs, vector_length=2, round_idx=1, seed=0, wire=False)
    x = np.zeros((10, 2), dtype=np.float32)
    stream.add([0, 1], x[:2])
    with pytest.raises(ValueError, match="twice"):
        stream.add([1, 2], x[:2])
    with pytest.raises(ValueError, match="twice"):
        stream.add([3, 3], x[:2])
    with pytest.raises(ValueError, match="0..9"):
        stream.add([10], x[:1])
    with pytest.raises(ValueError, match="rows"):
        stream.add([4], np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="one kind"):
        stream.add([4], np.zeros((1, 2), dtype=np.uint32))
    assert stream.seen.sum() == 2  # the refused pieces left nothing behind
    with pytest.raises(ValueError, match="8 of the round's 10"):
        stream.finish()
