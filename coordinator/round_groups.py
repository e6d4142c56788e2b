"""Which devices of a cohort share a secure-aggregation group, over gRPC
(pure; D99).

`secagg.groups.partition` cuts a cohort into groups of at least G devices
with no regard for where they connect. Over gRPC a client stream carries
one round at a time (a new RoundTask supersedes the one before), so all the
cohort devices one stream hosts must be in the same group. Real phones hold
one device per stream; the benches' and demos' client processes hold many.

Contract of `groups_by_host(cohort, host_of, group_size=G, seed=S)`
-------------------------------------------------------------------
- A cohort smaller than 2G is one group. Otherwise every group has at least
  G devices: m = floor(n / G) bins are filled with the hosts, largest host
  first (ties in a keyed random order from the seed), each into the bin
  with the fewest devices so far; then, while a bin has fewer than G, the
  smallest bin joins the next smallest. A host holding 2G or more devices
  simply makes its group that large.
- Every device is in exactly one group; the devices of one host are in the
  same group. A device without a host (`host_of` lacks it) is a host alone.
- Deterministic: the same cohort (as a set), hosts, G and seed give the same
  groups, each listing its devices in ascending order, the groups ordered
  by their smallest device.

With one device per host this gives groups of floor(n / m) or ceil(n / m)
devices, as `partition` does. The seed is public (`partition_seed`): it
makes the grouping reproducible, not secret; a malicious coordinator
chooses groups whatever the rule, and a device's defence is its own floor
on the group it is asked into (D34, D87).

Over a tier of replicas (`replica_groups`, contract in its docstring) a
group is formed from devices whose streams one replica holds, so no
secure-aggregation message crosses replicas: the round's target cohort is
shared among the replicas that hold at least G eligible devices, and each
replica cuts its share with `groups_by_host`. A one-replica tier groups
exactly as `round_groups` does.
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.selection import select_cohort
from secagg.errors import SecAggConfigError
from secagg.graph import random_permutation
from secagg.groups import group_count, partition_seed
from secagg.keys import SEED_BYTES

if TYPE_CHECKING:
    from coordinator.registry import ClientSession


def groups_by_host(cohort: Iterable[int], host_of: Mapping[int, int], *, group_size: int,
                   seed: bytes) -> tuple[tuple[int, ...], ...]:
    """The round's groups (see the module doc). SecAggConfigError for a
    cohort of fewer than 2 devices, a device listed twice or a group size
    below 2."""
    members = sorted(cohort)
    if len(set(members)) != len(members):
        raise SecAggConfigError("the cohort lists a device twice")
    m = group_count(len(members), group_size)
    if m == 1:
        return (tuple(members),)
    hosts: dict[tuple[int, int], list[int]] = {}
    for d in members:
        key = (0, host_of[d]) if d in host_of else (1, d)  # a device without a host is a host alone
        hosts.setdefault(key, []).append(d)
    units = sorted(hosts.values(), key=lambda devices: devices[0])
    rank = random_permutation(len(units), seed)  # ties between hosts of one size: a keyed order
    order = sorted(range(len(units)), key=lambda i: (-len(units[i]), int(rank[i])))
    bins: list[list[int]] = [[] for _ in range(m)]
    for i in order:
        min(bins, key=len).extend(units[i])
    bins = [b for b in bins if b]
    while len(bins) > 1:
        bins.sort(key=len)
        if len(bins[0]) >= group_size:
            break
        bins[1].extend(bins.pop(0))
    return tuple(sorted((tuple(sorted(b)) for b in bins), key=lambda g: g[0]))


def round_groups(group_size: int, cohort: Sequence[int], session_id: bytes,
                 owner: Callable[[int], ClientSession | None]) -> tuple[tuple[int, ...], ...]:
    """The groups of a round over `cohort`: `groups_by_host` at `group_size`
    (secagg.group_size) with each device's stream (`owner`) as its host and
    the public partition seed of the round's fresh session nonce; one group
    when there are none (group_size 0, or a cohort under 2G)."""
    if group_size < 2 or len(cohort) < 2 * group_size:
        return (tuple(cohort),)
    hosts = {d: s.sid for d in cohort if (s := owner(d)) is not None}
    return groups_by_host(cohort, hosts, group_size=group_size, seed=partition_seed(session_id, 0))


def groups_refusal(*, group_size: int, selected: int, plaintext: bool, hybrid: bool,
                   removable: bool = False) -> str | None:
    """Why rounds in groups (D99) cannot run with these settings, or None:
    when a selected cohort can be split (group_size >= 2, selected >= 2G)
    with the plaintext path or the hybrid one, which have one machine each.
    Noise of any kind runs in groups: local noise is every device's own, and
    distributed noise is split among each group's own devices
    (`round_machines.plan_groups`); removable noise (D110) does not yet: its
    surplus is removed by the one-instance round loop only."""
    if group_size < 2 or selected < 2 * group_size:
        return None
    why = ("debug.insecure_plaintext" if plaintext else "hybrid.unprotected_plaintext_j_bound" if hybrid
           else "dp.dropouts 'remove'" if removable else None)
    if why is None:
        return None
    return (f"a selected cohort of {selected} devices would run in groups of at least secagg.group_size = "
            f"{group_size}, and rounds in groups do not run with {why}: set secagg.group_size to 0 (one "
            f"instance) or above {selected // 2}")


@dataclass(frozen=True)
class ReplicaPlan:
    """A round's groups over a tier of replicas (`replica_groups`).

    `groups`: each group's replica and members (ascending), ordered by
    (replica, smallest device); empty when no round runs.
    `left_out_replicas`: the replicas that hold no group, by name.
    `devices_left_out`: the eligible devices of those replicas."""

    groups: tuple[tuple[str, tuple[int, ...]], ...]
    left_out_replicas: tuple[str, ...]
    devices_left_out: int

    @property
    def cohort(self) -> tuple[int, ...]:
        """Every selected device, ascending (empty: no round)."""
        return tuple(sorted(d for _, members in self.groups for d in members))


def replica_groups(eligible_by_replica: Mapping[str, Sequence[int]], hosts: Mapping[int, Hashable], *,
                   group_size: int, target: int, minimum: int, seed: bytes, rng: random.Random) -> ReplicaPlan:
    """A round's cohort and groups over a tier of replicas, each group
    inside one replica (pure; deterministic for the inputs, `seed` and the
    state of `rng`, whatever the mappings' order).

    `eligible_by_replica`: each replica's eligible devices (the devices
    whose streams it holds; duplicates count once). `hosts`: each device's
    stream; a device's host is (its replica, hosts[device]), a device
    without one is a host alone. `target`: the cohort to select, over-
    selection included. `seed`: the round's public partition seed (32
    bytes, `partition_seed`). G = `group_size`.

    - Replicas are ranked by eligible devices, most first; ties in a keyed
      order from `seed` (HMAC-SHA256(seed, name), not the names' order).
    - One instance when G < 2 (groups off), target < 2G, or no replica holds
      G eligible devices: one group on the first-ranked replica, of
      min(target, its eligible) devices; every other replica is left out.
    - Otherwise the replicas under G are left out, and the target is shared
      among the rest in proportion to their eligible devices (largest
      remainders, ties in rank order): each share is the floor or the ceil
      of its exact proportion, at most the replica's eligible, and the
      shares sum to min(target, the kept replicas' eligible total). While a
      share is under G, the last-ranked kept replica is left out and the
      split redone; one kept replica takes min(target, its eligible) >= G.
    - Each share is drawn by `select_cohort` from its replica's eligible
      devices (replicas in name order, one draw each from `rng`), then cut
      by `groups_by_host` with `seed` (one group under 2G): every group has
      at least G devices, except in the one-instance case, and a stream's
      selected devices are in one group. The draw is of devices, so the
      cohort has exactly the shares' sum whatever the hosts; hosts shape the
      groups only (a host of 2G or more makes its group that large).
    - No round (a plan with no groups, every replica left out) when the
      kept replicas hold fewer than `minimum` eligible devices, as
      `select_cohort` returns None. (So a replica left out for its share
      can cost the round when `minimum` exceeds the largest replica.)

    `devices_left_out` counts the eligible devices of the left-out
    replicas; a kept replica's devices outside its share are not counted.
    ValueError for a target or minimum under 1, a seed that is not 32 bytes
    or a device eligible on two replicas."""
    if target < 1 or minimum < 1:
        raise ValueError("target and minimum must be >= 1")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"the seed must be {SEED_BYTES} bytes, got {len(seed)}")
    pools = {name: sorted(set(devices)) for name, devices in eligible_by_replica.items()}
    seen: dict[int, str] = {}
    for name in sorted(pools):
        for d in pools[name]:
            if seen.setdefault(d, name) != name:
                raise ValueError(f"device {d} is eligible on two replicas ({seen[d]!r} and {name!r})")
    ranked = sorted(pools, key=lambda name: (-len(pools[name]), _tie_key(seed, name)))
    grouped = group_size >= 2 and target >= 2 * group_size and bool(ranked) and len(pools[ranked[0]]) >= group_size
    if grouped:
        shares = _shares({r: len(pools[r]) for r in ranked if len(pools[r]) >= group_size}, target, group_size)
    else:
        shares = {r: min(target, len(pools[r])) for r in ranked[:1]}
    if sum(len(pools[r]) for r in shares) < minimum:
        return ReplicaPlan((), tuple(sorted(pools)), sum(map(len, pools.values())))
    groups: list[tuple[str, tuple[int, ...]]] = []
    for name in sorted(shares):
        chosen = select_cohort(pools[name], target=shares[name], minimum=1, rng=rng)
        assert chosen is not None  # every share is >= 1 and at most the replica's eligible
        if not grouped or len(chosen) < 2 * group_size:
            groups.append((name, tuple(chosen)))
            continue
        interned: dict[Hashable, int] = {}
        host_of = {d: interned.setdefault(hosts[d], len(interned)) for d in chosen if d in hosts}
        groups.extend((name, g) for g in groups_by_host(chosen, host_of, group_size=group_size, seed=seed))
    left_out = tuple(sorted(set(pools) - set(shares)))
    return ReplicaPlan(tuple(groups), left_out, sum(len(pools[r]) for r in left_out))


def _tie_key(seed: bytes, name: str) -> bytes:
    """A replica's place among replicas of one size: keyed by the seed."""
    return hmac.new(seed, name.encode(), hashlib.sha256).digest()


def _shares(eligible: Mapping[str, int], target: int, group_size: int) -> dict[str, int]:
    """The target shared among `eligible` (replica: eligible devices, in
    rank order, each >= G) in proportion (largest remainders, ties in rank
    order); the last-ranked replica is dropped while a share is under G."""
    kept = list(eligible)
    while True:
        total = sum(eligible[r] for r in kept)
        want = min(target, total)
        shares = {r: want * eligible[r] // total for r in kept}
        rest = want - sum(shares.values())
        by_remainder = sorted(range(len(kept)), key=lambda i: (-(want * eligible[kept[i]] % total), i))
        for i in by_remainder[:rest]:
            shares[kept[i]] += 1
        if len(kept) == 1 or min(shares.values()) >= group_size:
            return shares
        kept.pop()


__all__ = ["ReplicaPlan", "groups_by_host", "groups_refusal", "replica_groups", "round_groups"]
