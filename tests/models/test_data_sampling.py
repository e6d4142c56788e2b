"""Training negative sampler and padded cohorts."""

from __future__ import annotations


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
        cohort_data(x, [0])  # type: ignore[arg-type]


@pytest.mark.parametrize("bitmap", [True, False])
def test_never_a_training_item_and_padding_zero(split: ImplicitSplit, bitmap: bool, monkeypatch) -> None:
    if not bitmap:
        monkeypatch.setattr(sampling, "_BITMAP_MAX_CELLS", 0)  # the searchsorted path
    c = cohort_data(split, np.arange(split.n_users))
    g = torch.Generator().manual_seed(0)
    neg = sample_negatives(c, split.n_items, 4, g)
    assert neg.shape == (*c.items.shape, 4) and neg.dtype == torch.int64
    for b in range(split.n_users):
        n = int(c.lengths[b])
        train = set(c.items[b, :n].tolist())
        drawn = set(neg[b, :n].reshape(-1).tolist())
        assert not (drawn & train)
        assert torch.all(neg[b, n:] == 0)
        assert min(drawn) >= 0 and max(drawn) < split.n_items


def test_deterministic_given_generator(split: ImplicitSplit) -> None:
    c = cohort_data(split, np.arange(40))
    a = sample_negatives(c, split.n_items, 3, torch.Generator().manual_seed(7))
    b = sample_negatives(c, split.n_items, 3, torch.Generator().manual_seed(7))
    d = sample_negatives(c, split.n_items, 3, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, d)


def test_held_out_items_can_be_drawn_and_uniform() -> None:
    # one device with training items {0..4} out of 20; held-out items are fair game
    items = torch.tensor([[0, 1, 2, 3, 4]])
    neg = sample_negatives_padded(items, torch.tensor([5]), 20, 2000, torch.Generator().manual_seed(1))
    counts = torch.bincount(neg.reshape(-1), minlength=20).double()
    assert counts[:5].sum() == 0
    expected = 5 * 2000 / 15
    assert counts[5:].min() > 0.85 * expected and counts[5:].max() < 1.15 * expected
    chi2 = float(((counts[5:] - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 14 dof; p ~ 2e-4


def test_held_out_items_are_not_excluded(split: ImplicitSplit) -> None:
    c = cohort_data(split, np.arange(split.n_users))
    neg = sample_negatives(c, split.n_items, 50, torch.Generator().manual_seed(2))
    hit_test = [(neg[b, : c.lengths[b]] == int(split.test_item[b])).any().item() for b in range(split.n_users)]
    assert any(hit_test)


def test_edge_cases() -> None:
    g = torch.Generator().manual_seed(0)
    empty = sample_negatives_padded(torch.zeros((3, 0), dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 10, 4, g)
    assert empty.shape == (3, 0, 4)
    # a device that trained on every item has no negative
    with pytest.raises(ValueError, match="no negative"):
        sample_negatives_padded(torch.arange(5)[None, :], torch.tensor([5]), 5, 1, g)
    # a device with all but one item always gets that item
    neg = sample_negatives_padded(torch.tensor([[0, 1, 3, 4]]), torch.tensor([4]), 5, 3, g)
    assert torch.all(neg == 2)
    with pytest.raises(ValueError, match="item ids"):
        sample_negatives_padded(torch.tensor([[7]]), torch.tensor([1]), 5, 1, g)
