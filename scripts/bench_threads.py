"""Seconds per round of `fedmask simulate` by thread setting, on a quiet and a loaded machine.

For each load case (`--burners`: how many busy-loop processes this script
starts beside the runs, e.g. 0 and 2), it waits `--settle` seconds so that the
1-minute load average sees them, then runs, one after another:

- `fedmask simulate --model M --dataset D --rounds R` with no `--threads`
  (the default, chosen from the cores idle now, D98; its choice is read from
  results.json), `--threads 2` (the old default), `--threads 1`, `--threads 2`
  under OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning),
  and the default again, right after the others: the 1-minute load average
  still counts them then, the CPUs watched now do not;
- with `--model fedmf`, the plain per-user PyTorch loop
  (`scripts/peer_fedmf_loop.py`, one thread) as the peer.

Prints a table of the medians over rounds 2..R (round seconds, with
validation; training seconds) and each one's ratio to the old default and to
the peer, then the JSON of everything measured (`--json FILE` writes it).
The burners are stopped at the end. Measured figures only; on a machine
shared with other jobs the load average printed beside each row says how
quiet "quiet" was.

    PYTHONPATH=. nice python scripts/bench_threads.py --burners 0,2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


# The default runs first in each case, and again last, when the runs before it have raised the load average.
VARIANTS = (
    Variant("default (chosen from the machine)", ()),
    Variant("--threads 2 (old default)", ("--threads", "2")),
    Variant("--threads 1", ("--threads", "1")),
    Variant("--threads 2, OMP_WAIT_POLICY=PASSIVE", ("--threads", "2"), {"OMP_WAIT_POLICY": "PASSIVE"}),
    Variant("default, right after the runs above", ()),
)
_THREAD_ENV = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_ENV}
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    return env | extra


def run_engine(v: Variant, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / f"run-{abs(hash(v.name))}"
    cmd = [sys.executable, "-m", "fedmask", "simulate", "--model", a.model, "--dataset", a.dataset,
           "--rounds", str(a.rounds), "--seed", str(a.seed), "--quiet", "--out", str(out), *v.flags]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(v.env))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    r = json.loads((out / "results.json").read_text())
    later = r["rounds"][1:]
    return {
        "round_s": statistics.median(x["seconds"] for x in later),
        "train_s": statistics.median(x["train_seconds"] for x in later),
        "threads": r.get("threads", {}).get("count", r["config"]["threads"]),
        "reason": r.get("threads", {}).get("reason", ""),
    }


def run_peer(a: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "peer_fedmf_loop.py"), "--dataset", a.dataset, "--rounds", str(a.rounds),
           "--seed", str(a.seed), "--threads", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env({}))
    if done.returncode != 0:
        raise SystemExit(f"the peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    s = json.loads(done.stdout.strip().splitlines()[-1])["median_after_first"]
    return {"round_s": s, "train_s": s, "threads": 1, "reason": "one thread"}


def one_case(burners: int, a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    try:
        if burners:
            print(f"[bench] {burners} burners started; waiting {a.settle:.0f} s for the load average",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(a.settle)
        rows = []
        todo: list[Variant | None] = [*VARIANTS, *([None] if a.model == "fedmf" else [])]
        for v in todo:
            load = os.getloadavg()[0]
            name = "plain per-user loop (peer)" if v is None else v.name
            print(f"[bench] burners {burners}: {name} (load {load:.2f})", file=sys.stderr, flush=True)
            m = run_peer(a) if v is None else run_engine(v, a, tmp)
            rows.append({"burners": burners, "variant": name, "load_1min_before": load} | m)
        return rows
    finally:
        for p in procs:
            p.kill()
            p.wait()


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| burners | setting | threads | load before | s / round | training s / round | "
             "vs --threads 2 | peer / this (training) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for b in sorted({r["burners"] for r in rows}):
        case = [r for r in rows if r["burners"] == b]
        old = next(r for r in case if r["variant"].startswith("--threads 2 (old"))
        peer = next((r for r in case if r["variant"].startswith("plain")), None)
        for r in case:
            ratio_peer = f"{peer['train_s'] / r['train_s']:.2f}x" if peer is not None else "-"
            lines.append(f"| {b} | {r['variant']} | {r['threads']} | {r['load_1min_before']:.2f} | "
                         f"{r['round_s']:.2f} | {r['train_s']:.2f} | {old['round_s'] / r['round_s']:.2f}x | "
                         f"{ratio_peer} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="fedmf", help="the model simulated (the peer exists for fedmf only)")
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per run (the first is left out of the medians)")
    ap.add_argument("--burners", default="0,2", help="load cases: busy-loop processes started beside the runs")
    ap.add_argument("--settle", type=float, default=60.0, help="seconds to wait after starting burners")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the measured rows to this file")
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be >= 2 (the first round is left out)")
    try:
        cases = [int(x) for x in a.burners.split(",")]
    except ValueError:
        ap.error(f"--burners must be comma-separated counts, got {a.burners!r}")
    if any(c < 0 for c in cases):
        ap.error("--burners counts must be >= 0")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        for c in cases:
            rows += one_case(c, a, Path(tmp))
    print(table(rows))
    doc = {"cpus": os.cpu_count(), "rows": rows}
    print(json.dumps(doc))
    if a.json is not None:
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
