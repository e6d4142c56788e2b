"""`fedmask privacy frontier`: test HR@10 against epsilon (models/sim/frontier.py, D95).

Layout of OUT (every finished run stays, so an interrupted frontier resumes):

    OUT/runs/no-dp/seed<S>/results.json              the baseline: the model's defaults, no DP
    OUT/runs/eps<E>/us<U>/seed<S>/results.json       one DP run: target epsilon E, update_scale U
    OUT/runs/.../checkpoints/                        with --checkpoint-every: the unfinished run's
                                                     checkpoints (D93), removed when it finishes
    OUT/frontier.json, OUT/frontier.md, OUT/frontier.png

A finished run is reused when its recorded config equals the one the frontier
would run (`models.sim.study.config_matches`: every setting and the resolved
hyperparameters; how it was checkpointed does not count); anything else is
run again. With --checkpoint-every K an interrupted run also resumes from its
last checkpoint, and ends bit for bit as an uninterrupted one would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the models package is imported lazily (the CLI's start-up time)
    from models.data.types import Interactions
    from models.sim.config import SimulationConfig
    from models.sim.frontier import FrontierRun, FrontierSpec

EXAMPLE = """\b
Example: ML-100K, epsilon 1 to 16 on seed 0, seeds 1 and 2 again at epsilon 8 and without DP:
  fedmask privacy frontier --out runs/frontier-ml100k --dataset ml-100k --repeat-seeds 1,2 --repeat-at 8
Interrupted? Run the same command again: finished runs are reused.
"""


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError as e:
        raise ValueError(f"{what} must be comma-separated numbers, not {text!r}") from e


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError as e:
        raise ValueError(f"{what} must be comma-separated whole numbers, not {text!r}") from e


def frontier_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Frontier folder (created; reused to resume).")],
    dataset: Annotated[str, typer.Option(help="Dataset name under --data-dir, a folder or .csv, or 'synthetic'.")
                       ] = "ml-100k",
    epsilons: Annotated[str, typer.Option(help="Target epsilons over the run, comma-separated.")] = "1,2,4,8,16",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the whole grid (and of the tuning).")] = 0,
    repeat_seeds: Annotated[str, typer.Option(help="More seeds, run at --repeat-at and without DP, e.g. 1,2.")] = "",
    repeat_at: Annotated[str, typer.Option(help="Target epsilons the repeat seeds run at, e.g. 8.")] = "",
    update_scales: Annotated[str, typer.Option(help="Candidate update_scale values (FedRAP's unit of the clip), the "
                                               "tuning budget: each epsilon keeps the best on validation.")] = "35,70",
    clip: Annotated[float, typer.Option(help="L2 clip tau of every update, in the sent unit.")] = 0.1,
    rounds: Annotated[int | None, typer.Option(min=1, help="Rounds (default: FedRAP's tuned number).",
                                               show_default=False)] = None,
    delta: Annotated[float | None, typer.Option(help="Delta (default: 1 / n^1.1 for n devices).",
                                                show_default=False)] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads of each run.")] = 1,
    jobs: Annotated[int, typer.Option(min=1, help="Runs side by side, each in its own process (quiet); "
                                      "jobs x threads should not exceed the free cores.")] = 1,
    checkpoint_every: Annotated[int | None, typer.Option(
        min=1, help="Checkpoint each run every K rounds, so that an interrupted run resumes there (long runs).",
        show_default=False)] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="FEDMASK_DATA_DIR",
                                                  help="Folder holding the datasets (default: ./data).",
                                                  show_default=False)] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", help="A FedRAP option every run takes, baseline included, as KEY=VALUE (repeatable), e.g. "
        "kernel=compiled: the same model in compiled loops, faster on a CPU. Not update_scale: it is tuned.",
        show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
) -> None:
    """What privacy costs FedRAP: test HR@10 (sampled and full ranking) against epsilon.

    For every target epsilon the planner's noise multiplier (every device in every round, no amplification by sampling) is run with distributed discrete-Gaussian noise, the released sum computed without masks (--unmasked-sum: the same sum and the same epsilon as the secure round). Each candidate update_scale runs on --seed and the best validation HR@10 is kept; the tuning's own privacy cost is not counted. The repeat seeds then run at --repeat-at with the chosen candidate, and the no-DP baseline (the defaults) on every seed. Writes OUT/frontier.json, frontier.md and frontier.png; the epsilon shown is the ledger's.
    """
    from fedmask.console import err as stderr_console
    from models.sim.frontier import FrontierSpec

    err = stderr_console()
    try:
        eps = _floats(epsilons, "--epsilons")
        spec_args: dict[str, Any] = dict(
            epsilons=eps, seed=seed, repeat_seeds=_ints(repeat_seeds, "--repeat-seeds"),
            repeat_at=_floats(repeat_at, "--repeat-at"), update_scales=_floats(update_scales, "--update-scales"),
            clip=clip, delta=delta)
        FrontierSpec(dataset=dataset, population=2, update_dim=1, rounds=1, **spec_args)  # the options, before data
        shared = shared_params(param or [])
        table = run_frontier(out=out, dataset=dataset, rounds=rounds, spec_args=spec_args, threads=threads,
                             jobs=jobs, data_dir=None if data_dir is None else str(data_dir), quiet=quiet,
                             log=err.print, checkpoint_every=checkpoint_every, params=shared)
    except ValueError as e:  # ConfigError and PlanError are ValueErrors
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    print(table)
    print(f"  {out / 'frontier.json'}\n  {out / 'frontier.md'}\n  {out / 'frontier.png'}")


def shared_params(items: list[str]) -> dict[str, Any]:
    """--param KEY=VALUE items as `fedmask simulate` reads them (ValueError
    for a malformed one, an unknown FedRAP option, or update_scale, which the
    frontier tunes itself)."""
    from fedmask.commands.simulate import parse_params

    params = parse_params(items)
    if "update_scale" in params:
        raise ValueError("--param update_scale: the frontier tunes it (--update-scales)")
    return params


def run_frontier(*, out: Path, dataset: str, rounds: int | None, spec_args: dict[str, Any], threads: int, jobs: int,
                 data_dir: str | None, quiet: bool, log: Callable[[str], None],
                 checkpoint_every: int | None = None, params: dict[str, Any] | None = None) -> str:
    """Run (or reuse) every run of the grid, then write the summary; returns the markdown table.
    `params`: FedRAP options every run takes (`shared_params`)."""
    from models.data.entry import load_interactions
    from models.registry import build_model, default_rounds
    from models.sim.frontier import (FrontierRun, FrontierSpec, choose, markdown_table, noise_for, plot_frontier,
                                     repeat_runs, summarise, tuning_runs)
    from models.sim.results import save_json

    data = load_interactions(dataset, data_dir, spec_args["seed"])
    model = build_model("fedrap", explicit=False, n_users=data.n_users, n_items=data.n_items,
                        item_features=data.item_features, overrides=params or {})  # an unknown option fails here
    spec = FrontierSpec(dataset=dataset, population=data.n_users, update_dim=model.update_dim,
                        rounds=rounds or default_rounds("fedrap", False), **spec_args)
    noise = {e: noise_for(spec, e) for e in spec.epsilons}
    log(f"frontier of {dataset}: {spec.population} devices, {spec.rounds} rounds, delta {spec.run_delta:.3g}; "
        + ", ".join(f"epsilon {e:g}: z {z:.2f}" for e, z in noise.items()))
    runner = _Runner(out=out, dataset=dataset, data=data, spec=spec, noise=noise, threads=threads, jobs=jobs,
                     data_dir=data_dir, quiet=quiet, log=log, checkpoint_every=checkpoint_every, params=params)
    runner.run_all(tuning_runs(spec))
    chosen = {e: choose({u: runner.done[FrontierRun(e, u, spec.seed)] for u in spec.update_scales})
              for e in spec.epsilons}
    log("chosen on validation: " + ", ".join(f"epsilon {e:g}: update_scale {u:g}" for e, u in chosen.items()))
    runner.run_all(repeat_runs(spec, chosen))
    frontier = summarise(spec, noise, chosen, runner.done)
    save_json(frontier, out / "frontier.json")
    plot_frontier([frontier], out / "frontier.png")
    table = markdown_table(frontier)
    (out / "frontier.md").write_text(table)
    return table


class _Runner:
    """Runs a grid's simulate jobs into OUT/runs, reusing the finished ones that match; with jobs > 1 in
    that many worker processes (each run quiet, one line per run started and finished)."""

    def __init__(self, *, out: Path, dataset: str, data: Interactions, spec: FrontierSpec, noise: dict[float, float],
                 threads: int, jobs: int, data_dir: str | None, quiet: bool, log: Callable[[str], None],
                 checkpoint_every: int | None = None, params: dict[str, Any] | None = None) -> None:
        self.out, self.dataset, self.data, self.spec, self.noise = out, dataset, data, spec, noise
        self.threads, self.jobs, self.data_dir, self.quiet, self.log = threads, jobs, data_dir, quiet, log
        self.checkpoint_every = checkpoint_every
        self.params = dict(params or {})
        self.done: dict[FrontierRun, dict[str, Any]] = {}

    def config(self, run: FrontierRun) -> SimulationConfig:
        """The baseline: the defaults (and the shared params); a DP run: the epsilon's z, the clip,
        distributed noise, unmasked sum, and its update_scale."""
        from models.sim.engine import SimulationConfig

        dp = run.epsilon is not None and run.update_scale is not None
        return SimulationConfig(
            model="fedrap", dataset=self.dataset, seed=run.seed, rounds=self.spec.rounds, threads=self.threads,
            data_dir=self.data_dir, dp_noise=self.noise[run.epsilon] if run.epsilon is not None else None,
            dp_clip=self.spec.clip if dp else None, dp_delta=self.spec.run_delta if dp else 1e-5,
            dp_mode="distributed" if dp else "local", unmasked_sum=dp,
            params={**self.params, "update_scale": run.update_scale} if dp else dict(self.params),
            checkpoint_every=self.checkpoint_every,
            checkpoint_dir=None if self.checkpoint_every is None else str(self.out / "runs" / run.folder / "checkpoints"))

    def _reused(self, run: FrontierRun) -> bool:
        """Whether OUT holds this run finished with the config asked for (then it is loaded)."""
        from fedmask.commands.study import read_json_object
        from models.registry import build_model
        from models.sim.study import config_matches

        cfg = self.config(run)
        old = read_json_object(self.out / "runs" / run.folder / "results.json")
        if old is None:
            return False
        # the resolved hyperparameters depend on the overrides, not on the seed: the data loaded once will do
        resolved = build_model("fedrap", explicit=False, n_users=self.data.n_users, n_items=self.data.n_items,
                               item_features=self.data.item_features, overrides=cfg.params).config()
        if not config_matches(old, asdict(cfg), self.spec.rounds, model_config=resolved):
            return False
        self.done[run] = old
        return True

    def run_all(self, runs: list[FrontierRun]) -> None:
        """Every run of `runs` finished in OUT and loaded into `done`."""
        todo = []
        for run in runs:
            if self._reused(run):
                self.log(f"{run.folder}: reusing {self.out / 'runs' / run.folder / 'results.json'}")
            else:
                todo.append(run)
        if self.jobs == 1:
            for i, run in enumerate(todo, 1):
                self.log(f"{run.folder}: simulating ({self._what(run)}; {i}/{len(todo)})")
                simulate_into(asdict(self.config(run)), str(self.out / "runs" / run.folder), quiet=self.quiet)
                self._load(run)
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from multiprocessing import get_context

        with ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(simulate_into, asdict(self.config(r)), str(self.out / "runs" / r.folder),
                                   quiet=True): r for r in todo}
            self.log(f"{len(todo)} runs in {self.jobs} processes: " + ", ".join(r.folder for r in todo))
            for i, future in enumerate(as_completed(pending), 1):
                run = pending[future]
                seconds = future.result()
                self._load(run)
                self.log(f"{run.folder}: done in {seconds:.0f} s ({self._what(run)}; {i}/{len(todo)})")

    def _what(self, run: FrontierRun) -> str:
        return "no DP" if run.epsilon is None else f"z {self.noise[run.epsilon]:.2f}"

    def _load(self, run: FrontierRun) -> None:
        self.done[run] = json.loads((self.out / "runs" / run.folder / "results.json").read_text())


def simulate_into(config: dict[str, Any], folder: str, *, quiet: bool) -> float:
    """One `fedmask simulate` run from its config (a SimulationConfig as a dict) into `folder`; its seconds.
    Its checkpoints, if any, are removed once its results are written. Top level, so that a worker
    process can run it."""
    import shutil
    import time

    from fedmask.commands.sim_progress import SimulationProgress
    from models.sim.engine import SimulationConfig, simulate, write_results

    start = time.monotonic()
    cfg = SimulationConfig(**config)
    with SimulationProgress(cfg.model, quiet=quiet) as events:
        res = simulate(cfg, events=events)
    write_results(res, Path(folder))
    if cfg.checkpoint_dir is not None:
        shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    return time.monotonic() - start


PLOT_EXAMPLE = """\b
Example: two datasets' frontiers on one figure:
  fedmask privacy frontier-plot runs/frontier-ml-latest-small/frontier.json runs/frontier-ml1m/frontier.json --out frontier.png
"""


def frontier_plot_command(
    frontiers: Annotated[list[Path], typer.Argument(help="frontier.json files written by `fedmask privacy frontier`.",
                                                    show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="The PNG to write.")],
) -> None:
    """Several frontiers on one figure: test HR@10 (sampled and full ranking) against the ledger's epsilon, one colour
    a dataset, its no-DP baseline dashed."""
    from fedmask.commands.study import read_json_object
    from fedmask.console import err as stderr_console
    from models.sim.frontier import plot_frontier

    err = stderr_console()
    loaded = []
    for path in frontiers:
        data = read_json_object(path)
        if data is None or not isinstance(data.get("rows"), list) or not isinstance(data.get("baseline"), dict):
            err.print(f"[red]error:[/red] {path} is not a frontier.json of `fedmask privacy frontier`")
            raise typer.Exit(2)
        loaded.append(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        print(f"  {plot_frontier(loaded, out)}")
    except (KeyError, TypeError) as e:  # a row without the fields the summary writes
        err.print(f"[red]error:[/red] a frontier.json lacks a field of `fedmask privacy frontier`'s summary: {e}")
        raise typer.Exit(2) from e

