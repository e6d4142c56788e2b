"""Property test of a round in groups (secagg/grouped_round.py) against an
independent oracle.

For random cohorts, group sizes, graphs, thresholds and dropout patterns
(some heavy enough to abort a group), the oracle predicts each group's
outcome with the survivor rules of tests/secagg/test_round_properties.py
(sets only, no cryptography), applied to the group's own graph and
threshold. It then says what the round must commit:

  counted = the union over the groups the oracle lets commit of their
            counted devices (as cohort positions);
  sum     = sum over counted positions p of encode(x_p), rounded with the
            generator (seed, p), as plain integers; it must stay below 2^w.

The run's committed sum must equal that sum bit for bit, its counted set
must equal the oracle's, a group the oracle aborts must add nobody, and no
position may be counted twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_round_properties import oracle

from secagg.config import SecAggConfig
from secagg.graph import majority_threshold
from secagg.grouped_round import check_groups, group_configs, run_grouped_round
from secagg.groups import partition, partition_seed
from secagg.inprocess import DROPOUT_STAGES, DropoutPlan, run_round

STAGES = [s for s in DROPOUT_STAGES if s != "consistency_check"]


@st.composite
def grouped_rounds(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(2, 36))
    group_size = draw(st.integers(2, max(2, n // 2)))
    round_idx = draw(st.integers(0, 2**20))
    groups = partition(range(n), group_size=group_size, seed=partition_seed(b"prop", round_idx))
    smallest = min(len(g) for g in groups)
    harary = smallest >= 4 and draw(st.booleans())
    k = 2 * draw(st.integers(1, (smallest - 2) // 2)) if harary else None
    # per group: complete graph at its own majority, or a Harary graph of degree k
    configs = group_configs(
        groups, vector_length=draw(st.integers(1, 6)), session_id=draw(st.binary(min_size=1, max_size=16)),
        clip=draw(st.sampled_from([0.5, 1.0, 4.0])), neighbors=k if k is not None else "all",
        modulus_bits=draw(st.sampled_from([None, 20, 32])),
    )
    if k is not None and draw(st.booleans()):  # a higher threshold, the same in every group
        t = draw(st.integers(majority_threshold(k), k + 1))
        configs = tuple(SecAggConfig.create(
            num_clients=c.num_clients, vector_length=c.vector_length, session_id=c.session_id,
            clip=c.encoding.clip, neighbors=k, threshold=t, modulus_bits=c.encoding.modulus_bits,
            encoding_clients=n,
        ) for c in configs)  # fmt: skip
    seed = draw(st.integers(0, 2**31))
    chooser = np.random.default_rng(seed)
    plan: dict[str, set[int]] = {s: set() for s in STAGES}
    for members in groups:  # each group its own dropout rate: some abort, some do not
        rate = draw(st.sampled_from([0.0, 0.0, 0.15, 0.4, 0.8]))
        for p in members:
            if chooser.random() < rate:
                plan[draw(st.sampled_from(STAGES))].add(p)
    return groups, configs, DropoutPlan(**{s: frozenset(v) for s, v in plan.items()}), round_idx, seed


def _local_plan(plan: DropoutPlan, members: tuple[int, ...]) -> DropoutPlan:
    index = {p: i for i, p in enumerate(members)}
    return DropoutPlan(**{s: frozenset(index[p] for p in getattr(plan, s) if p in index) for s in DROPOUT_STAGES})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grouped_rounds())
def test_the_committed_sum_is_the_counted_devices_sum_over_all_groups(scenario: tuple[Any, ...]) -> None:
    groups, configs, plan, round_idx, seed = scenario
    n, length = sum(len(g) for g in groups), configs[0].vector_length
    encoding = configs[0].encoding
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2 * encoding.clip, 2 * encoding.clip, size=(n, length))
    x[:, 0] = 10 * encoding.clip  # every device at the top level: the largest sums the encoding allows

    want_counted: list[int] = []
    want_groups = []
    for j, (members, cfg) in enumerate(zip(groups, configs, strict=True)):
        want = oracle(cfg, _local_plan(plan, members), round_idx)
        if want.ok:
            want_groups.append(j)
            want_counted.extend(members[i] for i in want.counted)
    event(f"groups: {len(groups)}; committing: {'all' if len(want_groups) == len(groups) else len(want_groups)}")

    out = run_grouped_round(x, groups=groups, configs=configs, dropouts=plan, round_idx=round_idx, seed=seed)
    assert out.committed == tuple(want_groups)
    for j, o in enumerate(out.outcomes):
        assert o.ok == (j in want_groups), (j, o.abort_stage, o.abort_reason)
    if not want_groups:
        assert not out.ok and out.encoded_sum is None and out.counted == ()
        return
    assert out.ok and len(out.counted) == len(set(out.counted))  # nobody counted twice
    assert out.counted == tuple(sorted(want_counted))
    plain = sum(
        (encoding.encode(x[p], np.random.default_rng((seed, p))).astype(np.uint64) for p in want_counted),
        np.zeros(length, dtype=np.uint64),
    )
    assert int(plain.max()) < 2**encoding.modulus_bits  # the cohort-wide encoding: no partial sum wraps
    assert out.encoded_sum is not None and out.mean is not None
    np.testing.assert_array_equal(out.encoded_sum.astype(np.uint64), plain)
    assert out.exact
    clipped = np.clip(x[list(want_counted)], -encoding.clip, encoding.clip)
    np.testing.assert_allclose(out.mean, clipped.mean(0), atol=encoding.step, rtol=0)


def test_some_scenarios_abort_a_group_and_commit_others() -> None:
    """Guard against a vacuous property: a fixed round where one group of
    three aborts and the others commit."""
    groups = partition(range(12), group_size=4, seed=partition_seed(b"g", 0))
    configs = group_configs(groups, vector_length=3, session_id=b"g")
    plan = DropoutPlan(masked_input=frozenset(groups[0][:2]))  # 2 of 4 left: below t = 3
    x = np.random.default_rng(1).normal(size=(12, 3))
    out = run_grouped_round(x, groups=groups, configs=configs, dropouts=plan, seed=5)
    assert out.committed == (1, 2) and out.counted == tuple(sorted(groups[1] + groups[2]))
    assert out.outcomes[0].abort_stage == "masked_input" and out.exact


def test_one_group_or_many_give_the_same_sum_bit_for_bit() -> None:
    """With nobody dropping, the groups' total is the single round's sum:
    one encoding, and each device rounds with (seed, its position)."""
    n, length = 30, 8
    x = np.random.default_rng(2).normal(size=(n, length))
    single = run_round(x, config=SecAggConfig.create(num_clients=n, vector_length=length, session_id=b"s"), seed=9)
    groups = partition(range(n), group_size=7, seed=partition_seed(b"s", 0))
    out = run_grouped_round(x, groups=groups, configs=group_configs(groups, vector_length=length, session_id=b"s"),
                            seed=9)  # fmt: skip
    assert len(groups) == 4 and out.counted == tuple(range(n))
    assert single.encoded_sum is not None and out.encoded_sum is not None and single.sum is not None
    np.testing.assert_array_equal(out.encoded_sum, single.encoded_sum)
    np.testing.assert_array_equal(out.sum, single.sum)


def test_a_device_refuses_a_group_below_its_floor() -> None:
    """A coordinator may put a device in a group of two; a floor of 3
    applies to the group, not the cohort: that group's devices withdraw and
    it adds nobody, the other group commits."""
    groups = ((0, 1), tuple(range(2, 12)))
    configs = group_configs(groups, vector_length=2, session_id=b"f")
    assert all(c.encoding.max_level == (2**32 - 1) // 12 for c in configs)  # the cohort's encoding

    def floor(position: int, config: SecAggConfig) -> str | None:
        return "group too small" if config.num_clients < 3 else None

    out = run_grouped_round(np.zeros((12, 2)), groups=groups, configs=configs, refuse=floor)
    assert out.refused == {0: "group too small", 1: "group too small"}
    assert out.committed == (1,) and out.counted == tuple(range(2, 12)) and out.exact


def test_groups_that_do_not_fit_are_refused() -> None:
    groups = ((0, 1, 2), (3, 4, 5))
    configs = group_configs(groups, vector_length=2, session_id=b"c")
    x = np.zeros((6, 2))
    with pytest.raises(ValueError, match="exactly once"):
        run_grouped_round(x, groups=((0, 1, 2), (2, 4, 5)), configs=configs)
    with pytest.raises(ValueError, match="groups for"):
        run_grouped_round(x, groups=groups, configs=configs[:1])
    own = SecAggConfig.create(num_clients=3, vector_length=2, session_id=b"c/other")  # sized for 3, not 6
    with pytest.raises(ValueError, match="another encoding"):
        check_groups(6, 2, groups, (configs[0], own))
    small = tuple(SecAggConfig.create(num_clients=3, vector_length=2, session_id=bytes([j + 1])) for j in range(2))
    with pytest.raises(ValueError, match="could wrap"):
        check_groups(6, 2, groups, small)
    with pytest.raises(ValueError, match="session id"):
        check_groups(6, 2, groups, (configs[0], configs[0]))
    with pytest.raises(ValueError, match="outside"):
        run_grouped_round(x, groups=groups, configs=configs, dropouts=DropoutPlan(unmasking=frozenset({6})))
