"""The federation step of `make gpu-check`: a real secure federation over gRPC on loopback.

One `fedmask coordinator` process (SQLite in a temp folder, FedRAP, an admin
listener on loopback) and one `fedmask client` process hosting four devices
(users 1-4 of the `synthetic` dataset, so nothing is fetched) that train on
`--device cpu|cuda`. The script

1. waits for two committed secure rounds (Bonawitz SecAgg over the full
   graph, a cohort of the four devices);
2. checks each committed aggregate bit for bit: the coordinator records a
   checksum of the encoded sum (`--debug-record-sums`), the client records
   every device's encoded input (`--debug-record-inputs`), and the plaintext
   sum of the counted devices' inputs must give the same checksum (the check
   of tests/integration/integration_harness.py's `check_exact_aggregate`);
3. pauses the federation and asks the coordinator's admin listener for
   user 1's top-k, which the device computes on its own model: k items must
   come back, ranked 1..k, without the device's scores and with the seen
   items left out (docs/decisions.md D84);
4. stops both processes (SIGTERM; both must exit 0).

The processes are started as `sys.executable -m fedmask ...` (the launcher of
`fedmask bench` / `fedmask demo` and the integration tests,
`fedmask.bench.processes`), each in its own process group; only those groups
are signalled at the end, also on an error, a timeout or SIGTERM. Nothing
needs the installed `fedmask` entry point or a particular working directory:
the repository root (this file's parent's parent) is put on the children's
PYTHONPATH.

The coordinator's and the client's logs are written to OUT/coordinator.log
and OUT/client.log, the JSON result to OUT/result.json. The last line printed
is that JSON object:

    {"ok": bool, "device": str, "rounds_committed": int, "exact": bool,
     "topk_ok": bool, "topk_items": [int, ...], "seconds": float,
     "error": str | null, ...}

The exit code is 0 only when "ok" is true.

    python scripts/gpu_federation_check.py --device cuda --out /tmp/gpu-check/federation
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/...` with the project not installed
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from fedmask.bench.processes import (  # noqa: E402
    LOOPBACK,
    Child,
    ProcessFailed,
    ProcessGroup,
    flags,
    free_port,
    health_status,
    wait_until,
)

COORDINATOR_SERVICE = "fedmask.v1.CoordinatorService"
USERS = "1-4"  # four devices in one client process: a cohort of four, Shamir threshold a majority
COHORT = 4
N_USERS, N_ITEMS = 200, 300  # the `synthetic` dataset's shape (models.data.synthetic, as the tests use it)
SEED = 3
ROUNDS = 2
K = 10
TOPK_USER = "user-1"


@dataclass
class Result:
    """The JSON object printed as the script's last line."""

    ok: bool = False
    device: str = "cpu"
    rounds_committed: int = 0
    exact: bool = False
    topk_ok: bool = False
    topk_items: list[int] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    rounds_aborted: int = 0
    counted: dict[str, list[int]] = field(default_factory=dict)
    topk_device_id: int | None = None
    topk_model_version: int | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)


class Deadline:
    """The time left of the whole check (--timeout)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        rest = max(1.0, self.end - time.monotonic())
        return rest if cap is None else min(rest, cap)


class Stopped(BaseException):
    """SIGTERM / SIGHUP reached the script: clean up and report. A
    BaseException, so no library's `except Exception` swallows it."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(f"stopped by signal {signal.Signals(signum).name}")


# --------------------------------------------------------------------------- store (read like an operator)


def _rounds(database_url: str) -> list[Any]:
    """Every round record of the coordinator's store, by number ([] while the schema does not exist)."""
    from coordinator.store import open_store

    try:
        store = open_store(database_url, migrate=False)
    except Exception:  # the coordinator is still creating the database
        return []
    try:
        return sorted(store.list_rounds(limit=1000).items, key=lambda r: r.number)
    except Exception:
        return []
    finally:
        store.close()


def _committed(database_url: str) -> list[Any]:
    return [r for r in _rounds(database_url) if r.state.value == "committed"]


def _model_versions(database_url: str) -> set[int]:
    from coordinator.store import open_store

    store = open_store(database_url, migrate=False)
    try:
        return {int(v.id) for v in store.list_model_versions(limit=1000).items}
    finally:
        store.close()


def recorded_input(state_dir: Path, round_number: int, device_id: int) -> np.ndarray:
    """The encoded input (uint32) the client wrote with --debug-record-inputs."""
    path = state_dir / "debug" / "inputs" / f"round-{round_number:06d}" / f"device-{device_id}.npy"
    if not path.exists():
        raise AssertionError(f"no recorded input of device {device_id} in round {round_number} ({path})")
    return np.load(path, allow_pickle=False)


def check_exact_aggregate(record: Any, state_dir: Path) -> list[int]:
    """The committed round's encoded sum (the coordinator's debug checksum)
    equals the plaintext sum of exactly the counted devices' encoded inputs;
    returns the counted device ids (tests/integration/integration_harness.py's
    check, for one client's state folder)."""
    from coordinator.debug import encoded_checksum

    counted = [int(d) for d in record.survivors.get("masked_input", [])]
    if not counted:
        raise AssertionError(f"round {record.number}: no device counted")
    if record.metrics.get("debug.counted") != len(counted):
        raise AssertionError(f"round {record.number}: debug.counted {record.metrics.get('debug.counted')} "
                             f"!= {len(counted)} survivors of masked_input")
    if "debug.encoded_checksum" not in record.metrics:
        raise AssertionError(f"round {record.number}: no debug.encoded_checksum "
                             "(a coordinator without --debug-record-sums?)")
    vectors = [recorded_input(state_dir, record.number, d) for d in counted]
    if len({v.shape for v in vectors}) != 1 or vectors[0].dtype != np.uint32:
        raise AssertionError(f"round {record.number}: recorded inputs of shapes {[v.shape for v in vectors]}, "
                             f"dtype {vectors[0].dtype}")
    total = np.asarray(np.sum(np.stack(vectors), axis=0, dtype=np.uint64), dtype=np.uint32)
    got, want = encoded_checksum(total), record.metrics["debug.encoded_checksum"]
    if got != want:
        raise AssertionError(f"round {record.number}: the aggregate is not the sum of the counted devices' inputs "
                             f"(checksum {got!r} != {want!r})")
    return counted


# --------------------------------------------------------------------------- admin listener


def _admin_call(admin_port: int, token: str, method: str, request: Any, timeout: float) -> Any:
    import grpc

    from fedmask_proto.v1 import admin_service_pb2_grpc

    with grpc.insecure_channel(f"{LOOPBACK}:{admin_port}") as channel:
        stub = admin_service_pb2_grpc.CoordinatorAdminStub(channel)
        return getattr(stub, method)(request, metadata=(("authorization", f"Bearer {token}"),), timeout=timeout)


def check_top_k(answer: Any, k: int) -> list[str]:
    """What is wrong with a RecommendTopKResponse ([] when nothing)."""
    problems = []
    items = list(answer.items)
    if len(items) != k:
        problems.append(f"{len(items)} items, not {k}")
    if [i.rank for i in items] != list(range(1, len(items) + 1)):
        problems.append(f"ranks {[i.rank for i in items]}")
    if any(i.score != 0.0 for i in items):
        problems.append("a device score left the device")
    if not answer.seen_excluded:
        problems.append("the seen items were not left out")
    if len({i.item_index for i in items}) != len(items):
        problems.append("an item twice")
    if any(not 0 <= i.item_index < N_ITEMS for i in items):
        problems.append(f"item index outside 0..{N_ITEMS - 1}")
    return problems


# --------------------------------------------------------------------------- the run


def run_check(args: argparse.Namespace, out: Path, workdir: Path, result: Result) -> None:
    """Start the processes, drive the federation and fill `result` (raises on a failed step)."""
    from fedmask_proto.v1 import admin_service_pb2 as A

    deadline = Deadline(args.timeout)
    database_url = f"sqlite:///{workdir / 'coordinator.db'}"
    state_dir = workdir / "client"
    port, admin_port = free_port(), free_port()
    token = secrets.token_urlsafe(24)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        "PYTHONPATH": pythonpath,
        "FEDMASK_DATA_DIR": str(workdir / "data"),  # `synthetic` is generated: nothing is read or fetched
        "FEDMASK_ADMIN__TOKEN": token,  # the admin token comes from the environment only, never a flag
        "OMP_NUM_THREADS": str(args.threads),
    }
    for name in ("coordinator", "client"):
        (out / f"{name}.log").unlink(missing_ok=True)
    group = ProcessGroup(out, env=env)  # logs OUT/NAME.log; cwd OUT
    try:
        coordinator = group.start("coordinator", ["coordinator", "--listen", f"{LOOPBACK}:{port}",
                                                  "--database-url", database_url, *flags({
            "model": "fedrap",
            "model_params": {"n_users": N_USERS, "n_items": N_ITEMS, "k": 8, "local_epochs": 1},
            "cohort_size": COHORT, "cohort_minimum": COHORT, "over_selection": 0.0, "allow_consecutive": True,
            "seed": 1,
            # a short pause after each round, so the federation is paused (below) before a third one opens
            "round_pause": 2.0,
            "deadline_policy": "fixed", "selection_deadline": 60, "training_deadline": 120,
            "advertise_keys_deadline": 30, "share_keys_deadline": 30, "share_check_deadline": 30,
            "masked_input_deadline": 60, "unmasking_deadline": 30,
            "secagg_graph": "full", "secagg_threshold": "majority",
            "dp_mode": args.dp_mode, "dp_clip": 0.1, "dp_noise": 1.0,
            "debug_record_sums": True,
            "admin_listen": f"{LOOPBACK}:{admin_port}",
        })])
        result.logs["coordinator"] = str(coordinator.log_path)
        wait_until(lambda: health_status(port, service=COORDINATOR_SERVICE) == "SERVING", deadline.left(60),
                   what=f"the coordinator on port {port} serving", watch=[coordinator], step=0.2)

        client = group.start("client", ["client", "--coordinator", f"{LOOPBACK}:{port}", "--users", USERS,
                                        "--state-dir", str(state_dir), *flags({
            "dataset": "synthetic", "seed": SEED, "device": args.device, "threads": args.threads,
            "debug_record_inputs": True, "log_level": "info",
        })])
        result.logs["client"] = str(client.log_path)

        wait_until(lambda: len(_committed(database_url)) >= ROUNDS, deadline.left(),
                   what=f"{ROUNDS} committed rounds", watch=[coordinator, client], step=0.25)
        # no new round from here on; wait for any round that opened meanwhile to end
        _admin_call(admin_port, token, "Pause", A.OperatorRequest(operator="gpu-check", reason="top-k"),
                    deadline.left(10))
        wait_until(lambda: all(r.state.is_terminal for r in _rounds(database_url)), deadline.left(120),
                   what="the running round to end after the pause", watch=[coordinator, client], step=0.25)
        rounds = _rounds(database_url)
        committed = [r for r in rounds if r.state.value == "committed"]
        result.rounds_committed = len(committed)
        result.rounds_aborted = sum(r.state.value != "committed" for r in rounds)

        for record in committed[:ROUNDS]:
            result.counted[str(record.number)] = check_exact_aggregate(record, state_dir)
        result.exact = True

        answer = _admin_call(admin_port, token, "RecommendTopK",
                             A.RecommendTopKRequest(user_handle=TOPK_USER, k=K, exclude_seen=True), deadline.left(60))
        result.topk_device_id = int(answer.device_id)
        result.topk_items = [int(i.item_index) for i in answer.items]
        result.topk_model_version = int(answer.model_version)
        problems = check_top_k(answer, K)
        if answer.model_version not in _model_versions(database_url):
            problems.append(f"model version {answer.model_version} is no committed version")
        if problems:
            raise AssertionError(f"top-k of {TOPK_USER}: " + "; ".join(problems))
        result.topk_ok = True

        for child in (client, coordinator):  # the client first: the coordinator sees it leave
            result.exit_codes[child.name] = child.stop(timeout=deadline.left(30))
        bad = {name: code for name, code in result.exit_codes.items() if code != 0}
        if bad:
            raise AssertionError(f"exit codes after SIGTERM: {bad}")
    finally:
        for child in group.children:  # exit codes of those that ended; None: still running, stopped here
            result.exit_codes.setdefault(child.name, child.returncode)
        group.close()  # SIGTERM, then SIGKILL, to the process groups this script started only


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Prints one JSON object as its last line; exit code 0 only when it says ok.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="torch device the edge client trains on (fedmask client --device)")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for coordinator.log, client.log and result.json (created)")
    parser.add_argument("--timeout", type=float, default=150.0,
                        help="seconds the whole check may take before it fails")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the edge client")
    parser.add_argument("--dp-mode", choices=("none", "local", "distributed"), default="distributed",
                        help="differential privacy of the rounds (clip 0.1, noise multiplier 1)")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the temp folder (database, the client's state and recorded inputs)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = Result(device=args.device)
    workdir = Path(tempfile.mkdtemp(prefix="fedmask-federation-check-"))
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        run_check(args, out, workdir, result)
        result.ok = result.exact and result.topk_ok and result.rounds_committed >= ROUNDS
    except (Exception, KeyboardInterrupt, Stopped) as exc:
        message = str(exc) if isinstance(exc, ProcessFailed) else f"{type(exc).__name__}: {exc}"
        result.error = "\n".join(line.rstrip() for line in message.splitlines())
        (out / "traceback.txt").write_text(traceback.format_exc())
    finally:
        if args.keep_workdir:
            result.logs["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        result.seconds = round(time.monotonic() - started, 2)
    line = json.dumps(asdict(result))
    (out / "result.json").write_text(line + "\n")
    print(line, flush=True)
    for sig, handler in previous.items():  # only now: a late SIGTERM still gets the JSON line out first
        signal.signal(sig, handler)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
