"""What the containers rely on, without containers: `fedmask health` (the
images' HEALTHCHECK and the Kubernetes exec probes), the coordinator's
plaintext health listener, and its wait for a database that is not up yet."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

import coordinator.server as server_mod
from coordinator.settings import CoordinatorSettings, SettingsError
from coordinator.store import InMemoryStore, StoreError
from fedmask.cli import app

runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(**overrides: object) -> CoordinatorSettings:
    base: dict[str, object] = {
        "listen_address": "127.0.0.1:0",
        "database_url": "memory://",
        "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": 8},
    }
    base.update(overrides)
    return CoordinatorSettings.load(overrides=base)


def test_health_listener_serves_the_coordinators_status_in_plaintext() -> None:
    health_port = _free_port()
    settings = _settings(health_listen_address=f"127.0.0.1:{health_port}")
    results: dict[str, object] = {}

    async def main() -> int:
        stop = asyncio.Event()

        def probe(coordinator: object, port: int) -> None:
            def run() -> None:
                results["health"] = runner.invoke(app, ["health", "--address", f"127.0.0.1:{health_port}"])
                # The health port serves nothing else: the coordinator's own service is unknown there.
                results["other"] = runner.invoke(
                    app, ["health", "--address", f"127.0.0.1:{health_port}", "--service", "nope"])
                stop_loop.call_soon_threadsafe(stop.set)

            threading.Thread(target=run, daemon=True).start()

        stop_loop = asyncio.get_running_loop()
        return await server_mod.serve(settings, store=InMemoryStore(), stop=stop, on_ready=probe, grace=0.1)

    assert asyncio.run(main()) == 0
    health = results["health"]
    assert health.exit_code == 0 and "healthy" in health.output, health.output  # type: ignore[attr-defined]
    other = results["other"]
    assert other.exit_code == 1 and "NOT_FOUND" in other.output, other.output  # type: ignore[attr-defined]
    # After the stop the listener is gone: the probe fails.
    gone = runner.invoke(app, ["health", "--address", f"127.0.0.1:{health_port}", "--timeout", "1"])
    assert gone.exit_code == 1 and "UNAVAILABLE" in gone.output


def test_health_probe_of_a_closed_port_fails_and_usage_errors_exit_2() -> None:
    closed = runner.invoke(app, ["health", "--address", f"127.0.0.1:{_free_port()}", "--timeout", "1"])
    assert closed.exit_code == 1 and "unhealthy" in closed.output
    assert runner.invoke(app, ["health"]).exit_code == 2
    assert runner.invoke(app, ["health", "--address", "x:1", "--client-state", "."]).exit_code == 2


def test_client_health_is_its_enrolment(tmp_path: Path) -> None:
    def probe() -> tuple[int, str]:
        r = runner.invoke(app, ["health", "--client-state", str(tmp_path)])
        return r.exit_code, r.output

    code, out = probe()
    assert code == 1 and "no device of this client has enrolled" in out
    (tmp_path / "enrollment.json").write_text(json.dumps({"coordinator:50051": {}}))
    code, out = probe()
    assert code == 1 and "lists no enrolled device" in out
    (tmp_path / "enrollment.json").write_text("{not json")
    assert probe()[0] == 1
    (tmp_path / "enrollment.json").write_text(json.dumps({"coordinator:50051": {"u1": 7}}))
    assert probe() == (0, "healthy\n")


def test_health_listen_address_is_validated() -> None:
    with pytest.raises(SettingsError, match="health_listen_address"):
        _settings(health_listen_address="no-port")
    with pytest.raises(SettingsError, match="database_wait_s"):
        _settings(database_wait_s=-1)


def _unreachable() -> StoreError:
    err = StoreError("cannot migrate postgresql+psycopg://db/x: connection refused")
    err.__cause__ = OperationalError("connect", {}, Exception("connection refused"))
    return err


def test_open_store_waiting_retries_an_unreachable_server_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    store = InMemoryStore()

    def fake_open(url: str, *, idle_in_transaction_s: float | None = None) -> InMemoryStore:
        calls.append(url)
        if len(calls) < 4:
            raise _unreachable()
        return store

    slept: list[float] = []
    now = [0.0]

    async def fake_sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(server_mod, "open_store", fake_open)
    got = asyncio.run(server_mod.open_store_waiting("postgresql+psycopg://db/x", 60, sleep=fake_sleep,
                                                   clock=lambda: now[0]))
    assert got is store and len(calls) == 4
    assert slept == [0.5, 1.0, 2.0]


def test_open_store_waiting_gives_up_and_never_retries_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    async def fake_sleep(s: float) -> None:
        now[0] += s

    def unreachable(url: str, *, idle_in_transaction_s: float | None = None) -> InMemoryStore:
        raise _unreachable()

    monkeypatch.setattr(server_mod, "open_store", unreachable)
    with pytest.raises(StoreError, match="connection refused"):
        asyncio.run(server_mod.open_store_waiting("postgresql+psycopg://db/x", 7, sleep=fake_sleep,
                                                  clock=lambda: now[0]))
    assert now[0] == pytest.approx(7.0)  # 0.5 + 1 + 2 + 3.5 (the rest), then it gives up

    calls: list[str] = []

    def bad(url: str, *, idle_in_transaction_s: float | None = None) -> InMemoryStore:
        calls.append(url)
        raise StoreError("bad URL")  # not an OperationalError: no retry

    monkeypatch.setattr(server_mod, "open_store", bad)
    with pytest.raises(StoreError, match="bad URL"):
        asyncio.run(server_mod.open_store_waiting("postgresql+psycopg://db/x", 60, sleep=fake_sleep))
    assert len(calls) == 1
    calls.clear()

    def unreachable_counted(url: str, *, idle_in_transaction_s: float | None = None) -> InMemoryStore:
        calls.append(url)
        raise _unreachable()

    monkeypatch.setattr(server_mod, "open_store", unreachable_counted)
    with pytest.raises(StoreError):
        asyncio.run(server_mod.open_store_waiting("sqlite:///x.db", 60, sleep=fake_sleep))
    assert len(calls) == 1  # SQLite is a file: never waited for


def test_admin_service_starts_without_its_dependencies_and_its_probe_reads_readyz() -> None:
    """`fedmask admin` (the admin image's command) must not exit when neither
    PostgreSQL nor the coordinator's admin listener is up yet (compose starts
    everything at once): it serves /healthz at once, /readyz says 503 naming
    both dependencies, and `fedmask health --http` (the image's HEALTHCHECK)
    follows /readyz."""
    import os
    import subprocess
    import sys
    import time

    port = _free_port()
    env = dict(os.environ,
               FEDMASK_ADMIN_LISTEN_ADDRESS=f"127.0.0.1:{port}",
               FEDMASK_ADMIN_DATABASE_URL=f"postgresql+psycopg://fedmask@127.0.0.1:{_free_port()}/fedmask",
               FEDMASK_ADMIN_COORDINATOR__ADDRESS=f"127.0.0.1:{_free_port()}",
               FEDMASK_ADMIN_COORDINATOR__CALL_TIMEOUT_S="2")
    proc = subprocess.Popen([sys.executable, "-m", "fedmask", "admin"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            alive = runner.invoke(app, ["health", "--http", f"http://127.0.0.1:{port}/healthz", "--timeout", "2"])
            if alive.exit_code == 0:
                break
            assert proc.poll() is None, f"fedmask admin exited {proc.returncode}:\n{proc.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, alive.output
            time.sleep(0.3)
        ready = runner.invoke(app, ["health", "--http", f"http://127.0.0.1:{port}/readyz", "--timeout", "15"])
        assert ready.exit_code == 1, ready.output
        assert "HTTP 503" in ready.output and '"store":false' in ready.output.replace(" ", "") \
            and '"coordinator":false' in ready.output.replace(" ", ""), ready.output
        assert proc.poll() is None, "fedmask admin exited while its dependencies were down"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    closed = runner.invoke(app, ["health", "--http", f"http://127.0.0.1:{port}/readyz", "--timeout", "1"])
    assert closed.exit_code == 1 and "unhealthy" in closed.output
    assert runner.invoke(app, ["health", "--http", "ftp://x/readyz"]).exit_code == 1
    assert runner.invoke(app, ["health", "--http", "http://x", "--client-state", "."]).exit_code == 2
