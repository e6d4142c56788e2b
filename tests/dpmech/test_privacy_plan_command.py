"""`fedmask privacy plan`: one JSON object, readable tables, and a refusal with exit code 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fedmask.cli import app

ARGS = ["privacy", "plan", "--population", "50000", "--cohort", "500", "--rounds", "100", "--delta", "1e-6",
        "--target-epsilon", "8", "--dim", "4096"]


def test_json_is_one_object_with_both_figures_and_the_dropout() -> None:
    out = CliRunner().invoke(app, [*ARGS, "--dropout", "0.1", "--group-size", "200", "--json"])
    assert out.exit_code == 0, out.output
    p = json.loads(out.stdout)
    assert set(p) == {"request", "protects", "mechanism", "without_amplification", "with_amplification",
                      "primary_noise_epsilon_if_poisson", "dropout", "grouping"}
    assert p["protects"] == "one device, all of its data"
    primary, amplified = p["without_amplification"], p["with_amplification"]
    assert primary["epsilon_total"] <= 8 and amplified["epsilon_total"] <= 8
    assert amplified["sampling_rate"] == 0.01 and "devices cannot check" in amplified["assumption"]
    assert amplified["noise_multiplier"] < primary["noise_multiplier"]
    assert p["primary_noise_epsilon_if_poisson"] < primary["epsilon_total"]
    assert p["mechanism"]["padded_dim"] == 4096 and p["mechanism"]["groups"] == [250, 250]
    assert p["mechanism"]["bits_needed"] <= 32
    assert p["grouping"]["groups"] == 2
    assert p["dropout"]["counted_by_group"] == [225, 225]
    assert p["dropout"]["with_plan_noise"]["epsilon_total"] > 8 >= p["dropout"]["keep_target"]["epsilon_total"]
    for noise in (primary, amplified):
        assert noise["noise_to_signal"] > 0 and noise["epsilon_per_round"] <= noise["epsilon_total"]


def test_the_tables_name_the_guarantee_and_the_assumption() -> None:
    out = CliRunner().invoke(app, ARGS, env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    for phrase in ("without amplification", "assuming Poisson sampling", "noise-to-signal", "epsilon over 100 rounds",
                   "Epsilon protects one device, all of its data", "bits needed"):
        assert phrase in text, (phrase, out.stdout)


def test_a_field_too_small_is_refused_with_exit_code_2() -> None:
    out = CliRunner().invoke(app, [*ARGS, "--bits", "10", "--json"])
    assert out.exit_code == 2
    assert out.stdout == ""
    assert "error: a field of 2^10 is too small" in out.stderr and "--bits" in out.stderr


def test_bad_input_is_refused_before_any_search() -> None:
    out = CliRunner().invoke(app, ["privacy", "plan", "--population", "100", "--cohort", "500", "--rounds", "10",
                                   "--delta", "1e-6", "--target-epsilon", "8"])
    assert out.exit_code == 2 and "cannot exceed the population" in out.stderr
