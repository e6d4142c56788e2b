"""Three coordinator replicas behind HAProxy (D94), over real processes on
PostgreSQL: the devices know only the balancer's address.

HAProxy (Debian's haproxy 2.6, `.ci/ensure-haproxy`) passes TCP through to
the replica whose health listener says the coordinator service is SERVING
(fedmask/bench/balancer.py): the leader. The test checks that HAProxy marks
exactly the leader UP and the standbys DOWN, that rounds commit through it,
then SIGKILLs the leader: a standby takes the lease, HAProxy marks it UP
and the dead one DOWN, the clients reconnect through the same address, and
rounds go on with no gap or duplicate in the version history, every
committed aggregate exact.

Each replica serves its own Prometheus metrics, labelled `replica`, the
standbys' too: `fedmask_replica_leader` is 1 on the leader only, before and
after the failover, and the successor's lease token is greater.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

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
    wait_until,
)

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
NAMES = ("replica-1", "replica-2", "replica-3")


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


def _leader_gauges(metrics_ports: dict[str, int]) -> dict[str, tuple[float, float]]:
    """replica -> (fedmask_replica_leader, fedmask_replica_lease_token) from each live replica's /metrics."""
    out = {}
    for name, port in metrics_ports.items():
        try:
            text = urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5).read().decode()
        except OSError:
            continue
        values = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name in ("fedmask_replica_leader", "fedmask_replica_lease_token")}
        assert all(s.labels == {"replica": name} for s in values.values()), values
        out[name] = (values["fedmask_replica_leader"].value, values["fedmask_replica_lease_token"].value)
    return out


def _up(balancer: Balancer) -> list[str]:
    return sorted(k.split("/", 1)[1] for k, status in balancer.servers().items() if status.startswith("UP"))


@pytest.mark.timeout(240)
def test_rounds_go_on_through_haproxy_when_the_leader_dies(procs: Processes, tmp_path: Path, postgresql_url: str,
                                                           balanced: tuple[Balancer, list[Replica], str]) -> None:
    url = postgresql_url
    balancer, replicas, front = balanced
    started: dict[str, Proc] = {}
    metrics_ports = {name: free_port() for name in NAMES}
    for r in replicas:
        started[r.name] = procs.start(r.name, coordinator_args(
            r.ports["devices"], url, replica_id=r.name, health_listen=f"{LOOPBACK}:{r.health_port}",
            metrics_listen=f"{LOOPBACK}:{metrics_ports[r.name]}", **COMMON))
        if r.name == NAMES[0]:  # the first leads; the others then wait as standbys
            wait_until(lambda: _up(balancer) == [NAMES[0]], 60, what="haproxy to find the leader up",
                       watch=[started[NAMES[0]]], step=0.2)
    for name in NAMES[1:]:
        wait_until(lambda: events(started[name].log(), "standby"), 30, what=f"{name} standby", watch=[started[name]])
    dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    clients = [procs.start(d.name, ["client", "--coordinator", front, "--users", users, "--state-dir", str(d),
                                    "--no-dp-floor", *flags(dict(dataset="synthetic", seed=0,
                                                                 debug_record_inputs=True, threads=1))])
               for d, users in zip(dirs, ("1-3", "4-6"))]
    wait_until(lambda: len(_committed(url)) >= 2, 90, what="2 rounds through the balancer",
               watch=[*started.values(), *clients], step=0.1)
    assert _up(balancer) == [NAMES[0]], balancer.servers()  # the standbys are down: NOT_SERVING
    gauges = _leader_gauges(metrics_ports)
    assert gauges == {NAMES[0]: (1.0, 1.0), NAMES[1]: (0.0, 0.0), NAMES[2]: (0.0, 0.0)}, gauges

    started[NAMES[0]].kill()
    killed = time.monotonic()
    before = len(_committed(url))
    wait_until(lambda: len(_up(balancer)) == 1 and _up(balancer)[0] != NAMES[0], LEASE_S + 15,
               what="haproxy to find the new leader up", watch=[started[n] for n in NAMES[1:]], step=0.1)
    successor = _up(balancer)[0]
    took = time.monotonic() - killed
    assert took <= LEASE_S + 5.0 + 2.0, f"the balancer found a new leader after {took:.1f} s"  # + two checks
    assert events(started[successor].log(), "leader_elected")
    gauges = _leader_gauges({n: p for n, p in metrics_ports.items() if n != NAMES[0]})
    assert gauges[successor][0] == 1.0 and gauges[successor][1] > 1.0, gauges
    assert [v for n, v in gauges.items() if n != successor] == [(0.0, 0.0)], gauges
    wait_until(lambda: len(_committed(url)) >= before + 2, 120, what="2 rounds committed through the balancer",
               watch=[started[successor], *clients], step=0.1)
    for c in clients:
        procs.check_alive(c)
    assert started[successor].stop() == 0

    check_version_history(url, dirs)
