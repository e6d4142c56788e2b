"""Three active replicas (`fedmask coordinator --replica-mode active`,
D109) behind HAProxy on real processes over PostgreSQL, and three client
processes of four devices each: what the active-tier tests share.

`start_tier` starts the replicas (each on `database_urls[name]` when given,
so that a test can route one replica's store through a forwarder it cuts),
waits until HAProxy marks every one UP, then starts the client processes
through the balancer one at a time, so that `balance leastconn` sees each
stream before the next (until the store says each one's devices are
published). The leader plans each round as one group per replica.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fedmask.bench.balancer import ADMIN_SERVICE, Balancer, Replica, Route, haproxy_binary
from integration_harness import (
    LOOPBACK,
    Processes,
    Proc,
    all_rounds,
    coordinator_args,
    flags,
    free_port,
    open_store_readonly,
    wait_until,
)

LEASE_S = 3.0
L = 32
DEVICES_PER_CLIENT = 4
NAMES = ("replica-1", "replica-2", "replica-3")
ADMIN_ENV = {"FEDMASK_ADMIN__TOKEN": "an-admin-token-of-the-test-0123456789"}
COMMON: dict[str, Any] = dict(
    model="synthetic", model_params={"vector_length": L}, cohort_size=3 * DEVICES_PER_CLIENT,
    cohort_minimum=3 * DEVICES_PER_CLIENT, over_selection=0.0, allow_consecutive=True, seed=1, selection_deadline=3,
    training_deadline=5, advertise_keys_deadline=5, share_keys_deadline=5, unmasking_deadline=5,
    masked_input_deadline=5, secagg_graph="full", secagg_threshold="majority", dp_mode="none", debug_record_sums=True,
    lease_seconds=LEASE_S, round_pause=0.5, replica_mode="active", group_size=DEVICES_PER_CLIENT,
)

#: The marks of a test module of the active tier: slow, and skipped where Debian's HAProxy is missing.
MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (Debian's haproxy; .ci/ensure-haproxy)"),
]


@contextlib.contextmanager
def tier_balancer(tmp_path: Path) -> Iterator[tuple[Balancer, list[Replica], str]]:
    """HAProxy in front of the three replicas' device and admin ports: (balancer, replicas, device front)."""
    replicas = [Replica(name, LOOPBACK, free_port(), {"devices": free_port(), "admin": free_port()}) for name in NAMES]
    front = f"{LOOPBACK}:{free_port()}"
    routes = [Route("devices", front), Route("admin", f"{LOOPBACK}:{free_port()}", ADMIN_SERVICE)]
    balancer = Balancer(tmp_path, routes, replicas)
    try:
        yield balancer, replicas, front
    finally:
        balancer.close()


def committed(url: str) -> list[Any]:
    return [r for r in all_rounds(url) if r.state.value == "committed"]


def up(balancer: Balancer, route: str = "devices") -> list[str]:
    """The replicas HAProxy marks UP on `route`'s backend."""
    return sorted(k.split("/", 1)[1] for k, status in balancer.servers().items()
                  if k.startswith(f"{route}-") and status.startswith("UP"))


def groups(url: str, number: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """replica -> (its group's state, its members) in round `number` (one group per replica here)."""
    store = open_store_readonly(url)
    try:
        return {g.assignment.replica: (g.state.value, tuple(g.assignment.members)) for g in store.round_groups(number)}
    finally:
        store.close()


def stream_owners(url: str) -> dict[str, int]:
    """replica -> how many devices' streams it holds (the store's view)."""
    store = open_store_readonly(url)
    try:
        return {name: len(devices) for name, devices in store.available_by_replica().items()}
    finally:
        store.close()


def start_tier(procs: Processes, tmp_path: Path, url: str, balancer: Balancer, replicas: list[Replica], front: str,
               database_urls: Mapping[str, str] | None = None) -> tuple[dict[str, Proc], list[Proc], list[Path]]:
    """(replica name -> process, client processes, their state folders): see the module doc."""
    urls = database_urls or {}
    started = {r.name: procs.start(r.name, coordinator_args(
        r.ports["devices"], urls.get(r.name, url), replica_id=r.name, health_listen=f"{LOOPBACK}:{r.health_port}",
        admin_listen=f"{LOOPBACK}:{r.ports['admin']}", **COMMON), env=ADMIN_ENV) for r in replicas}
    wait_until(lambda: up(balancer) == list(NAMES), 60, what="haproxy to find every replica up",
               watch=list(started.values()), step=0.2)
    dirs = [tmp_path / f"client-{i}" for i in range(3)]
    clients: list[Proc] = []
    for i, d in enumerate(dirs):
        first = 1 + i * DEVICES_PER_CLIENT
        clients.append(procs.start(d.name, [
            "client", "--coordinator", front, "--users", f"{first}-{first + DEVICES_PER_CLIENT - 1}",
            "--state-dir", str(d), "--no-dp-floor",
            *flags(dict(dataset="synthetic", seed=0, debug_record_inputs=True, threads=1))]))
        wait_until(lambda: sum(stream_owners(url).values()) == (i + 1) * DEVICES_PER_CLIENT, 60,
                   what=f"client {i}'s devices to be published", watch=[*started.values(), *clients], step=0.1)
    return started, clients, dirs
