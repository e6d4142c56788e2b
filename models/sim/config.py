"""A simulation's settings: `SimulationConfig` (what `fedmask simulate`'s
flags ask for, checked when made), its differential-privacy part
`DPSettings`, and `MemorySettings` (how it may use memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from models.registry import ConfigError
from models.sim.memory import PrivatePlacement

if TYPE_CHECKING:
    from models.privacy import Accountant
    from secagg.config import Neighbors


@dataclass(frozen=True)
class SimulationConfig:
    model: str
    dataset: str = "ml-100k"
    seed: int = 0
    rounds: int | None = None  # None: the model's tuned default (DEFAULT_ROUNDS)
    clients_per_round: int | None = None  # None: every user, every round
    secagg: bool = False
    secagg_neighbors: int | str | None = None  # SecAgg+ graph degree, or 'all'; None: 'auto' (SecAgg+)
    secagg_clip: float | None = None  # fixed-point range [-c, c]; None: see secagg_clip
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
        """Refuse settings that cannot run (ConfigError, user-facing
        message); what needs the data (the population, --clients-per-round)
        or the machine (--device) is checked by `simulate`."""
        if (self.dp_noise is None) != (self.dp_clip is None):
            raise ConfigError("differential privacy needs both --dp-noise Z and --dp-clip TAU")
        if self.dp_noise is not None and self.dp_clip is not None and (self.dp_clip <= 0 or self.dp_noise < 0):
            raise ConfigError("--dp-clip must be > 0 and --dp-noise >= 0")
        if self.rounds is not None and self.rounds < 1:
            raise ConfigError("--rounds must be >= 1")
        if self.dp_mode not in _DP_MODES:
            raise ConfigError(f"--dp-mode must be local or distributed, not {self.dp_mode!r}")
        if self.dp_accountant not in _ACCOUNTANTS:
            raise ConfigError(f"--dp-accountant must be rdp or pld, not {self.dp_accountant!r}")
        if self.dp_mode == "distributed" and self.dp_noise is not None and not self.secagg:
            raise ConfigError(
                "--dp-mode distributed splits the noise across the cohort: only the sum is private, so it needs --secagg"
            )
        if self.secagg_clip is not None and not self.secagg_clip > 0:
            raise ConfigError("--secagg-clip must be > 0")
        if self.eval_every < 1:
            raise ConfigError("--eval-every must be >= 1")
        if self.plaintext_j_bound is not None:
            from models.sim.hybrid import check_bound

            if self.model != "fedmmf":
                raise ConfigError("--plaintext-j-bound is FedMMF's policy (its privacy indicator J): --model fedmmf")
            if self.dp_noise is not None and self.dp_mode == "distributed":
                raise ConfigError(
                    "--plaintext-j-bound cannot be combined with --dp-mode distributed: a plaintext update carries "
                    "only its 1/cohort share of the noise, so no epsilon would cover it"
                )
            try:
                check_bound(self.plaintext_j_bound)
            except ValueError as e:
                raise ConfigError(f"--plaintext-j-bound: {e}") from e

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
        raise ConfigError(f"--secagg: neighbors must be 'all', 'auto' or an int, got {n!r}")


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


@dataclass(frozen=True)
class MemorySettings:
    """How the simulator may use memory (models/sim/memory.py). None of these
    changes what is computed: a chunked run reaches the same global model as an
    unchunked one up to float32 summation order (tests/models/test_engine_memory.py),
    and so does a state kept sparsely (D89, tests/models/test_sparse_engine.py)."""

    budget_gb: float | None = None  # None: 90 % of the memory available at the start
    cohort_chunk: int | None = None  # devices per local_update call; None: the largest that fits
    private: PrivatePlacement = "auto"  # how the population's private state is kept (sparse: D89)
    state_dir: str | None = None  # folder of the memory-mapped private state (None: the temporary directory)
