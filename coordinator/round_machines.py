"""Which machine runs a round, and the fields its tasks carry (blocking:
binding a config hashes the model; run it in a worker thread).

`build_round(settings, number=..., config=..., groups=..., ...)`:
- one group (the cohort): `config` bound to the round's task (the session
  id commits to it, D85) and the round's machine: the secure
  `RoundMachine`, or the plaintext or hybrid one when the settings ask;
- several groups (`round_groups.round_groups`, D99): one config per group
  (`round_policy.group_configs_for`: the group's graph and threshold, the
  round's one encoding), each bound to its own group's task, and a
  `GroupedRoundMachine`; with the discrete Gaussian every group's task
  carries the round's rotation key (the round's session nonce), so that
  the groups' residues add. The round commits with at least the cohort
  minimum of counted devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from coordinator.grouped_rounds import AnyRound, GroupedRoundMachine
from coordinator.hybrid import HybridRoundMachine
from coordinator.plaintext import PlaintextRoundMachine
from coordinator.round_policy import dp_settings_for, group_configs_for
from coordinator.round_tasks import TaskFields
from coordinator.rounds import RoundMachine
from coordinator.settings import CoordinatorSettings
from dpmech.mechanism import MechanismConfig
from secagg.config import SecAggConfig
from wire.round_metrics import MetricLayout


def build_round(settings: CoordinatorSettings, *, number: int, config: SecAggConfig,
                groups: Sequence[Sequence[int]], deadlines: dict[str, float], identity: dict[int, bytes] | None,
                metrics: MetricLayout, mechanism: MechanismConfig | None,
                fields: TaskFields) -> tuple[AnyRound, TaskFields]:
    """The round's machine and its tasks' fields (see the module doc).
    `config` is the whole cohort's (unbound); `groups` partition the cohort."""
    cohort = [d for g in groups for d in g]
    if len(groups) > 1:
        key = config.session_id if mechanism is not None else b""
        fields = dataclasses.replace(fields, dp=dp_settings_for(settings.dp, len(cohort), mechanism,
                                                                rotation_key=key))
        configs = tuple(fields.bind(c, number, g) for c, g in zip(group_configs_for(settings, config, groups), groups))
        minimum = min(max(settings.cohort.minimum, 2), len(cohort))
        return GroupedRoundMachine(number=number, configs=configs, groups=groups, deadlines=deadlines,
                                   minimum=minimum, identity_keys=identity, metrics=metrics, mechanism=mechanism,
                                   rotation_key=key), fields
    config = fields.bind(config, number, cohort)  # the session id commits to the task
    machine: type[RoundMachine] = RoundMachine
    if settings.debug.insecure_plaintext:
        machine = PlaintextRoundMachine
    elif settings.hybrid.enabled:  # UNPROTECTED plaintext inputs from some devices (D64)
        machine = HybridRoundMachine
    return machine(number=number, config=config, cohort=cohort, deadlines=deadlines, identity_keys=identity,
                   metrics=metrics, mechanism=mechanism), fields


__all__ = ["build_round"]
