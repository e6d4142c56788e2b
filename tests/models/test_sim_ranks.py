"""The simulator as several ranks (D93) against one process.

- Shards: consecutive, non-empty, balanced by training cost; a cohort's
  parts over the ranks are its positions in order (pure).
- Same results: 2 ranks (real processes, gloo over TCP, started by the
  `--nproc` launcher) against 1 rank of the same settings, for every
  device-level model, dense and sparse state, full and partial cohorts,
  chunked, with and without --secagg: the same final global model bit for
  bit (the plain sums are exact fixed-point integers, the secure sums the
  ranks' group sums added as integers mod 2^w), the same best round and
  the test figures to 4 decimals.
- An error on one rank stops every rank, and the launcher names it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedmask.commands.simulate_ranks import launch_local
from models.data.synthetic import synthetic
from models.sim.engine import MemorySettings, SimulationConfig, load_global_state, simulate
from models.sim.ranks import Ranks
from models.sim.shard import Shard, shard_bounds

ROOT = Path(__file__).resolve().parents[2]
WORKER = (sys.executable, str(ROOT / "tests" / "models" / "rank_worker.py"))
SYNTHETIC: dict[str, Any] = {"synthetic": [120, 260], "seed": 11}
TEST_KEYS = ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10", "rmse", "mae")
K8 = {"k": 8}

# every device-level model; dense ("memory") and sparse state; full and partial cohorts; chunked; --secagg in groups
JOBS: list[dict[str, Any]] = [
    {"config": {"model": "fedmf", "rounds": 3, "params": K8}},
    {"config": {"model": "fedmf", "rounds": 3, "params": K8, "clients_per_round": 50},
     "memory": {"private": "memory", "cohort_chunk": 16}},
    {"config": {"model": "pfedrec", "rounds": 4, "params": K8, "clients_per_round": 40}},
    {"config": {"model": "fedrap", "rounds": 3, "params": K8}},
    {"config": {"model": "fedmmf", "rounds": 3}},
    {"config": {"model": "fedmf", "rounds": 3, "params": K8, "clients_per_round": 40, "secagg": True,
                "secagg_group_size": 6}},
    {"config": {"model": "pfedrec", "rounds": 2, "params": K8, "secagg": True, "secagg_group_size": 20}},
    {"config": {"model": "fedrap", "rounds": 2, "params": K8, "clients_per_round": 30, "secagg": True}},
    {"config": {"model": "fedmmf", "rounds": 2, "secagg": True, "secagg_group_size": 25}},
]


# ---------------------------------------------------------------- shards (pure)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_shards_are_consecutive_non_empty_and_balanced(world: int) -> None:
    rng = np.random.default_rng(world)
    w = rng.pareto(1.5, 500) * 10 + 1
    b = shard_bounds(w, world)
    assert b[0] == 0 and b[-1] == 500 and len(b) == world + 1
    assert all(lo < hi for lo, hi in zip(b, b[1:]))
    loads = [w[lo:hi].sum() for lo, hi in zip(b, b[1:])]
    assert max(loads) <= w.sum() / world + w.max()  # within one device of the even share
    with pytest.raises(ValueError, match="at least one"):
        shard_bounds(np.ones(world - 1), world)


@pytest.mark.parametrize("rows", [None, [0, 3, 4, 9, 10, 11, 17, 19]])
def test_a_cohorts_parts_are_its_positions_in_order(rows: list[int] | None) -> None:
    bounds = (0, 4, 11, 20)
    t = None if rows is None else torch.tensor(rows)
    shares = [Shard(r, 3, bounds).share(t) for r in range(3)]
    cohort = list(range(20)) if rows is None else rows
    assert np.concatenate([s.positions for s in shares]).tolist() == list(range(len(cohort)))
    for r, s in enumerate(shares):
        local = list(range(bounds[r + 1] - bounds[r])) if s.rows is None else s.rows.tolist()
        assert [bounds[r] + i for i in local] == [cohort[p] for p in s.positions]
        assert s.counts == tuple(len(x.positions) for x in shares) and s.cohort == len(cohort)


# ---------------------------------------------------------------- 2 ranks against 1 rank


def _launch(tmp: Path, jobs: list[dict[str, Any]], nproc: int, monkeypatch: pytest.MonkeyPatch,
            scalar: bool = False) -> int:  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    if scalar:  # torch's scalar kernels: a device's float32 result does not depend on its batch
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    spec = SYNTHETIC | {"folder": str(tmp), "jobs": jobs}
    return launch_local(spec, nproc, command=WORKER)


@pytest.fixture(scope="module")
def scalar_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Every job as 2 ranks and as 1 rank, both with torch's scalar kernels."""
    one, two = tmp_path_factory.mktemp("one-rank"), tmp_path_factory.mktemp("two-ranks")
    with pytest.MonkeyPatch.context() as mp:
        assert _launch(two, JOBS, 2, mp, scalar=True) == 0
        assert _launch(one, JOBS, 1, mp, scalar=True) == 0
    return one, two


def _max_diff(a: Path, b: Path) -> float:
    g1, g2 = load_global_state(a), load_global_state(b)
    assert set(g1) == set(g2)
    return max(float(np.abs(g1[k].astype(np.float64) - g2[k].astype(np.float64)).max()) for k in g1)


def _job_id(j: dict[str, Any]) -> str:
    c = j["config"]
    return (f"{c['model']}-{'secagg' if c.get('secagg') else 'plain'}-{c.get('clients_per_round', 'full')}-"
            f"{j.get('memory', {}).get('private', 'auto')}")


@pytest.mark.parametrize("i", range(len(JOBS)), ids=[_job_id(j) for j in JOBS])
def test_two_ranks_reach_one_ranks_model_bit_for_bit(scalar_runs: tuple[Path, Path], i: int) -> None:
    """With batch-invariant kernels the only difference left is the split into
    ranks, and the exact sums (fixed-point integers; the secure sums' group
    sums mod 2^w) make it none: the same model bit for bit."""
    one_dir, two_dir = scalar_runs
    one = json.loads((one_dir / f"{i}.json").read_text())
    two = json.loads((two_dir / f"{i}.json").read_text())
    assert _max_diff(one_dir / f"{i}.npz", two_dir / f"{i}.npz") == 0.0
    assert two["best_round"] == one["best_round"]
    for key in TEST_KEYS:
        if key in one["test"]:
            assert round(two["test"][key], 4) == round(one["test"][key], 4), key
    assert one["ranks"]["world"] == 1 and two["ranks"]["world"] == 2
    per_rank = two["ranks"]["per_rank"]
    assert sum(p["devices"] for p in per_rank) == 120
    assert all(p["devices"] > 0 and p["peak_rss_bytes"] > 0 for p in per_rank)
    if JOBS[i]["config"].get("secagg"):
        for rec, ref in zip(two["rounds"], one["rounds"], strict=True):
            assert rec["secagg_exact"] is True and rec["secagg_counted"] == ref["secagg_counted"]
            assert rec["secagg_groups"] >= 2  # each rank runs its own groups


# 2 rounds: FedMF's partial cohorts amplify a last-bit difference ~100 times a round (as chunking does in one process)
VECTOR_JOBS = [j | {"config": j["config"] | {"rounds": 2}} for j in JOBS if not j["config"].get("secagg")]


@pytest.mark.parametrize("i", range(len(VECTOR_JOBS)), ids=[_job_id(j) for j in VECTOR_JOBS])
def test_with_vector_kernels_two_ranks_stay_within_1e6(two_vector: Path, tmp_path: Path, i: int) -> None:
    """torch's vector kernels (the default) give a device's float32 update a
    last-bit difference with its batch (vector body or scalar tail), so two
    ranks' devices differ from one rank's by that much; within 1e-6 here."""
    job = VECTOR_JOBS[i]
    x = synthetic(*SYNTHETIC["synthetic"], seed=SYNTHETIC["seed"])
    one = simulate(SimulationConfig(**job["config"], save_global=str(tmp_path / "one.npz"), threads=1),
                   interactions=x, memory=MemorySettings(**job.get("memory", {})), ranks=Ranks(0, 1))
    two = json.loads((two_vector / f"{i}.json").read_text())
    assert _max_diff(tmp_path / "one.npz", two_vector / f"{i}.npz") <= 1e-6
    assert two["best_round"] == one["best_round"]
    for key in TEST_KEYS:
        if key in one["test"]:
            assert round(two["test"][key], 4) == round(one["test"][key], 4), key


@pytest.fixture(scope="module")
def two_vector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("two-vector")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ATEN_CPU_CAPABILITY", raising=False)
        assert _launch(tmp, VECTOR_JOBS, 2, mp) == 0
    return tmp


def test_an_error_on_one_rank_stops_all_and_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    job = {"config": {"model": "fedmf", "rounds": 30, "params": K8}, "fail_at": [1, 1]}
    code = _launch(tmp_path, [job], 2, monkeypatch)
    err = capfd.readouterr().err
    assert code == 1
    assert "error: rank 1 of 2 failed" in err and "injected failure at round 1" in err, err
    assert not (tmp_path / "0.json").exists()  # rank 0 was stopped before the end of its 30 rounds


def test_plan_only_prints_each_ranks_needs() -> None:
    from models.sim.engine import plan_simulation

    x = synthetic(*SYNTHETIC["synthetic"], seed=SYNTHETIC["seed"])
    text = plan_simulation(SimulationConfig(model="fedrap", params=K8), interactions=x, nproc=3,
                           memory=MemorySettings(private="memory"))
    lines = [line for line in text.splitlines() if line.startswith("rank ")]
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1", "rank 2"]
    sizes = [int(line.split("(")[1].split(")")[0].replace(",", "")) for line in lines]
    assert sum(sizes) == 120 and min(sizes) > 0 and all("memory: estimated peak" in line for line in lines)


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_settings_ranks_cannot_run_are_refused_before_launching(nproc: str) -> None:
    """DP's noise is not in the ranks' aggregation: refused, one rank included (never silently dropped)."""
    from typer.testing import CliRunner

    from fedmask.cli import app

    res = CliRunner().invoke(app, ["simulate", "--model", "fedmf", "--dataset", "synthetic", "--dp-noise", "1",
                                   "--dp-clip", "1", "--nproc", nproc, "--out", "unused"])
    assert res.exit_code == 2 and f"with ranks (--nproc, torchrun; {nproc} here) is not built" in " ".join(
        res.output.split())
