"""CoordinatorSettings: precedence flag > env > file > default, and clear
errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.settings import CONFIG_ENV, CoordinatorSettings, SecaggSettings, SettingsError, ThresholdPolicy, unflatten


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FEDMASK_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "coordinator.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_are_valid() -> None:
    s = CoordinatorSettings.load()
    assert s.listen_address == "127.0.0.1:50051"
    assert s.database_url == "sqlite:///./fedmask.db"
    assert (s.model.name, s.cohort.size, s.secagg.graph, s.auth.mode) == ("fedrap", 100, "auto", "none")
    assert s.cohort.selected == 130


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path, """
listen_address = "127.0.0.1:6000"
database_url = "sqlite:///from-file.db"
[cohort]
size = 50
minimum = 5
over_selection = 0.1
[model]
name = "fedmf"
[model.hyperparameters]
lr = 0.5
""")
    # file over default
    s = CoordinatorSettings.load(config_file=cfg)
    assert (s.listen_address, s.cohort.size, s.cohort.minimum, s.model.name) == ("127.0.0.1:6000", 50, 5, "fedmf")
    assert s.model.hyperparameters == {"lr": 0.5}
    assert s.deadlines.unmasking == 60.0  # untouched default
    # env over file (nested groups merge key by key)
    monkeypatch.setenv("FEDMASK_COHORT__SIZE", "60")
    monkeypatch.setenv("FEDMASK_LISTEN_ADDRESS", "127.0.0.1:7000")
    monkeypatch.setenv("FEDMASK_MODEL__HYPERPARAMETERS", '{"lr": 0.25, "k": 32}')
    s = CoordinatorSettings.load(config_file=cfg)
    assert (s.listen_address, s.cohort.size, s.cohort.minimum) == ("127.0.0.1:7000", 60, 5)
    assert s.cohort.over_selection == 0.1 and s.model.name == "fedmf"
    assert s.model.hyperparameters == {"lr": 0.25, "k": 32}
    # flag over env; a None flag means "not given"
    s = CoordinatorSettings.load(
        config_file=cfg, overrides={"cohort.size": 70, "listen_address": None, "deadlines.unmasking": 5}
    )
    assert (s.listen_address, s.cohort.size, s.cohort.minimum) == ("127.0.0.1:7000", 70, 5)
    assert s.deadlines.unmasking == 5.0


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(write(tmp_path, '[secagg]\ngraph = 12\nthreshold = 0.75\n')))
    s = CoordinatorSettings.load()
    assert s.secagg.graph == 12 and s.secagg.threshold == 0.75


def test_env_values_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDMASK_SECAGG__GRAPH", "8")
    monkeypatch.setenv("FEDMASK_SECAGG__SIGNATURES", "true")
    monkeypatch.setenv("FEDMASK_DP__MODE", "distributed")
    monkeypatch.setenv("FEDMASK_DATABASE_URL", "postgresql://fed@db:5432/fedmask")
    s = CoordinatorSettings.load()
    assert s.secagg.graph == 8 and s.secagg.signatures is True and s.dp.mode == "distributed"
    assert s.database_url == "postgresql+psycopg://fed@db:5432/fedmask"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"cohort.size": 0}, "cohort.size (env FEDMASK_COHORT__SIZE): Input should be greater than 0 [got 0]"),
        ({"cohort.size": 5, "cohort.minimum": 9}, "cohort.minimum (9) must be <= cohort.size (5)"),
        ({"cohort.over_selection": 1.5}, "cohort.over_selection"),
        ({"deadlines.share_keys": -1}, "deadlines.share_keys (env FEDMASK_DEADLINES__SHARE_KEYS)"),
        ({"secagg.graph": "ring"}, "secagg.graph (env FEDMASK_SECAGG__GRAPH): Input should be 'full' or 'auto'"),
        ({"secagg.threshold": 0.4}, "secagg.threshold"),
        ({"secagg.modulus_bits": 64}, "secagg.modulus_bits"),
        ({"secagg.consistency_check": True}, "secagg.consistency_check requires secagg.signatures"),
        ({"dp.delta": 0}, "dp.delta"),
        ({"dp.mode": "global"}, "dp.mode"),
        ({"listen_address": "localhost"}, "listen address must be HOST:PORT"),
        ({"listen_address": "0.0.0.0:50051"}, "auth.mode 'none' is only allowed on a loopback"),
        ({"database_url": "mysql://u@h/db"}, "unsupported database URL scheme 'mysql'"),
        ({"auth.mode": "token"}, "auth.mode 'token' needs auth.token of at least 16"),
        ({"auth.token": "x" * 20}, "auth.token is set but auth.mode is 'none'"),
        ({"auth.mode": "mtls"}, "auth.mode 'mtls' needs tls.cert, tls.key, tls.client_ca"),
        ({"tls.cert": "/nonexistent.pem"}, "tls.cert"),
        ({"model.name": "Fed RAP"}, "model.name"),
        ({"cohort.sizee": 3}, "cohort.sizee"),
    ],
)
def test_bad_values_give_clear_errors(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        CoordinatorSettings.load(overrides=overrides)
    assert expected in str(info.value), str(info.value)
    assert str(info.value).startswith("invalid coordinator settings")


def test_all_problems_are_reported_at_once_and_tokens_redacted() -> None:
    with pytest.raises(SettingsError) as info:
        CoordinatorSettings.load(overrides={"cohort.size": -1, "dp.clip": 0, "auth.token": ["secret-secret-secret"]})
    text = str(info.value)
    assert "3 problem(s)" in text and "cohort.size" in text and "dp.clip" in text
    assert "secret-secret-secret" not in text and "<redacted>" in text


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        CoordinatorSettings.load(config_file=tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match="not valid TOML"):
        CoordinatorSettings.load(config_file=write(tmp_path, "cohort = [\n"))
    with pytest.raises(SettingsError, match="only TOML"):
        CoordinatorSettings.load(config_file=write(tmp_path, "a: 1", name="c.yaml"))
    with pytest.raises(SettingsError) as info:
        CoordinatorSettings.load(config_file=write(tmp_path, "[cohort]\nsise = 3\n"))
    assert "cohort.sise" in str(info.value) and "Extra inputs are not permitted" in str(info.value)
    assert "config file:" in str(info.value)


def test_mtls_and_token_modes_validate(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    s = CoordinatorSettings.load(overrides={
        "listen_address": "0.0.0.0:50051", "auth.mode": "mtls",
        "tls.cert": tmp_path / "cert.pem", "tls.key": tmp_path / "key.pem",
        "tls.client_ca": tmp_path / "ca.pem", "tls.require_client_cert": True,
    })
    assert s.tls.enabled and s.tls.cert == tmp_path / "cert.pem"
    with pytest.raises(SettingsError, match="tls.cert and tls.key must be given together"):
        CoordinatorSettings.load(overrides={"tls.cert": tmp_path / "cert.pem"})
    t = CoordinatorSettings.load(overrides={"listen_address": "[::1]:1", "auth.mode": "token", "auth.token": "t" * 16})
    assert t.auth.token is not None and t.auth.token.get_secret_value() == "t" * 16
    assert "t" * 16 not in repr(t) and not t.token_in_clear


def test_token_without_tls_off_loopback_needs_the_insecure_flag(tmp_path: Path) -> None:
    """E1: the bearer token would cross the network in clear."""
    token = {"auth.mode": "token", "auth.token": "t" * 16}
    for address in ("[::]:1", "0.0.0.0:50051", "10.1.2.3:50051"):
        with pytest.raises(SettingsError, match="in clear") as info:
            CoordinatorSettings.load(overrides={"listen_address": address, **token})
        assert "--insecure-token-without-tls" in str(info.value) and "t" * 16 not in str(info.value)
    loud = CoordinatorSettings.load(overrides={"listen_address": "[::]:1", **token, "auth.allow_insecure_token": True})
    assert loud.token_in_clear
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    tls = CoordinatorSettings.load(overrides={"listen_address": "[::]:1", **token,
                                              "tls.cert": tmp_path / "cert.pem", "tls.key": tmp_path / "key.pem"})
    assert not tls.token_in_clear
    with pytest.raises(SettingsError, match="only applies to auth.mode 'token'"):
        CoordinatorSettings.load(overrides={"auth.allow_insecure_token": True})


def test_limits_group_from_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = CoordinatorSettings.load().limits
    assert (d.hello_timeout_s, d.max_streams, d.max_announced_devices, d.device_lookup_interval_s) == (10.0, 1024, 10_000, 1.0)
    cfg = write(tmp_path, "[limits]\nmax_streams = 7\nenroll_rate = 0.5\n")
    monkeypatch.setenv("FEDMASK_LIMITS__HELLO_TIMEOUT_S", "2.5")
    s = CoordinatorSettings.load(config_file=cfg, overrides={"limits.max_announced_devices": 100})
    assert (s.limits.max_streams, s.limits.enroll_rate, s.limits.hello_timeout_s) == (7, 0.5, 2.5)
    assert s.limits.max_announced_devices == 100 and s.limits.session_burst == 50
    with pytest.raises(SettingsError) as info:
        CoordinatorSettings.load(overrides={"limits.max_streams": 0, "limits.max_announced_devices": 200_000,
                                            "limits.hello_timeout": 3})
    text = str(info.value)
    assert "limits.max_streams (env FEDMASK_LIMITS__MAX_STREAMS)" in text and "limits.max_announced_devices" in text
    assert "limits.hello_timeout: unknown setting" in text


@pytest.mark.parametrize(
    ("policy", "n", "t"),
    [("majority", 10, 6), ("majority", 3, 2), ("two_thirds", 10, 7), ("two_thirds", 3, 2), (0.51, 100, 51),
     (1.0, 7, 7), ("two_thirds", 1, 1)],
)
def test_threshold_policy(policy: ThresholdPolicy, n: int, t: int) -> None:
    assert SecaggSettings(threshold=policy).threshold_for(n) == t


def test_unflatten() -> None:
    assert unflatten({"a.b.c": 1, "a.d": 2, "e": 3, "f": None}) == {"a": {"b": {"c": 1}, "d": 2}, "e": 3}
    with pytest.raises(SettingsError):
        unflatten({"a": 1, "a.b": 2})


def test_hybrid_rounds_are_off_by_default_and_refused_without_tls(tmp_path: Path) -> None:
    assert CoordinatorSettings.load().hybrid.unprotected_plaintext_j_bound is None
    fedmmf = {"model.name": "fedmmf", "hybrid.unprotected_plaintext_j_bound": 0.5}
    with pytest.raises(SettingsError, match="needs TLS on the device listener"):
        CoordinatorSettings.load(overrides=fedmmf)
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    tls = {"tls.cert": tmp_path / "cert.pem", "tls.key": tmp_path / "key.pem"}
    s = CoordinatorSettings.load(overrides={**fedmmf, **tls})
    assert s.hybrid.enabled and s.hybrid.unprotected_plaintext_j_bound == 0.5
    with pytest.raises(SettingsError, match="model.name must be 'fedmmf'"):
        CoordinatorSettings.load(overrides={**fedmmf, **tls, "model.name": "fedrap"})
    with pytest.raises(SettingsError, match="dp.mode 'distributed'"):
        CoordinatorSettings.load(overrides={**fedmmf, **tls, "dp.mode": "distributed"})
    with pytest.raises(SettingsError, match="unprotected_plaintext_j_bound"):
        CoordinatorSettings.load(overrides={**fedmmf, **tls, "hybrid.unprotected_plaintext_j_bound": -1})
