"""`serve_active` (coordinator/active_serve.py, D109): two active replicas
in one process over one PostgreSQL database, each with its own store, its
own gRPC listener and its own devices (real in-process clients). Both
report SERVING at once; the leader's round runs a group on each replica
and commits the exact sum; when the leader stops, the other takes over
and commits the next version; a replica that loses its membership stops
serving and returns EXIT_DEPOSED; a replica that does not lead cannot
write what only a leader writes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.active_serve import serve_active
from coordinator.admin_servicer import SERVICE_NAME as ADMIN_SERVICE_NAME
from coordinator.debug import encoded_checksum
from coordinator.membership import settings_digest
from coordinator.server import EXIT_DEPOSED, SERVICE_NAME
from coordinator.service import Coordinator
from coordinator.store import FencedOut, Lease, NewModelVersion, RoundState, open_store
from fedmask.bench.processes import health_status

from test_grpc_end_to_end import _clients, _until, make_settings
from test_group_runner import _encoded_sum

def _settings(url: str, name: str, **over: Any) -> Any:
    return make_settings(**{"database_url": url, "replica.mode": "active", "replica.id": name,
                            "replica.lease_s": 2.0, "replica.poll_s": 0.05, "replica.publish_interval_s": 0.05,
                            "cohort.size": 8, "cohort.minimum": 8, "secagg.group_size": 4, "rounds": 1, **over})


@contextlib.asynccontextmanager
async def replica(url: str, name: str, *, seed: int, devices: int = 4) -> AsyncIterator[SimpleNamespace]:
    """A started active replica with `devices` devices on two streams of its
    own (rounds need 8 devices: no round starts before both are up)."""
    ready, stop = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    def on_ready(coord: Coordinator, port: int) -> None:
        seen.update(coord=coord, port=port)

    task = asyncio.create_task(serve_active(_settings(url, name), ready=ready, stop=stop, on_ready=on_ready,
                                            grace=0.5))
    await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(ready.wait())), 20)
    clients, devs = await _clients(f"127.0.0.1:{seen['port']}", devices, groups=2, seed=seed)
    try:
        yield SimpleNamespace(name=name, coord=seen["coord"], port=seen["port"], task=task, stop=stop,
                              clients=clients, devices=devs)
    finally:
        for c in clients:
            await c.close()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


def _committed(store: Any) -> list[Any]:
    return sorted((r for r in store.list_rounds(limit=50).items if r.state is RoundState.COMMITTED),
                  key=lambda r: r.number)


def test_two_active_replicas_serve_commit_exact_rounds_and_hand_over(postgresql_url: str) -> None:
    async def main() -> None:
        store = open_store(postgresql_url)
        try:
            async with replica(postgresql_url, "replica-a", seed=0) as a, \
                    replica(postgresql_url, "replica-b", seed=1) as b:
                tier = {a.name: a, b.name: b}
                assert [await _health(r.port) for r in (a, b)] == ["SERVING", "SERVING"]  # both serve devices
                await asyncio.wait_for(_until(lambda: len(_committed(store)) == 1, step=0.05), 60)
                (first,) = _committed(store)
                leader = next(r for r in tier.values() if r.coord.metrics.leader._value.get() == 1)
                other = b if leader is a else a
                assert other.coord.metrics.leader._value.get() == 0
                # operator actions go to the leader: its health listener alone says the admin service is SERVING
                assert [await _health(r.port, ADMIN_SERVICE_NAME) for r in (leader, other)] == ["SERVING",
                                                                                             "NOT_SERVING"]
                # one group on each replica, each of its own replica's devices, and the exact sum committed
                groups = store.round_groups(first.number)
                assert sorted(g.assignment.replica for g in groups) == ["replica-a", "replica-b"]
                for g in groups:
                    assert set(g.assignment.members) <= {d.device_id for d in tier[g.assignment.replica].devices}
                counted = set(first.survivors["masked_input"])
                assert len(counted) == 8
                every = a.devices + b.devices
                assert first.metrics["debug.encoded_checksum"] == encoded_checksum(_encoded_sum(every, counted))
                versions = [v.id for v in store.list_model_versions().items]
                # a replica that does not lead cannot write a leader's writes: nothing written
                with pytest.raises(FencedOut):
                    other.coord.store.add_model_version(NewModelVersion(
                        model_name="synthetic", parameters=b"", hyperparameters={"step": 9}))
                # the leader stops: the other takes over (its lease was released) and plans the next round
                # once four more devices connect to it
                leader.stop.set()
                assert await asyncio.wait_for(leader.task, 30) == 0
                more, _ = await _clients(f"127.0.0.1:{other.port}", 4, groups=2, seed=2)
                other.clients.extend(more)
                await asyncio.wait_for(_until(lambda: len(_committed(store)) == 2, step=0.05), 60)
                assert other.coord.metrics.leader._value.get() == 1
                assert await _health(other.port, ADMIN_SERVICE_NAME) == "SERVING"
                second = _committed(store)[1]
                assert {g.assignment.replica for g in store.round_groups(second.number)} == {other.name}
                after = [v.id for v in store.list_model_versions().items]
                assert sorted(after) == sorted(versions) + [max(versions) + 1]  # no gap, no duplicate
                assert store.get_model_version(max(after)) is not None
        finally:
            store.close()

    asyncio.run(main())


def test_a_replica_that_loses_its_membership_stops_serving_with_exit_3(postgresql_url: str) -> None:
    async def main() -> None:
        store = open_store(postgresql_url)
        try:
            async with replica(postgresql_url, "replica-a", seed=0, devices=2) as a:
                (member,) = store.live_replicas()
                assert await _health(a.port) == "SERVING"
                store.leave_tier(Lease(holder="replica-a", token=member.token, remaining_s=1.0))
                taken = store.join_tier("replica-a", 60.0, settings_digest=settings_digest(
                    _settings(postgresql_url, "replica-a")))
                assert taken is not None and taken.token != member.token
                assert await asyncio.wait_for(a.task, 30) == EXIT_DEPOSED
                assert await _health(a.port) is None  # the listener is gone: it serves nothing
        finally:
            store.close()

    asyncio.run(main())


async def _health(port: int, service: str = SERVICE_NAME) -> str | None:
    """`service`'s health status name on `port` (the coordinator service's by default), None when nothing
    answers."""
    return await asyncio.to_thread(health_status, port, service=service, timeout=1.0)
