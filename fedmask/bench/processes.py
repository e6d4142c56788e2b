"""Start a coordinator and edge-client processes on 127.0.0.1 and clean them up.

Used by `fedmask bench ...`, `fedmask demo` and the process-level tests
(tests/integration/integration_harness.py builds on it). Every process is
`sys.executable -m fedmask ...` in its own process group (so its children
die with it), with stdout+stderr in a log file of the run's folder.
`ProcessGroup.close()` stops them all (SIGTERM, then SIGKILL after a grace
period); use the group as a context manager so that happens on any exit,
Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def flags(options: Mapping[str, Any]) -> list[str]:
    """{"cohort_size": 5, "allow_consecutive": True} -> ["--cohort-size", "5", "--allow-consecutive"]
    (None / False omitted; dicts as JSON)."""
    out: list[str] = []
    for key, value in options.items():
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


def rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    """Resident set size (VmRSS) or its peak (VmHWM) of a process in MiB, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, this process's own threads, not its reaped
    children) in seconds, from /proc/<pid>/stat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # fields after the command name (which may hold spaces, in parentheses): utime, stime are the 12th, 13th
    rest = stat.rpartition(")")[2].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def read_log(path: Path) -> str:
    """The text of a log file ("" while it does not exist)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class ProcessFailed(RuntimeError):
    pass


@dataclass(eq=False)
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen
    peak_rss_mb: float = 0.0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log(self) -> str:
        return read_log(self.log_path)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> int:
        """SIGKILL the whole process group and reap it."""
        self.signal_group(signal.SIGKILL)
        return self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM the process group, then SIGKILL after `timeout` seconds."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def wait(self, timeout: float) -> int:
        """The exit code; ProcessFailed (with the log tail) if still running after `timeout`."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ProcessFailed(f"{self.name} still running after {timeout:.0f}s; log tail:\n{self.tail()}") from None

    def sample_rss(self) -> None:
        for key in ("VmHWM", "VmRSS"):
            got = rss_mb(self.pid, key)
            if got is not None:
                self.peak_rss_mb = max(self.peak_rss_mb, got)


@dataclass
class ProcessGroup:
    """The processes of one run; see the module doc."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    #: Run every child under cProfile, writing PROFILE_DIR/<name>.prof at its exit.
    profile_dir: Path | None = None
    _sampler: threading.Thread | None = None
    _stop_sampling: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, name: str, args: Sequence[str | Path | int | float], *, env: Mapping[str, str] | None = None) -> Child:
        prof = [] if self.profile_dir is None else ["-m", "cProfile", "-o", str(self.profile_dir / f"{name}.prof")]
        argv = [sys.executable, *prof, "-m", "fedmask", *map(str, args)]
        log_path = self.workdir / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **self.env, **(env or {})}
        full_env.pop("FEDMASK_CONFIG", None)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, start_new_session=True,
            )
        child = Child(name, argv, log_path, popen)
        self.children.append(child)
        return child

    def sample_rss_of(self, children: Iterable[Child], every: float = 0.1) -> None:
        """Track the peak RSS of `children` in a background thread until close()."""
        watched = list(children)

        def loop() -> None:
            while not self._stop_sampling.wait(every):
                for c in watched:
                    if c.alive():
                        c.sample_rss()

        self._sampler = threading.Thread(target=loop, name="fedmask-rss-sampler", daemon=True)
        self._sampler.start()

    def check_alive(self, *children: Child) -> None:
        for c in children or self.children:
            if not c.alive():
                raise ProcessFailed(f"{c.name} exited with code {c.popen.returncode}; log tail:\n{c.tail()}")

    def stop(self, child: Child, grace: float = 10.0) -> int:
        return child.stop(grace)

    def close(self, grace: float = 8.0) -> None:
        self._stop_sampling.set()
        for c in self.children:
            if c.alive():
                c.signal_group(signal.SIGTERM)
        end = time.monotonic() + grace
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(max(0.1, end - time.monotonic()))
            c.signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(10)


def wait_until(pred: Callable[[], Any], timeout: float, *, what: str, watch: Iterable[Child] = (),
               step: float = 0.1) -> Any:
    """Poll `pred` until truthy (returned); ProcessFailed early when a
    watched process died, or after `timeout` (with the watched log tails)."""
    end = time.monotonic() + timeout
    watch = list(watch)
    while True:
        got = pred()
        if got:
            return got
        for c in watch:
            if not c.alive():
                raise ProcessFailed(f"{c.name} exited with code {c.popen.returncode} while waiting for {what}; "
                                    f"log tail:\n{c.tail()}")
        if time.monotonic() > end:
            tails = "".join(f"\n--- {c.name}\n{c.tail(25)}" for c in watch)
            raise ProcessFailed(f"timed out after {timeout:.0f}s waiting for {what}{tails}")
        time.sleep(step)


def health_status(port: int, *, service: str = "", timeout: float = 2.0, credentials: Any = None) -> str | None:
    """The grpc.health.v1 status name ("SERVING", ...) of `service` ("" = the
    server) on 127.0.0.1:port, or None if unreachable. `credentials`: grpc
    channel credentials (TLS); plaintext without."""
    import grpc
    from grpc_health.v1 import health_pb2

    target = f"{LOOPBACK}:{port}"
    channel = grpc.secure_channel(target, credentials) if credentials is not None else grpc.insecure_channel(target)
    try:
        # grpc_health's stub class is typed without its methods; the same call, typed:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        resp = check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def health_serving(port: int, timeout: float = 2.0) -> bool:
    return health_status(port, timeout=timeout) == "SERVING"


def split_users(first: int, count: int, parts: int) -> list[str]:
    """`count` users from `first` in `parts` contiguous ranges ("A-B")."""
    parts = max(1, min(parts, count))
    out, start = [], first
    for i in range(parts):
        size = count // parts + (1 if i < count % parts else 0)
        out.append(f"{start}-{start + size - 1}" if size > 1 else str(start))
        start += size
    return out


def write_user_csv(path: Path, n_users: int, *, n_items: int = 60, per_user: int = 3, seed: int = 0) -> Path:
    """A tiny ratings file with `n_users` users (raw ids 1..n), for hosting
    many devices in synthetic-update benchmarks (their data is never used)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = ["user,item,rating,timestamp"]
    for u in range(1, n_users + 1):
        items = rng.choice(n_items, size=min(per_user, n_items), replace=False)
        for j, i in enumerate(items):
            lines.append(f"{u},{int(i) + 1},{int(rng.integers(1, 6))},{j}")
    path.write_text("\n".join(lines) + "\n")
    return path


__all__ = [
    "Child", "LOOPBACK", "ProcessFailed", "ProcessGroup", "cpu_seconds", "flags", "free_port", "health_serving", "health_status",
    "read_log", "rss_mb",
    "split_users", "wait_until", "write_user_csv",
]
