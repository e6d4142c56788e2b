"""ActiveReplica (coordinator/replica_server.py, D109): two replicas over
one in-memory store, each over a real started Coordinator (no listener):
both are members, exactly one leads and plans, the other takes over when
the leader stops, and a replica whose membership is taken over says so."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from coordinator.membership import settings_digest
from coordinator.model_host import build_server_model
from coordinator.replica_server import ActiveReplica
from coordinator.service import Coordinator
from coordinator.store import InMemoryStore

from test_grpc_end_to_end import make_settings


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


@contextlib.asynccontextmanager
async def replicas(store: InMemoryStore, names: list[str], settings: Any,
                   lost: dict[str, list[str]]) -> AsyncIterator[dict[str, ActiveReplica]]:
    """Started replicas by name (their coordinators started, no listener);
    stopped, and their coordinators shut down, on exit."""
    out: dict[str, ActiveReplica] = {}
    coords: list[Coordinator] = []
    try:
        for name in names:
            coord = Coordinator(settings, store=store,
                                model=build_server_model(settings.model.name, settings.model.hyperparameters))
            await coord.start()
            coords.append(coord)
            lost[name] = []
            replica = ActiveReplica(settings, store, coord, replica=name, device_address=f"{name}:50051",
                                    on_membership_lost=lost[name].append)
            await replica.start()
            out[name] = replica
        yield out
    finally:
        for replica in out.values():
            await replica.stop()
        for coord in coords:
            await coord.shutdown("test over")


def leaders(tier: dict[str, ActiveReplica]) -> list[str]:
    return [name for name, r in tier.items() if r.election.leading is not None]


def test_two_replicas_are_members_one_leads_and_the_other_takes_over() -> None:
    async def main() -> None:
        settings = make_settings(**{"replica.lease_s": 1.0, "replica.advertise_admin": "127.0.0.1:7001"})
        store = InMemoryStore()
        lost: dict[str, list[str]] = {}
        async with replicas(store, ["a", "b"], settings, lost) as tier:
            members = {m.name: m for m in store.live_replicas()}
            assert set(members) == {"a", "b"}
            assert all(m.settings_digest == settings_digest(settings) for m in members.values())
            await until(lambda: len(leaders(tier)) == 1)
            await asyncio.sleep(0.5)  # the other stays a candidate while the lease is renewed
            assert len(leaders(tier)) == 1
            first = leaders(tier)[0]
            second = "b" if first == "a" else "a"
            held = store.current_lease()
            assert held is not None and held.holder == first
            assert tier[first].planner is not None and tier[second].planner is None
            planning = tier[first]._planning
            assert planning is not None and not planning.done()  # the planner runs (no devices: no round)
            await tier[first].stop()
            assert planning.done() and tier[first].planner is None
            assert {m.name for m in store.live_replicas()} == {second}  # it left the tier
            await until(lambda: tier[second].election.leading is not None)
            held = store.current_lease()
            assert held is not None and held.holder == second and held.token == 2
            assert tier[second].planner is not None
            assert lost == {"a": [], "b": []}
        assert store.current_lease() is None and store.live_replicas() == []

    asyncio.run(main())


def test_a_replica_whose_membership_is_taken_over_reports_the_loss() -> None:
    async def main() -> None:
        settings = make_settings(**{"replica.lease_s": 1.0})
        store = InMemoryStore()
        lost: dict[str, list[str]] = {}
        async with replicas(store, ["a"], settings, lost) as tier:
            term = tier["a"].membership.member()
            store.leave_tier(term)  # its term ended, and another process joined under its name
            other = store.join_tier("a", 60.0, settings_digest=settings_digest(settings))
            assert other is not None and other.token != term.token
            await until(lambda: lost["a"] != [])
            assert lost["a"] == ["another process joined under this replica's name"]
            assert tier["a"].lost == lost["a"][0]
            await asyncio.sleep(0.5)
            assert len(lost["a"]) == 1  # reported once

    asyncio.run(main())


def test_serve_refuses_the_active_mode_it_does_not_start_yet() -> None:
    from coordinator.server import serve
    from coordinator.settings import CoordinatorSettings

    settings = CoordinatorSettings.load(overrides={
        "database_url": "postgresql+psycopg://fedmask:pw@db.invalid:5432/fedmask", "replica.mode": "active"})
    assert asyncio.run(serve(settings)) == 2  # before it opens the store: nothing listens, nothing is written
