"""`fedmask bench connections --replicas R`: idle devices held by active
replicas (D109) over PostgreSQL, with more devices enrolled than connect.
The run uses the session's throwaway PostgreSQL server (tests/conftest_pg.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedmask.bench.idle_tier import IdleTierConfig, fill_registry, run_idle_tier_bench
from fedmask.bench.scale import database_on
from fedmask.bench.throwaway_postgres import PgServer


def test_the_config_refuses_what_the_bench_cannot_run() -> None:
    with pytest.raises(ValueError, match="at least --devices"):
        IdleTierConfig(devices=100, enrolled=99)
    with pytest.raises(ValueError, match="at least 1"):
        IdleTierConfig(replicas=0)
    with pytest.raises(ValueError, match="more than --devices"):
        IdleTierConfig(devices=3, enrolled=10, client_processes=4)


def test_enrolled_without_replicas_is_refused() -> None:
    from fedmask.commands.bench import bench_app

    result = CliRunner().invoke(bench_app, ["connections", "--enrolled", "10"])
    assert result.exit_code == 2 and "needs --replicas" in result.output


def test_the_registry_is_filled_in_batches(postgresql_server: PgServer) -> None:
    from coordinator.store import open_store

    with database_on(postgresql_server, "fill") as url:
        store = open_store(url)
        try:
            fill_registry(store, 5003, lambda _: None)  # one batch and a part
            devices = store.list_devices()
        finally:
            store.close()
    assert len(devices) == 5003 and len({d.identity_public_key for d in devices}) == 5003


@pytest.mark.timeout(180)
def test_two_active_replicas_hold_the_idle_devices_of_a_larger_registry(postgresql_server: PgServer) -> None:
    lines: list[str] = []
    out = run_idle_tier_bench(IdleTierConfig(replicas=2, devices=40, enrolled=400, client_processes=2, hold=1.0,
                                             server=postgresql_server), lines.append)
    assert out["ok"], (out, lines)
    assert out["published"] == {"replica-0": 20, "replica-1": 20}  # client i starts at replica i mod R
    assert out["enrolled"] == 400 and any("360 devices enrolled straight into the store" in line for line in lines)
    for name in ("replica-0", "replica-1"):
        assert 50 < out["replica_rss_mb"][name] <= out["replica_rss_peak_mb"][name]
