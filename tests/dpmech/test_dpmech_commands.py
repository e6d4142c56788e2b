"""The package's two commands print what they say and refuse bad input clearly."""

from __future__ import annotations

import re

import pytest

from dpmech import divergence, speed


def test_speed_prints_a_median_per_variance_and_for_encode(capsys: pytest.CaptureFixture[str]) -> None:
    assert speed.main(["--dim", "4096", "--runs", "2", "--sigma2", "4", "7/3", "--update-dim", "3000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("exact discrete Gaussian, d = 4096, 2 runs")
    assert re.fullmatch(r"sigma\^2 = +4: median +[\d.]+ ms  \(min [\d.]+, max [\d.]+\)", out[1])
    assert re.fullmatch(r"sigma\^2 = +7/3: median .*", out[2])
    assert re.fullmatch(r"encode, dim 3000 -> 4096, sigma\^2 = 4: median +[\d.]+ ms .*", out[3])


def test_speed_refuses_a_variance_the_sampler_cannot_draw(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        speed.main(["--sigma2", "1099511627776"])
    assert stop.value.code == 2
    assert "too large" in capsys.readouterr().err


def test_the_bound_table_prints_ratios_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert divergence.main(["--sigma2", "1", "--devices", "2", "--alpha", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 3
    assert all(float(r.split()[6]) >= 1.0 and float(r.split()[7]) >= 1.0 for r in rows)
