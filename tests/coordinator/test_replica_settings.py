"""ReplicaSettings: standby by default, the active mode's settings from
flags, env and file, and its refusals (D109)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.settings import CoordinatorSettings, SettingsError

PG = "postgresql+psycopg://fedmask:pw@db.example:5432/fedmask"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FEDMASK_"):
            monkeypatch.delenv(name)


def test_default_is_standby_with_the_documented_intervals() -> None:
    s = CoordinatorSettings.load()
    assert s.replica.mode == "standby"
    assert s.replica.advertise_admin is None
    assert (s.replica.poll_s, s.replica.publish_interval_s) == (0.2, 0.25)


def test_standby_is_allowed_on_every_store() -> None:
    for url in ("sqlite:///./x.db", "memory://", PG):
        assert CoordinatorSettings.load(overrides={"database_url": url}).replica.mode == "standby"


def test_active_on_postgresql_from_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = CoordinatorSettings.load(overrides={"database_url": PG, "replica.mode": "active",
                                            "replica.advertise_admin": "10.0.0.5:50052"})
    assert (s.replica.mode, s.replica.advertise_admin) == ("active", "10.0.0.5:50052")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'database_url = "{PG}"\n[replica]\nmode = "active"\npoll_s = 0.5\n')
    monkeypatch.setenv("FEDMASK_REPLICA__PUBLISH_INTERVAL_S", "1.5")
    s = CoordinatorSettings.load(config_file=cfg)
    assert (s.replica.mode, s.replica.poll_s, s.replica.publish_interval_s) == ("active", 0.5, 1.5)


@pytest.mark.parametrize("url", ["sqlite:///./x.db", "memory://"])
def test_active_is_refused_on_a_store_of_one_process(url: str) -> None:
    with pytest.raises(SettingsError) as err:
        CoordinatorSettings.load(overrides={"database_url": url, "replica.mode": "active"})
    assert "this store serves one coordinator process; run several replicas on PostgreSQL" in str(err.value)


def test_active_is_refused_with_plaintext_rounds() -> None:
    with pytest.raises(SettingsError) as err:
        CoordinatorSettings.load(overrides={"database_url": PG, "replica.mode": "active",
                                            "debug.insecure_plaintext": True, "secagg.group_size": 0})
    assert "rounds in groups do not run with debug.insecure_plaintext" in str(err.value)


def test_active_is_refused_with_hybrid_rounds(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    with pytest.raises(SettingsError) as err:
        CoordinatorSettings.load(overrides={
            "database_url": PG, "replica.mode": "active", "model.name": "fedmmf", "secagg.group_size": 0,
            "hybrid.unprotected_plaintext_j_bound": 0.5, "tls.cert": str(cert), "tls.key": str(key)})
    assert "rounds in groups do not run with hybrid.unprotected_plaintext_j_bound" in str(err.value)
    standby = CoordinatorSettings.load(overrides={
        "database_url": PG, "model.name": "fedmmf", "secagg.group_size": 0,
        "hybrid.unprotected_plaintext_j_bound": 0.5, "tls.cert": str(cert), "tls.key": str(key)})
    assert standby.hybrid.enabled  # the same settings pass in standby mode


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"replica.mode": "leader"}, "replica.mode"),
    ({"replica.advertise_admin": "nope"}, "replica.advertise_admin"),
    ({"replica.poll_s": 0}, "replica.poll_s"),
    ({"replica.publish_interval_s": -1}, "replica.publish_interval_s"),
])
def test_bad_replica_values_name_their_field(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(SettingsError) as err:
        CoordinatorSettings.load(overrides={"database_url": PG, **overrides})
    assert expected in str(err.value)
