"""The accelerator check: one command that proves and measures fedmask on a GPU.

    make gpu-check OUT=DIR            # on a machine with a CUDA GPU
    python scripts/gpu_check.py --out DIR [--reference gpu-ref]

Steps (each with a planned time; the plan and what each step took are in the
summary):

1. `env`: the machine (GPU, torch, CUDA, cores) and an import of every package.
2. `cuda-tests`: the tests marked `cuda` (tests/cuda/).
3. `data`: ML-100K from data/ml-100k (or, where it was not brought, a
   synthetic population of its shape) and the ML-1M-shaped synthetic
   population (data/synthetic-ml1m.csv, unpacked from .csv.gz or generated).
4. `gpu-*-100`: `fedmask simulate --model fedrap --device cuda`, 100 rounds
   with validation every round, on both populations.
5. `federation`: a coordinator and one edge client with `--device cuda` over
   gRPC, two secure rounds checked bit for bit, a top-k answered on the GPU
   (scripts/gpu_federation_check.py).
6. `*-5`: 5 rounds on the GPU and on the machine's CPU cores (every core as a
   torch thread) for both populations, saving the global model: the CPU's
   seconds per round, and the global parameters compared (max |cpu - gpu|).
7. the full runs against a CPU reference of the same 100 rounds (`--reference
   DIR`, made by `make gpu-check-reference` on any CPU machine): the same best
   round, test HR@10 within 1/n_users.

No step runs past `--deadline-s` (8 minutes by default): a step that would is
cut short or not run, and says so.

Seconds: `seconds_total` here is a run's rounds (training, validation every
round) and its final test evaluation; its setup (loading and splitting the
data, CUDA's initialisation, the first private state) is `seconds_setup`,
reported beside it. The engine's own `seconds_total` (setup included) is kept
as `engine_seconds_total`.

Output: every step's log and results under --out, `summary.json`, and the
summary as one JSON object on the last line of standard output. Exit status 0
when every step ran and every target is met. `--accelerator cpu` rehearses the
whole check on a machine without a GPU (the "GPU" runs then run on the CPU;
no target is judged); `--rounds`/`--compare-rounds`/`--ml1m-users` shrink it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the project's packages, also where it is not installed

import numpy as np  # noqa: E402

# Targets on one H100 (docs/gpu.md): FedRAP, 100 rounds, validation every round.
TARGET_SECONDS = {"ml1m": 60.0, "ml100k": 15.0}
PARAM_TOL = 1e-4  # max |cpu - gpu| of a global parameter after the compared rounds
# The ML-1M-shaped population (docs/performance.md): 6,040 users, 3,706 items, ~993k ratings.
ML1M_SHAPE = ("--items", "3706", "--mean-interactions", "140", "--max-interactions", "2314")  # and --users (6040)
ML100K_SHAPE_FLAGS = ("--users", "943", "--items", "1682", "--mean-interactions", "106", "--max-interactions", "737")


@dataclass
class Step:
    """One step of the plan: what it is, the seconds planned and taken, and its outcome."""

    name: str
    planned_s: float
    seconds: float | None = None
    ok: bool | None = None
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ pure comparisons


def max_abs_difference(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, float]:
    """max |a - b| per parameter (in float64); ValueError if the names or shapes differ."""
    if sorted(a) != sorted(b):
        raise ValueError(f"different parameters: {sorted(a)} vs {sorted(b)}")
    out = {}
    for k in a:
        if a[k].shape != b[k].shape:
            raise ValueError(f"{k}: shape {a[k].shape} vs {b[k].shape}")
        out[k] = float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) if a[k].size else 0.0
    return out


def compare_full_runs(reference: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """A GPU run's best round and test figures against the CPU reference of the
    same configuration: the best round equal and test HR@10 within 1/n_users."""
    n = int(reference["n_users"])
    tol = 1.0 / n
    diffs = {k: abs(float(run["test"][k]) - float(v)) for k, v in reference["test"].items() if k != "n_users"}
    same_round = run["best_round"] == reference["best_round"]
    return {
        "reference_best_round": reference["best_round"],
        "best_round": run["best_round"],
        "reference_test": reference["test"],
        "test": run["test"],
        "abs_differences": diffs,
        "tolerance": tol,
        "ok": bool(same_round and diffs["hr@10"] <= tol + 1e-12),
    }


def run_seconds(results: Mapping[str, Any]) -> dict[str, float]:
    """The seconds of a results.json as this check reports them (see the module doc)."""
    rounds = results["rounds"]
    per_round = [float(r["seconds"]) for r in rounds]
    later = per_round[1:] if len(per_round) > 1 else per_round
    return {
        "seconds_total": float(results["seconds_total"]) - float(results["seconds_setup"]),
        "seconds_setup": float(results["seconds_setup"]),
        "engine_seconds_total": float(results["seconds_total"]),
        "seconds_per_round_median": float(np.median(later)),  # rounds 2.., the first warms the kernels
        "train_seconds_median": float(np.median([float(r["train_seconds"]) for r in rounds[1:] or rounds])),
        "eval_seconds_median": float(np.median([float(r["eval_seconds"]) for r in rounds[1:] or rounds])),
    }


# ------------------------------------------------------------------ I/O


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = self.out / "logs"
        self.logs.mkdir(exist_ok=True)
        self.steps: list[Step] = []
        self.summary: dict[str, Any] = {"runs": {}, "compare": {}, "targets": {}}
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), self.env.get("PYTHONPATH", "")) if p)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.cpus = os.cpu_count() or 1
        self.accel = args.accelerator
        self.rehearsal = self.accel == "cpu"
        self.deadline = time.perf_counter() + args.deadline_s  # no step runs past it

    def step(self, name: str, planned_s: float) -> Step:
        s = Step(name, planned_s)
        self.steps.append(s)
        print(f"[gpu-check] {name} (planned {planned_s:.0f} s) ...", flush=True)
        return s

    def run(self, step: Step, cmd: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
        """Run `cmd`, its output into logs/<step>.log; None (and the step failed) on a time-out.
        The time-out is cut to what is left before the check's deadline."""
        log = self.logs / f"{step.name}.log"
        t0 = time.perf_counter()
        left = self.deadline - t0
        if left < 5:
            step.seconds, step.ok, step.note = 0.0, False, "not run: the check's deadline (--deadline-s) has passed"
            return None
        timeout = min(timeout, left)
        try:
            p = subprocess.run(
                list(cmd), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            log.write_text(f"$ {' '.join(cmd)}\n(timed out after {timeout:.0f} s)\n{_text(e.stdout)}{_text(e.stderr)}")
            step.seconds, step.ok, step.note = time.perf_counter() - t0, False, f"timed out after {timeout:.0f} s"
            return None
        log.write_text(f"$ {' '.join(cmd)}\n(exit {p.returncode})\n{p.stdout}{p.stderr}")
        step.seconds = time.perf_counter() - t0
        if p.returncode != 0:
            step.ok = False
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
            step.note = f"exit {p.returncode}: " + " | ".join(tail)
        return p

    # -------------------------------------------------------------- steps

    def env_step(self) -> bool:
        s = self.step("env", 15)
        t0 = time.perf_counter()
        import torch

        info: dict[str, Any] = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda_available": torch.cuda.is_available(),
            "cpu_count": self.cpus,
            "machine": platform.machine(),
            "fedmask_commit": _commit(),
        }
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info |= {
                "gpu": props.name,
                "gpu_memory_gib": round(props.total_memory / 1024**3, 1),
                "cuda": torch.version.cuda,
                "multiprocessors": props.multi_processor_count,
            }
        missing = []
        for mod in ("fedmask.cli", "coordinator.service", "edge_client.app", "secagg", "wire", "models.sim.engine"):
            try:
                __import__(mod)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                missing.append(f"{mod}: {type(e).__name__}: {e}")
        info["import_errors"] = missing
        self.summary["machine"] = info
        s.seconds = time.perf_counter() - t0
        s.details = info
        if not self.rehearsal and not torch.cuda.is_available():
            s.ok, s.note = False, "no CUDA device: torch.cuda.is_available() is False"
            return False
        s.ok = not missing
        s.note = "; ".join(missing)
        return s.ok

    def tests_step(self) -> None:
        s = self.step("cuda-tests", 150)
        env_note = ""
        if self.rehearsal:
            self.env["FEDMASK_TEST_ACCELERATOR"] = "cpu"
            env_note = " (FEDMASK_TEST_ACCELERATOR=cpu)"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/cuda"]
        p = self.run(s, cmd, timeout=s.planned_s * 2)
        self.env.pop("FEDMASK_TEST_ACCELERATOR", None)
        if p is None:
            return
        last = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-1:] or [""]
        s.details = {"summary": last[0]}
        skipped = "skipped" in last[0]
        s.ok = p.returncode == 0 and not skipped
        s.note = last[0] + env_note + (" (skipped tests: not run on a GPU)" if skipped else "")

    def data_step(self) -> dict[str, str]:
        s = self.step("data", 30 if (REPO / "data" / "synthetic-ml1m.csv.gz").exists() else 150)
        t0 = time.perf_counter()
        data = REPO / "data"
        data.mkdir(exist_ok=True)
        out: dict[str, str] = {}
        notes = []
        if (data / "ml-100k" / "ml-100k.inter").exists():
            out["ml100k"] = "ml-100k"
            notes.append("ML-100K from data/ml-100k")
        else:
            path = data / "synthetic-ml100k-shape.csv"
            if not path.exists():
                self._make_population(path, ML100K_SHAPE_FLAGS)
            out["ml100k"] = str(path)
            notes.append("ML-100K absent: a synthetic population of its shape (943 x 1,682, ~100k)")
        users = self.args.ml1m_users
        name = "synthetic-ml1m.csv" if users == 6040 else f"synthetic-ml1m-{users}.csv"
        path = data / name
        packed = path.with_name(name + ".gz")
        if not path.exists() and packed.exists():
            with gzip.open(packed, "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            notes.append(f"{name} unpacked from {packed.name}")
        elif not path.exists():
            self._make_population(path, ("--users", str(users), *ML1M_SHAPE))
            notes.append(f"{name} generated")
        out["ml1m"] = str(path)
        s.seconds, s.ok, s.note, s.details = time.perf_counter() - t0, True, "; ".join(notes), dict(out)
        return out

    def _make_population(self, path: Path, flags: Sequence[str]) -> None:
        cmd = [sys.executable, str(REPO / "scripts" / "make_synthetic_csv.py"), str(path), *flags]
        subprocess.run(cmd, cwd=REPO, env=self.env, check=True, capture_output=True, text=True)

    def simulate(self, name: str, dataset: str, device: str, rounds: int, planned_s: float, save: bool) -> dict[str, Any] | None:
        s = self.step(name, planned_s)
        folder = self.out / "runs" / name
        cmd = [
            sys.executable, "-m", "fedmask", "simulate", "--model", "fedrap", "--dataset", dataset, "--seed", "0",
            "--rounds", str(rounds), "--device", device, "--threads", str(self.cpus if device == "cpu" else 1),
            "--out", str(folder), "-q",
        ]  # fmt: skip
        if save:
            cmd += ["--save-global", str(folder / "global.npz")]
        p = self.run(s, cmd, timeout=max(60.0, planned_s * 3))
        if p is None or p.returncode != 0:
            return None
        res = json.loads((folder / "results.json").read_text())
        secs = run_seconds(res)
        block = {
            "dataset": res["dataset"], "device": device, "rounds": len(res["rounds"]), "n_users": res["n_users"],
            "n_items": res["n_items"], "best_round": res["best_round"], "test": res["test"], **secs,
        }  # fmt: skip
        if "accelerator" in res:
            block["peak_gpu_memory_gib"] = round(res["accelerator"]["peak_memory_bytes"] / 1024**3, 3)
        self.summary["runs"][name] = block
        s.ok = True
        s.note = f"{secs['seconds_total']:.1f} s for {len(res['rounds'])} rounds (setup {secs['seconds_setup']:.1f} s)"
        return res

    def federation_step(self) -> None:
        s = self.step("federation", 120)
        script = REPO / "scripts" / "gpu_federation_check.py"
        cmd = [sys.executable, str(script), "--device", self.accel, "--out", str(self.out / "federation")]
        p = self.run(s, cmd, timeout=s.planned_s * 2)
        if p is None:
            return
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            s.ok, s.note = False, s.note or "no JSON line"
            return
        got = json.loads(lines[-1])
        self.summary["federation"] = got
        s.details = got
        s.ok = bool(got.get("ok")) and p.returncode == 0
        s.note = f"rounds {got.get('rounds_committed')}, exact {got.get('exact')}, top-k {got.get('topk_ok')}"

    # -------------------------------------------------------------- the whole check

    def main(self) -> int:
        t_start = time.perf_counter()
        env_ok = self.env_step()
        if env_ok:
            self.tests_step()
            data = self.data_step()
            r = self.args.rounds
            full: dict[str, Any] = {}
            for key, planned in (("ml100k", 40.0), ("ml1m", 90.0)):
                res = self.simulate(f"gpu-{key}-{r}", data[key], self.accel, r, planned, save=False)
                if res is not None:
                    full[key] = res
            self.federation_step()
            c = self.args.compare_rounds
            for key, planned_gpu, planned_cpu in (("ml100k", 20.0, 30.0), ("ml1m", 30.0, 90.0)):
                gpu = self.simulate(f"gpu-{key}-{c}", data[key], self.accel, c, planned_gpu, save=True)
                cpu = self.simulate(f"cpu-{key}-{c}", data[key], "cpu", c, planned_cpu, save=True)
                if gpu is not None and cpu is not None:
                    self._compare_globals(key, c)
            self._compare_references(full)
        self._judge()
        self.summary["steps"] = [asdict(s) for s in self.steps]
        self.summary["seconds_check"] = time.perf_counter() - t_start
        self.summary["rehearsal"] = self.rehearsal
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        self._print_table()
        print(json.dumps(compact(self.summary), separators=(",", ":")))
        return 0 if self.summary["ok"] else 1

    def _compare_globals(self, key: str, rounds: int) -> None:
        from models.sim.engine import load_global_state

        a = load_global_state(self.out / "runs" / f"cpu-{key}-{rounds}" / "global.npz")
        b = load_global_state(self.out / "runs" / f"gpu-{key}-{rounds}" / "global.npz")
        diffs = max_abs_difference(a, b)
        worst = max(diffs.values(), default=0.0)
        cpu_block = self.summary["runs"][f"cpu-{key}-{rounds}"]
        gpu_block = self.summary["runs"][f"gpu-{key}-{rounds}"]
        self.summary["compare"][f"{key}-params-after-{rounds}"] = {
            "max_abs_difference": diffs, "tolerance": PARAM_TOL, "ok": worst <= PARAM_TOL,
            "cpu_seconds_per_round": cpu_block["seconds_per_round_median"],
            "gpu_seconds_per_round": gpu_block["seconds_per_round_median"],
            "speedup_per_round": cpu_block["seconds_per_round_median"] / max(gpu_block["seconds_per_round_median"], 1e-9),
        }  # fmt: skip

    def _compare_references(self, full: Mapping[str, Mapping[str, Any]]) -> None:
        ref_dir: Path | None = self.args.reference
        for key, res in full.items():
            ref_path = None if ref_dir is None else ref_dir / f"{key}.json"
            entry: dict[str, Any]
            if ref_path is None or not ref_path.exists():
                entry = {"ok": None, "note": f"no CPU reference ({ref_path}); make gpu-check-reference makes one"}
            else:
                ref = json.loads(ref_path.read_text())
                same = ref["dataset"] == res["dataset"] and len(ref["rounds"]) == len(res["rounds"])
                entry = compare_full_runs(ref, res) if same else {"ok": None, "note": "reference of another run"}
                if same:
                    entry["reference_commit"] = ref.get("fedmask_commit")
            self.summary["compare"][f"{key}-full-run"] = entry

    def _judge(self) -> None:
        runs = self.summary["runs"]
        r = self.args.rounds
        targets: dict[str, Any] = {}
        if not self.rehearsal:
            for key, limit in TARGET_SECONDS.items():
                got = runs.get(f"gpu-{key}-{r}", {}).get("seconds_total")
                targets[f"{key}_{r}_rounds_seconds"] = {"target": limit, "measured": got, "ok": got is not None and got <= limit and r == 100}
        targets["params_within_tolerance"] = all(
            v.get("ok") for k, v in self.summary["compare"].items() if "params" in k
        ) and any("params" in k for k in self.summary["compare"])
        full = [v.get("ok") for k, v in self.summary["compare"].items() if "full-run" in k]
        targets["full_runs_match_cpu_reference"] = all(full) if full and None not in full else None
        fed = self.summary.get("federation", {})
        targets["federation_exact"] = bool(fed.get("ok") and fed.get("exact"))
        targets["peak_gpu_memory_reported"] = all("peak_gpu_memory_gib" in v for k, v in runs.items() if k.startswith("gpu-")) and not self.rehearsal
        self.summary["targets"] = targets
        steps_ok = all(s.ok for s in self.steps)
        judged = [v["ok"] if isinstance(v, dict) else v for v in targets.values()]
        self.summary["ok"] = bool(steps_ok and all(j is not False for j in judged) and not self.rehearsal and None not in judged)
        if self.rehearsal:
            self.summary["ok_rehearsal"] = steps_ok

    def _print_table(self) -> None:
        print("\nstep                 planned_s  seconds  ok     note")
        for s in self.steps:
            secs = "-" if s.seconds is None else f"{s.seconds:.1f}"
            print(f"{s.name:<20} {s.planned_s:>9.0f} {secs:>8} {str(s.ok):<6} {s.note[:110]}")
        print(f"targets: {json.dumps(self.summary['targets'])}")


def compact(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary for the last line of output: the steps without their details
    and the federation without its logs (summary.json keeps everything)."""
    out = dict(summary)
    out["steps"] = [{k: v for k, v in s.items() if k != "details"} for s in summary.get("steps", [])]
    if "federation" in summary:
        keep = ("ok", "device", "rounds_committed", "exact", "topk_ok", "topk_items", "seconds", "error")
        out["federation"] = {k: summary["federation"].get(k) for k in keep}
    return out


def _commit() -> str | None:
    """The checkout's commit ($FEDMASK_COMMIT where the copy has no git history)."""
    if os.environ.get("FEDMASK_COMMIT"):
        return os.environ["FEDMASK_COMMIT"]
    try:
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return p.stdout.strip() or None


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", "replace")


def make_reference(out: Path, rounds: int, ml1m_users: int) -> int:
    """The CPU reference of the full runs (`make gpu-check-reference`): FedRAP for
    `rounds` rounds on both populations, on this machine's CPU, as OUT/<key>.json."""
    args = argparse.Namespace(
        out=out / "work", accelerator="cpu", rounds=rounds, compare_rounds=1, reference=None, ml1m_users=ml1m_users,
        deadline_s=7200.0,
    )  # fmt: skip
    check = Check(args)
    data = check.data_step()
    commit = _commit()
    for key in ("ml100k", "ml1m"):
        res = check.simulate(f"cpu-{key}-{rounds}", data[key], "cpu", rounds, 900.0, save=False)
        if res is None:
            print(f"reference run {key} failed: see {check.logs}", file=sys.stderr)
            return 1
        res["fedmask_commit"] = commit
        (out / f"{key}.json").write_text(json.dumps(res) + "\n")
        print(f"{out / f'{key}.json'}: best round {res['best_round']}, test HR@10 {res['test']['hr@10']:.6f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="Folder for the logs, the runs and summary.json.")
    ap.add_argument("--reference", type=Path, default=None, help="Folder of the CPU reference runs (ml100k.json, ml1m.json).")
    ap.add_argument("--accelerator", default="cuda", help="The device under test: cuda (default), or cpu to rehearse.")
    ap.add_argument("--rounds", type=int, default=100, help="Rounds of the full runs (targets are judged at 100).")
    ap.add_argument("--compare-rounds", type=int, default=5, help="Rounds after which CPU and GPU parameters are compared.")
    ap.add_argument("--ml1m-users", type=int, default=6040, help="Users of the ML-1M-shaped population (smaller to rehearse).")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="No step runs past this many seconds (default 8 minutes).")
    ap.add_argument("--make-reference", action="store_true", help="Make the CPU reference runs into --out and stop.")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.compare_rounds < 1 or a.ml1m_users < 10:
        ap.error("--rounds and --compare-rounds must be >= 1, --ml1m-users >= 10")
    if a.make_reference:
        a.out.mkdir(parents=True, exist_ok=True)
        return make_reference(a.out, a.rounds, a.ml1m_users)
    return Check(a).main()


if __name__ == "__main__":
    sys.exit(main())
