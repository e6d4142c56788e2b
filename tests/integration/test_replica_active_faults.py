"""Faults of the active tier (D109) over real processes on PostgreSQL,
behind HAProxy: three active replicas, each reaching PostgreSQL through a
TCP forwarder the test holds (tests/integration/tcp_cut.py), and three
client processes of four devices each. The round's minimum is every device
(12), so a round that commits after a fault counts the devices of the
replica that failed: they moved.

1. The leader is paused (SIGSTOP) past its lease: another replica leads
   within the lease plus 5 s and HAProxy marks the paused one DOWN. Woken
   (SIGCONT), the old leader finds its membership and its lease lost: it
   writes nothing more (the store's fence refuses a deposed leader's
   writes) and exits with status 3; its client's devices
   reconnect through the balancer, and rounds go on over the other two.
2. A replica that does not lead is cut off from PostgreSQL (every
   connection of it reset, new ones refused): it stops serving within the
   lease (health NOT_SERVING, HAProxy marks it DOWN) and exits with status
   3; its devices move, the leader leads on, and rounds go on. (A leader cut
   off loses its lease as well: test_replica_cut_off.py cuts the standby
   mode's leader, and case 1 takes an active leader's lease away.)

Every case ends with a version history with no gap and no duplicate (a
version a deposed leader spent is skipped, D94) and every committed
aggregate exact.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from active_tier import DEVICES_PER_CLIENT, LEASE_S, MARKS, NAMES, committed, groups, start_tier, up
from fedmask.bench.balancer import Balancer, Replica
from integration_harness import LOOPBACK, Proc, Processes, check_version_history, events, health_status, wait_until
from tcp_cut import TcpForwarder

pytestmark = MARKS


@pytest.fixture
def paths(postgresql_url: str) -> Iterator[dict[str, TcpForwarder]]:
    """replica name -> the forwarder its store goes through."""
    pg = make_url(postgresql_url)
    made = {name: TcpForwarder((str(pg.host), int(pg.port or 5432))) for name in NAMES}
    try:
        yield made
    finally:
        for path in made.values():
            path.cut()


def _through(path: TcpForwarder, url: str) -> str:
    return make_url(url).set(host=LOOPBACK, port=path.port).render_as_string(hide_password=False)


def _leader(started: dict, names: tuple[str, ...] | list[str] = NAMES) -> str:
    (leader,) = [n for n in names if events(started[n].log(), "leader_elected")]
    return leader


def _rounds_go_on_without(url: str, gone: str, before: int, watch: list) -> None:
    """Two rounds commit after the `before` first, one of them with no group on `gone`: the round's minimum is
    every device, so its client's devices moved to the live replicas and were counted there."""
    def moved() -> bool:
        return any(gone not in groups(url, r.number) for r in committed(url)[before:])

    wait_until(lambda: len(committed(url)) >= before + 2 and moved(), 180,
               what=f"2 rounds, one over the live replicas alone with all {3 * DEVICES_PER_CLIENT} devices",
               watch=watch, step=0.1)
    for rec in committed(url)[before:]:
        if gone not in groups(url, rec.number):
            assert len(rec.survivors["masked_input"]) == 3 * DEVICES_PER_CLIENT, rec.survivors


def _rounds_go_on_then_stop(procs: Processes, url: str, gone: str, before: int, live: list[Proc],
                            clients: list[Proc], dirs: list[Path]) -> None:
    """Rounds go on without `gone` (`_rounds_go_on_without`), every client lives, the live replicas
    stop cleanly, and the version history has no gap or duplicate."""
    _rounds_go_on_without(url, gone, before, live + clients)
    for c in clients:
        procs.check_alive(c)
    for replica in live:
        assert replica.stop() == 0
    check_version_history(url, dirs)


def _after_a_round(procs: Processes, tmp_path: Path, url: str, balanced: tuple[Balancer, list[Replica], str],
                   paths: dict[str, TcpForwarder]) -> tuple[dict[str, Proc], list[Proc], list[Path]]:
    """The tier started, each replica's store through its forwarder; returns once a round committed."""
    balancer, replicas, front = balanced
    started, clients, dirs = start_tier(procs, tmp_path, url, balancer, replicas, front,
                                        {n: _through(p, url) for n, p in paths.items()})
    wait_until(lambda: len(committed(url)) >= 1, 120, what="a round across the replicas",
               watch=[*started.values(), *clients], step=0.1)
    return started, clients, dirs


@pytest.mark.timeout(240)
def test_a_paused_active_leader_that_wakes_is_fenced_out(procs: Processes, tmp_path: Path, postgresql_url: str,
                                                         balanced: tuple[Balancer, list[Replica], str],
                                                         paths: dict[str, TcpForwarder]) -> None:
    url = postgresql_url
    balancer = balanced[0]
    started, clients, dirs = _after_a_round(procs, tmp_path, url, balanced, paths)
    leader = _leader(started)
    live = [n for n in NAMES if n != leader]
    before = len(committed(url))
    started[leader].signal_group(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        wait_until(lambda: any(events(started[n].log(), "leader_elected") for n in live), LEASE_S + 5.0,
                   what="another replica to lead", watch=[started[n] for n in live], step=0.1)
        took = time.monotonic() - paused
        assert took <= LEASE_S + 5.0, took
        wait_until(lambda: leader not in up(balancer), 15, what="haproxy to mark the paused leader down", step=0.1)
    finally:
        started[leader].signal_group(signal.SIGCONT)
    old = started[leader]
    assert old.wait(30) == 3, old.tail()  # deposed: a supervisor restarts it as a new term
    # it woke to find its membership (and its lease) over; which of its two keepers said so first is a race
    gone = events(old.log(), "membership_lost_exit")
    assert gone and gone[0]["replica"] == leader, old.tail()
    successor = _leader(started, live)
    wait_until(lambda: up(balancer, "admin") == [successor], 15, what="the admin route to follow the new leader",
               step=0.1)
    _rounds_go_on_then_stop(procs, url, leader, before, [started[n] for n in live], clients, dirs)


@pytest.mark.timeout(240)
def test_an_active_replica_cut_off_from_postgresql_stops_serving(
        procs: Processes, tmp_path: Path, postgresql_url: str, balanced: tuple[Balancer, list[Replica], str],
        paths: dict[str, TcpForwarder]) -> None:
    url = postgresql_url
    balancer, replicas, _ = balanced
    started, clients, dirs = _after_a_round(procs, tmp_path, url, balanced, paths)
    leader = _leader(started)
    victim = next(n for n in NAMES if n != leader)
    live = [n for n in NAMES if n != victim]
    port = next(r.ports["devices"] for r in replicas if r.name == victim)
    assert paths[victim].forwarded > 0  # its store really goes through the forwarder
    before = len(committed(url))

    cut = time.monotonic()
    paths[victim].cut()
    wait_until(lambda: health_status(port) != "SERVING", LEASE_S + 2, what=f"{victim} to stop serving", step=0.1)
    stopped = time.monotonic() - cut
    assert stopped <= LEASE_S, f"the cut-off replica served {stopped:.1f} s after the cut (lease {LEASE_S} s)"
    assert started[victim].wait(30) == 3, started[victim].tail()
    assert events(started[victim].log(), "membership_lost_exit"), started[victim].tail()
    wait_until(lambda: victim not in up(balancer), 15, what="haproxy to mark the cut-off replica down", step=0.1)
    assert [n for n in live if events(started[n].log(), "leader_elected")] == [leader]  # the leader led on
    _rounds_go_on_then_stop(procs, url, victim, before, [started[n] for n in live], clients, dirs)
