"""`fedmask audit`: an empirical epsilon from canary devices, beside the accountant's (D92).

The run is `models.sim.canary_audit.run_audit` (the simulator's DP round
with canaries), the estimator `dpmech.audit` (pure); this module reads the
options, shows progress, prints the result as a table or one JSON object,
and sets the exit code: 0 when the estimate is at or below the
accountant's epsilon or its interval reaches it, 3 when the whole interval
lies above it (the audit caught an accountant or a noise that is wrong),
2 for a setting that cannot run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from models.sim.canary_audit import AuditResult, AuditSettings
    from models.sim.dp_mechanism import ShareSampler

EXIT_EXCEEDS = 3

_EXAMPLE = """\b
Example: the shipped discrete Gaussian at noise multiplier 2 over 4 rounds, then the float path:
  fedmask audit --noise 2 --rounds 4
  fedmask audit --noise 2 --rounds 4 --mechanism gaussian-float
Add --json for one JSON object, --secagg to sum the residues through in-process SecAgg(+).
"""


def register(app: typer.Typer) -> None:
    """Attach `fedmask audit` to the root app."""
    app.command("audit", epilog=_EXAMPLE)(audit_command)


def audit_command(
    noise: Annotated[float, typer.Option(help="Noise multiplier z of every round's sum (its noise std over the "
                                         "sensitivity).")] = 1.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of the federation; every canary is in every one.")] = 4,
    canaries: Annotated[int, typer.Option(min=10, help="Canary devices inserted (as many directions are held out).")
                        ] = 1000,
    dim: Annotated[int, typer.Option(min=2, help="Coordinates of an update (padded to a power of two by the "
                                     "rotation).")] = 16_384,
    population: Annotated[int, typer.Option(min=1, help="Ordinary devices (synthetic updates).")] = 100,
    cohort: Annotated[int, typer.Option(min=1, help="Ordinary devices per round, drawn without replacement.")] = 20,
    clip: Annotated[float, typer.Option(help="L2 clip of an update (tau), in model units.")] = 0.1,
    delta: Annotated[float, typer.Option(help="Delta of (epsilon, delta), for both epsilons.")] = 1e-5,
    mechanism: Annotated[str, typer.Option(help="discrete-gaussian (shipped, D88) or gaussian-float (the old "
                                           "path).")] = "discrete-gaussian",
    secagg: Annotated[bool, typer.Option("--secagg", help="Sum the devices' residues through the in-process "
                                         "SecAgg(+) round (slower; the sum is the same, bit for bit).")] = False,
    sampler: Annotated[str, typer.Option(help="seeded: the simulator's seeded sampler of the same law; exact: "
                                         "every device's vector is the devices' own encode, its noise sampled "
                                         "exactly from the OS CSPRNG (slower).")] = "seeded",
    fit: Annotated[str, typer.Option(help="pooled: one sd for both Gaussians (the Gaussian mechanism's shift "
                                     "model); separate: the paper's general fit (biased upward at small delta)."
                                     )] = "pooled",
    confidence: Annotated[float, typer.Option(help="Confidence of the bootstrap interval.")] = 0.95,
    resamples: Annotated[int, typer.Option(min=10, help="Bootstrap resamples.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the run (directions, updates, noise).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
) -> None:
    """Audit the DP mechanism: an empirical epsilon from canary devices, beside the accountant's epsilon.

    Runs a simulated federation through the simulator's real DP round (clip, rotation, rounding, integer noise shares, the sum mod 2^32, decoding; or the float path) with canary devices whose update, in every round, is a random unit direction scaled to the clip, as in "One-shot Empirical Privacy Estimation for Federated Learning" (Andrew et al., ICLR 2024). The ordinary devices' updates are synthetic. The cosines between the released model delta and the inserted canaries are compared with those of directions never inserted; the Gaussian model of the paper turns them into an epsilon at the run's delta, with a bootstrap interval, printed beside the epsilon the simulator's ledger reports for the same run.

    The estimate is a lower bound's estimate from one run: below the accountant's epsilon it shows no bug this statistic can see, not that the accountant is right. Exit code 3 when the whole interval lies above the accountant's epsilon (the noise or the accounting is wrong), 2 for a setting that cannot run.
    """
    from models.registry import ConfigError
    from models.sim.canary_audit import FITS, MECHANISMS, SAMPLERS, AuditSettings

    try:
        for option, value, known in (("--mechanism", mechanism, MECHANISMS), ("--fit", fit, FITS),
                                     ("--sampler", sampler, SAMPLERS)):
            if value not in known:
                raise ConfigError(f"{option} must be one of {', '.join(known)}, got {value!r}")
        settings = AuditSettings(dim=dim, population=population, cohort=cohort, canaries=canaries, rounds=rounds,
                                 noise=noise, clip=clip, delta=delta, mechanism=MECHANISMS[mechanism],
                                 secagg=secagg, sampler=SAMPLERS[sampler], seed=seed, confidence=confidence,
                                 resamples=resamples, fit=FITS[fit])
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    code = run_and_report(settings, as_json=as_json, quiet=quiet)
    if code:
        raise typer.Exit(code)


def run_and_report(settings: AuditSettings, *, as_json: bool, quiet: bool,
                   share_sampler: ShareSampler | None = None) -> int:
    """Run the audit, print it, and return the exit code (module doc).
    `share_sampler`: tests only, the fault the audit must catch."""
    from models.registry import ConfigError
    from models.sim.canary_audit import run_audit
    from models.sim.progress import Progress

    try:
        with Progress("audit", total=settings.rounds, unit="round", mode="off" if quiet else "auto") as bar:
            result = run_audit(settings, on_round=lambda done, _total: bar.update(done),
                               share_sampler=share_sampler)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    if as_json:
        from fedmask.commands.privacy import finite_json

        typer.echo(json.dumps(finite_json(result.as_dict()), indent=2))
    else:
        _print(result)
    from dpmech.audit import Verdict

    return EXIT_EXCEEDS if result.verdict is Verdict.EXCEEDS else 0


_VERDICTS = {
    "consistent": "consistent: the estimate is at or below the accountant's epsilon",
    "above, within the interval": "ABOVE the accountant's epsilon, but the interval reaches it: rerun with more "
                                  "canaries or another seed",
    "exceeds": "EXCEEDS the accountant's epsilon, the whole interval above it: the noise or the accounting is wrong",
}


def _print(r: AuditResult) -> None:
    from rich import box
    from rich.table import Table

    from dpmech import PROTECTS
    from dpmech.audit import EPSILON_CAP
    from fedmask.console import out

    s, e = r.settings, r.empirical
    console = out()

    def eps(value: float) -> str:
        return f">= {EPSILON_CAP:g}" if value >= EPSILON_CAP else f"{value:.3g}"

    t = Table(title=f"fedmask audit: {s.mechanism}, noise multiplier {s.noise:g}, {s.rounds} rounds, "
                    f"{s.canaries} canaries, delta {s.delta:g}", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("")
    t.add_column("epsilon", justify="right")
    t.add_row("empirical (canaries)", eps(e.epsilon))
    t.add_row(f"{e.confidence:.0%} interval (bootstrap, {e.resamples} resamples)", f"{eps(e.low)} .. {eps(e.high)}")
    t.add_row("accountant (the ledger, same run)", f"{r.reported_epsilon:.3g}")
    console.print(t)
    console.print(f"verdict: {_VERDICTS[r.verdict.value]}")
    (m1, s1), (m0, s0) = e.inserted, e.held_out
    console.print(f"cosines with the released model delta: inserted {m1:.4g} (sd {s1:.3g}, {e.n_inserted}), held out "
                  f"{m0:.4g} (sd {s0:.3g}, {e.n_held_out}); separation {e.separation:.3g} sd; fit: "
                  f"{'pooled sd' if e.equal_variances else 'separate sds'}")
    console.print(f"noise of the rounds' sums, measured by the simulator: {r.sum_noise_measured:.3g} x the clip; "
                  f"priced by the ledger: multiplier {r.noise_multiplier_priced:.3g} of the sensitivity")
    console.print(f"the canaries' cross-talk adds {r.crosstalk:.2g} x the configured noise's variance to each cosine"
                  + ("" if r.crosstalk <= 0.25 else ": the estimate is diluted, raise --dim or lower --canaries"))
    console.print(f"{s.cohort} of {s.population} ordinary devices (synthetic updates) and {s.canaries} canaries a "
                  f"round, {s.dim:,} coordinates, clip {s.clip:g}{', through SecAgg(+)' if s.secagg else ''}; "
                  f"{s.sampler} noise sampler; {r.wall_s:.1f} s. Epsilon protects {PROTECTS}. One run's estimate of a lower bound: not a proof "
                  "that the accountant is right.")
