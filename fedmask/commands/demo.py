"""`fedmask demo`: a real federation on this machine, with its admin service, reported round by round.

A coordinator (SQLite in a run folder), edge-client processes (ML-100K
users, one device each) and the admin service (`fedmask admin`: REST API and
dashboard, an operator token generated for the run) on 127.0.0.1. By
default every hosted device is in every secure round, with distributed DP
noise (the discrete Gaussian, D88; tau 0.1, z 1; FedRAP's update in the
validation-tuned unit `update_scale` 70, docs/tuning.md). Under it the
rounds carry no metric totals (they would be outside epsilon, D36); with
--dp-mode none the validation totals each round decodes from the secure
sum cover every hosted user (D35). Each round is reported: survivors and
dropouts per stage, stage timings, the validation totals when there are
any, the model version it committed, epsilon, and a bit-for-bit check of
the secure sum (debug instrumentation: the coordinator records a checksum
of the sum, the clients the inputs they encoded; each round's inputs are
deleted once checked). Injected dropouts are optional (--dropout). After
the rounds the federation is paused through the REST API, the validation
HR@10 (from the last round's totals, or under DP from the top-10 the
devices compute for up to 50 users, asked through the REST API) is printed
beside the popularity baseline on the same users, and one user's top-k, computed on their device and fetched
through the REST API, is shown next to what they rated highly. All
processes are stopped on exit, Ctrl-C included; with --keep-running they
stay up (paused) until Ctrl-C.

`fedmask secagg-demo` (or `fedmask demo --secagg-only`) is the earlier
one-process demo of the secure-aggregation library alone
(fedmask/commands/secagg_demo.py).
"""

from __future__ import annotations

import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from secagg.stages import Stage

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
    from fedmask.commands.secagg_demo import secagg_demo

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

    Starts a coordinator (SQLite), edge-client processes and the admin service (`fedmask admin`: REST API and dashboard) on 127.0.0.1, and prints the dashboard's address, an API token and a curl line for a top-k query. The devices (ML-100K users) train the model locally and the coordinator aggregates their updates with secure aggregation and distributed DP noise. Each round is reported as it ends: survivors per stage, stage timings, the devices' validation totals (from the secure sum; none under DP, whose discrete Gaussian leaves no total outside epsilon), the model version and epsilon. At the end: the validation HR@10 (from the totals, or under DP from the devices' own top-10s) against the popularity baseline on the same users, and one user's top-k computed on their device next to what they rated highly. Everything is stopped on exit or Ctrl-C (--keep-running: only on Ctrl-C).
    """
    if secagg_only:
        from fedmask.commands.secagg_demo import secagg_demo

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
        plan = _Plan(dataset=dataset, data_root=data_root.resolve(), rounds=rounds, devices=devices, cohort=cohort,
                     client_processes=client_processes, dropout=dropout, model=model, neighbors=neighbors,
                     dp_mode=dp_mode, seed=seed)
        _run(console, workdir, x, plan, keep_running=keep_running, admin_port=admin_port)
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


@dataclass(frozen=True)
class _Plan:
    """The federation `fedmask demo` runs, its options checked."""

    dataset: str
    data_root: Path
    rounds: int
    devices: int
    cohort: int
    client_processes: int
    dropout: float
    model: str
    neighbors: str
    dp_mode: str
    seed: int

    @property
    def everyone(self) -> bool:
        """Every hosted device in every round (else cohorts of `cohort`, 20 % over-selected)."""
        return self.cohort == self.devices

    @property
    def selected(self) -> int:
        return self.cohort if self.everyone else -(-self.cohort * 6 // 5)

    @property
    def deadlines(self) -> dict[str, int]:
        return _DEADLINES_DROPOUT if self.dropout > 0 else _DEADLINES_NO_DROPOUT


def _run(console: Any, workdir: Path, x: Any, plan: _Plan, *, keep_running: bool, admin_port: int) -> None:
    import contextlib
    import secrets

    from coordinator.store import open_store
    from fedmask.bench.loopback_federation import start_client, start_coordinator
    from fedmask.bench.processes import LOOPBACK, ProcessGroup, free_port, split_users
    from fedmask.commands.demo_product import start_admin

    port, coord_admin = free_port(), free_port()
    http_port = admin_port or free_port()
    coordinator_token = secrets.token_urlsafe(32)
    db = workdir / "coordinator.db"
    users = split_users(1, plan.devices, plan.client_processes)
    drop_at = [_DROP_STAGES[i % len(_DROP_STAGES)] for i in range(len(users))]
    console.print(_head_table(plan, f"port {port} (admin listener {coord_admin}), SQLite {db}", users, drop_at))

    env = {"OMP_NUM_THREADS": "1", "FEDMASK_DATA_DIR": str(plan.data_root)}
    t0 = time.monotonic()
    with ProcessGroup(workdir, env=env) as group:
        with console.status("starting the coordinator ..."):
            coord = start_coordinator(group, port, _coordinator_flags(plan, x, db, port, coord_admin),
                                      env={"FEDMASK_ADMIN__TOKEN": coordinator_token,
                                           "FEDMASK_ADMIN__MAX_TOP_K": str(int(x.n_items))})
        clients = [start_client(group, f"client-{i}", port, u, workdir / f"client-{i}", {
            "dataset": plan.dataset, "seed": plan.seed, "drop_rate": plan.dropout if plan.dropout > 0 else None,
            "drop_stage": stage if plan.dropout > 0 else None, "threads": 1, "debug_record_inputs": True,
            "no_dp_floor": plan.dp_mode == "none",  # --dp-mode none: the devices' DP floor off, with a warning (D85)
            # the closing validation figure ranks every item on the device (demo_product.device_top_k_val_hr)
            "recommend_seen_items": True, "max_top_k": int(x.n_items),
        }) for i, (u, stage) in enumerate(zip(users, drop_at, strict=True))]
        with console.status("starting the admin service ..."):
            admin = start_admin(group, db=db, coordinator_admin=f"{LOOPBACK}:{coord_admin}",
                                coordinator_token=coordinator_token, port=http_port, watch=[coord, *clients],
                                max_top_k=int(x.n_items))
        _print_access(console, admin)
        state_dirs = [workdir / f"client-{i}" for i in range(len(users))]
        group.check_alive()
        with contextlib.closing(open_store(f"sqlite:///{db}", migrate=False)) as store:
            records = _follow_rounds(console, group, admin, store, plan.rounds, state_dirs)
            _report(console, records, store, x, plan, seconds=time.monotonic() - t0, admin=admin)
            _privacy_summary(console, admin)
            _show_top_k(console, admin, x)
            if keep_running:
                _stay_up(console, group, admin)


def _coordinator_flags(plan: _Plan, x: Any, db: Path, port: int, admin_port: int) -> dict[str, Any]:
    from fedmask.bench.processes import LOOPBACK

    return {
        "listen": f"{LOOPBACK}:{port}",
        "admin_listen": f"{LOOPBACK}:{admin_port}",
        "database_url": f"sqlite:///{db}",
        "model": plan.model,
        "model_params": {"n_users": int(x.n_users), "n_items": int(x.n_items),
                         **_model_params(plan.model, plan.dp_mode)},
        "cohort_size": plan.cohort,
        "cohort_minimum": plan.cohort,
        # every hosted device in every round (secure sums only: consecutive sums reveal no device's update)
        "over_selection": 0.0 if plan.everyone else 0.2,
        "allow_consecutive": plan.everyone,
        "seed": plan.seed,
        "selection_deadline": 20,
        # no injected dropout: every device answers, each stage closes when the last one did, and the
        # deadlines are only there for a device that is slow (a busy machine): wait for it (fixed and
        # generous); with injected (silent) dropouts, learn them from the devices (adaptive, these ceilings)
        **plan.deadlines,
        "deadline_policy": "adaptive" if plan.dropout > 0 else "fixed",
        "secagg_graph": plan.neighbors,
        "dp_mode": plan.dp_mode,
        "debug_record_sums": True,
    }


def _head_table(plan: _Plan, coordinator: str, users: list[str], drop_at: list[str]) -> Any:
    """What the demo is about to run: the coordinator, the devices, the rounds, the dropouts, the deadlines."""
    from rich.table import Table

    head = Table(title=f"fedmask demo: {plan.model} on {plan.dataset}, secure aggregation over gRPC (127.0.0.1)",
                 show_header=False)
    head.add_row("coordinator", coordinator)
    head.add_row("devices", f"{plan.devices} ({plan.dataset} users 1-{plan.devices}) in {len(users)} client "
                 "process(es): " + ", ".join(f"users {u}" for u in users))
    head.add_row("rounds", f"{plan.rounds}, cohort {plan.selected}" + (" (every hosted device)" if plan.everyone else
                 f" ({plan.cohort} + 20% over-selected)") + f", graph {plan.neighbors}, DP {plan.dp_mode}"
                 + (" (tau 0.1, z 1: the secure sum carries the noise)" if plan.dp_mode == "distributed" else ""))
    if plan.dropout > 0:
        head.add_row("dropouts", ", ".join(f"process {i}: {plan.dropout:.0%} at {s}" for i, s in enumerate(drop_at))
                     + " (a dropped device goes silent; its stage waits for the deadline)")
    d = plan.deadlines
    head.add_row("deadlines", f"training {d['training_deadline']} s, advertise {d['advertise_keys_deadline']} s, "
                 f"share {d['share_keys_deadline']} s, masked input {d['masked_input_deadline']} s, "
                 f"unmasking {d['unmasking_deadline']} s "
                 + ("(ceilings; learnt from the devices after the first round)" if plan.dropout > 0 else
                    "(fixed: no device is silent, so a stage closes when the last device answered)"))
    return head


def _follow_rounds(console: Any, group: Any, admin: Any, store: Any, rounds: int, state_dirs: list[Path]) -> list[Any]:
    """Report every round as it ends; pause the federation once its last round has opened, and return when
    no round runs any more. The rounds' records, in the order they were reported."""
    reported: set[int] = set()
    records: list[Any] = []
    paused = False
    with console.status("clients enrolling their devices ...") as status:
        while True:
            group.check_alive()
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
    return records


def _report(console: Any, records: list[Any], store: Any, x: Any, plan: _Plan, *, seconds: float,
            admin: Any) -> None:
    """The rounds' tables, how many committed, and the last validation HR@10
    beside the popularity baseline: from the secure totals, or without them
    (DP with the discrete Gaussian, D36) from the devices' own top-10s."""
    import numpy as np

    from fedmask.commands.demo_product import device_top_k_val_hr, popularity_val_hr

    console.print(_stage_table(records))
    console.print(_metrics_table(records, store))
    committed = [r for r in records if r.state.value == "committed"]
    console.print(f"{len(committed)} of {len(records)} rounds committed in {seconds:.0f} s "
                  "(process start-up included)")
    hosted = np.arange(plan.devices)  # users 1..N are the dataset's dense users 0..N-1
    last = next((r for r in reversed(committed) if "val_hr@10" in r.metrics), None)
    if last is not None:
        counted = int(last.metrics.get("count.devices", last.metrics.get("contributors", 0)))
        base = popularity_val_hr(x, plan.seed, hosted)
        console.print(
            f"[bold]validation HR@10 {last.metrics['val_hr@10']:.3f}[/bold] after round {last.number}, "
            f"over the validation items of the {counted} of {plan.devices} hosted users counted in its secure "
            f"sum; popularity on the same {plan.devices} users: {base:.3f}")
    elif committed:  # no metric totals under DP (D36): ask the devices' own top-10s
        hr, hr_sampled, asked = device_top_k_val_hr(admin, x, plan.seed, hosted)
        base = popularity_val_hr(x, plan.seed, asked, full=True)
        base_sampled = popularity_val_hr(x, plan.seed, asked)
        console.print(
            f"[bold]validation HR@10 {hr:.3f}[/bold] (full ranking) of the top-10 that {len(asked)} of "
            f"{plan.devices} hosted devices compute for their users after round {committed[-1].number} (no "
            f"metric totals under DP: they would be outside epsilon, D36); popularity on the same {len(asked)} "
            f"users: {base:.3f}. Sampled (99 negatives): {hr_sampled:.3f}, popularity {base_sampled:.3f}")


def _privacy_summary(console: Any, admin: Any) -> None:
    """What the demo's epsilon means, as the admin service states it (GET /v1/privacy): its delta, the unit it
    protects, whether sampling was assumed, and the same noise at a production-size deployment."""
    p = admin.get("/v1/privacy")
    if p["statement"] is None:
        console.print("no differential privacy: the rounds spent no epsilon and protect nothing beyond the secure sum")
        return
    console.print(f"[bold]{p['statement']}[/bold]")
    if p["production_plan"] is not None:
        console.print(p["production_plan"]["text"])
    console.print("What a deployment needs for a meaningful epsilon: `fedmask privacy plan` (docs/privacy.md, "
                  "\"Planning\")")


def _show_top_k(console: Any, admin: Any, x: Any) -> None:
    """User 1's top-k, computed on their device and fetched over REST, beside what they rated highly."""
    from fedmask.commands.demo_product import rated_highly, top_k_table

    user = "user-1"
    answer = admin.get(f"/v1/users/{user}/recommendations", k=10)
    console.print(top_k_table(answer, rated_highly(x, 0), user))
    _print_access(console, admin)


def _stay_up(console: Any, group: Any, admin: Any) -> None:
    """--keep-running: the federation (paused) and the dashboard stay up until Ctrl-C or a process dies."""
    from fedmask.console import print_command

    console.print("[bold]--keep-running[/bold]: the federation stays up, paused; resume its rounds "
                  "from the dashboard or with:")
    print_command(console, admin.curl_resume())
    # the last line: a caller waiting for the demo to be up reads it
    console.print("the federation and the dashboard stay up; Ctrl-C stops them")
    while True:
        group.check_alive()
        time.sleep(1.0)


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
    from fedmask.bench.loopback_federation import exact_aggregate

    exact = exact_aggregate(r, state_dirs)
    return (f"[green]round {r.number} committed[/green] in {total:.1f} s: model v{version}, "
            f"{int(r.metrics.get('contributors', 0))}/{r.cohort_size} devices in the sum, dropouts: {drops}"
            + (f", val HR@10 {hr:.3f} (secure totals)" if hr is not None else ", no metric totals (DP, D36)")
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
                 "per round and composed so far (the metric totals are outside it, D36; under DP with the "
                 "discrete Gaussian none are asked for); "
                 "'-' where a round's metrics were unavailable")
    return t
