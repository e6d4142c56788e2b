"""Centralised reference recommenders on the federated models' split.

They answer one question for whoever reads a federated figure: what does a
strong model that sees *all* the data at once reach under the same sound
protocol (same leave-one-out split, same 99 evaluation negatives, same
placebo, same pessimistic ranking of models/evaluation.py)? They are
yardsticks, not shipped recommenders: nothing here is federated or private.

- popularity: an item's number of training users (the same for every user).
- itemknn: cosine item-item similarity; a user's score of a candidate item i
  is the sum of its similarities to those of its `neighbours` most similar
  items that the user trained on (the neighbourhood is the candidate's, as
  in RecBole's ItemKNN).
- ease: Steck's EASE (WWW 2019), the closed-form linear item-item model
  B = argmin ||X - XB||^2 + lam ||B||^2 with diag(B) = 0; often the strongest
  single model on MovieLens-sized data.
- ease-recency: EASE's B applied to a history in which the user's recent
  training items weigh more (1 + boost * exp(-r / half_life), r = 0 for the
  newest). It is the only one that uses the order of a user's interactions;
  the federated models do not.

Model selection: every hyperparameter is chosen on validation HR@10 from a
fixed grid, then the test metrics are computed once for that choice
(`select_on_validation`). Contracts: scores are dense (n_users, n_items)
float32 matrices; a split's training items are in time order per user
(models/data/types.py), which ease-recency relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.data.types import ImplicitSplit
from models.evaluation import evaluate_implicit, finalize

# Item-item models hold a dense n_items^2 matrix; beyond this they are refused
# (about 1.6 GB of float32 per matrix) rather than left to exhaust memory.
MAX_ITEMS_DENSE = 20_000

Scores = np.ndarray  # float32 (n_users, n_items)


def training_matrix(split: ImplicitSplit) -> np.ndarray:
    """Binary (n_users, n_items) float32 matrix of the training interactions."""
    x = np.zeros((split.n_users, split.n_items), dtype=np.float32)
    users = np.repeat(np.arange(split.n_users), np.diff(split.train_indptr))
    x[users, split.train_items] = 1.0
    return x


def recency_weighted_history(split: ImplicitSplit, half_life: float, boost: float = 2.0) -> np.ndarray:
    """Like `training_matrix`, but the r-th most recent training item of a user
    (r = 0 newest) weighs 1 + boost * exp(-r / half_life)."""
    if half_life <= 0:
        raise ValueError(f"half_life must be > 0, not {half_life}")
    counts = np.diff(split.train_indptr)
    users = np.repeat(np.arange(split.n_users), counts)
    position = np.arange(len(split.train_items)) - np.repeat(split.train_indptr[:-1], counts)
    age = np.repeat(counts, counts) - 1 - position
    x = np.zeros((split.n_users, split.n_items), dtype=np.float32)
    x[users, split.train_items] = 1.0 + boost * np.exp(-age / half_life)
    return x


def _check_dense(n_items: int, what: str) -> None:
    if n_items > MAX_ITEMS_DENSE:
        raise ValueError(
            f"{what} needs a dense {n_items} x {n_items} item matrix; refused above {MAX_ITEMS_DENSE} items"
        )


def popularity_scores(split: ImplicitSplit) -> Scores:
    counts = np.bincount(split.train_items, minlength=split.n_items).astype(np.float32)
    return np.broadcast_to(counts, (split.n_users, split.n_items))


def itemknn_scores(split: ImplicitSplit, neighbours: int) -> Scores:
    _check_dense(split.n_items, "itemknn")
    x = training_matrix(split)
    gram = x.T @ x
    norm = np.sqrt(np.diag(gram)) + 1e-9
    sim = gram / norm[:, None] / norm[None, :]
    np.fill_diagonal(sim, 0.0)
    if neighbours < split.n_items:
        drop = np.argpartition(-sim, neighbours, axis=1)[:, neighbours:]
        np.put_along_axis(sim, drop, 0.0, axis=1)
    return x @ sim.T


def ease_weights(x: np.ndarray, lam: float) -> np.ndarray:
    """EASE's item-item matrix B (n_items, n_items) with a zero diagonal."""
    if lam <= 0:
        raise ValueError(f"lam must be > 0, not {lam}")
    _check_dense(x.shape[1], "ease")
    gram = (x.T @ x).astype(np.float64)
    gram[np.diag_indices_from(gram)] += lam
    p = np.linalg.inv(gram)
    b = -p / np.diag(p)
    np.fill_diagonal(b, 0.0)
    return b.astype(np.float32)


def ease_scores(split: ImplicitSplit, lam: float) -> Scores:
    x = training_matrix(split)
    return x @ ease_weights(x, lam)


def ease_recency_scores(split: ImplicitSplit, lam: float, half_life: float) -> Scores:
    return recency_weighted_history(split, half_life) @ ease_weights(training_matrix(split), lam)


def score_fn(scores: Scores) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """models/evaluation.py's score_fn over a dense score matrix."""
    table = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32))

    def fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return table[users[:, None], items]

    return fn


@dataclass(frozen=True)
class Reference:
    """A reference model and its hyperparameter grid (each point a kwargs dict)."""

    name: str
    fit: Callable[..., Scores]
    grid: tuple[Mapping[str, float], ...] = field(default=({},))


REFERENCES: tuple[Reference, ...] = (
    Reference("popularity", lambda split: popularity_scores(split)),
    Reference("itemknn", itemknn_scores, tuple({"neighbours": k} for k in (20, 50, 100, 200))),
    Reference("ease", ease_scores, tuple({"lam": v} for v in (50.0, 100.0, 200.0, 400.0, 800.0, 1600.0))),
    Reference(
        "ease-recency",
        ease_recency_scores,
        tuple({"lam": v, "half_life": h} for v in (200.0, 400.0, 800.0) for h in (5.0, 20.0, 50.0)),
    ),
)


def reference_names() -> tuple[str, ...]:
    return tuple(r.name for r in REFERENCES)


def select_on_validation(split: ImplicitSplit, reference: Reference) -> dict[str, Any]:
    """Fit every grid point, keep the best validation HR@10 (first on ties), and
    evaluate only that one on test. Returns name, params, val, test, placebo and
    the validation HR@10 of every grid point."""
    best: tuple[float, Mapping[str, float], Scores] | None = None
    tried: list[dict[str, Any]] = []
    for params in reference.grid:
        scores = reference.fit(split, **params)
        val = finalize(evaluate_implicit(score_fn(scores), split, "val", full=False))
        tried.append({"params": dict(params), "val_hr@10": val["hr@10"]})
        if best is None or val["hr@10"] > best[0]:
            best = (val["hr@10"], params, scores)
    assert best is not None
    _, params, scores = best
    fn = score_fn(scores)
    val = finalize(evaluate_implicit(fn, split, "val", full=True))
    test = finalize(evaluate_implicit(fn, split, "test", full=True))
    return {
        "name": reference.name,
        "params": dict(params),
        "val": {k: val[k] for k in ("hr@10", "ndcg@10", "full_hr@10")},
        "test": {k: test[k] for k in ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10")},
        "placebo": {"hr@10": test["placebo_hr@10"]},
        "grid": tried,
    }


def run_references(split: ImplicitSplit, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """`select_on_validation` for each named reference (default: all), in REFERENCES order."""
    wanted = set(reference_names() if names is None else names)
    unknown = wanted - set(reference_names())
    if unknown:
        raise ValueError(f"unknown reference model(s) {sorted(unknown)}; known: {', '.join(reference_names())}")
    return [select_on_validation(split, r) for r in REFERENCES if r.name in wanted]
