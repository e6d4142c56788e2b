"""The batched federation simulator behind `fedmask simulate`.

One process simulates a whole federation with exactly the per-device functions
an edge client runs (`models/base.py`), stacked over the cohort. Each round:

1. select a cohort (seeded; all devices of the population by default, or
   `clients_per_round` drawn uniformly without replacement); the population
   is every user of the dataset, or `users` (1-based user numbers, like an
   edge client's --users);
2. gather the cohort's private rows (`PrivateTables.take`) and training data
   (`cohort_data`), the whole cohort at once or, when the memory plan says so
   (`models/sim/memory.py`, printed before training), chunk by chunk;
3. `model.local_update` -> new private rows and the (B, update_dim) updates
   (chunked: their running sum, or the whole table with DP or SecAgg); for
   FedMF and PFedRec by default `local_update_sparse` -> only the rows each
   device touched, kept in `models/sim/sparse_state.py` and summed row by row
   (D89);
4. optionally clip every update to L2 norm tau and add N(0, (z tau)^2) noise
   (`models/privacy.py`), on the device side, before aggregation (distributed
   mode: 1/|g| of that variance, g the device's secure-aggregation group;
   `models/sim/dp_groups.py`, whose ledger keeps each round's groups and
   epsilon);
5. aggregate: the plain mean, or with `secagg` the real SecAgg(+) protocol run
   in-process (fixed-point encoding, pairwise and self masks, unmasking), in
   groups of at least `secagg_group_size` devices for a cohort of twice that
   or more (D87);
6. `model.apply_mean_update` -> the new global state; the private rows go back
   into the tables (RAM, or memory-mapped files; `models/sim/private_tables.py`);
7. every `eval_every` rounds (and after the last) evaluate on *validation*
   (metric sums from `models/evaluation.py`).

Randomness: the initial global state comes from
`keyed_random.global_init_generator(seed)`, exactly like the coordinator's
version 1; every per-device draw (private initialisation, negatives,
mini-batch order) is keyed by (seed, round, user id, ...) inside the models
(`models/keyed_random.py`). So a device trains exactly as it would on an edge
client, whatever the cohort: with the same seed and settings a federation over
gRPC reaches the same global model as `simulate` (up to the secagg
quantisation; tests/integration/test_simulate_equivalence.py). Cohort
sampling and DP noise use their own seeded generators.

Model selection uses validation only: the state (global + all private rows)
of the best validation round is kept (its private tables are never written
again: a round then writes the other buffer, `models/sim/private_tables.py`)
and the test metrics are computed once, on that state, after training. A
state kept sparsely is not kept twice: its test metrics are computed when a
round becomes the best on validation, and reported at the end (D89). Test
numbers never influence anything.

The engine composes the simulator's parts, each a module of `models/sim/`:
`config` (the settings), `training` (cohorts, private state, memory plan,
local training; `sparse_training`, `sparse_state`, `sparse_plan` and
`sparse_aggregation` for a state kept sparsely), `aggregation` (one round's
DP, SecAgg and hybrid mean), `dp_groups` (DP per secure-aggregation group and
the privacy ledger),
`evaluate`, `report` (the results document), `global_state` and `results`
(the files written).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import (
    FederatedRecommender,
    GlobalState,
    PrivateState,
    resolve_device,
)
from models.data.entry import load_interactions, make_split
from models.data.types import ExplicitSplit, ImplicitSplit, Interactions
from models.registry import ConfigError, build_model, default_rounds, model_is_explicit
from models.sim.aggregation import SecureAggregator, aggregate_round
from models.sim.config import DPSettings, MemorySettings, SimulationConfig
from models.sim.evaluate import evaluate_state
from models.sim.events import SimulationEvents, close_round
from models.sim.global_state import load_global_state, save_global_state
from models.sim.memory import MemoryPlan, gib, peak_resident_bytes
from models.sim.private_tables import PrivateTables, Which
from models.sim.report import results_document, selection_key
from models.sim.results import write_results
from models.sim.sparse_aggregation import SparseUpdates, aggregate_sparse
from models.sim.sparse_plan import SparsePlan
from models.sim.sparse_state import SparseTables
from models.sim.sparse_training import init_sparse, plan_sparse_memory, sparse_model, train_sparse
from models.sim.threads import explicit_threads, machine_threads
from models.sim.training import (
    CohortRound,
    Cohorts,
    generators,
    init_private,
    plan_cohort_memory,
    population_of,
    train_cohort,
)
from models.sparse import SparseTraining

if TYPE_CHECKING:
    from models.evaluation import EvalSplit
    from models.sim.dp_groups import PrivacyLedger

#: the simulator's name for the catalogue's one configuration error (the same class)
SimulationConfigError = ConfigError

# What callers import from the engine (tests, scripts/gpu_check.py, the commands).
__all__ = [
    "DPSettings",
    "MemorySettings",
    "SecureAggregator",
    "SimulationConfig",
    "SimulationConfigError",
    "SimulationEvents",
    "evaluate_state",
    "load_global_state",
    "plan_simulation",
    "save_global_state",
    "simulate",
    "write_results",
]


@dataclass
class _Setup:
    """What a simulation has built before its first round (`tables` is None until
    `_init_tables`)."""

    explicit: bool
    rounds: int
    dataset: str
    split: ImplicitSplit | ExplicitSplit
    population: np.ndarray  # dense user ids of the simulated devices
    cohort_size: int
    model: FederatedRecommender
    cohorts: Cohorts
    global_: GlobalState
    plan: MemoryPlan | SparsePlan
    sparse: SparseTraining | None  # the model's sparse path when the state is kept sparsely (D89)
    tables: PrivateTables | SparseTables | None = None

    @property
    def full_cohort(self) -> bool:
        return self.cohort_size == len(self.population)


def _prepare(
    config: SimulationConfig,
    explicit: bool,
    interactions: Interactions | None,
    mem: MemorySettings,
    ev: SimulationEvents,
    device: torch.device,
) -> _Setup:
    """Data, population, model, initial global state and memory plan (reported
    through `ev.note`); ConfigError for settings the data refuses."""
    rounds = config.rounds if config.rounds is not None else default_rounds(config.model, explicit)
    x = interactions if interactions is not None else load_interactions(config.dataset, config.data_dir, config.seed)
    split = make_split(x, explicit, config.seed)
    population = population_of(config.users, split.n_users, x.name)
    n_pop = len(population)
    cpr = config.clients_per_round
    if cpr is not None and not 1 <= cpr <= n_pop:
        raise SimulationConfigError(f"--clients-per-round must be in [1, {n_pop}] for {x.name}, got {cpr}")
    cohort_size = n_pop if cpr is None else cpr
    model = build_model(
        config.model,
        explicit=explicit,
        n_users=split.n_users,
        n_items=split.n_items,
        item_features=split.item_features,
        overrides=config.params,
    )
    from models.keyed_random import global_init_generator

    cohorts = Cohorts(split, population, device)
    with torch.no_grad():
        global_ = {k: v.to(device) for k, v in model.init_global(global_init_generator(config.seed)).items()}
    sparse = sparse_model(model, mem)
    plan: MemoryPlan | SparsePlan
    if sparse is not None:
        plan = plan_sparse_memory(sparse, model.update_dim, cohorts, global_, mem, n_items=split.n_items,
                                  cohort=cohort_size, rounds=rounds, config=config)  # fmt: skip
    else:
        plan = plan_cohort_memory(
            model, cohorts, global_, mem, n_pop=n_pop, n_items=split.n_items, cohort=cohort_size, config=config
        )
    ev.note(plan.describe())
    return _Setup(explicit, rounds, x.name, split, population, cohort_size, model, cohorts, global_, plan, sparse)


def _init_tables(s: _Setup, mem: MemorySettings, seed: int, ev: SimulationEvents) -> PrivateTables | SparseTables:
    """The population's initial private state, as the plan says."""
    if s.sparse is not None and isinstance(s.plan, SparsePlan):
        s.tables = init_sparse(s.sparse, s.cohorts, s.global_, s.plan, seed)
    elif isinstance(s.plan, MemoryPlan):
        s.tables = init_private(s.model, s.cohorts, s.global_, s.plan, mem, seed, ev)
    assert s.tables is not None
    return s.tables


def plan_simulation(
    config: SimulationConfig,
    *,
    interactions: Interactions | None = None,
    memory: MemorySettings | None = None,
) -> str:
    """`fedmask simulate --plan-only`: the memory plan and the private state's bytes
    as a function of rounds, without training (ConfigError as `simulate`)."""
    explicit = model_is_explicit(config.model, config.explicit)
    device = resolve_device(config.device, SimulationConfigError)
    s = _prepare(config, explicit, interactions, memory or MemorySettings(), SimulationEvents(), device)
    if isinstance(s.plan, SparsePlan):
        return s.plan.describe() + "\n" + s.plan.table()
    one = s.plan.private_bytes
    return (
        s.plan.describe() + f"\nprivate state (dense tables): {one:,d} bytes ({gib(one)}) in every round, up to "
        f"{2 * one:,d} ({gib(2 * one)}) while an earlier round is kept as the best"
    )


def _ledger(dp: DPSettings | None, sampling_rate: float) -> PrivacyLedger | None:
    """The privacy ledger of a run with DP noise, else None (epsilon is then
    infinite)."""
    if dp is None or not dp.noise > 0:
        return None
    from models.sim.dp_groups import PrivacyLedger

    return PrivacyLedger(dp, sampling_rate)


@dataclass
class _Round:
    """What every round of one simulation shares."""

    s: _Setup
    tables: PrivateTables | SparseTables
    config: SimulationConfig
    ev: SimulationEvents
    gens: dict[str, torch.Generator]
    secure: SecureAggregator | None
    keep_updates: bool


def _train_and_aggregate(
    w: _Round, global_: GlobalState, rows: torch.Tensor | None, r: int, rec: dict[str, Any]
) -> torch.Tensor | None:
    """Round r's local training of the cohort `rows` (None: everyone) and the mean update."""
    s, tables, config = w.s, w.tables, w.config
    job = CohortRound(global_, s.cohorts, rows, s.plan.chunk, r, config.seed, w.ev, w.keep_updates)
    if isinstance(tables, SparseTables) and s.sparse is not None and isinstance(s.plan, SparsePlan):
        upd_s = train_sparse(s.sparse, s.model.update_dim, s.split.n_items, tables, job)
        if isinstance(upd_s, SparseUpdates):
            return aggregate_sparse(upd_s, config=config, secure=w.secure, dp_generator=w.gens["dp"],
                                    round_idx=r, rec=rec)  # fmt: skip
        return upd_s.mean()
    assert isinstance(tables, PrivateTables)
    tables.begin_round(covers_all=s.full_cohort)
    upd = train_cohort(s.model, tables, job)

    def cohort_J() -> torch.Tensor:
        return tables.take(rows)["J"]

    return aggregate_round(upd, config=config, secure=w.secure, dp_generator=w.gens["dp"], cohort_J=cohort_J,
                           round_idx=r, rec=rec)  # fmt: skip


def _evaluate(
    s: _Setup, tables: PrivateTables | SparseTables, global_: GlobalState, stage: EvalSplit, *, full: bool,
    which: Which = "current", population: np.ndarray | None,
) -> dict[str, float]:
    """Validation or test metrics of the current (or kept best) state."""
    device = s.cohorts.device
    if isinstance(tables, SparseTables):
        assert s.sparse is not None
        return evaluate_state(s.model, global_, tables.take, s.split, stage, full=full, placebo=stage == "test",
                              device=device, population=population, score_rows=tables.scorer(s.sparse, global_))  # fmt: skip

    def take(rows: torch.Tensor) -> PrivateState:
        return tables.take(rows, which)

    return evaluate_state(s.model, global_, take, s.split, stage, full=full, placebo=stage == "test", device=device,
                          population=population)  # fmt: skip


def _reach_best(
    best: dict[str, Any], s: _Setup, tables: PrivateTables | SparseTables, global_: GlobalState,
    population: np.ndarray | None,
) -> None:
    """The state after this round is the best so far: keep it (dense tables: never
    written again, copy on write) or, kept sparsely, test it now (D89: the test
    figures never influence anything, and no second private state is kept)."""
    best["global"] = global_  # new tensors every round: safe by reference
    if isinstance(tables, SparseTables):
        best["test"] = _evaluate(s, tables, global_, "test", full=True, population=population)
        best["summary"] = s.model.summary(global_, tables.table())
    else:
        tables.keep_best()


def simulate(
    config: SimulationConfig,
    *,
    interactions: Interactions | None = None,
    memory: MemorySettings | None = None,
    events: SimulationEvents | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run a whole federation; returns the results dict written to results.json.

    The memory plan is made before training (MemoryBudgetError, a
    SimulationConfigError, when `memory`'s budget cannot be met) and reported
    through `events.note` and the results' "memory" block, with the measured
    peak resident memory and the private state's peak bytes (RAM and disk)."""
    t_start = time.perf_counter()
    mem = memory or MemorySettings()
    ev = events or SimulationEvents()
    explicit = model_is_explicit(config.model, config.explicit)
    device = resolve_device(config.device, SimulationConfigError)
    threads = machine_threads() if config.threads is None else explicit_threads(config.threads)
    torch.set_num_threads(threads.count)
    ev.note(f"threads: {threads.count} ({threads.reason})")
    s = _prepare(config, explicit, interactions, mem, ev, device)
    tables = _init_tables(s, mem, config.seed, ev)
    model, global_, rounds, n_pop = s.model, s.global_, s.rounds, len(s.population)
    pop_arg = None if config.users is None else s.population  # evaluation over the population only
    gens = generators(config.seed, device)
    ledger = _ledger(config.dp, s.cohort_size / n_pop)
    secure = (SecureAggregator(seed=config.seed, neighbors=config.neighbors, group_size=config.secagg_group_size)
              if config.secagg else None)  # fmt: skip
    keep_updates = secure is not None or config.dp is not None or config.plaintext_j_bound is not None
    work = _Round(s, tables, config, ev, gens, secure, keep_updates)
    sel_key, sel_sign = selection_key(explicit)
    # the best validation round; on the sparse path its test figures are computed when
    # it is reached (D89): they never influence anything, and no second state is kept
    best: dict[str, Any] = {"round": None, "value": -math.inf, "global": None, "test": None, "summary": None}
    records: list[dict[str, Any]] = []
    diverged_at: int | None = None
    t_setup = time.perf_counter() - t_start
    ev.note(f"setup {t_setup:.1f} s: {n_pop} devices, {s.split.n_items} items, {s.cohort_size} devices per round")
    disk_peak, state_peak = tables.disk_bytes(), tables.nbytes()

    try:
        for r in range(rounds):
            ev.round_started(r, rounds)
            t0 = time.perf_counter()
            rows = None
            if not s.full_cohort:
                perm = torch.randperm(n_pop, generator=gens["cohort"], device=gens["cohort"].device)
                rows = perm[: s.cohort_size].sort().values.to(device)
            rec: dict[str, Any] = {"round": r}
            mean = _train_and_aggregate(work, global_, rows, r, rec)
            if ledger is not None:  # the round's entry: one line per group, the round's epsilon
                rec["dp"] = ledger.add(rec.get("dp"))
            if mean is not None:  # None: no device counted (a hybrid round with too few of either kind)
                global_ = model.apply_mean_update(global_, mean, r)
            tables.end_round()
            rec["train_seconds"] = time.perf_counter() - t0

            t1 = time.perf_counter()
            if (r + 1) % config.eval_every == 0 or r == rounds - 1:
                val = _evaluate(s, tables, global_, "val", full=config.full_val, population=pop_arg)
                rec["val"] = val
                v = sel_sign * val.get(sel_key, math.nan)
                if math.isfinite(v) and v > best["value"]:
                    best.update(round=r, value=v)
                    _reach_best(best, s, tables, global_, pop_arg)
            rec["eval_seconds"] = time.perf_counter() - t1
            rec.update(model.summary(global_, tables.table()))  # e.g. FedRAP's sparsity of C
            tables.release()
            disk_peak = max(disk_peak, tables.disk_bytes())
            state_peak = max(state_peak, tables.nbytes())
            rec["seconds"] = time.perf_counter() - t0
            if close_round(rec, records, best["round"], global_, rounds, ev, on_round):
                diverged_at = r
                break

        t_train_end = time.perf_counter()
        last_round = rounds - 1 if diverged_at is None else diverged_at
        saved_global = None
        if config.save_global is not None:
            saved_global = str(save_global_state(global_, config.save_global, round_=last_round, seed=config.seed))
        if best["round"] is None:  # every validation value was NaN: fall back to the last round
            best["round"] = last_round
            _reach_best(best, s, tables, global_, pop_arg)
        if isinstance(tables, PrivateTables):  # the kept best state, tested once, now
            best["test"] = _evaluate(s, tables, best["global"], "test", full=True, which="best", population=pop_arg)
            best["summary"] = model.summary(best["global"], tables.table("best"))
        tables.release()
    finally:
        tables.close()
    seconds_total = time.perf_counter() - t_start
    memory_block = s.plan.as_dict() | {"disk_bytes_peak": disk_peak, "private_state_bytes_peak": state_peak,
                                       "peak_rss_bytes": peak_resident_bytes()}  # fmt: skip
    return results_document(
        config, dataset=s.dataset, explicit=explicit, n_users=s.split.n_users, n_items=s.split.n_items,
        cohort_size=s.cohort_size, population=n_pop, model=model, rounds=rounds, records=records,
        best_round=best["round"], test=best["test"], summary_best=best["summary"],
        timing={"seconds_total": seconds_total, "seconds_setup": t_setup,
                "seconds_training": t_train_end - t_start - t_setup},
        memory=memory_block, device=device, saved_global=saved_global,
        diverged_at=diverged_at, epsilon=ledger.epsilon() if ledger is not None else math.inf,
        threads=threads.as_dict(),
        epsilon_amplified=ledger.epsilon_poisson_amplified() if ledger is not None else None,
    )  # fmt: skip
