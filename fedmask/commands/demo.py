"""`fedmask demo`: a real federation on this machine, with its admin service, reported round by round.

A coordinator (SQLite in a run folder), edge-client processes (ML-100K
users, one device each) and the admin service (`fedmask admin`: REST API and
dashboard, an operator token generated for the run) on 127.0.0.1. By
default every hosted device is in every secure round, with distributed DP
noise (tau 0.1, z 1; FedRAP's update in the validation-tuned unit
`update_scale` 70, docs/tuning.md), so the validation totals each round
decodes from the secure sum cover every hosted user (D35). Each round is
reported: survivors and dropouts per stage, stage timings, the validation
totals, the model version it committed, epsilon, and a bit-for-bit check of
the secure sum (debug instrumentation: the coordinator records a checksum
of the sum, the clients the inputs they encoded; each round's inputs are
deleted once checked). Injected dropouts are optional (--dropout). After
the rounds the federation is paused through the REST API, the last
round's validation HR@10 is printed beside the popularity baseline on the
same users, and one user's top-k, computed on their device and fetched
through the REST API, is shown next to what they rated highly. All
processes are stopped on exit, Ctrl-C included; with --keep-running they
stay up (paused) until Ctrl-C.

`fedmask secagg-demo` (or `fedmask demo --secagg-only`) is the earlier
one-process demo of the secure-aggregation library alone.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from secagg.stages import Stage

_WHEN = {
    Stage.ADVERTISE_KEYS: "never advertised keys",
    Stage.SHARE_KEYS: "advertised, never shared keys",
    Stage.SHARE_CHECK: "shared keys, never answered the share check",
    Stage.MASKED_INPUT: "checked the shares, no masked input",
    Stage.CONSISTENCY_CHECK: "no consistency signature",
    Stage.UNMASKING: "masked input sent, no unmasking",
}
# passive mode (no signatures): every stage but the consistency check
_STAGES = tuple(s.value for s in Stage if s is not Stage.CONSISTENCY_CHECK)
# the demo's defaults: every hosted device in every round, enough rounds to learn (docs/performance.md, "The demo")
DEMO_DEVICES = 450
DEMO_ROUNDS = 24
# stage deadlines (s): with injected dropouts a silent device costs its stage's (learnt) deadline
_DEADLINES_DROPOUT = {"training_deadline": 60, "advertise_keys_deadline": 10, "share_keys_deadline": 5,
                      "share_check_deadline": 5, "masked_input_deadline": 3, "unmasking_deadline": 3}
# without, they only bound how long a slow device (a busy machine) is waited for
_DEADLINES_NO_DROPOUT = {"training_deadline": 120, "advertise_keys_deadline": 30, "share_keys_deadline": 30,
                         "share_check_deadline": 30, "masked_input_deadline": 30, "unmasking_deadline": 30}
# the stage client process i drops at, cycling
_DROP_STAGES = tuple(s.cli_name for s in (Stage.MASKED_INPUT, Stage.UNMASKING, Stage.SHARE_KEYS, Stage.ADVERTISE_KEYS))


def register(app: typer.Typer) -> None:
    """Attach `fedmask demo` and `fedmask secagg-demo` to the root app."""
    app.command("demo")(demo)
    app.command("secagg-demo")(secagg_demo)


# ============================================================ the federation demo


def demo(
    rounds: Annotated[int, typer.Option(min=1, help="Secure rounds to run.")] = DEMO_ROUNDS,
    devices: Annotated[int, typer.Option(min=4, help="Devices hosted (ML-100K users 1..N, one device each).")] = DEMO_DEVICES,
    cohort: Annotated[int | None, typer.Option(min=3, help="Devices per round (default: every hosted device, so the "
                                               "validation totals cover all hosted users).", show_default=False)] = None,
    client_processes: Annotated[int, typer.Option(min=1, help="Edge-client processes hosting the devices.")] = 2,
    dropout: Annotated[float, typer.Option(min=0.0, max=0.4, help="Dropout probability per selected device; "
                                           "client process i drops at stage i of: masked-input, unmasking, "
                                           "share-keys, advertise-keys (dropped devices are not in that "
                                           "round's validation totals).")] = 0.0,
    model: Annotated[str, typer.Option(help="Model: fedrap, pfedrec, fedmf (implicit feedback).")] = "fedrap",
    dataset: Annotated[str, typer.Option(help="Dataset under --data-dir (fetched when it is ml-100k and missing).")] = "ml-100k",
    data_dir: Annotated[Path | None, typer.Option(envvar="FEDMASK_DATA_DIR", help="Datasets folder (default ./data).",
                                                  show_default=False)] = None,
    neighbors: Annotated[str, typer.Option(help="SecAgg graph: auto (SecAgg+), full (Bonawitz) or an even K.")] = "auto",
    dp_mode: Annotated[str, typer.Option(help="Differential privacy: distributed (each device adds N(0, (z tau)^2 / "
                                         "cohort), so the secure sum carries the full noise; tau 0.1, z 1), local "
                                         "(every device adds it all: the model learns nothing; docs/performance.md, "
                                         "\"Recommendation quality on ML-100K\") or none.")]
    = "distributed",
    seed: Annotated[int, typer.Option(help="Seed of selection, splits and dropout draws.")] = 0,
    keep: Annotated[Path | None, typer.Option(help="Run in this folder and keep it (logs, database, device state).",
                                              show_default=False)] = None,
    keep_running: Annotated[bool, typer.Option("--keep-running", help="After the rounds, leave the federation "
                                               "(paused) and the dashboard up until Ctrl-C.")] = False,
    admin_port: Annotated[int, typer.Option(min=0, max=65535, help="Port of the admin service and dashboard on "
                                            "127.0.0.1 (0: a free one).")] = 0,
    secagg_only: Annotated[bool, typer.Option("--secagg-only", help="Run the one-process secure-aggregation demo "
                                              "instead (`fedmask secagg-demo`, with its defaults).")] = False,
) -> None:
    """Run a real federation on this machine, with its admin service, and report every round.

    Starts a coordinator (SQLite), edge-client processes and the admin service (`fedmask admin`: REST API and dashboard) on 127.0.0.1, and prints the dashboard's address, an API token and a curl line for a top-k query. The devices (ML-100K users) train the model locally and the coordinator aggregates their updates with secure aggregation and distributed DP noise. Each round is reported as it ends: survivors per stage, stage timings, the devices' validation totals (from the secure sum), the model version and epsilon. At the end: the validation HR@10 against the popularity baseline on the same users, and one user's top-k computed on their device next to what they rated highly. Everything is stopped on exit or Ctrl-C (--keep-running: only on Ctrl-C).
    """
    if secagg_only:
        secagg_demo()
        return
    from fedmask.console import out

    console = out()
    if neighbors not in ("auto", "full") and not (neighbors.isdigit() and int(neighbors) % 2 == 0):
        raise typer.BadParameter("auto, full or an even number", param_hint="--neighbors")
    if dp_mode not in ("local", "distributed", "none"):
        raise typer.BadParameter("local, distributed or none", param_hint="--dp-mode")
    data_root = Path(data_dir) if data_dir is not None else Path("data")
    _ensure_dataset(console, dataset, data_root)
    from models.data.entry import load_interactions
    from models.registry import ConfigError

    try:
        x = load_interactions(dataset, str(data_root), seed)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dataset") from None
    if devices > x.n_users:
        raise typer.BadParameter(f"{dataset} has {x.n_users} users", param_hint="--devices")
    cohort = devices if cohort is None else cohort
    selected = -(-cohort * 6 // 5)  # ceil(1.2 * cohort)
    if cohort > devices or (cohort < devices and 2 * selected > devices):
        raise typer.BadParameter(f"--cohort {devices} (every device in every round), or host at least "
                                 f"{2 * selected} devices for cohorts of {selected} (a device sits out the round "
                                 "after it contributed)", param_hint="--devices")

    workdir = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="fedmask-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        _run(console, workdir, x, dataset=dataset, data_root=data_root.resolve(), rounds=rounds, devices=devices,
             cohort=cohort, client_processes=client_processes, dropout=dropout, model=model, neighbors=neighbors,
             dp_mode=dp_mode, seed=seed, keep_running=keep_running, admin_port=admin_port)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: every process of the demo was stopped")
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if keep is None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"run folder kept: {workdir} (coordinator.log, client-*.log, coordinator.db)")


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _ensure_dataset(console: Any, dataset: str, data_root: Path) -> None:
    if dataset != "ml-100k" or (data_root / "ml-100k").is_dir():
        return
    import subprocess
    import sys

    console.print(f"{data_root / 'ml-100k'} is missing: fetching it (fedmask data fetch ml-100k)")
    rc = subprocess.run([sys.executable, "-m", "fedmask", "data", "fetch", "ml-100k", "--data-dir", str(data_root)],
                        check=False).returncode
    if rc != 0:
        console.print("[red]could not fetch ml-100k[/red]; put it under DATA_DIR/ml-100k or pass --data-dir")
        raise typer.Exit(1)


def _run(console: Any, workdir: Path, x: Any, *, dataset: str, data_root: Path, rounds: int, devices: int,
         cohort: int, client_processes: int, dropout: float, model: str, neighbors: str, dp_mode: str,
         seed: int, keep_running: bool, admin_port: int) -> None:
    import secrets

    import numpy as np
    from rich.table import Table

    from coordinator.store import open_store
    from fedmask.bench.processes import LOOPBACK, ProcessGroup, flags, free_port, health_serving, split_users, wait_until
    from fedmask.commands.demo_product import popularity_val_hr, rated_highly, start_admin, top_k_table
    from fedmask.console import print_command

    port, coord_admin = free_port(), free_port()
    http_port = admin_port or free_port()
    coordinator_token = secrets.token_urlsafe(32)
    db = workdir / "coordinator.db"
    everyone = cohort == devices
    selected = cohort if everyone else -(-cohort * 6 // 5)
    coord_flags = {
        "listen": f"{LOOPBACK}:{port}",
        "admin_listen": f"{LOOPBACK}:{coord_admin}",
        "database_url": f"sqlite:///{db}",
        "model": model,
        "model_params": {"n_users": int(x.n_users), "n_items": int(x.n_items), **_model_params(model, dp_mode)},
        "cohort_size": cohort,
        "cohort_minimum": cohort,
        # every hosted device in every round (secure sums only: consecutive sums reveal no device's update)
        "over_selection": 0.0 if everyone else 0.2,
        "allow_consecutive": everyone,
        "seed": seed,
        "selection_deadline": 20,
        # no injected dropout: every device answers, each stage closes when the last one did, and the
        # deadlines are only there for a device that is slow (a busy machine): wait for it (fixed and
        # generous); with injected (silent) dropouts, learn them from the devices (adaptive, these ceilings)
        **(_DEADLINES_DROPOUT if dropout > 0 else _DEADLINES_NO_DROPOUT),
        "deadline_policy": "adaptive" if dropout > 0 else "fixed",
        "secagg_graph": neighbors,
        "dp_mode": dp_mode,
        "debug_record_sums": True,
    }
    users = split_users(1, devices, client_processes)
    plan = [_DROP_STAGES[i % len(_DROP_STAGES)] for i in range(len(users))]
    head = Table(title=f"fedmask demo: {model} on {dataset}, secure aggregation over gRPC (127.0.0.1)",
                 show_header=False)
    head.add_row("coordinator", f"port {port} (admin listener {coord_admin}), SQLite {db}")
    head.add_row("devices", f"{devices} ({dataset} users 1-{devices}) in {len(users)} client process(es): "
                 + ", ".join(f"users {u}" for u in users))
    head.add_row("rounds", f"{rounds}, cohort {selected}" + (" (every hosted device)" if everyone else
                 f" ({cohort} + 20% over-selected)") + f", graph {neighbors}, DP {dp_mode}"
                 + (" (tau 0.1, z 1: the secure sum carries the noise)" if dp_mode == "distributed" else ""))
    if dropout > 0:
        head.add_row("dropouts", ", ".join(f"process {i}: {dropout:.0%} at {s}" for i, s in enumerate(plan))
                     + " (a dropped device goes silent; its stage waits for the deadline)")
    d = _DEADLINES_DROPOUT if dropout > 0 else _DEADLINES_NO_DROPOUT
    head.add_row("deadlines", f"training {d['training_deadline']} s, advertise {d['advertise_keys_deadline']} s, "
                 f"share {d['share_keys_deadline']} s, masked input {d['masked_input_deadline']} s, "
                 f"unmasking {d['unmasking_deadline']} s "
                 + ("(ceilings; learnt from the devices after the first round)" if dropout > 0 else
                    "(fixed: no device is silent, so a stage closes when the last device answered)"))
    console.print(head)

    env = {"OMP_NUM_THREADS": "1", "FEDMASK_DATA_DIR": str(data_root)}
    t0 = time.monotonic()
    with ProcessGroup(workdir, env=env) as group:
        coord = group.start("coordinator", ["coordinator", *flags(coord_flags)],
                            env={"FEDMASK_ADMIN__TOKEN": coordinator_token})
        with console.status("starting the coordinator ..."):
            wait_until(lambda: health_serving(port), 60, what="the coordinator", watch=[coord], step=0.2)
        for i, (u, stage) in enumerate(zip(users, plan, strict=True)):
            group.start(f"client-{i}", ["client", *flags({
                "coordinator": f"{LOOPBACK}:{port}", "users": u, "state_dir": workdir / f"client-{i}",
                "dataset": dataset, "seed": seed, "drop_rate": dropout if dropout > 0 else None,
                "drop_stage": stage if dropout > 0 else None, "threads": 1, "debug_record_inputs": True,
            })])
        clients = [c for c in group.children if c is not coord]
        with console.status("starting the admin service ..."):
            admin = start_admin(group, db=db, coordinator_admin=f"{LOOPBACK}:{coord_admin}",
                                coordinator_token=coordinator_token, port=http_port, watch=[coord, *clients])
        _print_access(console, admin)
        state_dirs = [workdir / f"client-{i}" for i in range(len(users))]
        store = None
        reported: set[int] = set()
        records: list[Any] = []
        paused = False
        try:
            with console.status("clients enrolling their devices ...") as status:
                while True:
                    group.check_alive()
                    if store is None:
                        store = open_store(f"sqlite:///{db}", migrate=False)
                    try:
                        page = tuple(store.list_rounds(limit=rounds + 5).items)
                    except Exception:
                        page = ()
                    current = None
                    for r in sorted(page, key=lambda r: r.number):
                        if r.state.is_terminal and r.number not in reported:
                            reported.add(r.number)
                            records.append(r)
                            console.print(_round_line(r, store, state_dirs))
                            _drop_inputs(state_dirs, r.number)
                        elif not r.state.is_terminal:
                            current = r
                    last_open = current.number if current is not None else 0
                    if not paused and (len(records) >= rounds or last_open >= rounds):
                        # the last round is open (or done): it finishes, no new one opens
                        admin.post("/v1/federation/pause")
                        paused = True
                    if paused and current is None and admin.get("/v1/rounds/current")["round"] is None:
                        break
                    if current is not None:
                        status.update(f"round {current.number}: {current.state.value.replace('_', ' ')} "
                                      f"({len(current.survivors.get('selected', []))} devices) ...")
                    elif not records:
                        status.update("clients enrolling their devices, waiting for a full cohort ...")
                    time.sleep(0.3)
            for r in sorted(store.list_rounds(limit=rounds + 5).items, key=lambda r: r.number):
                if r.state.is_terminal and r.number not in reported:
                    records.append(r)
                    console.print(_round_line(r, store, state_dirs))
            console.print(_stage_table(records))
            console.print(_metrics_table(records, store))
            committed = [r for r in records if r.state.value == "committed"]
            console.print(f"{len(committed)} of {len(records)} rounds committed in {time.monotonic() - t0:.0f} s "
                          "(process start-up included)")
            hosted = np.arange(devices)  # users 1..N are the dataset's dense users 0..N-1
            last = next((r for r in reversed(committed) if "val_hr@10" in r.metrics), None)
            if last is not None:
                counted = int(last.metrics.get("count.devices", last.metrics.get("contributors", 0)))
                base = popularity_val_hr(x, seed, hosted)
                console.print(
                    f"[bold]validation HR@10 {last.metrics['val_hr@10']:.3f}[/bold] after round {last.number}, "
                    f"over the validation items of the {counted} of {devices} hosted users counted in its secure "
                    f"sum; popularity on the same {devices} users: {base:.3f}")
            user = "user-1"
            answer = admin.get(f"/v1/users/{user}/recommendations", k=10)
            console.print(top_k_table(answer, rated_highly(x, 0), user))
            _print_access(console, admin)
            if keep_running:
                console.print("[bold]--keep-running[/bold]: the federation stays up, paused; resume its rounds "
                              "from the dashboard or with:")
                print_command(console, admin.curl_resume())
                # the last line: a caller waiting for the demo to be up reads it
                console.print("the federation and the dashboard stay up; Ctrl-C stops them")
                while True:
                    group.check_alive()
                    time.sleep(1.0)
        finally:
            if store is not None:
                store.close()


def _model_params(model: str, dp_mode: str) -> dict[str, Any]:
    """The validation-tuned unit of FedRAP's update under tau 0.1, z 1 with
    distributed noise (docs/tuning.md: update_scale 70)."""
    return {"update_scale": 70} if model == "fedrap" and dp_mode == "distributed" else {}


def _print_access(console: Any, admin: Any) -> None:
    """The dashboard's address and token, then the curl line of a top-k
    query alone on its line (fedmask.console.print_command), to be pasted."""
    from fedmask.console import print_command

    console.print(f"dashboard: [bold]{admin.base}/[/bold]  (token: {admin.token})")
    console.print("top-k over REST:")
    print_command(console, admin.curl_top_k("user-1"))


def _drop_inputs(state_dirs: list[Path], number: int) -> None:
    """The devices' recorded inputs of a checked round (debug; 215 KB a device) are deleted."""
    import shutil

    for s in state_dirs:
        shutil.rmtree(s / "debug" / "inputs" / f"round-{number:06d}", ignore_errors=True)


def _round_line(r: Any, store: Any, state_dirs: list[Path]) -> str:
    total = (r.ended_at - r.started_at).total_seconds() if r.ended_at else float("nan")
    drops = ", ".join(f"{len(v)} at {k.replace('_', ' ')}" for k, v in r.dropouts.items() if v) or "none"
    if r.state.value != "committed":
        return (f"[red]round {r.number} aborted[/red] ({r.abort_reason}) after {total:.1f} s; "
                f"cohort {r.cohort_size}, dropouts: {drops}")
    version = next((v.id for v in store.list_model_versions(limit=50).items if v.round_number == r.number), None)
    hr = r.metrics.get("val_hr@10")
    from fedmask.bench.federation import exact_aggregate

    exact = exact_aggregate(r, state_dirs)
    return (f"[green]round {r.number} committed[/green] in {total:.1f} s: model v{version}, "
            f"{int(r.metrics.get('contributors', 0))}/{r.cohort_size} devices in the sum, dropouts: {drops}"
            + (f", val HR@10 {hr:.3f} (secure totals)" if hr is not None else "")
            + (", [yellow]metrics unavailable[/yellow]" if r.metrics.get("metrics_unavailable") else "")
            + f", secure sum {'[green]exact[/green]' if exact else '[red]NOT exact[/red]'}")


def _stage_table(records: list[Any]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title="per stage: devices that completed it [red](-dropped there)[/red], seconds it took",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("round", justify="right")
    t.add_column("selected", justify="right")
    for name in ("advertise\nkeys", "share\nkeys", "masked\ninput", "unmasking", "commit", "total"):
        t.add_column(name, justify="right", no_wrap=True)
    for r in records:
        cells = []
        for s in _STAGES:
            lost = len(r.dropouts.get(s, []))
            alive = f"{len(r.survivors[s])}" if s in r.survivors else "-"
            secs = f"{r.timings[s]:.2f} s" if s in r.timings else ""
            cells.append(alive + (f" [red]-{lost}[/red]" if lost else "") + (f"\n{secs}" if secs else ""))
        cells.append(f"{r.timings['aggregating']:.2f} s" if "aggregating" in r.timings else "-")
        total = (r.ended_at - r.started_at).total_seconds() if r.ended_at else float("nan")
        end = f"{total:.1f} s" if r.state.value == "committed" else f"[red]aborted[/red]\n{r.abort_reason}"
        t.add_row(str(r.number), str(len(r.survivors.get("selected", []))), *cells, end)
    return t


def _metrics_table(records: list[Any], store: Any) -> Any:
    from rich import box
    from rich.table import Table

    versions = {v.round_number: v for v in store.list_model_versions(limit=100).items}
    ledger = {e.round_number: e for e in store.privacy_ledger()}
    t = Table(title="the counted devices' metrics, known only as totals from the secure sum "
                    "(validation on their own held-out items)",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("round", "model", "in sum", "train\nexamples", "val\nHR@10", "val\nNDCG@10",
                 "clipped", "epsilon\nround / total"):
        t.add_column(name, justify="right", no_wrap=True)
    for r in records:
        m = r.metrics
        v = versions.get(r.number)
        e = ledger.get(r.number)
        n = m.get("count.devices") or m.get("contributors") or 0

        def f(key: str, fmt: str = "{:.3f}") -> str:
            return fmt.format(m[key]) if key in m else "-"

        t.add_row(
            str(r.number),
            f"v{r.base_model_version}->v{v.id}" if v else f"v{r.base_model_version} kept",
            f("contributors", "{:.0f}"),
            f("count.examples", "{:.0f}"),
            f("val_hr@10"),
            f("val_ndcg@10"),
            f"{m['count.clipped']:.0f}/{n:.0f}" if "count.clipped" in m and n else "-",
            f"{e.epsilon:.2f} / {e.cumulative_epsilon:.2f}" if e else "-",
        )
    t.caption = ("clipped: updates clipped to the DP norm; epsilon of (epsilon, delta)-DP of the model updates, "
                 "per round and composed so far (the metric totals are outside it, D36); "
                 "'-' where a round's metrics were unavailable")
    return t


# ============================================================ the secagg-only demo (one process)


def secagg_demo(
    clients: Annotated[int, typer.Option(min=3, help="Cohort size.")] = 20,
    dim: Annotated[int, typer.Option(min=1, help="Length of each device's update vector.")] = 1_000,
    neighbors: Annotated[
        str, typer.Option(help="'all' (Bonawitz, complete graph), 'auto' (SecAgg+ formula) or an even degree.")
    ] = "all",
    dropout: Annotated[
        float, typer.Option(min=0.0, max=0.45, help="Fraction of devices dropping at each of the two stages.")
    ] = 0.1,
    first_stage: Annotated[str, typer.Option(help="First dropout stage.")] = "masked-input",
    second_stage: Annotated[str, typer.Option(help="Second dropout stage.")] = "unmasking",
    seed: Annotated[int, typer.Option(help="Seed of updates, dropouts and keys.")] = 0,
) -> None:
    """Run one secure-aggregation round among simulated devices in this process and report it."""
    import numpy as np
    from rich.table import Table

    from fedmask.console import out

    from secagg.config import Neighbors, SecAggConfig
    from secagg.errors import SecAggError
    from secagg.inprocess import DROPOUT_STAGES, DropoutPlan, run_round

    console = out()
    stages = [s.replace("-", "_") for s in (first_stage, second_stage)]
    for s in stages:
        if s not in DROPOUT_STAGES:
            raise typer.BadParameter(f"unknown stage {s!r}; one of {', '.join(DROPOUT_STAGES)}")
    if stages[0] == stages[1]:
        raise typer.BadParameter("pick two different stages")
    try:
        degree: Neighbors = "all" if neighbors == "all" else "auto" if neighbors == "auto" else int(neighbors)
        config = SecAggConfig.create(
            num_clients=clients,
            vector_length=dim,
            session_id=f"demo-{seed}".encode(),
            neighbors=degree,
            expected_dropout=max(2 * dropout, 0.01),
        )
    except (ValueError, SecAggError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    rng = np.random.default_rng(seed)
    updates = rng.normal(0.0, 0.3, size=(clients, dim)).astype(np.float32)
    per_stage = round(dropout * clients)
    chosen = rng.permutation(clients)[: 2 * per_stage].tolist()
    plan = DropoutPlan(**{stages[0]: frozenset(chosen[:per_stage]), stages[1]: frozenset(chosen[per_stage:])})

    outcome = run_round(updates, config=config, dropouts=plan, round_idx=0, seed=seed)

    graph = "complete (Bonawitz)" if config.is_complete_graph else f"Harary, degree {config.degree} (SecAgg+)"
    head = Table(title="fedmask secure aggregation: one round", show_header=False)
    head.add_row("cohort", f"{clients} devices, vectors of {dim} floats clipped to ±{config.encoding.clip:g}")
    head.add_row("graph / threshold", f"{graph}, t = {config.threshold}")
    head.add_row("encoding", f"{config.encoding.modulus_bits}-bit fixed point, step {config.encoding.step:.3g}")
    for stage in DROPOUT_STAGES:
        ids = sorted(getattr(plan, stage))
        if ids:
            head.add_row(f"dropped: {_WHEN[Stage(stage)]}", ", ".join(map(str, ids)))
    console.print(head)

    surv = Table(title="survivors per stage (server view)")
    surv.add_column("stage")
    surv.add_column("devices", justify="right")
    surv.add_column("server CPU ms", justify="right")
    for stage, members in outcome.survivors.items():
        surv.add_row(stage.replace("_", " "), str(len(members)), f"{outcome.server_cpu_ms.get(stage, 0.0):.1f}")
    console.print(surv)

    if not outcome.ok:
        console.print(
            f"[red]round aborted[/red] at {outcome.abort_stage}: "
            f"{outcome.abort_reason.value if outcome.abort_reason else '?'} ({outcome.abort_detail})"
        )
        raise typer.Exit(1)

    counted = list(outcome.counted)
    float_mean = np.clip(updates[counted], -config.encoding.clip, config.encoding.clip).astype(np.float64).mean(0)
    err = float(np.abs(outcome.mean - float_mean).max())
    res = Table(title="result", show_header=False)
    res.add_row("counted devices", f"{len(counted)} (masked input received)")
    res.add_row(
        "exact sum",
        "[green]yes[/green]: equals the plaintext sum of the counted encoded updates bit for bit"
        if outcome.exact
        else "[red]NO[/red]",
    )
    res.add_row("max |decoded mean - float mean|", f"{err:.3g} (quantization step {config.encoding.step:.3g})")
    cpu = outcome.client_cpu_ms
    res.add_row("device CPU ms (mean / max)", f"{cpu.mean():.1f} / {cpu.max():.1f}")
    res.add_row("server CPU ms (all stages)", f"{sum(outcome.server_cpu_ms.values()):.1f}")
    res.add_row("masked input on the wire", f"{outcome.masked_input_bytes} bytes ({4 * dim} of payload)")
    res.add_row("one sealed share pair", f"{outcome.share_ciphertext_bytes} bytes")
    res.add_row("wall time", f"{outcome.wall_s:.2f} s")
    console.print(res)
    if not outcome.exact:
        raise typer.Exit(1)
