"""Proof: the containers run a federation and survive a killed leader.

Builds the images (`make images`), starts deploy/compose.yaml with
podman-compose (PostgreSQL, the certificate step, three coordinator replicas
with mTLS, one leading and two standbys (D90), HAProxy in front of them
(D94), the admin service, two edge
clients of 10 ML-100K users each), waits for three secure rounds to commit,
asks the admin service from the host (its published port) for a user's
top-k over REST with a recommender token and checks the answer against the
store (computed on the device, from a committed model version), checks the
admin service's role tokens and its SELECT-only database role, SIGKILLs the
leader's container and checks that a standby takes the lease and the
federation goes on from the committed model version with nothing lost and
nothing restarted by hand (every committed round and model version kept,
the next round built on the last committed version, the model step
continuing, no device re-enrolled, the clients and the admin service never
restarted, the admin service ready again and answering top-k); the killed
replica, started again, comes back as a standby. Then it tears the stack
down and removes its containers, volumes, network and secrets. The images
stay (the build cache).

The dataset is fetched on the host (`fedmask data fetch`, a no-op when
data/ml-100k is valid) and copied into the stack's data volume: containers on
the CI machines cannot reach the package index.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
PODMAN_COMPOSE = Path(sys.executable).with_name("podman-compose")
TAG = "0.1.0"
PREFIX = "localhost/"
POSTGRES_IMAGE = "localhost/fedmask-postgres:15"
HAPROXY_IMAGE = "localhost/fedmask-haproxy:2.6"
ROUNDS_BEFORE_KILL = 3
ROUNDS_AFTER_RESTART = 2

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (.ci/ensure-containers)"),
    pytest.mark.timeout(1800),
]


# The test's timings go to the terminal even when pytest captures output
# (`make test` runs without -s), so CI logs show the proof's wall time.
_REPORTER: Any = None
_CAPTURE: Any = None


def _say(line: str) -> None:
    if _REPORTER is None or _CAPTURE is None:  # pragma: no cover - outside pytest
        print(line)
        return
    with _CAPTURE.global_and_fixture_disabled():
        _REPORTER.write_line(line)


def _env(secrets_dir: Path, admin_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CONTAINERS_CONF=str(CONTAINERS_CONF), FEDMASK_IMAGE_PREFIX=PREFIX, FEDMASK_IMAGE_TAG=TAG,
               FEDMASK_POSTGRES_IMAGE=POSTGRES_IMAGE, FEDMASK_HAPROXY_IMAGE=HAPROXY_IMAGE,
               FEDMASK_SECRETS_DIR=str(secrets_dir),
               FEDMASK_ROUND_PAUSE="2", FEDMASK_ADMIN_PORT=str(admin_port))
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _secret(secrets_dir: Path, name: str, value: str) -> None:
    """A secret file as `make up` writes it: readable by the containers' user."""
    (secrets_dir / name).write_text(value + "\n")
    (secrets_dir / name).chmod(0o644)


def _api_token_entry(name: str, role: str, token: str) -> str:
    """The settings entry `fedmask admin-token NAME ROLE --stdin` prints (the real command, as make up runs it)."""
    return _run([sys.executable, "-m", "fedmask", "admin-token", name, role, "--stdin"],
                {**os.environ, "PYTHONPATH": str(ROOT)}, stdin=token + "\n").stdout


def _run(cmd: list[str], env: dict[str, str], *, check: bool = True, timeout: float = 600,
         capture: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, text=True, timeout=timeout, capture_output=capture, cwd=ROOT, input=stdin)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


class Stack:
    def __init__(self, project: str, env: dict[str, str], password: str, *, reader_password: str,
                 admin_port: int, tokens: dict[str, str]) -> None:
        self.project, self.env, self.password = project, env, password
        self.reader_password, self.admin_port, self.tokens = reader_password, admin_port, tokens

    def http(self, path: str, token: str | None = None, timeout: float = 30) -> tuple[int, Any]:
        """GET the admin service from the host (its port published on 127.0.0.1): (status, JSON body)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return exc.code, json.loads(body or b"null")
            except ValueError:
                return exc.code, body.decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as exc:  # not listening yet, reset during a restart
            return 0, str(exc)

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run([str(PODMAN_COMPOSE), "-p", self.project, "-f", str(COMPOSE_FILE), *args], self.env,
                    check=check, timeout=timeout)

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run(["podman", *args], self.env, check=check, timeout=timeout)

    def containers(self) -> dict[str, dict[str, Any]]:
        """service name -> `podman ps -a` entry of this project's containers."""
        out = self.podman("ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}",
                          "--format", "json").stdout
        return {c["Labels"]["com.docker.compose.service"]: c for c in json.loads(out or "[]")}

    def name(self, service: str) -> str:
        return str(self.containers()[service]["Names"][0])

    def sql(self, query: str) -> list[list[str]]:
        out = self.podman("exec", "-e", f"PGPASSWORD={self.password}", self.name("postgres"), "psql", "-h",
                          "127.0.0.1", "-U", "fedmask", "-d", "fedmask", "-tA", "-F", "\t", "-c", query).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def logs(self, service: str) -> str:
        proc = self.podman("logs", "--tail", "60", self.name(service), check=False)
        return proc.stdout + proc.stderr

    def all_logs(self) -> str:
        return "\n".join(f"===== {s}\n{self.logs(s)}" for s in sorted(self.containers()))


def _wait(what: str, predicate: Callable[[], Any], timeout: float, stack: Stack, every: float = 3.0) -> Any:
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        try:
            got = predicate()
            if got:
                return got
        except (AssertionError, subprocess.SubprocessError, KeyError, IndexError, ValueError) as exc:
            last_error = str(exc)[-500:]
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} ({last_error})\n{stack.all_logs()}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Stack]:
    global _REPORTER, _CAPTURE
    _REPORTER = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    _CAPTURE = pytestconfig.pluginmanager.get_plugin("capturemanager")
    t0 = time.monotonic()
    if not PODMAN_COMPOSE.exists():
        pytest.fail(f"{PODMAN_COMPOSE} missing: install the dev extras (podman-compose is pinned there)")
    secrets_dir = tmp_path_factory.mktemp("secrets")
    password, reader_password = secrets.token_hex(16), secrets.token_hex(16)
    _secret(secrets_dir, "postgres-password", password)
    _secret(secrets_dir, "postgres-reader-password", reader_password)
    _secret(secrets_dir, "admin-token", secrets.token_urlsafe(32))
    tokens = {role: secrets.token_urlsafe(32) for role in ("operator", "recommender", "viewer")}
    _secret(secrets_dir, "admin-api-tokens.toml",
            "".join(_api_token_entry(f"test-{role}", role, token) for role, token in tokens.items()))
    admin_port = _free_port()
    env = _env(secrets_dir, admin_port)
    project = f"fedmask-test-{os.getpid()}"
    s = Stack(project, env, password, reader_password=reader_password, admin_port=admin_port, tokens=tokens)

    # 1. Images (cached layers make a rebuild cheap when nothing changed).
    t = time.monotonic()
    _run(["make", "--no-print-directory", "images"], env, timeout=1500, capture=False)
    _say(f"[containers] make images: {time.monotonic() - t:.0f}s")

    # 2. The dataset, fetched on the host, copied into the data volume.
    data_dir = ROOT / "data"
    _run([sys.executable, "-m", "fedmask", "data", "fetch", "ml-100k", "--data-dir", str(data_dir)],
         {**env, "PYTHONPATH": str(ROOT)}, timeout=600)
    s.podman("volume", "create", f"{project}_data")
    s.podman("run", "--rm", "--entrypoint", "cp", "-v", f"{project}_data:/var/lib/fedmask/data",
             "-v", f"{data_dir / 'ml-100k'}:/src:ro", f"{PREFIX}fedmask-client:{TAG}",
             "-r", "/src", "/var/lib/fedmask/data/ml-100k")
    try:
        t = time.monotonic()
        s.compose("up", "-d", timeout=900)
        _say(f"[containers] compose up: {time.monotonic() - t:.0f}s")
        yield s
    finally:
        t = time.monotonic()
        if os.environ.get("FEDMASK_KEEP_STACK") != "1":
            s.compose("down", "-v", "-t", "5", check=False, timeout=300)
            s.podman("volume", "rm", "-f", f"{project}_data", check=False)
            left = s.podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={project}").stdout.split()
            if left:
                s.podman("rm", "-f", *left, check=False)
            for vol in s.podman("volume", "ls", "-q").stdout.split():
                if vol.startswith(f"{project}_"):
                    s.podman("volume", "rm", "-f", vol, check=False)
            for net in s.podman("network", "ls", "--format", "{{.Name}}").stdout.split():
                if net.startswith(f"{project}_"):
                    s.podman("network", "rm", "-f", net, check=False)
        _say(f"[containers] teardown: {time.monotonic() - t:.0f}s; whole test {time.monotonic() - t0:.0f}s wall")


def _committed(s: Stack) -> list[dict[str, Any]]:
    rows = s.sql("select r.number, r.base_model_version, m.id, m.sha256, m.hyperparameters::json->>'step' "
                 "from rounds r join model_versions m on m.round_number = r.number "
                 "where r.state = 'committed' order by r.number")
    return [{"number": int(n), "base": int(b), "version": int(v), "sha256": h, "step": int(st)}
            for n, b, v, h, st in rows]


def test_federation_survives_a_killed_leader(stack: Stack) -> None:
    s = stack
    t0 = time.monotonic()

    # Three secure rounds commit.
    _wait(f"{ROUNDS_BEFORE_KILL} committed rounds", lambda: len(_committed(s)) >= ROUNDS_BEFORE_KILL, 900, s)
    _say(f"[containers] {ROUNDS_BEFORE_KILL} rounds committed {time.monotonic() - t0:.0f}s after up")

    # Every service's HEALTHCHECK passes (podman 4.3 without systemd runs them only on demand);
    # the standbys' too (alive, not serving devices).
    for service in ("postgres", *REPLICAS, "admin", "client-0", "client-1"):
        proc = s.podman("healthcheck", "run", s.name(service), check=False)
        assert proc.returncode == 0, f"{service} healthcheck: {proc.stdout} {proc.stderr}\n{s.logs(service)}"
    # Secure rounds: every committed one went through the SecAgg stages to unmasking.
    stages = s.sql("select timings::jsonb ? 'share_keys' and timings::jsonb ? 'masked_input' "
                   "and timings::jsonb ? 'unmasking' from rounds where state = 'committed'")
    assert stages and all(row == ["t"] for row in stages), stages
    leader, token = _leader(s)
    _check_admin_service(s, leader)
    devices_before = s.sql("select id, identity_public_key from devices order by id")
    assert len(devices_before) == 20, devices_before
    clients_before = {k: v["Id"] for k, v in s.containers().items() if k.startswith("client-") or k == "admin"}

    # SIGKILL the leader's container, then read what the database holds at that moment.
    s.podman("kill", "--signal", "KILL", s.name(leader))
    killed = time.monotonic()
    _wait("the leader to be gone", lambda: s.containers()[leader]["State"] != "running", 60, s, 0.5)
    at_kill = _committed(s)
    versions_at_kill = s.sql("select id, sha256 from model_versions order by id")
    latest = int(versions_at_kill[-1][0])
    assert at_kill[-1]["version"] == latest
    in_flight = s.sql("select number from rounds where state not in ('committed', 'aborted')")

    # A standby takes the lease (a new term) and serves; nothing is restarted by hand.
    successor = _wait("a standby to take the lease",
                      lambda: (lambda now: now if now[0] != leader and now[1] > token else None)(_leader(s)), 120, s, 1)[0]
    _say(f"[containers] {successor} leads {time.monotonic() - killed:.0f}s after {leader} was killed")
    _wait(f"{ROUNDS_AFTER_RESTART} more committed rounds",
          lambda: len(_committed(s)) >= len(at_kill) + ROUNDS_AFTER_RESTART, 900, s)
    # The killed replica, started again, is a standby: alive, and the lease stays where it is.
    s.podman("start", s.name(leader))
    _wait("the restarted replica healthy (a standby)",
          lambda: s.podman("healthcheck", "run", s.name(leader), check=False).returncode == 0, 300, s, 2)
    assert _leader(s)[0] == successor

    after = _committed(s)
    # Nothing committed was lost or changed.
    assert after[: len(at_kill)] == at_kill
    assert [r[:2] for r in s.sql("select id, sha256 from model_versions order by id")][: len(versions_at_kill)] == \
        versions_at_kill
    # The chain of versions is unbroken: each committed round built on the
    # version the previous one committed; the first after the restart on the
    # last version committed before the kill, with the model step continuing.
    # A kill during unmasking may leave the version spent: the new leader
    # then moves past it with a skip version (D94: the same parameters at the
    # next step, `skip_of` the spent version), which the chain goes through.
    skips = {int(i): (int(of), int(st)) for i, of, st in s.sql(
        "select id, hyperparameters::json->>'skip_of', hyperparameters::json->>'step' from model_versions "
        "where hyperparameters::jsonb ? 'skip_of'")}
    for prev, cur in zip(after, after[1:]):
        base, step = cur["base"], prev["step"] + 1
        if base in skips:
            assert skips[base] == (prev["version"], prev["step"] + 1), (prev, cur, skips)
            base, step = prev["version"], step + 1
        assert base == prev["version"], (prev, cur)
        assert cur["step"] == step, (prev, cur)
    resumed = after[len(at_kill)]
    assert (skips[resumed["base"]][0] if resumed["base"] in skips else resumed["base"]) == latest
    assert resumed["number"] > at_kill[-1]["number"]
    # A round the kill interrupted is recorded as aborted, never committed.
    for (number,) in in_flight:
        assert s.sql(f"select state from rounds where number = {int(number)}") == [["aborted"]]
    # The same devices: none re-enrolled; the clients reconnected by themselves.
    assert s.sql("select id, identity_public_key from devices order by id") == devices_before
    now = s.containers()
    for service, cid in clients_before.items():
        assert now[service]["Id"] == cid and now[service]["State"] == "running", (service, now[service]["State"])
        restarts = s.podman("inspect", "--format", "{{.RestartCount}}", cid).stdout.strip()
        assert restarts == "0", (service, restarts)
    # The admin service rode the failover out (never restarted, checked
    # above): ready again and relaying top-k through the new leader.
    _wait("the admin service ready again", lambda: s.http("/readyz")[0] == 200, 120, s, 2)
    _wait("top-k after the restart",
          lambda: s.http("/v1/users/user-12/recommendations?k=3", s.tokens["recommender"])[0] == 200, 120, s, 2)
    _say(f"[containers] rounds committed: {[r['number'] for r in after]}; {successor} resumed from version {latest} "
          f"(round {resumed['number']}); "
          f"proof {time.monotonic() - t0:.0f}s")


REPLICAS = ("coordinator-1", "coordinator-2", "coordinator-3")


def _leader(s: Stack) -> tuple[str, int]:
    """(the replica service holding the leader lease, its token): the lease's
    holder is HOSTNAME-PID, and a container's hostname is its own."""
    rows = s.sql("select holder, token from leader_lease where holder is not null")
    assert rows, "no replica holds the leader lease"
    holder, token = rows[0][0], int(rows[0][1])
    hosts = {service: s.podman("inspect", "--format", "{{.Config.Hostname}}", s.name(service)).stdout.strip()
             for service in REPLICAS}
    found = [service for service, host in hosts.items() if holder.rsplit("-", 1)[0] == host]
    assert len(found) == 1, (holder, hosts)
    return found[0], token


def _check_admin_service(s: Stack, leader: str) -> None:
    """The admin service, asked from the host: ready, top-k over REST computed
    on a device, roles by route, history matching the store, and a database
    role that can read but not write. The coordinator's metrics listener too."""
    t = time.monotonic()
    ready = _wait("the admin service's /readyz", lambda: (lambda r: r if r[0] == 200 else None)(s.http("/readyz")),
                  180, s, 2)
    assert ready[1]["store"] is True and ready[1]["coordinator"] is True, ready
    assert s.http("/healthz") == (200, {"status": "ok"})

    # A user's top-k: user-3 is hosted by client-0 (users 1..10). The device
    # answers from its private model; the coordinator only relays.
    path = "/v1/users/user-3/recommendations?k=5"
    status, body = _wait("a top-k answer", lambda: (lambda r: r if r[0] == 200 else None)(
        s.http(path, s.tokens["recommender"])), 120, s, 2)
    assert body["computed_on"] == "device" and body["user"] == "user-3", body
    items = body["items"]
    assert [i["rank"] for i in items] == [1, 2, 3, 4, 5], items
    assert len({i["item_index"] for i in items}) == 5, items
    assert all("score" not in i for i in items) and body["seen_excluded"] is True, body  # ranks only (D84)
    assert all(0 <= i["item_index"] < 1682 for i in items), items
    # The device and the model version are the store's: the handle's device, a committed version.
    assert s.sql(f"select local_id from devices where id = {int(body['device_id'])}") == [["user-3"]]
    assert s.sql(f"select count(*) from model_versions where id = {int(body['model_version'])}") == [["1"]]
    _say(f"[containers] top-k over REST from the host {time.monotonic() - t:.0f}s after 3 commits: "
          f"{[i['item_id'] for i in items]} (model version {body['model_version']}, "
          f"device latency {body['latency_ms']:.0f} ms)")

    # Roles by route: no token 401, a recommender may not read history, a viewer may not ask for top-k.
    assert s.http(path)[0] == 401
    assert s.http("/v1/rounds", s.tokens["recommender"])[0] == 403
    assert s.http(path, s.tokens["viewer"])[0] == 403
    assert s.http(path, "not-a-token-of-this-deployment")[0] == 401
    # History from the store (read as fedmask_reader) matches what PostgreSQL holds; rounds may
    # commit meanwhile, so the listing lies between two reads of the database.
    def committed_in_db() -> set[int]:
        return {int(n) for (n,) in s.sql("select number from rounds where state = 'committed'")}
    before = committed_in_db()
    status, rounds = s.http("/v1/rounds?limit=500", s.tokens["viewer"])
    after = committed_in_db()
    assert status == 200 and rounds["next_cursor"] is None, rounds
    listed = {r["number"] for r in rounds["items"] if r["state"] == "committed"}
    assert before <= listed <= after and len(before) >= ROUNDS_BEFORE_KILL, (before, listed, after)
    assert s.http("/v1/federation", s.tokens["operator"])[0] == 200

    # The admin service's database role reads but cannot write, even when it asks for a read-write transaction.
    def as_reader(query: str) -> subprocess.CompletedProcess[str]:
        return s.podman("exec", "-e", f"PGPASSWORD={s.reader_password}", s.name("postgres"), "psql", "-h",
                        "127.0.0.1", "-U", "fedmask_reader", "-d", "fedmask", "-tA", "-c", query, check=False)
    assert as_reader("select count(*) from rounds").returncode == 0
    denied = as_reader("begin read write; delete from audit_log; commit")
    assert denied.returncode != 0 and "permission denied" in denied.stderr, denied.stderr
    assert "read-only transaction" in as_reader("delete from rounds").stderr

    # The coordinator's Prometheus endpoint (compose enables it on 9100 inside the network).
    metrics = s.podman("exec", s.name(leader), "python", "-c",
                       "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())")
    assert "fedmask_" in metrics.stdout, metrics.stdout[:500]
