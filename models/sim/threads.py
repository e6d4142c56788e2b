"""How many torch threads a simulation uses when `--threads` is not given.

torch's CPU build runs its intra-op parallel regions on an OpenMP thread pool
whose threads spin while they wait for each other. When another process holds
one of the cores, the round waits for the descheduled thread while the others
burn their share spinning: on the 2-core machine under load, 2 threads were
many times slower than 1 (docs/performance.md, "Threads on a shared machine").
So the default is the number of cores that are actually free:

- `choose_threads(state)` (pure): the cores that are idle now among the CPUs
  this process may run on (`CpuState.idle_now`: watched for `SAMPLE_SECONDS`
  in /proc/stat, D98), a core counting as free when at most `BUSY_SLACK` of
  it was busy, at least 1 and at most `CpuState.usable` (its CPU affinity,
  capped by a cgroup CPU quota and by OMP_NUM_THREADS when set). Where the
  CPUs cannot be watched (no /proc/stat), the usable cores minus the
  1-minute load average, which lags: a run that ended a minute ago still
  counts. Without either figure it is 1, the count that is never the slow case.
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: A core counts as free when its share of the 1-minute load is at most this much.
BUSY_SLACK = 0.5
#: How long `read_cpu_state` watches the CPUs to see how idle they are now.
SAMPLE_SECONDS = 0.3


@dataclass(frozen=True)
class CpuState:
    """What the machine can give this process.

    usable: the cores this process may run on (>= 1): its CPU affinity, capped by a cgroup CPU quota
    and by OMP_NUM_THREADS when it is set. load_1min: the 1-minute load average (runnable and
    uninterruptible tasks, the whole machine), or None where the platform has none. idle_now: the
    idle cores' worth of the CPUs this process may run on over the last `SAMPLE_SECONDS`, or None
    where they cannot be watched (it is preferred to the load average, which lags)."""

    usable: int
    load_1min: float | None
    limits: tuple[str, ...] = field(default=())  # what capped `usable`, e.g. "OMP_NUM_THREADS=1"
    idle_now: float | None = None


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
            if self.state.idle_now is not None:
                out["idle_now"] = self.state.idle_now
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
    idle = state.idle_now
    if idle is not None and math.isfinite(idle) and idle >= 0:  # D98: what is idle now, not a lagging average
        free = min(state.usable, math.floor(idle + BUSY_SLACK))
        figure = f"{idle:.2f} cores idle now"
        if free < 1:
            return ThreadChoice(1, "machine", f"{where}, {figure}: none free, 1 thread", state)
        said = "all free" if free == state.usable else f"{free} free"
        return ThreadChoice(free, "machine", f"{where}, {figure}: {said}", state)
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
    cpus = _affinity()
    usable = len(cpus) if cpus is not None else os.cpu_count() or 1
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
    return CpuState(max(usable, 1), load, tuple(limits), idle_cores(cpus, SAMPLE_SECONDS))


def _affinity() -> frozenset[int] | None:
    """The CPUs this process may run on (None: the platform cannot say: macOS, Windows)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:
        return None


def cpu_times(text: str) -> dict[int, tuple[int, int]]:
    """Each CPU's (all, idle) jiffies from the text of /proc/stat (idle counts
    iowait too); the per-CPU lines "cpuN user nice system idle iowait ..." only."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or len(fields) < 4:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
        out[int(name[3:])] = (sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0))
    return out


def idle_between(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                 cpus: frozenset[int] | None) -> float | None:
    """The idle cores' worth of `cpus` (None: all) between two `cpu_times`
    readings, or None when no CPU of them advanced."""
    idle, seen = 0.0, 0
    for cpu, (total, free) in after.items():
        if (cpus is not None and cpu not in cpus) or cpu not in before:
            continue
        d_total, d_idle = total - before[cpu][0], free - before[cpu][1]
        if d_total > 0:
            idle += min(1.0, max(0.0, d_idle / d_total))
            seen += 1
    return idle if seen else None


def idle_cores(cpus: frozenset[int] | None, seconds: float, path: Path = Path("/proc/stat")) -> float | None:
    """The idle cores' worth of `cpus` over the next `seconds`, watched in
    /proc/stat; None where it cannot be read (not Linux) or does not advance."""
    try:
        before = cpu_times(path.read_text())
        time.sleep(seconds)
        after = cpu_times(path.read_text())
    except (OSError, ValueError):
        return None
    return idle_between(before, after, cpus)


def cgroup_cpu_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole cores of a cgroup v2 CPU quota ("QUOTA PERIOD"; at least 1), None without one."""
    try:
        quota, period = path.read_text().split()[:2]
        return max(1, math.floor(int(quota) / int(period))) if quota != "max" else None
    except (OSError, ValueError):
        return None
