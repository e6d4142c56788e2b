"""Real processes on 127.0.0.1 for the integration tests.

Every coordinator and edge client is started as `sys.executable -m fedmask
...` in its own process group (start_new_session), with stdout+stderr in a
log file under the test's temp dir. `Processes.close()` (the `procs`
fixture's teardown, which also runs when a test fails or times out) sends
SIGTERM to every group still alive, waits a little, then SIGKILLs it.

Helpers read the coordinator's store directly (SQLite file or PostgreSQL
URL), like an operator would, and recompute each committed round's
aggregate from the encoded inputs the clients wrote with
`--debug-record-inputs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class ProcessDied(AssertionError):
    pass


@dataclass(eq=False)
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> int:
        """SIGKILL the whole process group and reap it."""
        self.signal_group(signal.SIGKILL)
        return self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)
        return self.popen.wait(10)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:.0f}s; log tail:\n{self.tail()}") from None


@dataclass
class Processes:
    """Starts fedmask processes; `close()` cleans every one of them up."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, args: Sequence[str], *, env: Mapping[str, str] | None = None) -> Proc:
        argv = [sys.executable, "-m", "fedmask", *map(str, args)]
        log_path = self.workdir / f"{name}.log"
        # several starts of one name (restarts) append to one log
        log = open(log_path, "ab")  # noqa: SIM115 - closed by the OS when the child exits; we keep no handle
        try:
            full_env = {
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "COLUMNS": "200",  # rich log lines stay on one line
                "FEDMASK_DATA_DIR": str(REPO / "data"),
                "OMP_NUM_THREADS": "1",
                **self.env,
                **(env or {}),
            }
            full_env.pop("FEDMASK_CONFIG", None)
            popen = subprocess.Popen(
                argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, start_new_session=True,
            )
        finally:
            log.close()
        p = Proc(name, argv, log_path, popen)
        self.procs.append(p)
        return p

    def check_alive(self, *procs: Proc) -> None:
        for p in procs or self.procs:
            if not p.alive():
                raise ProcessDied(f"{p.name} exited with {p.returncode}; log tail:\n{p.tail()}")

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 8
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            p.signal_group(signal.SIGKILL)  # also strays left in the group
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(10)


def wait_until(pred: Callable[[], Any], timeout: float, *, what: str, watch: Iterable[Proc] = (),
               step: float = 0.1) -> Any:
    """Poll `pred` until truthy (returned); fail early when a watched process died."""
    end = time.monotonic() + timeout
    watch = list(watch)
    while True:
        got = pred()
        if got:
            return got
        for p in watch:
            if not p.alive():
                raise ProcessDied(f"{p.name} exited with {p.returncode} while waiting for {what}; log tail:\n{p.tail()}")
        if time.monotonic() > end:
            tails = "\n".join(f"--- {p.name}\n{p.tail(25)}" for p in watch)
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
        time.sleep(step)


# --------------------------------------------------------------------------- coordinator / clients


def coordinator_args(port: int, database_url: str, **flags: Any) -> list[str]:
    """`fedmask coordinator` argv; flags as python names (None / False omitted,
    True -> bare flag)."""
    args = ["coordinator", "--listen", f"{LOOPBACK}:{port}", "--database-url", database_url]
    return args + _flags(flags)


def client_args(port: int, users: str, state_dir: Path, **flags: Any) -> list[str]:
    args = ["client", "--coordinator", f"{LOOPBACK}:{port}", "--users", users, "--state-dir", str(state_dir)]
    return args + _flags(flags)


def _flags(flags: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(name)
        elif isinstance(value, dict):
            out += [name, json.dumps(value)]
        else:
            out += [name, str(value)]
    return out


def health_status(port: int, *, timeout: float = 2.0, credentials: Any = None) -> str | None:
    """The grpc.health.v1 status name of the coordinator, or None if unreachable."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"{LOOPBACK}:{port}"
    channel = grpc.secure_channel(target, credentials) if credentials is not None else grpc.insecure_channel(target)
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="fedmask.v1.CoordinatorService"), timeout=timeout
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def wait_serving(port: int, proc: Proc, timeout: float = 60.0, credentials: Any = None) -> None:
    wait_until(lambda: health_status(port, credentials=credentials) == "SERVING", timeout,
               what=f"coordinator on port {port} serving", watch=[proc], step=0.2)


_EVENT = re.compile(r"event=(\w+)(.*)$")


def events(log_text: str, name: str | None = None) -> list[dict[str, str]]:
    """The coordinator's structured log lines (`event=NAME k=v ...`) as dicts."""
    import shlex

    out = []
    for line in log_text.splitlines():
        m = _EVENT.search(line)
        if not m or (name is not None and m.group(1) != name):
            continue
        fields = {"event": m.group(1)}
        try:
            parts = shlex.split(m.group(2))
        except ValueError:
            parts = m.group(2).split()
        for part in parts:
            k, sep, v = part.partition("=")
            if sep:
                fields[k] = v
        out.append(fields)
    return out


# --------------------------------------------------------------------------- store and aggregates


def open_store_readonly(url: str):
    from coordinator.store import open_store

    return open_store(url, migrate=False)


def round_record(url: str, number: int):
    store = open_store_readonly(url)
    try:
        return store.get_round(number)
    finally:
        store.close()


def terminal_rounds(url: str) -> list:
    store = open_store_readonly(url)
    try:
        return sorted((r for r in store.list_rounds(limit=1000).items if r.state.is_terminal), key=lambda r: r.number)
    except Exception:  # the schema may not exist yet (coordinator still starting)
        return []
    finally:
        store.close()


def all_rounds(url: str) -> list:
    store = open_store_readonly(url)
    try:
        return sorted(store.list_rounds(limit=1000).items, key=lambda r: r.number)
    except Exception:
        return []
    finally:
        store.close()


def recorded_input(state_dirs: Iterable[Path], round_number: int, device_id: int) -> np.ndarray:
    """The encoded input (uint32) a client wrote with --debug-record-inputs."""
    for d in state_dirs:
        path = d / "debug" / "inputs" / f"round-{round_number:06d}" / f"device-{device_id}.npy"
        if path.exists():
            return np.load(path, allow_pickle=False)
    raise AssertionError(f"no recorded input of device {device_id} in round {round_number} under {list(state_dirs)}")


def check_exact_aggregate(record, state_dirs: Sequence[Path], extra: Mapping[int, np.ndarray] | None = None) -> list[int]:
    """The committed round's encoded sum (coordinator debug checksum) equals
    the plaintext sum of exactly the counted devices' encoded inputs.
    Returns the counted device ids."""
    from coordinator.debug import encoded_checksum

    counted = list(record.survivors["masked_input"])
    assert record.metrics["debug.counted"] == len(counted), record.metrics
    vectors = [(extra or {}).get(d) if (extra and d in extra) else recorded_input(state_dirs, record.number, d)
               for d in counted]
    total = np.sum(np.stack(vectors), axis=0, dtype=np.uint64).astype(np.uint32)
    assert encoded_checksum(total) == record.metrics["debug.encoded_checksum"], (
        f"round {record.number}: the aggregate is not the sum of the counted devices' inputs"
    )
    return counted


def synthetic_sum(device_ids: Sequence[int], *, round_number: int, vector_length: int, seed: int, scale: float) -> np.ndarray:
    from edge_client.trainer import synthetic_updates

    return synthetic_updates(device_ids, round_number=round_number, vector_length=vector_length, seed=seed,
                             scale=scale).sum(axis=0)
