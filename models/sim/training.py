"""The cohort's side of a simulated round: its padded data, the population's
private state (in RAM or memory-mapped, `models/sim/private_tables.py`), the
memory plan that sizes the chunks (`models/sim/memory.py`, D70), and the
local training of a cohort chunk by chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from models.base import CohortData, FederatedRecommender, GlobalState, LocalRound, PrivateState, take_cohort
from models.data.types import ExplicitSplit, ImplicitSplit
from models.registry import ConfigError
from models.sim.aggregation import (RunningSum, SecureStream, plain_mean, stream_working_bytes, streams_dp,
                                    streams_secure)
from models.sim.config import MemorySettings, SimulationConfig
from models.sim.events import SimulationEvents
from models.sim.memory import (
    BASELINE_BYTES,
    Footprint,
    MemoryBudgetError,
    MemoryPlan,
    default_budget,
    plan_memory,
    resident_bytes,
)
from models.sim.private_tables import PrivateTables

if TYPE_CHECKING:
    from models.sim.aggregation import DPStream, RowStream


class Cohorts:
    """Padded training data of any cohort, cut from one table of the whole
    population (row i = dense user `users[i]`)."""

    def __init__(self, split: ImplicitSplit | ExplicitSplit, users: np.ndarray, device: torch.device) -> None:
        from models.data.sampling import cohort_data, explicit_train_csr

        csr = explicit_train_csr(split) if isinstance(split, ExplicitSplit) else None
        self.all = cohort_data(split, users, device=device, explicit_csr=csr)
        self.size = len(users)
        self.device = device

    def get(self, rows: torch.Tensor | None) -> CohortData:
        if rows is None:
            return self.all
        return take_cohort(self.all, rows)


def generators(seed: int, device: torch.device) -> dict[str, torch.Generator]:
    """Independent seeded streams, so e.g. turning DP on does not change the cohorts.
    (Initialisation and training draws are keyed, see models/sim/engine.py.)

    The cohort stream is a CPU generator whatever the device, so a run on an
    accelerator selects the same cohorts as on the CPU. The DP stream lives on
    the device: drawing a cohort's noise on the CPU and copying it over would
    cost more than the round, so CPU and CUDA runs with DP add different
    draws of the same distribution (docs/decisions.md D81)."""
    out = {}
    for i, name in ((1, "cohort"), (3, "dp")):
        g = torch.Generator(device=device if name == "dp" else "cpu")
        g.manual_seed(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]))
        out[name] = g
    return out


@dataclass(frozen=True)
class CohortRound:
    """One round's local training job: the cohort (`rows` of the population; None:
    all) trained `chunk` devices at a time from the round's global state.
    `keep_updates`: every device's update is kept (DP, SecAgg), not only their sum;
    `exact_sum`: the sum is the order-free fixed-point one (`models/sim/exact_sum.py`, ranks);
    `stream`: every chunk's updates go to this DP sum instead
    (`models.sim.aggregation.dp_stream`: DP under either mechanism), never kept whole;
    `secure_stream`: every chunk's updates go to this secure sum instead (SecAgg
    without DP, D100), the chunks cut group by group so that it holds one group,
    or to FedMMF's hybrid split (D107)."""

    global_: GlobalState
    cohorts: Cohorts
    rows: torch.Tensor | None
    chunk: int
    round_idx: int
    seed: int
    ev: SimulationEvents
    keep_updates: bool
    exact_sum: bool = False
    stream: DPStream | None = None
    spare_updates: torch.Tensor | None = None  # last round's update table, to write into (D97)
    secure_stream: RowStream | None = None
    # set by train_cohort: the whole cohort's table after the DP stream copied its rows, for
    # the engine to keep as the next round's spare_updates (D97: no fresh pages every round)
    fed_table: list[torch.Tensor] = field(default_factory=list)  # (frozen: a holder, filled once)

    def sums_in_model(self, model: FederatedRecommender) -> bool:
        """Whether the model adds this round's updates into one float64 sum itself
        (`LocalRound.sum_into`, D102): a plain round of one process, no stream."""
        return (model.sums_updates() and not self.keep_updates and not self.exact_sum and self.stream is None
                and self.secure_stream is None)

    def running_sum(self, dim: int, device: torch.device) -> RunningSum:
        """The accumulator of a chunked round's plain sum."""
        from models.sim.exact_sum import FixedSum

        return FixedSum(dim, device) if self.exact_sum else RunningSum(dim, device)

    @property
    def size(self) -> int:
        return self.cohorts.size if self.rows is None else int(self.rows.numel())

    def positions(self) -> list[torch.Tensor]:
        """The cohort positions (0..size-1) each chunk trains: in order, or
        group by group when the chunks feed a stream (`stream`, `secure_stream`)."""
        n = self.size
        order = torch.arange(n)
        fed = self.secure_stream if self.secure_stream is not None else self.stream
        if fed is not None and self.chunk < n:
            order = torch.as_tensor(fed.order())
        return [order[s : s + self.chunk] for s in range(0, n, max(self.chunk, 1))] if n else [order]

    def parts(self) -> list[torch.Tensor | None]:
        """The chunks' population rows, `positions()`' devices (one None: the whole population at once)."""
        n = self.size
        if self.chunk >= n:
            return [self.rows]
        ids = torch.arange(n, device=self.cohorts.device) if self.rows is None else self.rows
        return [ids[pos.to(ids.device)] for pos in self.positions()]

    def feed(self, upd: torch.Tensor, positions: torch.Tensor) -> bool:
        """Hand a chunk's dense updates to the round's stream, if it has one
        (then the caller keeps nothing of them)."""
        if self.secure_stream is not None:
            self.secure_stream.add(upd, positions)
            return True
        if self.stream is not None:  # DP (through the secure sum or not): rows in the stream's order
            self.stream.add(upd, positions)
            return True
        return False

    def local_round(self, private: PrivateState, data: CohortData, spare: PrivateState | None = None,
                    spare_updates: torch.Tensor | None = None, sum_into: torch.Tensor | None = None) -> LocalRound:
        return LocalRound(self.global_, private, data, self.round_idx, self.seed, spare, spare_updates, sum_into)


def train_cohort(
    model: FederatedRecommender, tables: PrivateTables, job: CohortRound
) -> torch.Tensor | RunningSum | None:
    """Train the cohort chunk by chunk, writing the new private rows to `tables`.
    Returns the (B, update_dim) updates, or only their running sum when the round
    is chunked and `job.keep_updates` is false (the plain mean: no DP, no SecAgg)
    or the model sums them itself (`job.sums_in_model`, D102), or None when every
    chunk's updates went to `job.stream` or `job.secure_stream`."""
    n, dim = job.size, model.update_dim
    parts = job.parts()  # one part: one local_update call (None: the whole population, by reference in RAM)
    summed = job.running_sum(dim, job.cohorts.device) if job.sums_in_model(model) else None
    out: torch.Tensor | RunningSum | None = summed
    done = 0
    for part, positions in zip(parts, job.positions(), strict=True):
        data = job.cohorts.get(part)
        # one call: the last round's update table can be written over; every row (part None): the state too (D97)
        job_part = job.local_round(tables.take(part), data, tables.spare() if part is None else None,
                                   job.spare_updates if len(parts) == 1 else None,
                                   None if summed is None else summed.total)
        with torch.no_grad():
            new_priv, upd = model.local_update(job_part)
        del job_part
        b = int(data.users.shape[0])
        if upd.shape != (b, 0 if summed is not None else dim):
            raise RuntimeError(f"{model.name}.local_update returned updates of shape {tuple(upd.shape)}")
        tables.put(part, new_priv)
        del new_priv
        if summed is not None:  # the model added them into summed.total
            summed.count += b
        elif job.feed(upd, positions):  # the table is never held
            if len(parts) == 1:
                if job.secure_stream is None:  # the DP stream copies what it keeps
                    job.fed_table.append(upd)
                return None
        elif len(parts) == 1:
            return upd
        elif out is None:
            out = torch.empty(n, dim, device=upd.device) if job.keep_updates else job.running_sum(dim, upd.device)
        if isinstance(out, RunningSum):
            if summed is None:
                out.add(upd)
        elif out is not None:
            out[done : done + b] = upd
        done += b
        del upd, data  # not alive during the next chunk's local_update (the plan counts one chunk)
        job.ev.chunk_done(job.round_idx, done, n)
    return out


def plan_cohort_memory(
    model: FederatedRecommender,
    cohorts: Cohorts,
    global_: GlobalState,
    mem: MemorySettings,
    *,
    n_pop: int,
    n_items: int,
    cohort: int,
    config: SimulationConfig,
    ranked: bool = False,
    rounds: int | None = None,
    varies: bool | None = None,
) -> MemoryPlan:
    """Measure the sizes (one device's private state, the data table) and plan
    (models/sim/memory.py); MemoryBudgetError when the budget cannot be met.
    `ranked`: this process is one of several ranks (D93): its plain sum is the
    exact fixed-point one. `varies`: its share of the cohort changes from round
    to round (a rank's share of a partial cohort; None: whenever `ranked`), so
    its secure sum's largest group is bounded over every share up to `cohort`. `rounds`: the run's rounds (the
    disk of tables that start at zero is planned for cohort x rounds devices)."""
    import shutil
    import tempfile

    one = cohorts.get(torch.zeros(1, dtype=torch.int64, device=cohorts.device))
    with torch.no_grad():
        row = model.init_private(one, global_, config.seed)
    private_bytes = sum(v.element_size() * v[0].numel() for v in row.values())
    data = cohorts.all
    max_history = int(data.lengths.max()) if data.lengths.numel() else 0
    # a plain round of one process: a model may sum the updates itself (D102)
    summed = plain_mean(config) and not ranked and model.sums_updates()
    fixed, per = model.train_memory(private_bytes, max_history, summed=summed)
    stream = stream_working_bytes(config, model.update_dim, cohort,  # a sum fed as the chunks train
                                  ranked=ranked if varies is None else varies)  # fmt: skip
    fixed += stream
    whole = None  # the whole population at once, over its state in RAM (D97, D102)
    if cohort == n_pop:
        whole_fixed, whole_per = model.train_memory(private_bytes, max_history, in_place=True, summed=summed)
        whole = whole_fixed + stream + cohort * whole_per
    fp = Footprint(
        baseline=max(resident_bytes(), BASELINE_BYTES // 2),  # measured: torch, the data, its padded table
        population=n_pop,
        cohort=cohort,
        private_per_device=private_bytes,
        train_fixed=fixed,
        train_per_device=per,
        global_bytes=sum(v.numel() * v.element_size() for v in global_.values()),
        update_dim=model.update_dim,
        data_bytes=0,  # the padded data table is inside the measured baseline
        eval_per_device=3 * private_bytes + 16 * n_items + 8 * model.update_dim,
        keep_updates=((config.secagg or config.dp is not None) and not streams_dp(config)
                      and not streams_secure(config)),
        secagg=config.secagg,
        whole_train=whole,
        kept_table=kept_table_bytes(config, model.update_dim, cohort, ranked=ranked, summed=summed),
        zero_init_per_device=sum(row[k].element_size() * row[k][0].numel() for k in model.zero_at_init()),
        devices_trained=None if rounds is None else cohort * rounds,
    )
    budget = default_budget() if mem.budget_gb is None else int(mem.budget_gb * 1024**3)
    folder = mem.state_dir if mem.state_dir is not None else tempfile.gettempdir()
    free = shutil.disk_usage(folder).free if Path(folder).exists() else None
    try:
        plan = plan_memory(fp, budget=budget, chunk=mem.cohort_chunk, private=mem.private, disk_free=free)
    except MemoryBudgetError as e:
        raise ConfigError(str(e)) from None
    if plan.private_on_disk and device_is_cuda(cohorts.device):
        raise ConfigError("the private state on disk (memory-mapped) needs --device cpu")
    return plan


def kept_table_bytes(config: SimulationConfig, update_dim: int, cohort: int, *, ranked: bool, summed: bool) -> int:
    """The float32 update table a round that trains its cohort at once keeps for the
    next round to write over (D97, D103): a plain round's, unless the model sums its
    updates itself (`summed`, D102), or the one the DP stream copied; none on a rank."""
    if ranked or not ((plain_mean(config) and not summed) or streams_dp(config)):
        return 0
    return 4 * cohort * update_dim


def device_is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def init_private(
    model: FederatedRecommender,
    cohorts: Cohorts,
    global_: GlobalState,
    plan: MemoryPlan,
    mem: MemorySettings,
    seed: int,
    ev: SimulationEvents,
) -> PrivateTables:
    """The population's initial private state, in RAM or on disk, made `plan.chunk`
    devices at a time when the plan chunks (rows depend only on their own device)."""
    n = cohorts.size
    if not plan.chunked and not plan.private_on_disk:
        with torch.no_grad():
            return PrivateTables.in_memory(model.init_private(cohorts.all, global_, seed), n)
    tables: PrivateTables | None = None
    step = max(1, plan.chunk)
    for s in range(0, n, step):
        rows = torch.arange(s, min(n, s + step), device=cohorts.device)
        with torch.no_grad():
            part = model.init_private(cohorts.get(rows), global_, seed)
        if tables is None:
            row = {k: v[:1] for k, v in part.items()}
            tables = (
                PrivateTables.on_disk(row, n, mem.state_dir)
                if plan.private_on_disk
                else PrivateTables.empty_in_memory(row, n)
            )
            tables.begin_round(covers_all=True)
            del row  # views of this chunk's tensors
        tables.put(rows, part)
        del part  # not alive while the next chunk is made
        ev.chunk_done(-1, int(rows[-1]) + 1, n)  # round -1: the initialisation
    assert tables is not None
    tables.end_round()
    return tables


def population_of(users: tuple[int, ...] | None, n_users: int, name: str) -> np.ndarray:
    """Dense user ids (sorted) of the simulated devices; `users` are 1-based numbers."""
    if users is None:
        return np.arange(n_users, dtype=np.int64)
    pop = np.array(sorted(int(u) - 1 for u in users), dtype=np.int64)
    if len(pop) == 0:
        raise ConfigError("--users selects no device")
    if len(np.unique(pop)) != len(pop):
        raise ConfigError("--users lists a user twice")
    if pop[0] < 0 or pop[-1] >= n_users:
        raise ConfigError(f"--users must lie in 1..{n_users} for {name}")
    return pop
