"""Secure aggregation in groups: which devices of a round's cohort share one
SecAgg(+) instance (pure; D87).

As in "Towards Federated Learning at Scale: System Design" (Bonawitz et al.,
2019), a large cohort is not one secure-aggregation instance: it is split
into groups, each group runs its own instance, and the groups' sums are
added. The server therefore learns each group's sum.

Contract of `partition(cohort, group_size=G, seed=S)`
-----------------------------------------------------
- m = max(1, floor(n / G)) groups for a cohort of n devices: a cohort smaller
  than 2G is one group, and every group of a cohort of 2G or more has at
  least G devices (n >= m G).
- Balanced: every group has floor(n / m) or ceil(n / m) devices.
- Every device of the cohort is in exactly one group.
- Deterministic: the same cohort (as a set: its order does not matter), G
  and seed give the same groups. The seed (32 bytes, e.g.
  `partition_seed(session_id, round_idx)`) decides who shares a group: the
  sorted cohort is shuffled by a keyed permutation (AES-256-CTR, as the
  SecAgg+ graph's relabeling) and cut into m consecutive runs.
- Each group lists its devices in ascending order (a device's id in its
  group's instance is its index there); the groups come in the order cut.

The seed is public; it makes the grouping reproducible and balanced, not
secret. A malicious coordinator chooses the groups whatever the rule says;
a device's defence is its own floor on the group it is asked into (D34,
D87).

One encoding per round: every group's `SecAggConfig` is made with
`encoding_clients` = the whole cohort's size (`SecAggConfig.create`), so
that any partial sum (a group's, or the total of several) of encoded inputs
stays below 2^w and the groups' sums add exactly (`secagg.grouped_round`).

The default G (`DEFAULT_GROUP_SIZE` = 500) follows the SecAgg+ parameters
(`secagg.graph.choose_parameters`): with the default failure targets
(10 % dropout, 5 % corrupt, 2^-20 / 2^-40) an instance of 500 to 999 devices
needs degree 36 to 38 and threshold 19 to 20, so a group of 500 is already
sparse (each device works with under 8 % of its group) and past the size
where SecAgg+ meets those targets at all (34 devices). Smaller groups only
cost: the server learns sums over fewer devices, and with distributed DP
the model's noise grows with the number of groups (D87). 500 is the top of
the "few hundred" of Bonawitz 2019, and keeps a cohort below 1,000 (every
ML-100K cohort) one group.
"""

from __future__ import annotations

from collections.abc import Iterable

from secagg.errors import SecAggConfigError
from secagg.graph import random_permutation
from secagg.keys import SEED_BYTES, context, hkdf_sha256

DEFAULT_GROUP_SIZE = 500
MIN_GROUP_SIZE = 2  # one secure-aggregation instance needs two devices


def group_count(cohort_size: int, group_size: int) -> int:
    """How many groups `partition` makes: max(1, floor(n / G))."""
    _check_size(cohort_size, group_size)
    return max(1, cohort_size // group_size)


def partition(cohort: Iterable[int], *, group_size: int, seed: bytes) -> tuple[tuple[int, ...], ...]:
    """The round's groups (see the module doc). SecAggConfigError for a
    cohort of fewer than 2 devices, a device listed twice, an id that is not
    a non-negative int, a group size below 2 or a seed that is not 32 bytes."""
    if isinstance(cohort, (str, bytes)):
        raise SecAggConfigError("the cohort must be an iterable of device ids (ints)")
    ids = list(cohort)
    bad = [d for d in ids if not (isinstance(d, int) and not isinstance(d, bool) and d >= 0)]
    if bad:
        raise SecAggConfigError(f"device ids must be non-negative ints, got {bad[:3]!r}")
    members = sorted(ids)
    if len(set(members)) != len(members):
        dup = next(a for a, b in zip(members, members[1:]) if a == b)
        raise SecAggConfigError(f"the cohort lists device {dup} twice")
    if not (isinstance(seed, bytes) and len(seed) == SEED_BYTES):
        raise SecAggConfigError(f"the partition seed must be {SEED_BYTES} bytes")
    m = group_count(len(members), group_size)
    if m == 1:
        return (tuple(members),)
    order = random_permutation(len(members), seed)
    base, extra = divmod(len(members), m)  # the first `extra` groups take one more
    groups: list[tuple[int, ...]] = []
    start = 0
    for j in range(m):
        size = base + (1 if j < extra else 0)
        groups.append(tuple(sorted(members[int(p)] for p in order[start:start + size])))
        start += size
    return tuple(groups)


def partition_seed(session_id: bytes, round_idx: int) -> bytes:
    """The public 32-byte seed of a round's partition, derived from the
    session and the round (as the SecAgg+ graph's seed is)."""
    if not (isinstance(session_id, bytes) and session_id):
        raise SecAggConfigError("session_id must be non-empty bytes")
    if not (isinstance(round_idx, int) and round_idx >= 0):
        raise SecAggConfigError(f"round_idx must be a non-negative int, got {round_idx!r}")
    return hkdf_sha256(session_id, info=context(b"groups", session_id, round_idx), length=SEED_BYTES)


def group_session_id(session_id: bytes, group: int) -> bytes:
    """The session id of group `group`'s instance: the round's, tagged with
    the group, so no two groups of a session derive a key or a graph from
    the same binding."""
    if not (isinstance(group, int) and group >= 0):
        raise SecAggConfigError(f"group must be a non-negative int, got {group!r}")
    return session_id + b"/group-" + str(group).encode()


def _check_size(cohort_size: int, group_size: int) -> None:
    if isinstance(group_size, bool) or not (isinstance(group_size, int) and group_size >= MIN_GROUP_SIZE):
        raise SecAggConfigError(f"the group size must be an int >= {MIN_GROUP_SIZE}, got {group_size!r}")
    if isinstance(cohort_size, bool) or not (isinstance(cohort_size, int) and cohort_size >= 2):
        raise SecAggConfigError(f"a cohort needs at least 2 devices, got {cohort_size!r}")


__all__ = [
    "DEFAULT_GROUP_SIZE",
    "MIN_GROUP_SIZE",
    "group_count",
    "group_session_id",
    "partition",
    "partition_seed",
]
