"""`fedmask simulate` as several ranks (D93): `--nproc N` on one machine, or
one rank of a torchrun job on several.

- `launch_local(spec, nproc)`: starts N local ranks (`python -m
  fedmask.commands.simulate_ranks SPEC`), each with torchrun's variables
  (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
  MASTER_PORT), and watches them: the first rank to fail stops all the
  others, and the launcher names it with its error (exit code: that rank's).
  Rank 0 prints the progress and the results; the others print nothing
  (their stderr goes to a log shown only when they fail).
- `run_rank(config, memory, ...)`: this process's part: join the ranks
  (`models.sim.ranks.join`), simulate its shard, and on an error write it,
  with the rank and the time, to $FEDMASK_RANK_ERRORS/rank-R.json (how the
  launcher finds which rank failed first) and print it prefixed with the
  rank. Under torchrun, torchrun's own agent stops the other workers and
  reports the first failure (`record` writes the error file it reads).

The spec is the run's settings as JSON (SimulationConfig, MemorySettings,
the output folder), so every rank builds exactly the same run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.sim.config import MemorySettings, SimulationConfig

ERRORS_ENV = "FEDMASK_RANK_ERRORS"
STOP_GRACE_S = 5.0


def spec_of(config: SimulationConfig, memory: MemorySettings, *, out: Path, quiet: bool,
            dp_delta: float) -> dict[str, Any]:  # fmt: skip
    """The run's settings as a JSON-ready dict (`settings_of` reads it back)."""
    return {"config": dataclasses.asdict(config), "memory": dataclasses.asdict(memory), "out": str(out),
            "quiet": quiet, "dp_delta": dp_delta}  # fmt: skip


def settings_of(spec: dict[str, Any]) -> tuple[SimulationConfig, MemorySettings]:
    from models.sim.config import MemorySettings, SimulationConfig

    c = dict(spec["config"])
    if c.get("users") is not None:
        c["users"] = tuple(c["users"])
    return SimulationConfig(**c), MemorySettings(**spec["memory"])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


RANK_COMMAND = (sys.executable, "-m", "fedmask.commands.simulate_ranks")


def launch_local(spec: dict[str, Any], nproc: int, *, poll_s: float = 0.1,
                 command: tuple[str, ...] = RANK_COMMAND) -> int:  # fmt: skip
    """Run the spec as `nproc` local ranks (each `command SPEC_PATH`); 0 when
    all succeed, else the exit code of the first rank that failed (named on
    stderr)."""
    with tempfile.TemporaryDirectory(prefix="fedmask-ranks-") as tmp:
        folder = Path(tmp)
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps(spec))
        port = free_port()
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        for r in range(nproc):
            env = os.environ | {"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                                "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                                "MASTER_PORT": str(port), ERRORS_ENV: str(folder)}  # fmt: skip
            log = open(folder / f"rank-{r}.log", "wb") if r else None  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(subprocess.Popen(
                [*command, str(spec_path)], env=env,
                stdout=subprocess.DEVNULL if r else None, stderr=log,
            ))  # fmt: skip
        try:
            return _watch(procs, folder, poll_s)
        finally:
            _stop(procs)
            for log in logs:
                if log is not None:
                    log.close()


def _watch(procs: list[subprocess.Popen[bytes]], folder: Path, poll_s: float) -> int:
    """Wait for every rank; at the first failure name the rank that failed first and return its code."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return 0
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            time.sleep(0.5)  # let a rank that failed at the same moment write its error
            r, message = first_failure(folder, failed)
            code = procs[r].poll() or 1
            log = folder / f"rank-{r}.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() and r else []
            print(f"error: rank {r} of {len(procs)} failed (exit code {code}): {message}", file=sys.stderr)
            for line in tail:
                print(f"  rank {r}: {line}", file=sys.stderr)
            print("stopped every other rank", file=sys.stderr)
            return code
        time.sleep(poll_s)


def first_failure(folder: Path, failed: list[int]) -> tuple[int, str]:
    """The rank whose error was written first (its time), else the lowest rank that exited non-zero."""
    errors = []
    for path in folder.glob("rank-*.json"):
        try:
            e = json.loads(path.read_text())
            errors.append((float(e["time"]), int(e["rank"]), str(e["error"])))
        except (ValueError, KeyError, OSError):
            continue
    if errors:
        _, rank, message = min(errors)
        return rank, message
    return failed[0], "it exited without writing its error"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate the ranks still running (SIGTERM, then SIGKILL after a grace period)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_rank(config: SimulationConfig, memory: MemorySettings, *, quiet: bool,
             env: Mapping[str, str] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """This process's rank of the run (its place from `env`, default the
    process environment); the results on rank 0, None elsewhere. An
    exception is recorded (see the module doc) and raised again."""
    from models.sim.events import SimulationEvents
    from models.sim.ranks import join, rank_of
    from models.sim.threads import machine_threads

    env = os.environ if env is None else env
    place = rank_of(env, cuda=config.device.startswith("cuda"))
    try:
        if config.device == "cuda":  # one rank per GPU
            config = dataclasses.replace(config, device=f"cuda:{place.local_rank}")
        if config.threads is None:  # the free cores shared by this machine's ranks
            config = dataclasses.replace(config, threads=max(1, machine_threads().count // place.local_world))
        ranks = join(env, cuda=config.device.startswith("cuda"))
        try:
            from fedmask.commands.sim_progress import SimulationProgress
            from models.sim.engine import simulate

            if ranks.rank == 0:
                with SimulationProgress(config.model, quiet=quiet) as events:
                    return simulate(config, memory=memory, events=events, ranks=ranks)
            simulate(config, memory=memory, events=SimulationEvents(), ranks=ranks)
            return None
        finally:
            ranks.close()
    except BaseException as e:
        record_error(place.rank, e)
        raise


def run_one_rank(config: SimulationConfig, memory: MemorySettings, *, quiet: bool) -> dict[str, Any] | None:
    """`--nproc 1`: the run as one rank, in this process (the reference N ranks are compared with)."""
    return run_rank(config, memory, quiet=quiet, env={"RANK": "0", "WORLD_SIZE": "1"})


def run_torchrun_rank(config: SimulationConfig, memory: MemorySettings, *, quiet: bool) -> dict[str, Any] | None:
    """`run_rank` under torchrun: the exception also goes to torchrun's error
    file, so its summary names the rank and the error."""
    from models.sim.ranks import recorded

    def rank() -> dict[str, Any] | None:
        return run_rank(config, memory, quiet=quiet)

    return recorded(rank)


def record_error(rank: int, e: BaseException) -> None:
    """Write and print this rank's error (KeyboardInterrupt and SystemExit(0) are not errors)."""
    if isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and not e.code):
        return
    message = f"{type(e).__name__}: {e}"
    folder = os.environ.get(ERRORS_ENV)
    if folder:
        path = Path(folder) / f"rank-{rank}.json"
        path.write_text(json.dumps({"rank": rank, "time": time.time(), "error": message}))
    print(f"rank {rank}: error: {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """A rank started by `launch_local`: run the spec at argv[0]."""
    from models.registry import ConfigError

    from fedmask.commands.sim_results import report_devices

    spec = json.loads(Path(argv[0]).read_text())
    config, memory = settings_of(spec)
    try:
        results = run_rank(config, memory, quiet=bool(spec["quiet"]))
    except ConfigError:
        return 2
    except Exception:  # recorded and printed by run_rank; the launcher names it
        return 1
    if results is not None:
        report_devices(results, Path(spec["out"]), float(spec["dp_delta"]))
    return 0


def exit_rank(code: int) -> None:
    """End a rank's process with `code` once its work is written: stdio
    flushed, then `os._exit`, skipping the interpreter's teardown, where
    torch's gloo threads can abort the process ("terminate called without
    an active exception", seen under load) after a rank that succeeded."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_rank(main(sys.argv[1:]))
