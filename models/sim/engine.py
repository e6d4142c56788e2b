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
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

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
from models.sim.aggregation import (SecureAggregator, aggregate_round, dp_mean, plain_mean, round_streams,
                                    streams_secure)
from models.sim.checkpoint import Checkpoints, fingerprint, restore_tables
from models.sim.config import DPSettings, MemorySettings, SimulationConfig
from models.sim.evaluate import evaluate_state
from models.sim.events import SimulationEvents, close_round
from models.sim.global_state import load_global_state, save_global_state
from models.sim.memory import MemoryPlan, gib, peak_resident_bytes
from models.sim.private_tables import PrivateTables, Which
from models.sim.rank_round import RankAggregator, check_rank_settings, gather_small, rank_figures
from models.sim.ranks import Ranks
from models.sim.report import results_document, selection_key
from models.sim.results import write_results
from models.sim.sparse_aggregation import SparseUpdates, aggregate_sparse
from models.sim.sparse_plan import SparsePlan
from models.sim.sparse_state import SparseTables
from models.sim.shard import CohortShare, Shard, shard_of
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
    from models.sim.aggregation import SecureStream
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
class _Data:
    """The data, the population and the model of a simulation, the same on every rank."""

    explicit: bool
    rounds: int
    dataset: str
    split: ImplicitSplit | ExplicitSplit
    population: np.ndarray  # dense user ids of the simulated devices (all ranks')
    cohort_size: int
    model: FederatedRecommender
    global_: GlobalState


@dataclass
class _Setup(_Data):
    """What a simulation (one rank's part of it) has built before its first
    round (`tables` is None until `_init_tables`)."""

    shard: Shard  # the population rows this rank owns (everyone without ranks)
    cohorts: Cohorts  # the shard's data
    plan: MemoryPlan | SparsePlan
    sparse: SparseTraining | None  # the model's sparse path when the state is kept sparsely (D89)
    ranks: Ranks | None = None
    tables: PrivateTables | SparseTables | None = None

    @property
    def full_cohort(self) -> bool:
        return self.cohort_size == len(self.population)

    @property
    def local(self) -> np.ndarray:
        """The dense user ids of this rank's devices."""
        return self.population[self.shard.lo : self.shard.hi]


def _load(
    config: SimulationConfig, explicit: bool, interactions: Interactions | None, device: torch.device
) -> _Data:
    """Data, population, model and initial global state; ConfigError for settings the data refuses."""
    rounds = config.rounds if config.rounds is not None else default_rounds(config.model, explicit)
    x = interactions if interactions is not None else load_interactions(config.dataset, config.data_dir, config.seed)
    split = make_split(x, explicit, config.seed)
    population = population_of(config.users, split.n_users, x.name)
    n_pop = len(population)
    cpr = config.clients_per_round
    if cpr is not None and not 1 <= cpr <= n_pop:
        raise SimulationConfigError(f"--clients-per-round must be in [1, {n_pop}] for {x.name}, got {cpr}")
    model = build_model(
        config.model,
        explicit=explicit,
        n_users=split.n_users,
        n_items=split.n_items,
        item_features=split.item_features,
        overrides=config.params,
    )
    from models.keyed_random import global_init_generator

    with torch.no_grad():
        global_ = {k: v.to(device) for k, v in model.init_global(global_init_generator(config.seed)).items()}
    return _Data(explicit, rounds, x.name, split, population, n_pop if cpr is None else cpr, model, global_)


def _shard_setup(
    d: _Data, config: SimulationConfig, mem: MemorySettings, device: torch.device, shard: Shard, ranked: bool = False
) -> _Setup:
    """One shard's data and memory plan (sized for the shard's devices; `ranked`: one of several ranks)."""
    local = d.population[shard.lo : shard.hi]
    cohorts = Cohorts(d.split, local, device)
    n_local, cohort = len(local), min(d.cohort_size, len(local))
    sparse = sparse_model(d.model, mem)
    plan: MemoryPlan | SparsePlan
    varies = ranked and d.cohort_size < len(d.population)  # a rank's share of a partial cohort changes
    if sparse is not None:
        plan = plan_sparse_memory(sparse, d.model.update_dim, cohorts, d.global_, mem, n_items=d.split.n_items,
                                  cohort=cohort, rounds=d.rounds, config=config, ranked=ranked, varies=varies)
    else:
        plan = plan_cohort_memory(d.model, cohorts, d.global_, mem, n_pop=n_local, n_items=d.split.n_items,
                                  cohort=cohort, config=config, ranked=ranked, rounds=d.rounds, varies=varies)
    return _Setup(**vars(d), shard=shard, cohorts=cohorts, plan=plan, sparse=sparse)


def _prepare(
    config: SimulationConfig,
    explicit: bool,
    interactions: Interactions | None,
    mem: MemorySettings,
    ev: SimulationEvents,
    device: torch.device,
    ranks: Ranks | None = None,
) -> _Setup:
    """This rank's setup (everything without ranks); the memory plan is
    reported through `ev.note`."""
    d = _load(config, explicit, interactions, device)
    shard = Shard.whole(len(d.population)) if ranks is None else _shard(d, ranks.rank, ranks.world)
    s = _shard_setup(d, config, mem, device, shard, ranked=ranks is not None)
    s.ranks = ranks
    ev.note(s.plan.describe() if ranks is None else f"rank {ranks.rank}: {s.plan.describe()}")
    return s


def _shard(d: _Data, rank: int, world: int) -> Shard:
    try:
        return shard_of(d.split, d.population, rank, world)
    except ValueError as e:
        raise SimulationConfigError(str(e)) from None


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
    nproc: int | None = None,
) -> str:
    """`fedmask simulate --plan-only`: the memory plan and the private state's bytes
    as a function of rounds, without training (ConfigError as `simulate`); with
    `nproc`, what each of that many ranks needs for its shard."""
    explicit = model_is_explicit(config.model, config.explicit)
    device = resolve_device(config.device, SimulationConfigError)
    mem = memory or MemorySettings()
    if nproc is not None:
        check_rank_settings(config, nproc)
        d = _load(config, explicit, interactions, device)
        lines = [f"{nproc} ranks, {len(d.population):,d} devices, {d.cohort_size:,d} per round; each rank's needs:"]
        for r in range(nproc):
            s = _shard_setup(d, config, mem, device, _shard(d, r, nproc), ranked=nproc > 1)
            lines.append(f"rank {r}: devices {s.shard.lo:,d}..{s.shard.hi - 1:,d} ({s.shard.size:,d}): "
                         + _plan_text(s.plan).replace("\n", "\n  "))  # fmt: skip
            del s
        return "\n".join(lines)
    return _plan_text(_prepare(config, explicit, interactions, mem, SimulationEvents(), device).plan)


def _plan_text(plan: MemoryPlan | SparsePlan) -> str:
    if isinstance(plan, SparsePlan):
        return plan.describe() + "\n" + plan.table()
    one = plan.private_bytes
    if plan.state_after(0) != one and plan.rounds:  # on disk, tables that start at zero (D104)
        by_round = ", ".join(f"{plan.state_after(r):,d} bytes ({gib(plan.state_after(r))}) after round {r}"
                             for r in sorted({1, plan.rounds}))
        return (plan.describe() + f"\nprivate state (dense tables on disk): at most {by_round}; the tables that "
                f"start at zero take disk only for the devices that trained (D104; dense: {gib(one)})")
    return (
        plan.describe() + f"\nprivate state (dense tables): {one:,d} bytes ({gib(one)}) in every round, written in "
        "place (the best validation round is tested when reached, not kept: D101)"
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
    ledger: PrivacyLedger | None
    agg: RankAggregator | None  # the mean over the ranks (None: one process)
    population: np.ndarray | None  # whose metrics this process computes (None: every user, row = user id)
    disk_peak: int = 0
    state_peak: int = 0
    spare_updates: torch.Tensor | None = None  # the last plain round's update table, written over next (D97)


def _round_context(s: _Setup, tables: PrivateTables | SparseTables, config: SimulationConfig,
                   ev: SimulationEvents) -> _Round:  # fmt: skip
    device = s.cohorts.device
    secure = (SecureAggregator(seed=config.seed, neighbors=config.neighbors, group_size=config.secagg_group_size)
              if config.secagg else None)  # fmt: skip
    keep_updates = not plain_mean(config)
    agg = None if s.ranks is None else RankAggregator(s.ranks, config, secure, s.model.update_dim, device)
    # evaluation over the population (a rank: its shard) only
    population = s.local if s.ranks is not None else (None if config.users is None else s.population)
    return _Round(s, tables, config, ev, generators(config.seed, device), secure, keep_updates,
                  _ledger(config.dp, s.cohort_size / len(s.population)), agg, population,
                  tables.disk_bytes(), tables.nbytes())  # fmt: skip


def _train_and_aggregate(
    w: _Round, global_: GlobalState, share: CohortShare, r: int, rec: dict[str, Any]
) -> torch.Tensor | None:
    """Round r's local training of this process's part of the cohort and the mean update."""
    s, tables, config, rows = w.s, w.tables, w.config, share.rows
    one = s.model.update_dim > 0 and share.count > 0 and w.agg is None  # one process sums the cohort

    def cohort_J() -> torch.Tensor:  # FedMMF's privacy indicators: fixed at init_private, any buffer has them
        return tables.take(rows)["J"]

    stream, sstream = (round_streams(config, w.secure, share.count, s.model.update_dim, r, w.gens["dp"], cohort_J)
                       if one else (None, None))  # fmt: skip
    if w.agg is not None and streams_secure(config):  # a rank's own groups (None: it holds no device)
        sstream = w.agg.secure_stream(share, r)
    spare, w.spare_updates = w.spare_updates, None
    job = CohortRound(global_, s.cohorts, rows, s.plan.chunk, r, config.seed, w.ev, w.keep_updates,
                      exact_sum=w.agg is not None, stream=stream, spare_updates=spare, secure_stream=sstream)
    del spare
    if isinstance(tables, SparseTables) and s.sparse is not None and isinstance(s.plan, SparsePlan):
        upd_s = train_sparse(s.sparse, s.model.update_dim, s.split.n_items, tables, job) if share.count else None
        if sstream is not None:
            return sstream.mean(rec) if w.agg is None else w.agg.mean(cast("SecureStream", sstream), share, r, rec)
        if stream is not None:
            return dp_mean(stream, config=config, rec=rec)
        if w.agg is not None:
            return w.agg.mean(upd_s, share, r, rec)
        if isinstance(upd_s, SparseUpdates):
            return aggregate_sparse(upd_s, config=config, secure=w.secure, dp_generator=w.gens["dp"],
                                    round_idx=r, rec=rec)  # fmt: skip
        assert upd_s is not None
        return upd_s.mean()
    assert isinstance(tables, PrivateTables)
    tables.begin_round(covers_all=s.full_cohort)
    upd = train_cohort(s.model, tables, job) if share.count else None
    if sstream is not None:
        return sstream.mean(rec) if w.agg is None else w.agg.mean(cast("SecureStream", sstream), share, r, rec)
    if stream is not None:
        w.spare_updates = job.fed_table.pop() if job.fed_table else None  # written over next round (D97)
        return dp_mean(stream, config=config, rec=rec)

    mean: torch.Tensor | None
    if w.agg is not None:
        mean = w.agg.mean(upd, share, r, rec)
    else:
        assert upd is not None
        mean = aggregate_round(upd, config=config, secure=w.secure, dp_generator=w.gens["dp"], cohort_J=cohort_J,
                               round_idx=r, rec=rec)  # fmt: skip
    if not w.keep_updates and isinstance(upd, torch.Tensor):  # a plain mean read it and let it go
        w.spare_updates = upd
    return mean


def _evaluate(
    s: _Setup, tables: PrivateTables | SparseTables, global_: GlobalState, stage: EvalSplit, *, full: bool,
    which: Which = "current", population: np.ndarray | None,
) -> dict[str, float]:
    """Validation or test metrics of the current (or kept best) state (with
    ranks: each rank's metric sums, added over the ranks)."""
    device = s.cohorts.device
    reduce = None if s.ranks is None else s.ranks.sum_dict
    if isinstance(tables, SparseTables):
        assert s.sparse is not None
        return evaluate_state(s.model, global_, tables.take, s.split, stage, full=full, placebo=stage == "test",
                              device=device, population=population, score_rows=tables.scorer(s.sparse, global_),
                              reduce=reduce)  # fmt: skip

    def take(rows: torch.Tensor) -> PrivateState:
        return tables.take(rows, which, read_only=True)  # scored, never written

    gathered = s.model.gathered_tables()

    def score_rows(rows: torch.Tensor, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Scores from the item tables' rows at `items` only (the same scores as `take`'s whole rows)."""
        return s.model.score_gathered(global_, tables.take_items(rows, items, gathered, which), users, items)

    scratch: dict[str, torch.Tensor] = {}  # the model's buffers for this evaluation only

    def score_all(rows: torch.Tensor, users: torch.Tensor) -> torch.Tensor | None:
        return s.model.score_all(global_, take(rows), users, scratch)  # whole rows: no item-by-item gather

    return evaluate_state(s.model, global_, take, s.split, stage, full=full, placebo=stage == "test", device=device,
                          population=population, score_rows=score_rows if gathered else None,
                          reduce=reduce, score_all_rows=score_all)  # fmt: skip


def _summary(s: _Setup, global_: GlobalState, table: PrivateState) -> dict[str, float]:
    """`model.summary` over the whole population (with ranks: its per-device scalars gathered)."""
    return s.model.summary(global_, table if s.ranks is None else gather_small(s.ranks, table))


def _reach_best(
    best: dict[str, Any], s: _Setup, tables: PrivateTables | SparseTables, global_: GlobalState,
    population: np.ndarray | None,
) -> None:
    """The state after this round is the best so far: test it now (D89, D101:
    the test figures never influence anything, and no second private state
    is kept, dense or sparse)."""
    best["global"] = global_  # new tensors every round: safe by reference
    best["test"] = _evaluate(s, tables, global_, "test", full=True, population=population)
    best["summary"] = _summary(s, global_, tables.table())
    if isinstance(tables, PrivateTables):
        tables.release()


def _cohort(w: _Round) -> CohortShare:
    """The round's cohort (the same draw on every rank) and this process's part of it."""
    s, gens = w.s, w.gens
    rows = None
    if not s.full_cohort:
        perm = torch.randperm(len(s.population), generator=gens["cohort"], device=gens["cohort"].device)
        rows = perm[: s.cohort_size].sort().values.to(s.cohorts.device)
    return s.shard.share(rows)


def _validate(w: _Round, global_: GlobalState, r: int, best: dict[str, Any], rec: dict[str, Any]) -> None:
    """Round r's validation figures; the state is kept (or tested) when they are the best so far."""
    s = w.s
    val = _evaluate(s, w.tables, global_, "val", full=w.config.full_val, population=w.population)
    rec["val"] = val
    sel_key, sel_sign = selection_key(s.explicit)
    v = sel_sign * val.get(sel_key, math.nan)
    if math.isfinite(v) and v > best["value"]:
        best.update(round=r, value=v)
        _reach_best(best, s, w.tables, global_, w.population)


def _train(
    w: _Round, best: dict[str, Any], records: list[dict[str, Any]],
    on_round: Callable[[dict[str, Any]], None] | None, ckpt: Checkpoints | None,
) -> tuple[GlobalState, int | None]:
    """Every round (from the checkpoint's next one when resuming); the final
    global state and the round the run diverged at (None: it did not)."""
    s, config, rounds = w.s, w.config, w.s.rounds
    state = ckpt.load_latest() if ckpt is not None else None
    start = 0 if state is None else _resume(w, state, best, records)
    tables, global_ = w.tables, s.global_
    for r in range(start, rounds):
        w.ev.round_started(r, rounds)
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"round": r}
        mean = _train_and_aggregate(w, global_, _cohort(w), r, rec)
        if w.ledger is not None:  # the round's entry: one line per group, the round's epsilon
            rec["dp"] = w.ledger.add(rec.get("dp"))
        if mean is not None:  # None: no device counted (a hybrid round with too few of either kind)
            global_ = s.model.apply_mean_update(global_, mean, r)
        tables.end_round()
        rec["train_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        if (r + 1) % config.eval_every == 0 or r == rounds - 1:
            _validate(w, global_, r, best, rec)
        rec["eval_seconds"] = time.perf_counter() - t1
        rec.update(_summary(s, global_, tables.table()))  # e.g. FedRAP's sparsity of C
        tables.release()
        w.disk_peak = max(w.disk_peak, tables.disk_bytes())
        w.state_peak = max(w.state_peak, tables.nbytes())
        rec["seconds"] = time.perf_counter() - t0
        if close_round(rec, records, best["round"], global_, rounds, w.ev, on_round):
            return global_, r
        if ckpt is not None and ckpt.due(r, rounds):
            run = {"global": global_, "gens": {k: g.get_state() for k, g in w.gens.items()}, "best": best,
                   "records": records, "ledger": w.ledger, "peaks": (w.disk_peak, w.state_peak)}  # fmt: skip
            ckpt.save(r, run, tables)
    return global_, None


def _checkpoints(config: SimulationConfig, ranks: Ranks | None) -> Checkpoints | None:
    if config.checkpoint_every is None or config.checkpoint_dir is None:
        return None
    r = Ranks(0, 1) if ranks is None else ranks
    return Checkpoints(Path(config.checkpoint_dir), config.checkpoint_every, fingerprint(config, r.world), r)


def _resume(w: _Round, state: dict[str, Any], best: dict[str, Any], records: list[dict[str, Any]]) -> int:
    """Take up the run a checkpoint left (its state into `w`, `best`, `records`); the next round."""
    run = state["run"]
    w.s.global_ = run["global"]
    for k, g in w.gens.items():
        g.set_state(run["gens"][k])
    best.update(run["best"])
    records[:] = run["records"]
    w.ledger = run["ledger"]
    w.disk_peak, w.state_peak = run["peaks"]
    w.tables = w.s.tables = restore_tables(w.tables, state["tables"])
    w.ev.note(f"resumed from the checkpoint of round {state['round']} ({len(records)} rounds done)")
    return int(state["round"]) + 1


def simulate(
    config: SimulationConfig,
    *,
    interactions: Interactions | None = None,
    memory: MemorySettings | None = None,
    events: SimulationEvents | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """Run a whole federation; returns the results dict written to results.json.

    The memory plan is made before training (MemoryBudgetError, a
    SimulationConfigError, when `memory`'s budget cannot be met) and reported
    through `events.note` and the results' "memory" block, with the measured
    peak resident memory and the private state's peak bytes (RAM and disk).
    With `ranks` (D93) this process is one rank: it holds and trains its
    shard of the devices, and every rank returns the same results (with
    each rank's figures under "ranks")."""
    t_start = time.perf_counter()
    mem = memory or MemorySettings()
    ev = events or SimulationEvents()
    explicit = model_is_explicit(config.model, config.explicit)
    device = resolve_device(config.device, SimulationConfigError)
    threads = machine_threads() if config.threads is None else explicit_threads(config.threads)
    torch.set_num_threads(threads.count)
    ev.note(f"threads: {threads.count} ({threads.reason})")
    if ranks is not None:
        check_rank_settings(config, ranks.world)
    s = _prepare(config, explicit, interactions, mem, ev, device, ranks)
    tables = _init_tables(s, mem, config.seed, ev)
    model, rounds, n_pop = s.model, s.rounds, len(s.population)
    work = _round_context(s, tables, config, ev)
    pop_arg = work.population
    # the best validation round; its test figures are computed when it is reached (D89,
    # D101): they never influence anything, and no second private state is kept
    best: dict[str, Any] = {"round": None, "value": -math.inf, "global": None, "test": None, "summary": None}
    records: list[dict[str, Any]] = []
    t_setup = time.perf_counter() - t_start
    ev.note(f"setup {t_setup:.1f} s: {n_pop} devices, {s.split.n_items} items, {s.cohort_size} devices per round")

    try:
        global_, diverged_at = _train(work, best, records, on_round, _checkpoints(config, ranks))
        tables = work.tables  # a resumed sparse store replaces the one made at the start
        t_train_end = time.perf_counter()
        last_round = rounds - 1 if diverged_at is None else diverged_at
        saved_global = None
        if config.save_global is not None and (ranks is None or ranks.rank == 0):
            saved_global = str(save_global_state(global_, config.save_global, round_=last_round, seed=config.seed))
        if best["round"] is None:  # every validation value was NaN: fall back to the last round
            best["round"] = last_round
            _reach_best(best, s, tables, global_, pop_arg)
        if best["test"] is None and isinstance(tables, PrivateTables) and tables.best is not None:
            # a run resumed from a checkpoint of an earlier version, which kept the best state
            best["test"] = _evaluate(s, tables, best["global"], "test", full=True, which="best", population=pop_arg)
            best["summary"] = _summary(s, best["global"], tables.table("best"))
        tables.release()
    finally:
        work.tables.close()
    seconds_total = time.perf_counter() - t_start
    memory_block = s.plan.as_dict() | {"disk_bytes_peak": work.disk_peak, "private_state_bytes_peak": work.state_peak,
                                       "peak_rss_bytes": peak_resident_bytes()}  # fmt: skip
    ledger = work.ledger
    doc = results_document(
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
    if ranks is not None:
        doc["ranks"] = rank_figures(ranks, s.shard, global_, memory_block)
    return doc
