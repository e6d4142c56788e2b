"""Training negative sampler and padded cohorts."""

from __future__ import annotations


from typing import Any, cast

import numpy as np
import pytest
import torch

from models.base import CohortData
from models.data import sampling
from models.data.sampling import (
    cohort_data,
    explicit_train_csr,
    sample_negatives,
    sample_negatives_padded,
)
from models.data.splits import leave_one_out, random_explicit_split
from models.data.synthetic import synthetic
from models.data.types import ImplicitSplit
from models.keyed_random import KeyedStream, Purpose


def stream(seed: int = 0, epoch: int = 0) -> KeyedStream:
    return KeyedStream.of(seed, Purpose.NEGATIVES, 0, epoch)


ONE = torch.tensor([0])  # the user id of a one-row cohort


@pytest.fixture(scope="module")
def split() -> ImplicitSplit:
    return leave_one_out(synthetic(150, 250, seed=4), seed=0)


def test_cohort_data_implicit(split: ImplicitSplit) -> None:
    users = np.array([5, 0, 149, 5])
    c = cohort_data(split, users)
    assert isinstance(c, CohortData) and c.ratings is None
    assert c.users.tolist() == users.tolist() and c.users.dtype == torch.int64
    for b, u in enumerate(users):
        row = split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]]
        n = len(row)
        assert c.lengths[b] == n and c.mask[b].sum() == n and bool(c.mask[b, :n].all())
        assert c.items[b, :n].tolist() == row.tolist()
        assert torch.all(c.items[b, n:] == 0)
    assert c.items.shape[1] == int(c.lengths.max())
    # tensors in, same result
    assert torch.equal(cohort_data(split, torch.tensor(users)).items, c.items)


def test_cohort_data_explicit() -> None:
    x = synthetic(50, 200, seed=1)
    e = random_explicit_split(x, 0)
    csr = explicit_train_csr(e)
    c = cohort_data(e, [3, 7], explicit_csr=csr)
    assert c.ratings is not None and c.ratings.dtype == torch.float32
    for b, u in enumerate([3, 7]):
        m = e.train_user == u
        n = int(c.lengths[b])
        got = sorted(zip(c.items[b, :n].tolist(), c.ratings[b, :n].tolist()))
        assert got == sorted(zip(e.train_item[m].tolist(), e.train_rating[m].tolist()))
        assert torch.all(c.ratings[b, n:] == 0)
    assert torch.equal(cohort_data(e, [3, 7]).items, c.items)
    with pytest.raises(TypeError):
        cohort_data(cast(Any, x), [0])  # not an ImplicitSplit


@pytest.mark.parametrize("bitmap", [True, False])
def test_never_a_training_item_and_padding_zero(split: ImplicitSplit, bitmap: bool, monkeypatch) -> None:
    if not bitmap:
        monkeypatch.setattr(sampling, "_BITMAP_MAX_CELLS", 0)  # the searchsorted path
    c = cohort_data(split, np.arange(split.n_users))
    neg = sample_negatives(c, split.n_items, 4, stream())
    assert neg.shape == (*c.items.shape, 4) and neg.dtype == torch.int64
    for b in range(split.n_users):
        n = int(c.lengths[b])
        train = set(c.items[b, :n].tolist())
        drawn = set(neg[b, :n].reshape(-1).tolist())
        assert not (drawn & train)
        assert torch.all(neg[b, n:] == 0)
        assert min(drawn) >= 0 and max(drawn) < split.n_items


def test_deterministic_given_the_key(split: ImplicitSplit) -> None:
    c = cohort_data(split, np.arange(40))
    a = sample_negatives(c, split.n_items, 3, stream(7))
    b = sample_negatives(c, split.n_items, 3, stream(7))
    d = sample_negatives(c, split.n_items, 3, stream(8))
    e = sample_negatives(c, split.n_items, 3, stream(7, epoch=1))
    assert torch.equal(a, b) and not torch.equal(a, d) and not torch.equal(a, e)


def _rows_equal(neg_a: torch.Tensor, la: torch.Tensor, ia: int, neg_b: torch.Tensor, lb: torch.Tensor, ib: int) -> bool:
    n = int(la[ia])
    assert n == int(lb[ib])
    return torch.equal(neg_a[ia, :n], neg_b[ib, :n])


@pytest.mark.parametrize("bitmap", [True, False])
def test_a_users_negatives_do_not_depend_on_the_batch(split: ImplicitSplit, bitmap: bool, monkeypatch) -> None:
    """Keyed draws: user u gets the same negatives alone, in a batch of 5 and in
    a batch of 30 in another order (so in simulate and on any edge client)."""
    if not bitmap:
        monkeypatch.setattr(sampling, "_BITMAP_MAX_CELLS", 0)
    st = stream(3, epoch=2)
    rng = np.random.default_rng(0)
    thirty = rng.permutation(split.n_users)[:30]
    five = thirty[[4, 0, 17, 9, 23]]
    c30 = cohort_data(split, thirty)
    c5 = cohort_data(split, five)
    n30 = sample_negatives(c30, split.n_items, 4, st)
    n5 = sample_negatives(c5, split.n_items, 4, st)
    for j, u in enumerate(five):
        c1 = cohort_data(split, [u])
        n1 = sample_negatives(c1, split.n_items, 4, st)
        i30 = int(np.flatnonzero(thirty == u)[0])
        assert _rows_equal(n1, c1.lengths, 0, n5, c5.lengths, j)
        assert _rows_equal(n1, c1.lengths, 0, n30, c30.lengths, i30)
    # the key is the user id, not the row: the same rows under other ids draw other negatives
    other = sample_negatives_padded(c5.items, c5.lengths, split.n_items, 4, st, c5.users + 1)
    assert not torch.equal(other, n5)


def test_keyed_redraws_depend_on_the_attempt_only() -> None:
    """A rejected candidate is redrawn with the next attempt number: rows with
    different training sets still agree on the slots both accept at attempt 0."""
    st = stream(5)
    a = sample_negatives_padded(torch.tensor([[0, 1]]), torch.tensor([2]), 50, 40, st, ONE)
    b = sample_negatives_padded(torch.tensor([[0, 2]]), torch.tensor([2]), 50, 40, st, ONE)
    first = KeyedStream.to_integers(
        KeyedStream.attempt(st.element_keys(st.user_keys(ONE)[[0] * 80], torch.arange(80)), 0), 50
    ).view(2, 40)
    for got, train in ((a, {0, 1}), (b, {0, 2})):
        ok = torch.tensor([int(v) not in train for v in first.reshape(-1)]).view(2, 40)
        assert torch.equal(got[0][ok], first[ok])  # accepted at attempt 0: the first candidate
        assert not any(int(v) in train for v in got.reshape(-1))


def test_held_out_items_can_be_drawn_and_uniform() -> None:
    # one device with training items {0..4} out of 20; held-out items are fair game
    items = torch.tensor([[0, 1, 2, 3, 4]])
    neg = sample_negatives_padded(items, torch.tensor([5]), 20, 2000, stream(1), ONE)
    counts = torch.bincount(neg.reshape(-1), minlength=20).double()
    assert counts[:5].sum() == 0
    expected = 5 * 2000 / 15
    assert counts[5:].min() > 0.85 * expected and counts[5:].max() < 1.15 * expected
    chi2 = float(((counts[5:] - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 14 dof; p ~ 2e-4


def test_held_out_items_are_not_excluded(split: ImplicitSplit) -> None:
    c = cohort_data(split, np.arange(split.n_users))
    neg = sample_negatives(c, split.n_items, 50, stream(2))
    hit_test = [(neg[b, : c.lengths[b]] == int(split.test_item[b])).any().item() for b in range(split.n_users)]
    assert any(hit_test)


def test_uniform_over_many_users_chi_square(split: ImplicitSplit) -> None:
    """Pooled over all users, each user's negatives are uniform over its allowed
    items: the counts of every user's draws against their expectation."""
    c = cohort_data(split, np.arange(split.n_users))
    n_neg = 40
    neg = sample_negatives(c, split.n_items, n_neg, stream(11))
    chi2, dof = 0.0, 0
    for b in range(split.n_users):
        n = int(c.lengths[b])
        allowed = np.setdiff1d(np.arange(split.n_items), c.items[b, :n].numpy())
        counts = np.bincount(neg[b, :n].reshape(-1).numpy(), minlength=split.n_items)[allowed]
        expected = n * n_neg / len(allowed)
        chi2 += float(((counts - expected) ** 2 / expected).sum())
        dof += len(allowed) - 1
    # chi-square with ~36k dof: mean dof, sd sqrt(2 dof) ~ 270; allow 5 sd
    assert abs(chi2 - dof) < 5 * np.sqrt(2 * dof), (chi2, dof)


def test_edge_cases() -> None:
    g = stream()
    three = torch.arange(3)
    empty = sample_negatives_padded(torch.zeros((3, 0), dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 10, 4, g, three)
    assert empty.shape == (3, 0, 4)
    # a device that trained on every item has no negative
    with pytest.raises(ValueError, match="no negative"):
        sample_negatives_padded(torch.arange(5)[None, :], torch.tensor([5]), 5, 1, g, ONE)
    # a device with all but one item always gets that item
    neg = sample_negatives_padded(torch.tensor([[0, 1, 3, 4]]), torch.tensor([4]), 5, 3, g, ONE)
    assert torch.all(neg == 2)
    with pytest.raises(ValueError, match="item ids"):
        sample_negatives_padded(torch.tensor([[7]]), torch.tensor([1]), 5, 1, g, ONE)
    with pytest.raises(ValueError, match="users"):
        sample_negatives_padded(torch.tensor([[1]]), torch.tensor([1]), 5, 1, g, three)


def _skewed_csr(seed: int = 0, users: int = 3000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A long-tailed CSR (a few users with thousands of rows, most with a handful, some with none):
    (indptr, int64 values, float32 values)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.6, size=users) - 1, 2500)
    indptr = np.zeros(users + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return indptr, rng.integers(1, 10**6, size=indptr[-1]), rng.random(indptr[-1]).astype(np.float32)


@pytest.mark.parametrize("block_cells", [1, 13, 4096, sampling.PAD_BLOCK_CELLS])
def test_pad_csr_in_blocks_is_every_row_in_place(block_cells: int) -> None:
    """Against an independent oracle: each chosen user's own rows, in order, then zeros."""
    indptr, a, b = _skewed_csr()
    users = np.random.default_rng(1).permutation(len(indptr) - 1)[:2000]
    lengths, (pa, pb), mask = sampling.pad_csr(indptr, [a, b], users, block_cells=block_cells)
    assert pa.dtype == a.dtype and pb.dtype == b.dtype and pa.shape == mask.shape == (2000, lengths.max())
    for row, u in enumerate(users):
        n = indptr[u + 1] - indptr[u]
        assert lengths[row] == n and mask[row, :n].all() and not mask[row, n:].any()
        assert (pa[row, :n] == a[indptr[u]:indptr[u + 1]]).all() and not pa[row, n:].any()
        assert (pb[row, :n] == b[indptr[u]:indptr[u + 1]]).all() and not pb[row, n:].any()


def test_pad_csr_takes_little_memory_beyond_its_outputs() -> None:
    """Its working memory (numpy's allocations, traced) is a block's, not another table of the outputs' size
    (in one piece the index table alone doubled the peak: 5.03 GiB against 3.86 planned at the ML-20M shape)."""
    import tracemalloc

    indptr, a, _ = _skewed_csr(users=4000)
    users = np.arange(len(indptr) - 1)
    tracemalloc.start()
    try:
        _, (pa,), mask = sampling.pad_csr(indptr, [a], users, block_cells=1 << 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    outputs = pa.nbytes + mask.nbytes
    assert outputs > 50 * (1 << 16) * 8  # the table is many blocks
    assert peak <= 1.1 * outputs, (peak, outputs)
