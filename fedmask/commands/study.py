"""`fedmask study`: `fedmask simulate` for every model and `fedmask reference`, over seeds.

Layout of OUT (every file a run writes stays, so a study resumes where it stopped):

    OUT/runs/<model>/seed<S>/results.json, metrics.png   one simulate run each
    OUT/references/seed<S>/reference.json                one reference run per seed
    OUT/study.json, OUT/study.png, OUT/study.md           the aggregate (models/sim/study.py)

A finished run is reused when its recorded config equals the one the study would
run (models/sim/study.py `config_matches`); a reference.json when it has the same
dataset and seed and every wanted reference model. Anything else is run again.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; distinct non-negative integers, in the given order."""
    try:
        seeds = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as e:
        raise ValueError(f"--seeds must be comma-separated integers, not {text!r}") from e
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct non-negative integers, not {text!r}")
    return seeds


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [p.strip() for p in text.split(",") if p.strip()]


def read_json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def register(app: typer.Typer) -> None:
    @app.command("study")
    def study(
        out: Annotated[Path, typer.Option("--out", "-o", help="Study folder (created; reused to resume).")],
        dataset: Annotated[
            str, typer.Option(help="Dataset name under --data-dir (ml-100k), a folder or .csv, or 'synthetic'.")
        ] = "ml-100k",
        seeds: Annotated[str, typer.Option(help="Comma-separated seeds, e.g. 0,1,2.")] = "0,1,2",
        models: Annotated[
            str | None,
            typer.Option(
                help="Comma-separated subset of fedrap, pfedrec, fedmf, fedmf-explicit, fedmmf (default: all "
                "that the dataset allows; the explicit two need ratings).",
                show_default=False,
            ),
        ] = None,
        references: Annotated[
            str | None,
            typer.Option(
                help="Comma-separated reference models of `fedmask reference` (default: all; 'none' for none).",
                show_default=False,
            ),
        ] = None,
        rounds: Annotated[
            int | None,
            typer.Option(min=1, help="Rounds of every model (default: each model's tuned number).", show_default=False),
        ] = None,
        threads: Annotated[int, typer.Option(min=1, help="torch CPU threads of the simulations.")] = 2,
        reference_threads: Annotated[int, typer.Option(min=1, help="BLAS threads of the references (D55).")] = 1,
        data_dir: Annotated[
            Path | None,
            typer.Option("--data-dir", envvar="FEDMASK_DATA_DIR", help="Folder holding the datasets (default: ./data).",
                         show_default=False),
        ] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    ) -> None:
        """Every model over the seeds against the centralised yardsticks: OUT/study.json, study.png, study.md.

        For each seed: `fedmask simulate` for every model (fedmf-explicit is fedmf --explicit) and `fedmask reference` on the same split, then the mean and the sample standard deviation over the seeds of test HR@10, NDCG@10, full-ranking HR@10 and placebo HR@10 (RMSE and MAE for the explicit models).
        """
        from fedmask.console import err as stderr_console

        err = stderr_console()
        try:
            seed_list = parse_seeds(seeds)
            study_json, table = _run_study(
                out=out, dataset=dataset, seeds=seed_list, models=_names(models), references=_names(references),
                rounds=rounds, threads=threads, reference_threads=reference_threads,
                data_dir=None if data_dir is None else str(data_dir), quiet=quiet, log=err.print,
            )  # fmt: skip
        except ValueError as e:  # models.registry.ConfigError is a ValueError
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from e
        print(table)
        print(f"  {study_json}\n  {out / 'study.png'}\n  {out / 'study.md'}")


def _run_study(
    *,
    out: Path,
    dataset: str,
    seeds: list[int],
    models: list[str] | None,
    references: list[str] | None,
    rounds: int | None,
    threads: int,
    reference_threads: int,
    data_dir: str | None,
    quiet: bool,
    log: Any,
) -> tuple[Path, str]:
    import numpy as np

    from fedmask.commands.sim_progress import SimulationProgress
    from models.data.entry import load_interactions, make_split
    from models.sim.engine import SimulationConfig, simulate, write_results
    from models.registry import build_model, default_rounds
    from models.sim.progress import Progress
    from models.reference import blas_threads, reference_names, run_references, run_steps
    from models.sim.results import save_json
    from models.sim.study import aggregate, config_matches, markdown_table, plot_study, study_runs

    ref_names = list(reference_names()) if references is None else ([] if references == ["none"] else references)
    unknown = set(ref_names) - set(reference_names())
    if unknown:
        raise ValueError(f"unknown reference model(s) {sorted(unknown)}; known: {', '.join(reference_names())}")
    runs_done: dict[str, dict[int, dict[str, Any]]] = {}
    refs_done: dict[int, dict[str, Any]] = {}
    runs = None
    for seed in seeds:
        data = load_interactions(dataset, data_dir, seed)
        if runs is None:
            runs = study_runs(bool(np.unique(data.rating).size > 1), models)
            log(f"study of {dataset}, seeds {seeds}: {', '.join(r.name for r in runs)}; references: "
                f"{', '.join(ref_names) or 'none'}")  # fmt: skip
        for run in runs:
            cfg = SimulationConfig(
                model=run.model, dataset=dataset, seed=seed, rounds=rounds, explicit=run.explicit and run.model != "fedmmf",
                threads=threads, data_dir=data_dir,
            )  # fmt: skip
            folder = out / "runs" / run.name / f"seed{seed}"
            old = read_json_object(folder / "results.json")
            if old is not None and config_matches(
                old, asdict(cfg), default_rounds(run.model, run.explicit),
                model_config=build_model(
                    run.model, explicit=run.explicit, n_users=data.n_users, n_items=data.n_items,
                    item_features=data.item_features,
                ).config(),
            ):  # fmt: skip
                log(f"{run.name} seed {seed}: reusing {folder / 'results.json'}")
                runs_done.setdefault(run.name, {})[seed] = old
                continue
            log(f"{run.name} seed {seed}: simulating")
            with SimulationProgress(run.model, quiet=quiet) as events:
                res = simulate(cfg, interactions=data, events=events)
            write_results(res, folder)
            runs_done.setdefault(run.name, {})[seed] = json.loads((folder / "results.json").read_text())
        if ref_names:
            folder = out / "references" / f"seed{seed}"
            old = read_json_object(folder / "reference.json")
            if (
                old is not None and old.get("dataset") == dataset and old.get("seed") == seed
                and set(ref_names) <= {m.get("name") for m in old.get("models", [])}
            ):  # fmt: skip
                log(f"references seed {seed}: reusing {folder / 'reference.json'}")
                refs_done[seed] = {**old, "models": [m for m in old["models"] if m["name"] in ref_names]}
                continue
            log(f"references seed {seed}: fitting {', '.join(ref_names)}")
            split = make_split(data, False, seed)
            with Progress(
                f"references on {dataset}, seed {seed}", run_steps(ref_names), unit="steps", mode="off" if quiet else "auto"
            ) as bar, blas_threads(reference_threads):
                results = run_references(split, ref_names, progress=bar)
            folder.mkdir(parents=True, exist_ok=True)
            save_json({"dataset": dataset, "seed": seed, "models": results}, folder / "reference.json")
            refs_done[seed] = {"dataset": dataset, "seed": seed, "models": results}
    study = aggregate(dataset, seeds, runs_done, refs_done)
    path = save_json(study, out / "study.json")
    plot_study(study, out / "study.png")
    table = markdown_table(study)
    (out / "study.md").write_text(table)
    return path, table
