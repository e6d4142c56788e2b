"""Bounded memory: the plan, chunked cohorts, memory-mapped private state, refusal.

A chunked run (and one with its private state in memory-mapped files) reaches
the same global model as the unchunked run: max |difference| <= 1e-5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.data.synthetic import synthetic
from models.sim.engine import MemorySettings, SimulationConfig, SimulationConfigError, load_global_state, simulate
from models.sim.memory import GIB, Footprint, MemoryBudgetError, PrivatePlacement, plan_memory
from models.sim.private_tables import PrivateTables


@pytest.fixture(scope="module")
def x():
    return synthetic(90, 220, seed=7)


def run(x, tmp: Path, name: str, mem: MemorySettings | None = None, **kw) -> tuple[dict, dict[str, np.ndarray]]:
    kw.setdefault("rounds", 3)
    kw.setdefault("model", "fedrap")
    path = tmp / f"{name}.npz"
    res = simulate(SimulationConfig(**kw, save_global=str(path), threads=1), interactions=x, memory=mem)
    return res, load_global_state(path)


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.fixture(scope="module")
def unchunked(x, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unchunked")
    return run(x, tmp, "full", MemorySettings(budget_gb=64, private="memory"), params={"k": 8})


def test_unchunked_plan_trains_the_cohort_at_once(unchunked) -> None:
    res, _ = unchunked
    assert res["memory"]["chunked"] is False and res["memory"]["private_on_disk"] is False
    assert res["memory"]["ram_estimate"] > 0 and res["memory"]["disk_bytes_peak"] == 0


def test_chunked_in_ram_reaches_the_same_global_model(x, tmp_path: Path, unchunked) -> None:
    res0, g0 = unchunked
    res, g = run(x, tmp_path, "c", MemorySettings(budget_gb=64, cohort_chunk=7, private="memory"), params={"k": 8})
    assert res["memory"]["chunk"] == 7 and res["memory"]["chunked"] is True
    assert max_diff(g, g0) <= 1e-5
    assert res["best_round"] == res0["best_round"]
    assert res["test"]["hr@10"] == pytest.approx(res0["test"]["hr@10"], abs=0.02)


def test_private_state_on_disk_reaches_the_same_global_model(x, tmp_path: Path, unchunked) -> None:
    _, g0 = unchunked
    state = tmp_path / "state"
    res, g = run(
        x, tmp_path, "d", MemorySettings(budget_gb=64, cohort_chunk=16, private="disk", state_dir=str(state)),
        params={"k": 8},
    )  # fmt: skip
    assert res["memory"]["private_on_disk"] is True
    assert res["memory"]["disk_bytes_peak"] > 0  # the files really held the rows
    assert max_diff(g, g0) <= 1e-5
    assert list(state.iterdir()) == []  # the memory-mapped files are removed at the end


def test_partial_cohorts_chunked_on_disk_match_unchunked(x, tmp_path: Path) -> None:
    """Partial cohorts write rows in place: the kept best state is copied on write.
    (server_lr 2: with 40 of 90 devices the default 10 makes C grow to ~1e4 in four
    rounds, where float32 rounding alone exceeds 1e-5.)"""
    kw = {"clients_per_round": 40, "params": {"k": 8, "server_lr": 2.0}, "rounds": 4}
    res0, g0 = run(x, tmp_path, "p0", MemorySettings(budget_gb=64, private="memory"), **kw)
    res1, g1 = run(x, tmp_path, "p1", MemorySettings(budget_gb=64, cohort_chunk=9, private="disk"), **kw)
    assert max_diff(g1, g0) <= 1e-5
    assert res1["best_round"] == res0["best_round"]
    assert res1["test"]["hr@10"] == pytest.approx(res0["test"]["hr@10"], abs=0.02)


def test_a_table_that_starts_at_zero_takes_disk_only_for_the_devices_that_trained(x, tmp_path: Path) -> None:
    """D104: FedRAP's D_i starts at zero, so on disk its rows are written only once a
    device trains (the files are sparse) and a device never trained is read as zeros,
    not from the file. One round of 10 of 90 devices: the same model and figures as in
    RAM (every row evaluated, trained or not), D's disk for about those 10, and the plan
    sizes D's disk for cohort x rounds devices."""
    kw = {"clients_per_round": 10, "params": {"k": 8}, "rounds": 1}
    res0, g0 = run(x, tmp_path, "z0", MemorySettings(budget_gb=64, cohort_chunk=4, private="memory"), **kw)
    res1, g1 = run(x, tmp_path, "z1", MemorySettings(budget_gb=64, cohort_chunk=4, private="disk"), **kw)
    assert max_diff(g1, g0) == 0.0 and res1["test"] == res0["test"] and res1["rounds"][0]["val"] == res0["rounds"][0][
        "val"]
    d_row = 4 * x.n_items * 8
    small = x.n_users * 4 * (8 + 1)  # u and b: every device's, written at init
    mem = res1["memory"]
    assert mem["disk_estimate"] == small + 10 * d_row  # D for the cohort x rounds devices only
    assert mem["disk_bytes_peak"] < small + 10 * d_row + 64 * 4096  # a few blocks of slack, never 90 rows of D
    assert 10 * d_row <= mem["disk_bytes_peak"]
    from models.sim.engine import plan_simulation

    text = plan_simulation(SimulationConfig(model="fedrap", threads=1, clients_per_round=10, params={"k": 8},
                                            rounds=3), interactions=x,
                           memory=MemorySettings(budget_gb=64, cohort_chunk=4, private="disk"))
    one, three = small + 10 * d_row, small + 30 * d_row  # 10 devices a round at most
    assert f"at most {one:,d} bytes" in text and f"{three:,d} bytes" in text and "after round 3" in text


def test_rows_never_written_read_as_zeros_and_zero_rows_are_not_written(tmp_path: Path) -> None:
    """PrivateTables on disk: an all-zero row (+0.0 bits) is not written where nothing was;
    -0.0 is written (it is not what a hole reads as); `take`, `take_items` and the copy of a
    kept best state see zeros in the rows never written."""
    row = {"D": torch.zeros(1, 6, 2), "u": torch.zeros(1, 2)}
    t = PrivateTables.on_disk(row, 8, tmp_path)
    t.begin_round(covers_all=True)
    d = torch.zeros(8, 6, 2)
    d[3] = 1.5
    d[5, 0, 0] = -0.0
    t.put(None, {"D": d, "u": torch.ones(8, 2)})
    t.end_round()
    written = t._written(t.current)
    assert written["D"].tolist() == [False, False, False, True, False, True, False, False]
    assert bool(written["u"].all())
    got = t.take(torch.tensor([5, 0, 3]))
    assert torch.equal(got["D"], d[[5, 0, 3]]) and str(got["D"][0, 0, 0].item()) == "-0.0"
    items = torch.tensor([[1, 4], [0, 5], [2, 2]])
    gathered = t.take_items(torch.tensor([5, 0, 3]), items, ("D",))
    assert torch.equal(gathered["D"], d[[5, 0, 3]][torch.arange(3).unsqueeze(1), items])
    t.keep_best()  # the next round writes the other buffer, copying the written rows only
    t.begin_round(covers_all=False)
    t.put(torch.tensor([0]), {"D": torch.full((1, 6, 2), 2.0), "u": torch.zeros(1, 2)})
    t.end_round()
    now, best = t.take(torch.arange(8)), t.take(torch.arange(8), "best")
    assert torch.equal(best["D"], d) and torch.equal(now["D"][1:], d[1:]) and bool((now["D"][0] == 2.0).all())
    t.close()


@pytest.mark.parametrize("group_size", [None, 4])
def test_chunked_secagg_and_dp_reach_the_same_model_one_group_held(x, tmp_path: Path, group_size: int | None) -> None:
    """The discrete Gaussian through SecAgg, chunked (D100): the chunks are
    cut group by group and the noise drawn in that order whatever the
    chunking, so the model is the unchunked run's; the secure sum holds one
    group's residues at a time."""
    kw = {"model": "fedmf", "clients_per_round": 12, "secagg": True, "dp_noise": 0.5, "dp_clip": 1.0,
          "params": {"k": 4}, "rounds": 2, "secagg_group_size": group_size}  # fmt: skip
    res0, g0 = run(x, tmp_path, "s0", MemorySettings(budget_gb=64), **kw)
    res1, g1 = run(x, tmp_path, "s1", MemorySettings(budget_gb=64, cohort_chunk=5), **kw)
    assert max_diff(g1, g0) <= 1e-5
    groups = 1 if group_size is None else 3
    for rec in res1["rounds"]:
        assert rec["secagg_exact"] and rec["secagg_groups"] == groups and rec["secagg_counted"] == 12
        assert rec["secagg_rows_held_peak"] <= 12 // groups


@pytest.mark.parametrize("model,private", [("fedrap", "memory"), ("fedmf", "sparse")])
def test_chunked_secagg_feeds_the_secure_sum_group_by_group(x, tmp_path: Path, model: str,
                                                            private: PrivatePlacement) -> None:
    """SecAgg without DP (D100): a chunked round trains the cohort group by
    group and hands each chunk to the secure sum, which holds at most one
    group's rows; the model is the unchunked run's (the sum is exact; only
    the float32 order inside a chunk may differ)."""
    kw = {"model": model, "clients_per_round": 40, "secagg": True, "secagg_group_size": 8, "params": {"k": 4},
          "rounds": 2}  # fmt: skip
    res0, g0 = run(x, tmp_path, f"{model}-0", MemorySettings(budget_gb=64, private=private), **kw)
    res1, g1 = run(x, tmp_path, f"{model}-1", MemorySettings(budget_gb=64, cohort_chunk=7, private=private), **kw)
    assert res1["memory"]["chunk"] == 7
    assert max_diff(g1, g0) <= 1e-5
    for rec in res1["rounds"]:
        assert rec["secagg_exact"] and rec["secagg_counted"] == 40 and rec["secagg_groups"] == 5
        assert rec["secagg_rows_held_peak"] <= max(rec["secagg_group_sizes"])  # never the cohort's 40
    assert [r["secagg_exact"] for r in res0["rounds"]] == [True, True]


@pytest.mark.parametrize("model", ["fedrap", "fedmf"])
def test_a_ranks_secure_sum_is_fed_group_by_group(x, tmp_path: Path, model: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank (D93; here the only one, in this process) feeds its own groups as
    its chunks train, holding one group's rows, never its share's table; its
    model is the single-process secure run's (the decoded sums are equal bit
    for bit, rank or not; only the float32 order inside a chunk may differ)."""
    from models.sim.rank_round import RankAggregator
    from models.sim.ranks import Ranks

    def no_table(*args: object) -> None:
        raise AssertionError("the rank's share was summed from a whole table")

    monkeypatch.setattr(RankAggregator, "_fed_whole", no_table)

    kw: dict[str, Any] = {"model": model, "clients_per_round": 40, "secagg": True, "secagg_group_size": 8,
                          "params": {"k": 4}, "rounds": 2}  # fmt: skip
    one, g_one = run(x, tmp_path, f"{model}-one", MemorySettings(budget_gb=64), **kw)
    path = tmp_path / f"{model}-rank.npz"
    ranked = simulate(SimulationConfig(**kw, save_global=str(path), threads=1), interactions=x,
                      memory=MemorySettings(budget_gb=64, cohort_chunk=7), ranks=Ranks(0, 1))  # fmt: skip
    assert ranked["memory"]["chunk"] == 7
    assert max_diff(load_global_state(path), g_one) <= 1e-5
    for rec in ranked["rounds"]:
        assert rec["secagg_exact"] and rec["secagg_counted"] == 40 and rec["secagg_groups"] == 5
        assert 0 < rec["secagg_rows_held_peak"] <= 9  # one group of 8 or 9, never the 40 of the share
    assert [r["val"]["hr@10"] for r in ranked["rounds"]] == pytest.approx([r["val"]["hr@10"] for r in one["rounds"]])


def test_the_plan_counts_one_group_not_the_cohort_table_for_secagg(x) -> None:
    """The memory plan of a streamed secure sum counts its largest group's
    rows, with DP under the float Gaussian too (streamed since D106)."""
    from models.sim.aggregation import stream_working_bytes
    from models.sim.memory import SECAGG_BYTES_PER_COORD

    cfg = SimulationConfig(model="fedrap", secagg=True, secagg_group_size=100)
    assert stream_working_bytes(cfg, 1000, 1050) == 105 * 1000 * (4 + SECAGG_BYTES_PER_COORD)  # 10 groups, 105 each
    # a rank's share changes from round to round: any share below 2G is one group
    assert stream_working_bytes(cfg, 1000, 1050, ranked=True) == 199 * 1000 * (4 + SECAGG_BYTES_PER_COORD)
    assert stream_working_bytes(cfg, 1000, 150, ranked=True) == 150 * 1000 * (4 + SECAGG_BYTES_PER_COORD)
    floats = SimulationConfig(model="fedrap", secagg=True, secagg_group_size=100, dp_noise=0.5, dp_clip=1.0,
                              dp_mechanism="gaussian-float")
    # the float Gaussian's stream (D106): two float64 sums and the secure stream's group
    assert stream_working_bytes(floats, 1000, 1050) == 16 * 1000 + 105 * 1000 * (4 + SECAGG_BYTES_PER_COORD)


def test_one_buffer_of_private_state_on_disk(x, tmp_path: Path) -> None:
    """D101: the best round is tested when reached, not kept, so the
    memory-mapped files never hold a second copy of the private state (they
    did from round 2 on, once round 1 was the kept best)."""
    res, _ = run(x, tmp_path, "one", MemorySettings(budget_gb=64, cohort_chunk=20, private="disk",
                                                    state_dir=str(tmp_path / "state")), params={"k": 8}, rounds=4)
    mem = res["memory"]
    # allocated blocks: a file system block or so above the rows, never a second buffer
    assert mem["private_on_disk"] and 0 < mem["disk_bytes_peak"] < 1.2 * mem["private_bytes"]
    assert mem["disk_estimate"] == mem["private_bytes"]


def test_the_reported_test_figures_are_the_best_rounds(x, tmp_path: Path) -> None:
    """The test figures computed when the best validation round is reached
    equal those of a run that stops at that round (whose final state it is)."""
    kw = {"params": {"k": 8}, "eval_every": 1}
    full, _ = run(x, tmp_path, "long", MemorySettings(budget_gb=64, private="memory"), rounds=5, **kw)
    best = full["best_round"]
    stop, _ = run(x, tmp_path, "stop", MemorySettings(budget_gb=64, private="memory"), rounds=best + 1, **kw)
    assert stop["best_round"] == best
    assert stop["test"] == full["test"]


def test_a_budget_that_cannot_be_met_is_refused_before_training(x) -> None:
    with pytest.raises(SimulationConfigError, match=r"needs about .* more than the budget --memory-gb 0\.01"):
        simulate(SimulationConfig(model="fedrap", rounds=1), interactions=x, memory=MemorySettings(budget_gb=0.01))


def fp(**kw) -> Footprint:
    base = dict(population=10_000, cohort=10_000, private_per_device=1_536_132, train_fixed=400 * 1024**2,
                train_per_device=4_800_000, global_bytes=1_536_000, update_dim=384_000, data_bytes=300 * 1024**2,
                eval_per_device=5_000_000, keep_updates=False, secagg=False)  # fmt: skip
    return Footprint(**(base | kw))


def test_plan_picks_the_largest_chunk_that_fits_and_disk_when_ram_cannot_hold_the_state() -> None:
    f = fp()
    assert f.ram(f.cohort, False) > 8 * GIB  # the unchunked run would not fit
    plan = plan_memory(f, budget=8 * GIB, disk_free=100 * GIB)
    assert plan.private_on_disk  # 2 x 15 GB of D_i cannot stay in RAM
    assert plan.ram_estimate <= 8 * GIB < f.ram(plan.chunk + 1, True)
    assert plan.disk_estimate == f.private_total  # one buffer (D101)
    small = fp(population=500, cohort=500)
    p2 = plan_memory(small, budget=8 * GIB)
    assert not p2.chunked and not p2.private_on_disk
    with pytest.raises(MemoryBudgetError, match="of disk"):
        plan_memory(f, budget=8 * GIB, disk_free=GIB)
    with pytest.raises(MemoryBudgetError, match="needs about"):
        plan_memory(fp(keep_updates=True, secagg=True), budget=8 * GIB, disk_free=100 * GIB)


def test_the_whole_population_over_its_own_state_counts_it_once() -> None:
    """D102: the whole population trained at once over its state in RAM (rows by
    reference, new rows written over them) is planned with `whole_train`, not with a
    chunk's copies; a partial cohort or the state on disk still plans chunks."""
    whole = 10_000 * 20_000 + 400 * 1024**2  # no copies of the rows: small outputs a device
    f = fp(whole_train=whole)
    assert f.ram(f.cohort, False) == f.static(False) + max(whole + 8 * f.update_dim, f.evaluation())
    budget = f.ram(f.cohort, False) + GIB
    assert fp().ram(fp().cohort, False) > budget  # planned as chunks, the cohort at once would not fit
    plan = plan_memory(f, budget=budget, disk_free=100 * GIB)
    assert not plan.chunked and not plan.private_on_disk and plan.ram_estimate == f.ram(f.cohort, False)
    assert plan_memory(f, budget=budget, chunk=1_000, disk_free=100 * GIB).chunk == 1_000  # asked for chunks
    for other in (fp(whole_train=whole, cohort=5_000), f):
        placed = plan_memory(other, budget=budget, private="disk" if other is f else "auto", disk_free=100 * GIB)
        assert placed.ram_estimate == other.ram(placed.chunk, placed.private_on_disk)
        assert not other.in_place(placed.chunk, placed.private_on_disk)


def test_the_update_table_a_whole_cohort_round_keeps_is_counted_through_evaluation() -> None:
    """D97, D103: a round that trains its cohort at once keeps its update table for the
    next round to write over, so evaluation runs beside it; a chunked round keeps none.
    The plan sizes it for plain rounds (unless the model sums) and DP streams, not ranks."""
    kept = 4 * 10_000 * 384_000
    f = fp(kept_table=kept, train_per_device=1_000_000)  # the evaluation beside the table outweighs training
    assert f.evaluation(f.cohort) == f.evaluation() + kept and f.evaluation(f.cohort - 1) == f.evaluation()
    assert f.ram(f.cohort, False) == f.static(False) + f.evaluation() + kept > fp(train_per_device=1_000_000).ram(
        f.cohort, False)
    budget = f.ram(f.cohort, False) - 1  # the cohort at once fits only without the kept table
    assert plan_memory(f, budget=budget, disk_free=100 * GIB).chunk == f.cohort - 1
    from models.sim.training import kept_table_bytes

    table = 4 * 100 * 64
    plain, dp = SimulationConfig(model="fedrap"), SimulationConfig(model="fedrap", dp_noise=1.0, dp_clip=0.1,
                                                                   dp_mode="distributed", unmasked_sum=True)
    assert kept_table_bytes(plain, 64, 100, ranked=False, summed=False) == table
    assert kept_table_bytes(plain, 64, 100, ranked=False, summed=True) == 0  # summed in the model (D102)
    assert kept_table_bytes(dp, 64, 100, ranked=False, summed=False) == table  # the table the DP stream copied
    assert kept_table_bytes(plain, 64, 100, ranked=True, summed=False) == 0  # a rank sums its own way
    floats = SimulationConfig(model="fedrap", dp_noise=1.0, dp_clip=0.1, dp_mechanism="gaussian-float")
    secure = SimulationConfig(model="fedrap", secagg=True)
    assert kept_table_bytes(floats, 64, 100, ranked=False, summed=False) == table  # its stream copies too (D106)
    assert kept_table_bytes(secure, 64, 100, ranked=False, summed=False) == 0  # fed to the secure sum


def test_fedraps_plan_counts_the_rows_it_takes_unless_in_place() -> None:
    from models.fedrap import FedRAP

    m = FedRAP(100, 1_000, k=8, kernel="compiled")
    table = 4 * 1_000 * 8
    fixed, per = m.train_memory(table + 40, 20)
    fixed_s, per_s = m.train_memory(table + 40, 20, summed=True)
    _, per_w = m.train_memory(table + 40, 20, in_place=True, summed=True)
    assert per - per_s == table and fixed_s > fixed  # the update row gone, a float64 partial per thread
    assert per_s - per_w == 2 * table + 40  # neither the taken rows nor a new D_i
    assert FedRAP(100, 1_000, k=8).train_memory(table, 20, summed=True) == FedRAP(100, 1_000, k=8).train_memory(table, 20)


def test_disk_tables_copy_on_write_keeps_the_best_state(tmp_path: Path) -> None:
    row = {"D": torch.zeros(1, 3, 2), "b": torch.zeros(1)}
    t = PrivateTables.on_disk(row, 5, tmp_path)
    t.begin_round(covers_all=True)
    t.put(torch.arange(5), {"D": torch.ones(5, 3, 2), "b": torch.arange(5.0)})
    t.end_round()
    t.keep_best()
    t.begin_round(covers_all=False)  # the best is current: writes go to the other buffer, a copy
    t.put(torch.tensor([1, 3]), {"D": torch.full((2, 3, 2), 7.0), "b": torch.tensor([-1.0, -3.0])})
    t.end_round()
    cur = t.take(torch.arange(5))
    best = t.take(torch.arange(5), "best")
    assert torch.equal(best["b"], torch.arange(5.0)) and torch.equal(best["D"], torch.ones(5, 3, 2))
    assert cur["b"].tolist() == [0.0, -1.0, 2.0, -3.0, 4.0] and float(cur["D"][1].max()) == 7.0
    assert float(cur["D"][0].max()) == 1.0  # rows outside the cohort were carried over
    t.close()
    assert not any(tmp_path.iterdir())


def test_cli_prints_the_plan_and_refuses_a_budget_it_cannot_meet(tmp_path: Path, command_app) -> None:
    from typer.testing import CliRunner

    from fedmask.commands.simulate import register_simulate

    app = command_app(register_simulate)
    base = ["simulate", "--model", "fedrap", "--dataset", "synthetic", "--rounds", "1", "-p", "k=4", "--threads", "1"]
    r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a"), "--memory-gb", "0.01"])
    assert r.exit_code == 2 and "more than the budget --memory-gb 0.01" in r.output
    assert not (tmp_path / "a" / "results.json").exists()  # refused before training
    r = CliRunner().invoke(
        app, [*base, "--out", str(tmp_path / "b"), "--memory-gb", "4", "--cohort-chunk", "50", "--private-state", "disk",
              "--state-dir", str(tmp_path / "state")],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "memory: estimated peak" in r.output and "training 50 of" in r.output and "memory-mapped files" in r.output
    res = (tmp_path / "b" / "results.json").read_text()
    assert '"private_on_disk": true' in res


def take_the_table_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on a round trains without feeding any stream and keeps the
    cohort's table (the plan counts it), and `aggregate_round` feeds the
    table to the round's streams at once: the path a streamed round must equal."""
    import models.sim.engine as engine
    import models.sim.sparse_training as sparse_training
    import models.sim.training as training

    monkeypatch.setattr(engine, "round_streams", lambda *args: (None, None))
    for module in (training, sparse_training):
        monkeypatch.setattr(module, "streams_dp", lambda config: False)
        monkeypatch.setattr(module, "streams_secure", lambda config: False)


@pytest.mark.parametrize("model,secagg", [("fedrap", False), ("fedrap", True), ("fedmf", True)])
def test_chunked_float_gaussian_rounds_stream_the_updates(x, tmp_path: Path, model: str, secagg: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The float Gaussian (D106) feeds each chunk's updates to its stream,
    group by group with --secagg, each device noised on its own in the
    stream's order, while no round keeps the table and a secure sum holds
    one group. Without --secagg the chunks are the table path's: the same
    run bit for bit. With it they are cut group by group, so the devices'
    float32 updates may differ in the last bit (not the draws: the noise
    does not depend on the values)."""
    kw: dict[str, Any] = {"model": model, "dp_noise": 0.5, "dp_clip": 1.0,
                          "dp_mode": "distributed" if secagg else "local", "dp_mechanism": "gaussian-float",
                          "secagg": secagg, "params": {"k": 4}, "rounds": 2, "clients_per_round": 40}  # fmt: skip
    if secagg:
        kw["secagg_group_size"] = 8
    mem = MemorySettings(budget_gb=64, cohort_chunk=7)
    res1, g1 = run(x, tmp_path, "streamed", mem, **kw)
    take_the_table_path(monkeypatch)
    res0, g0 = run(x, tmp_path, "table", mem, **kw)
    assert res1["memory"]["chunk"] == 7 and max_diff(g1, g0) <= (1e-5 if secagg else 0.0)
    assert res1["epsilon"] == res0["epsilon"]
    for a, b in zip(res1["rounds"], res0["rounds"], strict=True):
        measured = "sum_noise_multiplier_measured"
        assert a["dp"][measured] == pytest.approx(b["dp"][measured], rel=0 if not secagg else 1e-4)
        assert {k: v for k, v in a["dp"].items() if k != measured} == {k: v for k, v in b["dp"].items() if k != measured}
        if secagg:
            assert a["secagg_exact"] and a["secagg_groups"] == 5 and a["secagg_rows_held_peak"] <= 9
        else:
            assert a["val"] == b["val"]


@pytest.mark.parametrize("secagg,dp", [(False, False), (True, False), (True, True)])
def test_chunked_hybrid_rounds_feed_the_split(x, tmp_path: Path, secagg: bool, dp: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """FedMMF's hybrid round (D107) feeds each chunk to its split, plaintext
    devices first and then the secure ones group by group (behind the float
    Gaussian with DP): the table path's model within 1e-5 (the chunks are cut
    in another order, so float32 updates may differ in the last bit), the
    same paths taken, and a secure sum that holds one group."""
    import models.sim.engine as engine

    kw: dict[str, Any] = {"model": "fedmmf", "params": {"order": "one"}, "rounds": 2, "clients_per_round": 60}
    base, _ = run(x, tmp_path, "base", MemorySettings(budget_gb=64), **kw)
    kw["plaintext_j_bound"] = base["summary"]["privacy_J_median"]
    if secagg:
        kw.update(secagg=True, secagg_group_size=8)
    if dp:
        kw.update(dp_noise=0.5, dp_clip=1.0, dp_mode="local", dp_mechanism="gaussian-float")
    mem = MemorySettings(budget_gb=64, cohort_chunk=7)
    kept: list[object] = []
    real_train = engine.train_cohort

    def train(*args: Any) -> Any:
        kept.append(out := real_train(*args))
        return out

    monkeypatch.setattr(engine, "train_cohort", train)
    res1, g1 = run(x, tmp_path, "streamed", mem, **kw)
    assert kept == [None, None]  # every chunk went to the split: no round kept the cohort's table
    take_the_table_path(monkeypatch)
    res0, g0 = run(x, tmp_path, "table", mem, **kw)
    assert res1["memory"]["chunk"] == 7 and max_diff(g1, g0) <= 1e-5
    for a, b in zip(res1["rounds"], res0["rounds"], strict=True):
        paths = ("plaintext_devices", "secure_devices_chosen", "secure_devices_counted")
        assert [a[k] for k in paths] == [b[k] for k in paths] and 0 < a["plaintext_devices"] < 60
        assert a["secure_devices_counted"] == 60 - a["plaintext_devices"]
        if secagg:
            assert a["secagg_exact"] and 0 < a["secagg_rows_held_peak"] <= 15  # one group (< 2G), not the 60
        if dp:
            assert a["dp"]["noise_multiplier"] == b["dp"]["noise_multiplier"] == 0.5


@pytest.mark.parametrize("model,mode", [("fedrap", "distributed"), ("fedrap", "local"), ("fedmf", "distributed")])
def test_chunked_dp_without_a_secure_sum_streams_the_updates(x, tmp_path: Path, model: str, mode: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """DP without --secagg (local noise share by share, or distributed with
    --unmasked-sum) feeds each chunk's updates to the mechanism as it trains
    (FedMF: sparse rows made dense a chunk at a time) instead of keeping the
    cohort's table: the same run bit for bit as with the table. (Against an
    unchunked run a chunked DP run is not bit for bit: float32 updates that
    differ in the last bit can change a rounding retry, hence every later draw.)"""

    kw = {"model": model, "dp_noise": 0.5, "dp_clip": 1.0, "dp_mode": mode, "unmasked_sum": mode == "distributed",
          "params": {"k": 4}, "rounds": 2}  # fmt: skip
    mem = MemorySettings(budget_gb=64, cohort_chunk=7)
    res1, g1 = run(x, tmp_path, "streamed", mem, **kw)
    take_the_table_path(monkeypatch)
    res0, g0 = run(x, tmp_path, "table", mem, **kw)
    assert res1["memory"]["chunk"] == 7 and max_diff(g1, g0) == 0.0
    assert res1["epsilon"] == res0["epsilon"] and res1["rounds"][-1]["dp"] == res0["rounds"][-1]["dp"]
