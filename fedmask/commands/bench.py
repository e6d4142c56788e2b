"""`fedmask bench round|hybrid|connections|hostile|admin|scale`: federation
benchmarks over real processes on 127.0.0.1 (see fedmask/bench/federation.py,
hybrid.py, hostile.py, admin_load.py, scale.py)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from secagg.stages import Stage

bench_app = typer.Typer(
    help="Federation benchmarks: a real coordinator and edge-client processes on 127.0.0.1. "
    "Each prints progress on stderr and, as its LAST stdout line, one JSON object.",
    no_args_is_help=True,
)

# passive mode (no signatures): every stage but the consistency check
_STAGES = tuple(s.cli_name for s in Stage if s is not Stage.CONSISTENCY_CHECK)

# options that mean the same in several benches
CohortDevicesOption = Annotated[int, typer.Option(min=3, help="Devices (the whole cohort of every round).")]
ClientProcessesOption = Annotated[int, typer.Option(min=1, help="Edge-client processes hosting the devices.")]
NeighborsOption = Annotated[
    str, typer.Option(help="SecAgg graph: 'all' (Bonawitz, complete), 'auto' (SecAgg+ sized by secagg) or an even K.")
]
TimeoutPerModeOption = Annotated[float, typer.Option(help="Give up after this many seconds per mode.")]
KeepWorkFolderOption = Annotated[
    Path | None,
    typer.Option(help="Copy the work folder (logs, databases; never the vectors or keys) here at the end.",
                 show_default=False),
]


@bench_app.command("round")
def round_(
    devices: CohortDevicesOption = 100,
    client_processes: ClientProcessesOption = 2,
    dim: Annotated[int, typer.Option(min=1, help="Update length L (synthetic model; 53,824 = ML-100K item table x 32).")] = 53_824,
    neighbors: NeighborsOption = "all",
    dropout: Annotated[float, typer.Option(min=0.0, max=0.5, help="Probability that a device drops (goes silent) in a round.")] = 0.1,
    dropout_stage: Annotated[str, typer.Option(help="Stage at which dropped devices go silent: " + " | ".join(_STAGES) + ".")] = "masked-input",
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per mode (secure, then plaintext).")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic updates, of the dropout draws and of cohort selection.")] = 0,
    threshold: Annotated[str, typer.Option(help="Shamir threshold policy: majority, two_thirds or a fraction (sparse 'auto' graphs use secagg's t).")] = "two_thirds",
    training_deadline: Annotated[float, typer.Option(help="Seconds; stage 0 lasts at most training + advertise-keys.")] = 1.0,
    advertise_keys_deadline: Annotated[float, typer.Option(help="Ceiling (and first round's deadline) of AdvertiseKeys, seconds.")] = 5.0,
    share_keys_deadline: Annotated[float, typer.Option(help="Ceiling (and first round's deadline) of ShareKeys, seconds.")] = 5.0,
    share_check_deadline: Annotated[float, typer.Option(help="Ceiling (and first round's deadline) of the share check, seconds.")] = 5.0,
    masked_input_deadline: Annotated[float, typer.Option(help="Ceiling (and first round's deadline) of MaskedInput, seconds. Devices dropped at masked-input are silent, so this stage lasts its whole (learnt) deadline whenever one drops.")] = 5.0,
    unmasking_deadline: Annotated[float, typer.Option(help="Ceiling (and first round's deadline) of Unmasking, seconds.")] = 5.0,
    deadline_floor: Annotated[float, typer.Option(help="No learnt deadline goes below this many seconds (the coordinator's adaptive policy; its margin, quantile and slack are the production defaults).")] = 0.25,
    plaintext: Annotated[bool, typer.Option("--plaintext/--no-plaintext", help="Also run the rounds in the coordinator's INSECURE plaintext mode (the baseline).")] = True,
    dp_mechanism: Annotated[str, typer.Option(help="none (default: no DP), discrete-gaussian or gaussian-float: distributed DP noise of --dp-noise over --dp-clip (D88); each round then reports its epsilon from the privacy ledger (no amplification by sampling, the counted devices' shares only) and its noise multiplier.")] = "none",
    dp_noise: Annotated[float, typer.Option(min=0.0, help="With --dp-mechanism: the noise multiplier z.")] = 1.0,
    dp_clip: Annotated[float, typer.Option(min=0.0, help="With --dp-mechanism: the L2 clip of every update (the synthetic updates are uniform on [-1, 1]).")] = 1.0,
    dp_dropouts: Annotated[str, typer.Option(help="With --dp-mechanism discrete-gaussian: account (D19: the shares dropped devices take away are priced) or remove (Dordis's way, D110: devices add the worst tolerated dropout's noise in seeded components, the survivors' surplus is removed at unmasking; needs --neighbors all). Each round then also reports the removal's seconds, one device's ShareKeys and UnmaskingResponse bytes and, for remove, the epsilon by the unproven bound for unequal shares.")] = "account",
    timeout: TimeoutPerModeOption = 600.0,
    keep: KeepWorkFolderOption = None,
    profile: Annotated[Path | None, typer.Option(help="Run every process under cProfile; profiles go to PROFILE/<mode>/<process>.prof.", show_default=False)] = None,
) -> None:
    """Time secure rounds against plaintext rounds over gRPC.

    Starts a coordinator (SQLite in a temp folder, the synthetic model of length --dim) and --client-processes edge clients hosting --devices devices in synthetic-update mode (no local training), all on 127.0.0.1; runs --rounds secure rounds with --dropout of the devices going silent at --dropout-stage, and checks each committed aggregate bit for bit against the sum of the counted devices' encoded inputs. Then runs the same rounds in the coordinator's INSECURE plaintext mode (devices upload unmasked updates; no secagg stages) with fresh processes. A round's time runs from the coordinator opening it to its commit. Dropped devices stay silent, so a stage with a dropout lasts its whole deadline (reported in the JSON).

    Last stdout line: JSON with ok, secure_round_s_median, plaintext_round_s_median, coordinator_rss_mb (peak, secure run), the deadlines, masked_input_bytes, the DP block (with --dp-mechanism) and per-round details.
    """
    from fedmask.bench.federation import RoundBenchConfig, run_round_bench
    from fedmask.bench.loopback_federation import FleetShape, StageDeadlines

    if dropout_stage not in _STAGES:
        raise typer.BadParameter(f"one of {', '.join(_STAGES)}", param_hint="--dropout-stage")
    if dp_mechanism not in ("none", "discrete-gaussian", "gaussian-float"):
        raise typer.BadParameter("none, discrete-gaussian or gaussian-float", param_hint="--dp-mechanism")
    if dp_dropouts not in ("account", "remove"):
        raise typer.BadParameter("account or remove", param_hint="--dp-dropouts")
    if dp_dropouts == "remove" and (dp_mechanism != "discrete-gaussian" or neighbors != "all"):
        raise typer.BadParameter("remove needs --dp-mechanism discrete-gaussian and --neighbors all",
                                 param_hint="--dp-dropouts")
    _check_neighbors(neighbors)
    _run_and_report(lambda: RoundBenchConfig(
        fleet=FleetShape(devices=devices, client_processes=client_processes, dim=dim, neighbors=neighbors),
        dropout=dropout,
        dropout_stage=dropout_stage, rounds=rounds, seed=seed, threshold=threshold,
        deadlines=StageDeadlines(training=training_deadline, advertise_keys=advertise_keys_deadline,
                                 share_keys=share_keys_deadline, share_check=share_check_deadline,
                                 masked_input=masked_input_deadline, unmasking=unmasking_deadline, floor=deadline_floor),
        plaintext=plaintext, timeout=timeout, keep=keep, profile=profile,
        dp_mechanism=dp_mechanism, dp_noise=dp_noise, dp_clip=dp_clip, dp_dropouts=dp_dropouts,
    ), run_round_bench)


@bench_app.command("hybrid")
def hybrid(
    devices: Annotated[int, typer.Option(min=3, help="Devices: users 1..N of --dataset, one each (the whole cohort of every round).")] = 100,
    client_processes: ClientProcessesOption = 2,
    j_bound: Annotated[float, typer.Option(min=0.0, help="Hybrid mode: the privacy-indicator bound J <= B under which a device sends its update in PLAINTEXT (set on the coordinator and on every client). It must leave at least t devices secure (docs/performance.md, 'Hybrid rounds over real processes': at 0.8 the 100-user rounds lose their secure part).")] = 0.5,
    neighbors: NeighborsOption = "all",
    threshold: Annotated[str, typer.Option(help="Shamir threshold policy (majority, two_thirds or a fraction), chosen for the whole cohort; a hybrid round's secure part needs at least t secure devices, and commits the plaintext sum alone only if at least t went plaintext.")] = "two_thirds",
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per mode (all-secure, then hybrid).")] = 5,
    dataset: Annotated[str, typer.Option(help="Dataset name under --data-dir (the clients train FedMMF on it).")] = "ml-100k",
    data_dir: Annotated[Path, typer.Option(help="Folder holding the datasets.", envvar="FEDMASK_DATA_DIR")] = Path("data"),
    seed: Annotated[int, typer.Option(help="Seed of the local splits, the training draws and cohort selection.")] = 0,
    model_params: Annotated[str | None, typer.Option(help="FedMMF hyper-parameters over the defaults, as JSON (n_users / n_items come from the dataset).", show_default=False)] = None,
    timeout: TimeoutPerModeOption = 1200.0,
    keep: KeepWorkFolderOption = None,
) -> None:
    """Time FedMMF hybrid rounds against all-secure rounds over gRPC and mTLS.

    For each mode, fresh processes on 127.0.0.1: a PKI, a coordinator (SQLite in a temp folder, model fedmmf, mTLS) and --client-processes edge clients (one client certificate each) hosting users 1..--devices of --dataset, training FedMMF for real, no injected dropout. --rounds all-secure rounds, then --rounds hybrid rounds (coordinator and clients at --unprotected-plaintext-j-bound --j-bound: devices with J <= --j-bound upload their update in PLAINTEXT, the rest run secure aggregation). Every committed aggregate is checked bit for bit against the counted devices' encoded inputs. A round's time runs from the coordinator opening it to its commit (training included).

    A hybrid round whose secure part aborts (fewer than t secure devices on the complete graph; on a SecAgg+ graph, the pruning of devices with fewer than t secure devices in their neighbourhood, which can cascade) commits the plaintext sum alone when at least t devices went plaintext: it is committed and exact but leaves the secure devices out (all_counted false).

    Last stdout line: JSON with ok (every round committed, exact), all_counted, secure / hybrid (round_s, round_s_median, stage_s_median, plaintext_devices and secure_devices per round, per-round detail) and hybrid_over_secure_median.
    """
    import json

    from fedmask.bench.hybrid import HybridBenchConfig, run_hybrid_bench

    params = None
    if model_params is not None:
        try:
            params = json.loads(model_params)
        except json.JSONDecodeError as e:
            raise typer.BadParameter(f"not JSON: {e}", param_hint="--model-params") from None
        if not isinstance(params, dict):
            raise typer.BadParameter("a JSON object", param_hint="--model-params")
    _run_and_report(lambda: HybridBenchConfig(
        devices=devices, client_processes=client_processes, dataset=dataset,
        data_dir=data_dir.resolve(),  # the client processes run in their own folders
        j_bound=j_bound, neighbors=neighbors, threshold=threshold, rounds=rounds, seed=seed, model_params=params,
        timeout=timeout, keep=keep,
    ), run_hybrid_bench)


@bench_app.command("connections")
def connections(
    devices: Annotated[int, typer.Option(min=1, help="Idle devices to connect.")] = 1000,
    client_processes: ClientProcessesOption = 4,
    hold: Annotated[float, typer.Option(min=0.0, help="Seconds to keep them connected (heartbeating) before measuring.")] = 5.0,
    heartbeat_interval: Annotated[float, typer.Option(help="Coordinator heartbeat interval (s).")] = 2.0,
    timeout: Annotated[float, typer.Option(help="Give up if not all devices checked in after this many seconds.")] = 300.0,
    replicas: Annotated[int, typer.Option(min=0, help="0: one coordinator on SQLite. R >= 1: R active replicas "
                                          "(--replica-mode active, D109) over a throwaway PostgreSQL, the client "
                                          "processes spread over them.")] = 0,
    enrolled: Annotated[int | None, typer.Option(min=1, help="With --replicas: devices enrolled in the store, the "
                                                 "connected ones included (the others are enrolled straight into "
                                                 "the store and never connect). Default: --devices.")] = None,
) -> None:
    """Connect --devices idle devices to one coordinator, or to a tier of active replicas, and measure it.

    Without --replicas the coordinator (SQLite in a temp folder) never starts a round (its cohort minimum is devices + 1); the devices enrol, open their sessions, check in and heartbeat. Last stdout line: JSON with ok (all devices admitted and still connected after --hold seconds) and coordinator_rss_mb.

    With --replicas R the same idle devices are held by R active replicas over a throwaway PostgreSQL whose registry holds --enrolled devices; ok needs every connected device's stream published by some replica and still held after --hold seconds, and the JSON gives each replica's replica_rss_mb (target for 100,000 enrolled, 10,000 connected, 3 replicas: each <= 256 MB). Example: fedmask bench connections --replicas 3 --enrolled 100000 --devices 10000 --client-processes 8 --hold 10
    """
    if replicas:
        from fedmask.bench.idle_tier import IdleTierConfig, run_idle_tier_bench

        _run_and_report(lambda: IdleTierConfig(
            replicas=replicas, devices=devices, enrolled=enrolled if enrolled is not None else devices,
            client_processes=client_processes, hold=hold, heartbeat_interval=heartbeat_interval, timeout=timeout),
            run_idle_tier_bench)
        return
    if enrolled is not None:
        raise typer.BadParameter("needs --replicas (one coordinator on SQLite enrols only the devices that connect)",
                                 param_hint="--enrolled")
    from fedmask.bench.federation import ConnectionsBenchConfig, run_connections_bench

    _run_and_report(lambda: ConnectionsBenchConfig(devices=devices, client_processes=client_processes, hold=hold,
                                                   heartbeat_interval=heartbeat_interval, timeout=timeout),
                    run_connections_bench)


@bench_app.command("hostile")
def hostile(
    seconds: Annotated[float, typer.Option(min=1.0, help="How long the hostile traffic runs against live rounds.")] = 120.0,
    honest_devices: Annotated[int, typer.Option(min=2, help="Honest devices (at least 11: with the hostile devices in a cohort, an accused device's peers must "
                                "still reach the threshold).")] = 12,
    honest_processes: Annotated[int, typer.Option(min=1, help="Edge-client processes hosting the honest devices.")] = 2,
    dim: Annotated[int, typer.Option(min=1, help="Length of the synthetic model's update.")] = 1000,
    rate: Annotated[float, typer.Option(min=0.1, help="Attacks per second of each kind, the admin service's included.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the devices and the attacks.")] = 0,
    keep: KeepWorkFolderOption = None,
    admin: Annotated[bool, typer.Option("--admin/--no-admin", help="Also start `fedmask admin` on the coordinator's admin listener and send it, at --rate per kind: 64 MiB headers (431 expected), 200 MiB bodies to an operator action and 1 KiB bodies to a route that takes none (413), floods past limits.max_concurrent_requests (503), slow heads (408; the bench sets limits.head_timeout_s to 2 s) and one viewer token asking for more event streams than its share (429), while an honest viewer and operator read and open their own streams. --no-admin: the device attacks only.")] = True,
) -> None:
    """Run live secure rounds under hostile traffic and check nothing breaks.

    Two hostile client processes sit in the cohorts (devices that seal garbage shares; devices that send garbage metric coordinates), then a coalition of 3 credentials (three client processes of one device each) that falsely reports 3 honest devices at every share check, while the bench sends random bytes, malformed and oversized messages, out-of-order stage messages, enrolment floods and ids of 2^63 or more to the coordinator.

    Last stdout line: JSON with ok, coordinator_crashes, rounds_committed, rounds_aborted, aggregates_exact, honest_devices_dropped, huge_id_answers and false_reports (target: no crash, every round commits exactly, no honest device dropped, no huge id answered INTERNAL or UNKNOWN, at most N = 2 honest devices quarantined and rounds still committing after that).

    With --admin (the default) the JSON's admin object gives, per admin attack, the answers by status, the admin service's RSS growth and the honest viewer's and operator's read latency (p50/p99); its ok needs every attack answered with its expected status, RSS growth <= 20 MB, every honest read answered (200, or 503 while a flood holds every request slot) and the operator's own event stream accepted while a viewer hogs.
    """
    from fedmask.bench.hostile import HostileBenchConfig, run_hostile_bench

    _run_and_report(lambda: HostileBenchConfig(seconds=seconds, honest_devices=honest_devices,
                                               honest_processes=honest_processes, dim=dim, rate=rate, seed=seed,
                                               keep=keep, admin=admin),
                    run_hostile_bench)


@bench_app.command("admin")
def admin(
    devices: CohortDevicesOption = 100,
    client_processes: ClientProcessesOption = 2,
    dim: Annotated[int, typer.Option(min=1, help="Update length L of the synthetic model.")] = 53_824,
    neighbors: Annotated[str, typer.Option(help="SecAgg graph: 'all' (complete), 'auto' (SecAgg+) or an even K.")] = "auto",
    rate: Annotated[float, typer.Option(min=0.1, help="Requests per second in the loaded window, half top-k "
                                        "(GET /v1/devices/{id}/recommendations?k=10), half GET /v1/rounds/current.")] = 50.0,
    seconds: Annotated[float, typer.Option(min=1.0, help="Length of each window: idle (no request), then loaded.")] = 30.0,
    seed: Annotated[int, typer.Option(help="Seed of the bench dataset, the synthetic updates and the devices asked.")] = 0,
    keep: KeepWorkFolderOption = None,
) -> None:
    """Load `fedmask admin` with an open-loop request stream while secure rounds run.

    Starts a coordinator (the synthetic model, with an item catalogue so the devices answer top-k), --client-processes edge clients hosting --devices devices (no injected dropout) and `fedmask admin`, all on 127.0.0.1. After the first round, --seconds with no request (the idle rounds), then --seconds of --rate requests per second sent on schedule whatever the latency (open loop). Last stdout line: JSON with ok, topk_p50_ms, topk_p99_ms, topk_rps, status_p99_ms, status_rps, errors, secure_round_s_median_loaded, secure_round_s_median_idle and targets (the benchmark's targets, each with whether it was met).
    """
    from fedmask.bench.admin_load import AdminBenchConfig, run_admin_bench
    from fedmask.bench.loopback_federation import FleetShape

    _check_neighbors(neighbors)
    _run_and_report(lambda: AdminBenchConfig(
        fleet=FleetShape(devices=devices, client_processes=client_processes, dim=dim, neighbors=neighbors),
        rate=rate, seconds=seconds, seed=seed, items=min(1682, dim), keep=keep,
    ), run_admin_bench)


@bench_app.command("scale")
def scale(
    replicas: Annotated[int, typer.Option(min=1, help="Coordinator replicas over one PostgreSQL store (one leads, D90).")] = 3,
    devices: Annotated[int, typer.Option(min=3, help="Devices, hosted by the client processes; every round selects (nearly) all of them.")] = 1000,
    client_processes: Annotated[int, typer.Option(min=1, help="Edge-client processes hosting the devices: at least 3 per replica (a client process carries its devices on one stream, which one replica holds), and at most 8, or exactly 3 per replica from 3 replicas on.")] = 9,
    dim: Annotated[int, typer.Option(min=1, help="Update length L (synthetic model; 53,824 = ML-100K item table x 32).")] = 53_824,
    group_size: Annotated[int, typer.Option(min=2, help="Secure-aggregation group size G (D87, D99): a round of 2G devices or more runs in groups of at least G, each its own SecAgg+ instance, a client process's devices in one group; the JSON says how many groups the rounds ran in.")] = 500,
    dropout: Annotated[float, typer.Option(min=0.0, max=0.5, help="Probability that a device goes silent at the masked-input stage of a round.")] = 0.05,
    rounds: Annotated[int, typer.Option(min=1, help="Secure rounds per tier.")] = 3,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="First run the same rounds with --replicas 1 (the baseline), in this invocation.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic updates, of the dropout draws and of cohort selection.")] = 0,
    lease_seconds: Annotated[float, typer.Option(min=1.0, max=600.0, help="The replicas' leader lease (D90).")] = 10.0,
    kill: Annotated[str | None, typer.Option(help="leader or replica: kill -9 the leader, or a standby, while round --kill-round is in --at-stage (the --replicas tier only). After a leader kill the bench waits for a standby to take the lease (due within the lease plus 5 s) and for --rounds rounds committed in all; the JSON's kill object says who died, who took over and how fast, and whether the version history has no gap and no duplicate.", show_default=False)] = None,
    at_stage: Annotated[str, typer.Option(help="With --kill: the stage of the round: " + " | ".join(_STAGES) + ".")] = "masked-input",
    kill_round: Annotated[int, typer.Option(min=1, help="With --kill: the round to strike in (2: one version is committed before).")] = 2,
    timeout: Annotated[float, typer.Option(help="Give up on a tier after this many seconds, processes included.")] = 1800.0,
    replica_mode: Annotated[str, typer.Option(help="standby: the leader alone holds streams and runs rounds (D90). active: every replica holds the streams of the clients that start on it (client i at replica i mod R) and runs their groups; the leader plans and commits (D109). --kill needs standby.")] = "standby",
    keep: KeepWorkFolderOption = None,
) -> None:
    """Time secure rounds served by coordinator replicas over PostgreSQL.

    Starts a throwaway PostgreSQL server (initdb in a temp folder; needs the server binaries, as the tests do) and, on a fresh database each: --replicas replicas of `fedmask coordinator` (the synthetic model of length --dim, SecAgg+ at the coordinator's auto degree and threshold, the default over-selection, no DP), then --client-processes edge clients hosting --devices synthetic-update devices, each client given every replica's address (--coordinator A,B,C; no load balancer). The first replica leads; the others wait as standbys: only the leader holds device streams and runs rounds (D90). With --replica-mode active every replica serves the clients that start on it and runs their groups (D109). --dropout of the devices go silent at masked-input in each round. Every committed aggregate is checked bit for bit. With --baseline (the default) the same rounds first run on one replica.

    Last stdout line: JSON with ok, exact, round_s_median, stage_s_median, groups (the most a round ran in, at --group-size), replica_groups (with --replica-mode active: the most groups each replica ran in a round), secagg (the first round's cohort, threshold and neighbours), devices_left_out, replica_cpu_ms_per_device_round (the replicas' CPU from /proc over the rounds, per device-round), client_cpu_ms_per_device_round (the same for the client processes), replica_peak_rss_mb (VmHWM of each), rounds_committed, rounds_aborted, leader, routing, the baseline's figures and round_s_median_over_baseline.
    """
    from fedmask.bench.loopback_federation import FleetShape
    from fedmask.bench.scale import ScaleBenchConfig, fairness_problem, run_scale_bench
    from fedmask.bench.scale_faults import KillPlan

    problem = fairness_problem(replicas, client_processes)
    if problem:
        raise typer.BadParameter(problem, param_hint="--client-processes")
    if kill not in (None, "leader", "replica"):
        raise typer.BadParameter("leader or replica", param_hint="--kill")
    if at_stage not in _STAGES:
        raise typer.BadParameter(f"one of {', '.join(_STAGES)}", param_hint="--at-stage")
    if replica_mode not in ("standby", "active"):
        raise typer.BadParameter("standby or active", param_hint="--replica-mode")
    if kill is not None and replica_mode == "active":
        raise typer.BadParameter("--kill strikes a leader or a standby: it needs --replica-mode standby",
                                 param_hint="--kill")
    plan = None if kill is None else KillPlan("leader" if kill == "leader" else "replica",
                                              Stage.parse(at_stage).value, kill_round)
    _run_and_report(lambda: ScaleBenchConfig(
        fleet=FleetShape(devices=devices, client_processes=client_processes, dim=dim, neighbors="auto"),
        replicas=replicas, group_size=group_size, dropout=dropout, rounds=rounds, seed=seed, baseline=baseline,
        lease_s=lease_seconds, timeout=timeout, keep=keep, kill=plan, replica_mode=replica_mode,
    ), run_scale_bench)


Config = TypeVar("Config")


def _check_neighbors(neighbors: str) -> None:
    from fedmask.bench.loopback_federation import is_neighbors

    if not is_neighbors(neighbors):
        raise typer.BadParameter("'all', 'auto' or an even number", param_hint="--neighbors")


def _run_and_report(config: Callable[[], Config], bench: Callable[[Config, Callable[[str], None]], dict[str, Any]]) -> None:
    """Make the bench's configuration (a ValueError is a bad parameter), run `bench(cfg, log)`
    (progress to stderr), print its result as the last stdout line (JSON; {"ok": false, "error": ...}
    when a process failed or no PostgreSQL server could be started), exit 1 unless ok."""
    from fedmask.bench.federation import dumps
    from fedmask.bench.processes import ProcessFailed
    from fedmask.bench.throwaway_postgres import PgUnavailable
    from fedmask.console import err as stderr_console

    try:
        cfg = config()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    err = stderr_console()
    try:
        with _interruptible():
            result = bench(cfg, lambda m: err.print(m, markup=False, highlight=False))
    except (ProcessFailed, PgUnavailable) as exc:
        err.print(f"bench failed: {exc}", markup=False)
        result = {"ok": False, "error": str(exc).splitlines()[0]}
    print(dumps(result), flush=True)
    if not result.get("ok"):
        raise typer.Exit(1)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C: the benchmark's processes are stopped on the way out."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted: every process of the benchmark was stopped", file=sys.stderr)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(app: typer.Typer) -> None:
    """Attach `fedmask bench ...` to the root app."""
    app.add_typer(bench_app, name="bench")
