"""`fedmask bench scale`: its argument checks (the fairness rule, the
cohort it asks for), a tiny run of two replicas over PostgreSQL whose
aggregates are checked bit for bit while the standby is killed, and (slow)
its `--kill leader` run.

The run uses the session's throwaway PostgreSQL server (tests/conftest_pg.py:
skipped where no server can be started, saying why; a failure under CI)."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from fedmask.bench.loopback_federation import FleetShape, StageDeadlines
from fedmask.bench.scale import ScaleBenchConfig, cohort_for, fairness_problem, run_scale_bench
from fedmask.bench.throwaway_postgres import PgServer


@pytest.mark.parametrize(("replicas", "processes"), [(1, 3), (1, 8), (2, 6), (2, 8), (3, 9)])
def test_fair_shapes_are_accepted(replicas: int, processes: int) -> None:
    assert fairness_problem(replicas, processes) is None


@pytest.mark.parametrize(("replicas", "processes", "why"), [
    (1, 2, "fewer than 3 per replica"),
    (2, 5, "fewer than 3 per replica"),
    (3, 8, "fewer than 3 per replica"),
    (1, 9, "more than 8"),
    (3, 10, "more than 9"),
    (0, 3, "at least 1"),
])
def test_unfair_shapes_are_refused_saying_why(replicas: int, processes: int, why: str) -> None:
    problem = fairness_problem(replicas, processes)
    assert problem is not None and why in problem
    with pytest.raises(ValueError, match=why):
        ScaleBenchConfig(fleet=FleetShape(devices=30, client_processes=processes), replicas=replicas)


def test_the_config_refuses_what_the_bench_cannot_run() -> None:
    with pytest.raises(ValueError, match="auto"):
        ScaleBenchConfig(fleet=FleetShape(devices=30, client_processes=3, neighbors="all"), replicas=1)
    with pytest.raises(ValueError, match="group-size"):
        ScaleBenchConfig(fleet=FleetShape(devices=30, client_processes=3), replicas=1, group_size=1)
    with pytest.raises(ValueError, match="neighbors"):
        FleetShape(neighbors="3")
    from fedmask.bench.scale_faults import KillPlan

    with pytest.raises(ValueError, match="at least 2 replicas"):
        ScaleBenchConfig(fleet=FleetShape(devices=30, client_processes=3), replicas=1,
                         kill=KillPlan("leader", "masked_input"))
    with pytest.raises(ValueError, match="round 2"):
        ScaleBenchConfig(fleet=FleetShape(devices=30, client_processes=6), replicas=2, rounds=1,
                         kill=KillPlan("replica", "unmasking", 2))


def test_the_command_refuses_an_unfair_shape_before_starting_anything() -> None:
    from fedmask.commands.bench import bench_app

    out = CliRunner().invoke(bench_app, ["scale", "--replicas", "3", "--client-processes", "6"])
    assert out.exit_code == 2
    assert "fewer than 3 per replica" in " ".join(out.output.replace("│", " ").split())


@pytest.mark.parametrize("devices", [3, 4, 12, 100, 999, 1000, 10_000])
@pytest.mark.parametrize("over_selection", [0.0, 0.1, 0.3, 1.0])
def test_the_cohort_is_the_largest_whose_over_selection_fits(devices: int, over_selection: float) -> None:
    size, selected = cohort_for(devices, over_selection)
    assert selected == math.ceil(size * (1 + over_selection)) <= devices
    assert size == 1 or math.ceil((size + 1) * (1 + over_selection)) > devices  # no larger size fits
    assert cohort_for(1000, 0.3) == (769, 1000)


@pytest.mark.timeout(120)
def test_two_replicas_run_an_exact_secure_round_through_a_standby_kill(postgresql_server: PgServer) -> None:
    """The standby is killed (-9) during the round's masked-input stage: it holds no device stream (D90), so
    the round commits, exact."""
    from fedmask.bench.scale_faults import KillPlan

    lines: list[str] = []
    cfg = ScaleBenchConfig(
        fleet=FleetShape(devices=12, client_processes=6, dim=64), replicas=2, group_size=4, dropout=0.1, rounds=1,
        baseline=False, lease_s=5.0, deadlines=StageDeadlines(masked_input=1.0), timeout=90.0,
        server=postgresql_server, kill=KillPlan("replica", "masked_input", 1),
    )
    r = run_scale_bench(cfg, log=lines.append)
    assert r["ok"] is True and r["exact"] is True, r
    assert r["rounds_committed"] == 1 and r["rounds_aborted"] == 0
    assert r["leader"] == ["replica-0"]  # the first replica leads; the other waited as a standby
    assert any("replica-1" in line and "standby" in line for line in lines), lines
    assert r["kill"]["replica"] == "replica-1" and r["kill"]["version_history_ok"], r["kill"]
    assert any("kill -9 replica-1" in line for line in lines), lines
    (detail,) = r["detail"]
    # seed 0 silences devices 4 and 9 at masked-input (an honest device that missed a deadline on a loaded
    # machine would drop too: the aggregate must stay exact either way)
    assert detail["dropouts"].get("masked_input", 0) >= 2, r
    # three groups of 4 (each of two client processes); a group that fell below its threshold of 3 shows its
    # other devices among the dropouts too
    assert detail["counted"] == 12 - sum(detail["dropouts"].values()), r
    assert r["devices_left_out"] == 0 and r["groups"] == 3, r
    assert r["secagg"] == {"cohort": 12, "threshold": 3, "neighbours": 3}, r
    assert r["replica_cpu_ms_per_device_round"] > 0 and set(r["replica_peak_rss_mb"]) == {"replica-0", "replica-1"}
    assert "address list" in r["routing"]
    # the bench dropped its database
    import psycopg

    with psycopg.connect(host=postgresql_server.host, port=postgresql_server.port, user=postgresql_server.user,
                         dbname="postgres") as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
    assert not [n for n in names if n.startswith("fedmask_scale_")], names


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_bench_kills_the_leader_and_a_standby_takes_over(postgresql_server: PgServer) -> None:
    from fedmask.bench.scale_faults import KillPlan

    lines: list[str] = []
    cfg = ScaleBenchConfig(
        fleet=FleetShape(devices=12, client_processes=6, dim=64), replicas=2, dropout=0.15, rounds=3,
        baseline=False, lease_s=3.0, deadlines=StageDeadlines(masked_input=1.0), timeout=120.0,
        server=postgresql_server, kill=KillPlan("leader", "masked_input", 2),
    )
    r = run_scale_bench(cfg, log=lines.append)
    kill = r["kill"]
    assert r["ok"] is True and r["exact"] is True, (r.get("kill"), r["detail"], lines)
    assert kill["replica"] == "replica-0" and kill["new_leader"] == "replica-1", kill
    assert kill["takeover_ok"] and kill["takeover_s"] <= 3.0 + 5.0 and kill["version_history_ok"], kill
    assert r["leader"] == ["replica-0", "replica-1"] and r["rounds_committed"] == 3, r
    states = {d["round"]: (d["state"], d["abort_reason"]) for d in r["detail"]}
    # the round in flight at the kill never commits: the successor aborts it at its takeover
    assert states[2] == ("aborted", "coordinator_restart") if kill["stage_seen"] == "masked_input" else True, states


@pytest.mark.timeout(150)
def test_two_active_replicas_each_run_the_groups_of_their_clients(postgresql_server: PgServer) -> None:
    """--replica-mode active: both replicas serve (three client processes start on each), each runs a group
    of its own devices, and the leader's rounds commit, exact."""
    lines: list[str] = []
    cfg = ScaleBenchConfig(
        fleet=FleetShape(devices=12, client_processes=6, dim=64), replicas=2, group_size=4, dropout=0.0, rounds=2,
        baseline=False, lease_s=3.0, deadlines=StageDeadlines(masked_input=2.0), timeout=120.0,
        server=postgresql_server, replica_mode="active",
    )
    r = run_scale_bench(cfg, log=lines.append)
    assert r["ok"] is True and r["exact"] is True, (r["detail"], lines)
    assert r["rounds_committed"] == 2 and r["replica_mode"] == "active", r
    assert r["replica_groups"] == {"replica-0": 1, "replica-1": 1}, r  # each replica's three streams in one group
    assert len(r["leader"]) == 1 and r["devices_left_out"] == 12 - r["detail"][0]["cohort"], r
    assert "every replica holds device streams" in r["streams"] and "i mod R" in r["routing"]
    assert any("2 active replica(s) serve" in line for line in lines), lines
    with pytest.raises(ValueError, match="standby mode only"):
        from fedmask.bench.scale_faults import KillPlan

        ScaleBenchConfig(fleet=FleetShape(devices=12, client_processes=6), replicas=2, replica_mode="active",
                         kill=KillPlan("replica", "masked_input", 1))
