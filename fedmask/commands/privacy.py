"""`fedmask privacy plan`: the noise a deployment needs for a target epsilon, and what it costs the model.

The planning is `dpmech.plan` (pure); this module reads the options, prints
the plan as rich tables or one JSON object, and turns a refusal
(`PlanError`) into a message on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # dpmech.plan imports dp_accounting (slow): only when the command runs
    from dpmech.plan import Noise, Plan

privacy_app = typer.Typer(help="Differential privacy: plan the noise a deployment needs; measure what it costs.",
                          no_args_is_help=True)

_EXAMPLE = """\b
Example: 100,000 devices, cohorts of 1,000, 100 rounds, epsilon 8 at delta 1e-6:
  fedmask privacy plan --population 100000 --cohort 1000 --rounds 100 --delta 1e-6 --target-epsilon 8
Add --dropout 0.1 (10% of each group drops), --group-size 500 (groups, D87), --json (one JSON object).
"""


def register(app: typer.Typer) -> None:
    """Attach `fedmask privacy` (plan, frontier, frontier-plot) to the root app."""
    from fedmask.commands.frontier import EXAMPLE as frontier_example
    from fedmask.commands.frontier import PLOT_EXAMPLE as frontier_plot_example
    from fedmask.commands.frontier import frontier_command, frontier_plot_command

    privacy_app.command("frontier", epilog=frontier_example)(frontier_command)
    privacy_app.command("frontier-plot", epilog=frontier_plot_example)(frontier_plot_command)
    app.add_typer(privacy_app, name="privacy")


@privacy_app.command("plan", epilog=_EXAMPLE)
def plan_command(
    population: Annotated[int, typer.Option(min=2, help="Devices in the federation (N).", show_default=False)],
    cohort: Annotated[int, typer.Option(min=2, help="Devices per round (B).", show_default=False)],
    rounds: Annotated[int, typer.Option(min=1, help="Rounds the model trains for (T).", show_default=False)],
    delta: Annotated[float, typer.Option(help="Delta of (epsilon, delta); below 1/N.", show_default=False)],
    target_epsilon: Annotated[float, typer.Option(help="Epsilon over the T rounds the plan must meet.",
                                                  show_default=False)],
    dropout: Annotated[float, typer.Option(min=0.0, max=0.99, help="Fraction of every group that drops out: only "
                                           "counted devices' noise reaches the sum (D19).")] = 0.0,
    group_size: Annotated[int | None, typer.Option(min=2, help="Secure aggregation in groups of at least G (D87); "
                                                   "default: one group.", show_default=False)] = None,
    dim: Annotated[int, typer.Option(min=1, help="Coordinates of an update (FedRAP on ML-100K: 53,824).")] = 53_824,
    clip: Annotated[float, typer.Option(help="L2 clip of an update (tau), in model units.")] = 0.1,
    bits: Annotated[int, typer.Option(help="Bits of the secure sum's field (2^w).")] = 32,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Plan the distributed discrete Gaussian's noise for a target epsilon over T rounds.

    Searches the least noise multiplier whose epsilon over the rounds meets the target without amplification by sampling (the guarantee: devices cannot check how cohorts are drawn), and beside it the one that would do with amplification, assuming cohorts are Poisson samples at rate B/N. For each: the noise each device adds (sigma of its integer share, and in model units), epsilon per round and over the rounds, and the noise-to-signal ratio of the mean update: the noise norm sigma_sum sqrt(d) / B against the largest mean signal, the clip. With --dropout: the noise that reaches the sum and the epsilon it gives, and the noise that keeps the target. With --group-size: what groups cost the model. It also names the field the sum needs, and refuses (exit 2) a target out of reach or a field too small. Epsilon protects one device, all of its data.
    """
    from dpmech.plan import PlanError, PlanRequest, plan

    try:
        request = PlanRequest(population=population, cohort=cohort, rounds=rounds, delta=delta,
                              target_epsilon=target_epsilon, dropout=dropout, group_size=group_size, dim=dim,
                              clip=clip, bits=bits)
        from fedmask.console import err

        with err().status("searching the noise multiplier ..."):
            result = plan(request)
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(finite_json(result.as_dict()), indent=2))
        return
    _print_plan(result)


def finite_json(value: Any) -> Any:
    """JSON has no infinity: an infinite epsilon is written as null (also
    `fedmask audit`'s)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _noise_rows(noise: Noise) -> list[str]:
    from dpmech.claims import epsilon_text

    return [f"{noise.noise_multiplier:.4g}", f"{noise.device_sigma:,.1f}", f"{noise.device_sigma_model:.3g}",
            epsilon_text(noise.epsilon_round), epsilon_text(noise.epsilon_total), f"{noise.noise_norm_of_mean:.3g}",
            f"{noise.noise_to_signal:.3g}"]


_LABELS = ("noise multiplier (each group's sum)", "each device's sigma, integer units", "each device's sigma, model units",
           "epsilon per round", "epsilon over {rounds} rounds", "noise norm of the mean update",
           "noise-to-signal (against the clip)")


def _print_plan(p: Plan) -> None:
    from rich import box
    from rich.table import Table

    from dpmech import PROTECTS
    from dpmech.claims import epsilon_text
    from fedmask.console import out

    r = p.request
    console = out()
    t = Table(title=f"fedmask privacy plan: {r.population:,} devices, cohorts of {r.cohort:,}, {r.rounds} rounds, "
                    f"target epsilon {r.target_epsilon:g} at delta {r.delta:g}", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("")
    t.add_column("without amplification\n(the guarantee)", justify="right")
    t.add_column(f"assuming Poisson sampling\nat rate {r.sampling_rate:.3g}", justify="right")
    for label, a, b in zip(_LABELS, _noise_rows(p.primary), _noise_rows(p.amplified),
                           strict=True):
        t.add_row(label.format(rounds=r.rounds), a, b)
    console.print(t)
    console.print(f"Epsilon protects {PROTECTS}. Devices cannot check how cohorts are drawn: the first column is "
                  "the guarantee. The second prices each round as dp_accounting's Poisson-sampled Gaussian with the "
                  "same rho, an assumption not proved for the discrete sum; with the first column's noise it would "
                  f"give epsilon {epsilon_text(p.primary_if_poisson)} over {r.rounds} rounds.")
    g = p.geometry
    console.print(f"mechanism: d {r.dim:,} padded to {g.padded_dim:,}; clip {r.clip:g}; scale {g.scale:,.4g} integer "
                  f"units per model unit; sensitivity sqrt(B) = {g.sensitivity:,.1f}; field 2^{r.bits} "
                  f"({p.bits_needed} bits needed; the sum wraps with probability {_at_most(p.overflow_probability)})")
    if p.grouping_cost is not None:
        sizes = sorted(set(p.groups))
        console.print(f"groups: {len(p.groups)} of {' or '.join(f'{n:,}' for n in sizes)} devices, each device's "
                      f"share calibrated to its group (D87): the summed update carries {p.grouping_cost:.3g} times "
                      "the noise of one group over the cohort, for the same epsilon")
    if p.dropout is not None:
        console.print(_dropout_table(p))


def _at_most(bound: float) -> str:
    return f"<= {bound:.2g}" if bound > 0 else "below 1e-300"


def _dropout_table(p: Plan) -> Any:
    from rich import box
    from rich.table import Table

    from dpmech.claims import epsilon_text

    assert p.dropout is not None
    d, r = p.dropout, p.request
    t = Table(title=f"{d.fraction:.0%} of every group dropped: {sum(d.counted):,} of {r.cohort:,} devices counted "
                    "(only their noise reaches the sum, D19)", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("")
    t.add_column("the plan's shares", justify="right")
    t.add_column("shares that keep the target", justify="right")
    rows = (("noise multiplier of the worst group's sum", lambda n: f"{n.sum_multiplier:.4g}"),
            ("each device's sigma, integer units", lambda n: f"{n.device_sigma:,.1f}"),
            (f"epsilon over {r.rounds} rounds", lambda n: epsilon_text(n.epsilon_total)),
            ("noise-to-signal of the counted devices' mean", lambda n: f"{n.noise_to_signal:.3g}"))
    for label, cell in rows:
        t.add_row(label, cell(d.with_plan_noise), cell(d.keep_target))
    return t
