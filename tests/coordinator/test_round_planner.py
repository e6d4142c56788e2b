"""The leader's side of rounds over a tier of replicas (coordinator/round_planner.py),
in one process: three replicas over one store, each a real `Coordinator`
serving gRPC with its own registry, a `GroupRunner` and a `StreamPublisher`;
real clients pinned to a replica; the leader's `RoundPlanner` plans the
round, watches the group rows and commits or aborts, fenced."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import secrets
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from grpc_health.v1.health import aio as health_aio

from coordinator.debug import encoded_checksum
from coordinator.fleet_view import FleetView
from coordinator.grouped_rounds import combine_group_sums
from coordinator.interrupted_charge import abort_charge
from coordinator.membership import settings_digest
from coordinator.model_host import build_server_model
from coordinator.remote_round import RemoteRound
from coordinator.round_planner import RoundPlanner
from coordinator.server import build_server, set_serving
from coordinator.service import Coordinator
from coordinator.store import FencedOut, GroupState, InMemoryStore, Lease, RoundState
from coordinator.store.blobs import unpack_parameters
from coordinator.stream_publisher import StreamPublisher

from test_grpc_end_to_end import SHORT, _clients, _until, make_settings
from test_group_runner import _encoded_sum, open_round, runner_for

NAMES = ("replica-a", "replica-b", "replica-c")


def _same(member: Lease) -> Lease:
    return member


def _ignore(why: str) -> None:
    del why


@contextlib.asynccontextmanager
async def tier(settings: Any, store: InMemoryStore, sizes: dict[str, tuple[int, int]], *, lease_s: float = 60.0,
               silent: dict[str, dict[int, str]] | None = None) -> AsyncIterator[SimpleNamespace]:
    """Replicas over one store: `sizes[name]` = (devices, client streams);
    each replica serves gRPC, publishes its streams and runs its groups.
    Yields the replicas, the devices by replica, and a planner leading
    with replica-a's parts (its model, ledger, reports, spent devices)."""
    digest = settings_digest(settings)
    stack = contextlib.AsyncExitStack()
    async with stack:
        replicas: dict[str, SimpleNamespace] = {}
        for seed, name in enumerate(sizes):
            coord = Coordinator(settings, store=store, model=build_server_model(settings.model.name,
                                                                                  settings.model.hyperparameters))
            await coord.start()
            health = health_aio.HealthServicer()
            server, port = await build_server(coord, settings, health)
            await server.start()
            await set_serving(health, True)
            member = store.join_tier(name, 60.0, settings_digest=digest)
            assert member is not None
            publisher = StreamPublisher(store, coord.registry, functools.partial(_same, member),
                                        on_lost=_ignore, publish_interval_s=0.05)
            runner = runner_for(coord, store, member)
            tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(runner.run())]

            async def down(coord: Coordinator = coord, server: Any = server, runner: Any = runner,
                           publisher: Any = publisher, tasks: list[Any] = tasks) -> None:
                runner.stop()
                publisher.stop()
                for t in tasks:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(t, 5)
                await coord.shutdown("test over")
                await server.stop(0.5)

            stack.push_async_callback(down)
            n, streams = sizes[name]
            clients, devices = await _clients(f"127.0.0.1:{port}", n, groups=streams, seed=seed,
                                              silent=(silent or {}).get(name))
            for c in clients:
                stack.push_async_callback(c.close)
            replicas[name] = SimpleNamespace(coord=coord, member=member, runner=runner, clients=clients,
                                             devices=devices)
        total = sum(n for n, _ in sizes.values())
        await asyncio.wait_for(_until(lambda: sum(map(len, store.available_by_replica().values())) == total), 10)
        lease = store.acquire_lease("leader", lease_s)
        assert lease is not None
        lead = replicas[next(iter(sizes))].coord
        holder = SimpleNamespace(lease=lease)
        planner = RoundPlanner(settings, store, lead.model, lead.current, lead.ledger, lead.peer_reports, lead.spent,
                               FleetView(store, digest=digest), lead.deadlines, lambda: holder.lease,
                               rng=random.Random(5), token=secrets.token_bytes, poll_s=0.05)
        yield SimpleNamespace(replicas=replicas, planner=planner, holder=holder, store=store, lead=lead)


def _rec(store: InMemoryStore, number: int) -> Any:
    rec = store.get_round(number)
    assert rec is not None
    return rec


def _latest(store: InMemoryStore) -> Any:
    v = store.latest_model_version("synthetic")
    assert v is not None
    return v


def _plan_left(store: InMemoryStore, number: int) -> int:
    plan = store.round_plan(number)
    assert plan is not None
    return plan.devices_left_out


def _oracle_params(r: RemoteRound, devices: list[Any], counted: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """The committed parameters the plaintext sum of the counted devices'
    encoded inputs gives, decoded with the round's encoding (the synthetic
    model's step stores the mean as float32)."""
    total = _encoded_sum(devices, counted)
    whole = combine_group_sums(r.whole, [SimpleNamespace(encoded_sum=total, counted=tuple(sorted(counted)))],
                               metrics=r.metrics)
    return np.asarray(whole.decoded_mean, dtype=np.float32), total


def test_a_round_over_three_replicas_commits_the_exact_sum_and_leaves_out_a_small_replica() -> None:
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 19, "cohort.minimum": 6, "secagg.group_size": 4})
        store = InMemoryStore()
        sizes = {"replica-a": (8, 4), "replica-b": (8, 4), "replica-c": (3, 1)}
        async with tier(settings, store, sizes) as t:
            before = t.lead.current.version
            r = await asyncio.wait_for(t.planner.run_round(), 30)
            assert r is not None and r.phase is RoundState.COMMITTED
            rec = _rec(store, r.number)
            assert rec.state is RoundState.COMMITTED
            devices = [d for rep in t.replicas.values() for d in rep.devices]
            counted = set(rec.survivors["masked_input"])
            assert len(counted) == 16 and rec.metrics["contributors"] == 16
            # replica-c holds 3 < G devices: it contributes nobody, and its devices are counted left out
            small = {d.device_id for d in t.replicas["replica-c"].devices}
            assert not small & set(r.cohort)
            assert rec.metrics["devices_left_out"] == 3 and _plan_left(store, r.number) == 3
            assert rec.metrics["replica_groups.replica-a"] == 2 and rec.metrics["replica_groups.replica-b"] == 2
            assert "replica_groups.replica-c" not in rec.metrics
            # every group's members are on its replica, and a stream's devices in one group
            for g in store.round_groups(r.number):
                assert g.state is GroupState.DONE
                mine = {d.device_id for d in t.replicas[g.assignment.replica].devices}
                assert set(g.assignment.members) <= mine
                for c in t.replicas[g.assignment.replica].clients:
                    on = set(c.devices) & set(r.cohort)
                    assert not on or on <= set(g.assignment.members) or not on & set(g.assignment.members)
            # the committed update is the plaintext sum of the counted devices' inputs, decoded: bit for bit
            want, total = _oracle_params(r, devices, counted)
            latest = _latest(store)
            assert latest.id == r.new_model_version == t.lead.current.version and latest.id != before
            got = unpack_parameters(latest.parameters)["mean"]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(total)
            # the counted devices hear the commit from their own replica
            told = [c for rep in t.replicas.values() for c in rep.clients if set(c.devices) & counted]
            await asyncio.wait_for(_until(lambda: all(c.committed for c in told)), 5)
            assert all(m.new_model_version == latest.id for c in told for m in c.committed)

    asyncio.run(main())


def test_counted_under_the_minimum_aborts_and_charges_every_released_group() -> None:
    """Two groups (one per replica) lose a stream of two at masked input and
    fail (2 < their threshold of 3); the other two groups finish with 8
    devices, under the round's minimum (the majority of 16, 9): the round
    aborts, and the ledger charges exactly the two done groups, each at its
    own noise."""
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 16, "cohort.minimum": 6, "secagg.group_size": 4,
                                    "dp.mode": "distributed", "dp.mechanism": "gaussian-float", "dp.clip": 0.1,
                                    "dp.noise_multiplier": 1.0, "debug.record_sums": False, **SHORT})
        store = InMemoryStore()
        sizes = {"replica-a": (8, 4), "replica-b": (8, 4)}
        silent = {name: {0: "masked_input", 4: "masked_input"} for name in sizes}  # client 0's two devices
        async with tier(settings, store, sizes, silent=silent) as t:
            before = _latest(store).id
            r = await asyncio.wait_for(t.planner.run_round(), 30)
            assert r is not None and r.phase is RoundState.ABORTED
            rec = _rec(store, r.number)
            assert rec.state is RoundState.ABORTED and rec.abort_reason == "too_few_survivors"
            rows = store.round_groups(r.number)
            assert sorted(g.state for g in rows) == [GroupState.DONE] * 2 + [GroupState.FAILED] * 2
            (entry,) = store.privacy_ledger()
            assert entry.round_number == r.number
            assert sorted((g.size, g.counted) for g in entry.groups) == [(4, 4), (4, 4)]
            assert entry.noise_multiplier == pytest.approx(1.0)
            # every device a group asked to unmask is spent on the version: listed in the record
            asked = {d for g in rows if g.may_have_asked for d in g.asked or ()}
            assert len(asked) == 8 and asked <= set(rec.survivors["unmasking"])
            assert _latest(store).id == before

    asyncio.run(main())


def test_a_leader_whose_lease_moved_can_neither_open_nor_commit() -> None:
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 8, "cohort.minimum": 4, "secagg.group_size": 4})
        store = InMemoryStore()
        sizes = {"replica-a": (4, 2), "replica-b": (4, 2)}
        async with tier(settings, store, sizes, lease_s=1.0) as t:
            before = _latest(store).id
            chosen = await t.planner.select()
            assert chosen is not None
            r = await t.planner.open_round(chosen)  # opened under the lease
            assert r is not None
            await asyncio.sleep(1.1)
            other = store.acquire_lease("other", 60.0)
            assert other is not None and other.token > t.holder.lease.token
            await asyncio.wait_for(_until(lambda: all(g.state.is_final or g.state is GroupState.UNMASKING
                                                      for g in store.round_groups(r.number))), 20)
            with pytest.raises(FencedOut):
                await t.planner.finish(r)
            assert _rec(store, r.number).state is not RoundState.COMMITTED
            chosen = await t.planner.select()
            assert chosen is not None
            numbers = store.next_round_number()
            with pytest.raises(FencedOut):
                await t.planner.open_round(chosen)
            assert store.round_plan(numbers + 1) is None
            assert _latest(store).id == before == t.lead.current.version

    asyncio.run(main())


def test_a_group_lost_in_unmasking_is_priced_as_released_and_its_asked_devices_listed() -> None:
    """Without gRPC: the leader closes a group its replica saved in
    `unmasking`; the remote round prices it as released at its asked
    devices, in the abort charge and in the record's survivors."""
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 8, "cohort.minimum": 4, "secagg.group_size": 4,
                                    "dp.mode": "distributed", "dp.mechanism": "gaussian-float", "dp.clip": 0.1,
                                    "dp.noise_multiplier": 1.0})
        store = InMemoryStore()
        coord = Coordinator(settings, store=store, model=build_server_model("synthetic", {"vector_length": 16}))
        await coord.start()
        leader = store.acquire_lease("leader", 60.0)
        a = store.join_tier("replica-a", 60.0, settings_digest="")
        assert leader is not None and a is not None
        number, plan, machine = open_round(coord, store, leader, {0: a}, list(range(1, 9)))
        from coordinator.store import GroupProgress

        store.start_group(a, number, 0)
        members = machine.groups[0]
        store.save_group_progress(a, GroupProgress(round_number=number, index=0, state=GroupState.UNMASKING,
                                                   phase="unmasking", asked=tuple(members[:3]),
                                                   survivors={"masked_input": list(members[:3])}))
        store.close_groups(number, fence=leader)
        r = RemoteRound.of(plan, store.round_groups(number))
        assert [v.index for v in r.released()] == [0]
        assert set(members[:3]) <= set(r.survivors()["unmasking"])
        entry = abort_charge(coord.ledger, r, [])  # type: ignore[arg-type]
        assert entry is not None and [(g.size, g.counted) for g in entry.groups] == [(len(members), 3)]
        assert entry.noise_multiplier == pytest.approx((3 / len(members)) ** 0.5)
        await coord.shutdown("test over")

    asyncio.run(main())


def test_the_groups_of_a_replica_that_left_the_tier_are_written_off_at_once() -> None:
    """replica-c's devices hold its group at masked input (long deadlines:
    the plan closes 30 s or more later); when its membership ends, the
    leader closes that group at once (lost), and the round commits from
    the other two groups: the record counts exactly their devices and
    lists replica-c's as lost."""
    async def main() -> None:
        slow = {f"deadlines.{s}": 30.0 for s in ("masked_input", "consistency_check", "unmasking")}
        settings = make_settings(**{"cohort.size": 12, "cohort.minimum": 12, "secagg.group_size": 4, **slow})
        store = InMemoryStore()
        sizes = {"replica-a": (4, 2), "replica-b": (4, 2), "replica-c": (4, 2)}
        silent = {"replica-c": {i: "masked_input" for i in range(4)}}
        async with tier(settings, store, sizes, silent=silent) as t:
            task = asyncio.create_task(t.planner.run_round())
            c = t.replicas["replica-c"]
            others = [g for g in (await _wait_groups(store)) if g.assignment.replica != "replica-c"]
            await asyncio.wait_for(_until(lambda: all(g.state is GroupState.DONE for g in store.round_groups(
                others[0].round_number) if g.assignment.replica != "replica-c")), 20)
            plan = store.round_plan(others[0].round_number)
            assert plan is not None
            store.leave_tier(c.member)  # replica-c is gone
            left = asyncio.get_running_loop().time()
            r = await asyncio.wait_for(task, 10)
            assert asyncio.get_running_loop().time() - left < 5.0  # not at closes_at
            assert r is not None and r.phase is RoundState.COMMITTED
            rows = {g.assignment.replica: g for g in store.round_groups(r.number)}
            assert rows["replica-c"].state is GroupState.LOST
            assert rows["replica-c"].lost_in in (GroupState.RUNNING, GroupState.ASSIGNED)
            rec = _rec(store, r.number)
            counted = set(rec.survivors["masked_input"])
            assert counted == {d for n in ("replica-a", "replica-b") for d in rows[n].assignment.members}
            assert rec.metrics["debug.counted"] == 8
            lost = set(rows["replica-c"].assignment.members)
            assert not lost & counted
            assert lost <= {d for ids in rec.dropouts.values() for d in ids}
            devices = [d for rep in t.replicas.values() for d in rep.devices]
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(_encoded_sum(devices, counted))

    asyncio.run(main())


async def _wait_groups(store: InMemoryStore) -> list[Any]:
    """The groups of the first planned round, once it is planned."""
    await asyncio.wait_for(_until(lambda: store.round_plan(1) is not None or store.round_plan(2) is not None), 20)
    number = 1 if store.round_plan(1) is not None else 2
    return store.round_groups(number)


def test_a_round_of_one_group_runs_under_the_discrete_gaussian() -> None:
    """Four devices on one replica (under 2G: one instance) with the
    distributed discrete Gaussian: the leader plans the one group as a
    round in groups, so its task carries the round's rotation key (the
    plan's nonce) and the replica runs it; the round commits, priced as
    one group of four."""
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 4, "cohort.minimum": 3, "secagg.group_size": 4,
                                    "dp.mode": "distributed", "dp.mechanism": "discrete-gaussian", "dp.clip": 1.0,
                                    "dp.noise_multiplier": 1.0, "debug.record_sums": False})
        store = InMemoryStore()
        async with tier(settings, store, {"replica-a": (4, 2)}) as t:
            r = await asyncio.wait_for(t.planner.run_round(), 30)
            assert r is not None and r.phase is RoundState.COMMITTED, (r.abort_reason, r.abort_detail)
            plan = store.round_plan(r.number)
            assert plan is not None
            (group,) = store.round_groups(r.number)
            assert group.state is GroupState.DONE and len(group.assignment.members) == 4
            tasks = [task for c in t.replicas["replica-a"].clients for task in c.tasks]
            assert tasks and all(task.dp.rotation_key == plan.nonce for task in tasks)
            (entry,) = store.privacy_ledger()
            assert [g.size for g in entry.groups] == [4]
            assert _latest(store).id == r.new_model_version

    asyncio.run(main())


def test_a_held_planner_opens_no_round_until_released() -> None:
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 4, "cohort.minimum": 4, "secagg.group_size": 4})
        store = InMemoryStore()
        async with tier(settings, store, {"replica-a": (4, 2)}) as t:
            hold = [True]
            t.planner.held = lambda: hold[0]
            task = asyncio.create_task(t.planner.run(1))
            await asyncio.sleep(0.5)
            assert not store.list_rounds().items and t.planner.rounds_run == 0  # held: nothing planned
            hold[0] = False
            await asyncio.wait_for(task, 20)
            assert t.planner.rounds_run == 1 and _rec(store, 1).state is RoundState.COMMITTED

    asyncio.run(main())


def test_the_stage_deadlines_learn_from_the_groups_completion_times() -> None:
    """A committed round's stage times reach the leader's adaptive deadlines,
    so a silent device costs the next round a learnt window, not the ceiling."""
    async def main() -> None:
        from secagg.stages import Stage

        settings = make_settings(**{"cohort.size": 8, "cohort.minimum": 8, "secagg.group_size": 4})
        store = InMemoryStore()
        async with tier(settings, store, {"replica-a": (4, 2), "replica-b": (4, 2)}) as t:
            before = t.planner.deadlines.deadline(Stage.MASKED_INPUT, 8)
            r = await asyncio.wait_for(t.planner.run_round(), 30)
            assert r is not None and r.phase is RoundState.COMMITTED
            assert r.completion.get("masked_input", 0.0) > 0.0
            after = t.planner.deadlines.deadline(Stage.MASKED_INPUT, 8)
            assert after < before, (before, after)

    asyncio.run(main())
