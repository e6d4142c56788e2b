"""Which machine runs a round, with what each group's devices are told.

`plan_groups(settings, config, groups, mechanism)` (pure) gives one
`GroupPlan` per group: its devices, its SecAgg config (unbound) and its
noise. A round of one instance is one plan: the cohort, `config` and
`mechanism` as `round_policy.round_plan` made them. A round in groups (D99)
has one plan per group (`round_policy.group_configs_for`: the group's graph
and threshold, the round's one encoding), and with distributed noise each
group's devices split the noise among themselves: every device adds
sigma^2 = z^2 Delta^2 / |g| for its group g (the discrete Gaussian
calibrated once for the smallest group, whose shares are the largest, so
the field is checked for the most noise, then `dpmech.calibrate.with_shares`
for each group: the same scale and field in every group; the float
Gaussian through the task's noise std), so each group's released sum
carries the full multiplier z, as in the simulator (D87). Local noise
is every device's own in any case.

`build_round(settings, number=..., plans=..., ...)` (blocking: binding a
config hashes the model; run it in a worker thread) gives the round's
machine and each group's task fields: one plan -> its config bound to the
round's task (the session id commits to it, D85) and the secure
`RoundMachine`, or the plaintext or hybrid one when the settings ask;
several (or one, with `in_groups`) -> each group's config bound to its
own task and a `GroupedRoundMachine`, which commits when its groups count at least the
threshold one instance over the whole cohort would have (a group that
fails costs only its devices, as long as that holds). With the discrete
Gaussian every group's task carries the round's rotation key (its session
nonce), so that the groups' residues add.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.grouped_rounds import AnyRound, GroupedRoundMachine
from coordinator.hybrid import HybridRoundMachine
from coordinator.plaintext import PlaintextRoundMachine
from coordinator.round_policy import dp_mechanism_for, dp_settings_for, group_configs_for
from coordinator.round_tasks import TaskFields
from coordinator.rounds import RoundMachine
from coordinator.settings import CoordinatorSettings
from dpmech.calibrate import with_shares
from dpmech.mechanism import MechanismConfig
from secagg.config import SecAggConfig
from wire.round_metrics import MetricLayout


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One group of a round (the whole cohort for a round of one instance)."""

    members: tuple[int, ...]
    config: SecAggConfig  # unbound: its session id is the group's nonce
    mechanism: MechanismConfig | None  # its devices' discrete Gaussian (None without it)


def plan_groups(settings: CoordinatorSettings, config: SecAggConfig, groups: Sequence[Sequence[int]],
                mechanism: MechanismConfig | None) -> tuple[GroupPlan, ...]:
    """The round's plans (see the module doc). `config` and `mechanism` are
    the whole cohort's; `groups` partition the cohort."""
    if len(groups) == 1:
        return (GroupPlan(tuple(groups[0]), config, mechanism),)
    dp = settings.dp
    base = mechanism
    if mechanism is not None and dp.mode == "distributed":  # the field checked for the most noise: the smallest group's
        base = dp_mechanism_for(settings, mechanism.devices, mechanism.dim, shares=min(map(len, groups)))
    plans = []
    for members, group_config in zip(groups, group_configs_for(settings, config, groups), strict=True):
        share = base
        if base is not None and dp.mode == "distributed":
            share = with_shares(base, dp.noise_multiplier, len(members))
        plans.append(GroupPlan(tuple(members), group_config, share))
    return tuple(plans)


def build_round(settings: CoordinatorSettings, *, number: int, nonce: bytes, plans: Sequence[GroupPlan],
                minimum: int, deadlines: dict[str, float], identity: dict[int, bytes] | None,
                metrics: MetricLayout, fields: TaskFields,
                in_groups: bool = False) -> tuple[AnyRound, tuple[TaskFields, ...]]:
    """The round's machine and each group's task fields, in the plans'
    order (see the module doc); `nonce`: the round's session nonce;
    `minimum`: the fewest counted devices a round in groups commits with;
    `in_groups`: a `GroupedRoundMachine` (and the rotation key) even for
    one plan (the leader of a tier, whose replicas run every round's
    groups as one, D109)."""
    cohort = [d for p in plans for d in p.members]
    if len(plans) > 1 or in_groups:
        key = nonce if plans[0].mechanism is not None else b""
        per_group = tuple(
            dataclasses.replace(fields, dp=dp_settings_for(settings.dp, len(p.members), p.mechanism, rotation_key=key))
            for p in plans
        )
        configs = tuple(f.bind(p.config, number, p.members) for f, p in zip(per_group, plans, strict=True))
        machine = GroupedRoundMachine(number=number, configs=configs, groups=[p.members for p in plans],
                                      deadlines=deadlines, minimum=minimum, identity_keys=identity, metrics=metrics,
                                      mechanisms=[p.mechanism for p in plans], rotation_key=key)
        return machine, per_group
    (plan,) = plans
    config = fields.bind(plan.config, number, cohort)  # the session id commits to the task
    kind: type[RoundMachine] = RoundMachine
    if settings.debug.insecure_plaintext:
        kind = PlaintextRoundMachine
    elif settings.hybrid.enabled:  # UNPROTECTED plaintext inputs from some devices (D64)
        kind = HybridRoundMachine
    return kind(number=number, config=config, cohort=cohort, deadlines=deadlines, identity_keys=identity,
                metrics=metrics, mechanism=plan.mechanism), (fields,)


__all__ = ["GroupPlan", "build_round", "plan_groups"]
