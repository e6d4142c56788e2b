"""`fedmask bench connections --replicas R`: idle devices held by a tier of
active replicas (D109) over PostgreSQL, and what each replica's memory
holds for them.

What it starts:
- a throwaway PostgreSQL server (`throwaway_postgres.py`, as `bench scale`
  does) and one database on it;
- `enrolled - devices` devices enrolled straight into the store (random
  identity keys, a handle each, in batches of BATCH, one transaction each),
  so that every replica serves a registry of `enrolled` devices although
  only `devices` of them connect;
- R replicas of `fedmask coordinator --replica-mode active` that never open
  a round (the cohort asked is one more device than can connect);
- P client processes hosting the `devices` connected devices, each given
  every replica's address, client i's list starting at replica i mod R (the
  streams spread, as in `bench scale --replica-mode active`).

It waits until the store says every connected device's stream is published
by some replica (`stream_counts`, one store kept open for the bench), holds them `hold` seconds
(heartbeating), then reads each replica's RSS and its peak (sampled every
0.1 s from /proc). The last line of output is one JSON object: `ok` (every
device published and still held after the hold, every process alive),
`enrolled`, `devices`, `published` (per replica), `connect_s`, and per
replica `rss_mb`, `rss_peak_mb` and `rss_before_clients_mb`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedmask.bench.loopback_federation import bench_folder, start_client, start_coordinator
from fedmask.bench.processes import ProcessFailed, ProcessGroup, free_port, rss_mb, split_users, wait_until, write_user_csv
from fedmask.bench.throwaway_postgres import PgServer

if TYPE_CHECKING:
    from coordinator.store import Store

#: Devices enrolled in one transaction when the bench fills the registry.
BATCH = 5000


@dataclass(frozen=True)
class IdleTierConfig:
    replicas: int = 3
    devices: int = 10_000
    enrolled: int = 100_000
    client_processes: int = 8
    hold: float = 10.0
    heartbeat_interval: float = 2.0
    lease_s: float = 10.0
    timeout: float = 600.0
    seed: int = 0
    server: PgServer | None = None  # a running PostgreSQL server to use (the tests'); None: a throwaway one

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.enrolled < self.devices:
            raise ValueError(f"--enrolled ({self.enrolled}) must be at least --devices ({self.devices}): "
                             "the connected devices are enrolled too")
        if self.client_processes > self.devices:
            raise ValueError(f"--client-processes ({self.client_processes}) is more than --devices ({self.devices})")


def fill_registry(store: Store, count: int, log: Callable[[str], None]) -> float:
    """Enrol `count` devices that never connect (random keys, handles `idle-N`); the seconds it took."""
    t0 = time.monotonic()
    for lo in range(0, count, BATCH):
        n = min(BATCH, count - lo)
        store.enroll_devices([(os.urandom(32), f"idle-{lo + j}") for j in range(n)])
        if (lo // BATCH) % 4 == 3:
            log(f"  {lo + n:,} of {count:,} devices enrolled straight into the store")
    return time.monotonic() - t0


def _replica_flags(cfg: IdleTierConfig, url: str, port: int, index: int) -> dict[str, Any]:
    return {
        "database_url": url, "listen": f"127.0.0.1:{port}", "replica_id": f"replica-{index}",
        "replica_mode": "active", "lease_seconds": cfg.lease_s, "model": "synthetic",
        "model_params": {"vector_length": 16},
        # never a round: the devices stay idle
        "cohort_size": cfg.devices + 1, "cohort_minimum": cfg.devices + 1,
        "heartbeat_interval": cfg.heartbeat_interval, "dp_mode": "none", "log_level": "INFO",
    }


def _published(store: Store) -> dict[str, int]:
    """replica -> the available devices whose streams it holds, as the store
    counts them (running terms only; replicas holding none left out)."""
    return {name: available for name, (_, available) in store.stream_counts().items() if available}


def run_idle_tier_bench(cfg: IdleTierConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    from fedmask.bench.scale import database_on, postgres_server

    from coordinator.store import open_store

    with bench_folder("fedmask-bench-idle-", None) as root, postgres_server(cfg.replicas, cfg.server, log) as server, \
            database_on(server, "idle") as url, contextlib.closing(open_store(url)) as store:
        extra = cfg.enrolled - cfg.devices
        fill_s = fill_registry(store, extra, log) if extra else 0.0
        log(f"{extra:,} devices enrolled straight into the store in {fill_s:.1f} s")
        csv = write_user_csv(root / "users.csv", cfg.devices, seed=cfg.seed)
        with ProcessGroup(root, env={"OMP_NUM_THREADS": "1"}) as group:
            ports = [free_port() for _ in range(cfg.replicas)]
            tier = [start_coordinator(group, ports[i], _replica_flags(cfg, url, ports[i], i), name=f"replica-{i}")
                    for i in range(cfg.replicas)]
            group.sample_rss_of(tier)
            before = {c.name: round(rss_mb(c.pid) or 0.0, 1) for c in tier}
            log(f"{cfg.replicas} active replica(s) serve; RSS before the clients: {before} MB")
            t0 = time.monotonic()
            for i, users in enumerate(split_users(1, cfg.devices, cfg.client_processes)):
                k = i % cfg.replicas
                start_client(group, f"client-{i}", ports[k:] + ports[:k], users, root / f"client-{i}",
                             {"dataset": str(csv), "threads": 1, "log_level": "warning", "no_dp_floor": True})
            watch = list(group.children)
            ok = True
            try:
                wait_until(lambda: sum(_published(store).values()) >= cfg.devices, cfg.timeout,
                           what=f"{cfg.devices} devices' streams to be published", watch=watch, step=1.0)
            except ProcessFailed as exc:
                log(str(exc))
                ok = False
            connect_s = time.monotonic() - t0
            log(f"{sum(_published(store).values()):,} devices held after {connect_s:.1f} s; holding {cfg.hold:g} s")
            time.sleep(cfg.hold if ok else 0)
            published = _published(store)
            ok = ok and sum(published.values()) == cfg.devices and all(c.alive() for c in watch)
            for c in tier:
                c.sample_rss()
            rss = {c.name: round(rss_mb(c.pid) or 0.0, 1) for c in tier}
            peak = {c.name: round(c.peak_rss_mb, 1) for c in tier}
    return {
        "ok": ok, "replicas": cfg.replicas, "replica_mode": "active", "enrolled": cfg.enrolled,
        "devices": cfg.devices, "client_processes": cfg.client_processes, "published": published,
        "connect_s": round(connect_s, 2), "held_s": cfg.hold, "registry_fill_s": round(fill_s, 1),
        "replica_rss_mb": rss, "replica_rss_peak_mb": peak, "replica_rss_before_clients_mb": before,
    }


__all__ = ["BATCH", "IdleTierConfig", "fill_registry", "run_idle_tier_bench"]
