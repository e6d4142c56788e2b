"""`fedmask bench hybrid` end to end at a tiny size: 6 ML-100K users in two
client processes over mTLS, one all-secure round, then one FedMMF hybrid
round at J <= 0.8. Checks the JSON it prints last: both modes ran and
committed exactly, no device went plaintext in the all-secure mode, some did
in the hybrid one (and the rest ran secure aggregation), and the ratio of
the medians is the one of the reported round times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integration_harness import Processes


DEVICES = 6


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_hybrid_reports_both_modes(procs: Processes, ml100k_data_dir: Path) -> None:
    p = procs.start("bench-hybrid", ["bench", "hybrid", "--devices", str(DEVICES), "--client-processes", "2",
                                     "--rounds", "1", "--j-bound", "0.8", "--data-dir", str(ml100k_data_dir)])
    assert p.wait(280) == 0, p.tail()
    lines = [ln for ln in p.log().splitlines() if ln.startswith("{")]
    assert lines, p.tail()
    r = json.loads(lines[-1])
    assert r["ok"] is True and r["model"] == "fedmmf" and r["j_bound"] == 0.8
    sec, hyb = r["secure"], r["hybrid"]
    for mode in (sec, hyb):
        assert mode["ok"] is True and len(mode["round_s"]) == 1 and mode["round_s_median"] > 0
        assert all(d["state"] == "committed" and d["exact"] for d in mode["rounds"])
    assert sec["plaintext_devices"] == [0] and sec["secure_devices"] == [DEVICES]
    assert r["all_counted"] is True  # 4 secure devices reach t = 4: the secure part did not abort
    assert all(d["counted"] == DEVICES and d["secure_part_aborted"] is None for d in hyb["rounds"])
    assert all(n > 0 for n in hyb["plaintext_devices"])
    assert all(p + s == DEVICES and s > 0 for p, s in zip(hyb["plaintext_devices"], hyb["secure_devices"], strict=True))
    assert r["hybrid_over_secure_median"] == pytest.approx(hyb["round_s_median"] / sec["round_s_median"], abs=2e-3)
    assert procs.leftovers() == {}  # the benchmark cleaned up after itself: no process it started is left


@pytest.mark.parametrize("bad", [
    {"neighbors": "3"}, {"j_bound": float("nan")}, {"j_bound": -1.0}, {"client_processes": 7}, {"devices": 2},
])
def test_bench_hybrid_refuses_bad_settings(bad: dict) -> None:
    from fedmask.bench.hybrid import HybridBenchConfig

    with pytest.raises(ValueError, match="--"):
        HybridBenchConfig(**{"devices": 6, **bad})
