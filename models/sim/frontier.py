"""`fedmask privacy frontier`: what privacy costs in recommendation quality (D95).

Pure logic only (fedmask/commands/frontier.py runs the jobs):

- the grid (`FrontierSpec`, `tuning_runs`, `repeat_runs`): for every target
  epsilon, the noise multiplier z the planner (`dpmech.plan`) gives for the
  whole population in every round over the run's rounds, at delta =
  1/n^1.1 by default, without amplification by sampling (the figure devices
  can check); every candidate `update_scale` (the unit FedRAP's clip applies
  to, the one hyperparameter tuned here) on the grid's seed; then the
  repeat seeds at the repeat epsilons with the candidate chosen there, and
  the no-DP baseline (the model's defaults, no candidates) on every seed;
- the choice (`choose`): the candidate with the best validation HR@10 of
  the run's own selected round; the test is read only after it;
- the summary (`summarise`, `markdown_table`, `plot_frontier`): per target
  epsilon, the ledger's epsilon (what the run really spent), z, the chosen
  candidate, validation and test HR@10 (sampled and full ranking) as mean
  and sample sd over the seeds run there, and the loss against the no-DP
  baseline's mean on the same seeds.

Contracts: the runs are `fedmask simulate` runs with distributed discrete-
Gaussian noise summed without masks (--unmasked-sum: the released sum is
the secure sum's, exactly, and priced identically); the tuning's own
privacy cost is not counted (it is a researcher's study, and this is said
wherever the table is shown); no figure is read from a run whose config
differs from the one asked for (the command reuses a finished run only when
its config matches, as `fedmask study` does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.sim.study import mean_sd, mean_sd_cell

#: the clip tau of every DP run (in FedRAP's sent unit; D18's validation-tuned value)
DEFAULT_CLIP = 0.1
DEFAULT_EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULT_UPDATE_SCALES = (35.0, 70.0)
METRICS = ("val_hr@10", "test_hr@10", "test_full_hr@10")


def default_delta(population: int) -> float:
    """delta = 1 / n^1.1: below 1/n, so no single device is expected to be exposed."""
    if population < 1:
        raise ValueError(f"the population must be >= 1, got {population}")
    return 1.0 / population ** 1.1


@dataclass(frozen=True)
class FrontierSpec:
    """One dataset's frontier. `epsilons` are targets; `repeat_at` must be among them."""

    dataset: str
    population: int
    update_dim: int
    rounds: int
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    seed: int = 0
    repeat_seeds: tuple[int, ...] = ()
    repeat_at: tuple[float, ...] = ()
    update_scales: tuple[float, ...] = DEFAULT_UPDATE_SCALES
    clip: float = DEFAULT_CLIP
    delta: float | None = None  # None: default_delta(population)

    def __post_init__(self) -> None:
        if not self.epsilons or any(not (math.isfinite(e) and e > 0) for e in self.epsilons):
            raise ValueError(f"--epsilons must be positive numbers, got {list(self.epsilons)}")
        if len(set(self.epsilons)) != len(self.epsilons):
            raise ValueError(f"--epsilons repeats a value: {list(self.epsilons)}")
        if not self.update_scales or any(not (math.isfinite(u) and u > 0) for u in self.update_scales):
            raise ValueError(f"--update-scales must be positive numbers, got {list(self.update_scales)}")
        missing = [e for e in self.repeat_at if e not in self.epsilons]
        if missing:
            raise ValueError(f"--repeat-at {missing} is not among --epsilons {list(self.epsilons)}")
        if self.seed in self.repeat_seeds or len(set(self.repeat_seeds)) != len(self.repeat_seeds):
            raise ValueError(f"--repeat-seeds must be distinct and differ from --seed {self.seed}")
        if self.rounds < 1 or self.population < 2 or self.update_dim < 1:
            raise ValueError("a frontier needs rounds >= 1, two devices or more and an update to noise")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"--clip must be > 0, got {self.clip}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"--delta must be in (0, 1), got {self.delta}")

    @property
    def run_delta(self) -> float:
        return default_delta(self.population) if self.delta is None else self.delta

    @property
    def seeds(self) -> tuple[int, ...]:
        return (self.seed, *self.repeat_seeds)


def noise_for(spec: FrontierSpec, epsilon: float) -> float:
    """The least noise multiplier z whose epsilon over the run's rounds, every
    device in every round in one group, meets `epsilon` (dpmech.plan's
    primary figure: no amplification by sampling)."""
    from dpmech.plan import PlanRequest, plan

    request = PlanRequest(population=spec.population, cohort=spec.population, rounds=spec.rounds,
                          delta=spec.run_delta, target_epsilon=epsilon, dim=spec.update_dim, clip=spec.clip)
    return float(plan(request).primary.noise_multiplier)


@dataclass(frozen=True)
class FrontierRun:
    """One simulate run: `epsilon` None is the no-DP baseline (and `update_scale` None its default)."""

    epsilon: float | None
    update_scale: float | None
    seed: int

    @property
    def folder(self) -> str:
        if self.epsilon is None:
            return f"no-dp/seed{self.seed}"
        return f"eps{self.epsilon:g}/us{self.update_scale:g}/seed{self.seed}"


def tuning_runs(spec: FrontierSpec) -> list[FrontierRun]:
    """The grid's seed: the baseline, then every epsilon with every candidate."""
    runs = [FrontierRun(None, None, spec.seed)]
    runs += [FrontierRun(e, u, spec.seed) for e in spec.epsilons for u in spec.update_scales]
    return runs


def repeat_runs(spec: FrontierSpec, chosen: Mapping[float, float]) -> list[FrontierRun]:
    """The repeat seeds: the baseline and each repeat epsilon with its chosen candidate."""
    runs: list[FrontierRun] = []
    for s in spec.repeat_seeds:
        runs.append(FrontierRun(None, None, s))
        runs += [FrontierRun(e, chosen[e], s) for e in spec.repeat_at]
    return runs


def metrics_of(results: Mapping[str, Any]) -> dict[str, float]:
    """Validation HR@10 (of the selected round), test HR@10 sampled and full, and the ledger's epsilon."""
    def get(block: str, key: str) -> float:
        v = (results.get(block) or {}).get(key)
        return float(v) if isinstance(v, int | float) else math.nan

    eps = results.get("epsilon")
    return {"val_hr@10": get("best_val", "hr@10"), "test_hr@10": get("test", "hr@10"),
            "test_full_hr@10": get("test", "full_hr@10"),
            "epsilon": float(eps) if isinstance(eps, int | float) else math.nan}


def choose(candidates: Mapping[float, Mapping[str, Any]]) -> float:
    """The update_scale whose run has the best validation HR@10 (ties: the
    smaller scale, which clips more and adds less noise in model units)."""
    scored = [(metrics_of(r)["val_hr@10"], -u, u) for u, r in candidates.items()]
    scored = [s for s in scored if math.isfinite(s[0])]
    if not scored:
        raise ValueError("no candidate run has a validation HR@10 to choose by")
    return max(scored)[2]


def summarise(spec: FrontierSpec, noise: Mapping[float, float], chosen: Mapping[float, float],
              results: Mapping[FrontierRun, Mapping[str, Any]]) -> dict[str, Any]:
    """frontier.json: the baseline and one row per target epsilon (module doc)."""
    def stats(runs: Sequence[FrontierRun]) -> dict[str, Any]:
        per = [metrics_of(results[r]) for r in runs if r in results]
        return {m: mean_sd([p[m] for p in per]) for m in (*METRICS, "epsilon")} | {"seeds": [r.seed for r in runs
                                                                                         if r in results]}

    base = {s: FrontierRun(None, None, s) for s in spec.seeds}
    baseline = stats(list(base.values()))
    rows = []
    for e in spec.epsilons:
        u = chosen.get(e)
        seeds = spec.seeds if e in spec.repeat_at else (spec.seed,)
        row: dict[str, Any] = {"target_epsilon": e, "noise_multiplier": noise.get(e), "update_scale": u}
        if u is not None:
            runs = [FrontierRun(e, u, s) for s in seeds]
            row |= stats(runs)
            same = stats([base[s] for s in row["seeds"]])
            row["baseline_test_hr@10_same_seeds"] = same["test_hr@10"]["mean"]
            row["loss_test_hr@10"] = _loss(row["test_hr@10"]["mean"], same["test_hr@10"]["mean"])
            row["candidates"] = {f"{c:g}": metrics_of(results[FrontierRun(e, c, spec.seed)])["val_hr@10"]
                                 for c in spec.update_scales if FrontierRun(e, c, spec.seed) in results}
        rows.append(row)
    return {"dataset": spec.dataset, "population": spec.population, "update_dim": spec.update_dim,
            "rounds": spec.rounds, "delta": spec.run_delta, "clip": spec.clip, "seed": spec.seed,
            "repeat_seeds": list(spec.repeat_seeds), "repeat_at": list(spec.repeat_at),
            "update_scales": list(spec.update_scales), "accounting": ACCOUNTING, "baseline": baseline, "rows": rows}


ACCOUNTING = ("epsilon of the ledger: distributed discrete Gaussian, every device in every round, no amplification by "
              "sampling; protects one device, all of its data. The tuning's own privacy cost is not counted.")


def _loss(value: float | None, baseline: float | None) -> float | None:
    """The relative loss 1 - value / baseline (None when either is missing)."""
    if value is None or baseline is None or not baseline > 0:
        return None
    return 1.0 - value / baseline


def _cell(stat: Mapping[str, Any] | None) -> str:
    return mean_sd_cell(stat, "-")


def markdown_table(frontier: Mapping[str, Any]) -> str:
    """The table docs/privacy.md shows: one row per target epsilon, then the baseline."""
    head = (f"{frontier['dataset']}: {frontier['population']} devices, {frontier['rounds']} rounds, every device in "
            f"every round, delta {frontier['delta']:.3g}, clip {frontier['clip']:g}; mean ± sd over the seeds run.\n\n")
    lines = ["| target epsilon | ledger epsilon | z | update_scale (chosen on validation) | seeds | val HR@10 | "
             "test HR@10 | test full-ranking HR@10 | loss of test HR@10 against no DP |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in frontier["rows"]:
        if row.get("update_scale") is None:
            lines.append(f"| {row['target_epsilon']:g} | not run | | | | | | | |")
            continue
        loss = row.get("loss_test_hr@10")
        lines.append(
            f"| {row['target_epsilon']:g} | {_cell(row['epsilon'])} | {row['noise_multiplier']:.2f} | "
            f"{row['update_scale']:g} | {','.join(str(s) for s in row['seeds'])} | {_cell(row['val_hr@10'])} | "
            f"{_cell(row['test_hr@10'])} | {_cell(row['test_full_hr@10'])} | "
            f"{'-' if loss is None else f'{100 * loss:.1f}%'} |")
    b = frontier["baseline"]
    lines.append(f"| no DP | | | default | {','.join(str(s) for s in b['seeds'])} | {_cell(b['val_hr@10'])} | "
                 f"{_cell(b['test_hr@10'])} | {_cell(b['test_full_hr@10'])} | |")
    return head + "\n".join(lines) + "\n\n" + frontier["accounting"] + "\n"


def plot_frontier(frontiers: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Test HR@10 (sampled, full ranking) against the ledger's epsilon, one
    line per dataset, the no-DP baseline dashed in the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for i, fr in enumerate(frontiers):
        colour = f"C{i}"
        done = [r for r in fr["rows"] if r.get("update_scale") is not None and r["epsilon"]["mean"] is not None]
        for ax, metric in zip(axes, ("test_hr@10", "test_full_hr@10"), strict=True):
            xs = [r["epsilon"]["mean"] for r in done]
            ys = [r[metric]["mean"] for r in done]
            err = [r[metric]["sd"] or 0.0 for r in done]
            ax.errorbar(xs, ys, yerr=err, marker="o", color=colour, capsize=3,
                        label=f"{fr['dataset']} ({fr['population']} devices)")
            base = fr["baseline"][metric]["mean"]
            if base is not None:
                ax.axhline(base, color=colour, linestyle="--", linewidth=1)
    for ax, title in zip(axes, ("test HR@10 (sampled negatives)", "test HR@10 (full ranking)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("epsilon over the run (no amplification by sampling)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("What privacy costs: FedRAP, distributed discrete Gaussian (dashed: no DP)", fontsize=10)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


__all__ = ["DEFAULT_CLIP", "DEFAULT_EPSILONS", "DEFAULT_UPDATE_SCALES", "FrontierRun", "FrontierSpec", "choose",
           "default_delta", "markdown_table", "metrics_of", "noise_for", "plot_frontier", "repeat_runs", "summarise",
           "tuning_runs"]
