"""results.json and metrics.png of a simulation run."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _jsonable(x: Any) -> Any:
    """Plain JSON: non-finite floats become null, tuples lists, numpy/torch scalars numbers."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    item = getattr(x, "item", None)
    if callable(item):
        return _jsonable(item())
    return str(x)


def save_json(results: Mapping[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.write_text(json.dumps(_jsonable(results), indent=2, allow_nan=False) + "\n")
    return p


def plot_metrics(results: Mapping[str, Any], path: str | Path) -> Path:
    """Validation curves per round (HR@10 / NDCG@10, or RMSE / MAE), best round marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    explicit = results.get("kind") == "explicit"
    keys = ("rmse", "mae") if explicit else ("hr@10", "ndcg@10")
    recs = [r for r in results["rounds"] if r.get("val")]
    xs = [r["round"] for r in recs]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for key in keys:
        ys = [r["val"].get(key, math.nan) for r in recs]
        ys = [math.nan if y is None else y for y in ys]
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=f"val {key}")
    extra = "full_hr@10"
    if not explicit and recs and extra in recs[0]["val"]:
        ax.plot(xs, [r["val"].get(extra, math.nan) for r in recs], label=f"val {extra}")
    best = results.get("best_round")
    if best is not None:
        ax.axvline(best, color="grey", linestyle="--", linewidth=1, label=f"best round {best}")
    test = results.get("test", {})
    title = f"{results.get('model')} on {results.get('dataset')} (seed {results.get('seed')})"
    if test:
        main = "rmse" if explicit else "hr@10"
        if main in test and test[main] is not None:
            title += f" - test {main} {test[main]:.4f}"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("round (0-based, as in results.json)")
    ax.set_ylabel("validation metric")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p)
    plt.close(fig)
    return p


def write_results(results: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write DIR/results.json and DIR/metrics.png; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    j = save_json(results, out / "results.json")
    p = plot_metrics(results, out / "metrics.png")
    return j, p
