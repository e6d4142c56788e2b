"""A round in groups, in process: one real SecAgg(+) instance per group,
their sums added and decoded once (D87).

    run_grouped_round(inputs, *, groups, configs, dropouts=None, round_idx=0,
                      seed=0, wire=True, stochastic_rounding=True,
                      refuse=None, positions=None, first_group=0) -> GroupedOutcome

- inputs: float array (n, L), one row per device of the cohort; a device is
  named by its row, its *position* in the cohort. Or uint32 residues of
  Z_{2^w} already encoded (the discrete Gaussian's, D88; see
  `secagg.inprocess.run_round`): then the committed sum is the counted
  residues' sum mod 2^w, bit for bit, and its decoding is the caller's.
- groups: the partition of positions 0..n-1 (`secagg.groups.partition`);
  configs[j]: group j's instance (`group_configs`): len(groups[j]) devices,
  its own session id, and the round's ONE encoding, sized for the whole
  cohort: the same clip, w and max_level in every group, with
  n * max_level < 2^w (`FixedPointEncoding.for_group`).
- dropouts: a `DropoutPlan` over cohort positions.
- refuse(position, config) -> reason | None: a device's own floor on the
  group it is asked into (e.g. `edge_client`'s `CohortFloor.refusal`); a
  device that refuses withdraws before it advertises its keys.
- positions, first_group: when the rows are one part of a larger cohort
  (one rank's devices in a distributed simulation, D93), row p is the
  cohort's position positions[p] (its rounding key) and group j is the
  cohort's group first_group + j (its keys' seed). The configs' encoding
  is then the whole cohort's, the part's sum is committed like any other
  and `encoded_sum` (with `expected_encoded_sum`) is what the parts add,
  as integers mod 2^w, before the one decoding of the cohort's sum.

Each group runs `secagg.inprocess.run_round`: its devices' real client
states and its server's real states, every message through its wire
encoding (`wire=True`). Device i of group j is the cohort's position
groups[j][i]; it rounds its encoding with (seed, position), so its encoded
input is the one it would have in a single round of the whole cohort, and
its keys come from a seed of its group's own.

The result. A group that aborts (too few devices past a threshold)
contributes nobody. The counted set is the union of the committed groups'
counted sets (disjoint: a position is in one group), and the committed sum
is the sum of their unmasked sums mod 2^w, decoded once with the round's
encoding. Because that encoding is sized for the n devices of the cohort,
no sum over any subset of them reaches 2^w: the committed sum is the exact
integer sum of the counted devices' encoded inputs, bit for bit
(`exact`). The round is `ok` when at least one group committed; a caller
with a minimum number of counted devices checks `counted` itself.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from secagg.errors import EncodingRangeError
from secagg.groups import group_session_id
from secagg.inprocess import DROPOUT_STAGES, DropoutPlan, RoundOutcome, run_round

Refuse = Callable[[int, SecAggConfig], str | None]


@dataclass
class GroupedOutcome:
    """What a round in groups produced; positions are rows of the inputs."""

    ok: bool  # at least one group committed
    encoding: FixedPointEncoding  # the round's one encoding
    groups: tuple[tuple[int, ...], ...]
    outcomes: tuple[RoundOutcome, ...]  # group j's own outcome (its ids are indices into groups[j])
    committed: tuple[int, ...] = ()  # the groups whose sum is counted
    counted: tuple[int, ...] = ()  # positions: the union of the committed groups' counted sets
    refused: dict[int, str] = field(default_factory=dict)  # position -> why it refused its group
    encoded_sum: np.ndarray | None = None  # uint32: the committed groups' sums added mod 2^w
    residues: bool = False  # the inputs were residues of Z_{2^w}: no fixed-point decoding
    sum: np.ndarray | None = None  # decoded float64 sum of the counted devices
    mean: np.ndarray | None = None
    expected_encoded_sum: np.ndarray | None = None  # plaintext sum of the counted encoded inputs (check)
    exact: bool | None = None  # encoded_sum == expected_encoded_sum, bit for bit
    wall_s: float = 0.0


def group_configs(groups: Sequence[Sequence[int]], *, session_id: bytes, **settings: Any) -> tuple[SecAggConfig, ...]:
    """One `SecAggConfig` per group: `SecAggConfig.create(num_clients=|group|,
    session_id=<the group's>, encoding_clients=<the cohort's size>,
    **settings)`, `settings` being its other keywords (vector_length, clip,
    neighbors, threshold, modulus_bits, ...), the same for every group. So
    each group has its own session id and the encoding of the whole cohort
    (the groups' sizes added)."""
    cohort = sum(len(g) for g in groups)
    return tuple(
        SecAggConfig.create(num_clients=len(g), session_id=group_session_id(session_id, j), encoding_clients=cohort,
                            **settings)
        for j, g in enumerate(groups)
    )


def check_groups(num_clients: int, vector_length: int, groups: Sequence[Sequence[int]],
                 configs: Sequence[SecAggConfig]) -> FixedPointEncoding:
    """The round's encoding (for the n devices of the cohort), once the
    groups and their configs are checked: the groups partition 0..n-1,
    config j fits group j, every group has the same encoding (clip, w,
    max_level) and its own session id, and n inputs at that max_level sum
    below 2^w. ValueError otherwise."""
    if len(groups) != len(configs) or not groups:
        raise ValueError(f"{len(groups)} groups for {len(configs)} configs")
    flat = sorted(p for g in groups for p in g)
    if flat != list(range(num_clients)):
        raise ValueError(f"the groups must list each of the {num_clients} positions exactly once")
    first = configs[0].encoding
    scale = (first.clip, first.modulus_bits, first.max_level)
    for j, (g, cfg) in enumerate(zip(groups, configs, strict=True)):
        if cfg.num_clients != len(g) or cfg.vector_length != vector_length:
            raise ValueError(f"group {j}: config for n={cfg.num_clients} L={cfg.vector_length}, "
                             f"group of {len(g)} with L={vector_length}")
        if (cfg.encoding.clip, cfg.encoding.modulus_bits, cfg.encoding.max_level) != scale:
            raise ValueError(f"group {j} has another encoding: a round has one encoding")
    try:
        encoding = FixedPointEncoding(first.clip, num_clients, first.modulus_bits, first.max_level)
    except EncodingRangeError as e:
        raise ValueError(f"the encoding is not sized for the cohort of {num_clients}: the groups' sums could wrap "
                         f"({e})") from None
    if len({cfg.session_id for cfg in configs}) != len(configs):
        raise ValueError("two groups share a session id")
    return encoding


def run_grouped_round(
    inputs: np.ndarray,
    *,
    groups: Sequence[Sequence[int]],
    configs: Sequence[SecAggConfig],
    dropouts: DropoutPlan | None = None,
    round_idx: int = 0,
    seed: int = 0,
    wire: bool = True,
    stochastic_rounding: bool = True,
    refuse: Refuse | None = None,
    positions: Sequence[int] | None = None,
    first_group: int = 0,
) -> GroupedOutcome:
    """Run one round of the cohort in groups (see the module doc). Never
    raises for dropouts, refusals or aborted groups: those show in the
    outcome. ValueError for groups or configs that do not fit the inputs."""
    wall0 = time.perf_counter()
    x = np.asarray(inputs)
    if x.ndim != 2:
        raise ValueError(f"inputs must be (n, L), got shape {x.shape}")
    n, length = x.shape
    encoding = check_groups(n, length, groups, configs)
    cohort_pos = list(range(n)) if positions is None else [int(p) for p in positions]
    if len(cohort_pos) != n:
        raise ValueError(f"{len(cohort_pos)} positions for {n} inputs")
    plan = dropouts or DropoutPlan()
    for stage in DROPOUT_STAGES:
        if any(not 0 <= p < n for p in getattr(plan, stage)):
            raise ValueError(f"dropout plan lists positions outside 0..{n - 1}")
    refused: dict[int, str] = {}
    outcomes: list[RoundOutcome] = []
    for j, (members, cfg) in enumerate(zip(groups, configs, strict=True)):
        members = tuple(members)
        if refuse is not None:
            refused.update((p, why) for p in members if (why := refuse(p, cfg)) is not None)
        outcomes.append(run_round(
            x[list(members)], config=cfg, dropouts=_group_plan(plan, members, refused), round_idx=round_idx,
            seed=group_seed(seed, first_group + j), wire=wire, stochastic_rounding=stochastic_rounding,
            rounding_keys=[(seed, cohort_pos[p]) for p in members],
        ))  # fmt: skip
    out = combine_groups(encoding, tuple(tuple(g) for g in groups), tuple(outcomes), refused)
    out.wall_s = time.perf_counter() - wall0
    return out


def combine_groups(encoding: FixedPointEncoding, groups: tuple[tuple[int, ...], ...],
             outcomes: tuple[RoundOutcome, ...], refused: dict[int, str]) -> GroupedOutcome:
    """Add the committed groups' sums (mod 2^32, then as an element of
    Z_{2^w}) and decode them once; check them against the plaintext sum of
    the counted devices' encoded inputs."""
    out = GroupedOutcome(ok=False, encoding=encoding, groups=groups, outcomes=outcomes, refused=refused)
    committed = tuple(j for j, o in enumerate(outcomes) if o.ok and o.encoded_sum is not None)
    if not committed:
        return out
    total = np.zeros(outcomes[committed[0]].config.vector_length, dtype=np.uint64)
    expected = np.zeros_like(total)
    counted: list[int] = []
    for j in committed:
        o = outcomes[j]
        if o.encoded_sum is None or o.expected_encoded_sum is None:  # never for a committed group
            raise RuntimeError(f"group {j} committed without a sum")
        total += o.encoded_sum
        expected += o.expected_encoded_sum
        counted.extend(groups[j][i] for i in o.counted)
    words = (total & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    out.ok = True
    out.committed = committed
    out.counted = tuple(sorted(counted))
    out.encoded_sum = encoding.reduce(words)
    out.residues = outcomes[committed[0]].residues
    if out.residues:  # residues wrap by design: the sum is exact mod 2^w, and decoded by the caller
        expected &= np.uint64((1 << encoding.modulus_bits) - 1)
        out.exact = bool(np.array_equal(expected, out.encoded_sum.astype(np.uint64)))
    else:
        out.sum = encoding.decode_sum(words, len(counted))
        out.mean = out.sum / len(counted)
        out.exact = bool(expected.max(initial=0) < (1 << encoding.modulus_bits)
                         and np.array_equal(expected, out.encoded_sum.astype(np.uint64)))
    out.expected_encoded_sum = expected.astype(np.uint32)
    return out


def _group_plan(plan: DropoutPlan, members: tuple[int, ...], refused: dict[int, str]) -> DropoutPlan:
    """The cohort's dropout plan restricted to one group, in the group's ids;
    a device that refused the group never advertises its keys."""
    local = {p: i for i, p in enumerate(members)}
    stages = {s: frozenset(local[p] for p in getattr(plan, s) if p in local and p not in refused)
              for s in DROPOUT_STAGES}
    stages["advertise_keys"] |= frozenset(local[p] for p in refused if p in local)
    return DropoutPlan(**stages)


def group_seed(seed: int, group: int) -> int:
    """The seed of group `group`'s devices' keys and random bytes: no two
    groups' devices draw the same keys."""
    digest = hashlib.sha256(f"fedmask/grouped-round/{seed}/{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


__all__ = ["GroupedOutcome", "Refuse", "check_groups", "combine_groups", "group_configs", "group_seed",
           "run_grouped_round"]
