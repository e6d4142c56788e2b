"""A leader cut off from PostgreSQL (D90, D94), over real processes on
127.0.0.1: it stops serving rounds, its devices move, rounds go on.

Two replicas share one PostgreSQL store. The leader (replica-a) reaches
PostgreSQL only through a TCP forwarder the test holds (tests/integration/
tcp_cut.py); the standby (replica-b) connects directly. The devices know
only HAProxy's address (fedmask/bench/balancer.py), which passes them to
the replica whose health listener says SERVING.

After two committed rounds the test cuts the forwarder, in one of two ways:
every connection of the leader to PostgreSQL is reset and new ones are
refused ("reset"), or no byte passes any more while every connection stays
open, as on a network that drops packets ("silent": a store call then
waits on TCP timeouts instead of failing). Then:
- the leader's renewals fail or go unanswered; its lease keeper gives up at the safety
  margin (0.8 of the lease) before the lease runs out in the database, so
  it stops serving (health NOT_SERVING, HAProxy marks it DOWN) and logs
  `leadership_lost`, within the lease time. Reset, it exits with status 3
  at once; silent, its exit waits for the store call it had in flight
  (the test then resets the path and sees status 3);
- the standby takes the lease within the lease time plus 5 s of the cut,
  HAProxy marks it UP, and the same two client processes (six devices) are
  counted in its rounds: the devices moved;
- two more rounds commit; the version history has no gap and no duplicate
  (a version the cut-off leader spent is skipped, D94), and every committed
  aggregate is exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from fedmask.bench.balancer import Balancer, Replica, Route, haproxy_binary
from integration_harness import (
    LOOPBACK,
    Processes,
    Proc,
    all_rounds,
    check_version_history,
    coordinator_args,
    events,
    flags,
    free_port,
    health_status,
    wait_until,
)
from tcp_cut import TcpForwarder

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (Debian's haproxy; .ci/ensure-haproxy)"),
]

LEASE_S = 3.0
L = 32
COMMON: dict[str, Any] = dict(
    model="synthetic", model_params={"vector_length": L}, cohort_size=6, cohort_minimum=4, over_selection=0.0,
    allow_consecutive=True, seed=1, selection_deadline=3, training_deadline=2, advertise_keys_deadline=5,
    share_keys_deadline=5, unmasking_deadline=5, masked_input_deadline=5, secagg_graph="full",
    secagg_threshold="majority", dp_mode="none", debug_record_sums=True, lease_seconds=LEASE_S, round_pause=0.5,
)
NAMES = ("replica-a", "replica-b")


@pytest.fixture
def balanced(tmp_path: Path) -> Iterator[tuple[Balancer, list[Replica], str]]:
    replicas = [Replica(name, LOOPBACK, free_port(), {"devices": free_port()}) for name in NAMES]
    front = f"{LOOPBACK}:{free_port()}"
    balancer = Balancer(tmp_path, [Route("devices", front)], replicas)
    try:
        yield balancer, replicas, front
    finally:
        balancer.close()


def _committed(url: str) -> list[Any]:
    return [r for r in all_rounds(url) if r.state.value == "committed"]


def _up(balancer: Balancer) -> list[str]:
    return sorted(k.split("/", 1)[1] for k, status in balancer.servers().items() if status.startswith("UP"))


def _through(forwarder: TcpForwarder, url: str) -> str:
    """`url` with its host and port replaced by the forwarder's."""
    return make_url(url).set(host=LOOPBACK, port=forwarder.port).render_as_string(hide_password=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["reset", "silent"])
def test_a_leader_cut_off_from_postgresql_steps_down(procs: Processes, tmp_path: Path, postgresql_url: str,
                                                     balanced: tuple[Balancer, list[Replica], str], kind: str) -> None:
    url = postgresql_url
    balancer, replicas, front = balanced
    pg = make_url(url)
    path = TcpForwarder((str(pg.host), int(pg.port or 5432)))
    try:
        started: dict[str, Proc] = {}
        for r, db in zip(replicas, (_through(path, url), url)):
            started[r.name] = procs.start(r.name, coordinator_args(
                r.ports["devices"], db, replica_id=r.name, health_listen=f"{LOOPBACK}:{r.health_port}", **COMMON))
            if r.name == NAMES[0]:  # a leads (through the forwarder), b then waits as its standby
                wait_until(lambda: _up(balancer) == [NAMES[0]], 60, what="haproxy to find the leader up",
                           watch=[started[NAMES[0]]], step=0.2)
        a, b = started[NAMES[0]], started[NAMES[1]]
        wait_until(lambda: events(b.log(), "standby"), 30, what="replica-b standby", watch=[b])
        dirs = [tmp_path / "client-a", tmp_path / "client-b"]
        clients = [procs.start(d.name, ["client", "--coordinator", front, "--users", users, "--state-dir", str(d),
                                        "--no-dp-floor", *flags(dict(dataset="synthetic", seed=0,
                                                                     debug_record_inputs=True, threads=1))])
                   for d, users in zip(dirs, ("1-3", "4-6"))]
        wait_until(lambda: len(_committed(url)) >= 2, 90, what="2 rounds committed by replica-a",
                   watch=[a, b, *clients], step=0.1)
        assert path.forwarded > 0  # replica-a's store really goes through the forwarder

        cut = time.monotonic()
        path.cut() if kind == "reset" else path.silence()
        wait_until(lambda: health_status(replicas[0].ports["devices"]) != "SERVING", LEASE_S + 2,
                   what="replica-a to stop serving", step=0.1)
        stopped = time.monotonic() - cut
        assert stopped <= LEASE_S, f"the cut-off leader served {stopped:.1f} s after the cut (lease {LEASE_S} s)"
        lost = events(a.log(), "leadership_lost")
        assert lost and "no renewal reached the store" in lost[0]["reason"], a.tail()
        if kind == "reset":  # the store's errors reach it at once: it exits, deposed
            assert a.wait(30) == 3, a.tail()  # a supervisor restarts it as a standby
            assert events(a.log(), "lease_renewal_failed"), a.tail()

        wait_until(lambda: events(b.log(), "leader_elected"), LEASE_S + 5, what="replica-b to take the lease",
                   watch=[b])
        took = time.monotonic() - cut
        assert took <= LEASE_S + 5.0, f"the standby took {took:.1f} s to lead (lease {LEASE_S} s)"
        wait_until(lambda: _up(balancer) == [NAMES[1]], 15, what="haproxy to find replica-b up and replica-a down",
                   watch=[b], step=0.1)
        before = max((r.number for r in all_rounds(url)), default=0)
        wait_until(lambda: len([r for r in _committed(url) if r.number > before]) >= 2, 90,
                   what="2 rounds committed by replica-b", watch=[b, *clients], step=0.1)
        assert b.stop() == 0
        for c in clients:
            procs.check_alive(c)
        if kind == "silent":  # its exit waited on a store call that never returned; reset, that call fails
            path.cut()
            assert a.wait(60) == 3, a.tail()
    finally:
        path.cut()

    committed = check_version_history(url, dirs)
    for d in dirs:  # each client process's devices were counted by replica-b: they moved
        after = [r.number for r in committed if r.number > before
                 and any((d / "debug" / "inputs" / f"round-{r.number:06d}" / f"device-{i}.npy").exists()
                         for i in r.survivors["masked_input"])]
        assert after, f"no device of {d.name} was counted after the cut"
