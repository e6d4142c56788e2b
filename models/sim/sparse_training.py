"""The cohort's side of a round when the model trains sparsely (D89): whether a
run does, its memory plan (`models/sim/sparse_plan.py`), the population's
initial state (`models/sim/sparse_state.py`) and the local training of a
cohort, chunk by chunk, with its updates summed as rows."""

from __future__ import annotations

import torch

from models.base import FederatedRecommender, GlobalState
from models.registry import ConfigError
from models.sim.aggregation import stream_working_bytes, streams_dp, streams_secure
from models.sim.config import MemorySettings, SimulationConfig
from models.sim.exact_sum import FixedSum
from models.sim.memory import BASELINE_BYTES, MemoryBudgetError, default_budget, resident_bytes
from models.sim.sparse_aggregation import RowSum, SparseUpdates
from models.sim.sparse_plan import SparsePlan, SparseWork, StateShape, plan_sparse
from models.sim.sparse_state import SparseTables
from models.sim.training import CohortRound, Cohorts
from models.sparse import SparseTraining


def sparse_model(model: FederatedRecommender, mem: MemorySettings) -> SparseTraining | None:
    """The model as a sparse trainer when this run keeps its state sparsely: with
    --private-state auto (the default) or sparse for a model that has the sparse
    path; memory and disk ask for the dense tables. ConfigError for sparse with a
    model without it."""
    if mem.private in ("memory", "disk"):
        return None
    if isinstance(model, SparseTraining):
        return model
    if mem.private == "sparse":
        raise ConfigError(
            f"--private-state sparse: {model.name} has no sparse path (fedmf and pfedrec, implicit, have one)"
        )
    return None


def plan_sparse_memory(
    model: SparseTraining,
    update_dim: int,
    cohorts: Cohorts,
    global_: GlobalState,
    mem: MemorySettings,
    *,
    n_items: int,
    cohort: int,
    rounds: int,
    config: SimulationConfig,
    ranked: bool = False,
    varies: bool | None = None,
) -> SparsePlan:
    """Measure the sizes and plan (models/sim/sparse_plan.py); ConfigError when
    the budget cannot be met. `ranked`, `varies`: as for `plan_cohort_memory`."""
    one = cohorts.get(torch.zeros(1, dtype=torch.int64, device=cohorts.device))
    with torch.no_grad():
        row = model.init_dense(one, global_, config.seed)
    dense_per_device = sum(v.element_size() * v[0].numel() for v in row.values())
    lengths = cohorts.all.lengths
    touched = model.touched_rows(lengths)
    n = cohorts.size
    width = int(global_[model.base_keys[0]].shape[1]) if model.base_keys else 0
    base_bytes = sum(global_[k].numel() * global_[k].element_size() for k in model.base_keys)
    state = StateShape(
        population=n, cohort=cohort, dense_per_device=dense_per_device, rows_total=float(touched.sum()),
        row_bytes=8 + 4 * width, base_bytes=base_bytes,
    )  # fmt: skip
    row_width = update_dim // n_items if n_items else 0
    streamed = streams_dp(config) or streams_secure(config)
    work = SparseWork(
        baseline=max(resident_bytes(), BASELINE_BYTES // 2),
        stream_bytes=stream_working_bytes(config, update_dim, cohort, ranked=ranked if varies is None else varies),
        global_bytes=sum(v.numel() * v.element_size() for v in global_.values()),
        update_dim=update_dim,
        # a stream takes each chunk's updates in their dense form (4 bytes a coordinate)
        train_per_device=-(-model.sparse_train_bytes(lengths) // max(n, 1)) + (4 * update_dim if streamed else 0),
        train_max_device=model.sparse_train_bytes(lengths.max().view(1)) if n else 0,
        update_rows_per_device=float(touched.mean()) * (8 + 4 * row_width) if n else 0.0,
        eval_per_device=64 * n_items,  # per item: its id, score, row slot and masks of a full ranking
        keep_updates=((config.secagg or config.dp is not None) and not streams_dp(config)
                      and not streams_secure(config)),
        secagg=config.secagg,
    )  # fmt: skip
    budget = default_budget() if mem.budget_gb is None else int(mem.budget_gb * 1024**3)
    try:
        return plan_sparse(state, work, rounds=rounds, budget=budget, chunk=mem.cohort_chunk)
    except MemoryBudgetError as e:
        raise ConfigError(str(e)) from None


def init_sparse(
    model: SparseTraining, cohorts: Cohorts, global_: GlobalState, plan: SparsePlan, seed: int
) -> SparseTables:
    """The population's initial state: the dense tensors (made `plan.chunk` devices
    at a time) and no rows, relative to the initial global."""
    n = cohorts.size
    parts = []
    step = max(1, plan.chunk)
    with torch.no_grad():
        for s in range(0, n, step):
            parts.append(model.init_dense(cohorts.get(torch.arange(s, min(n, s + step), device=cohorts.device)), global_, seed))
    dense = {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else {}
    base = {k: global_[k] for k in model.base_keys}
    width = int(base[model.base_keys[0]].shape[1]) if model.base_keys else 0
    return SparseTables(dense, n, base, width)


def train_sparse(
    model: SparseTraining, update_dim: int, n_items: int, tables: SparseTables, job: CohortRound
) -> RowSum | SparseUpdates | None:
    """Train the cohort chunk by chunk, writing its state to `tables`. Returns the
    float64 sum of the updates or, with DP or SecAgg (`job.keep_updates`), the
    updates as rows, or None when every chunk's updates went to `job.stream` or
    `job.secure_stream` (dense a chunk at a time)."""
    n = job.size
    out: RowSum | SparseUpdates
    if job.keep_updates:
        out = SparseUpdates(n_items, update_dim)
    else:  # the order-free fixed-point sum with ranks (D93)
        out = FixedSum(update_dim, job.cohorts.device) if job.exact_sum else RowSum(update_dim, job.cohorts.device)
    done = 0
    fed = job.stream is not None or job.secure_stream is not None
    for part, positions in zip(job.parts(), job.positions(), strict=True):
        rows = torch.arange(n, device=job.cohorts.device) if part is None else part
        data = job.cohorts.get(part)
        with torch.no_grad():
            res = model.local_update_sparse(job.local_round(tables.take(rows), data))
        upd = res.update
        b = int(data.users.shape[0])
        if upd.n_devices != b or upd.nnz * upd.width > b * update_dim or upd.width * n_items != update_dim:
            raise RuntimeError(f"local_update_sparse returned updates for {upd.n_devices} devices of width {upd.width}")
        tables.put(rows, res, job.round_idx, job.global_)
        if fed:  # DP under the discrete Gaussian, or SecAgg without DP: dense for this chunk only
            job.feed(SparseUpdates(n_items, update_dim, [upd]).dense(), positions)
        elif isinstance(out, RowSum):
            out.add_rows(upd)
        else:
            out.parts.append(upd)
        del res, upd, data
        done += b
        if job.chunk < n:
            job.ev.chunk_done(job.round_idx, done, n)
    return None if fed else out
