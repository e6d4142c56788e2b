"""Validation-only tuning of the platform-level models (FREIB and its baselines).

Runs `fedmask simulate --platforms M` configurations one after another and
prints / appends one JSON line per configuration with its best validation
RMSE and round. The test figures are dropped unread: tuning looks at
validation only (docs/decisions.md D27, D67).

    python scripts/tune_platforms.py --grid grid.json --out tune.jsonl

grid.json: a list of {"model": ..., "beta": ..., "rounds": ..., "dataset": ..., "params": {...}}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", required=True, type=Path, help="JSON list of configurations")
    ap.add_argument("--out", required=True, type=Path, help="JSON-lines file the results are appended to")
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args(argv)
    from models.sim.platform_runner import PlatformSimConfig, run_platform_simulation

    grid = json.loads(a.grid.read_text())
    if not isinstance(grid, list):
        print("error: the grid must be a JSON list", file=sys.stderr)
        return 2
    for i, g in enumerate(grid):
        t0 = time.perf_counter()
        cfg = PlatformSimConfig(
            model=g["model"], dataset=g.get("dataset", "ml-100k"), seed=g.get("seed", 0),
            n_platforms=g.get("platforms", 5), beta=g.get("beta", 1.0), rounds=g.get("rounds"),
            data_dir=a.data_dir, params=g.get("params", {}),
        )  # fmt: skip
        r = run_platform_simulation(cfg)
        vals = [(rec["round"], rec["val"]["rmse"]) for rec in r["rounds"] if "val" in rec]
        line = {
            **g,
            "best_round": r["best_round"],
            "val_rmse": r["best_val"]["rmse"] if r["best_val"] else None,
            "val_mae": r["best_val"]["mae"] if r["best_val"] else None,
            "last_val_rmse": vals[-1][1] if vals else None,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"[{i + 1}/{len(grid)}] {json.dumps(line)}", flush=True)
        with a.out.open("a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
