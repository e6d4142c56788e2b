"""Benchmark: the simulator's DP mechanism per device, numpy against compiled.

For each update length, times `models.sim.fast_quantize.quantize_rows`
(clip, rotate, scale, round under the norm bound) on a chunk of rows the
size the simulator uses (`models.sim.dp_mechanism.row_chunk`), once with
dpmech's numpy path and once compiled (numba), alternating, `--repeats`
times each after one warm-up, and prints the best milliseconds a device
of each and their ratio, with the commit, date, machine and load. Both
paths give the same integers (tests/models/test_fast_quantize.py); the
ratio is what a DP round of the simulator gains. On a shared machine,
compare the ratio, not the milliseconds.

    PYTHONPATH=. python scripts/bench_sim_mechanism.py --dims 53824,118592,290112

53,824, 118,592 and 290,112 are FedRAP's updates (32 x items) on ML-100K,
the ML-1M shape and ml-latest-small; they pad to 65,536, 131,072 and
524,288 coordinates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from dpmech.calibrate import calibrate
from models.sim.dp_mechanism import FIELD_BITS, row_chunk
from models.sim.fast_quantize import Workspace, available, quantize_rows

ROOT = Path(__file__).resolve().parents[1]


def measure(dim: int, repeats: int) -> dict[str, float]:
    """Best ms a device of each path at update length `dim`, and the ratio."""
    cfg = calibrate(dim=dim, clip=0.1, noise_multiplier=5.0, devices=1000, shares=1000, bits=FIELD_BITS)
    rows = row_chunk(cfg.padded_dim)
    x = np.random.default_rng(dim).normal(size=(rows, dim)) * 0.01
    best = {False: float("inf"), True: float("inf")}
    work = Workspace(rows, cfg.padded_dim)  # kept from chunk to chunk, as the simulator keeps it
    for rep in range(repeats + 1):
        for compiled in (False, True):
            start = time.perf_counter()
            quantize_rows(x, cfg, b"bench", np.random.default_rng(rep), compiled=compiled,
                          work=work if compiled else None)
            if rep:  # the first is the warm-up (and numba's compile)
                best[compiled] = min(best[compiled], (time.perf_counter() - start) / rows * 1e3)
    return {"dim": dim, "padded": cfg.padded_dim, "rows": rows, "numpy_ms": best[False], "compiled_ms": best[True],
            "ratio": best[False] / best[True]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="53824,118592,290112", help="update lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each path (after one warm-up)")
    args = parser.parse_args()
    if not available():
        raise SystemExit("numba is not installed: pip install 'fedmask[fast]' (or the dev extra)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit or '?'}, {datetime.date.today()}, {platform.node()} ({os.cpu_count()} cpus), "
          f"load {os.getloadavg()[0]:.2f}; one thread")
    print(f"{'dim':>8} {'padded':>8} {'rows':>5} {'numpy ms/dev':>13} {'compiled ms/dev':>16} {'ratio':>6}")
    results = []
    for dim in (int(d) for d in args.dims.split(",") if d.strip()):
        r = measure(dim, args.repeats)
        results.append(r)
        print(f"{r['dim']:>8} {r['padded']:>8} {r['rows']:>5} {r['numpy_ms']:>13.2f} {r['compiled_ms']:>16.2f} "
              f"{r['ratio']:>6.2f}")
    print(json.dumps({"commit": commit, "load_after": os.getloadavg()[0], "results": results}))


if __name__ == "__main__":
    main()
