"""Smoke runs of the commands that start federations themselves:
`fedmask bench round` (secure and INSECURE plaintext rounds, both checked
bit for bit), `fedmask bench hostile`, `fedmask bench admin`, `fedmask bench connections` and `fedmask demo` (tiny sizes;
the synthetic dataset, so no download is needed)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import pytest

from integration_harness import Processes, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _last_json(proc) -> dict:
    lines = [ln for ln in proc.log().splitlines() if ln.startswith("{")]
    assert lines, proc.tail()
    return json.loads(lines[-1])


def test_bench_round_secure_and_plaintext(procs: Processes) -> None:
    p = procs.start("bench-round", ["bench", "round", "--devices", "6", "--client-processes", "2", "--dim", "64",
                                    "--rounds", "2", "--dropout", "0.2", "--masked-input-deadline", "1.0"])
    assert p.wait(120) == 0, p.tail()
    r = _last_json(p)
    assert r["ok"] is True and r["dropouts_as_injected"] is True
    assert r["secure_round_s_median"] > 0 and r["plaintext_round_s_median"] > 0 and r["coordinator_rss_mb"] > 0
    assert all(d["exact"] for d in r["secure_detail"] + r["plaintext_detail"])
    assert all("unmasking" in d["timings"] for d in r["secure_detail"])
    assert all(set(d["timings"]) == {"masked_input", "aggregating"} for d in r["plaintext_detail"])
    # metric totals only from the secure sum: one "devices" per counted device; none in plaintext rounds
    assert all(d["metric_devices"] == d["counted"] for d in r["secure_detail"])
    assert all(d["metric_devices"] is None for d in r["plaintext_detail"])
    assert procs.leftovers() == {}  # the benchmark cleaned up after itself: no process it started is left


def test_bench_round_removes_the_dropouts_surplus_noise(procs: Processes) -> None:
    """`--dp-dropouts remove` (Dordis's way, D110) over real processes: 8
    devices, t = 6, one round with two silent at masked input. The unmasked
    sum is exact; the coordinator regenerated the 6 counted devices' last
    component; the ledger's epsilon is the proven bound's (D19's figure for
    6 counted) and the unequal-shares figure is the no-dropout round's."""
    p = procs.start("bench-round-remove", [
        "bench", "round", "--devices", "8", "--client-processes", "2", "--dim", "64", "--rounds", "1",
        "--dropout", "0.2", "--no-plaintext", "--dp-mechanism", "discrete-gaussian", "--dp-dropouts", "remove",
        "--threshold", "0.75"])
    assert p.wait(120) == 0, p.tail()
    r = _last_json(p)
    assert r["ok"] is True and r["dp"]["dropouts"] == "remove" and r["secagg"]["threshold"] == 6
    (d,) = r["secure_detail"]
    assert d["exact"] and d["counted"] == 8 - d["dropouts"].get("masked_input", 0)
    removed = max(0, 2 - (8 - d["counted"]))  # m = 2 components; j = 8 - counted stay
    assert d["components_regenerated"] == d["counted"] * removed > 0 and d["surplus_removal_s"] >= 0
    assert d["epsilon_round_unequal_shares"] <= d["epsilon_round"]
    assert procs.leftovers() == {}


def test_bench_hostile_survives_its_traffic(procs: Processes) -> None:
    """Hostile traffic over real processes: garbage shares and metrics inside the
    cohorts, random bytes, malformed, oversized and out-of-order messages,
    enrolment floods and ids of 2^63 or more at the port, a coalition of 3
    credentials that falsely reports 3 honest devices; the rounds go on,
    exact, and the coalition quarantines at most N = 2 honest devices. Beside
    them `fedmask admin` on the coordinator's admin listener takes 64 MiB
    headers, 200 MiB bodies, bodies to routes that take none, concurrency
    floods, slow heads and one viewer token hogging event streams: each is
    refused with its status (D82), the service's RSS stays within 20 MB, the
    honest viewer's and operator's reads answer and the operator's own event
    stream is accepted."""
    p = procs.start("bench-hostile", ["bench", "hostile", "--seconds", "20", "--honest-devices", "12", "--dim", "64",
                                      "--rate", "5"])
    assert p.wait(120) == 0, p.tail()
    r = _last_json(p)
    assert r["ok"] is True and r["coordinator_crashes"] == 0 and r["rounds_aborted"] == 0
    assert r["rounds_committed"] >= 1 and r["aggregates_exact"] is True and r["honest_devices_dropped"] == 0
    assert all(n > 0 for n in r["attacks"].values())
    # ids of 2^63 or more: refused INVALID_ARGUMENT (or turned away earlier by the per-peer limits), never an
    # exception inside the coordinator (D83)
    answers = r["huge_id_answers"]
    assert answers.get("INVALID_ARGUMENT", 0) > 0 and not {"INTERNAL", "UNKNOWN", "OK"} & set(answers), answers
    first = r["rounds"][0]
    assert len(first["dropped"]) == 2  # the garbage-share devices, reported at the share check
    assert first["metrics_unavailable"] is True  # the garbage-metric devices cost only the metrics
    fr = r["false_reports"]  # the false-report coalition stays in the rounds; the quota bounds what it costs
    assert fr["credentials"] == 3 and fr["bound"] == 2 and len(fr["accused"]) == 3
    assert set(fr["honest_quarantined"]) <= set(fr["accused"]) and len(fr["honest_quarantined"]) <= 2
    assert fr["rounds_committed_with_coalition"] >= 2 and fr["rounds_committed_after_quarantines"] >= 1
    admin = r["admin"]
    assert admin["ok"] is True and admin["rss_growth_mb"] <= 20, admin
    expected = {"oversized_head": [431], "oversized_body": [413, 503], "body_to_bodiless": [413],
                "concurrency_flood": [503], "slow_head": [408], "stream_hog": [429]}
    assert {k: a["expected"] for k, a in admin["attacks"].items()} == expected
    for kind, a in admin["attacks"].items():  # every attempt refused as expected; nothing left unanswered
        assert a["attempts"] > 0 and sum(a["answers"].values()) == a["attempts"], (kind, a)
        assert {int(s) for s in a["answers"]} <= set(expected[kind]), (kind, a)
    # the 200 MiB bodies and 64 MiB heads were refused long before their end
    assert admin["attacks"]["oversized_body"]["answers"].get("413", 0) > 0
    assert admin["attacks"]["oversized_body"]["max_sent_mib"] < 32 and admin["attacks"]["oversized_head"]["max_sent_mib"] < 32
    assert admin["hog_streams_held"] == {"200": 4}  # the hog's share, then 429
    for role in ("viewer", "operator"):
        h = admin["honest"][role]
        assert h["reads"] > 0 and set(h["read_answers"]) <= {"200", "503"} and h["read_answers"].get("200", 0) > 0, h
        assert 0 < h["read_p50_ms"] <= h["read_p99_ms"] < 5000, h
        assert h["streams"] and set(h["streams"]) == {"200"}, h  # its own stream while the hog holds its share
    assert procs.leftovers() == {}


def test_bench_admin_serves_an_open_loop_stream_during_secure_rounds(procs: Processes) -> None:
    """`fedmask bench admin` at tiny sizes: idle then loaded secure rounds, and
    every request of the open-loop stream (top-k computed on the synthetic
    model's devices, the live round) answered."""
    p = procs.start("bench-admin", ["bench", "admin", "--devices", "6", "--client-processes", "2", "--dim", "640",
                                    "--rate", "20", "--seconds", "4"])
    assert p.wait(120) == 0, p.tail()
    r = _last_json(p)
    assert r["ok"] is True and r["errors"] == 0 and r["requests"] == 80
    assert r["topk_rps"] > 0 and r["status_rps"] > 0 and 0 < r["topk_p50_ms"] <= r["topk_p99_ms"]
    assert r["rounds_idle"] >= 2 and r["rounds_loaded"] >= 2 and r["rounds_aborted"] == 0
    assert r["secure_round_s_median_idle"] > 0 and r["secure_round_s_median_loaded"] > 0
    assert set(r["targets"]) == {"errors == 0", "topk_p99_ms <= 150", "status_p99_ms <= 25",
                                 "loaded median <= 1.25 x idle"}
    assert procs.leftovers() == {}


def test_bench_connections(procs: Processes) -> None:
    p = procs.start("bench-conn", ["bench", "connections", "--devices", "30", "--client-processes", "2",
                                   "--hold", "1", "--heartbeat-interval", "0.5"])
    assert p.wait(120) == 0, p.tail()
    r = _last_json(p)
    assert r["ok"] is True and r["admitted"] == 30 and 0 < r["coordinator_rss_mb"] < 1024


def test_demo_runs_a_federation_shows_the_product_and_keeps_running(procs: Processes, tmp_path: Path) -> None:
    """`fedmask demo --keep-running` at tiny sizes: secure rounds reported
    (exact sums; under DP no metric totals, the devices' own top-10s scored
    instead), the admin service's dashboard and a curl
    line with a token that works, the popularity baseline beside the
    federated HR@10, one user's top-k from the device next to their ratings;
    then everything stays up until SIGTERM, which stops every process."""
    p = procs.start("demo", ["demo", "--rounds", "2", "--devices", "30", "--dataset", "synthetic",
                             "--dropout", "0.2", "--keep", str(tmp_path / "run"), "--keep-running"])
    wait_until(lambda: "Ctrl-C stops them" in p.log(), 120, what="the demo's rounds", watch=[p], step=0.5)
    out = " ".join(p.log().split())  # one space between words (tables align with runs of spaces)
    assert "round 1 committed" in out and "round 2 committed" in out and "secure sum exact" in out
    # distributed DP with the discrete Gaussian (D88): no metric totals (D36), the devices' own top-10s instead
    assert out.count("no metric totals (DP, D36)") >= 2 and "metrics unavailable" not in out
    assert "per stage" in out and re.search(r"(\d+) of \1 rounds committed", out)
    assert re.search(r"validation HR@10 [01]\.\d{3} \(full ranking\) of the top-10 that (\d+) of 30 hosted devices "
                     r"compute for their users after round \d+ .* popularity on the same \1 users: [01]\.\d{3}", out)
    assert "user-1: top-10 computed on the device" in out
    # the epsilon with its delta, the unit it protects, and the production-size line (GET /v1/privacy)
    assert re.search(r"epsilon [\d.]+ at delta 1e-05 over 2 rounds protects one device, all of its data", out), out
    assert "At 1,000,000 devices, cohorts of 1,000, 100 rounds, with the same noise in the mean update" in out
    # the curl line whole, alone on its line (to be pasted), also in a log file
    curl = next((m for line in p.log().splitlines() if (m := re.fullmatch(
        r"curl -s -H 'Authorization: Bearer (\S+)' '(http://127\.0\.0\.1:\d+)/v1/users/user-1/recommendations\?k=10'",
        line))), None)
    assert curl, p.log()
    token, base = curl.group(1), curl.group(2)
    assert f"dashboard: {base}/" in out
    answer = httpx.get(f"{base}/v1/users/user-1/recommendations", params={"k": 10},
                       headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert answer.status_code == 200 and len(answer.json()["items"]) == 10
    assert httpx.get(f"{base}/", timeout=10).status_code == 200  # the dashboard page, still up
    assert p.alive()
    p.signal_group(signal.SIGTERM)
    assert p.wait(60) == 130, p.tail()
    assert (tmp_path / "run" / "coordinator.db").exists()
    assert procs.leftovers() == {}
