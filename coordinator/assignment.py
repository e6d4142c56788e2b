"""A replica's groups of one planned round, rebuilt from the store (pure;
rounds in groups over a tier of replicas, D99).

The leader plans a round (`RoundPlan`) and writes one `GroupAssignment` per
group (`assignment_for` writes what a replica reads back); the replica that
runs a group rebuilds, from those rows alone, the same group machine and
RoundTasks the leader's `round_machines.build_round` would have given:

- `secagg_settings` is the group's `SecaggSettings` as its RoundTask
  carries it (`wire.round_task.secagg_settings_to_proto`: the group's graph
  and threshold, the round's one encoding, sized for the whole cohort) and
  `session_id` the group's bound session id, so
  `wire.round_task.secagg_config_from_proto` gives the group's config;
- `dp_settings` is the group's `DpSettings` (None: DP off), from which
  `wire.dp_task.task_mechanism` rebuilds the group's discrete Gaussian with
  the field sized for the plan's whole cohort (`plan.cohort_size`);
- `local_round` gives the `GroupedRoundMachine` of this replica's groups of
  the round, with minimum 1: a replica never aborts its groups for the
  round's minimum, which only the leader can count (it adds the groups of
  every replica); the machine's own result is of no use, each group's sum
  is (`group_result`);
- `binding_matches` recomputes the group's session id from the plan, the
  model version's parameters and the group's settings (`wire.round_binding`:
  nonce || task digest, the nonce `group_session_id(plan.nonce, index)`):
  a mismatch means the leader and the replica disagree on the task (their
  settings or model drifted), and the group must fail (`BINDING_MISMATCH`)
  before any task goes out, since its devices would refuse the task or,
  worse, train on another model than the leader's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from coordinator.grouped_rounds import GroupedRoundMachine
from coordinator.round_tasks import TaskFields
from coordinator.store.group_records import (
    EncodedSum,
    GroupAssignment,
    GroupResult,
    GroupState,
    MAX_REASON_CHARS,
    RoundPlan,
)
from coordinator.store.lease_records import Lease
from coordinator.store.records import RoundState
from dpmech.mechanism import MechanismConfig
from fedmask_proto.v1 import session_pb2
from secagg.config import SecAggConfig
from secagg.groups import group_session_id
from wire.dp_task import task_mechanism
from wire.round_binding import DIGEST_BYTES
from wire.round_metrics import MetricLayout
from wire.round_task import secagg_config_from_proto, secagg_settings_to_proto
from wire.secagg_codec import reason_name

#: A group's failure reason when its stored session id is not the one its task binds to.
BINDING_MISMATCH = "binding_mismatch"


@dataclasses.dataclass(frozen=True, slots=True)
class StoredGroup:
    """One group as its replica reads it back: the row, its config (bound:
    its session id is the stored one) and its DpSettings."""

    assignment: GroupAssignment
    config: SecAggConfig
    dp: session_pb2.DpSettings


def assignment_for(plan: RoundPlan, index: int, member: Lease, members: Sequence[int], config: SecAggConfig,
                   dp: session_pb2.DpSettings) -> GroupAssignment:
    """The row of group `index` (its bound `config`, its task's `dp`) run by
    the membership term `member`, as the leader writes it (the module doc)."""
    off = dp.mode == session_pb2.DP_MODE_NONE
    return GroupAssignment(
        round_number=plan.round_number, index=index, replica=member.holder, replica_token=member.token,
        members=tuple(members), secagg_settings=secagg_settings_to_proto(config).SerializeToString(deterministic=True),
        session_id=config.session_id, dp_settings=None if off else dp.SerializeToString(deterministic=True))


def stored_group(a: GroupAssignment) -> StoredGroup:
    """The group's config and DpSettings from its row. WireError (or
    protobuf's DecodeError) for settings that do not parse."""
    settings = session_pb2.SecaggSettings.FromString(a.secagg_settings)
    dp = (session_pb2.DpSettings.FromString(a.dp_settings) if a.dp_settings is not None
          else session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE))
    return StoredGroup(a, secagg_config_from_proto(settings, a.session_id), dp)


def round_metrics(plan: RoundPlan, group: StoredGroup) -> MetricLayout:
    """The round's metric layout as the group's devices compute it (from
    the plan's names and the group's encoding)."""
    return MetricLayout.for_round(plan.metric_names, group.config.encoding)


def group_mechanism(plan: RoundPlan, group: StoredGroup, metrics: MetricLayout) -> MechanismConfig | None:
    """The group's discrete Gaussian (None without it), its field sized for
    the plan's whole cohort (one encoding per round). WireError when the
    settings cannot be right (`task_mechanism`)."""
    return task_mechanism(group.dp, group.config, metrics.coordinates, encoding_devices=plan.cohort_size)


def local_round(groups: Sequence[StoredGroup], plan: RoundPlan, *, identity: Mapping[int, bytes] | None,
                metrics: MetricLayout) -> GroupedRoundMachine:
    """The machine of this replica's `groups` of the round (by global index;
    machine group j is `groups[j]`, whose `assignment.index` the logs keep),
    minimum 1 (the module doc), the plan's stage deadlines, the round's
    rotation key when the groups run the discrete Gaussian. ValueError
    (from the machine) or WireError for groups that cannot run together."""
    if not groups:
        raise ValueError("a local round needs at least one group")
    mechanisms = [group_mechanism(plan, g, metrics) for g in groups]
    keys = {bytes(g.dp.rotation_key) for g in groups}
    if len(keys) != 1:
        raise ValueError("the groups of one round carry different rotation keys")
    key = keys.pop() if mechanisms[0] is not None else b""
    return GroupedRoundMachine(number=plan.round_number, configs=[g.config for g in groups],
                               groups=[g.assignment.members for g in groups], deadlines=dict(plan.deadlines),
                               minimum=1, identity_keys=identity, metrics=metrics, mechanisms=mechanisms,
                               rotation_key=key)


def binding_matches(group: StoredGroup, plan: RoundPlan, fields: TaskFields) -> bool:
    """Whether the group's stored session id is the one its task binds to:
    nonce `group_session_id(plan.nonce, index)` (the plan's nonce for the
    one group of a round of one instance) followed by the digest of
    the task built from `fields` (the plan's model version, parameters,
    hyper-parameters and metrics, the group's DpSettings) and the group's
    settings. Blocking (hashes the parameters): run it in a thread."""
    a = group.assignment
    nonce = a.session_id[:-DIGEST_BYTES]
    whole = a.index == 0 and len(a.members) == plan.cohort_size  # a round of one instance: the round's nonce
    if nonce != group_session_id(plan.nonce, a.index) and not (whole and nonce == plan.nonce):
        return False
    unbound = dataclasses.replace(group.config, session_id=nonce)
    return fields.bind(unbound, plan.round_number, a.members).session_id == a.session_id


def group_result(machine: GroupedRoundMachine, j: int, index: int, *, reason: str | None = None) -> GroupResult:
    """Machine group j's outcome as the store takes it for group `index`:
    `done` with its sum (metric limbs included, and apart) and counted
    devices when it reached aggregation and `reason` is None; otherwise
    `failed` with `reason` or, by default, the group's abort reason."""
    m = machine.machines[j]
    result = m.result
    done = reason is None and m.phase is RoundState.AGGREGATING and result is not None
    total = None
    if done and result is not None:
        limbs = result.metric_sums.astype(np.uint32)
        total = EncodedSum(result.encoded_sum.astype(np.uint32), limbs, len(result.encoded_sum), len(limbs))
    why = reason or (reason_name(m.abort_reason) if m.abort_reason is not None else "aborted")
    return GroupResult(
        round_number=machine.number, index=index, state=GroupState.DONE if done else GroupState.FAILED, sum=total,
        counted=tuple(result.counted) if done and result is not None else (),
        fail_reason=None if done else why[:MAX_REASON_CHARS], phase=m.phase.value,
        survivors={k: list(v) for k, v in m.survivors().items()}, dropouts=m.dropout_ids(), timings=dict(m.timings),
        completion=dict(m.completion), share_reports=tuple((r, d) for r, bad in m.share_reports().items() for d in bad),
        share_check_survivors=tuple(m.share_check_survivors()))

__all__ = ["BINDING_MISMATCH", "StoredGroup", "assignment_for", "binding_matches", "group_mechanism",
           "group_result", "local_round", "round_metrics", "stored_group"]
