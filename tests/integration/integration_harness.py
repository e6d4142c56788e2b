"""Real processes on 127.0.0.1 for the integration tests.

Every coordinator and edge client is started as `sys.executable -m fedmask
...` in its own process group (start_new_session), with stdout+stderr in a
log file under the test's temp dir, by `fedmask.bench.processes` (the
launcher `fedmask bench` and `fedmask demo` use; `Proc` is its `Child`).
`Processes.close()` (the `procs` fixture's teardown, which also runs when a
test fails or times out) sends SIGTERM to every group still alive, waits a
little, then SIGKILLs it.

Every process a `Processes` starts carries `PROCESS_TAG=<a tag of that
Processes>` in its environment, and so does everything it starts in turn
(coordinators and clients of `fedmask bench` / `fedmask demo`, in process
groups of their own; orphans re-parented to init keep it too).
`Processes.leftovers()` lists the live ones from /proc: a test checks that
the processes it started cleaned up after themselves, and is blind to any
other fedmask process on the machine.

`InProcessCoordinator` runs the coordinator's server module on a thread of
the test process instead, for tests that call the Coordinator's in-process
API (the relay of device requests).

Helpers read the coordinator's store directly (SQLite file or PostgreSQL
URL), like an operator would, and recompute each committed round's
aggregate from the encoded inputs the clients wrote with
`--debug-record-inputs`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# one implementation of the process plumbing: fedmask.bench.processes (also
# re-exported from here for the tests: LOOPBACK, free_port, wait_until, Proc,
# ProcessDied)
from fedmask.bench.processes import Child as Proc
from fedmask.bench.processes import LOOPBACK, ProcessGroup, flags, free_port, read_log, wait_until
from fedmask.bench.processes import ProcessFailed as ProcessDied
from fedmask.bench.processes import health_status as server_health_status

REPO = Path(__file__).resolve().parents[2]
COORDINATOR_SERVICE = "fedmask.v1.CoordinatorService"


#: The environment variable that marks the processes of one `Processes` (see the module doc).
PROCESS_TAG = "INTEGRATION_TESTS_PROCESS_TAG"  # outside the FEDMASK_ settings prefix


class Processes(ProcessGroup):
    """Starts fedmask processes (fedmask.bench.processes.ProcessGroup with
    the tests' environment: the repository's data folder, one OpenMP
    thread, this launcher's PROCESS_TAG); `close()` cleans every one of them
    up; `leftovers()` lists those still alive, descendants included."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.tag = uuid.uuid4().hex
        super().__init__(workdir, env={"FEDMASK_DATA_DIR": str(REPO / "data"), "OMP_NUM_THREADS": "1",
                                       **(env or {}), PROCESS_TAG: self.tag})

    @property
    def procs(self) -> list[Proc]:
        return self.children

    def leftovers(self, grace: float = 5.0) -> dict[int, str]:
        """The processes started through this launcher, or by one of them,
        still alive after up to `grace` seconds (pid -> command line); {} once
        all are gone. A process that is being killed gets the grace period to
        finish dying; one that was left running stays listed."""
        end = time.monotonic() + grace
        while True:
            alive = tagged_processes(self.tag)
            if not alive or time.monotonic() > end:
                return alive
            time.sleep(0.1)


def tagged_processes(tag: str) -> dict[int, str]:
    """The live processes whose environment holds PROCESS_TAG=tag (pid ->
    command line), read from /proc. Zombies (dead, not yet reaped) and
    processes of other users (their environment is unreadable; never ours)
    are not listed. The environment read is the one the process started
    with, so a process cannot drop the tag by changing its own."""
    if not os.path.exists("/proc/self/environ"):
        raise AssertionError("no /proc: the processes a test started cannot be listed")
    marker = f"{PROCESS_TAG}={tag}".encode()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]  # the field after "(comm)"
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or another user's
            continue
        if state != b"Z":
            found[int(entry.name)] = cmdline
    return found


# --------------------------------------------------------------------------- coordinator / clients


def coordinator_args(port: int, database_url: str, **options: Any) -> list[str]:
    """`fedmask coordinator` argv; options as python names (None / False
    omitted, True -> bare flag)."""
    args = ["coordinator", "--listen", f"{LOOPBACK}:{port}", "--database-url", database_url]
    return args + flags(options)


def client_args(port: int, users: str, state_dir: Path, **options: Any) -> list[str]:
    """`fedmask client` argv. The harness's clients run without a DP floor
    (--no-dp-floor: most scenarios train without DP, D85); dp_floor=True keeps
    the client's default floor."""
    args = ["client", "--coordinator", f"{LOOPBACK}:{port}", "--users", users, "--state-dir", str(state_dir)]
    dp_floor = bool(options.pop("dp_floor", False))
    return args + ([] if dp_floor else ["--no-dp-floor"]) + flags(options)


def health_status(port: int, *, timeout: float = 2.0, credentials: Any = None) -> str | None:
    """The grpc.health.v1 status name of the coordinator service, or None if unreachable."""
    return server_health_status(port, service=COORDINATOR_SERVICE, timeout=timeout, credentials=credentials)


def wait_serving(port: int, proc: Proc, timeout: float = 60.0, credentials: Any = None) -> None:
    wait_until(lambda: health_status(port, credentials=credentials) == "SERVING", timeout,
               what=f"coordinator on port {port} serving", watch=[proc], step=0.2)


class InProcessCoordinator:
    """`coordinator.server.serve` on its own event loop in a thread of the
    test process, so a test can call the Coordinator's in-process API
    (`relay.request_top_k`, what the admin service uses) while the edge clients
    are real processes. Its log lines go to WORKDIR/coordinator.log (read
    them with `events(c.log())`).

        with InProcessCoordinator(settings, tmp_path) as c:
            answer = c.call(lambda coord: coord.relay.request_top_k(device, 10))
    """

    def __init__(self, settings: Any, workdir: Path, *, ready_timeout: float = 60.0) -> None:
        self.settings = settings
        self.log_path = workdir / "coordinator.log"
        self.ready_timeout = ready_timeout
        self.coordinator: Any = None
        self.port: int | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="in-process-coordinator", daemon=True)
        self._handler: logging.Handler | None = None

    def __enter__(self) -> InProcessCoordinator:
        self._handler = logging.FileHandler(self.log_path)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        log = logging.getLogger("fedmask.coordinator")
        log.addHandler(self._handler)
        log.setLevel(logging.INFO)
        self._thread.start()
        if not self._ready.wait(self.ready_timeout) or self.port is None:
            self.close()
            raise AssertionError(f"the in-process coordinator did not start: {self.error!r}\n{self.log()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _main(self) -> None:
        from coordinator.server import serve

        async def main() -> int:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def on_ready(coordinator: Any, port: int) -> None:
                self.coordinator, self.port = coordinator, port
                self._ready.set()

            return await serve(self.settings, stop=self._stop, on_ready=on_ready, grace=1.0)

        try:
            self.exit_code = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by __enter__ / call
            self.error = exc
        finally:
            self._ready.set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, make: Callable[[Any], Awaitable[Any]], timeout: float = 60.0) -> Any:
        """Run `make(coordinator)` on the coordinator's loop; its result or exception."""
        if self._loop is None or not self.alive():
            raise AssertionError(f"the in-process coordinator is not running: {self.error!r}")

        async def run() -> Any:
            return await make(self.coordinator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def log(self) -> str:
        return read_log(self.log_path)

    def close(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self.alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._handler is not None:
            logging.getLogger("fedmask.coordinator").removeHandler(self._handler)
            self._handler.close()
            self._handler = None


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
    vectors = [extra[d] if (extra is not None and d in extra) else recorded_input(state_dirs, record.number, d)
               for d in counted]
    total = np.asarray(np.sum(np.stack(vectors), axis=0, dtype=np.uint64), dtype=np.uint32)
    assert encoded_checksum(total) == record.metrics["debug.encoded_checksum"], (
        f"round {record.number}: the aggregate is not the sum of the counted devices' inputs"
    )
    return counted


def check_version_history(url: str, state_dirs: Sequence[Path], *, skips: bool = True) -> list:
    """Across failovers: the versions step 0, 1, 2, ... once each (no gap,
    no duplicate); each committed round made exactly one version, on top of
    the last one (following a skip past a version a dead leader spent,
    D94; with skips=False there must be none); every committed aggregate
    exact. Returns the committed rounds."""
    store = open_store_readonly(url)
    try:
        versions = sorted(store.list_model_versions(limit=1000).items, key=lambda v: v.id)
    finally:
        store.close()
    steps = [v.hyperparameters["step"] for v in versions]
    assert steps == list(range(len(versions))), f"a gap or a duplicate in the version history: {steps}"
    skip_of = {v.id: v.hyperparameters.get("skip_of") for v in versions}
    assert skips or not any(skip_of.values()), f"a skipped version: {skip_of}"
    committed = [r for r in all_rounds(url) if r.state.value == "committed"]
    previous = versions[0].id
    for r in committed:
        base = r.base_model_version
        while skip_of.get(base) is not None:
            base = skip_of[base]
        assert base == previous, f"round {r.number} did not start from the last version"
        made = [v.id for v in versions if v.round_number == r.number]
        assert len(made) == 1, f"round {r.number} made {len(made)} versions"
        previous = made[0]
        check_exact_aggregate(r, state_dirs)
    assert skips or len(versions) == len(committed) + 1, "a version no committed round made"
    return committed


def synthetic_sum(device_ids: Sequence[int], *, round_number: int, vector_length: int, seed: int, scale: float) -> np.ndarray:
    from edge_client.trainer import synthetic_updates

    return synthetic_updates(device_ids, round_number=round_number, vector_length=vector_length, seed=seed,
                             scale=scale).sum(axis=0)


__all__ = [
    "LOOPBACK", "REPO", "InProcessCoordinator", "Proc", "ProcessDied", "Processes", "all_rounds",
    "check_exact_aggregate", "check_version_history", "client_args", "coordinator_args", "events", "free_port",
    "health_status", "open_store_readonly", "recorded_input", "round_record", "synthetic_sum", "terminal_rounds", "wait_serving",
    "wait_until",
]
