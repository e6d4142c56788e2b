"""The sparse path of FedMF and PFedRec (D89) against their dense `local_update`.

For each model and round: the dense update is exactly zero off the rows the
sparse path returns (so dropping them loses nothing), the densified sparse
update and the new dense private tensors match the dense path's, PFedRec's
personal table is the round's global table plus its rows, and scoring the
rows gives the scores of the dense table (up to float32 summation order)."""

from __future__ import annotations

import pytest
import torch

from models.base import LocalRound
from models.data.sampling import cohort_data
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.fedmf import FedMF
from models.pfedrec import PFedRec
from models.sparse import ItemRows, SparseView, dense_part, expected_distinct, touched_with_negatives


@pytest.fixture(scope="module")
def split():
    return leave_one_out(synthetic(80, 200, seed=3), seed=0)


def rounds(model, split, n_rounds: int = 3):
    """(global, private, data, dense output, sparse output) of `n_rounds` rounds of the whole population."""
    torch.manual_seed(0)
    data = cohort_data(split, list(range(split.n_users)))
    g = model.init_global(torch.Generator().manual_seed(0))
    p = model.init_private(data, g, 1)
    for r in range(n_rounds):
        new_p, upd = model.local_update(LocalRound(g, p, data, r, 1))
        res = model.local_update_sparse(LocalRound(g, dense_part(p, model.base_keys), data, r, 1))
        yield g, p, data, (new_p, upd), res
        g = model.apply_mean_update(g, upd.mean(0), r)
        p = new_p


@pytest.mark.parametrize(
    "make",
    [
        lambda s: FedMF(s.n_users, s.n_items, k=8, local_epochs=3, chunk=1000),
        lambda s: PFedRec(s.n_users, s.n_items, k=8, batch_size=16, local_epochs=2),
    ],
    ids=["fedmf", "pfedrec"],
)
def test_sparse_round_is_the_dense_round_on_the_touched_rows(split, make) -> None:
    model = make(split)
    m, k = split.n_items, model.k
    for _g, _p, _data, (new_p, upd), res in rounds(model, split):
        dense_upd = upd.view(split.n_users, m, k)
        touched = torch.zeros(split.n_users, m, dtype=torch.bool)
        touched[res.update.devices(), res.update.items] = True
        assert not bool(dense_upd[~touched].any()), "the dense update moved a row the device never sampled"
        assert 0.05 < res.update.nnz / (split.n_users * m) < 0.99  # really sparse, and not empty
        assert torch.allclose(res.update.dense(m), upd, atol=1e-6, rtol=0)
        for key, v in res.dense.items():
            assert torch.allclose(v, new_p[key], atol=1e-6, rtol=0), key
        if isinstance(model, FedMF):  # one chunk: the same float32 operations in the same order
            assert torch.equal(res.update.dense(m), upd) and all(torch.equal(res.dense[x], new_p[x]) for x in res.dense)


def test_pfedrec_table_is_the_rounds_global_plus_its_rows_and_scores_alike(split) -> None:
    model = PFedRec(split.n_users, split.n_items, k=8, batch_size=16)
    m, k = split.n_items, model.k
    for g, _p, data, (new_p, _upd), res in rounds(model, split, 2):
        assert res.rows is res.update  # W_i = E_i - E is both
        table = g["E"].unsqueeze(0) + res.rows.dense(m).view(split.n_users, m, k)
        assert torch.allclose(table, new_p["E"], atol=1e-6, rtol=0)
        # two bases: the first half of the devices refers to another global table
        other = {"E": g["E"] * 0.5}
        base_of = (torch.arange(split.n_users) >= split.n_users // 2).to(torch.int64)
        full = torch.where(base_of.view(-1, 1, 1).bool(), g["E"], other["E"]).clone()
        full += res.rows.dense(m).view(split.n_users, m, k)
        items = torch.randint(0, m, (split.n_users, 30), generator=torch.Generator().manual_seed(1))
        view = SparseView(dense=res.dense, rows=res.rows, bases=(other, g), base_of=base_of)
        got = model.score_sparse(g, view, data.users, items)
        assert torch.allclose(got, model.score(g, res.dense | {"E": full}, data.users, items), atol=1e-5, rtol=0)


def test_fedmf_scores_alike(split) -> None:
    model = FedMF(split.n_users, split.n_items, k=8, local_epochs=2)
    for g, _p, data, (new_p, _upd), res in rounds(model, split, 2):
        items = torch.randint(0, split.n_items, (split.n_users, 25), generator=torch.Generator().manual_seed(2))
        view = SparseView(dense=res.dense, rows=None, bases=(), base_of=torch.zeros(split.n_users, dtype=torch.int64))
        got = model.score_sparse(g, view, data.users, items)
        assert torch.allclose(got, model.score(g, new_p, data.users, items), atol=1e-5, rtol=0)


def test_item_rows_dense_and_keys_round_trip() -> None:
    keys = torch.tensor([2, 5, 11, 12, 19])  # 3 devices x 7 items: device 0 {2, 5}, device 1 {4, 5}, device 2 {5}
    vals = torch.arange(10, dtype=torch.float32).view(5, 2)
    rows = ItemRows.from_keys(keys, vals, 3, 7)
    assert rows.ptr.tolist() == [0, 2, 4, 5] and rows.items.tolist() == [2, 5, 4, 5, 5]
    assert rows.devices().tolist() == [0, 0, 1, 1, 2]
    d = rows.dense(7).view(3, 7, 2)
    assert d[1, 4].tolist() == [4.0, 5.0] and float(d.sum()) == float(vals.sum())
    assert torch.equal(rows.dense(7, 1, 3), rows.dense(7)[1:3])


def test_expected_touched_rows_match_the_draws() -> None:
    """The plan's expectation of distinct rows against simulated uniform draws."""
    g = torch.Generator().manual_seed(0)
    for draws, pool in ((40, 100), (400, 150), (5, 1000)):
        got = [len(torch.randint(0, pool, (draws,), generator=g).unique()) for _ in range(400)]
        want = float(expected_distinct(torch.tensor([draws]), torch.tensor([pool]))[0])
        assert abs(sum(got) / len(got) - want) < 0.02 * want
    assert float(touched_with_negatives(torch.tensor([0]), 50, 4)[0]) == 0.0
