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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from secagg.errors import SecAggConfigError
from secagg.graph import random_permutation
from secagg.groups import group_count, partition_seed

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


def groups_refusal(*, group_size: int, selected: int, plaintext: bool, hybrid: bool) -> str | None:
    """Why rounds in groups (D99) cannot run with these settings, or None:
    when a selected cohort can be split (group_size >= 2, selected >= 2G)
    with the plaintext path or the hybrid one, which have one machine each.
    Noise of any kind runs in groups: local noise is every device's own, and
    distributed noise is split among each group's own devices
    (`round_machines.plan_groups`)."""
    if group_size < 2 or selected < 2 * group_size:
        return None
    why = "debug.insecure_plaintext" if plaintext else "hybrid.unprotected_plaintext_j_bound" if hybrid else None
    if why is None:
        return None
    return (f"a selected cohort of {selected} devices would run in groups of at least secagg.group_size = "
            f"{group_size}, and rounds in groups do not run with {why}: set secagg.group_size to 0 (one "
            f"instance) or above {selected // 2}")


__all__ = ["groups_by_host", "groups_refusal", "round_groups"]
