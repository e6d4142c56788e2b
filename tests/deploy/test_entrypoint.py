"""deploy/docker/entrypoint.sh without a container: a stand-in `fedmask` and
`hostname` on PATH record what the entrypoint runs, so the user slice a
StatefulSet ordinal picks, the certificate it uses, the dataset fetch and the
database password hand-over are checked here (the compose test runs the real
thing)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "entrypoint.sh"

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def box(tmp_path: Path) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # `fedmask ARGS`: one line per call: the arguments, then PGPASSWORD.
    _tool(bin_dir / "fedmask", f'echo "$* | PGPASSWORD=${{PGPASSWORD:-}}" >> {calls}\n')
    _tool(bin_dir / "hostname", 'echo "${FAKE_HOSTNAME}"\n')
    certs = tmp_path / "certs"
    (certs / "devices").mkdir(parents=True)
    for name in ("ca.pem", "coordinator.pem", "coordinator.key"):
        (certs / name).write_text("x")
    for i in (1, 4):
        for ext in ("pem", "key"):
            (certs / "devices" / f"device-{i:04d}.{ext}").write_text("x")
    return {"bin": bin_dir, "calls": calls, "certs": certs, "data": tmp_path / "data", "tmp": tmp_path}


def _run(box: dict[str, Path], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": f"{box['bin']}:{os.environ['PATH']}",
        "FEDMASK_CERTS_DIR": str(box["certs"]),
        "FEDMASK_DATA_DIR": str(box["data"]),
        "FEDMASK_STATE_DIR": str(box["tmp"] / "state"),
        "FEDMASK_WAIT_S": "2",
        **env,
    }
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=full, text=True, capture_output=True, timeout=60)


def _calls(box: dict[str, Path]) -> list[str]:
    return box["calls"].read_text().splitlines() if box["calls"].exists() else []


def test_the_pod_ordinal_picks_the_users_and_the_certificate(box: dict[str, Path]) -> None:
    proc = _run(box, "client", "--threads", "2", FAKE_HOSTNAME="fedmask-client-3",
                FEDMASK_COORDINATOR="fedmask-coordinator:50051")
    assert proc.returncode == 0, proc.stderr
    fetch, client = _calls(box)
    assert fetch.startswith(f"data fetch ml-100k --data-dir {box['data']}")
    args = client.split(" | ")[0].split()
    assert args[0] == "client"
    opts = dict(zip(args[1::2], args[2::2]))
    assert opts["--users"] == "31-40"  # ordinal 3, 10 users per client
    assert opts["--tls-cert"] == f"{box['certs']}/devices/device-0004.pem"
    assert opts["--tls-key"] == f"{box['certs']}/devices/device-0004.key"
    assert opts["--tls-ca"] == f"{box['certs']}/ca.pem"
    assert opts["--coordinator"] == "fedmask-coordinator:50051"
    assert opts["--name"] == "client-3"
    assert args[-2:] == ["--threads", "2"]


def test_an_explicit_index_and_slice_size_win(box: dict[str, Path]) -> None:
    proc = _run(box, "client", FAKE_HOSTNAME="whatever", FEDMASK_CLIENT_INDEX="0", FEDMASK_USERS_PER_CLIENT="25",
                FEDMASK_COORDINATOR="c:1", FEDMASK_DATASET="synthetic")
    assert proc.returncode == 0, proc.stderr
    (client,) = _calls(box)  # synthetic data: nothing to fetch
    assert "--users 1-25 " in client and "device-0001.pem" in client


def test_a_client_without_its_index_or_coordinator_refuses_to_start(box: dict[str, Path]) -> None:
    proc = _run(box, "client", FAKE_HOSTNAME="laptop", FEDMASK_COORDINATOR="c:1")
    assert proc.returncode == 2 and "FEDMASK_CLIENT_INDEX" in proc.stderr
    proc = _run(box, "client", FAKE_HOSTNAME="x-1")
    assert proc.returncode != 0 and "FEDMASK_COORDINATOR" in proc.stderr
    assert _calls(box) == []


def test_a_missing_certificate_is_waited_for_then_given_up(box: dict[str, Path]) -> None:
    proc = _run(box, "client", FAKE_HOSTNAME="fedmask-client-1", FEDMASK_COORDINATOR="c:1",
                FEDMASK_DATASET="synthetic")  # device-0002 was never issued
    assert proc.returncode == 1
    assert "waiting" in proc.stderr and "gave up after 2s" in proc.stderr and "device-0002.pem" in proc.stderr
    assert _calls(box) == []


def test_the_coordinator_gets_the_database_password_from_its_file(box: dict[str, Path]) -> None:
    secret = box["tmp"] / "pw"
    secret.write_text("s3cret\n")
    proc = _run(box, "coordinator", "--rounds", "3", FEDMASK_DATABASE_PASSWORD_FILE=str(secret),
                FEDMASK_TLS__CERT=str(box["certs"] / "coordinator.pem"))
    assert proc.returncode == 0, proc.stderr
    assert _calls(box) == ["coordinator --rounds 3 | PGPASSWORD=s3cret"]


def test_certs_and_other_commands(box: dict[str, Path]) -> None:
    assert _run(box, "certs", FEDMASK_CERT_DEVICES="3").returncode == 0
    assert _run(box, "devices", "list").returncode == 0
    assert _calls(box) == [
        f"certs init {box['certs']} --devices 3 --coordinator-host coordinator | PGPASSWORD=",
        "devices list | PGPASSWORD=",
    ]


def test_admin_role_reads_its_secrets_from_files_and_waits_for_them(box: dict[str, Path]) -> None:
    """The admin service's database password and coordinator token come from
    mounted files (Compose secrets, Kubernetes Secret volumes), never from the
    compose file or a manifest; the entrypoint waits for every file it is
    told about and refuses an empty token file."""
    secrets_dir = box["tmp"] / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "pw").write_text("s3cret\n")
    (secrets_dir / "tokens.toml").write_text("")
    token_file = secrets_dir / "admin-token"
    env = {"FEDMASK_DATABASE_PASSWORD_FILE": str(secrets_dir / "pw"),
           "FEDMASK_COORDINATOR_TOKEN_FILE": str(token_file),
           "FEDMASK_ADMIN_CONFIG": str(secrets_dir / "tokens.toml"),
           "FEDMASK_ADMIN_COORDINATOR__TLS_CA": str(box["certs"] / "ca.pem")}
    # The token file is missing: it waits, then gives up naming it.
    missing = _run(box, "admin", **env)
    assert missing.returncode == 1 and str(token_file) in missing.stderr and not _calls(box)
    token_file.write_text("# the admin token\n\n  tok-abc123  \nold-token\n")
    bin_fedmask = box["bin"] / "fedmask"
    _tool(bin_fedmask, f'echo "$* | PGPASSWORD=${{PGPASSWORD:-}} | TOKEN=${{FEDMASK_ADMIN_COORDINATOR__TOKEN:-}}" '
                       f'>> {box["calls"]}\n')
    ok = _run(box, "admin", "--log-level", "DEBUG", **env)
    assert ok.returncode == 0, ok.stderr
    assert _calls(box) == ["admin --log-level DEBUG | PGPASSWORD=s3cret | TOKEN=tok-abc123"]
    token_file.write_text("# nothing but a comment\n\n")
    empty = _run(box, "admin", **env)
    assert empty.returncode == 2 and "holds no token" in empty.stderr


def test_coordinator_role_waits_for_its_admin_token_file(box: dict[str, Path]) -> None:
    missing = _run(box, "coordinator", FEDMASK_ADMIN__TOKEN_FILE=str(box["tmp"] / "admin-token"))
    assert missing.returncode == 1 and "admin-token" in missing.stderr and not _calls(box)
