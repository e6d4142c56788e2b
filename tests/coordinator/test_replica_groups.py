"""`replica_groups`: a round's cohort and groups over a tier of replicas,
checked property by property against an oracle written here (which
replicas may hold the round, how many devices each must give, what is left
out), independently of the implementation's ranking and split."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from coordinator.round_groups import ReplicaPlan, replica_groups, round_groups
from coordinator.selection import select_cohort
from secagg.groups import partition_seed

if TYPE_CHECKING:
    from coordinator.registry import ClientSession

SEED = partition_seed(b"session", 0)


@dataclass(frozen=True)
class Fleet:
    eligible: dict[str, list[int]]
    hosts: dict[int, Hashable]
    group_size: int
    target: int
    minimum: int
    rng_seed: int


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    g = draw(st.sampled_from([2, 5, 100]))
    names = draw(st.lists(st.sampled_from(["r0", "r1", "r2", "r3", "r4", "zeta", "alpha"]), min_size=1, max_size=5,
                          unique=True))
    sizes = [draw(st.one_of(st.integers(0, 600), st.integers(max(0, g - 2), g + 2))) for _ in names]
    build = random.Random(draw(st.integers(0, 2**32)))  # ids and streams: too many draws for hypothesis's buffer
    ids = build.sample(range(10**6), sum(sizes))
    eligible: dict[str, list[int]] = {}
    hosts: dict[int, Hashable] = {}
    for name, size in zip(names, sizes):
        devices, ids = ids[:size], ids[size:]
        eligible[name] = devices
        streams = draw(st.integers(1, max(1, size)))  # few streams: some carry many devices
        for d in devices:  # stream ids repeat across replicas: a host is (replica, stream); 1 in 20 has none
            if build.randrange(20):
                k = build.randrange(streams)
                hosts[d] = k if k % 2 else f"stream-{k}"
    target = draw(st.one_of(st.integers(1, 2 * g - 1), st.integers(2 * g, 3000)))
    minimum = draw(st.one_of(st.integers(1, 10), st.integers(1, 3 * g)))
    return Fleet(eligible, hosts, g, target, minimum, draw(st.integers(0, 2**32)))


def _plan(f: Fleet, *, seed: bytes = SEED, rng_seed: int | None = None) -> ReplicaPlan:
    rng = random.Random(f.rng_seed if rng_seed is None else rng_seed)
    return replica_groups(f.eligible, f.hosts, group_size=f.group_size, target=f.target, minimum=f.minimum,
                          seed=seed, rng=rng)


def _check_split(f: Fleet, plan: ReplicaPlan, size: dict[str, int], kept: list[str]) -> None:
    """The grouped case: only replicas of G or more, the largest ones, each
    giving its proportional share (floor or ceil), no share under G."""
    g = f.group_size
    assert all(size[r] >= g for r in kept)
    dropped = [r for r in size if r not in kept and size[r] >= g]
    assert all(size[d] <= size[k] for d in dropped for k in kept)  # the smallest are dropped first
    total = sum(size[r] for r in kept)
    want = min(f.target, total)
    given_by = {r: sum(len(m) for name, m in plan.groups if name == r) for r in kept}
    assert sum(given_by.values()) == len(plan.cohort) == want
    for r in kept:
        exact = want * size[r] / total
        assert given_by[r] >= g and abs(given_by[r] - exact) < 1
    if dropped:  # with the next largest back, some replica's exact share was under G
        back = max(dropped, key=lambda r: size[r])
        wider = kept + [back]
        total2 = sum(size[r] for r in wider)
        assert min(min(f.target, total2) * size[r] / total2 for r in wider) < g
    assert all(len(m) >= g for _, m in plan.groups)


@settings(deadline=None, max_examples=600)
@given(fleets())
def test_the_plan_keeps_groups_in_replicas_and_follows_the_split(f: Fleet) -> None:
    g = f.group_size
    plan = _plan(f)
    size = {r: len(set(devs)) for r, devs in f.eligible.items()}
    replica_of = {d: r for r, devs in f.eligible.items() for d in devs}
    kept = sorted({r for r, _ in plan.groups})
    # the oracle's own count of what is left out
    assert plan.left_out_replicas == tuple(sorted(set(size) - set(kept)))
    assert plan.devices_left_out == sum(n for r, n in size.items() if r not in kept)
    flat = [d for _, m in plan.groups for d in m]
    assert len(flat) == len(set(flat)) and tuple(sorted(flat)) == plan.cohort
    for r, members in plan.groups:
        assert members and list(members) == sorted(members)
        assert all(replica_of[d] == r for d in members)  # one replica, and eligible on it
    assert [(r, m[0]) for r, m in plan.groups] == sorted((r, m[0]) for r, m in plan.groups)
    where = {d: j for j, (_, m) in enumerate(plan.groups) for d in m}
    by_host: dict[tuple[str, Hashable], set[int]] = {}
    for d in flat:
        if d in f.hosts:
            by_host.setdefault((replica_of[d], f.hosts[d]), set()).add(where[d])
    assert all(len(groups) == 1 for groups in by_host.values())
    one_instance = g < 2 or f.target < 2 * g or max(size.values()) < g
    dropped = any(size[r] >= g for r in plan.left_out_replicas)
    event("no round" if not plan.groups else "one instance" if one_instance else
          f"grouped: {len(kept)} replicas kept{', some of G or more dropped' if dropped else ''}")
    if len(plan.groups) > len(kept):
        event("a replica holds several groups")
    if one_instance:
        biggest = max(size.values())
        if biggest < f.minimum:
            assert plan.groups == () and plan.devices_left_out == sum(size.values())
        else:
            assert len(plan.groups) == 1 and size[kept[0]] == biggest
            assert len(plan.cohort) == min(f.target, biggest)
    else:
        assert not any(size[r] < g for r in kept)
        if plan.groups:
            assert sum(size[r] for r in kept) >= f.minimum
            _check_split(f, plan, size, kept)
        else:  # the largest replica is always kept: no round only when it is under the minimum
            assert max(size.values()) < f.minimum and plan.devices_left_out == sum(size.values())
    assert _plan(f) == plan  # the same seed and rng state give the same plan
    shuffled = Fleet({r: f.eligible[r][::-1] for r in reversed(list(f.eligible))}, f.hosts, g, f.target, f.minimum,
                     f.rng_seed)
    assert _plan(shuffled) == plan  # whatever the mappings' and lists' order


@settings(deadline=None, max_examples=150)
@given(n=st.integers(0, 900), g=st.sampled_from([0, 2, 5, 100]), target=st.integers(1, 1200),
       minimum=st.integers(1, 250), streams=st.integers(1, 900), rng_seed=st.integers(0, 2**32),
       session=st.binary(min_size=1, max_size=16))
def test_one_replica_is_todays_round(n: int, g: int, target: int, minimum: int, streams: int, rng_seed: int,
                                     session: bytes) -> None:
    """One replica holding every stream: the same draw from the same rng
    and the same groups as `select_cohort` then `round_groups`."""
    devices = random.Random(rng_seed).sample(range(10**5), n)
    sid = {d: d % streams for d in devices}
    rng_today, rng_tier = random.Random(rng_seed), random.Random(rng_seed)
    cohort = select_cohort(devices, target=target, minimum=minimum, rng=rng_today)
    plan = replica_groups({"only": devices}, {d: f"sid-{s}" for d, s in sid.items()}, group_size=g, target=target,
                          minimum=minimum, seed=partition_seed(session, 0), rng=rng_tier)
    if cohort is None:
        assert plan == ReplicaPlan((), ("only",), n)
        return

    def owner(d: int) -> ClientSession | None:
        return cast("ClientSession", SimpleNamespace(sid=sid[d]))

    today = round_groups(g, cohort, session, owner)
    assert plan.groups == tuple(("only", grp) for grp in today)
    assert plan.left_out_replicas == () and plan.devices_left_out == 0
    assert rng_tier.getstate() == rng_today.getstate()


def test_ties_are_broken_by_the_seed_not_by_name() -> None:
    eligible = {"a": list(range(0, 50)), "b": list(range(100, 150)), "c": list(range(200, 240))}
    chosen = {replica_groups(eligible, {}, group_size=100, target=150, minimum=10, seed=partition_seed(bytes([s]), 0),
                             rng=random.Random(0)).groups[0][0] for s in range(1, 65)}
    assert chosen == {"a", "b"}  # both tied replicas, never the smaller one
    plan = replica_groups(eligible, {}, group_size=100, target=150, minimum=10, seed=SEED, rng=random.Random(0))
    assert len(plan.groups) == 1 and len(plan.cohort) == 50 and plan.devices_left_out == 90


def test_the_target_is_shared_in_proportion_and_small_replicas_are_left_out() -> None:
    eligible = {"a": list(range(0, 300)), "b": list(range(300, 420)), "c": list(range(500, 540)), "d": []}
    plan = replica_groups(eligible, {}, group_size=50, target=330, minimum=10, seed=SEED, rng=random.Random(3))
    per = {r: sum(len(m) for name, m in plan.groups if name == r) for r in ("a", "b")}
    assert per == {"a": 236, "b": 94}  # 330 * 300/420 = 235.7, 330 * 120/420 = 94.3
    assert plan.left_out_replicas == ("c", "d") and plan.devices_left_out == 40
    assert [r for r, _ in plan.groups] == ["a"] * 4 + ["b"] and min(len(m) for _, m in plan.groups) >= 50
    # 2G = 100 shared 75 : 25 would give b less than G: b is dropped and a gives its 100
    plan = replica_groups({"a": list(range(150)), "b": list(range(200, 250))}, {}, group_size=50, target=100,
                          minimum=10, seed=SEED, rng=random.Random(3))
    assert [(r, len(m)) for r, m in plan.groups] == [("a", 50), ("a", 50)]
    assert plan.left_out_replicas == ("b",) and plan.devices_left_out == 50


def test_hosts_shape_the_groups_never_the_cohort_size() -> None:
    """A stream holding most of a replica: the cohort still has exactly
    min(target, eligible) devices; the stream's selected devices make one
    group larger than G and the others still reach G."""
    eligible = {"a": list(range(1000)), "b": list(range(2000, 2300))}
    hosts: dict[int, Hashable] = {d: "big" for d in range(700)}
    hosts.update({d: "big" for d in range(2000, 2300)})  # the same stream id on b is another host
    plan = replica_groups(eligible, hosts, group_size=100, target=1300, minimum=10, seed=SEED, rng=random.Random(0))
    assert len(plan.cohort) == 1300
    big = [m for r, m in plan.groups if r == "a" and 0 in m]
    assert len(big) == 1 and set(range(700)) <= set(big[0])
    assert [m for r, m in plan.groups if r == "b"] == [tuple(range(2000, 2300))]
    assert min(len(m) for _, m in plan.groups) >= 100


def test_no_round_below_the_minimum_and_bad_input_is_refused() -> None:
    eligible = {"a": list(range(40)), "b": list(range(100, 130))}
    plan = replica_groups(eligible, {}, group_size=50, target=200, minimum=41, seed=SEED, rng=random.Random(0))
    assert plan == ReplicaPlan((), ("a", "b"), 70) and plan.cohort == ()
    # no replica reaches G: one instance on the largest, as one replica does today
    plan = replica_groups(eligible, {}, group_size=50, target=200, minimum=40, seed=SEED, rng=random.Random(0))
    assert plan.groups == (("a", tuple(range(40))),) and plan.devices_left_out == 30
    # dropping b (its share 4500 * 520/4920 = 475.6 < G) leaves a's 4400 under a minimum of 4500: no round,
    # although both hold 4920 (the proportional rule's price, with a minimum above the largest replica)
    eligible2 = {"a": list(range(4400)), "b": list(range(5000, 5520))}
    plan = replica_groups(eligible2, {}, group_size=500, target=4500, minimum=4500, seed=SEED, rng=random.Random(0))
    assert plan == ReplicaPlan((), ("a", "b"), 4920)
    with pytest.raises(ValueError, match="two replicas"):
        replica_groups({"a": [1, 2], "b": [2]}, {}, group_size=2, target=4, minimum=1, seed=SEED, rng=random.Random())
    with pytest.raises(ValueError, match="32 bytes"):
        replica_groups(eligible, {}, group_size=2, target=4, minimum=1, seed=b"short", rng=random.Random())
    with pytest.raises(ValueError, match=">= 1"):
        replica_groups(eligible, {}, group_size=2, target=0, minimum=1, seed=SEED, rng=random.Random())
