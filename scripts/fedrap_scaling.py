"""How a FedRAP round's cost grows with devices and items: short `fedmask simulate` runs.

For each population size (devices x items) it writes a long-tailed synthetic
population (`make_synthetic_csv.py`'s generator, `--mean-interactions` per
device), runs `fedmask simulate --model fedrap` for `--rounds` rounds with the
tuned defaults (every device every round, validation every round), and prints
the median training and validation seconds per round over the rounds after
the first, read from each run's results.json. Prints measured figures only.

    python scripts/fedrap_scaling.py --sizes 943x1682,943x3706,6040x1682,6040x3706 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from make_synthetic_csv import write_population  # this folder: `python scripts/fedrap_scaling.py`


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="943x1682,943x3706,6040x1682,6040x3706", help="devices x items, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per run (the first is left out of the medians)")
    ap.add_argument("--mean-interactions", type=float, default=140.0, help="lognormal median of a device's history")
    ap.add_argument("--threads", type=int, default=None, help="passed to fedmask simulate (default: its own)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be >= 2 (the first round is left out)")
    sizes = []
    for part in a.sizes.split(","):
        try:
            u, i = (int(v) for v in part.lower().split("x"))
        except ValueError:
            ap.error(f"bad size {part!r}: expected DEVICESxITEMS, e.g. 943x1682")
        if u < 1 or i < 202:
            ap.error(f"bad size {part!r}: need at least 1 device and 202 items")
        sizes.append((u, i))
    print("| devices | items | interactions | train s / round | validation s / round | per device ms |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="fedrap-scaling-") as tmp:
        for users, items in sizes:
            csv = Path(tmp) / f"pop-{users}x{items}.csv"
            n = write_population(csv, users, items, mean_interactions=a.mean_interactions,
                                 max_interactions=min(2314, items - 101), seed=a.seed)
            out = Path(tmp) / f"run-{users}x{items}"
            cmd = [sys.executable, "-m", "fedmask", "simulate", "--model", "fedrap", "--dataset", str(csv),
                   "--rounds", str(a.rounds), "--seed", str(a.seed), "--out", str(out)]  # fmt: skip
            if a.threads is not None:
                cmd += ["--threads", str(a.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return done.returncode
            rounds = json.loads((out / "results.json").read_text())["rounds"][1:]
            train = statistics.median(r["train_seconds"] for r in rounds)
            val = statistics.median(r["eval_seconds"] for r in rounds)
            print(f"| {users:,} | {items:,} | {n:,} | {train:.2f} | {val:.2f} | {1000 * train / users:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
