"""FedRAP's compiled kernel (models/fedrap_compiled.py, D97) against the torch path,
and the outputs a whole-population round writes over memory already mapped."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import models.fedrap as fedrap_mod
from models import fedrap_compiled
from models.base import LocalRound
from models.data.sampling import cohort_data
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.fedrap import FedRAP
from models.sim.aggregation import sum64
from models.sim.config import MemorySettings
from models.sim.engine import SimulationConfig, load_global_state, simulate
from models.sim.private_tables import PrivateTables
from models.sim.study import config_matches

pytestmark = pytest.mark.skipif(not fedrap_compiled.available(), reason="numba (the fast extra) is not installed")

VARIANTS = [
    {},
    {"variant": "c_only"},
    {"variant": "d_only", "init_std_d": 0.1},
    {"item_bias": True, "update_scale": 3.0},
    {"weight_decay_d": 0.1, "v1": 1e-3},
    {"recency": 0.0, "n_neg": 0},
]


@pytest.fixture(scope="module")
def split():
    return leave_one_out(synthetic(90, 240, seed=4), seed=0)


@pytest.mark.parametrize("params", VARIANTS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_one_local_update_matches_torch(split, params: dict, chunk: int) -> None:
    """Every output of one local update (u, b, D, the sent update) within float32
    rounding of the torch path's, for chunks of one device, uneven chunks and one chunk."""
    rows = torch.arange(0, split.n_users, 2)  # 45 devices: 5 does not divide it
    data = cohort_data(split, rows)
    outs = []
    for kernel in ("torch", "compiled"):
        m = FedRAP(split.n_users, split.n_items, k=8, local_epochs=3, chunk=chunk, kernel=kernel, **params)
        g0 = m.init_global(torch.Generator().manual_seed(0))
        if g0:  # a trained C, so that every term of the split step is non-zero
            g0["C"] = g0["C"] + 0.05
        p0 = m.init_private(data, g0, 1)
        outs.append(m.local_update(LocalRound(g0, p0, data, round_idx=6, seed=2)))
    (p_t, u_t), (p_c, u_c) = outs
    assert u_t.shape == u_c.shape
    assert torch.allclose(u_t, u_c, atol=2e-6, rtol=1e-5), float((u_t - u_c).abs().max())
    for key in p_t:
        assert torch.allclose(p_t[key], p_c[key], atol=2e-6, rtol=1e-5), (key, float((p_t[key] - p_c[key]).abs().max()))
    if params.get("variant") != "d_only":
        assert u_c.abs().max() > 1e-4  # the devices really trained
    assert p_c["u"].sub(p_t["u"]).abs().max() < 1e-5 and not torch.equal(p_c["u"], p0["u"])


def test_five_rounds_give_the_same_model_and_figures(split) -> None:
    """A whole simulation: the final C within 1e-5, the same best round and test HR@10 to 4 decimals."""
    runs = {}
    x = synthetic(200, 500, seed=3)
    for kernel in ("torch", "compiled"):
        out = Path(tempfile.mkdtemp()) / "g.npz"
        res = simulate(SimulationConfig(model="fedrap", rounds=5, threads=2, params={"kernel": kernel},
                                        save_global=str(out)), interactions=x)
        runs[kernel] = (load_global_state(out), res)
    (g_t, r_t), (g_c, r_c) = runs["torch"], runs["compiled"]
    assert float(np.abs(g_t["C"] - g_c["C"]).max()) < 1e-5
    assert r_t["best_round"] == r_c["best_round"]
    assert round(r_t["test"]["hr@10"], 4) == round(r_c["test"]["hr@10"], 4)
    assert "kernel" not in r_t["model_config"] and r_c["model_config"]["kernel"] == "compiled"


def test_the_kernel_is_recorded_only_when_compiled(tmp_path: Path) -> None:
    """A run made before the option existed (no `kernel` in its model_config) still
    matches a torch run; a compiled run does not."""
    torch_cfg, compiled_cfg = FedRAP(10, 20).config(), FedRAP(10, 20, kernel="compiled").config()
    assert "kernel" not in torch_cfg and compiled_cfg == torch_cfg | {"kernel": "compiled"}
    wanted = {"model": "fedrap", "rounds": 3}
    results = json.loads(json.dumps({"config": wanted, "test": {}, "model_config": torch_cfg}))
    assert config_matches(results, wanted, 3, model_config=torch_cfg)
    assert not config_matches(results, wanted, 3, model_config=compiled_cfg)


def test_bad_kernels_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown FedRAP kernel 'cuda'"):
        FedRAP(10, 20, kernel="cuda")
    monkeypatch.setattr(fedrap_compiled, "available", lambda: False)
    with pytest.raises(ValueError, match=r"pip install 'fedmask\[fast\]'"):
        FedRAP(10, 20, kernel="compiled")


@pytest.mark.parametrize(("params", "cohort"), [({}, None), ({"kernel": "compiled"}, None),
                                               ({"variant": "c_only", "item_bias": True}, None), ({}, 50),
                                               ({"kernel": "compiled", "dp": True}, None)],
                         ids=["torch", "compiled", "c_only-bias", "cohort-of-50", "compiled-dp-stream"])
def test_writing_over_spare_tables_changes_nothing(monkeypatch: pytest.MonkeyPatch, params: dict,
                                                   cohort: int | None) -> None:
    """Rounds that write their outputs over the spare tables (in place, or over a stale
    state) give the same run bit for bit as rounds that allocate fresh ones, and they do use them;
    with DP the table the mechanism's stream has copied is the next round's spare."""
    params = dict(params)
    dp: dict[str, Any] = (dict(dp_noise=2.0, dp_clip=0.1, dp_mode="distributed", unmasked_sum=True)
                          if params.pop("dp", False) else {})
    x = synthetic(120, 300, seed=5)
    used: list[bool] = []
    reuse = fedrap_mod.reuse_or_empty

    def counted(spare: torch.Tensor | None, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        out = reuse(spare, shape, device)
        used.append(out is spare)
        return out

    monkeypatch.setattr(fedrap_mod, "reuse_or_empty", counted)
    runs = []
    for spare in (True, False):
        if not spare:  # every output in fresh memory
            monkeypatch.setattr(fedrap_mod, "reuse_or_empty", lambda _s, shape, device: torch.empty(shape, device=device))
        out = Path(tempfile.mkdtemp()) / "g.npz"
        res = simulate(SimulationConfig(model="fedrap", rounds=6, threads=2, params=params, save_global=str(out),
                                        clients_per_round=cohort, **dp), interactions=x)
        runs.append((load_global_state(out), res))
        if spare:
            assert sum(used) >= 5  # the update table of every round after the first (D in every round when summed)
            if cohort is None and params.get("variant") != "c_only":
                # and D in most rounds; compiled, the updates are summed (D102): D in all 6, no table
                assert sum(used) >= (6 if params.get("kernel") == "compiled" and not dp else 8)
    (g0, r0), (g1, r1) = runs
    assert all(np.array_equal(g0[k], g1[k]) for k in g0)
    assert r0["test"] == r1["test"] and [r["val"] for r in r0["rounds"]] == [r["val"] for r in r1["rounds"]]


def test_the_spare_buffer_is_never_the_kept_best() -> None:
    state = {"D": torch.zeros(4, 3), "u": torch.zeros(4, 2)}
    t = PrivateTables.in_memory(state, 4)
    t.begin_round(covers_all=True)
    assert t.spare() is state  # the current state, written in place: nothing keeps it
    t.put(None, {k: v + 1 for k, v in state.items()})
    t.end_round()
    t.keep_best()
    t.begin_round(covers_all=True)
    assert t.spare() is None  # the other buffer does not exist yet; the best is never offered
    t.put(None, {k: v + 2 for k, v in state.items()})
    t.end_round()
    t.keep_best()
    t.begin_round(covers_all=True)
    stale = t.spare()
    assert stale is not None and float(stale["D"][0, 0]) == 1.0  # the state before the best: stale
    assert t.spare() is not t.table("best")
    assert PrivateTables.on_disk({"D": torch.zeros(3)}, 2, tempfile.mkdtemp()).spare() is None


def test_sum64_is_the_float64_sum() -> None:
    """Row by row in float64: equal to torch's sum where the sum is exact (integers), and
    the same float32 mean on ordinary updates."""
    g = torch.Generator().manual_seed(0)
    ints = torch.randint(-1000, 1000, (300, 50), generator=g).to(torch.float32)
    assert torch.equal(sum64(ints), ints.sum(0, dtype=torch.float64))
    upd = torch.randn(500, 2000, generator=g) * 1e-3
    assert sum64(upd).dtype == torch.float64
    assert torch.equal((sum64(upd) / 500).float(), (upd.sum(0, dtype=torch.float64) / 500).float())
    assert torch.equal(sum64(upd[:1]), upd[0].double())


@pytest.mark.parametrize("params", VARIANTS[:2] + VARIANTS[3:4], ids=["default", "c_only", "item_bias"])
@pytest.mark.parametrize("threads", [1, 2])
def test_summed_updates_are_the_tables_sum(split, params: dict, threads: int) -> None:
    """With `sum_into` (D102) the compiled kernel returns no update table and adds the
    updates into the float64 sum: equal to sum64 of the table it writes without it,
    whatever the worker threads; the private outputs are the same bit for bit."""
    rows = torch.arange(0, split.n_users, 2)
    data = cohort_data(split, rows)
    m = FedRAP(split.n_users, split.n_items, k=8, local_epochs=3, chunk=2, kernel="compiled", **params)
    assert m.sums_updates()
    g0 = m.init_global(torch.Generator().manual_seed(0))
    g0["C"] = g0["C"] + 0.05
    p0 = m.init_private(data, g0, 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p_t, u_t = m.local_update(LocalRound(g0, p0, data, round_idx=6, seed=2))
        total = torch.full((m.update_dim,), 0.25, dtype=torch.float64)  # it adds to what is there
        p_s, u_s = m.local_update(LocalRound(g0, p0, data, round_idx=6, seed=2, sum_into=total))
    finally:
        torch.set_num_threads(before)
    assert u_s.shape == (rows.numel(), 0) and u_t.shape == (rows.numel(), m.update_dim)
    assert torch.allclose(total - 0.25, sum64(u_t), rtol=1e-12, atol=1e-12)
    assert float(sum64(u_t).abs().max()) > 1e-3  # a real sum
    assert all(torch.equal(p_t[k], p_s[k]) for k in p_t)
    with pytest.raises(ValueError, match="float64"):
        m.local_update(LocalRound(g0, p0, data, round_idx=6, seed=2, sum_into=torch.zeros(m.update_dim)))
    assert not FedRAP(10, 20).sums_updates() and not FedRAP(10, 20, variant="d_only", kernel="compiled").sums_updates()


@pytest.mark.parametrize("chunk", [None, 37], ids=["whole", "chunks-of-37"])
def test_a_summed_run_is_the_run_with_tables(monkeypatch: pytest.MonkeyPatch, chunk: int | None) -> None:
    """A whole compiled simulation with the updates summed in the kernel (D102) against the
    same run with update tables: the same global model (within float64 rounding of the sum,
    1e-6), the same best round and test figures; unchunked and in chunks."""
    x = synthetic(120, 300, seed=5)
    runs = []
    for summed in (True, False):
        if not summed:
            monkeypatch.setattr(FedRAP, "sums_updates", lambda self: False)
        out = Path(tempfile.mkdtemp()) / "g.npz"
        res = simulate(SimulationConfig(model="fedrap", rounds=6, threads=2, params={"kernel": "compiled"},
                                        save_global=str(out)), interactions=x,
                       memory=MemorySettings(budget_gb=64, cohort_chunk=chunk, private="memory"))
        runs.append((load_global_state(out), res))
    (g0, r0), (g1, r1) = runs
    assert float(np.abs(g0["C"] - g1["C"]).max()) < 1e-6
    assert r0["best_round"] == r1["best_round"]
    assert {k: round(v, 4) for k, v in r0["test"].items()} == {k: round(v, 4) for k, v in r1["test"].items()}
    assert r0["memory"]["chunk"] == r1["memory"]["chunk"] == (chunk or 120)
