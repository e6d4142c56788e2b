"""`fedmask data ...`, `fedmask simulate` and `fedmask reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    """Attach the model-side subcommands to the root app."""
    register_data(app)
    register_simulate(app)
    register_reference(app)


# ====================================================================== data

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="FEDMASK_DATA_DIR",
        help="Folder holding the datasets (default: ./data).",
        show_default=False,
    ),
]


def register_data(app: typer.Typer) -> None:
    """`fedmask data fetch NAME` and `fedmask data info NAME_OR_PATH`."""
    data_app = typer.Typer(help="Datasets: fetch and inspect.", no_args_is_help=True)

    @data_app.command("fetch")
    def fetch(
        name: Annotated[str, typer.Argument(help="Dataset to fetch: ml-100k, ml-latest-small, ml-1m or lastfm.")],
        data_dir: DataDirOption = None,
        force: Annotated[bool, typer.Option(help="Download again even if the files are valid.")] = False,
        base_url: Annotated[
            str | None,
            typer.Option(
                envvar="FEDMASK_DATA_BASE_URL",
                help="Fetch the archive from BASE_URL/<archive file name> instead of its official address "
                "(a mirror); its pinned sha256 still applies. Not for ml-100k (pip: use PIP_INDEX_URL).",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Download a public dataset (hash-pinned) into DATA_DIR/NAME.

        ml-100k: the recbole 1.2.1 wheel from PyPI (pip download, never installed).

        ml-latest-small: the lenskit 2025.8.1 source distribution from PyPI.

        ml-1m, lastfm: GroupLens' official archives (files.grouplens.org).
        """
        from fedmask import console as cli_console

        from models.data.fetch import FetchError, fetch_dataset

        console = cli_console.err()
        try:
            with console.status(f"[bold]fetching {name}[/bold]") as status:

                def progress(msg: str) -> None:
                    status.update(f"[bold]{name}[/bold]: {msg}")

                result = fetch_dataset(name, data_dir, progress=progress, force=force, base_url=base_url)
        except FetchError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from e
        state = "downloaded and verified" if result.downloaded else "already present, hashes verified"
        console.print(f"[green]✓[/green] {result.name}: {state} in {result.directory}")
        for p in result.files:
            console.print(f"  {p}")

    @data_app.command("info")
    def info(
        name: Annotated[str, typer.Argument(help="Dataset name (ml-100k), a folder or a .csv file.")],
        data_dir: DataDirOption = None,
    ) -> None:
        """Load a dataset and print its size and side features."""
        from fedmask import console as cli_console

        from models.data.errors import DataFormatError, DatasetNotFoundError
        from models.data.fetch import resolve_data_dir
        from models.data.loaders import load_dataset

        console = cli_console.out()
        try:
            d = load_dataset(name, resolve_data_dir(data_dir))
        except (DataFormatError, DatasetNotFoundError) as e:
            cli_console.err().print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from e
        console.print(
            f"{d.name}: {d.n_users} users, {d.n_items} items, {len(d.user)} interactions, "
            f"ratings {float(d.rating.min()):g}..{float(d.rating.max()):g}"
        )
        uf = 0 if d.user_features is None else d.user_features.shape[1]
        itf = 0 if d.item_features is None else d.item_features.shape[1]
        console.print(f"user features: {uf}, item features: {itf}")

    app.add_typer(data_app, name="data")


# ====================================================================== simulate


def _parse_params(items: list[str]) -> dict[str, object]:
    """`--param key=value` pairs; values parsed as JSON when they can be (numbers, true/false)."""
    import json

    out: dict[str, object] = {}
    for it in items:
        if "=" not in it:
            raise typer.BadParameter(f"expected KEY=VALUE, got {it!r}", param_hint="--param")
        key, raw = it.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def _parse_neighbors(value: str | None) -> int | str | None:
    if value is None or value in ("auto", "all"):
        return value
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"expected an even integer, 'all' or 'auto', got {value!r}") from None


def register_simulate(app: typer.Typer) -> None:
    """`fedmask simulate`: a whole federation in one process (models/sim/engine.py)."""

    @app.command("simulate")
    def simulate(
        model: Annotated[
            str,
            typer.Option(
                "--model",
                "-m",
                help="fedrap | fedmmf | pfedrec | fedmf (device level); freib | central-mf (platform level, "
                "see --platforms).",
                show_default=False,
            ),
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Output folder for results.json and metrics.png.")],
        dataset: Annotated[
            str, typer.Option(help="Dataset name under --data-dir (ml-100k), a folder or .csv, or 'synthetic'.")
        ] = "ml-100k",
        seed: Annotated[int, typer.Option(help="Seed of the split, the initialisation, the cohorts and the noise.")] = 0,
        rounds: Annotated[
            int | None, typer.Option(help="Federated rounds (default: the model's tuned number).", show_default=False)
        ] = None,
        clients_per_round: Annotated[
            int | None,
            typer.Option(help="Devices per round, drawn uniformly (default: every device every round).", show_default=False),
        ] = None,
        secagg: Annotated[
            bool, typer.Option("--secagg/--no-secagg", help="Aggregate through the real SecAgg+ protocol, in process.")
        ] = False,
        secagg_neighbors: Annotated[
            str | None,
            typer.Option(
                help="SecAgg+ graph degree (even int) or 'all' for the complete graph (default: 'auto', "
                "the secagg package's SecAgg+ choice for the cohort size).",
                show_default=False,
            ),
        ] = None,
        secagg_clip: Annotated[
            float | None,
            typer.Option(
                help="SecAgg fixed-point range [-c, c] of every coordinate (default: tau*(1+6z) with DP, else 32).",
                show_default=False,
            ),
        ] = None,
        dp_noise: Annotated[
            float | None,
            typer.Option(help="DP noise multiplier z (noise std z * tau per coordinate). Needs --dp-clip.", show_default=False),
        ] = None,
        dp_clip: Annotated[
            float | None, typer.Option(help="DP clipping norm tau of every device's update. FedRAP sends (C_i - C) / update_scale, so tau is in that unit: -p update_scale=70 is the validation-tuned unit for tau 0.1, z 1 with --dp-mode distributed (docs/tuning.md).", show_default=False)
        ] = None,
        dp_delta: Annotated[float, typer.Option(help="delta of the reported (epsilon, delta).")] = 1e-5,
        dp_accountant: Annotated[str, typer.Option(help="Privacy accountant: rdp or pld (dp-accounting).")] = "rdp",
        dp_mode: Annotated[
            str,
            typer.Option(
                help="local: every device adds N(0, (z tau)^2); distributed: N(0, (z tau)^2 / B) each, so only "
                "the sum carries the full noise (needs --secagg)."
            ),
        ] = "local",
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        explicit: Annotated[
            bool, typer.Option("--explicit", help="Explicit ratings (fedmf only; fedmmf is always explicit): MSE, RMSE/MAE.")
        ] = False,
        eval_every: Annotated[int, typer.Option(help="Evaluate on validation every E rounds (and after the last).")] = 1,
        full_val: Annotated[
            bool, typer.Option("--full-val", help="Also rank all items on validation every evaluation (slower).")
        ] = False,
        threads: Annotated[int, typer.Option(help="torch CPU threads.")] = 2,
        data_dir: Annotated[
            Path | None,
            typer.Option("--data-dir", envvar="FEDMASK_DATA_DIR", help="Folder holding the datasets (default: ./data).", show_default=False),
        ] = None,
        param: Annotated[
            list[str] | None,
            typer.Option(
                "--param",
                "-p",
                help="Override a model hyperparameter, KEY=VALUE (repeatable), e.g. -p k=16 -p lr_item=0.3.",
                show_default=False,
            ),
        ] = None,
        users: Annotated[
            str | None,
            typer.Option(
                help="Simulate only these devices, as an edge client's --users (1-based user numbers, e.g. 1-30); "
                "default: every user of the dataset. Metrics are over these devices.",
                show_default=False,
            ),
        ] = None,
        save_global: Annotated[
            Path | None,
            typer.Option(
                help="Write the final global model (after the last round) to this .npz file, one float32 array "
                "per parameter (e.g. FedRAP's C), to compare with a federation's committed version.",
                show_default=False,
            ),
        ] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
        plaintext_j_bound: Annotated[
            float | None,
            typer.Option(
                help="FedMMF hybrid rounds, UNPROTECTED updates: a device whose privacy indicator J (the mean "
                "squared residual of its personalised mask on its own ratings) is at most this sends its "
                "item-factor update in plaintext; the others go through the secure sum (--secagg) and the "
                "round sums both. Off by default; not with --dp-mode distributed. See docs/decisions.md D64.",
                show_default=False,
            ),
        ] = None,
        memory_gb: Annotated[
            float | None,
            typer.Option(
                help="Memory budget in GiB (default: 90 % of the memory available at the start). The footprint "
                "is estimated and printed before training; a round's cohort is then trained in chunks and the "
                "private state kept in memory-mapped files when needed, or the run refuses with the size it needs.",
                show_default=False,
            ),
        ] = None,
        cohort_chunk: Annotated[
            int | None,
            typer.Option(
                help="Train at most N devices per batched call (default: the most the budget allows). Changes "
                "nothing but memory and speed (float32 summation order).",
                show_default=False,
            ),
        ] = None,
        private_state: Annotated[
            str,
            typer.Option(help="Where the devices' private state lives: auto (RAM if it fits), memory or disk."),
        ] = "auto",
        state_dir: Annotated[
            Path | None,
            typer.Option(
                help="Folder for the memory-mapped private state (default: the temporary directory); removed "
                "at the end.",
                show_default=False,
            ),
        ] = None,
        platforms: Annotated[
            int | None,
            typer.Option(
                help="Platform-level federation (FREIB's setting): M platforms, each holding all ratings of its "
                "users, made by Dirichlet label skew. Implied by --model freib (default 5 there) and "
                "--model central-mf; with fedmf or pfedrec it runs them on the same platforms (explicit ratings).",
                show_default=False,
            ),
        ] = None,
        dirichlet_beta: Annotated[
            float, typer.Option(help="Dirichlet parameter beta of the platform split (smaller = more label skew).")
        ] = 1.0,
        ablate: Annotated[
            list[str] | None,
            typer.Option(
                help="FREIB ablation, repeatable: bias (no item-bias encoder, no prototypes), guidance (no global "
                "knowledge guidance), prototypes (no prototype alignment).",
                show_default=False,
            ),
        ] = None,
        ldp_scale: Annotated[
            float | None,
            typer.Option(
                help="Platform level: the FREIB paper's Laplace local DP, noise Laplace(0, LAMBDA) on every "
                "uploaded coordinate. Needs --ldp-clip.",
                show_default=False,
            ),
        ] = None,
        ldp_clip: Annotated[
            float | None,
            typer.Option(
                help="Platform level: L1 bound C of every upload before the Laplace noise; epsilon per release "
                "= 2C / LAMBDA (printed; separate from the Gaussian --dp-* ledger).",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Simulate a federation and write OUT/results.json and OUT/metrics.png.

        Every round: pick a cohort, train it locally (batched), optionally clip and noise the updates (DP) and aggregate them (mean, or SecAgg+), evaluate on validation. The best validation round is kept and tested once at the end. The defaults of each model are its tuned ones (docs/tuning.md).
        """
        from fedmask import console as cli_console

        from fedmask.commands.sim_progress import SimulationProgress
        from models.registry import ConfigError
        from models.sim.engine import MemorySettings, SimulationConfig, simulate as run_simulation, write_results
        from models.sim.memory import PrivatePlacement

        err = cli_console.err()
        if platforms is not None or model in ("freib", "central-mf"):
            _simulate_platforms(
                model=model, out=out, dataset=dataset, seed=seed, rounds=rounds, platforms=platforms,
                beta=dirichlet_beta, ablate=tuple(ablate or ()), secagg=secagg, secagg_clip=secagg_clip,
                ldp_scale=ldp_scale, ldp_clip=ldp_clip, eval_every=eval_every, data_dir=data_dir,
                params=_parse_params(param or []), quiet=quiet, save_global=save_global, device=device, unsupported={
                    "--clients-per-round": clients_per_round, "--dp-noise": dp_noise, "--dp-clip": dp_clip,
                    "--users": users, "--secagg-neighbors": secagg_neighbors,
                    "--plaintext-j-bound": plaintext_j_bound,
                },
            )  # fmt: skip
            return
        if ablate or ldp_scale is not None or ldp_clip is not None:
            err.print("[red]error:[/red] --ablate and --ldp-* are for the platform level (--model freib or --platforms M)")
            raise typer.Exit(2)
        population = None
        if users is not None:
            from edge_client.users import UserRangeError, parse_user_ranges

            try:
                population = tuple(parse_user_ranges(users))
            except UserRangeError as e:
                err.print(f"[red]error:[/red] {e}")
                raise typer.Exit(2) from e
        try:
            cfg = SimulationConfig(
                model=model,
                dataset=dataset,
                seed=seed,
                rounds=rounds,
                clients_per_round=clients_per_round,
                secagg=secagg,
                secagg_neighbors=_parse_neighbors(secagg_neighbors),
                secagg_clip=secagg_clip,
                dp_noise=dp_noise,
                dp_clip=dp_clip,
                dp_delta=dp_delta,
                dp_accountant=dp_accountant,
                dp_mode=dp_mode,
                device=device,
                explicit=explicit,
                eval_every=eval_every,
                full_val=full_val,
                threads=threads,
                data_dir=None if data_dir is None else str(data_dir),
                params=_parse_params(param or []),
                users=population,
                save_global=None if save_global is None else str(save_global),
                plaintext_j_bound=plaintext_j_bound,
            )
            placements: dict[str, PrivatePlacement] = {"auto": "auto", "memory": "memory", "disk": "disk"}
            if private_state not in placements:
                raise ConfigError(f"--private-state must be auto, memory or disk, not {private_state!r}")
            mem = MemorySettings(
                budget_gb=memory_gb,
                cohort_chunk=cohort_chunk,
                private=placements[private_state],
                state_dir=None if state_dir is None else str(state_dir),
            )
            with SimulationProgress(model, quiet=quiet) as events:
                results = run_simulation(cfg, memory=mem, events=events)
        except ConfigError as e:
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from e
        j, p = write_results(results, out)
        t = results["test"]
        if results["kind"] == "explicit":
            line = f"test rmse {t.get('rmse', float('nan')):.4f}  mae {t.get('mae', float('nan')):.4f}"
        else:
            line = (
                f"test hr@10 {t.get('hr@10', float('nan')):.4f}  ndcg@10 {t.get('ndcg@10', float('nan')):.4f}  "
                f"full hr@10 {t.get('full_hr@10', float('nan')):.4f}  placebo hr@10 "
                f"{results['placebo']['hr@10']:.4f}"
            )
        if "epsilon" in results:
            line += f"  epsilon {results['epsilon']:.3g} (delta {dp_delta:g})"
        line += _diverged(results)
        if "hybrid" in results:
            h = results["hybrid"]
            line += (f"  UNPROTECTED plaintext share {h['plaintext_share']:.3f} (J <= {h['plaintext_j_bound']:g}, "
                     f"{h['plaintext_contributions']} plaintext contributions)")
        cli_console.out().print(
            f"[green]done[/green] {results['model']} on {results['dataset']}: best round {results['best_round']}, "
            f"{line}, {results['seconds_total']:.1f} s\n  {j}\n  {p}"
            + (f"\n  {results['saved_global']}" if "saved_global" in results else "")
        )


def _diverged(results: dict[str, Any]) -> str:
    """The done line's warning for a run that stopped at a diverged round ('' otherwise)."""
    r = results.get("diverged_at_round")
    return "" if r is None else f"  [red]DIVERGED at round {r}[/red] (stopped there)"


def _simulate_platforms(
    *,
    model: str,
    out: Path,
    dataset: str,
    seed: int,
    rounds: int | None,
    platforms: int | None,
    beta: float,
    ablate: tuple[str, ...],
    secagg: bool,
    secagg_clip: float | None,
    ldp_scale: float | None,
    ldp_clip: float | None,
    eval_every: int,
    data_dir: Path | None,
    params: dict[str, object],
    quiet: bool,
    unsupported: dict[str, object],
    save_global: Path | None = None,
    device: str = "cpu",
) -> None:
    """`fedmask simulate` at the platform level (models/sim/platform_runner.py)."""
    from fedmask import console as cli_console

    from models.sim.engine import write_results
    from fedmask.commands.sim_progress import SimulationProgress
    from models.sim.platform_runner import PlatformConfigError, PlatformSimConfig, run_platform_simulation

    err = cli_console.err()
    bad = [name for name, v in unsupported.items() if v is not None]
    if bad:
        err.print(f"[red]error:[/red] {', '.join(bad)} are device-level options; not available with platforms")
        raise typer.Exit(2)
    try:
        cfg = PlatformSimConfig(
            model=model, dataset=dataset, seed=seed, n_platforms=5 if platforms is None else platforms, beta=beta,
            rounds=rounds, ablate=ablate, secagg=secagg, secagg_clip=secagg_clip, ldp_scale=ldp_scale,
            ldp_clip=ldp_clip, eval_every=eval_every, data_dir=None if data_dir is None else str(data_dir),
            params=params, save_global=None if save_global is None else str(save_global), device=device,
        )  # fmt: skip
        with SimulationProgress(model, quiet=quiet) as events:
            results = run_platform_simulation(cfg, events=events)
    except PlatformConfigError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    j, p = write_results(results, out)
    t = results["test"]
    line = f"test rmse {t['rmse']:.4f}  mae {t['mae']:.4f}"
    if "ldp" in results:
        d = results["ldp"]
        line += (
            f"  Laplace LDP: epsilon {d['epsilon_per_release']:.4g} per release (lambda {d['scale_lambda']:g}, "
            f"L1 clip {d['l1_clip']:g}), {d['epsilon_total_basic_composition']:.4g} over {d['releases_per_platform']}"
        )
    line += _diverged(results)
    cli_console.out().print(
        f"[green]done[/green] {results['model']} on {results['dataset']}, {results['n_platforms']} platforms, "
        f"beta {results['dirichlet_beta']:g}: best round {results['best_round']}, {line}, "
        f"{results['seconds_total']:.1f} s\n  {j}\n  {p}"
    )


# ================================================================= reference


def register_reference(app: typer.Typer) -> None:
    """`fedmask reference`: centralised yardsticks on the same split (models/reference.py)."""

    @app.command("reference")
    def reference(
        dataset: Annotated[
            str, typer.Option(help="Dataset name under --data-dir (ml-100k), a folder or .csv, or 'synthetic'.")
        ] = "ml-100k",
        seed: Annotated[int, typer.Option(help="Seed of the split (the same split `simulate --seed` uses).")] = 0,
        model: Annotated[
            list[str] | None,
            typer.Option(
                "--model",
                "-m",
                help="popularity | itemknn | ease | ease-recency (repeatable; default: all).",
                show_default=False,
            ),
        ] = None,
        out: Annotated[
            Path | None,
            typer.Option("--out", "-o", help="Also write OUT/reference.json.", show_default=False),
        ] = None,
        data_dir: DataDirOption = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
        progress_every: Annotated[
            float,
            typer.Option(
                help="When stderr is not a terminal (a log file), print a plain progress line at most "
                "every this many seconds (on a terminal a progress bar is shown instead)."
            ),
        ] = 30.0,
        threads: Annotated[
            int,
            typer.Option(
                min=1,
                help="BLAS/LAPACK and torch threads. 1 by default: on cores shared with other jobs, "
                "multithreaded BLAS waits on busy cores and runs several times slower (docs/decisions.md D55).",
            ),
        ] = 1,
    ) -> None:
        """What centralised models reach under the sound protocol, to judge federated figures by.

        Each reference model sees all training data at once (nothing is federated or private). Its hyperparameters are chosen on validation HR@10 from a fixed grid; the test metrics and the placebo are computed once for that choice, on exactly the split, negatives and ranking `fedmask simulate --seed` uses. ease-recency also weighs each user's recent items more, the only one that uses the order of interactions.
        """
        import json

        from fedmask import console as cli_console
        from rich.table import Table

        from models.data.types import ImplicitSplit
        from models.data.entry import load_interactions, make_split
        from models.registry import ConfigError
        from models.sim.progress import Progress
        from models.reference import ReferenceContext, blas_threads, reference_names, run_references, run_steps

        err = cli_console.err()
        try:
            split = make_split(load_interactions(dataset, None if data_dir is None else str(data_dir), seed), False, seed)
            names = model or None
            unknown = set(names or ()) - set(reference_names())
            if unknown:
                raise ValueError(f"unknown reference model(s) {sorted(unknown)}; known: {', '.join(reference_names())}")
            if not isinstance(split, ImplicitSplit):  # make_split(..., explicit=False) is implicit
                raise ValueError("reference models need an implicit (leave-one-out) split")
            with Progress(
                f"references on {dataset}", run_steps(names), unit="steps", mode="off" if quiet else "auto", interval=progress_every
            ) as bar, blas_threads(threads):
                ctx = ReferenceContext(split, bar)
                results = run_references(split, names, context=ctx)
        except (ConfigError, ValueError) as e:
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from e
        table = Table(title=f"centralised references on {dataset}, seed {seed} (HR@10, 99 sampled negatives)")
        for col in ("model", "chosen on validation", "val", "test", "test full-rank", "placebo"):
            table.add_column(col)
        for r in results:
            params = ", ".join(f"{k}={v:g}" for k, v in r["params"].items()) or "-"
            table.add_row(
                r["name"],
                params,
                f"{r['val']['hr@10']:.3f}",
                f"{r['test']['hr@10']:.3f}",
                f"{r['test']['full_hr@10']:.3f}",
                f"{r['placebo']['hr@10']:.3f}",
            )
        cli_console.out().print(table)
        cli_console.out().print(
            f"wall seconds ({threads} BLAS thread{'s' if threads > 1 else ''}): "
            + ", ".join(f"{k} {v:.1f}" for k, v in ctx.timings.items())
        )
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / "reference.json"
            path.write_text(json.dumps({"dataset": dataset, "seed": seed, "models": results}, indent=2))
            cli_console.out().print(f"  {path}")
