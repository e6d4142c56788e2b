"""`make gpu-check` (scripts/gpu_check.py) on a machine without a GPU: its
comparisons, and the whole check rehearsed with the CPU standing in for the
accelerator, so that accelerator time is never spent on a broken script."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


gpu_check = _load()


def test_parameter_differences_are_per_parameter_and_refuse_other_models() -> None:
    a = {"C": np.zeros((3, 2), np.float32), "c": np.ones(3, np.float32)}
    b = {"C": np.full((3, 2), 2e-5, np.float32), "c": np.ones(3, np.float32)}
    got = gpu_check.max_abs_difference(a, b)
    assert got["c"] == 0.0 and got["C"] == pytest.approx(2e-5)
    with pytest.raises(ValueError, match="shape"):
        gpu_check.max_abs_difference(a, {"C": np.zeros((2, 3), np.float32), "c": b["c"]})
    with pytest.raises(ValueError, match="different parameters"):
        gpu_check.max_abs_difference(a, {"C": a["C"]})


def test_full_runs_match_on_the_best_round_and_hr_within_one_user() -> None:
    ref = {"n_users": 100, "best_round": 7, "test": {"hr@10": 0.50, "ndcg@10": 0.3, "n_users": 100.0}}
    same = {"best_round": 7, "test": {"hr@10": 0.51, "ndcg@10": 0.31, "n_users": 100.0}}
    assert gpu_check.compare_full_runs(ref, same)["ok"]  # one device's hit: 1/100
    assert not gpu_check.compare_full_runs(ref, same | {"test": {"hr@10": 0.52, "ndcg@10": 0.3}})["ok"]
    assert not gpu_check.compare_full_runs(ref, same | {"best_round": 8})["ok"]


def test_seconds_leave_the_setup_out() -> None:
    res = {
        "seconds_total": 12.0, "seconds_setup": 2.0,
        "rounds": [{"seconds": 4.0, "train_seconds": 3.5, "eval_seconds": 0.5},
                   {"seconds": 3.0, "train_seconds": 2.5, "eval_seconds": 0.5},
                   {"seconds": 3.0, "train_seconds": 2.0, "eval_seconds": 1.0}],
    }  # fmt: skip
    got = gpu_check.run_seconds(res)
    assert got["seconds_total"] == 10.0 and got["seconds_setup"] == 2.0 and got["engine_seconds_total"] == 12.0
    assert got["seconds_per_round_median"] == 3.0  # the first round (kernel warm-up) is left out


@pytest.mark.slow
def test_the_whole_check_rehearsed_on_the_cpu(tmp_path: Path) -> None:
    """Every step of the check runs, and its summary says what the GPU run will:
    the plan with each step's seconds, the runs, the comparisons, the federation."""
    out = tmp_path / "gc"
    p = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--out", str(out), "--accelerator", "cpu",
         "--rounds", "2", "--compare-rounds", "1", "--ml1m-users", "80"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr  # a rehearsal is never a passed check
    last = json.loads(p.stdout.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    assert last["ok"] is False and last["rehearsal"] is True and last["ok_rehearsal"] is True, p.stdout[-3000:]
    names = [s["name"] for s in summary["steps"]]
    assert names[:3] == ["env", "cuda-tests", "data"] and "federation" in names and len(names) == 10
    assert all(s["ok"] and s["seconds"] is not None for s in summary["steps"]), summary["steps"]
    assert "passed" in summary["steps"][1]["note"] and "skipped" not in summary["steps"][1]["note"]
    for key in ("ml100k", "ml1m"):
        cmp = summary["compare"][f"{key}-params-after-1"]
        assert cmp["ok"] and max(cmp["max_abs_difference"].values()) == 0.0  # the CPU against itself
    assert summary["federation"]["exact"] and summary["federation"]["topk_ok"]
    assert (out / "logs" / "federation.log").exists() and (out / "runs" / "gpu-ml1m-2" / "results.json").exists()
