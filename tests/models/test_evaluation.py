"""Evaluation as sums: batched path vs a slow reference, placebo behaviour, explicit errors."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
import torch

from models.data.splits import leave_one_out, random_explicit_split
from models.data.synthetic import synthetic
from models.data.types import ImplicitSplit
from models.evaluation import (
    EvalSplit,
    evaluate,
    evaluate_explicit,
    evaluate_implicit,
    finalize,
    full_rank,
    merge_sums,
    pessimistic_rank,
    rank_sums,
    rating_sums,
    sampled_sums,
)


@pytest.fixture(scope="module")
def split() -> ImplicitSplit:
    return leave_one_out(synthetic(120, 260, seed=9), seed=1)


def table_scorer(table: torch.Tensor):
    return lambda u, i: table[u[:, None], i]


# ------------------------------------------------------------------ slow reference


def ref_rank(target_score: float, competitor_scores: list[float]) -> int:
    t = -math.inf if math.isnan(target_score) else target_score
    return sum(1 for c in competitor_scores if (math.inf if math.isnan(c) else c) >= t)


def ref_metrics(rank: int, k: int = 10) -> tuple[float, float]:
    return (1.0, 1.0 / math.log2(rank + 2)) if rank < k else (0.0, 0.0)


def reference_implicit(S: np.ndarray, s: ImplicitSplit, stage: str) -> dict[str, float]:
    out = dict.fromkeys(["hr", "ndcg", "full_hr", "full_ndcg", "placebo_hr", "placebo_ndcg"], 0.0)
    n = 0
    for u in range(s.n_users):
        target = int((s.test_item if stage == "test" else s.val_item)[u])
        if target < 0:
            continue
        n += 1
        negs = (s.test_negatives if stage == "test" else s.val_negatives)[u].tolist()
        h, d = ref_metrics(ref_rank(S[u, target], [S[u, j] for j in negs]))
        out["hr"] += h
        out["ndcg"] += d
        train = set(s.train_items[s.train_indptr[u] : s.train_indptr[u + 1]].tolist())
        excluded = train | ({int(s.val_item[u])} if stage == "test" else set())
        comp = [S[u, j] for j in range(s.n_items) if j not in excluded and j != target]
        h, d = ref_metrics(ref_rank(S[u, target], comp))
        out["full_hr"] += h
        out["full_ndcg"] += d
        if stage == "test":
            h, d = ref_metrics(ref_rank(S[u, int(s.placebo_item[u])], [S[u, j] for j in negs]))
            out["placebo_hr"] += h
            out["placebo_ndcg"] += d
    return {k: v / n for k, v in out.items()}


@pytest.mark.parametrize("stage", ["test", "val"])
@pytest.mark.parametrize("ties", [False, True])
def test_batched_matches_reference(split: ImplicitSplit, stage: EvalSplit, ties: bool) -> None:
    g = torch.Generator().manual_seed(3)
    S = torch.rand(split.n_users, split.n_items, generator=g, dtype=torch.float64)
    if ties:  # coarse scores: many ties, and a few NaNs
        S = torch.round(S * 4) / 4
        S[torch.rand(S.shape, generator=g, dtype=torch.float64) < 0.01] = float("nan")
    sums = evaluate_implicit(table_scorer(S), split, stage, batch_size=37)  # ragged batches
    got = finalize(sums)
    ref = reference_implicit(S.numpy(), split, stage)
    for key in ("hr", "ndcg", "full_hr", "full_ndcg"):
        name = {"hr": "hr@10", "ndcg": "ndcg@10", "full_hr": "full_hr@10", "full_ndcg": "full_ndcg@10"}[key]
        assert got[name] == pytest.approx(ref[key], abs=1e-12), name
    if stage == "test":
        assert got["placebo_hr@10"] == pytest.approx(ref["placebo_hr"], abs=1e-12)
        assert got["placebo_ndcg@10"] == pytest.approx(ref["placebo_ndcg"], abs=1e-12)
    else:
        assert "placebo_hr@10" not in got
    assert sums["sampled_count"] == sums["full_count"] == split.n_users


def test_sums_over_user_subsets_add_up(split: ImplicitSplit) -> None:
    S = torch.rand(split.n_users, split.n_items, generator=torch.Generator().manual_seed(5))
    whole = evaluate_implicit(table_scorer(S), split)
    parts = [evaluate_implicit(table_scorer(S), split, users=np.arange(a, min(a + 25, split.n_users))) for a in range(0, split.n_users, 25)]
    merged = merge_sums(parts)
    assert merged.keys() == whole.keys()
    for k in whole:
        assert merged[k] == pytest.approx(whole[k])
    # per-device sums (one user each) add up too
    one = merge_sums(evaluate_implicit(table_scorer(S), split, users=np.array([u]), full=False) for u in range(split.n_users))
    assert one["sampled_hits@10"] == whole["sampled_hits@10"]


def test_constant_scorer_gets_no_free_hits(split: ImplicitSplit) -> None:
    res = finalize(evaluate_implicit(lambda u, i: torch.zeros(i.shape), split))
    assert res["hr@10"] == res["full_hr@10"] == res["placebo_hr@10"] == 0.0


# ------------------------------------------------------------------ placebo


@pytest.fixture(scope="module")
def big_split() -> ImplicitSplit:
    return leave_one_out(synthetic(1500, 400, seed=2, mean_interactions=12), seed=0)


def test_random_scores_give_ten_percent_for_test_and_placebo(big_split: ImplicitSplit) -> None:
    S = torch.rand(big_split.n_users, big_split.n_items, generator=torch.Generator().manual_seed(0))
    res = finalize(evaluate_implicit(table_scorer(S), big_split, full=False))
    # sd of a mean of 1500 Bernoulli(0.1) ~ 0.0077
    assert res["hr@10"] == pytest.approx(0.10, abs=0.035)
    assert res["placebo_hr@10"] == pytest.approx(0.10, abs=0.035)


def test_cheating_scorer_is_caught_by_the_placebo(big_split: ImplicitSplit) -> None:
    test_item = torch.from_numpy(big_split.test_item)
    noise = torch.rand(big_split.n_users, big_split.n_items, generator=torch.Generator().manual_seed(1))

    def cheat(u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return noise[u[:, None], i] + 10.0 * (i == test_item[u][:, None])

    res = finalize(evaluate_implicit(cheat, big_split))
    assert res["hr@10"] == 1.0 and res["ndcg@10"] == 1.0 and res["full_hr@10"] == 1.0
    assert res["placebo_hr@10"] == pytest.approx(0.10, abs=0.035)


def test_popularity_leak_shows_in_placebo_gap(big_split: ImplicitSplit) -> None:
    # a popularity scorer beats the placebo by far: placebo stays near (or below) chance
    pop = torch.from_numpy(np.bincount(big_split.train_items, minlength=big_split.n_items)).double()
    res = finalize(evaluate_implicit(lambda u, i: pop[i], big_split, full=False))
    assert res["hr@10"] > 2 * res["placebo_hr@10"]
    assert res["placebo_hr@10"] < 0.15


# ------------------------------------------------------------------ pure pieces


def test_rank_and_metric_pieces() -> None:
    t = torch.tensor([0.5, 0.5, float("nan"), 0.9])
    c = torch.tensor([[0.1, 0.5, 0.7], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [float("nan"), 0.2, 0.3]])
    assert pessimistic_rank(t, c).tolist() == [2, 0, 3, 1]  # ties and NaNs are pessimistic
    valid = torch.tensor([[True, False, True]] * 4)
    assert pessimistic_rank(t, c, valid).tolist() == [1, 0, 2, 1]
    s = rank_sums(torch.tensor([0, 9, 10, 3]), "sampled", k=10)
    assert s["sampled_hits@10"] == 3 and s["sampled_count"] == 4
    assert s["sampled_ndcg@10"] == pytest.approx(1 + 1 / math.log2(11) + 1 / math.log2(5))
    assert sampled_sums(torch.tensor([1.0]), torch.tensor([[2.0, 0.0]]), k=1)["sampled_hits@1"] == 0
    allsc = torch.tensor([[0.9, 0.8, 0.1, 0.95]])
    ex = torch.tensor([[False, False, False, True]])
    assert full_rank(allsc, torch.tensor([1]), ex).tolist() == [1]  # only item 0 beats it; 3 excluded
    fin = finalize({"sampled_hits@5": 1.0, "sampled_ndcg@5": 0.5, "sampled_count": 2.0})
    assert fin == {"hr@5": 0.5, "ndcg@5": 0.25, "n_users": 2.0}
    assert math.isnan(finalize({"full_hits@10": 0.0, "full_ndcg@10": 0.0, "full_count": 0.0})["full_hr@10"])


def test_rating_sums_and_explicit_evaluation() -> None:
    r = rating_sums(torch.tensor([[1.0, 6.0, 0.0]]), torch.tensor([[2.0, 5.0, 3.0]]), torch.tensor([[True, True, False]]), clip=(1.0, 5.0))
    assert r == {"sse": 1.0, "sae": 1.0, "rating_count": 2.0}
    x = synthetic(80, 200, seed=6)
    e = random_explicit_split(x, 0)
    rng = np.random.default_rng(0)
    P = torch.from_numpy(rng.uniform(0, 6, (x.n_users, x.n_items)))
    sums = evaluate(table_scorer(P), e, "test", batch_size=7)
    pred = np.clip(P.numpy()[e.test_user, e.test_item], 1, 5)
    err = pred - e.test_rating
    fin = finalize(sums)
    assert fin["n_ratings"] == len(e.test_user)
    assert fin["rmse"] == pytest.approx(float(np.sqrt(np.mean(err**2))))
    assert fin["mae"] == pytest.approx(float(np.mean(np.abs(err))))
    raw = finalize(evaluate_explicit(table_scorer(P), e, "val", clip=False))
    verr = P.numpy()[e.val_user, e.val_item] - e.val_rating
    assert raw["rmse"] == pytest.approx(float(np.sqrt(np.mean(verr**2))))
    sub = evaluate_explicit(table_scorer(P), e, "test", users=np.array([0, 1, 2]))
    assert sub["rating_count"] == np.isin(e.test_user, [0, 1, 2]).sum()


def test_score_fn_shape_is_checked(split: ImplicitSplit) -> None:
    with pytest.raises(ValueError, match="score_fn returned shape"):
        evaluate_implicit(lambda u, i: torch.zeros(i.shape[0]), split)
    with pytest.raises(ValueError, match="stage"):
        evaluate_implicit(lambda u, i: torch.zeros(i.shape), split, cast(Any, "train"))  # not a stage


def test_users_without_held_out_items_are_skipped() -> None:
    x = synthetic(60, 200, seed=8, min_interactions=1, mean_interactions=3)
    s = leave_one_out(x, 0)
    n_eval = int((s.test_item >= 0).sum())
    assert 0 < n_eval < s.n_users  # some users are training-only
    seen: list[torch.Tensor] = []

    def scorer(u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        seen.append(i)
        return torch.rand(i.shape, dtype=torch.float64)

    sums = evaluate_implicit(scorer, s)
    assert sums["sampled_count"] == sums["full_count"] == sums["placebo_count"] == n_eval
    assert all(int(t.min()) >= 0 for t in seen)  # no -1 sentinel ever reaches the model
