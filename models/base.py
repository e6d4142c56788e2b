"""The one interface every federated recommender implements.

A model is a bundle of pure, *batched* functions over torch tensors. The
engine (simulation) and the edge client (real devices) both call exactly these
functions; the only difference is where the private state is stored.

Vocabulary:
- global state: parameters the server holds and broadcasts (e.g. FedRAP's C).
- private state: per-device parameters that never leave the device (u_i, D_i,
  p_u, mask models...). Stored batched: every tensor has a leading user axis.
  The engine keeps one PrivateState for all users and gathers/scatters cohort
  rows with `take_rows` / `put_rows`.
- update: the flat float32 vector a device sends for aggregation, shape
  (B, update_dim) for a cohort of B devices. DP clipping/noise and secure
  aggregation act on it; the model never sees masks.
- seed: the federation's seed. Every per-device random draw (initial private
  parameters, training negatives, mini-batch order) is keyed by (seed, round,
  user id, purpose, index) through `models/keyed_random.py`, never drawn from a
  shared stream, so a device gets the same numbers in any batch, in any order,
  in `fedmask simulate` and on an edge client. Only `init_global` (run once, by
  the server) takes a generator (`keyed_random.global_init_generator(seed)`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

GlobalState = dict[str, torch.Tensor]
PrivateState = dict[str, torch.Tensor]  # every tensor: leading axis = user


def take_rows(state: PrivateState, rows: torch.Tensor) -> PrivateState:
    """The cohort's slice of a batched private state (copies)."""
    return {k: v.index_select(0, rows) for k, v in state.items()}


def put_rows(state: PrivateState, rows: torch.Tensor, part: PrivateState) -> None:
    """Write a cohort's slice back in place."""
    for k, v in part.items():
        state[k].index_copy_(0, rows, v)


@dataclass(frozen=True)
class CohortData:
    """The local training data of a cohort of B devices, padded.

    Implicit models: `items[b, :lengths[b]]` are device b's training positives.
    Explicit models: the same plus `ratings[b, :lengths[b]]`.
    `users` are the dense user ids (for features); padding entries are 0 and
    must be ignored via `lengths` / `mask`.
    """

    users: torch.Tensor  # int64 (B,)
    items: torch.Tensor  # int64 (B, Lmax)
    mask: torch.Tensor  # bool (B, Lmax)
    lengths: torch.Tensor  # int64 (B,)
    ratings: torch.Tensor | None = None  # float32 (B, Lmax)


@dataclass(frozen=True)
class LocalRound:
    """What one call of local training is given: the round's global state (read
    only), the cohort's private rows and data, the round index and the
    federation's seed (see the module doc for how draws are keyed by them)."""

    global_: GlobalState
    private: PrivateState
    data: CohortData
    round_idx: int
    seed: int
    #: Tables the model may write its new private rows into and return (a state no
    #: one keeps, shaped like `private`; it may be `private` itself, so every element
    #: must be read before it is written), and a (B, update_dim) table it may write
    #: its updates into; None: allocate. Memory already mapped spares a round the
    #: page faults of fresh outputs (D97); a model may ignore both.
    spare: PrivateState | None = None
    spare_updates: torch.Tensor | None = None
    #: A float64 (update_dim,) sum, given only to a model whose `sums_updates()` is
    #: true and only in a plain round (no DP, no SecAgg, one process): the model adds
    #: its devices' updates into it and returns updates of shape (B, 0) (D102).
    sum_into: torch.Tensor | None = None


def diverged(state: dict[str, torch.Tensor]) -> bool:
    """True when any parameter holds a NaN or an infinity: no later round can recover from it."""
    return not all(bool(torch.isfinite(v).all()) for v in state.values())


def divergence_note(round_idx: int, rounds: int) -> str:
    """What a simulation says when it stops at a diverged round."""
    return (
        f"round {round_idx}: the global model is no longer finite (training diverged, e.g. a learning rate or "
        f"regulariser too large); stopping after {round_idx + 1} of {rounds} rounds, keeping the best validation "
        "round before it"
    )


def take_cohort(data: CohortData, rows: torch.Tensor) -> CohortData:
    """The rows `rows` of a padded cohort, trimmed to their longest history."""
    lengths = data.lengths.index_select(0, rows)
    lmax = int(lengths.max()) if rows.numel() else 0
    return CohortData(
        users=data.users.index_select(0, rows),
        items=data.items.index_select(0, rows)[:, :lmax],
        mask=data.mask.index_select(0, rows)[:, :lmax],
        lengths=lengths,
        ratings=None if data.ratings is None else data.ratings.index_select(0, rows)[:, :lmax],
    )


def resolve_device(name: str, error: type[Exception] = ValueError) -> torch.device:
    """"cpu" or "cuda[:N]" as a torch device; raises `error` (a caller's
    user-facing error class, ValueError by default) for another name or a CUDA
    device on a machine without one."""
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise error(f"--device {name} requested but CUDA is not available on this machine")
        return torch.device(name)
    raise error(f"unknown --device {name!r}; use cpu or cuda")


class FederatedRecommender(ABC):
    """Hyperparameters live on the instance; state lives in the dicts."""

    name: ClassVar[str]
    kind: ClassVar[Literal["implicit", "explicit"]]

    @property
    @abstractmethod
    def update_dim(self) -> int:
        """Length of the flat update each device sends."""

    @abstractmethod
    def init_global(self, generator: torch.Generator) -> GlobalState:
        """The server's initial parameters."""

    @abstractmethod
    def init_private(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        """Initial private state for the devices in `data` (all users at once
        in simulation). May train device-local models first (FedMMF's masks).
        Row b depends only on (seed, data.users[b], its data, global_)."""

    @abstractmethod
    def local_update(self, job: LocalRound) -> tuple[PrivateState, torch.Tensor]:
        """Train the cohort locally; return its new private state and the
        (B, update_dim) updates to aggregate. Must not modify `job.global_`.
        Row b depends only on (seed, round_idx, data.users[b], its data and
        private rows, global_): never on the other rows of the batch."""

    @abstractmethod
    def apply_mean_update(
        self, global_: GlobalState, mean_update: torch.Tensor, round_idx: int
    ) -> GlobalState:
        """Server step: the new global state from the mean of the survivors' updates."""

    @abstractmethod
    def score(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """Scores (B, K) of `items` (B, K) for the B devices whose private
        state is `private`. Higher is better (implicit) or a predicted rating
        (explicit). Computed on the device."""

    # ------------------------------------------------------------ optional, with defaults

    def gathered_tables(self) -> tuple[str, ...]:
        """Private tables with an item axis, (B, m, ...), that `score` reads
        only at the scored items: an evaluator may gather them there itself
        and call `score_gathered` (the simulator does: a device's whole table
        is m rows, a validation list 101). None by default."""
        return ()

    def score_gathered(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """`score`, with each table of `gathered_tables()` already taken at
        `items` (B, K, ...): the same scores, bit for bit."""
        raise NotImplementedError(f"{type(self).__name__} gathers no table")

    def score_all(self, global_: GlobalState, private: PrivateState, users: torch.Tensor,
                  scratch: dict[str, torch.Tensor] | None = None) -> torch.Tensor | None:
        """Scores (B, m) of every item for the B devices whose private state
        is `private` (whole rows), equal to `score` at items 0..m-1 bit for
        bit, without gathering the tables item by item (a full ranking); None
        when the model has no faster way than `score` (the default).
        `scratch`: the caller's dict, kept for one evaluation, where the model
        may keep working buffers between batches."""
        return None

    #: The attributes holding the hyperparameters recorded with a run's results, in that order.
    config_keys: ClassVar[tuple[str, ...]] = ()

    def config(self) -> dict[str, object]:
        """The hyperparameters recorded with a run's results: the attributes `config_keys`."""
        return {key: getattr(self, key) for key in self.config_keys}

    def summary(self, global_: GlobalState, private: PrivateState) -> dict[str, float]:
        """Statistics recorded after every round (default: none). `private` is
        the whole population's state; in the simulator it may be memory-mapped,
        so a summary should read only small tables (e.g. FedMMF's J)."""
        return {}

    def zero_at_init(self) -> tuple[str, ...]:
        """Private tables that `init_private` sets to +0.0 for every device. On
        disk the simulator writes their rows only once a device has trained (its
        files are sparse) and plans their disk for the devices that can train
        (models/sim/private_tables.py). None by default."""
        return ()

    def sums_updates(self) -> bool:
        """Whether `local_update` honours `LocalRound.sum_into` (D102). Default: no."""
        return False

    def train_memory(self, private_bytes: int, max_history: int, *, in_place: bool = False,
                     summed: bool = False) -> tuple[int, int]:
        """(fixed, per_device): an upper estimate of the bytes `local_update`
        holds at once for a cohort of B devices, fixed + B * per_device,
        counting its inputs (the cohort's private rows, `private_bytes` per
        device), outputs (new rows, the B x update_dim updates) and temporaries;
        `max_history` is the longest training history of the cohort. `in_place`:
        the whole population's rows are given by reference with themselves as
        `LocalRound.spare`; `summed`: the updates go to `LocalRound.sum_into`. A
        model that uses neither may ignore them. The simulator plans its memory
        with it (models/sim/memory.py). The default is generic (four copies of
        the private rows, three of the update, 64 bytes per history entry); a
        model with large temporaries overrides it."""
        return 0, 4 * private_bytes + 12 * self.update_dim + 64 * max_history
