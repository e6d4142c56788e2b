"""The coordinator's Prometheus metrics (`prometheus_client`), in a registry
of their own, served on `metrics.listen` (GET /metrics).

Names follow the Prometheus conventions: the `fedmask_` prefix, base units
(`_seconds`, `_bytes`), `_total` for counters. Labels take a small fixed set
of values (an outcome, a stage, an abort reason, a top-k status); never a
device id, a user or a handle.

The coordinator pushes values from its event loop (counters and histograms
when something ends, gauges when they change), so a scrape (in the HTTP
server's thread) never reads the coordinator's state while it changes.

Replicas (D90, D94). Every replica serves its own /metrics, a standby too
(from the moment it starts waiting), and every sample carries the label
`replica` (its name in the leader lease) when the metrics are built with
one (`fedmask coordinator` always does). `fedmask_replica_leader` is 1 on
the replica that holds the lease and serves devices, 0 on a standby or a
deposed one; `fedmask_replica_lease_token` is the fencing token of its
latest term (0: it never led). `sum(fedmask_replica_leader)` over the tier
is 1 while it leads, 0 during a failover.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

#: Round and stage durations: from loopback benchmarks (0.1 s) to a slow
#: federation's training window (10 min).
ROUND_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOPK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


REPLICA_LABEL = "replica"


class _Labelled(Collector):
    """Every sample of `registry`, with `replica="NAME"` added."""

    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        self._registry = registry
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [Sample(s.name, {**s.labels, REPLICA_LABEL: self._replica}, s.value, s.timestamp,
                                  s.exemplar) for s in family.samples]
            yield out


class CoordinatorMetrics:
    """See the module doc. One instance per Coordinator; `exposed` is the
    registry to serve (the metrics, labelled with `replica` if given)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, replica: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.exposed = self.registry
        if replica is not None:
            self.exposed = CollectorRegistry(auto_describe=False)
            self.exposed.register(_Labelled(self.registry, replica))
        r = self.registry
        self.rounds = Counter("fedmask_rounds", "Rounds that ended, by outcome (committed, aborted).",
                              ["outcome"], registry=r)
        self.aborts = Counter("fedmask_round_aborts", "Aborted rounds by abort reason.", ["reason"], registry=r)
        self.round_duration = Histogram("fedmask_round_duration_seconds",
                                        "From opening a round to its commit or abort.", buckets=ROUND_BUCKETS,
                                        registry=r)
        self.stage_duration = Histogram("fedmask_stage_duration_seconds", "Time each round stage was open.",
                                        ["stage"], buckets=ROUND_BUCKETS, registry=r)
        self.dropouts = Counter("fedmask_dropouts", "Devices that left a round, by the stage they left at.",
                                ["stage"], registry=r)
        self.update_bytes = Counter("fedmask_update_bytes", "Bytes of masked (or plaintext) updates received.",
                                    registry=r)
        self.enrolled = Gauge("fedmask_enrolled_devices", "Enrolled devices (revoked included).", registry=r)
        self.connected = Gauge("fedmask_connected_devices", "Devices hosted by an open Session stream.",
                               registry=r)
        self.available = Gauge("fedmask_available_devices", "Connected devices selectable for a round now.",
                               registry=r)
        self.live_survivors = Gauge("fedmask_live_round_survivors",
                                    "Devices still in the running round (0 when none runs).", registry=r)
        self.live_threshold = Gauge("fedmask_live_round_threshold",
                                    "Shamir threshold of the running round (0 when none runs).", registry=r)
        self.live_cohort = Gauge("fedmask_live_round_cohort_size", "Cohort of the running round (0 when none runs).",
                                 registry=r)
        self.epsilon_spent = Gauge("fedmask_epsilon_spent", "Cumulative epsilon of the committed rounds.",
                                   registry=r)
        self.epsilon_budget = Gauge("fedmask_epsilon_budget", "The configured epsilon budget (0: none).",
                                    registry=r)
        self.budget_exhausted = Gauge("fedmask_budget_exhausted", "1 when the epsilon budget stops the rounds.",
                                      registry=r)
        self.paused = Gauge("fedmask_paused", "1 when an operator paused the federation.", registry=r)
        self.topk_requests = Counter("fedmask_topk_requests", "Top-k requests relayed to devices, by status.",
                                     ["status"], registry=r)
        self.topk_latency = Histogram("fedmask_topk_latency_seconds",
                                      "From sending a top-k request to the device's answer (or failure).",
                                      buckets=TOPK_BUCKETS, registry=r)
        self.watchers = Gauge("fedmask_event_watchers", "Open WatchEvents streams.", registry=r)
        self.watchers_dropped = Counter("fedmask_event_watchers_dropped",
                                        "Event watchers dropped for falling behind.", registry=r)
        self.leader = Gauge("fedmask_replica_leader",
                            "1 while this replica holds the leader lease and serves devices, 0 as a standby.",
                            registry=r)
        self.lease_token = Gauge("fedmask_replica_lease_token",
                                 "The fencing token of this replica's latest term (0: it never led).", registry=r)

    def leading(self, token: int | None) -> None:
        """This replica leads with fencing token `token`, or (None) it does not lead."""
        self.leader.set(0 if token is None else 1)
        if token is not None:
            self.lease_token.set(token)

    def round_ended(self, *, committed: bool, reason: str | None, duration_s: float | None,
                    timings: Mapping[str, float], dropouts: Mapping[str, int]) -> None:
        self.rounds.labels(outcome="committed" if committed else "aborted").inc()
        if not committed:
            self.aborts.labels(reason=reason or "unspecified").inc()
        if duration_s is not None:
            self.round_duration.observe(max(0.0, duration_s))
        for stage, seconds in timings.items():
            self.stage_duration.labels(stage=stage).observe(max(0.0, seconds))
        for stage, n in dropouts.items():
            if n:
                self.dropouts.labels(stage=stage).inc(n)

    def live_round(self, *, survivors: int, threshold: int, cohort: int) -> None:
        self.live_survivors.set(survivors)
        self.live_threshold.set(threshold)
        self.live_cohort.set(cohort)

    def devices(self, *, enrolled: int, connected: int, available: int) -> None:
        self.enrolled.set(enrolled)
        self.connected.set(connected)
        self.available.set(available)

    def privacy(self, *, spent: float, budget: float | None, exhausted: bool) -> None:
        self.epsilon_spent.set(spent)
        self.epsilon_budget.set(budget or 0.0)
        self.budget_exhausted.set(1 if exhausted else 0)

    def top_k(self, status: str, seconds: float) -> None:
        self.topk_requests.labels(status=status).inc()
        self.topk_latency.observe(max(0.0, seconds))

    def exposition(self) -> bytes:
        """The text exposition format of every metric (what GET /metrics serves)."""
        return generate_latest(self.exposed)


__all__ = ["REPLICA_LABEL", "CoordinatorMetrics"]
