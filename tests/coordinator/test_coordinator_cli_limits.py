"""`fedmask coordinator`: the limits flags reach the settings, and token
mode without TLS off loopback is refused unless the insecure flag says so."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedmask.cli import app

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
TOKEN = "a-token-of-enough-length"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list:
    """`serve` replaced by a stub that records the settings it got."""
    import coordinator.server

    got: list = []

    async def fake_serve(settings, **_kwargs) -> int:
        got.append(settings)
        return 0

    monkeypatch.setattr(coordinator.server, "serve", fake_serve)
    return got


def test_help_lists_the_limits_and_the_insecure_flag() -> None:
    out = CliRunner().invoke(app, ["coordinator", "--help"], env=ENV)
    assert out.exit_code == 0
    for flag in ("--hello-timeout", "--max-streams", "--max-streams-per-peer", "--session-rate", "--enroll-rate",
                 "--message-rate", "--max-announced-devices", "--insecure-token-without-tls"):
        assert flag in out.output, flag


def test_limit_flags_reach_the_settings(captured: list) -> None:
    out = CliRunner().invoke(app, [
        "coordinator", "--database-url", "memory://", "--hello-timeout", "2.5", "--max-streams", "9",
        "--max-streams-per-peer", "3", "--session-rate", "0.5", "--enroll-rate", "0.25", "--message-rate", "7",
        "--max-announced-devices", "42",
    ], env=ENV)
    assert out.exit_code == 0, out.output
    (s,) = captured
    limits = s.limits
    assert (limits.hello_timeout_s, limits.max_streams, limits.max_streams_per_peer) == (2.5, 9, 3)
    assert (limits.session_rate, limits.enroll_rate, limits.message_rate) == (0.5, 0.25, 7.0)
    assert limits.max_announced_devices == 42 and limits.session_burst == 50


def test_token_without_tls_off_loopback_needs_the_loud_flag(captured: list) -> None:
    env = {**ENV, "FEDMASK_AUTH__TOKEN": TOKEN}
    argv = ["coordinator", "--database-url", "memory://", "--listen", "0.0.0.0:50051", "--auth", "token"]
    out = CliRunner().invoke(app, argv, env=env)
    assert out.exit_code == 2 and captured == []
    assert "in clear" in out.output and "--insecure-token-without-tls" in out.output and TOKEN not in out.output
    out = CliRunner().invoke(app, [*argv, "--insecure-token-without-tls"], env=env)
    assert out.exit_code == 0, out.output
    assert captured[0].auth.allow_insecure_token and captured[0].token_in_clear
