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
   (chunked: their running sum, or the whole table with DP or SecAgg);
4. optionally clip every update to L2 norm tau and add N(0, (z tau)^2) noise
   (`models/privacy.py`), on the device side, before aggregation;
5. aggregate: the plain mean, or with `secagg` the real SecAgg(+) protocol run
   in-process (fixed-point encoding, pairwise and self masks, unmasking);
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
again: a round then writes the other buffer, `models/sim/private_tables.py`) and the test metrics are computed once, on that
state, after training. Test numbers never influence anything.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from models.base import (
    CohortData,
    FederatedRecommender,
    GlobalState,
    PrivateState,
    divergence_note,
    diverged,
    resolve_device,
    take_cohort,
    take_rows,
)
from models.data.entry import load_interactions, make_split
from models.data.types import ExplicitSplit, ImplicitSplit, Interactions
from models.sim.memory import (
    BASELINE_BYTES,
    Footprint,
    MemoryBudgetError,
    MemoryPlan,
    PrivatePlacement,
    default_budget,
    plan_memory,
    resident_bytes,
)
from models.sim.private_tables import PrivateTables
from models.registry import ConfigError, build_model, default_rounds, model_is_explicit

if TYPE_CHECKING:
    from models.evaluation import EvalSplit
    from models.privacy import Accountant
    from secagg.config import Neighbors, SecAggConfig

#: the simulator's name for the catalogue's one configuration error (the same class)
SimulationConfigError = ConfigError


# ============================================================ config and results


@dataclass(frozen=True)
class SimulationConfig:
    model: str
    dataset: str = "ml-100k"
    seed: int = 0
    rounds: int | None = None  # None: the model's tuned default (DEFAULT_ROUNDS)
    clients_per_round: int | None = None  # None: every user, every round
    secagg: bool = False
    secagg_neighbors: int | str | None = None  # SecAgg+ graph degree, or 'all'; None: 'auto' (SecAgg+)
    secagg_clip: float | None = None  # fixed-point range [-c, c]; None: see _secagg_clip
    dp_noise: float | None = None
    dp_clip: float | None = None
    dp_delta: float = 1e-5
    dp_accountant: str = "rdp"
    dp_mode: str = "local"  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / B)
    device: str = "cpu"
    explicit: bool = False
    eval_every: int = 1
    full_val: bool = False
    threads: int | None = 2
    data_dir: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    users: tuple[int, ...] | None = None  # the population: 1-based user numbers (None: every user)
    save_global: str | None = None  # write the final global state here (.npz, one array per parameter)
    #: FedMMF hybrid rounds (D64): a device whose privacy indicator J is at most
    #: this sends its update UNPROTECTED (plaintext); None (default): all secure.
    plaintext_j_bound: float | None = None

    def __post_init__(self) -> None:
        """Refuse settings that cannot run (SimulationConfigError, user-facing
        message); what needs the data (the population, --clients-per-round)
        or the machine (--device) is checked by `simulate`."""
        if (self.dp_noise is None) != (self.dp_clip is None):
            raise SimulationConfigError("differential privacy needs both --dp-noise Z and --dp-clip TAU")
        if self.dp_noise is not None and self.dp_clip is not None and (self.dp_clip <= 0 or self.dp_noise < 0):
            raise SimulationConfigError("--dp-clip must be > 0 and --dp-noise >= 0")
        if self.rounds is not None and self.rounds < 1:
            raise SimulationConfigError("--rounds must be >= 1")
        if self.dp_mode not in _DP_MODES:
            raise SimulationConfigError(f"--dp-mode must be local or distributed, not {self.dp_mode!r}")
        if self.dp_accountant not in _ACCOUNTANTS:
            raise SimulationConfigError(f"--dp-accountant must be rdp or pld, not {self.dp_accountant!r}")
        if self.dp_mode == "distributed" and self.dp_noise is not None and not self.secagg:
            raise SimulationConfigError(
                "--dp-mode distributed splits the noise across the cohort: only the sum is private, so it needs --secagg"
            )
        if self.secagg_clip is not None and not self.secagg_clip > 0:
            raise SimulationConfigError("--secagg-clip must be > 0")
        if self.eval_every < 1:
            raise SimulationConfigError("--eval-every must be >= 1")
        if self.plaintext_j_bound is not None:
            from models.sim.hybrid import check_bound

            if self.model != "fedmmf":
                raise SimulationConfigError("--plaintext-j-bound is FedMMF's policy (its privacy indicator J): --model fedmmf")
            if self.dp_noise is not None and self.dp_mode == "distributed":
                raise SimulationConfigError(
                    "--plaintext-j-bound cannot be combined with --dp-mode distributed: a plaintext update carries "
                    "only its 1/cohort share of the noise, so no epsilon would cover it"
                )
            try:
                check_bound(self.plaintext_j_bound)
            except ValueError as e:
                raise SimulationConfigError(f"--plaintext-j-bound: {e}") from e

    @property
    def dp(self) -> DPSettings | None:
        """The differential-privacy settings, or None when DP is off."""
        if self.dp_noise is None or self.dp_clip is None:
            return None
        return DPSettings(
            noise=float(self.dp_noise),
            clip=float(self.dp_clip),
            delta=self.dp_delta,
            accountant=_ACCOUNTANTS[self.dp_accountant],
            mode=_DP_MODES[self.dp_mode],
        )

    @property
    def neighbors(self) -> Neighbors:
        """The SecAgg graph: an int degree, 'all' or 'auto' (the default)."""
        n = self.secagg_neighbors
        if n is None:
            return "auto"
        if isinstance(n, int):
            return n
        if n in _GRAPHS:
            return _GRAPHS[n]
        raise SimulationConfigError(f"--secagg: neighbors must be 'all', 'auto' or an int, got {n!r}")


DPMode = Literal["local", "distributed"]
_DP_MODES: dict[str, DPMode] = {"local": "local", "distributed": "distributed"}
_ACCOUNTANTS: dict[str, Accountant] = {"rdp": "rdp", "pld": "pld"}
_GRAPHS: dict[str, Literal["all", "auto"]] = {"all": "all", "auto": "auto"}


@dataclass(frozen=True)
class DPSettings:
    """Differential privacy of a simulation, as checked by SimulationConfig:
    noise multiplier z >= 0, clip norm tau > 0."""

    noise: float
    clip: float
    delta: float
    accountant: Accountant
    mode: DPMode  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / B)


def _select_key(explicit: bool) -> tuple[str, int]:
    """(metric, sign): the validation metric that picks the best round; sign +1 = higher is better."""
    return ("rmse", -1) if explicit else ("hr@10", +1)


# ============================================================ data


class _Cohorts:
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


# ============================================================ aggregation


class SecureAggregator:
    """Aggregation through the real SecAgg(+) protocol, run in process by
    `secagg.inprocess.run_round`: every device encodes its update to fixed point,
    runs its own client states (keys, Shamir shares, pairwise and self masks)
    and the server states unmask only the sum. One `SecAggConfig` per cohort
    size, reused across rounds (the round index is bound into every key)."""

    def __init__(self, *, seed: int, neighbors: Neighbors) -> None:
        self.seed = seed
        self.neighbors = neighbors
        self.session_id = f"fedmask-sim-seed-{seed}".encode()
        self._configs: dict[tuple[int, int, float], SecAggConfig] = {}
        self.last: dict[str, Any] = {}

    def config(self, n: int, length: int, clip: float) -> SecAggConfig:
        from secagg import SecAggConfig, SecAggConfigError

        key = (n, length, clip)
        if key not in self._configs:

            def create(neighbors: Neighbors) -> SecAggConfig:
                return SecAggConfig.create(
                    num_clients=n, vector_length=length, session_id=self.session_id, clip=clip, neighbors=neighbors
                )

            try:
                cfg = create(self.neighbors)
            except SecAggConfigError as e:
                if self.neighbors != "auto":
                    raise SimulationConfigError(f"--secagg: {e}") from e
                # too few devices for SecAgg+'s failure targets: the complete graph (Bonawitz)
                cfg = create("all")
            self._configs[key] = cfg
        return self._configs[key]

    def mean(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        return self.sum(updates, round_idx=round_idx, clip=clip) / updates.shape[0]

    def sum(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        """The decoded exact sum of the devices' encoded updates (all counted: no dropouts here)."""
        from secagg.inprocess import run_round

        n, length = updates.shape
        if n < 2:
            raise SimulationConfigError("--secagg needs at least 2 devices per round")
        cfg = self.config(n, length, clip)
        x = updates.detach().to("cpu", torch.float32).numpy()
        # wire=False: in one process the messages are handed over as objects instead of
        # being serialised and parsed; every cryptographic step of every device and of the
        # server still runs (serialisation is ~14 % of a 943-device round and is covered by
        # the secagg tests and `fedmask bench round`, which use the real wire format).
        out = run_round(x, config=cfg, round_idx=round_idx, seed=self.seed * 1_000_003 + round_idx, wire=False)
        if not out.ok or out.sum is None:
            raise RuntimeError(f"secure aggregation aborted in round {round_idx}: {out.abort_reason} {out.abort_detail}")
        self.last = {
            "secagg_graph": cfg.describe(),
            "secagg_counted": len(out.counted),
            "secagg_exact": bool(out.exact),
            "secagg_wall_s": float(out.wall_s),
        }
        return torch.as_tensor(np.asarray(out.sum, dtype=np.float32), device=updates.device)


def _hybrid_mean(
    upd: torch.Tensor,
    J: torch.Tensor,
    config: SimulationConfig,
    secure: SecureAggregator | None,
    round_idx: int,
    rec: dict[str, Any],
) -> torch.Tensor | None:
    """FedMMF's hybrid round (D64): devices with J <= the bound add their
    update in the clear, the others through the secure sum (the in-process
    SecAgg with --secagg, else the plain sum); the mean over the counted
    devices, or None when none is counted. Records how many took each path."""
    from models.sim.hybrid import hybrid_sum, plaintext_choice

    plain = plaintext_choice(J.to(upd.device), config.plaintext_j_bound)

    def secure_sum(rows: torch.Tensor) -> torch.Tensor:
        if secure is None:
            return rows.sum(0)
        c = _secagg_clip(config)
        out = secure.sum(rows, round_idx=round_idx, clip=c)
        rec.update(secure.last)
        rec["secagg_clipped_fraction"] = float((rows.abs() > c).sum()) / rows.numel()
        return out

    h = hybrid_sum(upd, plain, secure_sum)
    rec["plaintext_devices"] = h.plaintext
    rec["secure_devices_chosen"] = h.secure_chosen
    rec["secure_devices_counted"] = h.secure_counted
    return h.mean()


# ============================================================ the simulation


EVAL_BATCH_CPU = 256  # devices scored at a time when evaluating on the CPU
EVAL_BATCH_ACCELERATOR = 2048  # and on an accelerator


def _generators(seed: int, device: torch.device) -> dict[str, torch.Generator]:
    """Independent seeded streams, so e.g. turning DP on does not change the cohorts.
    (Initialisation and training draws are keyed, see the module doc.)

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


def evaluate_state(
    model: FederatedRecommender,
    global_: GlobalState,
    private: PrivateState | Callable[[torch.Tensor], PrivateState],
    split: ImplicitSplit | ExplicitSplit,
    stage: EvalSplit,
    *,
    full: bool,
    placebo: bool,
    device: torch.device,
    population: np.ndarray | None = None,
) -> dict[str, float]:
    """Metrics of the devices of `population` (dense user ids; row i of
    the private state is user population[i]; None: every user, row = user id).
    `private`: the state itself or a function taking its rows
    (`PrivateTables.take`), so it may live on disk."""
    from models.evaluation import evaluate_explicit, evaluate_implicit, finalize

    take = private if callable(private) else partial(take_rows, private)

    row_of: torch.Tensor | None = None
    if population is not None:
        row_of = torch.full((split.n_users,), -1, dtype=torch.int64, device=device)
        row_of[torch.as_tensor(population, device=device)] = torch.arange(len(population), device=device)

    def score_fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        rows = users if row_of is None else row_of[users]
        return model.score(global_, take(rows), users, items)

    # an accelerator scores larger batches (fewer launches); the sums do not depend on the batching
    batch = EVAL_BATCH_ACCELERATOR if device.type != "cpu" else EVAL_BATCH_CPU
    with torch.no_grad():
        if isinstance(split, ImplicitSplit):
            sums = evaluate_implicit(
                score_fn, split, stage, full=full, placebo=placebo, device=device, users=population, batch_size=batch
            )
        else:
            sums = evaluate_explicit(score_fn, split, stage, device=device, users=population, batch_size=batch)
    return finalize(sums)


@dataclass(frozen=True)
class MemorySettings:
    """How the simulator may use memory (models/sim/memory.py). None of these
    changes what is computed: a chunked run reaches the same global model as an
    unchunked one up to float32 summation order (tests/models/test_engine_memory.py)."""

    budget_gb: float | None = None  # None: 90 % of the memory available at the start
    cohort_chunk: int | None = None  # devices per local_update call; None: the largest that fits
    private: PrivatePlacement = "auto"  # where the population's private state lives
    state_dir: str | None = None  # folder of the memory-mapped private state (None: the temporary directory)


class SimulationEvents:
    """What a caller may hear about a running simulation (all optional; the CLI
    turns them into the progress display, models/sim/progress.py)."""

    def note(self, text: str) -> None:
        """A one-off message (the memory plan, the setup time)."""

    def round_started(self, round_idx: int, rounds: int) -> None:
        """Round `round_idx` (0-based) of `rounds` begins."""

    def chunk_done(self, round_idx: int, devices_done: int, cohort: int) -> None:
        """Part of a round's cohort is trained (chunked rounds only; round -1:
        part of the initial private state is made)."""

    def round_done(self, rec: Mapping[str, Any], best_round: int | None) -> None:
        """A round's record (as in results.json) and the best validation round so far."""


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
    through `events.note` and the results' "memory" block."""
    t_start = time.perf_counter()
    mem = memory or MemorySettings()
    ev = events or SimulationEvents()
    explicit = model_is_explicit(config.model, config.explicit)
    device = resolve_device(config.device, SimulationConfigError)
    if config.threads:
        torch.set_num_threads(config.threads)
    dp = config.dp  # the config checked its own settings when it was made
    rounds = config.rounds if config.rounds is not None else default_rounds(config.model, explicit)

    x = interactions if interactions is not None else load_interactions(config.dataset, config.data_dir, config.seed)
    split = make_split(x, explicit, config.seed)
    n_users, n_items = split.n_users, split.n_items
    population = _population(config.users, n_users, x.name)
    n_pop = len(population)
    pop_arg = None if config.users is None else population  # evaluation over the population only
    cpr = config.clients_per_round
    if cpr is not None and not 1 <= cpr <= n_pop:
        raise SimulationConfigError(f"--clients-per-round must be in [1, {n_pop}] for {x.name}, got {cpr}")
    cohort_size = n_pop if cpr is None else cpr
    full_cohort = cohort_size == n_pop

    model = build_model(
        config.model,
        explicit=explicit,
        n_users=n_users,
        n_items=n_items,
        item_features=split.item_features,
        overrides=config.params,
    )
    from models.keyed_random import global_init_generator

    gens = _generators(config.seed, device)
    cohorts = _Cohorts(split, population, device)
    with torch.no_grad():
        global_ = {k: v.to(device) for k, v in model.init_global(global_init_generator(config.seed)).items()}
    plan = _plan_memory(
        model, cohorts, global_, mem, n_pop=n_pop, n_items=n_items, cohort=cohort_size, config=config
    )
    ev.note(plan.describe())
    tables = _init_private(model, cohorts, global_, plan, mem, config.seed, ev)

    accountant = None
    if dp is not None and dp.noise > 0:
        from models.privacy import RoundAccountant

        accountant = RoundAccountant(
            noise_multiplier=dp.noise,
            sampling_rate=cohort_size / n_pop,
            delta=dp.delta,
            accountant=dp.accountant,
        )

    secure = SecureAggregator(seed=config.seed, neighbors=config.neighbors) if config.secagg else None
    sel_key, sel_sign = _select_key(explicit)
    best: dict[str, Any] = {"round": None, "value": -math.inf, "global": None}
    records: list[dict[str, Any]] = []
    diverged_at: int | None = None
    t_setup = time.perf_counter() - t_start
    ev.note(f"setup {t_setup:.1f} s: {n_pop} devices, {n_items} items, {cohort_size} devices per round")
    disk_peak = tables.disk_bytes()

    try:
        for r in range(rounds):
            ev.round_started(r, rounds)
            t0 = time.perf_counter()
            rows = None
            if not full_cohort:
                perm = torch.randperm(n_pop, generator=gens["cohort"], device=gens["cohort"].device)
                rows = perm[:cohort_size].sort().values.to(device)
            tables.begin_round(covers_all=full_cohort)
            upd = _train_cohort(
                model, global_, tables, cohorts, rows, plan.chunk, r, config.seed, ev,
                keep_updates=secure is not None or dp is not None or config.plaintext_j_bound is not None,
            )  # fmt: skip
            rec: dict[str, Any] = {"round": r}
            mean: torch.Tensor | None
            if isinstance(upd, _RunningSum):  # plain mean of a chunked round: only the sum was kept
                mean = upd.mean()
            else:
                if dp is not None and upd.shape[1] > 0:
                    from models.privacy import privatize

                    z = dp.noise
                    if dp.mode == "distributed":  # each device 1/B of the variance: the sum gets N(0, (z tau)^2)
                        z = z / math.sqrt(upd.shape[0])
                    upd, norms = privatize(upd, clip=dp.clip, noise_multiplier=z, generator=gens["dp"])
                    rec["update_norm_mean"] = float(norms.mean())
                    rec["clipped_fraction"] = float((norms > dp.clip).float().mean())
                if upd.shape[1] == 0:
                    mean = upd.new_zeros(0)
                elif config.plaintext_j_bound is not None:  # J is fixed at init_private: any buffer has it
                    mean = _hybrid_mean(upd, tables.take(rows)["J"], config, secure, r, rec)
                elif secure is not None:
                    c = _secagg_clip(config)
                    mean = secure.mean(upd, round_idx=r, clip=c)
                    rec.update(secure.last)
                    rec["secagg_clipped_fraction"] = float((upd.abs() > c).sum()) / upd.numel()
                else:
                    mean = upd.mean(0)
            if accountant is not None:
                accountant.step()
            if mean is not None:  # None: no device counted (a hybrid round with too few of either kind)
                global_ = model.apply_mean_update(global_, mean, r)
            tables.end_round()
            del upd
            rec["train_seconds"] = time.perf_counter() - t0

            t1 = time.perf_counter()
            if (r + 1) % config.eval_every == 0 or r == rounds - 1:
                val = evaluate_state(
                    model, global_, tables.take, split, "val", full=config.full_val, placebo=False, device=device,
                    population=pop_arg,
                )
                rec["val"] = val
                v = sel_sign * val.get(sel_key, math.nan)
                if math.isfinite(v) and v > best["value"]:
                    best.update(round=r, value=v)
                    best["global"] = global_  # new tensors every round: safe by reference
                    tables.keep_best()  # never written again (copy on write)
            rec["eval_seconds"] = time.perf_counter() - t1
            rec.update(model.summary(global_, tables.table()))  # e.g. FedRAP's sparsity of C
            tables.release()
            disk_peak = max(disk_peak, tables.disk_bytes())
            rec["seconds"] = time.perf_counter() - t0
            records.append(rec)
            ev.round_done(rec, best["round"])
            if on_round is not None:
                on_round(rec)
            if diverged(global_):  # stop, keeping the best finite round
                diverged_at = r
                ev.note(divergence_note(r, rounds))
                break

        t_train_end = time.perf_counter()
        last_round = rounds - 1 if diverged_at is None else diverged_at
        saved_global = None
        if config.save_global is not None:
            saved_global = str(save_global_state(global_, config.save_global, round_=last_round, seed=config.seed))
        if best["round"] is None:  # every validation value was NaN: fall back to the last round
            best["round"] = last_round
            best["global"] = global_
            tables.keep_best()

        def take_best(rows: torch.Tensor) -> PrivateState:
            return tables.take(rows, "best")

        test = evaluate_state(
            model, best["global"], take_best, split, "test", full=True, placebo=True, device=device,
            population=pop_arg,
        )
        summary_best = model.summary(best["global"], tables.table("best"))
        tables.release()
    finally:
        tables.close()
    seconds_total = time.perf_counter() - t_start

    out: dict[str, Any] = {
        "model": config.model,
        "dataset": x.name,
        "seed": config.seed,
        "kind": "explicit" if explicit else "implicit",
        "n_users": n_users,
        "n_items": n_items,
        "cohort_size": cohort_size,
        "population": n_pop,
        "update_dim": model.update_dim,
        "rounds": records,
        "best_round": best["round"],
        "selection": {"metric": f"val {sel_key}", "higher_is_better": sel_sign > 0},
        "best_val": next(rec["val"] for rec in records if rec["round"] == best["round"] and "val" in rec)
        if any("val" in rec and rec["round"] == best["round"] for rec in records)
        else None,
        "test": _test_block(test, explicit),
        "summary": summary_best,
        "seconds_total": seconds_total,
        "seconds_setup": t_setup,
        "seconds_training": t_train_end - t_start - t_setup,
        "config": asdict(config) | {"rounds": rounds},
        "model_config": model.config(),
        "memory": plan.as_dict() | {"disk_bytes_peak": disk_peak},
        "protocol": _protocol_note(explicit),
    }
    if device_is_cuda(device):  # what the accelerator held at most (the tensors torch allocated)
        out["accelerator"] = {
            "name": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
        }
    if saved_global is not None:
        out["saved_global"] = saved_global
    if diverged_at is not None:
        out["diverged_at_round"] = diverged_at
    if config.plaintext_j_bound is not None:
        plain = sum(rec.get("plaintext_devices", 0) for rec in records)
        chosen = sum(rec.get("secure_devices_chosen", 0) for rec in records)
        counted_sec = sum(rec.get("secure_devices_counted", 0) for rec in records)
        out["hybrid"] = {
            "plaintext_j_bound": config.plaintext_j_bound,
            "plaintext_share": plain / max(plain + chosen, 1),
            "plaintext_contributions": plain,
            "secure_contributions": counted_sec,
            "secure_sat_out": chosen - counted_sec,
            "meaning": "plaintext contributions are UNPROTECTED: the server sees each such device's item-factor "
            "update (D64-D66); no epsilon or secure-aggregation guarantee covers them",
        }
    if not explicit:
        out["placebo"] = {"hr@10": test.get("placebo_hr@10", math.nan), "ndcg@10": test.get("placebo_ndcg@10", math.nan)}
    if dp is not None:
        out["dp"] = {
            "noise_multiplier": config.dp_noise,
            "clip": config.dp_clip,
            "delta": config.dp_delta,
            "accountant": config.dp_accountant,
            "mode": config.dp_mode,
            "sampling_rate": cohort_size / n_pop,
            "rounds": rounds,
            "meaning": (
                "user-level (add/remove one device) epsilon of the Poisson-subsampled Gaussian mechanism "
                "with noise multiplier z and sampling rate q = cohort/population, composed over all rounds "
                "(dp_accounting), for what the aggregated updates reveal; "
                + (
                    "local noise: conservative for the aggregate (it carries noise z*tau*sqrt(B))"
                    if config.dp_mode == "local"
                    else "distributed noise: exact for the sum seen through secure aggregation, "
                    "assuming the devices add their share"
                )
                + "; see models/privacy.py"
            ),
        }
        out["epsilon"] = accountant.epsilon() if accountant is not None else math.inf
    return out


class _RunningSum:
    """The float64 sum of a chunked round's updates (the plain mean needs nothing more)."""

    def __init__(self, dim: int, device: torch.device) -> None:
        self.total = torch.zeros(dim, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, upd: torch.Tensor) -> None:
        self.total += upd.sum(0, dtype=torch.float64)
        self.count += int(upd.shape[0])

    def mean(self) -> torch.Tensor:
        return (self.total / max(self.count, 1)).to(torch.float32)


def _train_cohort(
    model: FederatedRecommender,
    global_: GlobalState,
    tables: PrivateTables,
    cohorts: _Cohorts,
    rows: torch.Tensor | None,
    chunk: int,
    round_idx: int,
    seed: int,
    ev: SimulationEvents,
    *,
    keep_updates: bool,
) -> torch.Tensor | _RunningSum:
    """Train the cohort (`rows` of the population; None: all) `chunk` devices at
    a time, writing the new private rows to `tables`. Returns the (B, update_dim)
    updates, or only their running sum when the round is chunked and
    `keep_updates` is false (the plain mean: no DP, no SecAgg)."""
    n = cohorts.size if rows is None else int(rows.numel())
    dim = model.update_dim
    if chunk >= n:  # one local_update call (rows None: the whole population, by reference in RAM)
        parts = [rows]
    else:
        ids = torch.arange(n, device=cohorts.device) if rows is None else rows
        parts = [ids[s : s + chunk] for s in range(0, n, chunk)]
    out: torch.Tensor | _RunningSum | None = None
    done = 0
    for part in parts:
        data = cohorts.get(part)
        with torch.no_grad():
            new_priv, upd = model.local_update(global_, tables.take(part), data, round_idx, seed)
        b = int(data.users.shape[0])
        if upd.shape != (b, dim):
            raise RuntimeError(f"{model.name}.local_update returned updates of shape {tuple(upd.shape)}")
        tables.put(part, new_priv)
        del new_priv
        if len(parts) == 1:
            return upd
        if out is None:
            out = torch.empty(n, dim, device=upd.device) if keep_updates else _RunningSum(dim, upd.device)
        if isinstance(out, _RunningSum):
            out.add(upd)
        else:
            out[done : done + b] = upd
        done += b
        del upd, data  # not alive during the next chunk's local_update (the plan counts one chunk)
        ev.chunk_done(round_idx, done, n)
    assert out is not None
    return out


def _plan_memory(
    model: FederatedRecommender,
    cohorts: _Cohorts,
    global_: GlobalState,
    mem: MemorySettings,
    *,
    n_pop: int,
    n_items: int,
    cohort: int,
    config: SimulationConfig,
) -> MemoryPlan:
    """Measure the sizes (one device's private state, the data table) and plan
    (models/sim/memory.py); MemoryBudgetError when the budget cannot be met."""
    import shutil
    import tempfile

    one = cohorts.get(torch.zeros(1, dtype=torch.int64, device=cohorts.device))
    with torch.no_grad():
        row = model.init_private(one, global_, config.seed)
    private_bytes = sum(v.element_size() * v[0].numel() for v in row.values())
    data = cohorts.all
    max_history = int(data.lengths.max()) if data.lengths.numel() else 0
    fixed, per = model.train_memory(private_bytes, max_history)
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
        keep_updates=config.secagg or config.dp is not None,
        secagg=config.secagg,
    )
    budget = default_budget() if mem.budget_gb is None else int(mem.budget_gb * 1024**3)
    folder = mem.state_dir if mem.state_dir is not None else tempfile.gettempdir()
    free = shutil.disk_usage(folder).free if Path(folder).exists() else None
    try:
        plan = plan_memory(fp, budget=budget, chunk=mem.cohort_chunk, private=mem.private, disk_free=free)
    except MemoryBudgetError as e:
        raise SimulationConfigError(str(e)) from None
    if plan.private_on_disk and device_is_cuda(cohorts.device):
        raise SimulationConfigError("the private state on disk (memory-mapped) needs --device cpu")
    return plan


def device_is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def _init_private(
    model: FederatedRecommender,
    cohorts: _Cohorts,
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


def _population(users: tuple[int, ...] | None, n_users: int, name: str) -> np.ndarray:
    """Dense user ids (sorted) of the simulated devices; `users` are 1-based numbers."""
    if users is None:
        return np.arange(n_users, dtype=np.int64)
    pop = np.array(sorted(int(u) - 1 for u in users), dtype=np.int64)
    if len(pop) == 0:
        raise SimulationConfigError("--users selects no device")
    if len(np.unique(pop)) != len(pop):
        raise SimulationConfigError("--users lists a user twice")
    if pop[0] < 0 or pop[-1] >= n_users:
        raise SimulationConfigError(f"--users must lie in 1..{n_users} for {name}")
    return pop


def save_global_state(global_: GlobalState, path: str | Path, **meta: Any) -> Path:
    """Write a global state as an .npz of float32 arrays (one per parameter,
    by name) plus `__meta__` (JSON); returns the path."""
    import json

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: v.detach().to("cpu", torch.float32).numpy() for k, v in global_.items()}
    with open(p, "wb") as f:  # np.savez would append .npz to a name without it
        # allow_pickle named (its default) so that no array can be taken for it
        np.savez(f, allow_pickle=True, **arrays, __meta__=np.array(json.dumps(meta)))
    return p


def load_global_state(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of `save_global_state` (without the metadata)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != "__meta__"}


def _test_block(test: Mapping[str, float], explicit: bool) -> dict[str, float]:
    keys = ("rmse", "mae", "n_ratings") if explicit else ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10", "n_users")
    return {k: float(test[k]) for k in keys if k in test}


def _protocol_note(explicit: bool) -> str:
    if explicit:
        return "per-user random split 72/8/20 (train/val/test); best round by validation RMSE; test once at the end"
    return (
        "leave-one-out by time; training negatives drawn every epoch from all items minus the user's training "
        "items; best round by validation HR@10 (99 sampled negatives); test once at the end on the kept state"
    )


SECAGG_DEFAULT_CLIP = 32.0


def _secagg_clip(config: SimulationConfig) -> float:
    """The fixed-point range [-c, c] every device encodes its update in (a public,
    agreed constant): --secagg-clip if given; with DP, tau * (1 + 6 z) (a clipped
    coordinate is at most tau, the noise rarely exceeds 6 std); otherwise 32,
    above every coordinate the tuned models produce (the encoding clips the rare
    larger one; the run records how many were)."""
    if config.secagg_clip is not None:
        return float(config.secagg_clip)
    if config.dp_clip is not None:
        return float(config.dp_clip) * (1.0 + 6.0 * float(config.dp_noise or 0.0))
    return SECAGG_DEFAULT_CLIP


def write_results(results: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write DIR/results.json and DIR/metrics.png; returns their paths."""
    from models.sim.results import plot_metrics, save_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    j = save_json(results, out / "results.json")
    p = plot_metrics(results, out / "metrics.png")
    return j, p
