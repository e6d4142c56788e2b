"""Evaluation, sound by construction: metrics as per-device SUMS, finalized centrally.

Every metric is a sum over evaluated users (or ratings) plus a count, so edge
clients can compute their own contribution and only sums travel (they can be
securely aggregated like updates). `finalize` turns summed dicts into means.

Definitions (docs/decisions.md):
- Rank of a held-out item = the number of competing items whose score is
  >= its score (pessimistic ties: a constant scorer gets rank = #competitors,
  never a free hit). NaN scores are pessimistic too: a NaN target counts as
  -inf, a NaN competitor as +inf. HR@K = [rank < K]; NDCG@K = [rank < K] /
  log2(rank + 2) (one relevant item, so IDCG = 1).
- Sampled ranking (NCF protocol): the held-out item against its 99 sampled
  negatives (validation: val_item vs val_negatives; test: test_item vs
  test_negatives).
- Full ranking: the held-out item against every item the user has not trained
  on. Validation excludes the training items; test excludes the training items
  and the validation item (it is history by test time, as in RecBole's
  full-sort evaluation). The other held-out item stays a competitor.
- Placebo (test only): the split's placebo item ranked against the *test*
  negatives exactly like the test item. It is an item the user never touched,
  so a sound pipeline gives placebo HR@10 ~= 10/100 whatever the model; a
  higher value means the ranking leaks (e.g. popularity of never-seen items
  or a bug that makes sampled negatives easy).
- Explicit: sums of squared and absolute errors over rated pairs -> RMSE, MAE.
  Predictions are clipped to the split's rating range by default.
- Users with no held-out item (test_item == -1, see models/data/splits.py) are
  skipped and not counted.

Batched evaluation takes a `score_fn(users (B,), items (B, K)) -> scores (B, K)`
callback, so it works with any model of models/base.py; the engine passes
`lambda u, i: model.score(global_, take_rows(private, u), u, i)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import numpy as np
import torch

from models.data.sampling import pad_csr
from models.data.types import ExplicitSplit, ImplicitSplit

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Sums = dict[str, float]
#: The held-out split an evaluation scores: validation or test (not a
#: secure-aggregation stage: that is secagg.stages.Stage).
EvalSplit = Literal["val", "test"]

K_DEFAULT = 10


# ============================================================ per-device math (pure)


def pessimistic_rank(
    target: torch.Tensor, competitors: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) number of competitors (B, N) scoring >= the target (B,); `valid` masks competitors."""
    t = torch.nan_to_num(target.float(), nan=-math.inf)
    c = torch.nan_to_num(competitors.float(), nan=math.inf)
    beats = c >= t[:, None]
    if valid is not None:
        beats &= valid
    return beats.sum(dim=1)


def rank_sums(ranks: torch.Tensor, prefix: str, k: int = K_DEFAULT) -> Sums:
    """HR@k / NDCG@k sums and the count for 0-based ranks (B,)."""
    r = ranks.to(torch.float64)
    hit = r < k
    ndcg = torch.where(hit, 1.0 / torch.log2(r + 2.0), torch.zeros_like(r))
    return {
        f"{prefix}_hits@{k}": float(hit.sum()),
        f"{prefix}_ndcg@{k}": float(ndcg.sum()),
        f"{prefix}_count": float(r.numel()),
    }


def sampled_sums(
    target_scores: torch.Tensor, negative_scores: torch.Tensor, prefix: str = "sampled", k: int = K_DEFAULT
) -> Sums:
    """Held-out (B,) vs its sampled negatives (B, N)."""
    return rank_sums(pessimistic_rank(target_scores, negative_scores), prefix, k)


def full_rank(all_scores: torch.Tensor, target: torch.Tensor, exclude: torch.Tensor) -> torch.Tensor:
    """(B,) rank of `target` (B,) among all items (scores (B, n_items)), ignoring the
    items where `exclude` (B, n_items) is True; the target itself never competes."""
    rows = torch.arange(all_scores.shape[0], device=all_scores.device)
    t = all_scores[rows, target]
    valid = ~exclude.clone()
    valid[rows, target] = False
    return pessimistic_rank(t, all_scores, valid)


def rating_sums(
    pred: torch.Tensor,
    true: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: tuple[float, float] | None = None,
) -> Sums:
    """Squared / absolute error sums over the (masked) entries."""
    p = pred.to(torch.float64)
    if clip is not None:
        p = p.clamp(clip[0], clip[1])
    err = p - true.to(torch.float64)
    if mask is not None:
        err = err[mask]
    return {"sse": float((err**2).sum()), "sae": float(err.abs().sum()), "rating_count": float(err.numel())}


def merge_sums(parts: Iterable[Mapping[str, float]]) -> Sums:
    """Add sum dicts (e.g. from devices or batches) key by key."""
    out: Sums = {}
    for p in parts:
        for key, v in p.items():
            out[key] = out.get(key, 0.0) + float(v)
    return out


_HIT = re.compile(r"^(sampled|full|placebo)_hits@(\d+)$")
_NDCG = re.compile(r"^(sampled|full|placebo)_ndcg@(\d+)$")


def finalize(sums: Mapping[str, float]) -> dict[str, float]:
    """Means from sums: `hr@10`, `ndcg@10` (sampled), `full_hr@10`, `full_ndcg@10`,
    `placebo_hr@10`, `placebo_ndcg@10`, `rmse`, `mae` — each present when its sums
    are; NaN when its count is 0. Counts are passed through as `n_users` (sampled),
    `n_ratings` (explicit)."""

    def mean(num: float, count: float) -> float:
        return num / count if count > 0 else math.nan

    name = {"sampled": "", "full": "full_", "placebo": "placebo_"}
    out: dict[str, float] = {}
    for key, v in sums.items():
        for pat, metric in ((_HIT, "hr"), (_NDCG, "ndcg")):
            m = pat.match(key)
            if m:
                fam, k = m.group(1), m.group(2)
                out[f"{name[fam]}{metric}@{k}"] = mean(v, sums.get(f"{fam}_count", 0.0))
    if "sampled_count" in sums:
        out["n_users"] = float(sums["sampled_count"])
    if "rating_count" in sums:
        n = sums["rating_count"]
        mse = mean(sums.get("sse", 0.0), n)
        out["rmse"] = math.sqrt(mse) if mse >= 0 else math.nan  # a negative (impossible) sum never raises
        out["mae"] = mean(sums.get("sae", 0.0), n)
        out["n_ratings"] = float(n)
    return out


# ============================================================ batched over a split


def _check_stage(stage: str) -> None:
    """ValueError unless `stage` is an `EvalSplit`."""
    if stage not in ("val", "test"):
        raise ValueError(f"stage must be 'val' or 'test', not {stage!r}")


def _user_ids(users: np.ndarray | torch.Tensor) -> np.ndarray:
    """Dense user ids as int64 numpy, from an array or a tensor on any device."""
    return np.asarray(users.cpu() if isinstance(users, torch.Tensor) else users, dtype=np.int64)


def _batches(users: np.ndarray, batch_size: int) -> Iterable[np.ndarray]:
    for s in range(0, len(users), batch_size):
        yield users[s : s + batch_size]


def _scores(score_fn: ScoreFn, users: np.ndarray, items: np.ndarray, device: torch.device | str | None):
    u = torch.from_numpy(np.ascontiguousarray(users, dtype=np.int64)).to(device)
    it = torch.from_numpy(np.ascontiguousarray(items, dtype=np.int64)).to(device)
    with torch.no_grad():
        s = score_fn(u, it)
    if s.shape != it.shape:
        raise ValueError(f"score_fn returned shape {tuple(s.shape)} for items of shape {tuple(it.shape)}")
    return s.detach()


def _scores_all(score_all: Callable[[torch.Tensor], torch.Tensor | None], users: np.ndarray, n_items: int,
                device: torch.device | str | None) -> torch.Tensor | None:
    u = torch.from_numpy(np.ascontiguousarray(users, dtype=np.int64)).to(device)
    with torch.no_grad():
        s = score_all(u)
    if s is not None and tuple(s.shape) != (len(users), n_items):
        raise ValueError(f"score_all returned shape {tuple(s.shape)} for {len(users)} users and {n_items} items")
    return None if s is None else s.detach()


def evaluate_implicit(
    score_fn: ScoreFn,
    split: ImplicitSplit,
    stage: EvalSplit = "test",
    *,
    users: np.ndarray | torch.Tensor | None = None,
    k: int = K_DEFAULT,
    full: bool = True,
    placebo: bool = True,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    score_all: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
) -> Sums:
    """Sums for the sampled (and full / placebo) rankings of `users` (default: all).

    Users without a held-out item are skipped. Placebo sums are produced only
    for stage="test". `score_all(users)`, when given, scores every item at
    once for the full ranking ((B, n_items), equal to `score_fn` at every
    item; None: use `score_fn`).
    """
    _check_stage(stage)
    all_users = np.arange(split.n_users) if users is None else _user_ids(users)
    target_all = split.test_item if stage == "test" else split.val_item
    negs_all = split.test_negatives if stage == "test" else split.val_negatives
    ev = all_users[target_all[all_users] >= 0]
    parts: list[Sums] = []
    zero = {f"sampled_hits@{k}": 0.0, f"sampled_ndcg@{k}": 0.0, "sampled_count": 0.0}
    if full:
        zero |= {f"full_hits@{k}": 0.0, f"full_ndcg@{k}": 0.0, "full_count": 0.0}
    if placebo and stage == "test":
        zero |= {f"placebo_hits@{k}": 0.0, f"placebo_ndcg@{k}": 0.0, "placebo_count": 0.0}
    parts.append(zero)
    do_placebo = placebo and stage == "test"
    for bu in _batches(ev, batch_size):
        target = target_all[bu]
        negs = negs_all[bu]
        cols = [target[:, None], negs]
        if do_placebo:
            cols.append(split.placebo_item[bu][:, None])
        s = _scores(score_fn, bu, np.concatenate(cols, axis=1), device)
        n_neg = negs.shape[1]
        parts.append(sampled_sums(s[:, 0], s[:, 1 : 1 + n_neg], "sampled", k))
        if do_placebo:
            parts.append(sampled_sums(s[:, 1 + n_neg], s[:, 1 : 1 + n_neg], "placebo", k))
        if full:
            B, n = len(bu), split.n_items
            sa = _scores_all(score_all, bu, n, device) if score_all is not None else None
            if sa is None:
                sa = _scores(score_fn, bu, np.broadcast_to(np.arange(n, dtype=np.int64), (B, n)), device)
            lengths, (tr,), mask = pad_csr(split.train_indptr, [split.train_items], bu)
            exclude = np.zeros((B, n), dtype=bool)
            rr = np.broadcast_to(np.arange(B)[:, None], tr.shape)
            exclude[rr[mask], tr[mask]] = True
            if stage == "test":
                exclude[np.arange(B), split.val_item[bu]] = True
            ex = torch.from_numpy(exclude).to(sa.device)
            tgt = torch.from_numpy(target).to(sa.device)
            parts.append(rank_sums(full_rank(sa, tgt, ex), "full", k))
    return merge_sums(parts)


def evaluate_explicit(
    score_fn: ScoreFn,
    split: ExplicitSplit,
    stage: EvalSplit = "test",
    *,
    users: np.ndarray | torch.Tensor | None = None,
    clip: bool = True,
    batch_size: int = 256,
    device: torch.device | str | None = None,
) -> Sums:
    """SSE / SAE / count over the held-out ratings of `users` (default: all)."""
    _check_stage(stage)
    eu, ei, er = (
        (split.test_user, split.test_item, split.test_rating)
        if stage == "test"
        else (split.val_user, split.val_item, split.val_rating)
    )
    order = np.argsort(eu, kind="stable")
    eu, ei, er = eu[order], ei[order], er[order]
    counts = np.bincount(eu, minlength=split.n_users)
    indptr = np.zeros(split.n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if users is None:
        sel = np.flatnonzero(counts > 0)
    else:
        sel = _user_ids(users)
        sel = sel[counts[sel] > 0]
    parts: list[Sums] = [{"sse": 0.0, "sae": 0.0, "rating_count": 0.0}]
    rng = split.rating_range if clip else None
    for bu in _batches(sel, batch_size):
        _, (items, ratings), mask = pad_csr(indptr, [ei, er], bu)
        s = _scores(score_fn, bu, items, device)
        parts.append(
            rating_sums(s, torch.from_numpy(ratings).to(s.device), torch.from_numpy(mask).to(s.device), rng)
        )
    return merge_sums(parts)


def evaluate(
    score_fn: ScoreFn,
    split: ImplicitSplit | ExplicitSplit,
    stage: EvalSplit = "test",
    **kwargs,
) -> Sums:
    """`evaluate_implicit` or `evaluate_explicit` by the split's type."""
    if isinstance(split, ImplicitSplit):
        return evaluate_implicit(score_fn, split, stage, **kwargs)
    if isinstance(split, ExplicitSplit):
        return evaluate_explicit(score_fn, split, stage, **kwargs)
    raise TypeError(f"expected ImplicitSplit or ExplicitSplit, got {type(split).__name__}")
