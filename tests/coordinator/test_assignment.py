"""A replica rebuilds its groups of a planned round from the store's rows
(coordinator/assignment.py): the same configs, metric layout, discrete
Gaussians and session ids the leader's `plan_groups` / `build_round` give
for the cohort, and any drift in the task or its settings shows as a
binding mismatch."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.assignment import (
    assignment_for,
    binding_matches,
    group_mechanism,
    group_result,
    local_round,
    round_metrics,
    stored_group,
)
from coordinator.current_model import CurrentModel
from coordinator.grouped_rounds import GroupedRoundMachine
from coordinator.model_cache import ModelCache
from coordinator.model_host import build_server_model
from coordinator.round_machines import build_round, plan_groups
from coordinator.round_policy import AdaptiveDeadlines, round_plan
from coordinator.round_tasks import TaskFields
from coordinator.store import GroupAssignment, GroupState, InMemoryStore, Lease, NewModelVersion, RoundPlan
from coordinator.store.blobs import pack_parameters
from fedmask_proto.v1 import session_pb2

from test_grpc_end_to_end import make_settings

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
MEMBER = Lease("replica-a", 1, 60.0)
DG = {"dp.mode": "distributed", "dp.mechanism": "discrete-gaussian", "dp.clip": 1.0, "dp.noise_multiplier": 1.0}


def leader_round(settings: Any, groups: list[tuple[int, ...]], *, seed: int = 3, nonce: bytes = b"n" * 16) -> Any:
    """What a leader plans for `groups` by the in-process path (round_plan ->
    plan_groups -> build_round), the plan and rows it would write, and a
    store holding the model version."""
    store = InMemoryStore()
    model = build_server_model(settings.model.name, settings.model.hyperparameters)
    params = model.init_parameters(seed)
    version = store.add_model_version(NewModelVersion(model_name=model.name, parameters=pack_parameters(params),
                                                      hyperparameters={"step": 0})).id
    current = CurrentModel(store, model)
    current.adopt(version, params, 0)
    cohort = [d for g in groups for d in g]
    config, metrics, mechanism = round_plan(settings, len(cohort), model.update_dim, nonce, model.metric_names,
                                            plaintext=False)
    plans = plan_groups(settings, config, groups, mechanism)
    fields = TaskFields.for_round(settings, model, current, version, len(cohort), metrics, mechanism)
    windows = AdaptiveDeadlines(settings.deadlines).windows(active=config.active_adversary, cohort=len(cohort))
    machine, per_group = build_round(settings, number=1, nonce=nonce, plans=plans, minimum=config.threshold,
                                     deadlines=windows.machine, identity=None, metrics=metrics, fields=fields)
    assert isinstance(machine, GroupedRoundMachine)
    plan = RoundPlan(round_number=1, lease_token=1, nonce=nonce, model_name=model.name, model_version=version,
                     step=0, hyperparameters=fields.hyperparameters, metric_names=metrics.names,
                     cohort_size=len(cohort), minimum=config.threshold, rotation_key=nonce, deadlines=windows.machine,
                     task_deadlines=windows.task, opened_at=T0, closes_at=T0 + timedelta(minutes=5))
    rows = [assignment_for(plan, j, MEMBER, m.cohort, m.config, f.dp)
            for j, (m, f) in enumerate(zip(machine.machines, per_group, strict=True))]
    return store, plans, machine, per_group, metrics, plan, rows


GROUPS = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12, 13)]


@pytest.mark.parametrize("dp", [{}, DG, {"dp.mode": "local", "dp.mechanism": "discrete-gaussian", "dp.clip": 1.0,
                                        "dp.noise_multiplier": 0.5}], ids=["no-dp", "distributed-dg", "local-dg"])
def test_a_replica_rebuilds_the_leaders_configs_mechanisms_and_metrics(dp: dict[str, Any]) -> None:
    settings = make_settings(**{"cohort.size": 13, "secagg.group_size": 4, "secagg.graph": "auto", **dp})
    store, plans, machine, per_group, metrics, plan, rows = leader_round(settings, GROUPS)
    stored = [stored_group(a) for a in rows]
    for j, g in enumerate(stored):
        assert g.config == machine.machines[j].config  # the bound config: graph, threshold, one encoding, session id
        assert round_metrics(plan, g) == metrics
        assert group_mechanism(plan, g, metrics) == plans[j].mechanism
        assert g.dp == per_group[j].dp
    # this replica's share of the groups (1 and 2): the same machines, minimum 1
    local = local_round(stored[1:], plan, identity=None, metrics=metrics)
    assert [m.config for m in local.machines] == [m.config for m in machine.machines[1:]]
    assert list(local.mechanisms) == [p.mechanism for p in plans[1:]]
    assert local.rotation_key == machine.rotation_key and local.minimum == 1
    assert (local.rotation_key == plan.nonce) == bool(dp)


@pytest.mark.parametrize("dp", [{}, DG], ids=["no-dp", "distributed-dg"])
def test_the_binding_is_reproduced_from_the_plan_and_the_stored_version(dp: dict[str, Any]) -> None:
    settings = make_settings(**{"cohort.size": 13, "secagg.group_size": 4, **dp})
    store, _, _, _, metrics, plan, rows = leader_round(settings, GROUPS)
    cache = ModelCache(store)
    for a in rows:
        g = stored_group(a)
        assert binding_matches(g, plan, cache.task_fields(plan, g.dp, metrics))
    assert cache.loads == 1  # the version is read once


def _drifted(rows: list[GroupAssignment], j: int, **settings: Any) -> GroupAssignment:
    s = session_pb2.SecaggSettings.FromString(rows[j].secagg_settings)
    for k, v in settings.items():
        setattr(s, k, v)
    return dataclasses.replace(rows[j], secagg_settings=s.SerializeToString(deterministic=True))


def test_a_changed_hyperparameter_model_or_setting_is_a_mismatch() -> None:
    settings = make_settings(**{"cohort.size": 13, "secagg.group_size": 4})
    store, _, _, _, metrics, plan, rows = leader_round(settings, GROUPS)
    cache = ModelCache(store)

    def matches(a: GroupAssignment, p: RoundPlan = plan) -> bool:
        g = stored_group(a)
        return binding_matches(g, p, cache.task_fields(p, g.dp, metrics))

    assert matches(rows[0])
    changed_hp = dict(plan.hyperparameters)
    changed_hp["vector_length"] = 17
    assert not matches(rows[0], dataclasses.replace(plan, hyperparameters=changed_hp))
    assert not matches(_drifted(rows, 0, threshold=4))
    assert not matches(_drifted(rows, 1, clip=0.5))
    # another version of the model: other parameters
    model = build_server_model(settings.model.name, settings.model.hyperparameters)
    other = store.add_model_version(NewModelVersion(model_name=model.name,
                                                    parameters=pack_parameters(model.init_parameters(99)),
                                                    hyperparameters={"step": 0})).id
    assert not matches(rows[0], dataclasses.replace(plan, model_version=other))
    # a group's row given another group's session nonce
    assert not matches(dataclasses.replace(rows[0], index=1))


def test_a_groups_result_is_its_sum_or_its_failure() -> None:
    settings = make_settings(**{"cohort.size": 13, "secagg.group_size": 4})
    *_, metrics, plan, rows = leader_round(settings, GROUPS)
    local = local_round([stored_group(a) for a in rows[:1]], plan, identity=None, metrics=metrics)
    failed = group_result(local, 0, 7, reason="binding_mismatch")
    assert failed.state is GroupState.FAILED and failed.fail_reason == "binding_mismatch" and failed.index == 7
    assert failed.sum is None and failed.phase == "advertise_keys"
