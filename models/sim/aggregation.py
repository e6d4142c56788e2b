"""One round's aggregation in the simulator: from the cohort's updates to the
mean the server applies. Device-side DP (clip and noise, `models/privacy.py`)
first, then the plain mean, the in-process SecAgg(+) sum, or FedMMF's hybrid
round (D64); a chunked plain round keeps only a running sum."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.registry import ConfigError
from models.sim.config import SimulationConfig

if TYPE_CHECKING:
    from secagg.config import Neighbors, SecAggConfig


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
                    raise ConfigError(f"--secagg: {e}") from e
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
            raise ConfigError("--secagg needs at least 2 devices per round")
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


class RunningSum:
    """The float64 sum of a chunked round's updates (the plain mean needs nothing more)."""

    def __init__(self, dim: int, device: torch.device) -> None:
        self.total = torch.zeros(dim, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, upd: torch.Tensor) -> None:
        self.total += upd.sum(0, dtype=torch.float64)
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


def hybrid_mean(
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
        c = secagg_clip(config)
        out = secure.sum(rows, round_idx=round_idx, clip=c)
        rec.update(secure.last)
        rec["secagg_clipped_fraction"] = float((rows.abs() > c).sum()) / rows.numel()
        return out

    h = hybrid_sum(upd, plain, secure_sum)
    rec["plaintext_devices"] = h.plaintext
    rec["secure_devices_chosen"] = h.secure_chosen
    rec["secure_devices_counted"] = h.secure_counted
    return h.mean()


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
    cohort's (B, update_dim) updates or a chunked plain round's running sum:
    with DP every update is clipped and noised first (the noise split over the
    cohort in distributed mode); then FedMMF's hybrid round when
    `config.plaintext_j_bound` is set (`cohort_J`: the cohort's privacy
    indicators), else the SecAgg mean with `secure`, else the plain mean.
    None when no device is counted (a hybrid round with too few of either
    kind). Records what it did in `rec` (results.json's round record)."""
    if isinstance(upd, RunningSum):  # plain mean of a chunked round: only the sum was kept
        return upd.mean()
    dp = config.dp
    if dp is not None and upd.shape[1] > 0:
        from models.privacy import privatize

        z = dp.noise
        if dp.mode == "distributed":  # each device 1/B of the variance: the sum gets N(0, (z tau)^2)
            z = z / math.sqrt(upd.shape[0])
        upd, norms = privatize(upd, clip=dp.clip, noise_multiplier=z, generator=dp_generator)
        rec["update_norm_mean"] = float(norms.mean())
        rec["clipped_fraction"] = float((norms > dp.clip).float().mean())
    if upd.shape[1] == 0:
        return upd.new_zeros(0)
    if config.plaintext_j_bound is not None:  # J is fixed at init_private: any buffer has it
        return hybrid_mean(upd, cohort_J(), config, secure, round_idx, rec)
    if secure is not None:
        c = secagg_clip(config)
        mean = secure.mean(upd, round_idx=round_idx, clip=c)
        rec.update(secure.last)
        rec["secagg_clipped_fraction"] = float((upd.abs() > c).sum()) / upd.numel()
        return mean
    # summed in float64 like a chunked round's RunningSum: the mean does not depend on the order or chunking
    return (upd.sum(0, dtype=torch.float64) / max(int(upd.shape[0]), 1)).to(upd.dtype)
