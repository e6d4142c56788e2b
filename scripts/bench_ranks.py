"""Benchmark: the simulator's scaling over ranks (D93), measured in one run.

For each rank count N (default 1 and 2), runs `fedmask simulate --nproc N
--threads 1` (N = 1: one rank in process) on the same data and settings,
reads every round's seconds from rank 0's results.json, and prints per N:
the median round of rounds 2..R (the first round pays one-off costs), the
throughput (devices trained per second: the cohort over that median) and
the parallel efficiency, throughput(N) / (N x throughput(1)), and the
whole run's wall and CPU seconds (all its processes: on a loaded machine a
low efficiency with about the same CPU seconds is contention, not extra
work). The runs go
one after another in the same invocation, so their figures compare as
ratios; the load average before and after each run is printed with them
(on a shared machine other jobs take cores too: say so with the figures).

    PYTHONPATH=. nice -n 19 python scripts/bench_ranks.py --dataset data/synthetic-ml1m.csv \\
        --model fedrap --rounds 5 --nproc 1,2

The ML-1M-shaped CSV is made as docs/performance.md says
(scripts/make_synthetic_csv.py --users 6040 --items 3706 --mean-interactions 140
--max-interactions 2314).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(n: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One `fedmask simulate --nproc n` run; its rounds' seconds and cohort."""
    out = folder / f"nproc-{n}"
    cmd = [sys.executable, "-m", "fedmask", "simulate", "--model", args.model, "--dataset", args.dataset,
           "--rounds", str(args.rounds), "--threads", "1", "--nproc", str(n), "--seed", "0", "--quiet",
           "--out", str(out), *args.extra]  # fmt: skip
    load0 = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"nproc {n} failed:\n{done.stderr[-3000:]}")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads((out / "results.json").read_text())
    seconds = [float(r["seconds"]) for r in res["rounds"]]
    train = [float(r["train_seconds"]) for r in res["rounds"]]
    return {"nproc": n, "seconds": seconds, "train_seconds": train, "cohort": int(res["cohort_size"]),
            "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
            "wall_s": float(res["seconds_total"]),
            "load": (load0, os.getloadavg()[0]), "rss": [p.get("peak_rss_bytes", 0)
                                                        for p in res.get("ranks", {}).get("per_rank", [])]}  # fmt: skip


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="data/synthetic-ml1m.csv")
    ap.add_argument("--model", default="fedrap")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nproc", default="1,2", help="comma-separated rank counts (the first is the baseline)")
    ap.add_argument("extra", nargs="*", help="more `fedmask simulate` options (after --)")
    args = ap.parse_args()
    counts = [int(c) for c in args.nproc.split(",")]
    print(f"command: {' '.join(sys.argv)}\ncommit {commit()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
          f"UTC, {platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        for n in counts:
            rows.append(run(n, args, Path(tmp)))
    base = None
    print(f"{args.model} on {args.dataset}, {args.rounds} rounds, one thread per rank; median of rounds 2..{args.rounds}")
    print("ranks  round s  train s  devices/s  efficiency  load before/after  run: wall s, CPU s (all ranks)  "
          "peak RSS per rank (GiB)")
    for row in rows:
        med = statistics.median(row["seconds"][1:])
        med_train = statistics.median(row["train_seconds"][1:])
        thr = row["cohort"] / med
        base = thr if base is None else base
        eff = thr / (row["nproc"] / counts[0] * base)
        rss = " ".join(f"{b / 2**30:.2f}" for b in row["rss"])
        print(f"{row['nproc']:>5}  {med:7.2f}  {med_train:7.2f}  {thr:9.1f}  {eff:10.3f}  "
              f"{row['load'][0]:6.2f} / {row['load'][1]:5.2f}     {row['wall_s']:7.1f} {row['cpu_s']:8.1f}"
              f"                {rss}")


if __name__ == "__main__":
    main()
