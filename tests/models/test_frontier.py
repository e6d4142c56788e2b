"""`fedmask privacy frontier` (models/sim/frontier.py, fedmask/commands/frontier.py, D95).

Oracles: the planner (`dpmech.plan`) for each epsilon's noise, recomputed
here; the runs' own results.json for every figure the summary shows; the
grid's rules written out by hand for a small spec."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpmech.plan import PlanRequest, plan
from models.sim import frontier as F


def _results(val: float, test: float, full: float, eps: float | None) -> dict[str, Any]:
    return {"best_val": {"hr@10": val}, "test": {"hr@10": test, "full_hr@10": full}, "epsilon": eps}


def test_the_grid_tunes_on_one_seed_then_repeats_with_the_choice() -> None:
    spec = F.FrontierSpec(dataset="d", population=100, update_dim=64, rounds=5, epsilons=(2.0, 8.0), seed=0,
                          repeat_seeds=(1, 2), repeat_at=(8.0,), update_scales=(35.0, 70.0))
    assert [r.folder for r in F.tuning_runs(spec)] == [
        "no-dp/seed0", "eps2/us35/seed0", "eps2/us70/seed0", "eps8/us35/seed0", "eps8/us70/seed0"]
    assert [r.folder for r in F.repeat_runs(spec, {2.0: 35.0, 8.0: 70.0})] == [
        "no-dp/seed1", "eps8/us70/seed1", "no-dp/seed2", "eps8/us70/seed2"]
    assert spec.run_delta == pytest.approx(100 ** -1.1)
    # the choice reads validation only, ties go to the smaller scale
    assert F.choose({35.0: _results(0.5, 0.9, 0.2, 8), 70.0: _results(0.6, 0.1, 0.1, 8)}) == 70.0
    assert F.choose({35.0: _results(0.6, 0.1, 0.2, 8), 70.0: _results(0.6, 0.9, 0.1, 8)}) == 35.0
    with pytest.raises(ValueError, match="validation"):
        F.choose({35.0: {"test": {"hr@10": 0.5}}})


@pytest.mark.parametrize("kwargs, why", [
    ({"epsilons": (0.0,)}, "positive"), ({"epsilons": (2.0, 2.0)}, "repeats"), ({"update_scales": ()}, "update-scales"),
    ({"repeat_at": (3.0,)}, "not among"), ({"repeat_seeds": (0,)}, "differ from --seed"), ({"delta": 1.0}, "delta"),
    ({"clip": -1.0}, "clip"),
])
def test_bad_grids_are_refused_saying_why(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        F.FrontierSpec(dataset="d", population=100, update_dim=64, rounds=5, **kwargs)


def test_each_epsilons_noise_is_the_planners_without_amplification() -> None:
    spec = F.FrontierSpec(dataset="d", population=300, update_dim=1000, rounds=20)
    for eps in (1.0, 8.0):
        z = F.noise_for(spec, eps)
        want = plan(PlanRequest(population=300, cohort=300, rounds=20, delta=300 ** -1.1, target_epsilon=eps, dim=1000,
                                clip=0.1))
        assert z == want.primary.noise_multiplier and want.primary.epsilon_total <= eps
    assert F.noise_for(spec, 1.0) > F.noise_for(spec, 8.0)


def test_the_summary_reads_the_runs_and_prices_the_loss_on_the_same_seeds(tmp_path: Path) -> None:
    spec = F.FrontierSpec(dataset="d", population=100, update_dim=64, rounds=5, epsilons=(2.0, 8.0),
                          repeat_seeds=(1,), repeat_at=(8.0,), update_scales=(35.0, 70.0))
    R = F.FrontierRun
    results = {R(None, None, 0): _results(0.7, 0.60, 0.20, None), R(None, None, 1): _results(0.7, 0.70, 0.22, None),
               R(2.0, 35.0, 0): _results(0.3, 0.30, 0.05, 1.9), R(2.0, 70.0, 0): _results(0.2, 0.25, 0.04, 1.9),
               R(8.0, 35.0, 0): _results(0.5, 0.50, 0.10, 7.9), R(8.0, 70.0, 0): _results(0.6, 0.55, 0.12, 7.9),
               R(8.0, 70.0, 1): _results(0.6, 0.65, 0.14, 7.9)}
    fr = F.summarise(spec, {2.0: 10.0, 8.0: 4.0}, {2.0: 35.0, 8.0: 70.0}, results)
    two, eight = fr["rows"]
    assert two["seeds"] == [0] and two["test_hr@10"]["mean"] == 0.30 and two["test_hr@10"]["sd"] is None
    assert two["loss_test_hr@10"] == pytest.approx(1 - 0.30 / 0.60)  # against seed 0's baseline only
    assert eight["seeds"] == [0, 1] and eight["test_hr@10"]["mean"] == pytest.approx(0.60)
    assert eight["loss_test_hr@10"] == pytest.approx(1 - 0.60 / 0.65)  # both seeds' baselines
    assert eight["candidates"] == {"35": 0.5, "70": 0.6} and eight["epsilon"]["mean"] == pytest.approx(7.9)
    assert fr["baseline"]["test_hr@10"]["mean"] == pytest.approx(0.65) and fr["delta"] == spec.run_delta
    table = F.markdown_table(fr)
    assert "| 8 | 7.900 ± 0.000 | 4.00 | 70 | 0,1 |" in table and "7.7%" in table and "not counted" in table
    png = F.plot_frontier([fr], tmp_path / "f.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isnan(F.metrics_of({})["test_hr@10"])
    _check_frontier_plot_command(fr, tmp_path)


def _check_frontier_plot_command(fr: dict[str, Any], tmp_path: Path) -> None:
    """`fedmask privacy frontier-plot` draws several frontier.json files on one
    figure, and refuses a file that is not one, saying which."""
    from fedmask.cli import app

    a, b, bad, broken = (tmp_path / n for n in ("a.json", "b.json", "bad.json", "broken.json"))
    a.write_text(json.dumps(fr))
    b.write_text(json.dumps({**fr, "dataset": "e", "population": 300}))
    bad.write_text(json.dumps({"rows": 3}))
    broken.write_text(json.dumps({**fr, "rows": [{"update_scale": 35}]}))
    r = CliRunner().invoke(app, ["privacy", "frontier-plot", str(a), str(b), "--out", str(tmp_path / "p" / "two.png")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p" / "two.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for wrong in (bad, broken, tmp_path / "missing.json"):
        refused = CliRunner().invoke(app, ["privacy", "frontier-plot", str(a), str(wrong), "--out",
                                           str(tmp_path / "x.png")])
        assert refused.exit_code == 2 and not (tmp_path / "x.png").exists(), refused.output
    assert str(bad) in CliRunner().invoke(app, ["privacy", "frontier-plot", str(bad), "--out", "x.png"]).output


def test_the_command_runs_the_grid_resumes_and_refuses_bad_options(tmp_path: Path, command_app) -> None:
    from fedmask.commands.privacy import register

    app = command_app(register)
    out = tmp_path / "fr"
    args = ["privacy", "frontier", "--out", str(out), "--dataset", "synthetic", "--rounds", "2", "--epsilons", "4,16",
            "--update-scales", "35,70", "--repeat-seeds", "1", "--repeat-at", "16", "--jobs", "2", "-q"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    fr = json.loads((out / "frontier.json").read_text())
    chosen = {row["target_epsilon"]: row["update_scale"] for row in fr["rows"]}
    for row in fr["rows"]:
        res = json.loads((out / "runs" / f"eps{row['target_epsilon']:g}" / f"us{row['update_scale']:g}" / "seed0"
                          / "results.json").read_text())
        cfg = res["config"]
        assert cfg["unmasked_sum"] and cfg["dp_mode"] == "distributed" and cfg["dp_noise"] == row["noise_multiplier"]
        assert cfg["params"] == {"update_scale": chosen[row["target_epsilon"]]} and cfg["dp_delta"] == fr["delta"]
        assert res["epsilon"] <= row["target_epsilon"] * 1.01  # the ledger's, about the target
    assert fr["rows"][1]["seeds"] == [0, 1] and fr["baseline"]["seeds"] == [0, 1]
    assert (out / "runs" / "no-dp" / "seed1" / "results.json").exists()
    assert not (out / "runs" / "eps4" / f"us{chosen[4.0]:g}" / "seed1").exists()  # not a repeat epsilon
    assert "| no DP |" in r.output and (out / "frontier.png").stat().st_size > 0
    again = CliRunner().invoke(app, args[:-3] + ["-q"])  # one job: everything is reused
    assert again.exit_code == 0 and again.output.count("reusing") == 7, again.output
    assert json.loads((out / "frontier.json").read_text()) == fr
    bad = CliRunner().invoke(app, ["privacy", "frontier", "--out", str(out), "--epsilons", "8", "--repeat-at", "4"])
    assert bad.exit_code == 2 and "not among" in bad.output


def test_an_interrupted_run_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
        tmp_path: Path, command_app, monkeypatch: pytest.MonkeyPatch) -> None:
    """--checkpoint-every K: a run killed after its last checkpoint resumes
    there and ends with the figures of a run never interrupted; its
    checkpoints go once it is done, and a later frontier without the option
    still reuses it (how a run was kept is not what it computed)."""
    import models.sim.engine as engine
    from fedmask.commands.privacy import register

    app = command_app(register)
    common = ["privacy", "frontier", "--dataset", "synthetic", "--rounds", "3", "--epsilons", "8",
              "--update-scales", "35", "-q"]
    plain = CliRunner().invoke(app, common + ["--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    real_write = engine.write_results

    class Killed(Exception):
        pass

    def killed(res: Any, folder: Path) -> None:
        if "eps8" in folder.parts:
            raise Killed  # the DP run dies after its last round, before its results are written
        real_write(res, folder)

    monkeypatch.setattr(engine, "write_results", killed)
    out = tmp_path / "kept"
    args = common + ["--out", str(out), "--checkpoint-every", "1"]
    with pytest.raises(Killed):
        CliRunner().invoke(app, args, catch_exceptions=False)
    kept = out / "runs" / "eps8" / "us35" / "seed0" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir() if (p / "COMPLETE").exists()) == ["round-0", "round-1"]
    assert not (out / "runs" / "eps8" / "us35" / "seed0" / "results.json").exists()
    monkeypatch.setattr(engine, "write_results", real_write)
    resumed = CliRunner().invoke(app, args)
    assert resumed.exit_code == 0, resumed.output
    assert not kept.exists()
    for run in ("eps8/us35/seed0", "no-dp/seed0"):
        a, b = (json.loads((tmp_path / name / "runs" / run / "results.json").read_text()) for name in ("plain", "kept"))
        assert a["test"] == b["test"] and a["best_val"] == b["best_val"] and a.get("epsilon") == b.get("epsilon")
    again = CliRunner().invoke(app, common + ["--out", str(out)])
    assert again.exit_code == 0 and again.output.count("reusing") == 2, again.output


def test_shared_params_reach_every_run_and_bad_ones_are_refused(tmp_path: Path, command_app) -> None:
    """--param KEY=VALUE goes into the baseline's and every DP run's config
    (beside the tuned update_scale); update_scale itself, an unknown option
    and a bad value are refused before anything runs."""
    from fedmask.commands.privacy import register

    app = command_app(register)
    out = tmp_path / "fr"
    common = ["privacy", "frontier", "--dataset", "synthetic", "--rounds", "1", "--epsilons", "8",
              "--update-scales", "35", "-q"]
    r = CliRunner().invoke(app, common + ["--out", str(out), "-p", "local_epochs=2"])
    assert r.exit_code == 0, r.output
    base = json.loads((out / "runs" / "no-dp" / "seed0" / "results.json").read_text())
    dp = json.loads((out / "runs" / "eps8" / "us35" / "seed0" / "results.json").read_text())
    assert base["config"]["params"] == {"local_epochs": 2} and base["model_config"]["local_epochs"] == 2
    assert dp["config"]["params"] == {"local_epochs": 2, "update_scale": 35.0}
    assert dp["model_config"]["local_epochs"] == 2
    for bad, why in ((["-p", "update_scale=3"], "tunes it"), (["-p", "kernal=compiled"], "kernal"),
                     (["-p", "kernel=fast"], "unknown FedRAP kernel"), (["-p", "kernel"], "KEY=VALUE")):
        refused = CliRunner().invoke(app, common + ["--out", str(tmp_path / "bad"), *bad])
        assert refused.exit_code == 2 and why in refused.output, refused.output
        assert not (tmp_path / "bad" / "runs").exists()
