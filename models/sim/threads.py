"""How many torch threads a simulation uses when `--threads` is not given.

torch's CPU build runs its intra-op parallel regions on an OpenMP thread pool
whose threads spin while they wait for each other. When another process holds
one of the cores, the round waits for the descheduled thread while the others
burn their share spinning: on the 2-core machine under load, 2 threads were
many times slower than 1 (docs/performance.md, "Threads on a shared machine").
So the default is the number of cores that are actually free:

- `choose_threads(state)` (pure): the cores this process may use
  (`CpuState.usable`: its CPU affinity, capped by a cgroup CPU quota and by
  OMP_NUM_THREADS when set) minus the 1-minute load average, a core counting
  as free when at most `BUSY_SLACK` of it was busy; at least 1, at most
  `usable`. Without a load average (a platform without one) it is 1, the
  count that is never the slow case.
- `explicit_threads(n)`: `--threads N`, an override used as given.
- `read_cpu_state()`: the machine's figures (the only I/O here).
- `machine_threads()`: `choose_threads(read_cpu_state())`, read once per
  process. Every later simulation of the process uses the same count: its own
  earlier simulations would otherwise count as load against it, and two runs
  compared in one process keep the same float rounding.

The choice is a speed setting only: results do not depend on the thread count
beyond float rounding. It is printed before training and recorded in
results.json (`threads`: count, reason and the figures it came from).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: A core counts as free when its share of the 1-minute load is at most this much.
BUSY_SLACK = 0.5


@dataclass(frozen=True)
class CpuState:
    """What the machine can give this process.

    usable: the cores this process may run on (>= 1): its CPU affinity, capped by a cgroup CPU quota
    and by OMP_NUM_THREADS when it is set. load_1min: the 1-minute load average (runnable and
    uninterruptible tasks, the whole machine), or None where the platform has none."""

    usable: int
    load_1min: float | None
    limits: tuple[str, ...] = field(default=())  # what capped `usable`, e.g. "OMP_NUM_THREADS=1"


@dataclass(frozen=True)
class ThreadChoice:
    """The torch thread count of a run, how it was chosen and why (results.json's `threads`)."""

    count: int
    chosen_by: Literal["flag", "machine"]
    reason: str
    state: CpuState | None = None  # the figures a machine choice came from

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count, "chosen_by": self.chosen_by, "reason": self.reason}
        if self.state is not None:
            out |= {"usable_cpus": self.state.usable, "load_1min": self.state.load_1min}
        return out


def explicit_threads(n: int) -> ThreadChoice:
    """`--threads N`: N torch threads whatever the machine (ValueError for N < 1)."""
    if n < 1:
        raise ValueError(f"--threads must be >= 1, not {n}")
    return ThreadChoice(n, "flag", f"--threads {n}")


def choose_threads(state: CpuState) -> ThreadChoice:
    """The cores of `state` that are free (see the module docstring); pure."""
    if state.usable < 1:
        raise ValueError(f"usable cores must be >= 1, not {state.usable}")
    where = f"{state.usable} usable core{'s' if state.usable != 1 else ''}"
    if state.limits:
        where += f" ({', '.join(state.limits)})"
    load = state.load_1min
    if load is None or not math.isfinite(load) or load < 0:
        return ThreadChoice(1, "machine", f"{where}, no load average: 1 thread", state)
    free = min(state.usable, math.floor(state.usable - load + BUSY_SLACK))
    if free < 1:
        return ThreadChoice(1, "machine", f"{where}, 1-minute load {load:.2f}: none free, 1 thread", state)
    said = "all free" if free == state.usable else f"{free} free"
    return ThreadChoice(free, "machine", f"{where}, 1-minute load {load:.2f}: {said}", state)


@functools.cache
def machine_threads() -> ThreadChoice:
    """The default of this process: the machine's free cores, read at its first call (see the module docstring)."""
    return choose_threads(read_cpu_state())


def read_cpu_state(environ: dict[str, str] | None = None) -> CpuState:
    """This process's usable cores and the machine's 1-minute load average (see `CpuState`)."""
    env = dict(os.environ) if environ is None else environ
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        usable = os.cpu_count() or 1
    limits: list[str] = []
    quota = cgroup_cpu_quota()
    if quota is not None and quota < usable:
        usable, limits = quota, [f"cgroup CPU quota {quota}"]
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and 1 <= int(omp) < usable:
        usable = int(omp)
        limits.append(f"OMP_NUM_THREADS={omp}")
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        load = None
    return CpuState(max(usable, 1), load, tuple(limits))


def cgroup_cpu_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole cores of a cgroup v2 CPU quota ("QUOTA PERIOD"; at least 1), None without one."""
    try:
        quota, period = path.read_text().split()[:2]
        return max(1, math.floor(int(quota) / int(period))) if quota != "max" else None
    except (OSError, ValueError):
        return None
