"""Federation benchmarks over real processes on 127.0.0.1.

`run_round_bench(RoundBenchConfig(...))`: one coordinator (SQLite in a temp
folder, the `synthetic` model of length L) and P edge-client processes
hosting N devices in synthetic-update mode (no local training: device d's
update in round r is `uniform(-clip, clip, L)` seeded by (seed, r, d)). R
secure rounds run; every committed aggregate is checked bit for bit: the
coordinator records a checksum of the encoded sum (`--debug-record-sums`),
the clients write each device's encoded input (`--debug-record-inputs`),
and the checksum of the sum of exactly the counted devices' inputs must be
equal. Then the same R rounds run with fresh processes in the coordinator's
INSECURE plaintext mode (`--debug-insecure-plaintext`: devices upload their
encoded update unmasked, no secagg stages; coordinator/plaintext.py), with
the same deadlines and fault injection, checked the same way.

Round time = the round record's ended_at - started_at: from the coordinator
opening the round (cohort selected, RoundTasks about to go out) to the
commit record. Dropped devices are silent (the fault injection's drop is a
device that stops answering, like a phone that lost its network), so a
stage with a dropout lasts its full deadline: the deadlines used are part of
the result.

With `dp_mechanism` (discrete-gaussian or gaussian-float) the rounds run
with distributed DP noise of multiplier `dp_noise` and clip `dp_clip`, the
devices' own DP floor on; each round then reports the privacy ledger's
epsilon for that round alone (no amplification by sampling; with dropouts
the counted devices' shares only, D19) and its noise multiplier, and the
bytes of one device's MaskedInput. Under the discrete Gaussian no metric
totals are asked for (D36), so none are checked.

`run_connections_bench(...)`: N idle devices in P client processes connect
to one coordinator that never starts a round (its cohort minimum is N + 1);
reports whether all N were admitted and the coordinator's RSS.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedmask.bench.loopback_federation import (
    FleetShape,
    StageDeadlines,
    bench_folder,
    committed_times,
    exact_aggregate,
    full_cohort,
    read_rounds,
    recorded_input,
    round_seconds,
    run_to_exit,
    secagg_graph,
    start_client,
    start_coordinator,
)
from fedmask.bench.processes import LOOPBACK, ProcessFailed, ProcessGroup, free_port, split_users, wait_until, write_user_csv

from dpmech.removable_noise import removed_components
from fedmask.bench.noise_removal import epsilons, message_bytes, removal_seconds

PLAINTEXT_TRAINING_S = 0.05


@dataclass(frozen=True)
class RoundBenchConfig:
    fleet: FleetShape = FleetShape(neighbors="all")
    dropout: float = 0.1
    dropout_stage: str = "masked-input"
    rounds: int = 3
    seed: int = 0
    threshold: str = "two_thirds"
    #: Stage deadlines (s): a silent (dropped) device costs its stage's
    #: deadline. The coordinator's production policy (adaptive, D21) learns
    #: each from the honest devices' completion times; these are its bounds
    #: for loopback: the ceilings (and the first round's deadlines) and the floor.
    deadlines: StageDeadlines = StageDeadlines()
    plaintext: bool = True
    #: none (no DP, the default), discrete-gaussian or gaussian-float: distributed noise (D88)
    dp_mechanism: str = "none"
    dp_noise: float = 1.0
    dp_clip: float = 1.0
    #: account (D19) or remove (Dordis's way, D110): what dropped devices' noise does (discrete Gaussian only)
    dp_dropouts: str = "account"
    timeout: float = 600.0
    keep: Path | None = None
    profile: Path | None = None  # cProfile every process into PROFILE/<mode>/<name>.prof


def _phase(cfg: RoundBenchConfig, root: Path, *, plaintext: bool, log: Any) -> dict[str, Any]:
    """One coordinator + P clients; R rounds; returns the phase's figures."""
    name = "plaintext" if plaintext else "secure"
    fleet = cfg.fleet
    work = root / name
    work.mkdir()
    csv = write_user_csv(work / "users.csv", fleet.devices, seed=cfg.seed)
    db = work / "coordinator.db"
    port = free_port()
    # plaintext: one stage of training + masked-input; synthetic updates need no
    # training, so a silent device costs about the same masked-input deadline
    deadlines = dataclasses.replace(cfg.deadlines, training=PLAINTEXT_TRAINING_S) if plaintext else cfg.deadlines
    coord_flags = {
        "database_url": f"sqlite:///{db}",
        "listen": f"{LOOPBACK}:{port}",
        "model": "synthetic",
        "model_params": {"vector_length": fleet.dim},
        **full_cohort(fleet.devices, cfg.seed, cfg.rounds),
        "selection_deadline": 120,
        **deadlines.flags(),
        "secagg_graph": secagg_graph(fleet.neighbors),
        "secagg_threshold": cfg.threshold,
        **_dp_flags(cfg, plaintext),
        "debug_record_sums": True,
        "debug_insecure_plaintext": plaintext,
        "log_level": "INFO",
    }
    state_dirs = fleet.state_dirs(work)
    client_flags = {
        "dataset": str(csv),
        "seed": cfg.seed,
        "drop_rate": cfg.dropout if cfg.dropout > 0 else None,
        "drop_stage": cfg.dropout_stage if cfg.dropout > 0 else None,
        "debug_record_inputs": True,
        "debug_allow_insecure_plaintext": plaintext,
        # without DP the devices' DP floor is off (D85); with it, their default floor holds
        "no_dp_floor": cfg.dp_mechanism == "none",
        "threads": 1,
        "log_level": "warning",
    }
    t_start = time.monotonic()
    profile_dir = None
    if cfg.profile is not None:
        profile_dir = cfg.profile / name
        profile_dir.mkdir(parents=True, exist_ok=True)
    with ProcessGroup(work, env={"OMP_NUM_THREADS": "1"}, profile_dir=profile_dir) as group:
        coord = start_coordinator(group, port, coord_flags)
        group.sample_rss_of([coord])
        clients = [start_client(group, f"client-{i}", port, users, state_dirs[i], client_flags)
                   for i, users in enumerate(fleet.user_ranges())]
        log(f"[{name}] coordinator pid {coord.pid} on port {port}, {len(clients)} client process(es) started")
        run_to_exit(coord, clients, cfg.timeout, what=f"{cfg.rounds} {name} rounds")
        peak_rss = coord.peak_rss_mb
    records = [r for r in read_rounds(db) if r.state.is_terminal]
    ledger = _privacy_ledger(db)
    log_text = (work / "coordinator.log").read_text(errors="replace")
    applied = _applied_deadlines(log_text)
    removals = removal_seconds(log_text)
    per_round: list[dict[str, Any]] = []
    ok = len(records) == cfg.rounds
    as_injected = True
    for r in records:
        committed = r.state.value == "committed"
        exact = committed and exact_aggregate(r, state_dirs)
        # did exactly the fault-injected devices drop (no honest device missed a deadline)?
        injected = _injected_drops(cfg, r.number, plaintext)
        dropped = {d for ids in r.dropouts.values() for d in ids}
        as_injected = as_injected and dropped == injected
        counted = len(r.survivors.get("masked_input", []))
        # secure rounds: the metric totals come out of the secure sum (D35), one "devices" per counted device;
        # plaintext rounds carry no metrics (each input is in the clear)
        metric_devices = r.metrics.get("count.devices")
        metrics_ok = plaintext or not committed or metric_devices == counted or (
            cfg.dp_mechanism == "discrete-gaussian" and metric_devices is None)  # no totals under it (D36)
        entry = ledger.get(r.number)
        per_round.append({
            "round": r.number, "state": r.state.value, "abort_reason": r.abort_reason,
            "seconds": round(round_seconds(r), 3), "counted": counted,
            "dropouts": {k: len(v) for k, v in r.dropouts.items()},
            "exact": exact, "dropouts_as_injected": dropped == injected,
            "metric_devices": metric_devices, "val_hr@10": r.metrics.get("val_hr@10"),
            "epsilon_round": entry.epsilon if entry else None,
            "noise_multiplier": entry.noise_multiplier if entry else None,
            "masked_input_bytes": _masked_input_bytes(state_dirs, r.number, r.survivors.get("masked_input", [])),
            "timings": {k: round(v, 3) for k, v in r.timings.items()},
            "deadlines": applied.get(r.number, {}),
            **({} if plaintext or not committed else _noise_figures(
                cfg, counted, removals.get(r.number), entry.delta if entry else None)),
        })
        ok = ok and committed and exact and metrics_ok
    log(f"[{name}] {len(records)} round(s) in {time.monotonic() - t_start:.1f}s (processes included)")
    return {
        "ok": ok,
        **committed_times(records),
        "coordinator_rss_mb": round(peak_rss, 1),
        "dropouts_as_injected": as_injected,
        "rounds": per_round,
    }


def _dp_flags(cfg: RoundBenchConfig, plaintext: bool) -> dict[str, Any]:
    """The coordinator's DP flags: off, or distributed noise with the mechanism
    asked for (the plaintext baseline has no secure sum to remove noise from:
    its dropouts are accounted, D19)."""
    if cfg.dp_mechanism == "none":
        return {"dp_mode": "none"}
    return {"dp_mode": "distributed", "dp_mechanism": cfg.dp_mechanism, "dp_noise": cfg.dp_noise,
            "dp_clip": cfg.dp_clip, "dp_dropouts": "account" if plaintext else cfg.dp_dropouts}


def _round_mechanism(cfg: RoundBenchConfig) -> tuple[int, Any] | None:
    """(t, the discrete Gaussian) the bench's coordinator plans for its
    cohort, rebuilt from the same settings; None without the mechanism."""
    if cfg.dp_mechanism != "discrete-gaussian":
        return None
    from coordinator.round_policy import round_plan
    from coordinator.settings import CoordinatorSettings

    n = cfg.fleet.devices
    settings = CoordinatorSettings.load(overrides={
        "dp.mode": "distributed", "dp.mechanism": cfg.dp_mechanism, "dp.noise_multiplier": cfg.dp_noise,
        "dp.clip": cfg.dp_clip, "dp.dropouts": cfg.dp_dropouts, "secagg.graph": secagg_graph(cfg.fleet.neighbors),
        "secagg.threshold": cfg.threshold, "cohort.size": n, "cohort.minimum": n})
    config, _, mechanism = round_plan(settings, n, cfg.fleet.dim, b"bench", (), plaintext=False)
    return config.threshold, mechanism


def _noise_figures(cfg: RoundBenchConfig, counted: int, removal: tuple[float, int] | None,
                   delta: float | None) -> dict[str, Any]:
    """A secure DP round's cost figures of the way its dropouts' noise is
    handled (`fedmask.bench.noise_removal`)."""
    planned = _round_mechanism(cfg)
    if planned is None or delta is None or counted == 0:
        return {}
    t, mechanism = planned
    n = cfg.fleet.devices
    remove = cfg.dp_dropouts == "remove"
    m = n - t if remove else 0
    removed = len(removed_components(n, t, counted)) if remove else 0
    sizes = message_bytes(n, m, counted, removed)
    eps = epsilons(mechanism, n, t, counted, delta, remove)
    return {"share_keys_bytes": sizes.share_keys, "unmasking_response_bytes": sizes.unmasking_response,
            "epsilon_round_unequal_shares": eps.get("unequal_shares"),
            "surplus_removal_s": removal[0] if removal else None,
            "components_regenerated": removal[1] if removal else None}


def _privacy_ledger(db: Path) -> dict[int, Any]:
    """Round number -> its privacy ledger entry, from the coordinator's SQLite store."""
    from coordinator.store import open_store

    store = open_store(f"sqlite:///{db}", migrate=False)
    try:
        return {e.round_number: e for e in store.privacy_ledger()}
    finally:
        store.close()


def _masked_input_bytes(state_dirs: list[Path], round_number: int, counted: list[int]) -> int | None:
    """The bytes of one counted device's MaskedInput proto (its recorded
    input's words, as the wire carries them, and a header of the round's
    shape: a 48-byte session id and the ids), or None without a record."""
    from fedmask_proto.v1 import secagg_pb2

    for device in counted:
        vector = recorded_input(state_dirs, round_number, device)
        if vector is not None:
            break
    else:
        return None
    return secagg_pb2.MaskedInput(session_id=bytes(48), round_number=round_number, device_id=device,
                                  masked_vector=vector.astype("<u4").tobytes(), length=vector.shape[0],
                                  modulus_bits=32).ByteSize()


def _applied_deadlines(log_text: str) -> dict[int, dict[str, float]]:
    """round number -> {phase: seconds} the coordinator gave each stage, from
    its `round_started` log lines (deadlines=advertise_keys=1.20,...)."""
    out: dict[int, dict[str, float]] = {}
    for m in re.finditer(r"event=round_started round=(\d+) .*?deadlines='?([a-z_=0-9.,]+)", log_text):
        pairs = (kv.split("=") for kv in m.group(2).split(",") if "=" in kv)
        out[int(m.group(1))] = {k: float(v) for k, v in pairs}
    return out


def _injected_drops(cfg: RoundBenchConfig, round_number: int, plaintext: bool) -> set[int]:
    """The devices the clients' fault injection silences in this round (device
    ids are 1..N on the bench's fresh database; the draw is a pure function of
    (seed, round, device id), edge_client.faults.FaultPlan)."""
    from edge_client.faults import FaultPlan

    if cfg.dropout <= 0 or (plaintext and cfg.dropout_stage == "unmasking"):
        return set()
    plan = FaultPlan(drop_rate=cfg.dropout, drop_stage=cfg.dropout_stage, seed=cfg.seed)
    return {d for d in range(1, cfg.fleet.devices + 1) if plan.drop_stage_of(d, round_number) is not None}


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = sorted(v for r in rounds if (v := r.get(key)) is not None)
    return None if not values else float(statistics.median(values))


def run_round_bench(cfg: RoundBenchConfig, log: Any = print) -> dict[str, Any]:
    with bench_folder("fedmask-bench-round-", cfg.keep, ignore=("*.npy", "*.fms")) as root:
        secure = _phase(cfg, root, plaintext=False, log=log)
        plain = _phase(cfg, root, plaintext=True, log=log) if cfg.plaintext else None
        t = None
        if secure["rounds"]:
            log_text = (root / "secure" / "coordinator.log").read_text(errors="replace")
            m = re.search(r"config='n=\d+ L=\d+ graph=(.+?) t=(\d+)'", log_text)
            t = {"graph": m.group(1), "threshold": int(m.group(2))} if m else None
        return {
            "ok": bool(secure["ok"] and (plain is None or plain["ok"])),
            **cfg.fleet.figures(),
            "secagg": t,
            "dropout": cfg.dropout,
            "dropout_stage": cfg.dropout_stage,
            "dp": None if cfg.dp_mechanism == "none" else {
                "mode": "distributed", "mechanism": cfg.dp_mechanism, "noise_multiplier": cfg.dp_noise,
                "clip": cfg.dp_clip, "dropouts": cfg.dp_dropouts,
                "epsilon_round_median": _median_of(secure["rounds"], "epsilon_round"),
                "epsilon_meaning": "each round alone, at the ledger's delta, without amplification by sampling; "
                                   "priced with the counted devices' noise shares (D19; under removable noise, "
                                   "D110, the proven bound of its best single component, the same figure)",
                "epsilon_round_unequal_shares_median": _median_of(secure["rounds"], "epsilon_round_unequal_shares"),
                "unequal_shares_meaning": "removable noise only: every kept component priced by the bound for "
                                          "shares of different variances, an unproven extension (never the ledger's)",
                "surplus_removal_s_median": _median_of(secure["rounds"], "surplus_removal_s"),
                "share_keys_bytes": _median_of(secure["rounds"], "share_keys_bytes"),
                "unmasking_response_bytes_median": _median_of(secure["rounds"], "unmasking_response_bytes")},
            "masked_input_bytes": _median_of(secure["rounds"], "masked_input_bytes"),
            "rounds": cfg.rounds,
            "deadline_policy": "adaptive",
            "deadline_bounds_s": {
                "floor": cfg.deadlines.floor,
                "training": cfg.deadlines.training, "advertise_keys": cfg.deadlines.advertise_keys,
                "share_keys": cfg.deadlines.share_keys, "share_check": cfg.deadlines.share_check,
                "masked_input": cfg.deadlines.masked_input,
                "unmasking": cfg.deadlines.unmasking,
                "plaintext_upload": round(PLAINTEXT_TRAINING_S + cfg.deadlines.masked_input, 3),
            },
            "secure_round_s_median": secure["round_s_median"],
            "plaintext_round_s_median": plain["round_s_median"] if plain else None,
            "secure_round_s": secure["round_s"],
            "plaintext_round_s": plain["round_s"] if plain else None,
            "secure_stage_s_median": secure["stage_s_median"],
            "dropouts_as_injected": secure["dropouts_as_injected"] and (plain is None or plain["dropouts_as_injected"]),
            "coordinator_rss_mb": secure["coordinator_rss_mb"],
            "plaintext_coordinator_rss_mb": plain["coordinator_rss_mb"] if plain else None,
            "secure_detail": secure["rounds"],
            "plaintext_detail": plain["rounds"] if plain else None,
        }


@dataclass(frozen=True)
class ConnectionsBenchConfig:
    devices: int = 1000
    client_processes: int = 4
    hold: float = 5.0
    heartbeat_interval: float = 2.0
    timeout: float = 300.0
    seed: int = 0


def _admitted(log_text: str) -> int:
    """Devices currently admitted: sum of `accepted` over sessions opened
    and not closed (from the coordinator's event log)."""
    open_sessions: dict[str, int] = {}
    for line in log_text.splitlines():
        m = re.search(r"event=session_opened session=(\d+) .*accepted=(\d+)", line)
        if m:
            open_sessions[m.group(1)] = int(m.group(2))
            continue
        m = re.search(r"event=session_(?:closed|displaced) session=(\d+)", line)
        if m:
            open_sessions.pop(m.group(1), None)
    return sum(open_sessions.values())


def run_connections_bench(cfg: ConnectionsBenchConfig, log: Any = print) -> dict[str, Any]:
    from fedmask.bench.processes import rss_mb

    with bench_folder("fedmask-bench-conn-", None) as root:
        csv = write_user_csv(root / "users.csv", cfg.devices, seed=cfg.seed)
        port = free_port()
        with ProcessGroup(root, env={"OMP_NUM_THREADS": "1"}) as group:
            coord = start_coordinator(group, port, {
                "database_url": f"sqlite:///{root / 'coordinator.db'}",
                "listen": f"{LOOPBACK}:{port}",
                "model": "synthetic",
                "model_params": {"vector_length": 16},
                # never starts a round: the devices stay idle
                "cohort_size": cfg.devices + 1,
                "cohort_minimum": cfg.devices + 1,
                "heartbeat_interval": cfg.heartbeat_interval,
                "dp_mode": "none",
                "log_level": "INFO",
            })
            group.sample_rss_of([coord])
            rss_idle = rss_mb(coord.pid) or 0.0
            t0 = time.monotonic()
            for i, users in enumerate(split_users(1, cfg.devices, cfg.client_processes)):
                start_client(group, f"client-{i}", port, users, root / f"client-{i}",
                             {"dataset": str(csv), "threads": 1, "log_level": "warning", "no_dp_floor": True})
            watch = list(group.children)
            log_path = coord.log_path

            def all_in() -> bool:
                return _admitted(log_path.read_text(errors="replace")) >= cfg.devices

            try:
                wait_until(all_in, cfg.timeout, what=f"{cfg.devices} devices to check in", watch=watch, step=0.25)
                connect_s = time.monotonic() - t0
                ok = True
            except ProcessFailed as exc:
                log(str(exc))
                connect_s, ok = time.monotonic() - t0, False
            # hold them: several heartbeat intervals, all must stay connected
            time.sleep(cfg.hold if ok else 0)
            admitted = _admitted(log_path.read_text(errors="replace"))
            ok = ok and admitted == cfg.devices and all(c.alive() for c in watch)
            rss_now = rss_mb(coord.pid) or 0.0
            coord.sample_rss()
            peak = coord.peak_rss_mb
        return {
            "ok": ok,
            "devices": cfg.devices,
            "admitted": admitted,
            "client_processes": cfg.client_processes,
            "connect_s": round(connect_s, 2),
            "held_s": cfg.hold,
            "coordinator_rss_mb": round(rss_now, 1),
            "coordinator_rss_peak_mb": round(peak, 1),
            "coordinator_rss_before_clients_mb": round(rss_idle, 1),
        }


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, sort_keys=False, default=str)


__all__ = ["ConnectionsBenchConfig", "RoundBenchConfig", "dumps", "run_connections_bench", "run_round_bench"]
