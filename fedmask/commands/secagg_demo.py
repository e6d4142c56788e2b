"""`fedmask secagg-demo` (also `fedmask demo --secagg-only`): one secure-aggregation round among
simulated devices in this process (secagg.inprocess), reported stage by stage."""

from __future__ import annotations

from typing import Annotated

import typer

from secagg.stages import Stage

# what the server saw of a device that dropped at a stage
_WHEN = {
    Stage.ADVERTISE_KEYS: "never advertised keys",
    Stage.SHARE_KEYS: "advertised, never shared keys",
    Stage.SHARE_CHECK: "shared keys, never answered the share check",
    Stage.MASKED_INPUT: "checked the shares, no masked input",
    Stage.CONSISTENCY_CHECK: "no consistency signature",
    Stage.UNMASKING: "masked input sent, no unmasking",
}


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
