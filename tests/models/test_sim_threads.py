"""The default torch thread count of a simulation (models/sim/threads.py): the
free cores of an injected machine, the explicit override, and what a run records."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.data.synthetic import synthetic
from models.sim.engine import SimulationConfig, SimulationConfigError, SimulationEvents, simulate
from models.sim.threads import (BUSY_SLACK, CpuState, cgroup_cpu_quota, choose_threads, cpu_times, explicit_threads,
                                idle_between, idle_cores, read_cpu_state)


@pytest.mark.parametrize(
    ("usable", "load", "count"),
    [
        (2, 0.0, 2),  # a quiet machine: every core
        (2, 0.49, 2),  # under half a core busy still counts as free
        (2, 0.51, 1),
        (2, 1.4, 1),
        (2, 7.0, 1),  # the loaded 2-core machine: one thread, never zero
        (16, 3.2, 13),
        (16, 0.0, 16),
        (1, 0.0, 1),
    ],
)
def test_the_free_cores_of_a_machine(usable: int, load: float, count: int) -> None:
    c = choose_threads(CpuState(usable, load))
    assert (c.count, c.chosen_by) == (count, "machine")
    assert f"load {load:.2f}" in c.reason and f"{usable} usable core" in c.reason
    assert c.as_dict() == {"count": count, "chosen_by": "machine", "reason": c.reason, "usable_cpus": usable,
                                "load_1min": load}  # fmt: skip


@given(st.integers(1, 256), st.floats(0, 1000, allow_nan=False), st.floats(0, 1000, allow_nan=False))
def test_the_count_is_within_the_usable_cores_and_falls_as_the_load_rises(usable: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    c_lo, c_hi = choose_threads(CpuState(usable, lo)).count, choose_threads(CpuState(usable, hi)).count
    assert 1 <= c_hi <= c_lo <= usable
    # an independent statement of the rule: every core whose share of the load is at most BUSY_SLACK
    assert c_lo == max(1, min(usable, math.floor(usable - lo + BUSY_SLACK)))


@pytest.mark.parametrize("load", [None, math.nan, -1.0])
def test_without_a_load_average_one_thread(load: float | None) -> None:
    c = choose_threads(CpuState(8, load))
    assert c.count == 1 and "no load average" in c.reason


def test_the_limits_that_capped_the_cores_are_named() -> None:
    c = choose_threads(CpuState(1, 0.0, ("OMP_NUM_THREADS=1",)))
    assert c.count == 1 and "OMP_NUM_THREADS=1" in c.reason


def test_bad_figures_and_flags_are_refused() -> None:
    with pytest.raises(ValueError, match="usable cores"):
        choose_threads(CpuState(0, 0.0))
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        explicit_threads(0)
    assert explicit_threads(3).as_dict() == {"count": 3, "chosen_by": "flag", "reason": "--threads 3"}


def test_reading_the_machine(tmp_path: Path) -> None:
    s = read_cpu_state({"OMP_NUM_THREADS": "1"})
    assert s.usable == 1 and s.limits[-1] == "OMP_NUM_THREADS=1"
    assert s.load_1min is None or s.load_1min >= 0
    assert read_cpu_state({}).usable >= 1
    quota = tmp_path / "cpu.max"
    for text, cores in (("200000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None), ("junk\n", None)):
        quota.write_text(text)
        assert cgroup_cpu_quota(quota) == cores
    assert cgroup_cpu_quota(tmp_path / "absent") is None


STAT_BEFORE = """cpu  400 0 200 1000 0 0 0 0 0 0
cpu0 100 0 100 500 0 0 0 0 0 0
cpu1 300 0 100 500 0 0 0 0 0 0
intr 12345 0 0
"""
# 100 jiffies later: cpu0 idle all along (iowait counts as idle), cpu1 busy all along
STAT_AFTER = """cpu  500 0 200 1100 0 0 0 0 0 0
cpu0 100 0 100 590 10 0 0 0 0 0
cpu1 400 0 100 500 0 0 0 0 0 0
intr 12399 0 0
"""


def test_idle_cores_are_read_per_cpu_from_proc_stat() -> None:
    before, after = cpu_times(STAT_BEFORE), cpu_times(STAT_AFTER)
    assert before == {0: (700, 500), 1: (900, 500)}
    assert idle_between(before, after, None) == 1.0
    assert idle_between(before, after, frozenset({0})) == 1.0  # only the CPUs this process may run on
    assert idle_between(before, after, frozenset({1})) == 0.0
    assert idle_between(before, before, None) is None  # nothing advanced: no figure


def test_what_is_idle_now_wins_over_the_lagging_load_average() -> None:
    """The load average still counts a run that ended a minute ago; the CPUs watched now do not."""
    c = choose_threads(CpuState(2, 1.0, (), idle_now=1.97))
    assert c.count == 2 and "1.97 cores idle now: all free" in c.reason and c.as_dict()["idle_now"] == 1.97
    assert choose_threads(CpuState(2, 0.0, (), idle_now=1.2)).count == 1  # one core busy now
    assert choose_threads(CpuState(16, 0.0, (), idle_now=12.6)).count == 13
    assert choose_threads(CpuState(2, 0.0, (), idle_now=0.1)).reason.endswith("none free, 1 thread")
    assert choose_threads(CpuState(2, 1.0, (), idle_now=math.nan)).count == 1  # no usable figure: the load's rule


def test_reading_idle_cores(tmp_path: Path) -> None:
    assert idle_cores(None, 0.0, tmp_path / "absent") is None
    still = tmp_path / "stat"
    still.write_text(STAT_BEFORE)
    assert idle_cores(None, 0.0, still) is None  # a file that does not advance gives no figure
    if Path("/proc/stat").exists():
        s = read_cpu_state({})
        assert s.idle_now is not None and 0.0 <= s.idle_now <= len(os.sched_getaffinity(0))


class _Notes(SimulationEvents):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_a_run_prints_and_records_its_thread_count() -> None:
    x = synthetic(40, 150, seed=1)
    before = torch.get_num_threads()
    try:
        ev = _Notes()
        res = simulate(SimulationConfig(model="fedmf", rounds=1), interactions=x, events=ev)
        t = res["threads"]
        assert t["chosen_by"] == "machine" and 1 <= t["count"] <= t["usable_cpus"]
        assert torch.get_num_threads() == t["count"]
        assert ev.notes[0] == f"threads: {t['count']} ({t['reason']})"
        # read once per process: a second run keeps the first one's choice (and its float rounding)
        assert simulate(SimulationConfig(model="fedmf", rounds=1), interactions=x)["threads"] == t
        res = simulate(SimulationConfig(model="fedmf", rounds=1, threads=1), interactions=x)
        assert res["threads"] == {"count": 1, "chosen_by": "flag", "reason": "--threads 1"}
        assert res["config"]["threads"] == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SimulationConfigError, match="--threads must be >= 1"):
        SimulationConfig(model="fedmf", threads=0)
