"""The simulator with the private state kept sparsely (D89) against the dense tables.

The same runs with `--private-state memory` and `sparse` reach the same
global model (max |difference| <= 1e-5), the same best round and the same
test figures to 4 decimals, with full and partial cohorts; the sparse store
keeps exactly the devices' current rows and bases; the plan's expected state
bytes are within 10 % of the measured ones; selection still uses validation
only; DP forms dense updates a chunk at a time."""

from __future__ import annotations

import math

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import models.sim.engine as engine
from models.data.synthetic import synthetic
from models.sim.engine import MemorySettings, SimulationConfig, load_global_state, simulate
from models.sim.memory import PrivatePlacement
from models.sim.sparse_state import GARBAGE_FRACTION, SparseTables
from models.sparse import ItemRows, SparseResult

TEST_KEYS = ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10")


@pytest.fixture(scope="module")
def x():
    return synthetic(120, 260, seed=11)


def run(x, tmp: Path, private: PrivatePlacement, **kw) -> tuple[dict, dict[str, np.ndarray]]:
    path = tmp / f"{private}.npz"
    cfg = SimulationConfig(**kw, save_global=str(path), threads=1)
    res = simulate(cfg, interactions=x, memory=MemorySettings(private=private))
    return res, load_global_state(path)


@pytest.mark.parametrize(
    ("model", "kw"),
    [
        ("fedmf", {"rounds": 4}),
        ("pfedrec", {"rounds": 5}),
        ("pfedrec", {"rounds": 6, "clients_per_round": 35}),
        ("fedmf", {"rounds": 4, "clients_per_round": 50}),
    ],
    ids=["fedmf-full", "pfedrec-full", "pfedrec-partial", "fedmf-partial"],
)
def test_sparse_run_is_the_dense_run(x, tmp_path: Path, model: str, kw: dict) -> None:
    kw = kw | {"model": model, "params": {"k": 8}}
    dres, dglob = run(x, tmp_path, "memory", **kw)
    sres, sglob = run(x, tmp_path, "sparse", **kw)
    assert sres["memory"]["sparse"] is True and "sparse" not in dres["memory"]
    assert max(float(np.abs(dglob[k] - sglob[k]).max()) for k in dglob) <= 1e-5
    assert sres["best_round"] == dres["best_round"]
    assert [round(r["val"]["hr@10"], 4) for r in sres["rounds"]] == [round(r["val"]["hr@10"], 4) for r in dres["rounds"]]
    for key in TEST_KEYS:
        assert round(sres["test"][key], 4) == round(dres["test"][key], 4), key
    # what is reported: the state's peak bytes (far below the dense tables for PFedRec) and the peak RSS
    assert 0 < sres["memory"]["private_state_bytes_peak"] and sres["memory"]["peak_rss_bytes"] > 0
    if model == "pfedrec":  # the dense tables' one buffer (D101) against the touched rows
        assert sres["memory"]["private_state_bytes_peak"] < 0.7 * dres["memory"]["private_state_bytes_peak"]


@pytest.mark.parametrize("cohort", [None, 150], ids=["full", "partial"])
def test_plan_predicts_the_state_bytes_within_ten_percent(cohort: int | None) -> None:
    x = synthetic(600, 400, seed=4)
    measured: list[int] = []
    real_end = SparseTables.end_round

    def spy(self: SparseTables) -> None:
        real_end(self)
        measured.append(self.nbytes())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SparseTables, "end_round", spy)
        res = simulate(
            SimulationConfig(model="pfedrec", rounds=8, clients_per_round=cohort, threads=1, params={"k": 8}),
            interactions=x, memory=MemorySettings(private="sparse"),
        )  # fmt: skip
    expected = res["memory"]["state_bytes_expected"]
    assert abs(expected - measured[-1]) <= 0.10 * measured[-1], (expected, measured)
    assert res["memory"]["private_state_bytes_peak"] == max([*measured, res["memory"]["private_state_bytes_peak"]])


def test_store_keeps_the_current_rows_and_bases_only() -> None:
    """Random partial rounds against a plain dict: every device's rows and base are its
    last round's; unreferenced bases and blocks are dropped; garbage stays bounded."""
    n, m, w = 40, 30, 3
    gen = torch.Generator().manual_seed(5)
    store = SparseTables({"w": torch.zeros(n, 2)}, n, {"E": torch.zeros(m, w)}, w)
    oracle: dict[int, tuple[int, dict[int, list[float]]]] = {d: (0, {}) for d in range(n)}
    globals_ = {0: {"E": torch.zeros(m, w)}}
    for r in range(1, 30):
        globals_[r] = {"E": torch.full((m, w), float(r))}
        for rows in torch.randperm(n, generator=gen)[: int(torch.randint(1, n, (1,), generator=gen))].split(7):
            rows = rows.sort().values
            # up to 4 rows per device, some devices none
            keep = torch.rand(rows.numel() * 4, generator=gen) < 0.3
            draws = torch.randint(0, m, (rows.numel() * 4,), generator=gen) + torch.arange(rows.numel()).repeat(4) * m
            keys = torch.unique(draws[keep])
            vals = torch.rand(keys.numel(), w, generator=gen)
            upd = ItemRows.from_keys(keys, vals, rows.numel(), m)
            store.put(rows, SparseResult(dense={"w": torch.full((rows.numel(), 2), float(r))}, rows=upd, update=upd), r, globals_[r])
            for i, d in enumerate(rows.tolist()):
                a, b = int(upd.ptr[i]), int(upd.ptr[i + 1])
                oracle[d] = (r, {int(j): vals[t].tolist() for t, j in zip(range(a, b), upd.items[a:b].tolist(), strict=True)})
        store.end_round()
        view = store.view(torch.arange(n))
        assert view.rows is not None
        for d in range(n):
            base, want = oracle[d]
            assert torch.equal(view.bases[int(view.base_of[d])]["E"], globals_[base]["E"])
            a, b = int(view.rows.ptr[d]), int(view.rows.ptr[d + 1])
            assert {int(j): view.rows.values[t].tolist() for t, j in zip(range(a, b), view.rows.items[a:b].tolist(), strict=True)} == want
        assert store.base_count() == len({v for v, _ in oracle.values()})
        assert store.live_rows() == sum(len(rows) for _, rows in oracle.values())
        allocated = sum(int(blk.items.numel()) for blk in store._blocks.values())
        assert allocated <= (1 + GARBAGE_FRACTION) * store.live_rows() or len(store._blocks) == 1


def test_selection_uses_validation_only_and_tests_the_best_round_when_reached(x, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the sparse path the test figures of the best validation round are computed
    when that round is reached (no second private state is kept); they never
    influence the choice, and the reported ones are that round's."""
    calls: list[str] = []
    real = engine.evaluate_state
    val_hr = [0.2, 0.5, 0.3, 0.45]
    tested: list[float] = []

    def fake(model, global_, private, split, stage, **kw):
        calls.append(stage)
        out = real(model, global_, private, split, stage, **kw)
        if stage == "val":
            out["hr@10"] = val_hr[len([c for c in calls if c == "val"]) - 1]
        else:
            out["hr@10"] = 0.99 - 0.1 * len(tested)  # would win every time if test drove anything
            tested.append(out["hr@10"])
        return out

    monkeypatch.setattr(engine, "evaluate_state", fake)
    res = simulate(SimulationConfig(model="pfedrec", rounds=4, threads=1), interactions=x,
                   memory=MemorySettings(private="sparse"))  # fmt: skip
    assert calls == ["val", "test", "val", "test", "val", "val"]
    assert res["best_round"] == 1 and res["best_val"]["hr@10"] == 0.5
    assert res["test"]["hr@10"] == tested[1]


def test_dp_on_the_sparse_path_is_priced_as_on_the_dense_path(x) -> None:
    """With DP the sparse path aggregates through the same mechanism and
    ledger as the dense one (D88, D87): the same groups and epsilon."""
    cfg = SimulationConfig(model="fedmf", rounds=2, dp_noise=0.5, dp_clip=0.5, threads=1, params={"k": 8})
    sparse = simulate(cfg, interactions=x, memory=MemorySettings(private="sparse"))
    dense = simulate(cfg, interactions=x, memory=MemorySettings(private="memory"))
    assert sparse["epsilon"] == dense["epsilon"] and math.isfinite(sparse["epsilon"])
    for a, b in zip(sparse["rounds"], dense["rounds"]):
        assert a["dp"].keys() == b["dp"].keys() and "clipped_fraction" in a
        for key, value in a["dp"].items():  # measured noise: the same draws, summed in another order
            assert value == (pytest.approx(b["dp"][key], rel=1e-9) if key.endswith("_measured") else b["dp"][key])
    assert np.isfinite(sparse["test"]["hr@10"])


def test_secagg_on_the_sparse_path_gives_the_plain_mean_up_to_fixed_point(x, tmp_path: Path) -> None:
    kw: dict[str, Any] = {"model": "pfedrec", "rounds": 2, "clients_per_round": 12, "params": {"k": 4}}
    _, plain = run(x, tmp_path, "sparse", **kw)
    path = tmp_path / "secagg.npz"
    res = simulate(SimulationConfig(**kw, secagg=True, save_global=str(path), threads=1), interactions=x,
                   memory=MemorySettings(private="sparse"))  # fmt: skip
    secure = load_global_state(path)
    assert res["rounds"][0]["secagg_exact"] is True
    assert max(float(np.abs(plain[k] - secure[k]).max()) for k in plain) < 1e-3


def test_sparse_is_refused_for_a_model_without_it(x) -> None:
    with pytest.raises(engine.SimulationConfigError, match="no sparse path"):
        simulate(SimulationConfig(model="fedrap", rounds=1, threads=1), interactions=x,
                 memory=MemorySettings(private="sparse"))  # fmt: skip


def test_cli_plan_only_prints_the_state_by_rounds(tmp_path: Path, command_app) -> None:
    from typer.testing import CliRunner

    from fedmask.commands.simulate import register_simulate

    out = CliRunner().invoke(
        command_app(register_simulate),
        ["simulate", "--model", "pfedrec", "--dataset", "synthetic", "--plan-only", "--rounds", "20",
         "--clients-per-round", "100", "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "sparse private state" in out.output and "rounds  private state" in out.output
    lines = [ln.split() for ln in out.output.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert [int(ln[0]) for ln in lines] == [1, 2, 5, 10, 20]
    sizes = [int(ln[1].replace(",", "")) for ln in lines]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # partial cohorts: the state grows with rounds
    assert not (tmp_path / "o").exists()  # nothing was trained or written
