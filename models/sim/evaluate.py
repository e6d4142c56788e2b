"""Evaluation of a simulated state (the global state and the private rows of
the population) on validation or test, batched for the device it runs on."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from models.base import FederatedRecommender, GlobalState, PrivateState, take_rows
from models.data.types import ExplicitSplit, ImplicitSplit

if TYPE_CHECKING:
    from models.evaluation import EvalSplit

EVAL_BATCH_CPU = 256  # devices scored at a time when evaluating on the CPU
EVAL_BATCH_ACCELERATOR = 2048  # and on an accelerator


def evaluate_state(
    model: FederatedRecommender,
    global_: GlobalState,
    private: PrivateState | Callable[[torch.Tensor], PrivateState],
    split: ImplicitSplit | ExplicitSplit,
    stage: EvalSplit,
    *,
    full: bool,
    placebo: bool,
    device: torch.device,
    population: np.ndarray | None = None,
    score_rows: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    reduce: Callable[[dict[str, float]], dict[str, float]] | None = None,
    score_all_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
) -> dict[str, float]:
    """Metrics of the devices of `population` (dense user ids; row i of
    the private state is user population[i]; None: every user, row = user id).
    `private`: the state itself or a function taking its rows
    (`PrivateTables.take`), so it may live on disk. `score_rows(rows, users,
    items)`, when given, scores instead of `model.score` (a state kept
    sparsely, `SparseTables.scorer`). `reduce`, when given, maps the metric
    sums before the means are taken (a distributed run adds them over its
    ranks, `Ranks.sum_dict`). `score_all_rows(rows, users)`, when given,
    scores every item at once for the full ranking (`model.score_all`)."""
    from models.evaluation import evaluate_explicit, evaluate_implicit, finalize

    take = private if callable(private) else partial(take_rows, private)

    row_of: torch.Tensor | None = None
    if population is not None:
        row_of = torch.full((split.n_users,), -1, dtype=torch.int64, device=device)
        row_of[torch.as_tensor(population, device=device)] = torch.arange(len(population), device=device)

    def score_fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        rows = users if row_of is None else row_of[users]
        if score_rows is not None:
            return score_rows(rows, users, items)
        return model.score(global_, take(rows), users, items)

    def score_all(users: torch.Tensor) -> torch.Tensor | None:
        assert score_all_rows is not None
        return score_all_rows(users if row_of is None else row_of[users], users)

    # an accelerator scores larger batches (fewer launches); the sums do not depend on the batching
    batch = EVAL_BATCH_ACCELERATOR if device.type != "cpu" else EVAL_BATCH_CPU
    with torch.no_grad():
        if isinstance(split, ImplicitSplit):
            sums = evaluate_implicit(
                score_fn, split, stage, full=full, placebo=placebo, device=device, users=population, batch_size=batch,
                score_all=score_all if score_all_rows is not None else None,
            )
        else:
            sums = evaluate_explicit(score_fn, split, stage, device=device, users=population, batch_size=batch)
    return finalize(sums if reduce is None else reduce(dict(sums)))
