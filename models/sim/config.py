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
    #: devices per secure-aggregation group (D87): a cohort of 2G or more runs in groups of at
    #: least G; None: secagg.groups.DEFAULT_GROUP_SIZE
    secagg_group_size: int | None = None
    dp_noise: float | None = None
    dp_clip: float | None = None
    dp_delta: float = 1e-5
    dp_accountant: str = "rdp"
    dp_mode: str = "local"  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / |its group|)
    #: discrete-gaussian (D88, models/sim/dp_mechanism.py) or gaussian-float (the float path; epsilon approximate)
    dp_mechanism: str = "discrete-gaussian"
    #: --unmasked-sum (D95): distributed discrete-Gaussian noise summed mod 2^w without SecAgg's masks (which
    #: cancel exactly), each group's noise one draw; for studies that cannot afford the protocol's cost
    unmasked_sum: bool = False
    device: str = "cpu"
    explicit: bool = False
    eval_every: int = 1
    full_val: bool = False
    threads: int | None = None  # torch CPU threads; None: chosen from the machine (models/sim/threads.py)
    data_dir: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    users: tuple[int, ...] | None = None  # the population: 1-based user numbers (None: every user)
    save_global: str | None = None  # write the final global state here (.npz, one array per parameter)
    #: FedMMF hybrid rounds (D64): a device whose privacy indicator J is at most
    #: this sends its update UNPROTECTED (plaintext); None (default): all secure.
    plaintext_j_bound: float | None = None
    #: a checkpoint every this many rounds into `checkpoint_dir`, resumed from there (D93, models/sim/checkpoint.py)
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None

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
        self._check_mechanism()
        if self.unmasked_sum:
            self._check_unmasked_sum()
        elif self.dp_mode == "distributed" and self.dp_noise is not None and not self.secagg:
            raise ConfigError(
                "--dp-mode distributed splits the noise across the cohort: only the sum is private, so it needs --secagg"
                " (or --unmasked-sum, its released sum without the masks' cost)"
            )
        if self.secagg_group_size is not None:
            if not self.secagg:
                raise ConfigError("--group-size splits the secure sum into groups: it needs --secagg")
            if isinstance(self.secagg_group_size, bool) or not (
                isinstance(self.secagg_group_size, int) and self.secagg_group_size >= 2
            ):
                raise ConfigError(f"--group-size must be an int >= 2, got {self.secagg_group_size!r}")
        if self.secagg_clip is not None and not self.secagg_clip > 0:
            raise ConfigError("--secagg-clip must be > 0")
        if self.eval_every < 1:
            raise ConfigError("--eval-every must be >= 1")
        if (self.checkpoint_every is None) != (self.checkpoint_dir is None):
            raise ConfigError("--checkpoint-every K and --checkpoint-dir DIR go together")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ConfigError("--checkpoint-every must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, not {self.threads}")
        if self.plaintext_j_bound is not None:
            from models.sim.hybrid import check_bound

            if self.model != "fedmmf":
                raise ConfigError("--plaintext-j-bound is FedMMF's policy (its privacy indicator J): --model fedmmf")
            if self.dp_noise is not None and self.dp_mode == "distributed":
                raise ConfigError(
                    "--plaintext-j-bound cannot be combined with --dp-mode distributed: a plaintext update carries "
                    "only its 1/cohort share of the noise, so no epsilon would cover it"
                )
            if self.dp_noise is not None and self.dp_mechanism == "discrete-gaussian":
                raise ConfigError("--plaintext-j-bound runs with --dp-mechanism gaussian-float (its plaintext updates "
                                  "are outside every epsilon anyway; the hybrid sum of residues is not built)")
            try:
                check_bound(self.plaintext_j_bound)
            except ValueError as e:
                raise ConfigError(f"--plaintext-j-bound: {e}") from e

    def _check_unmasked_sum(self) -> None:
        """--unmasked-sum computes what the secure sum releases, without masks: only for distributed
        discrete-Gaussian noise, and not beside --secagg (which would run the masks after all)."""
        if self.secagg:
            raise ConfigError("--unmasked-sum replaces --secagg's masked sum by the same sum unmasked: use one of them")
        if self.dp_noise is None or self.dp_mode != "distributed" or self.dp_mechanism != "discrete-gaussian":
            raise ConfigError("--unmasked-sum sums the devices' discrete-Gaussian shares: it needs --dp-noise, --dp-clip "
                              "and --dp-mode distributed with --dp-mechanism discrete-gaussian")

    def _check_mechanism(self) -> None:
        """--dp-mechanism: a known name; the discrete Gaussian needs noise
        (z > 0) and the RDP accountant (its bound is zCDP)."""
        if self.dp_mechanism not in _DP_MECHANISMS:
            raise ConfigError(f"--dp-mechanism must be discrete-gaussian or gaussian-float, not {self.dp_mechanism!r}")
        if self.dp_noise is None or self.dp_mechanism != "discrete-gaussian":
            return
        if not self.dp_noise > 0:
            raise ConfigError("--dp-mechanism discrete-gaussian needs --dp-noise > 0")
        if self.dp_accountant != "rdp":
            raise ConfigError("--dp-accountant pld prices the continuous Gaussian; the discrete Gaussian's bound is "
                              "zCDP, composed with --dp-accountant rdp")

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
            mechanism=_DP_MECHANISMS[self.dp_mechanism],
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
DPMechanism = Literal["discrete-gaussian", "gaussian-float"]
_DP_MECHANISMS: dict[str, DPMechanism] = {"discrete-gaussian": "discrete-gaussian", "gaussian-float": "gaussian-float"}
_GRAPHS: dict[str, Literal["all", "auto"]] = {"all": "all", "auto": "auto"}


@dataclass(frozen=True)
class DPSettings:
    """Differential privacy of a simulation, as checked by SimulationConfig:
    noise multiplier z >= 0, clip norm tau > 0."""

    noise: float
    clip: float
    delta: float
    accountant: Accountant
    mode: DPMode  # local: every device adds N(0,(z tau)^2); distributed: N(0,(z tau)^2 / |its group|)
    mechanism: DPMechanism = "discrete-gaussian"  # D88; gaussian-float: the float path (epsilon approximate)


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
