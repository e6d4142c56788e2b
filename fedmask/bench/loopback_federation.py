"""What the benchmarks share about their federation on 127.0.0.1.

A bench (fedmask/bench/federation.py, hybrid.py, hostile.py, admin_load.py)
starts a coordinator and edge-client processes in a `ProcessGroup`
(fedmask/bench/processes.py), waits for its rounds, then reads the rounds
from the coordinator's SQLite store and checks each committed aggregate bit
for bit against the inputs the clients recorded. This module holds those
steps; each bench keeps its own flags and figures.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedmask.bench.processes import (
    LOOPBACK,
    Child,
    ProcessFailed,
    ProcessGroup,
    flags,
    health_status,
    split_users,
    wait_until,
)

# ------------------------------------------------------------------ coordinator flags


def is_neighbors(value: str) -> bool:
    """A bench's --neighbors: 'all' (complete graph), 'auto' (SecAgg+ sized by secagg) or an even K."""
    return value in ("all", "auto") or (value.isdigit() and int(value) % 2 == 0)


@dataclass(frozen=True)
class FleetShape:
    """The federation a bench builds: `devices` synthetic-update devices
    hosted by `client_processes` edge-client processes, an update of length
    `dim` (the synthetic model) and the SecAgg graph `neighbors` ('all',
    'auto' or an even K). The round, admin and scale benches' configurations
    hold one (composition); ValueError on a shape no bench can run."""

    devices: int = 100
    client_processes: int = 2
    dim: int = 53_824
    neighbors: str = "auto"

    def __post_init__(self) -> None:
        if self.devices < 3 or self.client_processes < 1 or self.dim < 1:
            raise ValueError("need at least 3 devices, 1 client process and a positive dim")
        if not is_neighbors(self.neighbors):
            raise ValueError(f"--neighbors must be 'all', 'auto' or an even number, got {self.neighbors!r}")

    def user_ranges(self) -> list[str]:
        """Each client process's users ("A-B"): devices 1..N in contiguous ranges."""
        return split_users(1, self.devices, self.client_processes)

    def state_dirs(self, work: Path) -> list[Path]:
        """Each client process's state folder under `work` (client-0, client-1, ...)."""
        return [work / f"client-{i}" for i in range(self.client_processes)]

    def figures(self) -> dict[str, Any]:
        """The shape as a bench's JSON reports it."""
        return {"devices": self.devices, "client_processes": self.client_processes, "dim": self.dim,
                "neighbors": self.neighbors}


def secagg_graph(neighbors: str) -> str:
    """The coordinator's --secagg-graph for a bench's --neighbors: 'all' is its 'full'; the rest are the same."""
    return "full" if neighbors == "all" else neighbors


def full_cohort(devices: int, seed: int, rounds: int | None = None) -> dict[str, Any]:
    """Coordinator flags: every one of `devices` devices in every round, rounds back to back (a device may
    contribute to consecutive rounds), `rounds` of them (None: until stopped)."""
    return {"cohort_size": devices, "cohort_minimum": devices, "over_selection": 0.0, "allow_consecutive": True,
            "rounds": rounds, "seed": seed}


@dataclass(frozen=True)
class StageDeadlines:
    """Stage deadlines (s) of a bench's coordinator: under the adaptive policy (D21) the ceilings (and the
    first round's deadlines) and the floor of what it learns. A silent (dropped) device costs its stage's
    deadline. The defaults suit synthetic updates on 127.0.0.1."""

    training: float = 1.0
    advertise_keys: float = 5.0
    share_keys: float = 5.0
    share_check: float = 5.0
    masked_input: float = 5.0
    unmasking: float = 5.0
    floor: float = 0.25

    def flags(self) -> dict[str, float]:
        return {
            "training_deadline": self.training,
            "advertise_keys_deadline": self.advertise_keys,
            "share_keys_deadline": self.share_keys,
            "share_check_deadline": self.share_check,
            "masked_input_deadline": self.masked_input,
            "unmasking_deadline": self.unmasking,
            "deadline_floor": self.floor,
        }


# ------------------------------------------------------------------ processes


def start_coordinator(group: ProcessGroup, port: int, options: Mapping[str, Any], *, env: Mapping[str, str] | None = None,
                      credentials: Any = None, timeout: float = 60.0, name: str = "coordinator") -> Child:
    """`fedmask coordinator` NAME with `options` (which make it listen on 127.0.0.1:port), once it serves
    (grpc.health.v1 SERVING; `credentials`: TLS channel credentials to ask it with)."""
    coord = group.start(name, ["coordinator", *flags(options)], env=env)
    wait_until(lambda: health_status(port, credentials=credentials) == "SERVING", timeout,
               what="the coordinator to serve", watch=[coord], step=0.2)
    return coord


def start_client(group: ProcessGroup, name: str, port: int | Sequence[int], users: str, state_dir: Path,
                 options: Mapping[str, Any]) -> Child:
    """`fedmask client` NAME hosting `users`, with its state in `state_dir`, to the coordinator on
    127.0.0.1:port; with several ports, to the replicas on them (the client's address list, tried in
    turn on each reconnect, D90)."""
    ports = [port] if isinstance(port, int) else list(port)
    target = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    return group.start(name, ["client", "-c", target, "-u", users, "-s", state_dir, *flags(options)])


def run_to_exit(coord: Child, clients: Sequence[Child], timeout: float, *, what: str, step: float = 0.1,
                poll: Callable[[], None] | None = None) -> None:
    """Wait for the coordinator to finish its rounds and exit with code 0, calling `poll` at every step.
    ProcessFailed when a client exits first, when `timeout` passes, or when the coordinator's code is not 0."""

    def done() -> bool:
        for c in clients:
            if not c.alive():
                raise ProcessFailed(f"{c.name} exited with code {c.popen.returncode}; log tail:\n{c.tail()}")
        if poll is not None:
            poll()
        return not coord.alive()

    wait_until(done, timeout, what=what, step=step)
    if coord.popen.returncode != 0:
        raise ProcessFailed(f"the coordinator exited with {coord.popen.returncode}:\n{coord.tail()}")


@contextlib.contextmanager
def bench_folder(prefix: str, keep: Path | None, ignore: Sequence[str] = ()) -> Iterator[Path]:
    """A fresh temporary folder for a bench's run, removed at the end; with `keep`, first copied to
    KEEP/<its name> without the files matching `ignore`."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(root, keep / root.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*ignore))
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------ the rounds


def read_rounds(db: Path | str) -> list[Any]:
    """Every round record of the coordinator's store, by number: `db` is its SQLite file or a database URL."""
    from coordinator.store import open_store

    store = open_store(db if isinstance(db, str) else f"sqlite:///{db}", migrate=False)
    try:
        return sorted(store.list_rounds(limit=1000).items, key=lambda r: r.number)
    finally:
        store.close()


def round_seconds(record: Any) -> float:
    """From the coordinator opening the round to its end (NaN while it has not ended)."""
    return (record.ended_at - record.started_at).total_seconds() if record.ended_at else math.nan


def committed_times(records: Sequence[Any]) -> dict[str, Any]:
    """round_s (each committed round's seconds), round_s_median and stage_s_median (stage -> median seconds)."""
    committed = [r for r in records if r.state.value == "committed"]
    round_s = [round_seconds(r) for r in committed]
    stage_s: dict[str, list[float]] = {}
    for r in committed:
        for k, v in r.timings.items():
            stage_s.setdefault(k, []).append(v)
    return {
        "round_s": [round(x, 3) for x in round_s],
        "round_s_median": round(statistics.median(round_s), 3) if round_s else None,
        "stage_s_median": {k: round(statistics.median(v), 3) for k, v in stage_s.items()},
    }


def recorded_input(state_dirs: list[Path], round_number: int, device_id: int) -> np.ndarray | None:
    for d in state_dirs:
        p = d / "debug" / "inputs" / f"round-{round_number:06d}" / f"device-{device_id}.npy"
        if p.exists():
            return np.load(p, allow_pickle=False)
    return None


def exact_aggregate(record: Any, state_dirs: list[Path]) -> bool:
    """The round's recorded checksum equals that of the sum of exactly its
    counted devices' encoded inputs, as the clients recorded them
    (`--debug-record-sums` / `--debug-record-inputs`): the secure survivors'
    and, in a FedMMF hybrid round (D64), the plaintext devices' too. With
    removable noise (D110) the sum compared is the unmasked one, before the
    coordinator removed the surplus (tests check that removal)."""
    from coordinator.debug import encoded_checksum

    counted = list(record.survivors.get("masked_input", [])) + list(record.survivors.get("plaintext", []))
    vectors = [v for d in counted if (v := recorded_input(state_dirs, record.number, d)) is not None]
    if not counted or len(vectors) != len(counted):
        return False
    total = np.asarray(np.sum(np.stack(vectors), axis=0, dtype=np.uint64), dtype=np.uint32)
    # with removable noise (D110) the inputs add to the unmasked sum, before the surplus is removed
    recorded = record.metrics.get("debug.unmasked_checksum", record.metrics.get("debug.encoded_checksum"))
    return record.metrics.get("debug.counted") == len(counted) and encoded_checksum(total) == recorded


__all__ = [
    "FleetShape", "StageDeadlines", "bench_folder", "committed_times", "exact_aggregate", "full_cohort", "is_neighbors",
    "read_rounds", "recorded_input", "round_seconds", "run_to_exit", "secagg_graph", "start_client", "start_coordinator",
]
