"""`fedmask bench scale`: secure rounds served by a tier of coordinator
replicas over PostgreSQL, over real processes on 127.0.0.1.

`run_scale_bench(ScaleBenchConfig(...))` starts a throwaway PostgreSQL
server (fedmask/bench/throwaway_postgres.py; or uses `server`, as the tests
do), then for R = 1 (the baseline, unless `baseline` is off) and for R =
`replicas`, each on a fresh database of that server:

- R replicas of `fedmask coordinator` (the `synthetic` model of length L,
  SecAgg+ at the coordinator's auto degree and threshold, the default
  over-selection, no DP, `--debug-record-sums`, `--rounds` rounds). In the
  standby mode (D90, the default) the first is started alone and leads (it
  holds the store's lease); each other one is started next and must log
  that it waits as a standby. In the active mode (`replica_mode="active"`,
  D109) every replica is started and must serve; one of them leads;
- P edge-client processes hosting N synthetic-update devices (device d's
  update in round r is `uniform(-clip, clip, L)` seeded by (seed, r, d)),
  each given every replica's address (`--coordinator A,B,C`, tried in turn
  on each reconnect); in the active mode client i's list starts at replica
  i mod R, so the streams spread evenly over the replicas. No load
  balancer: the clients' address list is the routing, which the result
  says;
- a `dropout` fraction of the devices goes silent at the masked-input
  stage in each round (the clients' fault injection), so that stage lasts
  its whole learnt deadline.

Once `rounds` rounds have ended the standbys are stopped and the leader
exits by itself (active replicas serve until stopped: all are stopped).
Every committed aggregate is checked bit for bit against the counted
devices' encoded inputs, which the clients recorded.

The cohort: the coordinator selects ceil(size * (1 + f)) devices, f its
default over-selection; the bench sets cohort.size (and the minimum that
starts a round) to the largest size whose selection fits in the N devices,
so every round selects (nearly) all of them; `devices_left_out` counts the
hosted devices a round did not select (in the active mode, the leader's
own count: the devices on replicas left out for holding fewer than G, D109).

Groups: every replica is started with `--group-size G`, so a round whose
cohort reaches 2G runs in groups of at least G, a client process's devices
in one group (D99). In the standby mode only the leader holds device
streams (D90), so no device is left out for sitting on a replica with too
few devices; in the active mode each replica runs the groups of its own
devices.
`groups` is the most groups a round ran in and `secagg` the first round's
shape (cohort, smallest group threshold, largest degree), both from the
rounds' records.

CPU: `replica_cpu_ms_per_device_round` is the replicas' user + system time
(/proc/<pid>/stat, sampled every 0.2 s) from the sample before the first
round opened to the first after the last round ended, over the device-rounds
(the sum of the rounds' cohorts); `client_cpu_ms_per_device_round` is the
same for the client processes (the devices' own work, on the same machine).
Peak RSS: each replica's VmHWM.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import tempfile
import threading
import time
import uuid
from datetime import datetime
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedmask.bench.loopback_federation import (
    FleetShape,
    StageDeadlines,
    bench_folder,
    committed_times,
    exact_aggregate,
    read_rounds,
    round_seconds,
    start_client,
    start_coordinator,
)
from fedmask.bench.processes import (
    Child,
    ProcessFailed,
    ProcessGroup,
    cpu_seconds,
    flags,
    free_port,
    wait_until,
    write_user_csv,
)
from fedmask.bench.scale_faults import Kill, KillPlan, version_history
from fedmask.bench.throwaway_postgres import PgServer, admin, start_server

#: Fairness of a replica comparison (a client process carries all its devices on one stream, which one replica
#: holds): at least three client processes per replica, and at most 8 on the 2-core machine unless three per
#: replica needs more (`fairness_problem`).
MAX_CLIENT_PROCESSES = 8
PROCESSES_PER_REPLICA = 3
ROUTING = ("the clients' address list (--coordinator A,B,C, every replica; each client tries them in turn on "
           "every reconnect); no load balancer")
STREAMS = {"standby": "only the leader holds device streams and runs rounds (D90); the standbys hold none",
           "active": "every replica holds device streams and runs their groups; the leader plans and commits (D109)"}
ROUTING_ACTIVE = ("the clients' address list (--coordinator, every replica, client i's starting at replica i mod R; "
                  "each client tries them in turn on every reconnect); no load balancer")
DROPOUT_STAGE = "masked-input"
_CPU_SAMPLE_S = 0.2


def fairness_problem(replicas: int, client_processes: int) -> str | None:
    """Why `replicas` replicas and `client_processes` client processes make no fair comparison, or None.

    The rule is P >= 3R and P <= 8; the two cannot both hold from R = 3 on, so the upper bound gives way to
    the lower one there: P <= max(8, 3R) (exactly 9 client processes for 3 replicas)."""
    if replicas < 1:
        return f"--replicas must be at least 1, got {replicas}"
    most = max(MAX_CLIENT_PROCESSES, PROCESSES_PER_REPLICA * replicas)
    if client_processes > most:
        return (f"--client-processes {client_processes} is more than {most} (at most {MAX_CLIENT_PROCESSES}, or "
                f"{PROCESSES_PER_REPLICA} per replica when that is more): on a small machine more client processes "
                "measure the clients' scheduling, not the replicas")
    if client_processes < PROCESSES_PER_REPLICA * replicas:
        return (f"--client-processes {client_processes} is fewer than {PROCESSES_PER_REPLICA} per replica "
                f"({PROCESSES_PER_REPLICA * replicas} for --replicas {replicas}): a client process carries its devices "
                "on one stream, so streams could not spread over the replicas")
    return None


@dataclass(frozen=True)
class ScaleBenchConfig:
    fleet: FleetShape = FleetShape(devices=1000, client_processes=9)
    replicas: int = 3
    #: The group size G the rounds run at (each replica's --group-size; see the module doc).
    group_size: int = 500
    dropout: float = 0.05
    rounds: int = 3
    seed: int = 0
    #: Also run R = 1 first, in the same invocation.
    baseline: bool = True
    lease_s: float = 10.0
    deadlines: StageDeadlines = field(default_factory=StageDeadlines)
    #: Seconds each tier (the baseline, then R replicas) may take, processes included.
    timeout: float = 1800.0
    keep: Path | None = None
    #: An already running server to make the databases on (tests); None: start a throwaway one.
    server: PgServer | None = None
    #: kill -9 the leader or a standby in a round's stage (the R-replica tier only; fedmask/bench/scale_faults.py).
    kill: KillPlan | None = None
    #: standby (D90: the leader alone serves) or active (D109: every replica serves its devices' groups).
    replica_mode: str = "standby"

    def __post_init__(self) -> None:
        problem = fairness_problem(self.replicas, self.fleet.client_processes)
        if problem:
            raise ValueError(problem)
        if self.fleet.neighbors != "auto":
            raise ValueError("the scale bench runs SecAgg+ at the coordinator's auto degree (neighbors 'auto')")
        if self.group_size < 2:
            raise ValueError(f"--group-size must be at least 2, got {self.group_size}")
        if not 0.0 <= self.dropout <= 0.5:
            raise ValueError(f"--dropout must be in [0, 0.5], got {self.dropout}")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")
        if self.replica_mode not in STREAMS:
            raise ValueError(f"--replica-mode must be standby or active, got {self.replica_mode!r}")
        if self.kill is not None and self.replica_mode == "active":
            raise ValueError("--kill runs in the standby mode only (its faults strike a leader or a standby)")
        if self.kill is not None and self.replicas < 2:
            raise ValueError("--kill needs at least 2 replicas: one to lose and one to go on")
        if self.kill is not None and self.rounds < self.kill.round_number:
            raise ValueError(f"--kill strikes in round {self.kill.round_number}: run at least that many --rounds")


def cohort_for(devices: int, over_selection: float) -> tuple[int, int]:
    """(cohort.size, selected): the largest size whose selection ceil(size * (1 + f)) fits in `devices`
    (the coordinator's own formula, CohortSettings.selected), and that selection."""
    size = devices
    while size > 1 and math.ceil(size * (1 + over_selection)) > devices:
        size -= 1
    return size, math.ceil(size * (1 + over_selection))


class CpuSampler:
    """Samples the CPU seconds of some processes every 0.2 s on a thread, with wall-clock stamps (see the module doc)."""

    def __init__(self, children: Sequence[Child]) -> None:
        self._children = list(children)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fedmask-cpu-sampler", daemon=True)

    def _sample(self) -> None:
        now = time.time()
        got = {c.name: s for c in self._children if (s := cpu_seconds(c.pid)) is not None}
        self.samples.append((now, got))

    def _loop(self) -> None:
        while not self._stop.wait(_CPU_SAMPLE_S):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def seconds_between(self, start: float, end: float) -> float:
        """CPU seconds all the processes spent from the last sample at or before `start` to the first at or
        after `end` (a process gone by then: its last sample)."""
        total = 0.0
        for c in self._children:
            mine = [(t, s[c.name]) for t, s in self.samples if c.name in s]
            if not mine:
                continue
            before = [v for t, v in mine if t <= start] or [mine[0][1]]
            after = [v for t, v in mine if t >= end] or [mine[-1][1]]
            total += after[0] - before[-1]
        return total


@contextmanager
def database_on(server: PgServer, label: str) -> Iterator[str]:
    """A fresh database on `server` for one tier; its URL. Dropped at the end."""
    name = f"fedmask_scale_{label}_{uuid.uuid4().hex[:10]}"
    admin(server, "CREATE DATABASE {}", name)
    try:
        yield server.url(name)
    finally:
        admin(server, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)


@contextmanager
def postgres_server(replicas: int, server: PgServer | None, log: Callable[[str], None]) -> Iterator[PgServer]:
    """`server` when given, else a throwaway PostgreSQL server with connections enough for `replicas`
    replicas, stopped and removed at the end."""
    if server is not None:
        yield server
        return
    base = Path(tempfile.mkdtemp(prefix="fedmask-bench-pg-", dir="/tmp"))  # the postgres user must traverse it
    try:
        started = start_server(base, max_connections=40 + 4 * replicas)
        try:
            log(f"PostgreSQL ({started.server.version}) on {started.server.host}:{started.server.port}")
            yield started.server
        finally:
            started.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _replica_flags(cfg: ScaleBenchConfig, url: str, port: int, index: int) -> dict[str, Any]:
    from coordinator.settings import CohortSettings

    size, _ = cohort_for(cfg.fleet.devices, CohortSettings().over_selection)
    return {
        "database_url": url, "listen": f"127.0.0.1:{port}", "replica_id": f"replica-{index}",
        "lease_seconds": cfg.lease_s, "model": "synthetic", "model_params": {"vector_length": cfg.fleet.dim},
        "cohort_size": size, "cohort_minimum": size, "allow_consecutive": True, "rounds": cfg.rounds,
        "seed": cfg.seed, "selection_deadline": 120, **cfg.deadlines.flags(), "secagg_graph": "auto",
        "group_size": cfg.group_size, "replica_mode": cfg.replica_mode,
        "dp_mode": "none", "debug_record_sums": True, "log_level": "INFO",
    }


def _start_tier(cfg: ScaleBenchConfig, group: ProcessGroup, url: str, replicas: int,
                log: Callable[[str], None]) -> tuple[list[Child], list[int]]:
    """The replicas: the first once it serves (it leads), each other once it logs that it waits as a standby;
    in the active mode, each once it serves."""
    ports = [free_port() for _ in range(replicas)]
    if cfg.replica_mode == "active":
        tier = [start_coordinator(group, ports[i], _replica_flags(cfg, url, ports[i], i), name=f"replica-{i}")
                for i in range(replicas)]
        log(f"  {replicas} active replica(s) serve, ports {', '.join(map(str, ports))}")
        return tier, ports
    tier = [start_coordinator(group, ports[0], _replica_flags(cfg, url, ports[0], 0), name="replica-0")]
    log(f"  replica-0 (pid {tier[0].pid}) leads, port {ports[0]}")
    for i in range(1, replicas):
        replica = group.start(f"replica-{i}", ["coordinator", *flags(_replica_flags(cfg, url, ports[i], i))])
        log_of = replica.log
        wait_until(lambda: "event=standby" in log_of(), 60, what=f"replica-{i} to wait as a standby",
                   watch=[replica], step=0.2)
        tier.append(replica)
        log(f"  replica-{i} (pid {replica.pid}) waits as a standby, port {ports[i]}")
    return tier, ports


def _run_rounds(cfg: ScaleBenchConfig, url: str, tier: list[Child], clients: list[Child], kill: Kill | None,
                log: Callable[[str], None]) -> int:
    """Wait for the rounds (a progress line each; `kill` carried out on the way); returns the number of the
    last round that counts. Without a leader kill: `rounds` ended rounds, then the standbys are stopped and
    the leader exits by itself. After a leader kill: a successor leads and `rounds` rounds committed in all,
    then every replica is stopped."""
    seen: dict[int, str] = {}
    store_read = [0.0]
    leader_killed = kill is not None and kill.plan.target == "leader"

    def last_counted() -> int | None:
        if not leader_killed:
            return sorted(seen)[cfg.rounds - 1] if len(seen) >= cfg.rounds else None
        committed = sorted(n for n, state in seen.items() if state == "committed")
        ready = kill is not None and kill.done and len(committed) >= cfg.rounds
        return committed[cfg.rounds - 1] if ready else None

    def ended() -> int | None:
        for c in clients:
            if not c.alive():
                raise ProcessFailed(f"{c.name} exited with code {c.returncode}; log tail:\n{c.tail()}")
        # a replica that exited may have ended its last round since the store was last read: read it now
        exited = [c for c in tier if not c.alive() and not (kill is not None and kill.killed(c))]
        if exited or time.monotonic() - store_read[0] >= 0.5:
            store_read[0] = time.monotonic()
            for r in read_rounds(url):
                if r.state.is_terminal and r.number not in seen:
                    seen[r.number] = r.state.value
                    counted = len(r.survivors.get("masked_input", []))
                    log(f"  round {r.number} {r.state.value} in {round_seconds(r):.1f} s "
                        f"({counted} of {r.cohort_size} devices counted)")
        last = last_counted()
        if last is not None:
            return last
        for c in exited:  # read after the store: the leader exits (code 0) right after its last round
            raise ProcessFailed(f"{c.name} exited with code {c.returncode} after {len(seen)} round(s); "
                                f"log tail:\n{c.tail()}")
        return None

    with contextlib.nullcontext() if kill is None else kill.watch(log):
        last: int = wait_until(ended, cfg.timeout, what=f"{cfg.rounds} rounds", step=0.05)
    if leader_killed or cfg.replica_mode == "active":  # active replicas serve until stopped
        for replica in tier:
            replica.stop()
        return last
    leader = tier[0]
    for standby in tier[1:]:
        standby.stop()
    code = leader.wait(120)
    if code != 0:
        raise ProcessFailed(f"the leader exited with {code}:\n{leader.tail()}")
    return last


_ELECTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*event=leader_elected", re.MULTILINE)


def _leaders(tier: list[Child], until: float) -> list[str]:
    """The replicas that took the lease before `until` (epoch seconds: the last counted round's end), in the
    order they did. A standby that takes the lease when the leader leaves after its last round is not one."""
    elected: list[tuple[float, str]] = []
    for c in tier:  # the log's stamps are the replica's local time, as this process reads its clock
        for m in _ELECTED.finditer(c.log()):
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            if at <= until:
                elected.append((at, c.name))
    return [name for _, name in sorted(elected)]


def _tier_figures(cfg: ScaleBenchConfig, records: list[Any], tier: list[Child], cpu: CpuSampler,
                  client_cpu: CpuSampler, state_dirs: list[Path]) -> dict[str, Any]:
    committed = [r for r in records if r.state.value == "committed"]
    exact = bool(committed) and all(exact_aggregate(r, state_dirs) for r in committed)
    device_rounds = sum(r.cohort_size for r in records)
    window = (min(r.started_at.timestamp() for r in records), max(r.ended_at.timestamp() for r in records))
    cpu_s = cpu.seconds_between(*window) if records else math.nan
    client_cpu_s = client_cpu.seconds_between(*window) if records else math.nan
    first = records[0].metrics if records else None
    return {
        "ok": len(committed) == cfg.rounds and exact,
        "exact": exact,
        "replicas": len(tier),
        **committed_times(records),
        "groups": max((int(r.metrics.get("groups", 1)) for r in records), default=None),
        "replica_groups": _replica_groups(records),
        "secagg": None if first is None else {k: int(first[k]) for k in ("cohort", "threshold", "neighbours")
                                              if k in first},
        "devices_left_out": max((_left_out(cfg, r) for r in records), default=None),
        "replica_cpu_ms_per_device_round": round(1000.0 * cpu_s / device_rounds, 3) if device_rounds else None,
        "replica_cpu_s": round(cpu_s, 2),
        "client_cpu_ms_per_device_round": round(1000.0 * client_cpu_s / device_rounds, 3) if device_rounds else None,
        "replica_peak_rss_mb": {c.name: round(c.peak_rss_mb, 1) for c in tier},
        "rounds_committed": len(committed),
        "rounds_aborted": sum(r.state.value == "aborted" for r in records),
        "leader": _leaders(tier, window[1]) if records else [],
        "detail": [{"round": r.number, "state": r.state.value, "abort_reason": r.abort_reason,
                    "seconds": round(round_seconds(r), 3), "cohort": r.cohort_size,
                    "counted": len(r.survivors.get("masked_input", [])),
                    "dropouts": {k: len(v) for k, v in r.dropouts.items()},
                    "timings": {k: round(v, 3) for k, v in r.timings.items()}} for r in records],
    }


def _replica_groups(records: list[Any]) -> dict[str, int]:
    """replica -> the most groups it ran in a round (the active mode's records; empty in the standby mode)."""
    prefix = "replica_groups."
    out: dict[str, int] = {}
    for r in records:
        for key, value in r.metrics.items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                out[name] = max(out.get(name, 0), int(value))
    return dict(sorted(out.items()))


def _addresses(cfg: ScaleBenchConfig, ports: list[int], i: int) -> list[int]:
    """Client i's replica ports: every replica, from replica i mod R in the active mode (streams spread)."""
    if cfg.replica_mode != "active":
        return ports
    k = i % len(ports)
    return ports[k:] + ports[:k]


def _left_out(cfg: ScaleBenchConfig, record: Any) -> int:
    """The hosted devices round `record` did not select: the leader's count in the active mode (replicas under
    G left out, D109, plus the fleet the cohort did not reach), else the fleet minus the cohort."""
    fleet_gap = cfg.fleet.devices - record.cohort_size
    if cfg.replica_mode == "active" and "devices_left_out" in record.metrics:
        return max(int(record.metrics["devices_left_out"]), fleet_gap)
    return fleet_gap


def _tier(cfg: ScaleBenchConfig, server: PgServer, root: Path, replicas: int,
          log: Callable[[str], None]) -> dict[str, Any]:
    """One tier of `replicas` replicas on a fresh database: its rounds and figures."""
    fleet = cfg.fleet
    work = root / f"replicas-{replicas}"
    work.mkdir()
    csv = write_user_csv(work / "users.csv", fleet.devices, seed=cfg.seed)
    state_dirs = fleet.state_dirs(work)
    client_flags = {
        "dataset": str(csv), "seed": cfg.seed, "debug_record_inputs": True, "threads": 1, "log_level": "warning",
        "drop_rate": cfg.dropout if cfg.dropout > 0 else None, "drop_stage": DROPOUT_STAGE if cfg.dropout > 0 else None,
        "no_dp_floor": True,  # the bench's rounds run without DP (D85)
    }
    log(f"[{replicas} replica(s)] {fleet.devices} devices in {fleet.client_processes} client processes, "
        f"L = {fleet.dim}, {cfg.rounds} secure round(s)")
    t0 = time.monotonic()

    def say(message: str) -> None:  # progress, stamped with the tier's elapsed time
        log(f"{time.monotonic() - t0:7.1f} s {message}")

    with database_on(server, f"{replicas}r") as url, ProcessGroup(work, env={"OMP_NUM_THREADS": "1"}) as group:
        tier, ports = _start_tier(cfg, group, url, replicas, say)
        group.sample_rss_of(tier)
        with CpuSampler(tier) as cpu:
            clients = [start_client(group, f"client-{i}", _addresses(cfg, ports, i), users, state, client_flags)
                       for i, (users, state) in enumerate(zip(fleet.user_ranges(), state_dirs, strict=True))]
            say(f"  {len(clients)} client process(es) started, each given all {replicas} address(es)")
            kill = Kill(cfg.kill, tier, cfg.lease_s) if cfg.kill is not None and replicas > 1 else None
            with CpuSampler(clients) as client_cpu:
                last = _run_rounds(cfg, url, tier, clients, kill, say)
        records = [r for r in read_rounds(url) if r.state.is_terminal and r.number <= last]
        figures = _tier_figures(cfg, records, tier, cpu, client_cpu, state_dirs)
        if kill is not None:
            committed = [r for r in records if r.state.value == "committed"]
            history = version_history(url, committed)
            figures["kill"] = {**kill.figures(), "version_history_ok": history}
            figures["ok"] = bool(figures["ok"] and history and figures["kill"].get("takeover_ok", True))
        say("  aggregates checked; stopping the processes")
    log(f"[{replicas} replica(s)] {len(records)} round(s) in {time.monotonic() - t0:.1f} s (processes included); "
        f"median round {figures['round_s_median']} s, exact: {figures['exact']}")
    return figures


def run_scale_bench(cfg: ScaleBenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    with bench_folder("fedmask-bench-scale-", cfg.keep, ignore=("*.npy", "*.fms")) as root, \
            postgres_server(cfg.replicas, cfg.server, log) as server:
        baseline = _tier(cfg, server, root, 1, log) if cfg.baseline and cfg.replicas > 1 else None
        main = _tier(cfg, server, root, cfg.replicas, log)
    ratio = None
    if baseline and baseline["round_s_median"] and main["round_s_median"]:
        ratio = round(main["round_s_median"] / baseline["round_s_median"], 3)
    return {
        "ok": bool(main["ok"] and (baseline is None or baseline["ok"])),
        **{k: v for k, v in main.items() if k not in ("ok", "detail")},
        **cfg.fleet.figures(),
        "group_size": cfg.group_size,
        "dropout": cfg.dropout,
        "dropout_stage": DROPOUT_STAGE,
        "rounds": cfg.rounds,
        "replica_mode": cfg.replica_mode,
        "routing": ROUTING_ACTIVE if cfg.replica_mode == "active" else ROUTING,
        "streams": STREAMS[cfg.replica_mode],
        "lease_s": cfg.lease_s,
        "deadline_bounds_s": cfg.deadlines.flags(),
        "round_s_median_over_baseline": ratio,
        "baseline": baseline,
        "detail": main["detail"],
    }


__all__ = ["ScaleBenchConfig", "cohort_for", "database_on", "fairness_problem", "postgres_server", "run_scale_bench"]
