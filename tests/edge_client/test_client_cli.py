"""`fedmask client`: help text and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedmask.cli import app

FLAGS = [
    "--coordinator", "--users", "--state-dir", "--dataset", "--data-dir", "--device", "--seed", "--name",
    "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name", "--token", "--drop-rate", "--drop-stage",
    "--crash-after-round", "--delay-ms", "--exit-after-rounds", "--threads", "--log-level",
]


def test_help_explains_every_flag() -> None:
    out = CliRunner().invoke(app, ["client", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert out.exit_code == 0
    for flag in FLAGS:
        assert flag in out.output, flag
    assert "1-based" in out.output and "FEDMASK_TOKEN" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "no-such-set"], "unknown or missing dataset 'no-such-set'"),
        (["--users", "5-2"], "descending range"),
        (["--users", "1-250"], "beyond dataset 'synthetic', which has users 1..200"),
        (["--coordinator", "nohost"], "HOST:PORT"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--device", "tpu"], "unknown --device"),
    ],
)
def test_bad_input_fails_fast_with_a_clear_message(tmp_path: Path, args: list[str], message: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    base = {"--coordinator": "127.0.0.1:1", "--users": "1-3", "--state-dir": str(tmp_path / "s"),
            "--dataset": "synthetic", "--data-dir": str(tmp_path)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["client"] + [x for kv in base.items() for x in kv]
    out = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert out.exit_code == 2
    text = out.output + caplog.text
    assert message in " ".join(text.split()), text


def test_drop_rate_needs_a_stage(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["client", "-c", "127.0.0.1:1", "-u", "1", "-s", str(tmp_path),
                                   "--dataset", "synthetic", "--drop-rate", "0.5"], env={"COLUMNS": "200"})
    assert out.exit_code == 2 and "--drop-stage" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of --users"),
        (["-u", "1", "--platform", "1"], "give exactly one of --users"),
        (["--platform", "6", "--platforms", "5"], "--platform must be in 1..5"),
        (["--platform", "1", "--dirichlet-beta", "0"], "--dirichlet-beta must be > 0"),
    ],
)
def test_platform_hosting_flags_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    out = CliRunner().invoke(app, ["client", "-c", "127.0.0.1:1", "-s", str(tmp_path), "--dataset", "synthetic", *args],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 2 and message in " ".join(out.output.split()), out.output


def test_a_platform_client_hosts_one_device_and_joins_only_full_cohorts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--platform P --platforms M: one platform device, the cohort floor at M (D68)."""
    import edge_client.app as edge_app

    seen = {}

    def fake_run(config):  # noqa: ANN001, ANN202
        seen["config"] = config
        return 0

    monkeypatch.setattr(edge_app, "run_client", fake_run)
    out = CliRunner().invoke(app, ["client", "-c", "127.0.0.1:1", "-s", str(tmp_path), "--dataset", "synthetic",
                                   "--platform", "2", "--platforms", "4"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    cfg = seen["config"]
    assert cfg.platform.platform == 2 and cfg.platform.n_platforms == 4 and cfg.cohort_floor.min_cohort == 4
    client = edge_app.EdgeClient(cfg).prepare()
    try:
        assert [d.number for d in client.hosted] == [2] and client.hosted[0].local_id == "platform-2-of-4"
        from edge_client.platform_trainer import PlatformTrainer

        assert isinstance(client.trainer, PlatformTrainer) and client.trainer.supported_models == ("freib",)
        assert len(client.trainer.users) > 0 and client.trainer.hosting.index == 1
    finally:
        client.close()
