"""A round's aggregation across the ranks of a distributed simulation (D93).

Each rank trains its part of the cohort (`models/sim/shard.py`) and hands
what it produced to `RankAggregator.mean`, which returns the mean update
every rank then applies (the same tensor on every rank):

- Plain mean: the rank's updates summed exactly on a fixed-point grid
  (`models/sim/exact_sum.py`: a chunked or sparse round's `FixedSum`, or
  the dense table summed here), followed by the device count and an
  out-of-range flag, in ONE int64 all_reduce; the mean is total / count
  cast to float32. Integer sums do not depend on the order: the sum is the
  same function of the devices' updates for any split into ranks (a
  device's own float32 update may still depend on its batch, D93).
- SecAgg: the rank runs the secure sum in groups over its own devices
  (`secagg.group_stream.GroupStream`, equal to
  `secagg.grouped_round.run_grouped_round` with their cohort positions as
  rounding keys and its groups numbered after the lower ranks'), fed as the
  rank's chunks train, group by group (`secure_stream`, D100), so that the
  rank holds one group's updates, never its share's table; every
  group config carrying the ONE encoding of the round, sized for the whole
  cohort (D87). The ranks' committed sums (uint32 words of Z_{2^w}), their
  plaintext checks and counts go in ONE int64 all_reduce; the total is
  reduced mod 2^w and decoded once. Each device's encoded input is the one
  it has in a single-process round (same encoding, same rounding key), so
  the decoded sum, hence the model, is bit for bit the single-process one.

DP and FedMMF's hybrid round are refused with ranks (`check_rank_settings`,
called before any rank starts): their noise and their choice are drawn from
one stream over the whole cohort, and this aggregation has neither.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from models.base import GlobalState, PrivateState
from models.registry import ConfigError
from models.sim.aggregation import RunningSum, SecureAggregator, SecureStream, secagg_clip
from models.sim.config import SimulationConfig
from models.sim.exact_sum import RANGE, FixedSum, mean_of
from models.sim.ranks import Ranks
from models.sim.shard import CohortShare, Shard
from models.sim.sparse_aggregation import SparseUpdates

if TYPE_CHECKING:
    from secagg.encoding import FixedPointEncoding

#: what one rank's training of its part of a round produced (None: it held no device of the cohort)
#: (a SecureStream: its chunks already fed the rank's secure sum, `RankAggregator.secure_stream`)
RankUpdates = torch.Tensor | RunningSum | SparseUpdates | SecureStream | None


def check_rank_settings(config: SimulationConfig, world: int) -> None:
    """ConfigError for settings a run as ranks (any number, `--nproc 1`
    included: its aggregation is `RankAggregator`'s) does not support."""
    if config.dp is not None:
        raise ConfigError(f"--dp-* with ranks (--nproc, torchrun; {world} here) is not built: the device noise is "
                          "drawn from one stream over the whole cohort; run DP without --nproc")
    if config.plaintext_j_bound is not None:
        raise ConfigError("--plaintext-j-bound with ranks (--nproc, torchrun) is not built; run the hybrid round "
                          "without --nproc")


class RankAggregator:
    """The mean update of a round over all ranks (see the module doc)."""

    def __init__(self, ranks: Ranks, config: SimulationConfig, secure: SecureAggregator | None, dim: int,
                 device: torch.device) -> None:  # fmt: skip
        self.ranks = ranks
        self.config = config
        self.secure = secure
        self.dim = dim
        self.device = device
        self.graph = "none"  # this rank's SecAgg graphs in the last round (results.json's secagg_graph)

    def mean(self, upd: RankUpdates, share: CohortShare, round_idx: int, rec: dict[str, Any]) -> torch.Tensor:
        if self.dim == 0:
            return torch.zeros(0, device=self.device)
        if self.secure is not None:
            stream = upd if isinstance(upd, SecureStream) else self._fed_whole(upd, share, round_idx)
            return self._secure_mean(stream, share, round_idx, rec)
        hi, lo, count, peak, bad = self._local_sum(upd)
        flags = torch.tensor([count, bad + int(peak * share.cohort >= RANGE)], dtype=torch.int64)
        red = self.ranks.sum_i64(torch.cat([hi.cpu(), lo.cpu(), flags]))
        n, out_of_range = int(red[-2]), int(red[-1])
        if n != share.cohort:
            raise RuntimeError(f"round {round_idx}: the ranks trained {n} devices of a cohort of {share.cohort}")
        if out_of_range:  # NaN, infinity or too large a coordinate: the run stops as a diverged one
            rec["exact_sum_out_of_range"] = out_of_range
            return torch.full((self.dim,), math.nan, device=self.device)
        return mean_of(red[: self.dim], red[self.dim : 2 * self.dim], n).to(self.device)

    def _local_sum(self, upd: RankUpdates) -> tuple[torch.Tensor, torch.Tensor, int, float, int]:
        """This rank's exact sum of its devices' updates (limbs hi, lo), their
        count, the largest |coordinate| and how many coordinates are not finite."""
        if upd is None:
            zero = torch.zeros(self.dim, dtype=torch.int64)
            return zero, zero, 0, 0.0, 0
        if isinstance(upd, FixedSum):
            return upd.hi, upd.lo, upd.count, upd.peak, upd.nonfinite
        if isinstance(upd, RunningSum | SecureStream):
            raise RuntimeError("a distributed plain round sums on the fixed-point grid (FixedSum)")
        if isinstance(upd, SparseUpdates):
            upd = upd.dense()
        exact = FixedSum(self.dim, upd.device)  # in bounded steps: the whole table's limbs would be 4 times its size
        exact.add(upd)
        return exact.hi, exact.lo, exact.count, exact.peak, exact.nonfinite

    def secure_stream(self, share: CohortShare, round_idx: int) -> SecureStream | None:
        """Round `round_idx`'s secure sum of this rank's devices, to be fed as
        their chunks train (`models.sim.training.CohortRound`): the rank's
        groups (a partition of its share, numbered after the lower ranks'),
        each run when its last update arrives, so that fed in `order()` the
        rank holds one group's updates. None without --secagg, with nothing
        to send, or when the rank holds no device of the cohort (it still
        joins `mean`'s all_reduce). ConfigError, on every rank alike, when
        some rank holds a single device of the cohort."""
        from secagg.group_stream import GroupStream
        from secagg.groups import group_count, partition, partition_seed

        secure = self.secure
        if secure is None or self.dim == 0:
            return None
        short = [r for r, c in enumerate(share.counts) if c == 1]
        if short:
            raise ConfigError(f"round {round_idx}: rank {short[0]} holds 1 device of the cohort, and a secure sum "
                              "needs at least 2 per group; use fewer ranks or a larger --clients-per-round")
        if not share.count:
            return None
        first = sum(group_count(k, secure.group_size) for k in share.counts[: self.ranks.rank] if k)
        tag = secure.session_id + f"/rank-{self.ranks.rank}".encode()
        groups = partition(range(share.count), group_size=secure.group_size, seed=partition_seed(tag, round_idx))
        clip = secagg_clip(self.config)
        configs = [secure.config(len(g), self.dim, clip, cohort=share.cohort, group=first + j)
                   for j, g in enumerate(groups)]  # fmt: skip
        self.graph = "; ".join(sorted({cfg.describe() for cfg in configs}))
        inner = GroupStream(groups=groups, configs=configs, vector_length=self.dim, round_idx=round_idx,
                            seed=secure.seed * 1_000_003 + round_idx, wire=False,
                            cohort_positions=share.positions.tolist(), first_group=first)  # fmt: skip
        return SecureStream(secure, share.count, self.dim, round_idx=round_idx, clip=clip, inner=inner)

    def _fed_whole(self, upd: RankUpdates, share: CohortShare, round_idx: int) -> SecureStream | None:
        """This rank's secure sum fed its whole (B_local, dim) table at once (a round not trained into a stream)."""
        stream = self.secure_stream(share, round_idx)
        if stream is None:
            return None
        if upd is None or isinstance(upd, RunningSum | SecureStream):
            raise RuntimeError("a secure round keeps every update, not only their sum")
        t = upd.dense() if isinstance(upd, SparseUpdates) else upd
        stream.add(t.detach().to("cpu", torch.float32), torch.arange(share.count))
        return stream

    def _secure_mean(self, stream: SecureStream | None, share: CohortShare, round_idx: int,
                     rec: dict[str, Any]) -> torch.Tensor:  # fmt: skip
        from secagg.encoding import FixedPointEncoding
        from secagg.groups import group_count

        secure = self.secure
        assert secure is not None
        encoding = FixedPointEncoding.for_cohort(share.cohort, clip=secagg_clip(self.config))
        n_groups = [group_count(k, secure.group_size) if k else 0 for k in share.counts]
        words = np.zeros(self.dim, dtype=np.int64)
        expected = np.zeros(self.dim, dtype=np.int64)
        counted = clipped = 0
        if stream is not None:
            words, expected, counted = self._rank_sum(stream, encoding, round_idx)
            clipped = stream.clipped
            rec["secagg_rows_held_peak"] = stream.inner.peak_rows_held  # this rank's
        red = self.ranks.sum_i64(torch.from_numpy(np.concatenate([words, expected, [counted, clipped]])))
        total, exp = red[: self.dim].numpy(), red[self.dim : 2 * self.dim].numpy()
        n, n_clipped = int(red[-2]), int(red[-1])
        mask = (1 << encoding.modulus_bits) - 1
        committed = (total & mask).astype(np.uint32)
        decoded = encoding.decode_sum(committed, n)
        rec.update(secagg_graph=self.graph, secagg_groups=sum(n_groups), secagg_counted=n,
                   secagg_exact=bool(exp.max(initial=0) <= mask and np.array_equal(exp, committed.astype(np.int64))),
                   secagg_clipped_fraction=n_clipped / max(1, share.cohort * self.dim))  # fmt: skip
        if n != share.cohort:
            raise RuntimeError(f"secure aggregation in round {round_idx} counted {n} of {share.cohort} devices")
        # as SecureAggregator.mean: the float32 sum over the cohort's size
        return torch.as_tensor(np.asarray(decoded, dtype=np.float32), device=self.device) / share.cohort

    def _rank_sum(self, stream: SecureStream, encoding: FixedPointEncoding,
                  round_idx: int) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
        """This rank's groups, every update fed: their committed sum (words of Z_{2^w}), its plaintext check and the count."""
        out = stream.inner.finish()
        e = out.encoding
        if (e.clip, e.modulus_bits, e.max_level) != (encoding.clip, encoding.modulus_bits, encoding.max_level):
            raise RuntimeError("the groups' encoding is not the cohort's")
        failed = [j for j, o in enumerate(out.outcomes) if not o.ok]
        if failed or out.encoded_sum is None or out.expected_encoded_sum is None:
            o = out.outcomes[failed[0]] if failed else out.outcomes[0]
            first = int(stream.inner.first_group)
            raise RuntimeError(f"secure aggregation aborted in round {round_idx}, rank {self.ranks.rank}, group "
                               f"{first + (failed or [0])[0]}: {o.abort_reason} {o.abort_detail}")
        return (out.encoded_sum.astype(np.int64), out.expected_encoded_sum.astype(np.int64), len(out.counted))


def gather_small(ranks: Ranks, table: PrivateState) -> PrivateState:
    """The population's per-device scalars (e.g. FedMMF's J), gathered from the
    ranks in rank order (= population order), for `model.summary`; wider
    columns stay out (a summary reads only small tables, models/base.py)."""
    small = {k: v.detach().cpu() for k, v in table.items() if v.dim() == 1 or (v.dim() == 2 and v.shape[1] == 1)}
    if ranks.world == 1 or not small:
        return small
    parts = ranks.gather(small)
    return {k: torch.cat([p[k] for p in parts]) for k in small}


def rank_figures(ranks: Ranks, shard: Shard, global_: GlobalState, memory: dict[str, Any]) -> dict[str, Any]:
    """results.json's "ranks": the world, the backend and each rank's shard and
    memory figures; RuntimeError when the ranks' final global models differ
    (they apply the same server step to the same reduced sums, so they never should)."""
    import hashlib

    digest = hashlib.sha256()
    for k in sorted(global_):
        digest.update(k.encode())
        digest.update(global_[k].detach().to("cpu").contiguous().numpy().tobytes())
    mine: dict[str, Any] = {"rank": ranks.rank, "devices": shard.size, "first_row": shard.lo,
                            "global_sha256": digest.hexdigest()}
    mine.update((k, memory[k]) for k in ("peak_rss_bytes", "private_state_bytes_peak", "disk_bytes_peak"))
    every = ranks.gather(mine)
    if len({p["global_sha256"] for p in every}) != 1:
        raise RuntimeError(f"the ranks' final global models differ: {[p['global_sha256'][:12] for p in every]}")
    return {"world": ranks.world, "backend": ranks.backend, "per_rank": every}
