"""The benchmark's command line and the `fedmask secagg-demo` command."""

from __future__ import annotations

import json

import pytest

from secagg import bench


def _run(capsys, *args: str) -> dict:
    code = bench.main(list(args))
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert code == (0 if result["ok"] else 1)
    return result


@pytest.mark.parametrize(
    "neighbors,stage,extra",
    [
        ("all", "unmasking", ()),
        ("all", "masked-input", ()),
        ("4", "share-keys", ()),
        ("auto", "none", ("--expected-dropout", "0.01", "--corrupt-fraction", "0.01")),
    ],
)
def test_bench_prints_a_json_last_line(capsys, neighbors: str, stage: str, extra) -> None:
    r = _run(capsys, "--clients", "40", "--dim", "64", "--neighbors", neighbors, "--dropout", "0.1",
             "--dropout-stage", stage, "--seed", "3", *extra)
    assert r["ok"] is True
    for key in ("clients", "dim", "neighbors", "threshold", "survivors", "client_ms_mean", "server_ms",
                "server_unmask_ms", "total_s", "masked_input_bytes", "share_ciphertext_bytes", "plaintext_sum_ms"):
        assert key in r
    assert r["masked_input_bytes"] <= 4 * 64 + 1024
    assert r["share_ciphertext_bytes"] <= 150


def test_bench_reports_an_abort(capsys) -> None:
    r = _run(capsys, "--clients", "6", "--dim", "8", "--dropout", "0.5", "--dropout-stage", "advertise-keys")
    assert r["ok"] is False and r["abort_reason"] == "too_few_advertised"


def test_bench_refuses_an_infeasible_configuration(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--clients", "12", "--dim", "8", "--neighbors", "auto"])
    assert exc.value.code == 2
    assert "no (degree, threshold)" in capsys.readouterr().err


def test_bench_help(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    assert "--dropout-stage" in capsys.readouterr().out


def test_demo_command() -> None:
    from typer.testing import CliRunner

    from fedmask.cli import app

    # the one-process secagg demo is `fedmask secagg-demo` (`fedmask demo` runs a real federation)
    result = CliRunner().invoke(app, ["secagg-demo", "--clients", "12", "--dim", "50"])
    assert result.exit_code == 0, result.output
    assert "exact sum" in result.output and "yes" in result.output
    bad = CliRunner().invoke(app, ["secagg-demo", "--first-stage", "nowhere"])
    assert bad.exit_code != 0
    only = CliRunner().invoke(app, ["demo", "--secagg-only"])
    assert only.exit_code == 0 and "exact sum" in only.output, only.output
