"""E1, client side: `fedmask client --token` without --tls-ca to a
non-loopback coordinator is refused unless --insecure-token-without-tls."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge_client.transport_policy import INSECURE_TOKEN_FLAG, token_in_clear, token_transport_refusal
from fedmask.cli import app


@pytest.mark.parametrize(
    ("target", "token", "ca", "clear"),
    [
        ("10.0.0.5:50051", True, False, True),
        ("coordinator.example.org:443", True, False, True),
        ("dns:///coordinator.example.org:443", True, False, True),
        ("[2001:db8::1]:50051", True, False, True),
        ("10.0.0.5:50051", True, True, False),  # TLS
        ("10.0.0.5:50051", False, False, False),  # no token to leak
        ("127.0.0.1:50051", True, False, False),
        ("localhost:50051", True, False, False),
        ("[::1]:50051", True, False, False),
        ("ipv4:127.0.0.2:1", True, False, False),
    ],
)
def test_token_in_clear(target: str, token: bool, ca: bool, clear: bool) -> None:
    assert token_in_clear(target, has_token=token, has_tls_ca=ca) is clear
    refusal = token_transport_refusal(target, has_token=token, has_tls_ca=ca, allow_insecure=False)
    assert (refusal is not None) is clear
    if refusal is not None:
        assert "in clear" in refusal and INSECURE_TOKEN_FLAG in refusal and "--tls-ca" in refusal
    assert token_transport_refusal(target, has_token=token, has_tls_ca=ca, allow_insecure=True) is None


def test_the_cli_refuses_before_the_client_starts(tmp_path: Path) -> None:
    argv = ["client", "-c", "10.0.0.5:50051", "-u", "1", "-s", str(tmp_path / "s"), "--dataset", "synthetic",
            "--data-dir", str(tmp_path)]
    out = CliRunner().invoke(app, argv, env={"COLUMNS": "200", "FEDMASK_TOKEN": "a-token-of-some-length"})
    assert out.exit_code == 2
    assert "in clear" in " ".join(out.output.split()) and INSECURE_TOKEN_FLAG in out.output
    assert not (tmp_path / "s").exists()  # nothing started: no state written
    help_text = CliRunner().invoke(app, ["client", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert INSECURE_TOKEN_FLAG in help_text
