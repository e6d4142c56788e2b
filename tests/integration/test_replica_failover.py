"""A coordinator tier on PostgreSQL with a leader lease (D90), over real
processes on 127.0.0.1.

Two replicas of `fedmask coordinator` share one PostgreSQL store; the one
holding the lease leads (binds its device port, runs rounds), the other
waits as a standby. The clients take both addresses (--coordinator A,B) and
try them in turn on each reconnect.

1. kill -9 the leader mid-federation: the standby takes the lease within
   the lease time plus 5 s, aborts the round in flight and goes on from the
   last committed version; the clients move to it; the version history has
   no gap and no duplicate, and every committed aggregate is exact.
2. SIGSTOP the leader past its lease, let the standby take over, then
   SIGCONT the old leader: it finds its lease lost, commits nothing (the
   store's fence refuses a deposed leader's writes) and exits with code 3
   so that a supervisor restarts it as a standby; rounds go on under the
   new leader with no duplicate version.
3. A second coordinator on the same SQLite store is refused (exit code 2)
   with a message that says to run replicas on PostgreSQL.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

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
    open_store_readonly,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow]

LEASE_S = 3.0
#: Seconds between rounds. The tests stop the leader right after a commit,
#: inside this pause, so that every version in the history is a committed
#: round's: a leader killed after asking for unmasking makes its successor
#: skip the spent version (D94), which test_replica_spent_version.py tests.
ROUND_PAUSE_S = 3.0
L = 32
COMMON: dict[str, Any] = dict(
    model="synthetic", model_params={"vector_length": L}, cohort_size=6, cohort_minimum=4, over_selection=0.0,
    allow_consecutive=True, seed=1, selection_deadline=5, training_deadline=2, advertise_keys_deadline=5,
    share_keys_deadline=5, unmasking_deadline=5, masked_input_deadline=5, secagg_graph="full",
    secagg_threshold="majority", dp_mode="none", debug_record_sums=True, lease_seconds=LEASE_S,
    round_pause=ROUND_PAUSE_S,
)


def _replica(procs: Processes, name: str, port: int, url: str, **extra: Any) -> Proc:
    return procs.start(name, coordinator_args(port, url, replica_id=name, **COMMON, **extra))


def _clients(procs: Processes, tmp_path: Path, ports: tuple[int, int]) -> tuple[list[Path], list[Proc]]:
    target = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    started = [
        procs.start(d.name, ["client", "--coordinator", target, "--users", users, "--state-dir", str(d), "--no-dp-floor",
                             *flags(dict(dataset="synthetic", seed=0, debug_record_inputs=True, threads=1))])
        for d, users in zip(dirs, ("1-3", "4-6"))
    ]
    return dirs, started


def _committed(url: str) -> list[Any]:
    return [r for r in terminal_rounds(url) if r.state.value == "committed"]


def _standby(proc: Proc, port: int) -> None:
    wait_until(lambda: events(proc.log(), "standby"), 30, what=f"{proc.name} to wait as a standby", watch=[proc])
    assert health_status(port) is None  # a standby serves no device


def _elected_at(proc: Proc) -> float:
    wait_until(lambda: events(proc.log(), "leader_elected"), 30, what=f"{proc.name} to take the lease", watch=[proc])
    return time.monotonic()


def _tier(procs: Processes, tmp_path: Path, url: str, rounds: int) -> tuple[tuple[int, int], Proc, Proc, list[Path],
                                                                           list[Proc]]:
    """Replica A leading, replica B its standby, two clients given both
    addresses; returns once A committed `rounds` rounds."""
    ports = (free_port(), free_port())
    a = _replica(procs, "replica-a", ports[0], url)
    wait_serving(ports[0], a)
    b = _replica(procs, "replica-b", ports[1], url)
    _standby(b, ports[1])
    dirs, clients = _clients(procs, tmp_path, ports)
    wait_until(lambda: len(_committed(url)) >= rounds, 90, what=f"{rounds} rounds committed by the leader",
               watch=[a, b, *clients], step=0.05)
    return ports, a, b, dirs, clients


@pytest.mark.timeout(240)
def test_kill_the_leader_and_the_standby_takes_over(procs: Processes, tmp_path: Path, postgresql_url: str) -> None:
    url = postgresql_url
    ports, a, b, dirs, clients = _tier(procs, tmp_path, url, 2)

    a.kill()
    killed = time.monotonic()
    before = len(_committed(url))
    in_flight = [r.number for r in all_rounds(url) if not r.state.is_terminal]
    took = _elected_at(b) - killed
    assert took <= LEASE_S + 5.0, f"the standby took {took:.1f} s to lead (lease {LEASE_S} s)"
    wait_serving(ports[1], b)
    wait_until(lambda: len(_committed(url)) >= before + 2, 120, what="2 rounds committed by the new leader",
               watch=[b, *clients])
    assert b.stop() == 0

    committed = check_version_history(url, dirs, skips=False)
    assert len(committed) >= before + 2
    by_number = {r.number: r for r in all_rounds(url)}
    for number in in_flight:  # the round the dead leader was running: aborted by its successor, never committed
        assert by_number[number].state.value == "aborted" and by_number[number].abort_reason == "coordinator_restart"


@pytest.mark.timeout(240)
def test_a_paused_leader_that_wakes_is_fenced_out(procs: Processes, tmp_path: Path, postgresql_url: str) -> None:
    url = postgresql_url
    ports, a, b, dirs, clients = _tier(procs, tmp_path, url, 1)

    before = len(_committed(url))
    a.signal_group(signal.SIGSTOP)
    try:
        _elected_at(b)
        wait_serving(ports[1], b)
    finally:
        a.signal_group(signal.SIGCONT)
    # The paused leader's device streams stayed open (its kernel kept the TCP
    # connections), so the clients move when it wakes and leaves, or when
    # gRPC keepalive gives up on it, whichever comes first.
    assert a.wait(30) == 3, a.tail()
    lost = events(a.log(), "leadership_lost")
    assert lost and lost[0]["replica"] == "replica-a", a.tail()
    wait_until(lambda: len(_committed(url)) >= before + 2, 120, what="rounds going on under the new leader",
               watch=[b, *clients])
    assert b.stop() == 0
    check_version_history(url, dirs, skips=False)


@pytest.mark.timeout(60)
def test_a_second_coordinator_on_sqlite_is_refused(procs: Processes, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    ports = (free_port(), free_port())
    alone = {**COMMON, "lease_seconds": 1.0}
    first = procs.start("first", coordinator_args(ports[0], url, replica_id="first", **alone))
    wait_serving(ports[0], first)
    second = procs.start("second", coordinator_args(ports[1], url, replica_id="second", **alone))
    assert second.wait(30) == 2, second.tail()
    refused = events(second.log(), "refused")
    assert refused and "held by first" in refused[0]["why"] and "PostgreSQL" in refused[0]["why"], second.tail()
    assert health_status(ports[1]) is None
    procs.check_alive(first)
