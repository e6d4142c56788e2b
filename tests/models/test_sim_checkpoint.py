"""Checkpoints and resume (D93, models/sim/checkpoint.py).

- In process: a run that stops (an error at round 4) and is started again
  with the same checkpoint folder resumes from its latest complete
  checkpoint and ends with the uninterrupted run's global model bit for bit,
  the same records, best round and test figures; dense tables (with a kept
  best buffer) and the sparse store, full and partial cohorts.
- Another run's folder is refused.
- Under torchrun (2 ranks, --max-restarts 1): one rank is killed (SIGKILL)
  after the first checkpoint; torchrun restarts both, they resume, and the
  run ends with the global model of an uninterrupted 2-rank run, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedmask.commands.simulate_ranks import free_port
from models.data.synthetic import synthetic
from models.registry import ConfigError
from models.sim.engine import MemorySettings, SimulationConfig, load_global_state, simulate

ROOT = Path(__file__).resolve().parents[2]


class Stop(Exception):
    pass


def _stop_at(r: int) -> Any:
    def hook(rec: dict[str, Any]) -> None:
        if rec["round"] == r:
            raise Stop

    return hook


@pytest.mark.parametrize(("model", "kw", "private"), [
    ("fedmf", {"clients_per_round": 50}, "auto"),
    ("pfedrec", {}, "auto"),
    ("fedrap", {"clients_per_round": 60}, "memory"),
], ids=["fedmf-sparse-partial", "pfedrec-sparse", "fedrap-dense-partial"])
def test_a_stopped_run_resumes_to_the_uninterrupted_model(tmp_path: Path, model: str, kw: dict[str, Any],
                                                          private: Any) -> None:
    x = synthetic(100, 150, seed=3)
    params = {} if model == "fedmmf" else {"k": 8}
    mem = MemorySettings(private=private)

    def cfg(name: str, **more: Any) -> SimulationConfig:
        return SimulationConfig(model=model, rounds=7, params=params, threads=1, save_global=str(tmp_path / name),
                                **kw, **more)

    whole = simulate(cfg("whole.npz"), interactions=x, memory=mem)
    ck = {"checkpoint_every": 2, "checkpoint_dir": str(tmp_path / "ck")}
    with pytest.raises(Stop):
        simulate(cfg("stopped.npz", **ck), interactions=x, memory=mem, on_round=_stop_at(4))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["round-1", "round-3"]
    resumed = simulate(cfg("resumed.npz", **ck), interactions=x, memory=mem)
    a, b = load_global_state(tmp_path / "whole.npz"), load_global_state(tmp_path / "resumed.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert resumed["best_round"] == whole["best_round"]
    assert [r["val"] for r in resumed["rounds"]] == [r["val"] for r in whole["rounds"]]
    assert resumed["test"] == whole["test"]
    with pytest.raises(ConfigError, match="another run"):
        simulate(dataclasses.replace(cfg("other.npz", **ck), seed=1), interactions=x, memory=mem)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def _rank_pid(agent: int, rank: int) -> int | None:
    for child in _children(agent):
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return child
    return None


def _torchrun(out: Path, extra: list[str], port: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "1", "--master-port", str(port), "-m", "fedmask", "simulate", "--model", "pfedrec",
           "--dataset", "synthetic", "--rounds", "40", "--threads", "1", "--param", "k=8", "--quiet",
           "--clients-per-round", "120", "--out", str(out), "--save-global", str(out / "g.npz"), *extra]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_torchrun_restarts_a_killed_rank_and_the_run_resumes(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run = _torchrun(tmp_path / "killed", ["--checkpoint-every", "3", "--checkpoint-dir", str(ck)], free_port())
    try:
        deadline = time.monotonic() + 240
        while not list(ck.glob("round-*/COMPLETE")):  # the first checkpoint, then kill rank 1
            assert run.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.05)
        victim = _rank_pid(run.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        log = run.communicate(timeout=300)[0]
    finally:
        run.kill()
    assert run.returncode == 0, log
    ref = _torchrun(tmp_path / "whole", [], free_port())
    ref_log = ref.communicate(timeout=300)[0]
    assert ref.returncode == 0, ref_log
    a = load_global_state(tmp_path / "whole" / "g.npz")
    b = load_global_state(tmp_path / "killed" / "g.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    killed = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert len(killed["rounds"]) == 40 and killed["ranks"]["world"] == 2
    assert "restart" in log.lower() or "Restarting" in log, log  # torchrun restarted the workers
