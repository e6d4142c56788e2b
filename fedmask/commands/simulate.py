"""`fedmask simulate`: a whole federation in one process (models/sim/engine.py),
or at the platform level (models/sim/platform_runner.py). Its options are in
fedmask/commands/simulate_options.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from fedmask.commands.dataset_options import DataDirOption, DatasetOption
from fedmask.commands.sim_results import diverged_note, report_devices
from fedmask.commands.simulate_options import (
    AblateOption,
    CheckpointDirOption,
    CheckpointEveryOption,
    ClientsPerRoundOption,
    CohortChunkOption,
    DeviceOption,
    DirichletBetaOption,
    DpAccountantOption,
    DpClipOption,
    DpDeltaOption,
    DpMechanismOption,
    DpModeOption,
    DpNoiseOption,
    EvalEveryOption,
    ExplicitOption,
    FullValOption,
    GroupSizeOption,
    LdpClipOption,
    LdpScaleOption,
    MemoryGbOption,
    ModelOption,
    NprocOption,
    OutOption,
    ParamOption,
    PlaintextJBoundOption,
    PlanOnlyOption,
    PlatformsOption,
    PrivateStateOption,
    QuietOption,
    RoundsOption,
    SaveGlobalOption,
    SecAggClipOption,
    SecAggNeighborsOption,
    SecAggOption,
    SeedOption,
    StateDirOption,
    ThreadsOption,
    UnmaskedSumOption,
    UsersOption,
)

if TYPE_CHECKING:  # the models package is imported lazily (the CLI's start-up time)
    from models.sim.engine import MemorySettings, SimulationConfig


def register_simulate(app: typer.Typer) -> None:
    """Attach `fedmask simulate` to `app`."""
    app.command("simulate")(simulate)


def simulate(
    model: ModelOption,
    out: OutOption,
    dataset: DatasetOption = "ml-100k",
    seed: SeedOption = 0,
    rounds: RoundsOption = None,
    clients_per_round: ClientsPerRoundOption = None,
    secagg: SecAggOption = False,
    secagg_neighbors: SecAggNeighborsOption = None,
    secagg_clip: SecAggClipOption = None,
    group_size: GroupSizeOption = None,
    dp_noise: DpNoiseOption = None,
    dp_clip: DpClipOption = None,
    dp_delta: DpDeltaOption = 1e-5,
    dp_accountant: DpAccountantOption = "rdp",
    dp_mode: DpModeOption = "local",
    dp_mechanism: DpMechanismOption = "discrete-gaussian",
    unmasked_sum: UnmaskedSumOption = False,
    device: DeviceOption = "cpu",
    explicit: ExplicitOption = False,
    eval_every: EvalEveryOption = 1,
    full_val: FullValOption = False,
    threads: ThreadsOption = None,
    data_dir: DataDirOption = None,
    param: ParamOption = None,
    users: UsersOption = None,
    save_global: SaveGlobalOption = None,
    quiet: QuietOption = False,
    plaintext_j_bound: PlaintextJBoundOption = None,
    memory_gb: MemoryGbOption = None,
    cohort_chunk: CohortChunkOption = None,
    private_state: PrivateStateOption = "auto",
    state_dir: StateDirOption = None,
    platforms: PlatformsOption = None,
    dirichlet_beta: DirichletBetaOption = 1.0,
    ablate: AblateOption = None,
    ldp_scale: LdpScaleOption = None,
    ldp_clip: LdpClipOption = None,
    plan_only: PlanOnlyOption = False,
    nproc: NprocOption = None,
    checkpoint_every: CheckpointEveryOption = None,
    checkpoint_dir: CheckpointDirOption = None,
) -> None:
    """Simulate a federation and write OUT/results.json and OUT/metrics.png.

    Every round: pick a cohort, train it locally (batched), optionally clip and noise the updates (DP) and aggregate them (mean, or SecAgg+), evaluate on validation. The best validation round is kept and tested once at the end. The defaults of each model are its tuned ones (docs/tuning.md).
    """
    from fedmask.commands.sim_progress import SimulationProgress
    from models.registry import ConfigError
    from models.sim.engine import SimulationConfig, plan_simulation, simulate as run_simulation

    if platforms is not None or model in ("freib", "central-mf"):
        _simulate_platforms(
            model=model, out=out, dataset=dataset, seed=seed, rounds=rounds, platforms=platforms,
            beta=dirichlet_beta, ablate=tuple(ablate or ()), secagg=secagg, secagg_clip=secagg_clip,
            ldp_scale=ldp_scale, ldp_clip=ldp_clip, eval_every=eval_every, data_dir=data_dir,
            params=parse_params(param or []), quiet=quiet, save_global=save_global, device=device, unsupported={
                "--clients-per-round": clients_per_round, "--dp-noise": dp_noise, "--dp-clip": dp_clip,
                "--users": users, "--secagg-neighbors": secagg_neighbors, "--group-size": group_size,
                "--plaintext-j-bound": plaintext_j_bound, "--plan-only": True if plan_only else None,
                "--nproc": nproc, "--checkpoint-every": checkpoint_every,
            },
        )  # fmt: skip
        return
    if ablate or ldp_scale is not None or ldp_clip is not None:
        _fail("--ablate and --ldp-* are for the platform level (--model freib or --platforms M)")
    population = _population(users)
    with _exit_on(ConfigError):
        cfg = SimulationConfig(
            model=model, dataset=dataset, seed=seed, rounds=rounds, clients_per_round=clients_per_round,
            secagg=secagg, secagg_neighbors=_parse_neighbors(secagg_neighbors), secagg_clip=secagg_clip,
            secagg_group_size=group_size, dp_noise=dp_noise, dp_clip=dp_clip, dp_delta=dp_delta, dp_accountant=dp_accountant, dp_mode=dp_mode,
            dp_mechanism=dp_mechanism, unmasked_sum=unmasked_sum, device=device, explicit=explicit, eval_every=eval_every, full_val=full_val, threads=threads,
            data_dir=_str_or_none(data_dir), params=parse_params(param or []), users=population,
            save_global=_str_or_none(save_global), plaintext_j_bound=plaintext_j_bound,
            checkpoint_every=checkpoint_every, checkpoint_dir=_str_or_none(checkpoint_dir),
        )  # fmt: skip
        memory = _memory_settings(memory_gb, cohort_chunk, private_state, state_dir)
        if plan_only:
            from fedmask import console as cli_console

            text = plan_simulation(cfg, memory=memory, nproc=nproc if nproc is not None and nproc > 1 else None)
            cli_console.out().print(text, markup=False, highlight=False)
            return
        ranked = _run_ranks(cfg, memory, out=out, quiet=quiet, dp_delta=dp_delta, nproc=nproc)
        if ranked is not None:
            if ranked:
                report_devices(ranked, out, dp_delta)
            return
        with SimulationProgress(model, quiet=quiet) as events:
            results = run_simulation(cfg, memory=memory, events=events)
    report_devices(results, out, dp_delta)


def _run_ranks(cfg: SimulationConfig, memory: MemorySettings, *, out: Path, quiet: bool, dp_delta: float,
               nproc: int | None) -> dict[str, Any] | None:  # fmt: skip
    """A distributed run (D93): this process is a torchrun rank (its results
    on rank 0, {} elsewhere), `--nproc 1` runs one rank here, or `--nproc N`
    launches N local ranks (the launcher exits with the failing rank's code;
    {} on success). None: not distributed."""
    from fedmask.commands import simulate_ranks
    from models.sim.rank_round import check_rank_settings
    from models.sim.ranks import in_rank_environment

    if in_rank_environment():
        if nproc is not None:
            _fail("--nproc starts ranks itself; under torchrun leave it out (its RANK and WORLD_SIZE are set)")
        return simulate_ranks.run_torchrun_rank(cfg, memory, quiet=quiet) or {}
    if nproc is None:
        return None
    check_rank_settings(cfg, nproc)
    if nproc == 1:
        return simulate_ranks.run_one_rank(cfg, memory, quiet=quiet)
    code = simulate_ranks.launch_local(simulate_ranks.spec_of(cfg, memory, out=out, quiet=quiet, dp_delta=dp_delta),
                                       nproc)  # fmt: skip
    if code:
        raise typer.Exit(code)
    return {}


# ---------------------------------------------------------------- parsing the options


def parse_params(items: list[str]) -> dict[str, object]:
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


def _population(users: str | None) -> tuple[int, ...] | None:
    """--users as user numbers (None: every user); a malformed range exits with code 2."""
    if users is None:
        return None
    from edge_client.users import UserRangeError, parse_user_ranges

    try:
        return tuple(parse_user_ranges(users))
    except UserRangeError as e:
        _fail(str(e))


def _memory_settings(
    memory_gb: float | None, cohort_chunk: int | None, private_state: str, state_dir: Path | None
) -> MemorySettings:
    """--memory-gb, --cohort-chunk, --private-state and --state-dir; ConfigError for an unknown placement."""
    from models.registry import ConfigError
    from models.sim.engine import MemorySettings
    from models.sim.memory import PrivatePlacement

    placements: dict[str, PrivatePlacement] = {"auto": "auto", "memory": "memory", "disk": "disk", "sparse": "sparse"}
    if private_state not in placements:
        raise ConfigError(f"--private-state must be auto, sparse, memory or disk, not {private_state!r}")
    return MemorySettings(budget_gb=memory_gb, cohort_chunk=cohort_chunk, private=placements[private_state],
                          state_dir=_str_or_none(state_dir))


def _str_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path)


@contextlib.contextmanager
def _exit_on(*errors: type[Exception]) -> Iterator[None]:
    """Any of `errors` raised inside is printed as the command's error and exits with code 2."""
    try:
        yield
    except errors as e:
        from fedmask import console as cli_console

        cli_console.err().print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e


def _fail(message: str) -> NoReturn:
    """Print `message` as the command's error and exit with code 2."""
    from fedmask import console as cli_console

    cli_console.err().print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


# ---------------------------------------------------------------- the platform level


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
    from fedmask.commands.sim_progress import SimulationProgress
    from models.sim.platform_runner import PlatformConfigError, PlatformSimConfig, run_platform_simulation

    bad = [name for name, v in unsupported.items() if v is not None]
    if bad:
        _fail(f"{', '.join(bad)} are device-level options; not available with platforms")
    with _exit_on(PlatformConfigError):
        cfg = PlatformSimConfig(
            model=model, dataset=dataset, seed=seed, n_platforms=5 if platforms is None else platforms, beta=beta,
            rounds=rounds, ablate=ablate, secagg=secagg, secagg_clip=secagg_clip, ldp_scale=ldp_scale,
            ldp_clip=ldp_clip, eval_every=eval_every, data_dir=_str_or_none(data_dir),
            params=params, save_global=_str_or_none(save_global), device=device,
        )  # fmt: skip
        with SimulationProgress(model, quiet=quiet) as events:
            results = run_platform_simulation(cfg, events=events)
    _report_platforms(results, out)


# ---------------------------------------------------------------- the results


def _report_platforms(results: dict[str, Any], out: Path) -> None:
    """Write a platform-level run's results to `out` and print its done line."""
    from fedmask import console as cli_console

    from models.sim.engine import write_results

    j, p = write_results(results, out)
    t = results["test"]
    line = f"test rmse {t['rmse']:.4f}  mae {t['mae']:.4f}"
    if "ldp" in results:
        d = results["ldp"]
        line += (
            f"  Laplace LDP: epsilon {d['epsilon_per_release']:.4g} per release (lambda {d['scale_lambda']:g}, "
            f"L1 clip {d['l1_clip']:g}), {d['epsilon_total_basic_composition']:.4g} over {d['releases_per_platform']}"
        )
    line += diverged_note(results)
    cli_console.out().print(
        f"[green]done[/green] {results['model']} on {results['dataset']}, {results['n_platforms']} platforms, "
        f"beta {results['dirichlet_beta']:g}: best round {results['best_round']}, {line}, "
        f"{results['seconds_total']:.1f} s\n  {j}\n  {p}"
    )
