"""`fedmask study`: one dataset, several seeds, every model against the yardsticks.

Pure logic only (no training here; fedmask/commands/study.py runs the jobs):

- which runs a study makes (`study_runs`): the implicit models fedrap, pfedrec
  and fedmf, plus, where the dataset has ratings, fedmf `--explicit` (named
  `fedmf-explicit`) and fedmmf (always explicit);
- when a finished run's results.json can be reused (`config_matches`: the same
  config and the same resolved hyperparameters);
- the metrics read from a run (`simulation_metrics`, `reference_metrics`);
- their mean and sample standard deviation over the seeds (`aggregate`);
- the markdown table and the PNG plot of the aggregate.

Contract of study.json (`aggregate`):
    {"dataset": D, "seeds": [0, 1, 2],
     "models": {"fedrap": {"test_hr@10": {"mean": m, "sd": s, "n": 3}, ...}, ...},
     "references": {"ease": {"test_hr@10": {...}, ...}, ...}}
Implicit runs and references carry test_hr@10, test_ndcg@10, test_full_hr@10 and
placebo_hr@10; explicit runs carry test_rmse and test_mae. `sd` is the sample
standard deviation (ddof 1), None with a single seed; `n` counts the seeds that
had the metric (a NaN or missing value is left out, never counted as 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPLICIT_METRICS: dict[str, tuple[str, str]] = {
    "test_hr@10": ("test", "hr@10"),
    "test_ndcg@10": ("test", "ndcg@10"),
    "test_full_hr@10": ("test", "full_hr@10"),
    "placebo_hr@10": ("placebo", "hr@10"),
}
EXPLICIT_METRICS: dict[str, tuple[str, str]] = {"test_rmse": ("test", "rmse"), "test_mae": ("test", "mae")}


@dataclass(frozen=True)
class StudyRun:
    """One model of a study: its name in study.json, the simulate model and --explicit."""

    name: str
    model: str
    explicit: bool


ALL_RUNS: tuple[StudyRun, ...] = (
    StudyRun("fedrap", "fedrap", False),
    StudyRun("pfedrec", "pfedrec", False),
    StudyRun("fedmf", "fedmf", False),
    StudyRun("fedmf-explicit", "fedmf", True),
    StudyRun("fedmmf", "fedmmf", True),
)


def study_runs(has_ratings: bool, models: Iterable[str] | None = None) -> list[StudyRun]:
    """The runs of a study, in ALL_RUNS order. `models` picks by run name (None: every
    run the dataset allows). Explicit runs need a dataset with ratings: left out of
    the default, an error when asked for."""
    names = [r.name for r in ALL_RUNS]
    if models is None:
        return [r for r in ALL_RUNS if has_ratings or not r.explicit]
    wanted = set(models)
    unknown = wanted - set(names)
    if unknown:
        raise ValueError(f"unknown study model(s) {sorted(unknown)}; known: {', '.join(names)}")
    runs = [r for r in ALL_RUNS if r.name in wanted]
    if not has_ratings and any(r.explicit for r in runs):
        raise ValueError("fedmf-explicit and fedmmf need a dataset with ratings; this one has none")
    if not runs:
        raise ValueError("--models picked no model")
    return runs


#: config fields that say how a run was kept, not what it computes: a run resumed
#: from its checkpoints ends bit for bit as an uninterrupted one (D93)
RESUME_ONLY = frozenset({"checkpoint_every", "checkpoint_dir"})


def _normal(x: Any) -> Any:
    """JSON's view of a value (tuples become lists), so configs compare as written."""
    return json.loads(json.dumps(x))


def config_matches(
    results: Mapping[str, Any], wanted: Mapping[str, Any], default_rounds: int, *, model_config: Mapping[str, Any]
) -> bool:
    """Whether a finished run (its results.json) is the run `wanted` (a SimulationConfig
    as a dict) would make: every config field equal but RESUME_ONLY's, rounds None meaning `default_rounds`,
    and the resolved hyperparameters (`model_config`, what the model the current code
    builds reports) equal to the run's, so that a change of a model's defaults is re-run."""
    have = results.get("config")
    if not isinstance(have, Mapping) or "test" not in results:
        return False
    if _normal(results.get("model_config")) != _normal(dict(model_config)):
        return False
    want = dict(_normal(dict(wanted)))
    if want.get("rounds") is None:
        want["rounds"] = default_rounds
    have = _normal(dict(have))
    return set(have) == set(want) and all(have[k] == want[k] for k in want if k not in RESUME_ONLY)


def _metric(block: Mapping[str, Any], path: tuple[str, str]) -> float:
    v = block.get(path[0], {}) or {}
    x = v.get(path[1]) if isinstance(v, Mapping) else None
    return float(x) if isinstance(x, int | float) and x is not None else math.nan


def simulation_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """The study's metrics of one simulate results.json (NaN where absent)."""
    table = EXPLICIT_METRICS if results.get("kind") == "explicit" else IMPLICIT_METRICS
    return {name: _metric(results, path) for name, path in table.items()}


def reference_metrics(reference: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The study's metrics of every model of one reference.json, by model name."""
    return {m["name"]: {name: _metric(m, path) for name, path in IMPLICIT_METRICS.items()} for m in reference["models"]}


def mean_sd(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and sample standard deviation (ddof 1) of the finite values; None when
    there are none (mean) or fewer than two (sd)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    mean = sum(xs) / n if n else None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n >= 2 and mean is not None else None
    return {"mean": mean, "sd": sd, "n": n}


def _aggregate_group(per_seed: Mapping[int, Mapping[str, float]]) -> dict[str, dict[str, float | int | None]]:
    names: list[str] = []
    for m in per_seed.values():
        names += [k for k in m if k not in names]
    return {k: mean_sd([m.get(k, math.nan) for m in per_seed.values()]) for k in names}


def aggregate(
    dataset: str,
    seeds: Sequence[int],
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    references: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    """study.json from the runs' results.json (`runs[name][seed]`) and the
    reference.json of every seed (`references[seed]`). Every seed must be present
    for every run and reference: a study with a missing seed is an error."""
    seeds = [int(s) for s in seeds]
    models: dict[str, Any] = {}
    for name, by_seed in runs.items():
        missing = [s for s in seeds if s not in by_seed]
        if missing:
            raise ValueError(f"{name}: no results for seed(s) {missing}")
        models[name] = _aggregate_group({s: simulation_metrics(by_seed[s]) for s in seeds})
    missing = [s for s in seeds if s not in references]
    if references and missing:
        raise ValueError(f"references: no reference.json for seed(s) {missing}")
    refs: dict[str, dict[int, dict[str, float]]] = {}
    for s in seeds if references else []:
        for ref_name, metrics in reference_metrics(references[s]).items():
            refs.setdefault(ref_name, {})[s] = metrics
    return {
        "dataset": dataset,
        "seeds": seeds,
        "models": models,
        "references": {name: _aggregate_group(by_seed) for name, by_seed in refs.items()},
    }


def mean_sd_cell(stat: Mapping[str, Any] | None, missing: str = "") -> str:
    """A table cell of a `mean_sd` result: 'mean ± sd' (3 decimals), the mean alone without sd, `missing` without mean."""
    if not stat or stat.get("mean") is None:
        return missing
    sd = stat.get("sd")
    return f"{stat['mean']:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")


def markdown_table(study: Mapping[str, Any]) -> str:
    """One row per model and reference, one column per metric: mean ± sd over the seeds."""
    cols = list(IMPLICIT_METRICS) + list(EXPLICIT_METRICS)
    rows = [(name, "model", stats) for name, stats in study["models"].items()]
    rows += [(name, "reference", stats) for name, stats in study["references"].items()]
    used = [c for c in cols if any(c in stats for _, _, stats in rows)]
    seeds = ", ".join(str(s) for s in study["seeds"])
    head = f"{study['dataset']}, seeds {seeds}: mean ± sd over the seeds\n\n"
    lines = ["| model | kind | " + " | ".join(used) + " |", "|---|---|" + "---|" * len(used)]
    for name, kind, stats in rows:
        lines.append(f"| {name} | {kind} | " + " | ".join(mean_sd_cell(stats.get(c)) for c in used) + " |")
    return head + "\n".join(lines) + "\n"


def plot_study(study: Mapping[str, Any], path: str | Path) -> Path:
    """Bars of the mean with sd error bars, one panel per metric, one bar per model
    and reference (references hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [(n, s, False) for n, s in study["models"].items()] + [(n, s, True) for n, s in study["references"].items()]
    metrics = [m for m in list(IMPLICIT_METRICS) + list(EXPLICIT_METRICS) if any(m in s for _, s, _ in entries)]
    fig, axes = plt.subplots(1, max(len(metrics), 1), figsize=(3.2 * max(len(metrics), 1), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        names, means, sds, hatch = [], [], [], []
        for name, stats, is_ref in entries:
            st = stats.get(metric)
            if st and st.get("mean") is not None:
                names.append(name)
                means.append(st["mean"])
                sds.append(st["sd"] or 0.0)
                hatch.append("//" if is_ref else "")
        bars = ax.bar(range(len(names)), means, yerr=sds, capsize=3, color=["#bbb" if h else "#4c72b0" for h in hatch])
        for b, h in zip(bars, hatch):
            b.set_hatch(h)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_title(metric, fontsize=9)
    seeds = ", ".join(str(s) for s in study["seeds"])
    fig.suptitle(f"{study['dataset']}, seeds {seeds} (bars: mean; error bars: sd; hatched: centralised references)", fontsize=9)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
