"""A replica runs the groups the leader assigned it (coordinator/group_runner.py)
over real gRPC, with in-process clients: a test-side leader plans the round
by the in-process path and writes it with `open_planned_round`; the runner
writes each group's outcome, and its devices learn the round's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
from grpc_health.v1.health import aio as health_aio

from coordinator.assignment import BINDING_MISMATCH, assignment_for, stored_group
from coordinator.group_runner import GroupRunner
from coordinator.grouped_rounds import GroupedRoundMachine, cohort_config, combine_group_sums
from coordinator.model_cache import ModelCache
from coordinator.model_host import build_server_model
from coordinator.round_groups import round_groups
from coordinator.round_machines import build_round, plan_groups
from coordinator.round_policy import round_plan
from coordinator.round_tasks import TaskFields
from coordinator.server import build_server, set_serving
from coordinator.service import Coordinator
from coordinator.store import (
    GroupState,
    InMemoryStore,
    NewModelVersion,
    RoundPlan,
    RoundRecord,
    RoundState,
    utc_now,
)
from coordinator.store.blobs import pack_parameters
from fedmask_proto.v1 import common_pb2, session_pb2
from wire.round_metrics import EMPTY_LAYOUT

from test_grpc_end_to_end import _clients, _until, make_settings

P = common_pb2


@contextlib.asynccontextmanager
async def serving(settings: Any) -> AsyncIterator[tuple[Coordinator, str, InMemoryStore]]:
    """A replica's device service over gRPC, its in-process round loop not run."""
    store = InMemoryStore()
    coord = Coordinator(settings, store=store, model=build_server_model(settings.model.name,
                                                                          settings.model.hyperparameters))
    await coord.start()
    health = health_aio.HealthServicer()
    server, port = await build_server(coord, settings, health)
    await server.start()
    await set_serving(health, True)
    try:
        yield coord, f"127.0.0.1:{port}", store
    finally:
        await coord.shutdown("test over")
        await server.stop(0.5)


def open_round(coord: Coordinator, store: InMemoryStore, leader: Any, members: dict[int, Any],
               cohort: list[int], *, drift: bool = False) -> tuple[int, RoundPlan, GroupedRoundMachine]:
    """The leader's side: plan the round as the in-process loop does, group
    j run by `members[j]` (default: members[0]); `drift`: the plan's
    hyper-parameters differ from those the session ids bind."""
    settings, model = coord.settings, coord.model
    nonce = b"r" * 16
    config, metrics, mechanism = round_plan(settings, len(cohort), model.update_dim, nonce, model.metric_names,
                                            plaintext=False)
    groups = round_groups(settings.secagg.group_size, cohort, nonce, coord.registry.owner)
    plans = plan_groups(settings, config, groups, mechanism)
    number = store.next_round_number()
    version = coord.model_version or 0
    fields = TaskFields.for_round(settings, model, coord.current, version, len(cohort), metrics, mechanism)
    windows = coord.deadlines.windows(active=config.active_adversary, cohort=len(cohort))
    machine, per_group = build_round(settings, number=number, nonce=nonce, plans=plans, minimum=config.threshold,
                                     deadlines=windows.machine, identity=None, metrics=metrics, fields=fields)
    assert isinstance(machine, GroupedRoundMachine)
    now = utc_now()
    hp = dict(fields.hyperparameters)
    if drift:
        hp["vector_length"] = hp["vector_length"] + 1
    plan = RoundPlan(round_number=number, lease_token=leader.token, nonce=nonce, model_name=model.name,
                     model_version=version, step=coord.current.step, hyperparameters=hp,
                     metric_names=metrics.names, cohort_size=len(cohort), minimum=config.threshold,
                     rotation_key=nonce, deadlines=windows.machine, task_deadlines=windows.task, opened_at=now,
                     closes_at=now + timedelta(minutes=5))
    rows = [assignment_for(plan, j, members.get(j, members[0]), m.cohort, m.config, f.dp)
            for j, (m, f) in enumerate(zip(machine.machines, per_group, strict=True))]
    record = RoundRecord(number=number, state=RoundState.ADVERTISE_KEYS, started_at=now, cohort_size=len(cohort))
    store.open_planned_round(record, plan, rows, fence=leader)
    return number, plan, machine


def tier(store: InMemoryStore) -> tuple[Any, Any, Any]:
    leader = store.acquire_lease("leader", 60.0)
    a = store.join_tier("replica-a", 60.0, settings_digest="")
    b = store.join_tier("replica-b", 60.0, settings_digest="")
    assert leader is not None and a is not None and b is not None
    return leader, a, b


def runner_for(coord: Coordinator, store: InMemoryStore, member: Any) -> GroupRunner:
    """The runner wired as a host would: the coordinator routes the devices'
    stage messages to `coord.round`, which is the runner's local round."""
    return GroupRunner(store, lambda: member, coord.delivery, coord.registry, ModelCache(store), poll_s=0.05,
                       wake=coord._round_event, on_round=lambda r: setattr(coord, "round", r))


def _encoded_sum(devices: list[Any], counted: set[int]) -> np.ndarray:
    """The oracle: the plaintext sum mod 2^32 of these devices' encoded inputs."""
    total = np.sum([d.encoded for d in devices if d.device_id in counted], axis=0, dtype=np.uint64)
    return np.asarray(total & np.uint64(0xFFFFFFFF), dtype=np.uint32)


async def _final(store: InMemoryStore, number: int, indexes: set[int]) -> list[Any]:
    await asyncio.wait_for(_until(lambda: all(g.state.is_final for g in store.round_groups(number)
                                              if g.index in indexes)), 20)
    return [g for g in store.round_groups(number, sums=True) if g.index in indexes]


def test_the_runners_sums_are_exact_and_the_commit_reaches_the_counted_devices() -> None:
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 6, "secagg.group_size": 4})
        async with serving(settings) as (coord, target, store):
            clients, devices = await _clients(target, 12, groups=6)
            leader, a, b = tier(store)
            cohort = sorted(d.device_id for d in devices)
            number, plan, machine = open_round(coord, store, leader, {0: a, 2: b}, cohort)
            runner = runner_for(coord, store, a)
            task = asyncio.create_task(runner.run())
            try:
                mine = {0, 1}  # group 2 is replica-b's, which runs nothing here
                rows = await _final(store, number, mine)
                assert [g.state for g in rows] == [GroupState.DONE, GroupState.DONE]
                for g in rows:
                    assert g.sum is not None and g.counted == g.assignment.members
                    want = _encoded_sum(devices, set(g.counted))
                    assert g.sum.encoded_sum.tobytes() == want.tobytes()  # bit for bit
                    assert g.sum.metric_limbs.tobytes() == want[-g.sum.metric_coordinates:].tobytes()
                    assert g.asked == g.assignment.members and g.phase == "aggregating"
                # the leader adds the sums: the plaintext sum of every counted device's input
                whole = cohort_config(stored_group(rows[0].assignment).config, plan.cohort_size)
                total = combine_group_sums(whole, [SimpleNamespace(encoded_sum=g.sum.encoded_sum, counted=g.counted)
                                                   for g in rows], metrics=machine.metrics)
                counted = {d for g in rows for d in g.counted}
                assert total.encoded_sum.tobytes() == _encoded_sum(devices, counted).tobytes()
                assert np.allclose(total.decoded_mean,
                                   np.mean([d.update for d in devices if d.device_id in counted], axis=0), atol=1e-5)
                others = set(machine.groups[2])
                hosting = [c for c in clients if set(c.devices) & others]
                assert hosting and all(not c.tasks for c in hosting)  # replica-b's devices got no task from a
                # the leader commits: the runner tells its counted groups' devices
                version = store.commit_round(
                    RoundRecord(number=number, state=RoundState.COMMITTED, started_at=plan.opened_at,
                                ended_at=utc_now(), cohort_size=plan.cohort_size),
                    NewModelVersion(model_name=plan.model_name, parameters=pack_parameters(coord.current.parameters),
                                    hyperparameters={"step": 1}), None, fence=leader).id
                told = [c for c in clients if set(c.devices) & counted]
                await asyncio.wait_for(_until(lambda: all(c.committed for c in told)), 5)
                assert all([m.new_model_version for m in c.committed] == [version] for c in told)
                assert all(m.contributors == 4 for c in told for m in c.committed)
                await asyncio.wait_for(_until(lambda: runner.round is None and coord.round is None), 5)
            finally:
                runner.stop()
                await asyncio.wait_for(task, 5)
                for c in clients:
                    await c.close()

    asyncio.run(main())


def test_a_binding_mismatch_fails_the_group_and_sends_no_task() -> None:
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 8, "cohort.minimum": 4, "secagg.group_size": 4})
        async with serving(settings) as (coord, target, store):
            clients, devices = await _clients(target, 8, groups=4)
            leader, a, _ = tier(store)
            number, _, _ = open_round(coord, store, leader, {0: a}, sorted(d.device_id for d in devices), drift=True)
            runner = runner_for(coord, store, a)
            task = asyncio.create_task(runner.run())
            try:
                rows = await _final(store, number, {0, 1})
                assert [(g.state, g.fail_reason) for g in rows] == [(GroupState.FAILED, BINDING_MISMATCH)] * 2
                await asyncio.sleep(0.2)
                assert not any(c.tasks for c in clients)
                assert store.assigned_groups(a) == []
            finally:
                runner.stop()
                await asyncio.wait_for(task, 5)
                for c in clients:
                    await c.close()

    asyncio.run(main())


def test_an_abort_during_masked_input_tells_the_devices_and_no_unmasking_request_goes_out() -> None:
    """One device is silent at masked input, so the stage waits for its
    deadline; meanwhile the leader aborts the round. The stage closes, the
    runner's save of `unmasking` is refused (the round is sealed), no
    device is asked to unmask, and every device still in the round gets an
    AbortNotice."""
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 8, "cohort.minimum": 4, "secagg.group_size": 4,
                                    "deadlines.masked_input": 3.0})  # the others' inputs in time, even on a loaded machine
        async with serving(settings) as (coord, target, store):
            clients, devices = await _clients(target, 8, groups=4, silent={0: "masked_input"})
            leader, a, _ = tier(store)
            number, plan, _ = open_round(coord, store, leader, {0: a}, sorted(d.device_id for d in devices))
            runner = runner_for(coord, store, a)
            task = asyncio.create_task(runner.run())
            try:
                # the stage as SAVED, not only the machine's phase: an abort that lands before that save
                # is refused at the save itself, and every device (the silent one too) is then cancelled
                await asyncio.wait_for(_until(lambda: all(g.phase == RoundState.MASKED_INPUT.value
                                                          for g in store.round_groups(number))), 10)
                store.abort_round(RoundRecord(number=number, state=RoundState.ABORTED, started_at=plan.opened_at,
                                              ended_at=utc_now(), cohort_size=plan.cohort_size,
                                              abort_reason="cancelled"), fence=leader)
                await asyncio.wait_for(_until(lambda: runner.rounds_run == 1), 10)
                rows = store.round_groups(number)
                assert all(g.state is GroupState.LOST and g.lost_in is GroupState.RUNNING and g.asked is None
                           for g in rows)
                silent = devices[0]
                # the notices were sent before the runner's round ended; on a loaded machine they may land later
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_until(lambda: P.ABORT_REASON_DEADLINE_MISSED in silent.aborted and all(
                        P.ABORT_REASON_CANCELLED in d.aborted for d in devices[1:])), 5)
                received = [m.WhichOneof("message") for c in clients for m in c.received]
                assert "masking_request" in received and "unmasking_request" not in received
                assert P.ABORT_REASON_DEADLINE_MISSED in silent.aborted
                assert all(P.ABORT_REASON_CANCELLED in d.aborted for d in devices[1:]), [
                    (d.device_id, d.aborted) for d in devices]
            finally:
                runner.stop()
                await asyncio.wait_for(task, 5)
                for c in clients:
                    await c.close()

    asyncio.run(main())


def test_the_model_cache_reads_a_version_once() -> None:
    store = InMemoryStore()
    model = build_server_model("synthetic", {"vector_length": 4})
    v = store.add_model_version(NewModelVersion(model_name="synthetic", parameters=pack_parameters(
        model.init_parameters(1)), hyperparameters={})).id
    cache = ModelCache(store, keep=1)
    first = cache.parameters(v)
    assert cache.parameters(v) is first and cache.loads == 1
    plan = SimpleNamespace(model_name="synthetic", model_version=v, hyperparameters={"lr": 1})
    fields = cache.task_fields(plan, session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE),  # type: ignore[arg-type]
                               EMPTY_LAYOUT)
    assert fields.global_parameters is first[1] and fields.model_version == v and fields.hyperparameters == {"lr": 1}
