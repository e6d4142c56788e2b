"""`fedmask data ...` and `fedmask reference`; `fedmask simulate` is attached from
fedmask/commands/simulate.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedmask.commands.dataset_options import DataDirOption, DatasetOption
from fedmask.commands.simulate import register_simulate


def register(app: typer.Typer) -> None:
    """Attach the model-side subcommands to the root app."""
    register_data(app)
    register_simulate(app)
    register_reference(app)


# ====================================================================== data


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


# ================================================================= reference


def register_reference(app: typer.Typer) -> None:
    """`fedmask reference`: centralised yardsticks on the same split (models/reference.py)."""

    @app.command("reference")
    def reference(
        dataset: DatasetOption = "ml-100k",
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
