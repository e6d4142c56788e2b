"""Centralised reference models (models/reference.py) and `fedmask reference`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from models import reference as R
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.data.types import ImplicitSplit


@pytest.fixture(scope="module")
def split() -> ImplicitSplit:
    return leave_one_out(synthetic(400, 300, seed=5), seed=2)


def test_training_matrix_is_the_csr(split: ImplicitSplit) -> None:
    x = R.training_matrix(split)
    assert x.shape == (split.n_users, split.n_items) and x.dtype == np.float32
    for u in (0, 17, split.n_users - 1):
        items = split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]]
        assert set(np.flatnonzero(x[u]).tolist()) == set(items.tolist())
    assert x.sum() == len(split.train_items)


def test_recency_weights_decay_from_the_newest_item(split: ImplicitSplit) -> None:
    w = R.recency_weighted_history(split, half_life=5.0, boost=2.0)
    for u in (0, 9):
        items = split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]]
        weights = w[u, items]
        assert weights[-1] == pytest.approx(3.0)  # newest: 1 + boost
        assert weights[-2] == pytest.approx(1 + 2 * math.exp(-1 / 5))
        assert np.all(np.diff(weights) > 0) and weights.min() > 1.0
    assert set(np.unique(w[w > 0] > 0)) == {True}
    with pytest.raises(ValueError, match="half_life"):
        R.recency_weighted_history(split, half_life=0.0)


def test_ease_is_the_zero_diagonal_ridge_regression() -> None:
    # B's column j is the ridge regression of item j on the other items (diag(B) = 0).
    rng = np.random.default_rng(0)
    x = (rng.random((60, 12)) < 0.3).astype(np.float32)
    lam = 3.0
    b = R.ease_weights(x, lam)
    assert np.all(np.diag(b) == 0)
    for j in range(x.shape[1]):
        others = np.delete(np.arange(x.shape[1]), j)
        a = x[:, others].astype(np.float64)
        ridge = np.linalg.solve(a.T @ a + lam * np.eye(len(others)), a.T @ x[:, j])
        np.testing.assert_allclose(b[others, j], ridge, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="lam"):
        R.ease_weights(x, 0.0)


def test_itemknn_keeps_the_given_number_of_neighbours(split: ImplicitSplit) -> None:
    s = R.itemknn_scores(split, neighbours=5)
    assert s.shape == (split.n_users, split.n_items)
    # brute force: score(u, j) = sum of cos(j, h) over the user's items h among j's 5 most similar
    x = R.training_matrix(split).astype(np.float64)
    norm = np.sqrt((x * x).sum(0)) + 1e-9
    cos = (x.T @ x) / norm[:, None] / norm[None, :]
    np.fill_diagonal(cos, 0.0)
    for u, j in [(0, 3), (5, 100), (7, 250), (11, 0)]:
        top = np.argsort(-cos[j], kind="stable")[:5]
        expected = sum(cos[j, h] for h in top if x[u, h] > 0)
        assert s[u, j] == pytest.approx(expected, abs=1e-5)
    assert np.all(R.itemknn_scores(split, neighbours=split.n_items) + 1e-4 >= s)  # truncation only removes mass


def test_selection_uses_validation_and_structure_beats_popularity(split: ImplicitSplit) -> None:
    results = {r["name"]: r for r in R.run_references(split)}
    assert list(results) == list(R.reference_names())
    for r in results.values():
        vals = [g["val_hr@10"] for g in r["grid"]]
        assert r["val"]["hr@10"] == pytest.approx(max(vals))
        assert r["params"] == r["grid"][int(np.argmax(vals))]["params"]
        # the placebo is a never-touched item: near chance (10/100), 400 users -> sd 0.015
        assert 0.04 <= r["placebo"]["hr@10"] <= 0.16, r
    # the synthetic data has planted low-rank structure: EASE finds it, popularity cannot
    assert results["ease"]["test"]["hr@10"] > results["popularity"]["test"]["hr@10"] + 0.05


def test_unknown_reference_and_too_many_items(split: ImplicitSplit, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown reference"):
        R.run_references(split, ["ease", "svd"])
    monkeypatch.setattr(R, "MAX_ITEMS_DENSE", 100)
    with pytest.raises(ValueError, match="refused above 100 items"):
        R.ease_scores(split, 10.0)


def test_cli_reference(tmp_path: Path, command_app) -> None:
    from fedmask.commands.models import register_reference

    app = command_app(register_reference)

    r = CliRunner().invoke(
        app, ["reference", "--dataset", "synthetic", "-m", "popularity", "-m", "ease", "--out", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "reference.json").read_text())
    assert [m["name"] for m in res["models"]] == ["popularity", "ease"]
    assert "ease" in r.output and "placebo" in r.output
    flat = " ".join(r.output.split())
    assert "wall seconds (1 BLAS thread): popularity (all of it)" in flat and "ease: Gram eigendecomposition" in flat
    bad = CliRunner().invoke(app, ["reference", "--dataset", "synthetic", "-m", "svd"])
    assert bad.exit_code == 2 and "unknown reference" in bad.output


@pytest.mark.parametrize("shape", [(400, 300), (150, 400)])  # item-space and user-space eigendecomposition
def test_shared_factorisation_equals_direct_ease(shape: tuple[int, int]) -> None:
    import scipy.sparse as sp

    s = leave_one_out(synthetic(*shape, seed=3), seed=1)
    x = R.training_matrix(s)
    f = R.gram_factors(x, dtype=np.float64)
    assert f.w.dtype == np.float64 and f.w.shape[1] <= min(shape)
    users, items = R.validation_candidates(s)
    lams = (50.0, 400.0, 1600.0)
    for history in (x, R.recency_weighted_history(s, 5.0)):
        cand = R.ease_candidate_scores(f, sp.csr_matrix(history), lams, users, items)
        for j, lam in enumerate(lams):
            b = R.ease_weights(x, lam).astype(np.float64)
            direct = history.astype(np.float64) @ b
            scale = np.abs(direct).max()
            fast = R.ease_scores_from_factors(f, sp.csr_matrix(history), lam)
            np.testing.assert_allclose(fast, direct, rtol=0, atol=1e-6 * scale * 10)
            np.testing.assert_allclose(cand[j], direct[users[:, None], items], rtol=0, atol=1e-6 * scale * 10)
            pdiag = np.diag(np.linalg.inv(x.T.astype(np.float64) @ x + lam * np.eye(x.shape[1])))
            np.testing.assert_allclose(f.inverse_diag(lam), pdiag, rtol=1e-9)


def test_candidate_scores_refuse_other_items(split: ImplicitSplit) -> None:
    import torch

    users, items = R.validation_candidates(split)
    fn = R.candidate_score_fn(users, items, np.zeros(items.shape, np.float32))
    u = torch.from_numpy(users[:3])
    assert fn(u, torch.from_numpy(items[:3])).shape == (3, items.shape[1])
    with pytest.raises(ValueError, match="not computed for"):
        fn(u, torch.from_numpy(items[:3] + 1))


def test_cli_reference_prints_progress_lines_when_not_a_terminal(tmp_path: Path, command_app) -> None:
    from fedmask.commands.models import register_reference

    app = command_app(register_reference)
    r = CliRunner().invoke(app, ["reference", "--dataset", "synthetic", "-m", "ease", "--progress-every", "0"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("[progress]")]
    # started, one per grid point (6) and the chosen point (interval 0), done
    assert len(lines) >= 8, r.output
    assert "0/7 steps" in lines[0] and "7/7 steps" in lines[-1] and "(done)" in lines[-1]
    assert any("ease lam=400" in ln and "left" in ln for ln in lines)
    quiet = CliRunner().invoke(app, ["reference", "--dataset", "synthetic", "-m", "popularity", "-q"])
    assert quiet.exit_code == 0 and "[progress]" not in quiet.output


def _itemknn_whole_matrix(split: ImplicitSplit, k: int) -> np.ndarray:
    """ItemKNN as it was computed before the shared neighbourhoods: one argpartition
    over the whole similarity matrix, dropped entries zeroed, one sparse product."""
    import scipy.sparse as sp

    x = R.training_csr(split)
    gram = np.asarray((x.T @ x).toarray(), dtype=np.float32)
    norm = np.sqrt(np.diag(gram)) + 1e-9
    sim = gram / norm[:, None] / norm[None, :]
    np.fill_diagonal(sim, 0.0)
    drop = np.argpartition(-sim, k, axis=1)[:, k:]
    np.put_along_axis(sim, drop, 0.0, axis=1)
    return np.asarray((x @ sp.csr_matrix(sim.T)).toarray(), dtype=np.float32)


@pytest.mark.parametrize("k", [1, 7, 50])
def test_itemknn_blocks_and_candidates_are_bit_equal_to_the_whole_matrix(split: ImplicitSplit, k: int) -> None:
    # ties in the similarity (rare items) are common here: the kept sets must match anyway
    before = _itemknn_whole_matrix(split, k)
    x = R.training_csr(split)
    nb = R.neighbourhoods(R.cosine_similarity(x), k, block=37)  # blocks that do not divide n_items
    assert nb.cols.shape == (split.n_items, k) and np.all(np.diff(nb.cols, axis=1) > 0)
    dense = R.itemknn_from_neighbourhoods(x, nb)
    assert np.array_equal(dense, before)
    users, items = R.validation_candidates(split)
    cand = R.itemknn_candidate_scores(x, nb, users, items)
    assert np.array_equal(cand, before[users[:, None], items])
    assert np.count_nonzero(cand) > cand.size // 10  # not trivially all zeros


def test_count_gram_splits_heavy_columns_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    import scipy.sparse as sp

    rng = np.random.default_rng(4)
    a = sp.csr_matrix((rng.random((300, 90)) < np.linspace(0.02, 0.9, 90)).astype(np.float32))
    plain = np.asarray((a @ a.T).toarray(), dtype=np.float32)
    monkeypatch.setattr(R, "HEAVY_FRACTION", 1 / 3)  # about half the columns are heavy (>= 100 of 300 rows)
    assert 10 < np.count_nonzero(np.diff(sp.csc_matrix(a).indptr) >= 100) < 80
    assert np.array_equal(R.count_gram(a, np.float32), plain)
    assert np.array_equal(R.count_gram(a, np.float64), plain.astype(np.float64))
    weighted = a.multiply(1.5).tocsr()  # not binary: the sparse product alone
    np.testing.assert_array_equal(R.count_gram(weighted, np.float64), (weighted @ weighted.T).toarray())
