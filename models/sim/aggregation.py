"""One round's aggregation in the simulator: from the cohort's updates to the
mean the server applies. Device-side DP (clip and noise, `models/privacy.py`)
first, then the plain mean, the in-process SecAgg(+) sum, or FedMMF's hybrid
round (D64); a chunked plain round keeps only a running sum. Under the
discrete Gaussian (D88) the round is `models.sim.dp_mechanism`'s: the
mechanism's own encoding, noise and decoding, through SecAgg(+) with
--secagg. Its updates are fed to it as the chunks train (`dp_stream`), and
so are SecAgg's without DP (`SecureStream`, D100): the chunks are cut group
by group and each group's secure sum runs once its last update came, so
the cohort's (B, D) table is never held; a simulation rank feeds its own
devices' groups the same way (`models.sim.rank_round`), and the float
Gaussian (`gaussian-float`) its own stream (`models.sim.float_dp_stream`,
D106), and FedMMF's hybrid round its split (`models.sim.hybrid_stream`,
D107)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch

from models.registry import ConfigError
from models.sim.config import SimulationConfig

if TYPE_CHECKING:
    from models.sim.dp_mechanism import DiscreteGaussianSum
    from models.sim.float_dp_stream import FloatGaussianSum
    from models.sim.hybrid_stream import HybridSplit

    #: a round's DP sum fed as the chunks train (`round_streams`)
    DPStream = DiscreteGaussianSum | FloatGaussianSum
    #: a round's secure sum or FedMMF's hybrid split, fed as the chunks train without DP
    RowStream: TypeAlias = "SecureStream | HybridSplit"
    from secagg.config import Neighbors, SecAggConfig
    from secagg.group_stream import GroupStream
    from secagg.grouped_round import GroupedOutcome


class SecureAggregator:
    """Aggregation through the real SecAgg(+) protocol, run in process: every
    device encodes its update to fixed point, runs its own client states
    (keys, Shamir shares, pairwise and self masks) and the server states
    unmask only the sum. A cohort of 2G devices or more (G = `group_size`)
    is split into groups (`secagg.groups.partition`, D87), one instance
    each, whose sums are added and decoded once with the encoding of the
    whole cohort; a smaller cohort is one group. Every round goes through
    `secagg.group_stream.GroupStream` (D100), fed a chunk at a time or the
    whole table at once: the sums of `run_grouped_round`, or of `run_round`
    for one group, bit for bit. Configs are kept per (instance size, cohort size,
    length, clip, group), reused across rounds (the round index is bound
    into every key)."""

    def __init__(self, *, seed: int, neighbors: Neighbors, group_size: int | None = None) -> None:
        from secagg.groups import DEFAULT_GROUP_SIZE

        self.seed = seed
        self.neighbors = neighbors
        self.group_size = DEFAULT_GROUP_SIZE if group_size is None else group_size
        self.session_id = f"fedmask-sim-seed-{seed}".encode()
        self._configs: dict[tuple[int, int, int, float, int | None], SecAggConfig] = {}
        self.last: dict[str, Any] = {}

    def partition(self, n: int, round_idx: int) -> tuple[tuple[int, ...], ...]:
        """The groups of round `round_idx`'s n devices (rows 0..n-1): one
        group below 2G, else balanced groups of at least G."""
        from secagg.groups import partition, partition_seed

        if n < 2:
            raise ConfigError("--secagg needs at least 2 devices per round")
        return partition(range(n), group_size=self.group_size, seed=partition_seed(self.session_id, round_idx))

    def config(self, n: int, length: int, clip: float, *, cohort: int | None = None,
               group: int | None = None) -> SecAggConfig:
        """The instance of n devices: the whole cohort (`group` None), or
        group `group` of a cohort of `cohort` devices, with the cohort's
        encoding and the group's session id."""
        from secagg import SecAggConfig, SecAggConfigError
        from secagg.groups import group_session_id

        key = (n, cohort or n, length, clip, group)
        if key not in self._configs:
            session = self.session_id if group is None else group_session_id(self.session_id, group)

            def create(neighbors: Neighbors) -> SecAggConfig:
                return SecAggConfig.create(
                    num_clients=n, vector_length=length, session_id=session, clip=clip, neighbors=neighbors,
                    encoding_clients=cohort,
                )

            try:
                cfg = create(self.neighbors)
            except SecAggConfigError as e:
                if self.neighbors != "auto":
                    raise ConfigError(f"--secagg: {e}") from e
                # too few devices for SecAgg+'s failure targets: the complete graph (Bonawitz)
                cfg = create("all")
            self._configs[key] = cfg
        return self._configs[key]

    def mean(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        return self.sum(updates, round_idx=round_idx, clip=clip) / updates.shape[0]

    def stream(self, n: int, length: int, *, round_idx: int, clip: float) -> GroupStream:
        """Round `round_idx`'s secure sum of n devices fed a piece at a time
        (D100): the same groups, configs and seeds as `sum`, so the same sum
        bit for bit, with one group's rows held at a time when fed in
        `GroupStream.order()`."""
        from secagg.group_stream import GroupStream

        groups = self.partition(n, round_idx)
        if len(groups) == 1:
            configs = [self.config(n, length, clip)]
        else:
            configs = [self.config(len(g), length, clip, cohort=n, group=j) for j, g in enumerate(groups)]
        # wire=False: in one process the messages are handed over as objects instead of
        # being serialised and parsed; every cryptographic step of every device and of the
        # server still runs (serialisation is ~14 % of a 943-device round and is covered by
        # the secagg tests and `fedmask bench round`, which use the real wire format).
        return GroupStream(groups=groups, configs=configs, vector_length=length, round_idx=round_idx,
                           seed=self.seed * 1_000_003 + round_idx, wire=False)

    def finish(self, stream: GroupStream, round_idx: int) -> GroupedOutcome:
        """A streamed round's outcome (every device's input added), its figures
        in `last` (results.json's round record). RuntimeError when a group
        aborted (no dropouts here: never for an honest in-process round)."""
        out = stream.finish()
        failed = [j for j, o in enumerate(out.outcomes) if not o.ok]
        if failed or out.encoded_sum is None:
            o = out.outcomes[failed[0]] if failed else out.outcomes[0]
            raise RuntimeError(f"secure aggregation aborted in round {round_idx}, group {failed[:1]}: "
                               f"{o.abort_reason} {o.abort_detail}")
        self.last = {
            "secagg_graph": "; ".join(sorted({c.describe() for c in stream.configs})),
            "secagg_groups": len(out.groups),
            "secagg_counted": len(out.counted),
            "secagg_exact": bool(out.exact),
            "secagg_wall_s": float(out.wall_s),
            "secagg_rows_held_peak": stream.peak_rows_held,  # the most inputs waiting at once
        }
        if len(out.groups) > 1:
            self.last["secagg_group_sizes"] = [len(g) for g in out.groups]
        return out

    def sum(self, updates: torch.Tensor, *, round_idx: int, clip: float) -> torch.Tensor:
        """The decoded exact sum of the devices' encoded updates (all counted:
        no dropouts here), the whole table fed to `stream` at once."""
        n, length = updates.shape
        stream = self.stream(n, length, round_idx=round_idx, clip=clip)
        stream.add(np.arange(n), updates.detach().to("cpu", torch.float32).numpy())
        out = self.finish(stream, round_idx)
        assert out.sum is not None  # float inputs are decoded
        return torch.as_tensor(np.asarray(out.sum, dtype=np.float32), device=updates.device)


def plain_mean(config: SimulationConfig) -> bool:
    """Whether a round's server needs only the plain sum of the updates: no DP,
    no SecAgg, no hybrid round (else every update goes through the mechanism)."""
    return not config.secagg and config.dp is None and config.plaintext_j_bound is None


def streams_dp(config: SimulationConfig) -> bool:
    """Whether a round's updates go to a DP sum as they are trained
    (`round_streams`), not kept as the cohort's table: DP under either
    mechanism (D100, D106), through the secure sum or not, FedMMF's hybrid
    round included (its float-Gaussian rows handed on to the split, D107)."""
    return config.dp is not None


def streams_secure(config: SimulationConfig) -> bool:
    """Whether a round without DP feeds its updates as they are trained to
    the secure sum (`SecureStream`, D100; on a rank its own devices' groups,
    D105) or to FedMMF's hybrid split (D107), not kept as the cohort's table."""
    return config.dp is None and (config.secagg or config.plaintext_j_bound is not None)


def stream_working_bytes(config: SimulationConfig, update_dim: int, cohort: int, *, ranked: bool = False) -> int:
    """What the memory plans add for a round's stream: a `dp_stream`'s working
    set (`models.sim.dp_mechanism.stream_bytes`), or a `SecureStream`'s (the
    largest group's rows, with the in-process round's encodings and masks);
    0 when the round keeps no such sum or has nothing to send. `ranked`:
    `cohort` bounds a simulation rank's share of the cohort (D93)."""
    if update_dim <= 0:
        return 0
    from models.sim.memory import SECAGG_BYTES_PER_COORD

    hybrid = config.plaintext_j_bound is not None  # a float64 sum, and the secure devices' groups (any count)
    ranked = ranked or (hybrid and config.secagg)
    extra = 8 * update_dim if hybrid else 0
    if config.dp is not None and config.dp.mechanism == "gaussian-float":  # streams_dp: any DP
        # two float64 running sums, and with SecAgg the secure stream's group (its noisy float rows)
        held = _largest_group(config, cohort, ranked=ranked) * update_dim if config.secagg else 0
        return extra + 16 * update_dim + held * (4 + SECAGG_BYTES_PER_COORD)
    if streams_dp(config):
        from dpmech.rotation import padded_dimension
        from models.sim.dp_mechanism import stream_bytes

        held = _largest_group(config, cohort) * padded_dimension(update_dim) if config.secagg else 0
        return stream_bytes(update_dim) + held * (4 + SECAGG_BYTES_PER_COORD)  # its residues, with SecAgg
    if streams_secure(config):
        held = _largest_group(config, cohort, ranked=ranked) if config.secagg else 0
        return extra + held * update_dim * (4 + SECAGG_BYTES_PER_COORD)
    return 0


def _largest_group(config: SimulationConfig, cohort: int, *, ranked: bool = False) -> int:
    """The most devices in one of a round's secure-aggregation groups (`secagg.groups.partition`).
    `ranked`: `cohort` bounds a rank's share, which changes from round to round; a share of
    k < 2G devices is one group of k, and groups of larger shares hold fewer than 1.5G, so
    the bound over every share up to `cohort` is min(cohort, 2G - 1)."""
    from secagg.groups import DEFAULT_GROUP_SIZE, group_count

    g = DEFAULT_GROUP_SIZE if config.secagg_group_size is None else config.secagg_group_size
    if ranked:
        return min(cohort, 2 * g - 1)
    return -(-cohort // group_count(cohort, g)) if cohort >= 2 else cohort


class SecureStream:
    """A round's secure sum fed the cohort's updates a chunk at a time (D100):
    SecAgg(+) in groups (`SecureAggregator.stream`), each group's instance
    run when its last device's update arrives. `order()` is the order to
    train the cohort in (group by group) so that one group's rows are held;
    `mean` is what `SecureAggregator.mean` gives for the whole table, bit
    for bit."""

    def __init__(self, secure: SecureAggregator, devices: int, dim: int, *, round_idx: int, clip: float,
                 inner: GroupStream | None = None) -> None:  # fmt: skip
        """`inner`: the groups to feed (default: the whole cohort's, `SecureAggregator.stream`;
        a simulation rank passes its own devices' groups, `models.sim.rank_round`)."""
        self.secure, self.devices, self.dim, self.clip, self.round_idx = secure, devices, dim, clip, round_idx
        self.inner = secure.stream(devices, dim, round_idx=round_idx, clip=clip) if inner is None else inner
        self.clipped = 0  # coordinates beyond the encoding's range (it clips them)
        self.device = torch.device("cpu")  # where the rows came from (the mean goes back there)

    def order(self) -> np.ndarray:
        return self.inner.order()

    def add(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """The updates (b, D) of the cohort's positions `positions`."""
        self.device = rows.device
        x = rows.detach().to("cpu", torch.float32)
        for a in range(0, x.shape[0], 64):  # a few rows at a time: no temporaries of the chunk's size
            self.clipped += int((x[a:a + 64].abs() > self.clip).sum())
        self.inner.add(positions.cpu().numpy(), x.numpy())

    @property
    def counted(self) -> int:
        """The devices its sum counts: all (no dropouts in a simulated round)."""
        return self.devices

    def total(self, rec: dict[str, Any]) -> np.ndarray:
        """Once every device's update came: the decoded sum (float64), the
        round's figures recorded in `rec`."""
        out = self.secure.finish(self.inner, self.round_idx)
        assert out.sum is not None  # float inputs are decoded
        rec.update(self.secure.last)
        rec["secagg_clipped_fraction"] = self.clipped / max(self.devices * self.dim, 1)
        return np.asarray(out.sum, dtype=np.float64)

    def mean(self, rec: dict[str, Any]) -> torch.Tensor:
        total = torch.as_tensor(self.total(rec).astype(np.float32), device=self.device)
        return total / self.devices


def round_streams(config: SimulationConfig, secure: SecureAggregator | None, devices: int, dim: int,
                  round_idx: int, generator: torch.Generator,
                  cohort_J: Callable[[], torch.Tensor]) -> tuple[DPStream | None, RowStream | None]:  # fmt: skip
    """What one process feeds a round's updates to as its chunks train: (the
    DP sum, or the secure sum or FedMMF's hybrid split without DP); (None,
    None) for a plain round. `cohort_J`: the cohort's privacy indicators
    (a hybrid round's split is known before it trains: J is fixed at
    init_private)."""
    split = None
    if config.plaintext_j_bound is not None:
        split = hybrid_split(config, secure, cohort_J(), dim, round_idx)
    if config.dp is not None:
        return dp_stream(config, secure, devices, dim, round_idx, generator, split=split), None
    if split is not None:
        return None, split
    if secure is not None:
        return None, SecureStream(secure, devices, dim, round_idx=round_idx, clip=secagg_clip(config))
    return None, None


def hybrid_split(config: SimulationConfig, secure: SecureAggregator | None, J: torch.Tensor, dim: int,
                 round_idx: int) -> HybridSplit:  # fmt: skip
    """FedMMF's hybrid round (D64, D107): devices with J <= the bound add their
    update in the clear, the others through the secure sum over their own
    devices (the in-process SecAgg with --secagg, else the plain sum), when
    at least `models.sim.hybrid.SECURE_FLOOR` chose it."""
    from models.sim.hybrid import SECURE_FLOOR, plaintext_choice
    from models.sim.hybrid_stream import HybridSplit

    plain = plaintext_choice(J, config.plaintext_j_bound).cpu().numpy()
    n_secure = int((~plain).sum())
    rows = (SecureStream(secure, n_secure, dim, round_idx=round_idx, clip=secagg_clip(config))
            if secure is not None and n_secure >= SECURE_FLOOR else None)  # fmt: skip
    return HybridSplit(plain, dim, secure=rows, count_secure=n_secure >= SECURE_FLOOR)


def dp_stream(config: SimulationConfig, secure: SecureAggregator | None, devices: int, dim: int,
              round_idx: int, generator: torch.Generator, *, split: HybridSplit | None = None) -> DPStream:
    """The round's DP sum, to be fed the cohort's updates: the discrete
    Gaussian's (`models.sim.dp_mechanism`, D88) or the float Gaussian's
    (`models.sim.float_dp_stream`, D106; its noise from `generator`), the
    devices' shares calibrated to the secure sum's groups (one group
    without a secure sum). A hybrid round (`split`) runs the float
    Gaussian over one group in the split's order and hands it the rows."""
    from models.sim.dp_mechanism import DiscreteGaussianSum
    from models.sim.float_dp_stream import FloatGaussianSum

    assert config.dp is not None
    if split is not None:
        return FloatGaussianSum(devices, dim, dp=config.dp, groups=(tuple(split.order().tolist()),),
                                generator=generator, secure=split)  # fmt: skip
    groups: tuple[tuple[int, ...], ...] = (tuple(range(devices)),)
    if secure is not None and devices >= 2:
        groups = secure.partition(devices, round_idx)
    if config.dp.mechanism == "gaussian-float":
        rows = (SecureStream(secure, devices, dim, round_idx=round_idx, clip=secagg_clip(config))
                if secure is not None else None)  # fmt: skip
        return FloatGaussianSum(devices, dim, dp=config.dp, groups=groups, generator=generator, secure=rows)
    return DiscreteGaussianSum(devices, dim, dp=config.dp, groups=groups, seed=config.seed, round_idx=round_idx,
                               secure=secure, one_draw_per_group=config.unmasked_sum)


def dp_mean(stream: DPStream, *, config: SimulationConfig, rec: dict[str, Any]) -> torch.Tensor | None:
    """The mean the server applies under DP (either mechanism), from a
    `dp_stream` fed every device's update: the sum over the devices it
    counts (None when none is, a hybrid round's only)."""
    dp = config.dp
    assert dp is not None
    total, norms64, rec["dp"], secured = stream.finish()
    rec.update(secured)
    norms = norms64.to(torch.float32)
    rec["update_norm_mean"] = float(norms.mean())
    rec["clipped_fraction"] = float((norms > dp.clip).float().mean())
    if not stream.counted:
        return None
    return total.to(device=stream.device, dtype=torch.float32) / stream.counted


def sum64(rows: torch.Tensor) -> torch.Tensor:
    """The float64 sum of a (B, d) float32 table's rows. On the CPU it is taken row by
    row: torch's casting reduction (`sum(0, dtype=float64)`) was 8-19 times slower on
    1,000 rows of ML-1M's 118,592 coordinates (D97). Both orders give the same sum whenever
    the float64 sum is exact, which it is unless the rows span more than 53 bits
    of magnitude; the mean's float32 value is the same in practice."""
    if rows.device.type != "cpu" or rows.shape[0] < 2:
        return rows.sum(0, dtype=torch.float64)
    total = rows[0].to(torch.float64)
    for row in rows[1:]:
        total += row
    return total


class RunningSum:
    """The float64 sum of a chunked round's updates (the plain mean needs nothing more)."""

    def __init__(self, dim: int, device: torch.device) -> None:
        self.total = torch.zeros(dim, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, upd: torch.Tensor) -> None:
        self.total += sum64(upd)
        self.count += int(upd.shape[0])

    def mean(self) -> torch.Tensor:
        return (self.total / max(self.count, 1)).to(torch.float32)


SECAGG_DEFAULT_CLIP = 32.0


def secagg_clip(config: SimulationConfig) -> float:
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


def aggregate_round(
    upd: torch.Tensor | RunningSum,
    *,
    config: SimulationConfig,
    secure: SecureAggregator | None,
    dp_generator: torch.Generator,
    cohort_J: Callable[[], torch.Tensor],
    round_idx: int,
    rec: dict[str, Any],
) -> torch.Tensor | None:
    """The mean update the server applies in round `round_idx`, from the
    cohort's (B, update_dim) updates at once or a chunked plain round's
    running sum: the table is fed to the round's streams (`round_streams`:
    DP, the secure sum, FedMMF's hybrid split), the same result bit for bit
    as a round that fed them chunk by chunk in their order; else the plain
    mean. None when no device is counted (a hybrid round). Records what it
    did in `rec` (results.json's round record)."""
    if isinstance(upd, RunningSum):  # plain mean of a chunked round: only the sum was kept
        return upd.mean()
    if upd.shape[1] == 0:
        return upd.new_zeros(0)
    B = int(upd.shape[0])
    stream, rows = round_streams(config, secure, B, int(upd.shape[1]), round_idx, dp_generator, cohort_J)
    if stream is not None:
        stream.add(upd, np.arange(B))
        return dp_mean(stream, config=config, rec=rec)
    if rows is not None:
        rows.add(upd, torch.arange(B))
        return rows.mean(rec)
    # summed in float64 like a chunked round's RunningSum: the mean does not depend on the order or chunking
    return (sum64(upd) / max(B, 1)).to(upd.dtype)
