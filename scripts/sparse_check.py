"""The sparse private state against the dense tables, on a real run (D89).

Runs `fedmask simulate` twice, in two processes, with the same settings:
`--private-state memory` (the dense tables) and `--private-state sparse`
(only the rows each device touched), and prints, for each, the seconds per
round, the peak resident memory, the private state's peak bytes, the best
round and the test figures; then the largest absolute difference between the
two final global models, and whether the best rounds and the test figures
(to 4 decimals) agree. Exits with status 1 when they do not.

    python scripts/sparse_check.py --model fedmf                       # ML-100K, seed 0
    python scripts/sparse_check.py --model pfedrec --rounds 5 --dataset data/sparse.csv --only sparse

`--only sparse` (or `memory`) runs one path, for shapes where the other does not fit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

PATHS = ("memory", "sparse")
TEST_KEYS = ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10")


def run_path(path: str, a: argparse.Namespace, out: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One `fedmask simulate` run with `--private-state path`; its results and final global model."""
    glob = out / f"{path}.npz"
    cmd = [
        sys.executable, "-m", "fedmask", "simulate", "--model", a.model, "--dataset", a.dataset, "--seed", str(a.seed),
        "--threads", str(a.threads), "--private-state", path, "--save-global", str(glob), "--out", str(out / path),
        "--quiet",
    ]  # fmt: skip
    if a.rounds is not None:
        cmd += ["--rounds", str(a.rounds)]
    if a.clients_per_round is not None:
        cmd += ["--clients-per-round", str(a.clients_per_round)]
    for p in a.param or []:
        cmd += ["--param", p]
    subprocess.run(cmd, check=True)
    res = json.loads((out / path / "results.json").read_text())
    with np.load(glob) as z:
        return res, {k: z[k] for k in z.files if k != "__meta__"}


def describe(path: str, res: dict[str, Any]) -> str:
    rounds = res["rounds"]
    per_round = [r["seconds"] for r in rounds]
    mem = res["memory"]
    test = "  ".join(f"{k} {res['test'][k]:.4f}" for k in TEST_KEYS if k in res["test"])
    return (
        f"{path:>6}: {len(rounds)} rounds, {statistics.median(per_round):.3f} s per round (median; mean "
        f"{statistics.fmean(per_round):.3f}), {res['seconds_total']:.1f} s in all; peak RSS "
        f"{mem['peak_rss_bytes'] / 2**20:,.0f} MiB; private state peak {mem['private_state_bytes_peak']:,d} bytes "
        f"(RAM + disk; expected {mem.get('state_bytes_expected', 'n/a')}); best round {res['best_round']}; {test}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=("fedmf", "pfedrec"))
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="default: the model's tuned number")
    ap.add_argument("--clients-per-round", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--param", action="append", help="KEY=VALUE, as fedmask simulate --param")
    ap.add_argument("--only", choices=PATHS, default=None, help="run one path only")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed |difference| of the global models")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"# sparse_check {' '.join(sys.argv[1:])}  commit {commit or '?'}  "
        f"{datetime.datetime.now().isoformat(timespec='seconds')}  {platform.node()} ({os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    results: dict[str, tuple[dict[str, Any], dict[str, np.ndarray]]] = {}
    with tempfile.TemporaryDirectory(prefix="fedmask-sparse-check-") as tmp:
        for path in PATHS if a.only is None else (a.only,):
            results[path] = run_path(path, a, Path(tmp))
            print(describe(path, results[path][0]), flush=True)
    if len(results) < 2:
        return
    (dres, dglob), (sres, sglob) = results["memory"], results["sparse"]
    diff = max(float(np.abs(dglob[k].astype(np.float64) - sglob[k]).max()) for k in dglob)
    same_best = dres["best_round"] == sres["best_round"]
    same_test = all(round(dres["test"][k], 4) == round(sres["test"][k], 4) for k in TEST_KEYS if k in dres["test"])
    speed = statistics.median(r["seconds"] for r in dres["rounds"]) / statistics.median(
        r["seconds"] for r in sres["rounds"]
    )
    print(
        f"final global models: max |dense - sparse| = {diff:.3g} (tolerance {a.tolerance:g}); "
        f"same best round: {same_best}; test figures equal to 4 decimals: {same_test}; "
        f"dense / sparse seconds per round: {speed:.2f}"
    )
    if not (diff <= a.tolerance and same_best and same_test):
        sys.exit(1)


if __name__ == "__main__":
    main()
