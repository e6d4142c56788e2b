"""How much memory a simulation needs, and the plan that keeps it in a budget.

Pure arithmetic over byte counts (no torch, no I/O except `default_budget`,
which reads the machine's available memory). The engine measures the sizes
(`Footprint`), asks `plan_memory` for a plan and either follows it or stops
with `MemoryBudgetError` before training starts.

A plan has two knobs:

- `chunk`: how many devices one `local_update` call trains. A round's cohort is
  trained chunk by chunk; the working set of training is chunk x the model's
  per-device training bytes (`FederatedRecommender.train_memory`).
- `private_on_disk`: the population's private state (e.g. FedRAP's personal
  item tables D_i) lives in memory-mapped files instead of RAM; a chunk's rows
  are read in, trained and written back. Like in RAM, one buffer: the best
  validation round's state is tested when it is reached, not kept (D101), and
  a round writes its rows in place.

Estimates, not measurements: every figure is an upper estimate of the tensors
the engine and the model hold at once, on top of the resident memory measured
when the plan is made (interpreter, torch, the loaded dataset and its padded
training table; `BASELINE_BYTES` where nothing was measured); the measured peak resident memory
of a run is reported next to it (docs/performance.md, "Memory and scale").
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

GIB = 1024**3
BASELINE_BYTES = 700 * 1024**2  # interpreter, torch, numpy and the loaded dataset
EVAL_BATCH = 256  # users per evaluation batch (models/evaluation.py)
IO_STEP_BYTES = 128 * 1024**2  # mapped pages one disk access holds (models/sim/private_tables.py)
SECAGG_BYTES_PER_COORD = 24  # the in-process SecAgg round: float64 input, uint32 encoding, masks, sums

#: auto: sparse for a model with a sparse path (D89), else RAM if it fits, else disk
PrivatePlacement = Literal["auto", "memory", "disk", "sparse"]


class MemoryBudgetError(ValueError):
    """The simulation cannot run within the memory budget (message is user-facing)."""


@dataclass(frozen=True)
class Footprint:
    """Sizes of one simulation, in bytes (per device where named so)."""

    population: int  # devices holding private state
    cohort: int  # devices trained per round
    private_per_device: int  # one device's private state
    train_fixed: int  # local_update's working set independent of the chunk size
    train_per_device: int  # local_update's working set per device of its chunk (inputs, outputs, temporaries)
    global_bytes: int  # the global state
    update_dim: int  # coordinates of one device's update
    data_bytes: int  # the population's padded training table
    eval_per_device: int  # evaluation's working set per user of an evaluation batch
    keep_updates: bool  # the float Gaussian, a hybrid round, or SecAgg on a rank: the whole (cohort, update_dim) table is held
    secagg: bool
    baseline: int = BASELINE_BYTES  # resident before training (the engine measures it; data_bytes then 0)
    # local_update's working set when the whole population trains at once with its private
    # state in RAM, given by reference and written over (D97, D102); None: as a chunk's
    whole_train: int | None = None
    # the update table a round that trains its cohort at once keeps for the next round to
    # write over (D97, D103): held through evaluation too; 0 where the round keeps none
    kept_table: int = 0
    # on disk: bytes of a device's state that start at zero (`zero_at_init`), written only once
    # it trains, and how many devices can train in the run (None: the population)
    zero_init_per_device: int = 0
    devices_trained: int | None = None

    def __post_init__(self) -> None:
        if self.population < 1 or not 1 <= self.cohort <= self.population:
            raise ValueError(f"bad population/cohort sizes {self.population}/{self.cohort}")
        for name in ("private_per_device", "train_fixed", "train_per_device", "global_bytes", "update_dim", "data_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def private_total(self) -> int:
        return self.population * self.private_per_device

    def updates_bytes(self) -> int:
        """The update table held for DP / SecAgg, or the float64 running sum of a plain mean."""
        if not self.keep_updates:
            return 8 * self.update_dim
        per = 2 * 4 + (SECAGG_BYTES_PER_COORD if self.secagg else 0)  # table + privatised copy (+ secagg)
        return self.cohort * self.update_dim * per

    def static(self, private_on_disk: bool) -> int:
        """Bytes held throughout: baseline, data, global states, private state in RAM."""
        # in RAM: the one buffer (D101); on disk: one I/O step of mapped pages
        private = IO_STEP_BYTES if private_on_disk else self.private_total
        return self.baseline + self.data_bytes + 4 * self.global_bytes + private

    def train(self, chunk: int) -> int:
        return self.train_fixed + chunk * self.train_per_device + self.updates_bytes()

    def in_place(self, chunk: int, private_on_disk: bool) -> bool:
        """Whether `chunk` trains the whole population at once over its state in RAM."""
        return (self.whole_train is not None and not private_on_disk and chunk >= self.cohort
                and self.cohort == self.population)

    def evaluation(self, chunk: int | None = None) -> int:
        """Evaluation's working set, with the kept update table when `chunk` trains the cohort at once."""
        kept = self.kept_table if chunk is not None and chunk >= self.cohort else 0
        return EVAL_BATCH * self.eval_per_device + kept

    def ram(self, chunk: int, private_on_disk: bool) -> int:
        """Estimated peak resident bytes with `chunk` devices per local_update call
        (training and evaluation do not overlap)."""
        if self.in_place(chunk, private_on_disk):
            assert self.whole_train is not None
            return self.static(False) + max(self.whole_train + self.updates_bytes(), self.evaluation(chunk))
        return self.static(private_on_disk) + max(self.train(chunk), self.evaluation(chunk))

    def disk(self, private_on_disk: bool) -> int:
        """The memory-mapped files' bytes at most: every device's state, but the tables that
        start at zero only for the devices that can train (sparse files, D104)."""
        if not private_on_disk:
            return 0
        trained = self.population if self.devices_trained is None else self.devices_trained
        return sparse_state_bytes(self.private_total, self.population, self.zero_init_per_device, trained)


def sparse_state_bytes(dense: int, population: int, zero_init_per_device: int, devices_trained: int) -> int:
    """The private state's bytes on disk, at most, once `devices_trained` devices have
    trained: the `dense` bytes less the tables that start at zero of the devices not
    trained yet, whose rows the sparse files never hold (D104)."""
    return dense - max(0, population - devices_trained) * zero_init_per_device


@dataclass(frozen=True)
class MemoryPlan:
    budget: int  # bytes
    chunk: int  # devices per local_update call (== cohort: unchunked)
    cohort: int
    private_on_disk: bool
    ram_estimate: int  # bytes, under this plan
    disk_estimate: int  # bytes of memory-mapped private state (at most)
    unchunked_estimate: int  # bytes, the whole cohort at once with private state in RAM
    baseline: int  # bytes resident when the plan was made
    private_bytes: int = 0  # the population's private state, one buffer
    population: int = 0
    zero_init_per_device: int = 0  # a device's bytes in tables that start at zero (D104)
    rounds: int | None = None  # the run's rounds, when the plan was told

    @property
    def chunked(self) -> bool:
        return self.chunk < self.cohort

    def state_after(self, rounds: int) -> int:
        """The private state's bytes after `rounds` rounds, at most: on disk the tables
        that start at zero hold rows only for the devices trained so far (D104)."""
        if not self.private_on_disk:
            return self.private_bytes
        return sparse_state_bytes(self.private_bytes, self.population, self.zero_init_per_device,
                                  self.cohort * rounds)

    def describe(self) -> str:
        """One line for the log."""
        text = (
            f"memory: estimated peak {gib(self.ram_estimate)} of a {gib(self.budget)} budget "
            f"({gib(self.baseline)} resident now; unchunked, in RAM: {gib(self.unchunked_estimate)}); "
        )
        text += f"training {self.chunk} of {self.cohort} devices at a time" if self.chunked else "training the cohort at once"
        if self.private_on_disk:
            text += f"; private state in memory-mapped files (up to {gib(self.disk_estimate)} of disk)"
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"chunked": self.chunked}


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def plan_memory(
    fp: Footprint,
    *,
    budget: int,
    chunk: int | None = None,
    private: PrivatePlacement = "auto",
    disk_free: int | None = None,
) -> MemoryPlan:
    """The plan for `fp` within `budget` bytes, or MemoryBudgetError.

    `chunk` forces the devices per local_update call (capped at the cohort);
    None picks the largest that fits. `private` forces where the private state
    lives; "auto" keeps it in RAM when a chunk of at least
    min(cohort, 64) devices still fits, otherwise on disk. `disk_free`: bytes
    free where the memory-mapped files go (checked when they are used).
    """
    if budget <= 0:
        raise MemoryBudgetError(f"--memory-gb must be > 0, got {budget / GIB:g}")
    if chunk is not None and chunk < 1:
        raise MemoryBudgetError(f"--cohort-chunk must be >= 1, got {chunk}")
    unchunked = fp.ram(fp.cohort, False)

    def largest_chunk(on_disk: bool) -> int:
        if fp.ram(0, on_disk) > budget:
            return 0
        if fp.train_per_device == 0:
            return fp.cohort
        free = budget - fp.static(on_disk) - fp.train(0)
        return max(0, min(fp.cohort, free // fp.train_per_device))

    whole = private != "disk" and (chunk is None or chunk >= fp.cohort) and fp.in_place(fp.cohort, False)
    if whole and fp.ram(fp.cohort, False) <= budget:  # the whole population at once, over its own state
        on_disk, fits = False, fp.cohort
    elif private == "auto":
        wanted = min(fp.cohort, 64) if chunk is None else min(chunk, fp.cohort)
        on_disk = largest_chunk(False) < wanted
        fits = largest_chunk(on_disk)
    else:
        on_disk = private == "disk"
        fits = largest_chunk(on_disk)
    size = fits if chunk is None else min(chunk, fp.cohort)
    if chunk is None and size >= fp.cohort > 1 and fp.ram(size, on_disk) > budget:
        size = fp.cohort - 1  # the cohort at once fits only without the update table it keeps
    if size < 1 or fp.ram(size, on_disk) > budget:
        need_disk = fp.ram(1 if chunk is None else size, True)
        hint = "" if on_disk else f"; with the private state on disk it needs {gib(need_disk)}"
        raise MemoryBudgetError(
            f"this simulation needs about {gib(fp.ram(max(size, 1), on_disk))} of memory "
            f"({'chunks of ' + str(max(size, 1)) + ' devices' if chunk is not None else 'one device at a time'}, "
            f"private state {'on disk' if on_disk else 'in RAM'}){hint}, more than the budget "
            f"--memory-gb {budget / GIB:.2f}; fixed parts: {gib(fp.ram(0, on_disk))} "
            f"(the cohort's updates, or their sum: {gib(fp.updates_bytes())}). "
            "Raise --memory-gb, train fewer devices per round (--clients-per-round) or a smaller model"
        )
    disk = fp.disk(on_disk)
    if on_disk and disk_free is not None and disk > disk_free:
        raise MemoryBudgetError(
            f"the private state needs up to {gib(disk)} of disk for its memory-mapped files, "
            f"only {gib(disk_free)} free there; choose another --state-dir"
        )
    return MemoryPlan(
        budget=budget,
        chunk=size,
        cohort=fp.cohort,
        private_on_disk=on_disk,
        ram_estimate=fp.ram(size, on_disk),
        disk_estimate=disk,
        unchunked_estimate=unchunked,
        baseline=fp.baseline,
        private_bytes=fp.private_total,
        population=fp.population,
        zero_init_per_device=fp.zero_init_per_device,
        rounds=None if fp.devices_trained is None else fp.devices_trained // fp.cohort,
    )


def default_budget() -> int:
    """90 % of the memory available now (MemAvailable on Linux; else 90 % of RAM)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * 0.9)
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.9)
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far (Linux VmHWM; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
