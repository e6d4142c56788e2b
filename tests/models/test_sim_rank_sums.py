"""A round's sums across ranks (D93), without processes: the ranks are threads
that exchange their vectors through a barrier, so any split of a cohort can
be checked against an independent oracle.

- --secagg: each rank's SecAgg+ groups over its own devices (its table
  handed over at once, or fed to its stream in chunks), the group sums
  added as integers mod 2^w and decoded once, equal bit for bit the
  single-process secure sum (`SecureAggregator.sum`) and the oracle: every
  device's input encoded on its own with the cohort's one encoding and its
  rounding key (seed, cohort position), the integers added, decoded once.
- the plain sum: fixed-point integers, the same for every split and chunking
  of the cohort (bit for bit), and a NaN, an infinity or an out-of-range
  coordinate makes the mean NaN on every rank.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from models.registry import ConfigError
from models.sim.aggregation import SecureAggregator
from models.sim.config import SimulationConfig
from models.sim.exact_sum import RANGE, FixedSum
from models.sim.rank_round import RankAggregator
from models.sim.ranks import Ranks
from models.sim.shard import CohortShare, Shard
from secagg.encoding import FixedPointEncoding


class ThreadRanks(Ranks):
    """Rank `rank` of `world` threads; the sums go through a shared list and a barrier."""

    def __init__(self, rank: int, world: int, board: list[Any], barrier: threading.Barrier) -> None:
        super().__init__(rank, world)
        self.board, self.barrier = board, barrier

    def _exchange(self, t: torch.Tensor) -> torch.Tensor:
        self.board[self.rank] = t.clone()
        self.barrier.wait()
        total = sum(self.board[1:], self.board[0].clone())
        self.barrier.wait()
        return total

    def sum_i64(self, t: torch.Tensor) -> torch.Tensor:
        return self._exchange(t.to(torch.int64))

    def sum_f64(self, t: torch.Tensor) -> torch.Tensor:
        return self._exchange(t.to(torch.float64))


def run_ranks(bounds: tuple[int, ...], fn: Any) -> list[Any]:
    """fn(ranks, shard) on one thread per rank; their results in rank order (an exception is raised again)."""
    world = len(bounds) - 1
    board: list[Any] = [None] * world
    barrier = threading.Barrier(world, timeout=60)
    out: list[Any] = [None] * world
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            out[r] = fn(ThreadRanks(r, world, board, barrier), Shard(r, world, bounds))
        except BaseException as e:  # noqa: BLE001 (raised again below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def oracle_sum(x: np.ndarray, *, clip: float, seed: int) -> np.ndarray:
    """Every device encoded alone (the cohort's encoding, rounding key (seed, position)), summed as integers."""
    enc = FixedPointEncoding.for_cohort(x.shape[0], clip=clip)
    total = np.zeros(x.shape[1], dtype=np.uint64)
    for p in range(x.shape[0]):
        total += enc.encode(x[p].astype(np.float32), np.random.default_rng((seed, p))).astype(np.uint64)
    assert int(total.max()) < 1 << enc.modulus_bits  # sized for the cohort: the sum never wraps
    return enc.decode_sum(total.astype(np.uint32), x.shape[0])


SEED_ROWS = 0  # a partial cohort that gives no rank of these splits a single device
CONFIG = SimulationConfig(model="fedmf", secagg=True, secagg_group_size=4, secagg_clip=2.0)


@pytest.mark.parametrize("bounds", [(0, 40), (0, 17, 40), (0, 9, 12, 31, 40)], ids=["1", "2", "4"])
@pytest.mark.parametrize("cohort", [None, "partial"])
@pytest.mark.parametrize("fed", ["table", "chunks"])
def test_rank_secure_sums_are_the_single_process_sum_bit_for_bit(bounds: tuple[int, ...], cohort: str | None,
                                                                 fed: str) -> None:
    """`fed`: each rank's updates handed over as its table, or fed to its stream
    in chunks of 3 in the stream's order (as a chunked round trains them)."""
    rng = np.random.default_rng(len(bounds))
    n_pop, dim, round_idx = 40, 23, 3
    pop_updates = rng.normal(0, 0.7, (n_pop, dim)).astype(np.float32)
    pop_updates[0, :3] = [5.0, -5.0, 2.0]  # beyond the clip: every path clips it alike
    pick = np.random.default_rng(SEED_ROWS).choice(n_pop, 26, replace=False)
    rows = None if cohort is None else torch.tensor(sorted(pick.tolist()))
    x = pop_updates if rows is None else pop_updates[rows.numpy()]

    def rank(ranks: Ranks, shard: Shard) -> tuple[torch.Tensor, dict[str, Any]]:
        secure = SecureAggregator(seed=CONFIG.seed, neighbors=CONFIG.neighbors, group_size=4)
        agg = RankAggregator(ranks, CONFIG, secure, dim, torch.device("cpu"))
        share = shard.share(rows)
        local = torch.from_numpy(x[share.positions]) if share.count else None
        rec: dict[str, Any] = {}
        if fed == "table":
            return agg.mean(local, share, round_idx, rec), rec
        stream = agg.secure_stream(share, round_idx)
        if stream is not None:
            assert local is not None
            order = torch.as_tensor(stream.order())
            for a in range(0, share.count, 3):
                stream.add(local[order[a : a + 3]], order[a : a + 3])
            assert stream.inner.peak_rows_held <= 7  # groups of 4 to 7 (of a share up to 23): one at a time
        return agg.mean(stream, share, round_idx, rec), rec

    # no rank holds a single device of the cohort (refused: tested below)
    assert 1 not in Shard(0, len(bounds) - 1, bounds).share(rows).counts
    results = run_ranks(bounds, rank)
    single = SecureAggregator(seed=CONFIG.seed, neighbors=CONFIG.neighbors, group_size=4)
    expected = single.mean(torch.from_numpy(x), round_idx=round_idx, clip=2.0)
    oracle = oracle_sum(x, clip=2.0, seed=CONFIG.seed * 1_000_003 + round_idx)
    for mean, rec in results:
        assert torch.equal(mean, expected)  # bit for bit, on every rank
        assert torch.equal(mean, torch.as_tensor(oracle.astype(np.float32)) / x.shape[0])
        assert rec["secagg_exact"] is True and rec["secagg_counted"] == x.shape[0]
        assert rec["secagg_groups"] >= len(bounds) - 1


def test_a_rank_with_one_device_of_a_secure_cohort_is_refused() -> None:
    rows = torch.tensor([0, 1, 2, 7])  # rank 1 (rows 5..9) holds one

    def rank(ranks: Ranks, shard: Shard) -> torch.Tensor:
        secure = SecureAggregator(seed=0, neighbors="auto", group_size=4)
        share = shard.share(rows)
        return RankAggregator(ranks, CONFIG, secure, 3, torch.device("cpu")).mean(
            torch.zeros(share.count, 3), share, 0, {})

    with pytest.raises(ConfigError, match="rank 1 holds 1 device"):
        run_ranks((0, 5, 10), rank)


def _plain(bounds: tuple[int, ...], x: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    config = SimulationConfig(model="fedmf")

    def rank(ranks: Ranks, shard: Shard) -> torch.Tensor:
        share = shard.share(None)
        acc = FixedSum(x.shape[1], torch.device("cpu"))
        for s in range(shard.lo, shard.hi, chunk):
            acc.add(x[s : min(s + chunk, shard.hi)])
        return RankAggregator(ranks, config, None, x.shape[1], torch.device("cpu")).mean(acc, share, 0, {})

    return run_ranks(bounds, rank)


def test_plain_sums_do_not_depend_on_the_split_or_the_chunks() -> None:
    # coordinates from 1e-12 to 1e7 (a model far from converged still sums exactly)
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-12, 7, 64)
    ref = _plain((0, 50), x, 50)[0]
    exact = x.double().mean(0)
    assert bool(((ref.double() - exact).abs() <= 2.0**-48 + 1e-7 * exact.abs()).all())  # the float32 mean
    for bounds, chunk in [((0, 50), 7), ((0, 13, 50), 50), ((0, 1, 2, 30, 50), 3)]:
        for mean in _plain(bounds, x, chunk):
            assert torch.equal(mean, ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), RANGE / 10])
def test_a_value_out_of_range_makes_the_mean_nan_on_every_rank(bad: float) -> None:
    x = torch.randn(20, 5, generator=torch.Generator().manual_seed(2))
    x[15, 2] = bad  # on rank 1 only
    for mean in _plain((0, 10, 20), x, 4):
        assert torch.isnan(mean).all()


def test_shares_reject_nothing_and_count_everyone() -> None:
    share = Shard(1, 2, (0, 3, 8)).share(torch.tensor([1, 4, 5]))
    assert isinstance(share, CohortShare) and share.counts == (1, 2) and share.positions.tolist() == [1, 2]
