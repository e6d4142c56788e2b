"""`fedmask study`: the aggregation (models/sim/study.py) on small fake result files, and
one end-to-end run of the command on a tiny synthetic dataset."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from models.sim import study as S


def _implicit(seed: int, hr: float, placebo: float = 0.1) -> dict[str, Any]:
    return {
        "kind": "implicit",
        "seed": seed,
        "test": {"hr@10": hr, "ndcg@10": hr / 2, "full_hr@10": hr / 5, "n_users": 10.0},
        "placebo": {"hr@10": placebo, "ndcg@10": 0.05},
        "config": {"model": "fedrap", "seed": seed, "rounds": 100, "params": {}, "users": None},
    }


def _explicit(seed: int, rmse: float) -> dict[str, Any]:
    return {"kind": "explicit", "seed": seed, "test": {"rmse": rmse, "mae": rmse - 0.2, "n_ratings": 5.0}}


def _reference(seed: int, ease_hr: float) -> dict[str, Any]:
    def model(name: str, hr: float) -> dict[str, Any]:
        return {"name": name, "params": {}, "test": {"hr@10": hr, "ndcg@10": hr / 2, "full_hr@10": hr / 4},
                "placebo": {"hr@10": 0.1}}  # fmt: skip

    return {"dataset": "d", "seed": seed, "models": [model("popularity", 0.4), model("ease", ease_hr)]}


def test_mean_and_sample_sd_over_the_seeds() -> None:
    runs = {
        "fedrap": {0: _implicit(0, 0.60), 1: _implicit(1, 0.64), 2: _implicit(2, 0.65, placebo=0.12)},
        "fedmmf": {0: _explicit(0, 0.93), 1: _explicit(1, 0.91), 2: _explicit(2, 0.95)},
    }
    refs = {s: _reference(s, hr) for s, hr in ((0, 0.649), (1, 0.650), (2, 0.655))}
    st = S.aggregate("d", [0, 1, 2], runs, refs)
    assert st["dataset"] == "d" and st["seeds"] == [0, 1, 2]
    hr = st["models"]["fedrap"]["test_hr@10"]
    assert hr["mean"] == pytest.approx(statistics.mean([0.60, 0.64, 0.65]))
    assert hr["sd"] == pytest.approx(statistics.stdev([0.60, 0.64, 0.65])) and hr["n"] == 3
    assert st["models"]["fedrap"]["test_full_hr@10"]["mean"] == pytest.approx(statistics.mean([0.12, 0.128, 0.13]))
    assert st["models"]["fedrap"]["placebo_hr@10"]["mean"] == pytest.approx((0.1 + 0.1 + 0.12) / 3)
    assert set(st["models"]["fedmmf"]) == {"test_rmse", "test_mae"}
    assert st["models"]["fedmmf"]["test_rmse"]["sd"] == pytest.approx(0.02)
    assert st["models"]["fedmmf"]["test_mae"]["mean"] == pytest.approx(0.73)
    assert list(st["references"]) == ["popularity", "ease"]
    assert st["references"]["ease"]["test_hr@10"]["mean"] == pytest.approx(statistics.mean([0.649, 0.650, 0.655]))
    assert st["references"]["popularity"]["test_hr@10"]["sd"] == pytest.approx(0.0)
    json.dumps(st, allow_nan=False)  # plain JSON


def test_missing_values_are_left_out_and_a_missing_seed_is_an_error() -> None:
    assert S.mean_sd([0.5]) == {"mean": 0.5, "sd": None, "n": 1}
    assert S.mean_sd([0.5, math.nan, 0.7])["n"] == 2
    assert S.mean_sd([]) == {"mean": None, "sd": None, "n": 0}
    no_placebo = _implicit(1, 0.6)
    del no_placebo["placebo"]
    st = S.aggregate("d", [0, 1], {"fedmf": {0: _implicit(0, 0.5), 1: no_placebo}}, {})
    assert st["models"]["fedmf"]["placebo_hr@10"]["n"] == 1 and st["references"] == {}
    with pytest.raises(ValueError, match=r"fedmf: no results for seed\(s\) \[2\]"):
        S.aggregate("d", [0, 1, 2], {"fedmf": {0: _implicit(0, 0.5), 1: _implicit(1, 0.5)}}, {})
    with pytest.raises(ValueError, match="no reference.json for seed"):
        S.aggregate("d", [0, 1], {}, {0: _reference(0, 0.6)})


def test_runs_of_a_study_depend_on_ratings_and_models() -> None:
    assert [r.name for r in S.study_runs(True)] == ["fedrap", "pfedrec", "fedmf", "fedmf-explicit", "fedmmf"]
    assert [r.name for r in S.study_runs(False)] == ["fedrap", "pfedrec", "fedmf"]
    assert [(r.model, r.explicit) for r in S.study_runs(True, ["fedmf-explicit"])] == [("fedmf", True)]
    with pytest.raises(ValueError, match="need a dataset with ratings"):
        S.study_runs(False, ["fedmmf"])
    with pytest.raises(ValueError, match="unknown study model"):
        S.study_runs(True, ["fedavg"])


def test_config_match_decides_reuse() -> None:
    done = _implicit(0, 0.6) | {"model_config": {"k": 32, "v2": 1e-4, "mlp": [32, 16]}}
    wanted = {"model": "fedrap", "seed": 0, "rounds": None, "params": {}, "users": None}
    hyper = {"k": 32, "v2": 1e-4, "mlp": (32, 16)}  # tuples compare as JSON writes them
    assert S.config_matches(done, wanted, default_rounds=100, model_config=hyper)
    assert not S.config_matches(done, wanted, default_rounds=150, model_config=hyper)
    assert not S.config_matches(done, wanted | {"seed": 1}, default_rounds=100, model_config=hyper)
    assert not S.config_matches(done, wanted | {"threads": 1}, default_rounds=100, model_config=hyper)  # a field it lacks
    assert S.config_matches(done, wanted | {"rounds": 100}, default_rounds=7, model_config=hyper)
    never_finished = {"config": done["config"], "model_config": done["model_config"]}
    assert not S.config_matches(never_finished, wanted, default_rounds=100, model_config=hyper)
    # the same command after a model's defaults changed: the run is stale, not reused
    assert not S.config_matches(done, wanted, default_rounds=100, model_config=hyper | {"v2": 3e-4})
    assert not S.config_matches(_implicit(0, 0.6), wanted, default_rounds=100, model_config=hyper)  # none recorded


def test_markdown_table_and_plot(tmp_path: Path) -> None:
    st = S.aggregate(
        "d", [0, 1], {"fedrap": {0: _implicit(0, 0.6), 1: _implicit(1, 0.7)}, "fedmmf": {0: _explicit(0, 0.9),
                                                                                       1: _explicit(1, 0.9)}},
        {0: _reference(0, 0.64), 1: _reference(1, 0.66)},
    )  # fmt: skip
    table = S.markdown_table(st)
    rows = {ln.split("|")[1].strip(): ln for ln in table.splitlines() if ln.startswith("| ")}
    assert "0.650 ± 0.071" in rows["fedrap"] and "0.650 ± 0.014" in rows["ease"]
    assert "0.900 ± 0.000" in rows["fedmmf"] and "reference" in rows["popularity"]
    png = S.plot_study(st, tmp_path / "study.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_study_command_end_to_end_and_resumes(tmp_path: Path, command_app) -> None:
    from fedmask.commands.study import register

    app = command_app(register)
    out = tmp_path / "study"
    args = ["study", "--dataset", "synthetic", "--seeds", "0,1", "--out", str(out), "--models", "fedrap,fedmf-explicit",
            "--references", "popularity,ease", "--rounds", "2", "-q"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    st = json.loads((out / "study.json").read_text())
    assert st["seeds"] == [0, 1] and set(st["models"]) == {"fedrap", "fedmf-explicit"}
    assert set(st["references"]) == {"popularity", "ease"}
    for seed in (0, 1):
        res = json.loads((out / "runs" / "fedrap" / f"seed{seed}" / "results.json").read_text())
        assert res["seed"] == seed and len(res["rounds"]) == 2
    hrs = [json.loads((out / "runs" / "fedrap" / f"seed{s}" / "results.json").read_text())["test"]["hr@10"]
           for s in (0, 1)]  # fmt: skip
    assert st["models"]["fedrap"]["test_hr@10"]["mean"] == pytest.approx(sum(hrs) / 2)
    assert st["models"]["fedmf-explicit"]["test_rmse"]["n"] == 2 and "placebo_hr@10" in st["references"]["ease"]
    assert (out / "study.png").stat().st_size > 0 and "| fedrap | model |" in r.output
    # a second run reuses every finished run; a changed config runs again
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and again.output.count("reusing") == 6, again.output
    assert json.loads((out / "study.json").read_text()) == st
    one = ["study", "--dataset", "synthetic", "--seeds", "0", "--out", str(out), "--models", "fedrap",
           "--references", "ease", "--rounds", "1", "-q"]  # fmt: skip
    more = CliRunner().invoke(app, one)  # other rounds: simulated again; the references are reused
    assert more.exit_code == 0 and "references seed 0: reusing" in more.output, more.output
    assert "fedrap seed 0: simulating" in more.output
    assert len(json.loads((out / "runs" / "fedrap" / "seed0" / "results.json").read_text())["rounds"]) == 1


def test_study_command_refuses_bad_arguments(tmp_path: Path, command_app) -> None:
    from fedmask.commands.study import register

    app = command_app(register)
    bad = CliRunner().invoke(app, ["study", "--dataset", "synthetic", "--seeds", "0,0", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "distinct" in bad.output
    bad = CliRunner().invoke(app, ["study", "--dataset", "synthetic", "--models", "svd", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown study model" in bad.output
