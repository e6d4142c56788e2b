"""Prometheus metrics per replica (coordinator/metrics.py, D94): every
sample carries the replica's name, and the leader is marked. Over real
replica processes behind HAProxy: tests/integration/test_replica_balancer.py."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from coordinator.metrics import CoordinatorMetrics


def _samples(m: CoordinatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.exposition().decode()) for s in f.samples}


def test_every_sample_names_its_replica_and_the_leader_is_marked() -> None:
    m = CoordinatorMetrics(replica="replica-2")
    m.rounds.labels(outcome="committed").inc()
    standby = _samples(m)
    assert all(dict(labels).get("replica") == "replica-2" for _, labels in standby)
    assert standby[("fedmask_replica_leader", (("replica", "replica-2"),))] == 0
    assert standby[("fedmask_rounds_total", (("outcome", "committed"), ("replica", "replica-2")))] == 1

    m.leading(7)
    leading = _samples(m)
    assert leading[("fedmask_replica_leader", (("replica", "replica-2"),))] == 1
    assert leading[("fedmask_replica_lease_token", (("replica", "replica-2"),))] == 7
    m.leading(None)  # deposed or shutting down: no longer the leader, its last term kept
    after = _samples(m)
    assert after[("fedmask_replica_leader", (("replica", "replica-2"),))] == 0
    assert after[("fedmask_replica_lease_token", (("replica", "replica-2"),))] == 7


def test_without_a_replica_name_the_samples_are_as_before() -> None:
    m = CoordinatorMetrics()
    assert all("replica" not in dict(labels) for _, labels in _samples(m))
