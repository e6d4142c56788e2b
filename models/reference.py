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

Speed (docs/decisions.md, "EASE over a grid: one eigendecomposition"): EASE
and EASE-recency share ONE eigendecomposition of the Gram matrix over the whole
lambda grid and every recency setting (`GramFactors`): with G = X^T X =
W diag(s) W^T on its range, (G + lam I)^-1 = I/lam - W diag(s / (lam (s + lam))) W^T,
so each lambda costs a diagonal, not an inverse. The eigendecomposition is taken
in the smaller space (X X^T when there are fewer users than items). Validation
only needs each user's 100 candidates, so grid points are scored there (every
lambda of a history in one pass); only the chosen point gets a dense score
matrix for the full-rank metrics. Histories (X, recency-weighted X) are sparse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import time

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch
from threadpoolctl import threadpool_limits

from models.data.types import ImplicitSplit
from models.evaluation import evaluate_implicit, finalize
from models.sim.progress import NullProgress, Progress

# Item-item models hold a dense n_items^2 matrix; beyond this they are refused
# (about 1.6 GB of float32 per matrix) rather than left to exhaust memory.
MAX_ITEMS_DENSE = 20_000
# The eigendecomposition runs in float64 up to this size, in float32 above
# (float32 halves time and memory; the EASE test checks the float64 path to 1e-6).
EIGH_FLOAT64_MAX = 4_000
# Users per chunk when candidate scores gather item factor rows (bounds memory).
GATHER_CHUNK = 64
# count_gram: an inner column with at least this fraction of the rows non-zero goes
# through dense BLAS (it costs ~rows^2 flops there, ~count^2 slower scalar steps in
# the sparse product; on the 8,000-row synthetic Gram, 1,000 rows was measured faster
# than 300: 8.1 s against 10.2 s, the sparse product alone 14.9 s, on a shared machine).
HEAVY_FRACTION = 0.125
# Rows per argpartition block, and users per chunk of ItemKNN candidate scoring.
KNN_BLOCK = 1024
KNN_CANDIDATE_CHUNK = 128

Scores = np.ndarray  # float32 (n_users, n_items)
ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the block with `n` BLAS/LAPACK (OpenBLAS, MKL, OpenMP) threads and `n` torch
    threads, then restore both. Results do not depend on `n` beyond float rounding."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, not {n}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(before)


def training_csr(split: ImplicitSplit) -> sp.csr_matrix:
    """Binary (n_users, n_items) float32 sparse matrix of the training interactions."""
    users = np.repeat(np.arange(split.n_users), np.diff(split.train_indptr))
    data = np.ones(len(users), dtype=np.float32)
    return sp.csr_matrix((data, (users, split.train_items)), shape=(split.n_users, split.n_items))


def training_matrix(split: ImplicitSplit) -> np.ndarray:
    """Binary (n_users, n_items) float32 matrix of the training interactions."""
    return np.asarray(training_csr(split).toarray(), dtype=np.float32)


def recency_weighted_csr(split: ImplicitSplit, half_life: float, boost: float = 2.0) -> sp.csr_matrix:
    """Like `training_csr`, but the r-th most recent training item of a user
    (r = 0 newest) weighs 1 + boost * exp(-r / half_life)."""
    if half_life <= 0:
        raise ValueError(f"half_life must be > 0, not {half_life}")
    counts = np.diff(split.train_indptr)
    users = np.repeat(np.arange(split.n_users), counts)
    position = np.arange(len(split.train_items)) - np.repeat(split.train_indptr[:-1], counts)
    age = np.repeat(counts, counts) - 1 - position
    w = (1.0 + boost * np.exp(-age / half_life)).astype(np.float32)
    return sp.csr_matrix((w, (users, split.train_items)), shape=(split.n_users, split.n_items))


def recency_weighted_history(split: ImplicitSplit, half_life: float, boost: float = 2.0) -> np.ndarray:
    """Dense `recency_weighted_csr`."""
    return np.asarray(recency_weighted_csr(split, half_life, boost).toarray(), dtype=np.float32)


def _check_dense(n_items: int, what: str) -> None:
    if n_items > MAX_ITEMS_DENSE:
        raise ValueError(
            f"{what} needs a dense {n_items} x {n_items} item matrix; refused above {MAX_ITEMS_DENSE} items"
        )


def popularity_scores(split: ImplicitSplit) -> Scores:
    counts = np.bincount(split.train_items, minlength=split.n_items).astype(np.float32)
    return np.broadcast_to(counts, (split.n_users, split.n_items))


def count_gram(a: sp.spmatrix, dtype: type | np.dtype) -> np.ndarray:
    """Dense A A^T in `dtype` for a sparse A. When A is binary (a training history)
    the entries are counts, exact in float32 and float64 below 2^24 whatever the
    order of summation, so the inner columns held by many rows go through one dense
    BLAS product and the rest through the sparse product: the same numbers as the
    sparse product alone, faster on long-tailed data. Otherwise the sparse product."""
    a = sp.csc_matrix(a)
    dt = np.dtype(dtype)
    binary = a.shape[1] < 2**24 and bool(np.all(a.data == 1))
    heavy = np.flatnonzero(np.diff(a.indptr) >= HEAVY_FRACTION * a.shape[0]) if binary else np.empty(0, dtype=np.int64)
    if len(heavy) == 0:
        return np.asarray((a @ a.T).toarray(), dtype=dt)
    dense = np.asarray(a[:, heavy].toarray(), dtype=dt)
    out = dense @ dense.T
    del dense
    rest = a[:, np.setdiff1d(np.arange(a.shape[1]), heavy)].tocsr()
    out += np.asarray((rest @ rest.T).toarray(), dtype=dt)
    return out


def cosine_similarity(x: sp.csr_matrix) -> np.ndarray:
    """Dense (n_items, n_items) float32 cosine similarity of the columns of a binary x,
    with a zero diagonal. The Gram matrix holds integer counts (exact in float32)."""
    _check_dense(x.shape[1], "itemknn")
    sim = count_gram(sp.csr_matrix(x).T, np.float32)
    norm = np.sqrt(np.diag(sim)) + 1e-9
    sim /= norm[:, None]  # in place: the same two float32 divisions as sim / a / b
    sim /= norm[None, :]
    np.fill_diagonal(sim, 0.0)
    return sim


@dataclass(frozen=True)
class Neighbourhoods:
    """Each item's `k` most similar items: cols (n_items, k) int64, ascending per row,
    and their similarities vals (n_items, k) float32 (zeros included). The kept set
    of a row is `np.argpartition(-sim_row, k)[:k]`, row by row, so ties at the k-th
    place are settled exactly as a whole-matrix argpartition settles them."""

    cols: np.ndarray
    vals: np.ndarray

    def transposed_csr(self) -> sp.csr_matrix:
        """S^T as CSR, S the (n_items, n_items) matrix of the kept similarities; x @ S^T
        are the dense ItemKNN scores (row j holds the items that keep j)."""
        n, k = self.cols.shape
        rows = np.repeat(np.arange(n), k)
        m = sp.csr_matrix((self.vals.ravel(), (self.cols.ravel(), rows)), shape=(n, n))
        m.eliminate_zeros()
        return m


def neighbourhoods(sim: np.ndarray, k: int, block: int = KNN_BLOCK) -> Neighbourhoods:
    """The `k` nearest neighbours of every row of `sim` (all of them when k >= n_items)."""
    n = sim.shape[0]
    if k >= n:
        cols = np.broadcast_to(np.arange(n, dtype=np.int64), (n, n)).copy()
        return Neighbourhoods(cols=cols, vals=np.array(sim, dtype=np.float32))
    cols = np.empty((n, k), dtype=np.int64)
    for lo in range(0, n, block):
        part = np.argpartition(-sim[lo : lo + block], k, axis=1)[:, :k]
        cols[lo : lo + block] = np.sort(part, axis=1)
    return Neighbourhoods(cols=cols, vals=np.take_along_axis(sim, cols, axis=1))


def itemknn_from_neighbourhoods(x: sp.csr_matrix, nb: Neighbourhoods) -> Scores:
    """Dense ItemKNN scores x @ S^T (the sparse product, in blocks of users)."""
    sim_t = nb.transposed_csr()
    out = np.empty(x.shape, dtype=np.float32)
    for lo in range(0, x.shape[0], 1024):
        out[lo : lo + 1024] = (x[lo : lo + 1024] @ sim_t).toarray()
    return out


def itemknn_candidate_scores(x: sp.csr_matrix, nb: Neighbourhoods, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """ItemKNN scores of `items` (n, K) for `users` (n,), bit-equal to the same entries
    of `itemknn_from_neighbourhoods`: a score is the float32 sum, in ascending item
    order, of the kept similarities to the user's training items, which is the
    order in which the sparse product x @ S^T accumulates it (x has sorted indices)."""
    xs = sp.csr_matrix(x)
    if not xs.has_sorted_indices:
        xs = xs.sorted_indices()
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    out = np.empty(items.shape, dtype=np.float32)
    for lo in range(0, len(users), KNN_CANDIDATE_CHUNK):
        sl = slice(lo, lo + KNN_CANDIDATE_CHUNK)
        hist = xs[users[sl]].toarray() != 0  # (c, n_items)
        cols = nb.cols[items[sl]]  # (c, K, k)
        held = np.take_along_axis(hist[:, None, :], cols.reshape(len(cols), -1)[:, None, :], axis=2)
        terms = np.where(held.reshape(cols.shape), nb.vals[items[sl]], np.float32(0.0))
        # cumsum adds left to right in float32 (+0.0 leaves a sum unchanged)
        out[sl] = np.cumsum(terms, axis=2, dtype=np.float32)[:, :, -1] if cols.shape[2] else 0.0
    return out


def itemknn_scores(split: ImplicitSplit, neighbours: int) -> Scores:
    x = training_csr(split)
    return itemknn_from_neighbourhoods(x, neighbourhoods(cosine_similarity(x), neighbours))


def ease_weights(x: np.ndarray, lam: float) -> np.ndarray:
    """EASE's item-item matrix B (n_items, n_items) with a zero diagonal, by a direct
    inverse (the definition; `GramFactors` computes the same without one per lambda)."""
    if lam <= 0:
        raise ValueError(f"lam must be > 0, not {lam}")
    _check_dense(x.shape[1], "ease")
    gram = (x.T @ x).astype(np.float64)
    gram[np.diag_indices_from(gram)] += lam
    p = np.linalg.inv(gram)
    b = -p / np.diag(p)
    np.fill_diagonal(b, 0.0)
    return b.astype(np.float32)


@dataclass(frozen=True)
class GramFactors:
    """G = X^T X = w diag(s) w^T on G's range: w (n_items, r) orthonormal columns,
    s (r,) > 0. For lam > 0, P = (G + lam I)^-1 = I/lam - w diag(c) w^T with
    c = s / (lam (s + lam)), and EASE's scores of a history H are
    H B = H - (H P) diag(1/diag P) (B = I - P diag(1/diag P) has a zero diagonal)."""

    w: np.ndarray
    s: np.ndarray  # float64

    @cached_property
    def _w2(self) -> np.ndarray:
        return np.square(self.w, dtype=np.float64)

    def coefficients(self, lam: float) -> np.ndarray:
        if lam <= 0:
            raise ValueError(f"lam must be > 0, not {lam}")
        return self.s / (lam * (self.s + lam))

    def inverse_diag(self, lam: float) -> np.ndarray:
        """diag((G + lam I)^-1), float64 (n_items,)."""
        return 1.0 / lam - self._w2 @ self.coefficients(lam)


def gram_factors(x: sp.spmatrix | np.ndarray, dtype: type | None = None) -> GramFactors:
    """Eigendecomposition of X^T X, via X X^T when X has fewer rows than columns
    (w = X^T u / sqrt(s)). Eigenvalues below max(s) * dim * eps are dropped (their
    coefficient c is ~0). `dtype`: float64 up to EIGH_FLOAT64_MAX, else float32."""
    xs = sp.csr_matrix(x)
    n_users, n_items = xs.shape
    _check_dense(min(n_users, n_items), "ease")
    dim = min(n_users, n_items)
    dt = np.dtype(dtype if dtype is not None else (np.float64 if dim <= EIGH_FLOAT64_MAX else np.float32))
    xd = xs.astype(dt)
    small = n_users < n_items
    gram = count_gram(xd if small else xd.T, dt)
    s, v = scipy.linalg.eigh(gram, overwrite_a=True, check_finite=False, driver="evd")
    del gram
    keep = s > max(float(s[-1]), 0.0) * dim * np.finfo(dt).eps
    s, v = s[keep], v[:, keep]
    if small:
        w = np.asarray(xd.T @ v, dtype=dt) / np.sqrt(s).astype(dt)
    else:
        w = np.ascontiguousarray(v)
    return GramFactors(w=np.ascontiguousarray(w), s=s.astype(np.float64))


def ease_scores_from_factors(f: GramFactors, history: sp.spmatrix, lam: float) -> Scores:
    """Dense EASE scores H B of a (sparse) history H; exact, no inverse."""
    h = sp.csr_matrix(history)
    c = f.coefficients(lam).astype(f.w.dtype)
    pdiag = f.inverse_diag(lam)
    hw = np.asarray(h @ f.w)
    dense = (hw * c) @ f.w.T  # = H/lam - H P
    out = np.asarray(h.toarray(), dtype=np.float64) * (1.0 - 1.0 / (lam * pdiag))
    out += dense / pdiag
    return out.astype(np.float32)


def ease_candidate_scores(
    f: GramFactors, history: sp.spmatrix, lams: Iterable[float], users: np.ndarray, items: np.ndarray
) -> np.ndarray:
    """EASE scores of `items` (n, K) for `users` (n,), for every lam at once:
    (len(lams), n, K) float32, equal to `ease_scores_from_factors` at those entries."""
    lam_list = [float(v) for v in lams]
    h = sp.csr_matrix(history)
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    hw = torch.from_numpy(np.ascontiguousarray(np.asarray(h[users] @ f.w)))
    w = torch.from_numpy(f.w)
    coef = torch.from_numpy(np.stack([f.coefficients(v) for v in lam_list]).astype(f.w.dtype))  # (L, r)
    pdiag = np.stack([f.inverse_diag(v) for v in lam_list])  # (L, n_items)
    hvals = np.asarray(h[np.repeat(users, items.shape[1]), items.ravel()], dtype=np.float64).reshape(items.shape)
    out = np.empty((len(lam_list), len(users), items.shape[1]), dtype=np.float32)
    for lo in range(0, len(users), GATHER_CHUNK):
        sl = slice(lo, lo + GATHER_CHUNK)
        it = torch.from_numpy(items[sl])
        wg = w[it]  # (c, K, r)
        a = hw[sl][:, None, :] * coef[None, :, :]  # (c, L, r)
        dots = torch.bmm(a, wg.transpose(1, 2)).numpy().astype(np.float64)  # (c, L, K): (H/lam - HP)[u, i]
        for j, lam in enumerate(lam_list):
            pd = pdiag[j][items[sl]]
            out[j, sl] = hvals[sl] * (1.0 - 1.0 / (lam * pd)) + dots[:, j] / pd
    return out


def ease_scores(split: ImplicitSplit, lam: float) -> Scores:
    x = training_csr(split)
    return ease_scores_from_factors(gram_factors(x), x, lam)


def ease_recency_scores(split: ImplicitSplit, lam: float, half_life: float) -> Scores:
    return ease_scores_from_factors(gram_factors(training_csr(split)), recency_weighted_csr(split, half_life), lam)


def score_fn(scores: Scores) -> ScoreFn:
    """models/evaluation.py's score_fn over a dense score matrix."""
    table = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32))

    def fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return table[users[:, None], items]

    return fn


def validation_candidates(split: ImplicitSplit) -> tuple[np.ndarray, np.ndarray]:
    """The users evaluate_implicit ranks on validation and their items, in its order:
    (users (n,), items (n, 100) = [val item, 99 val negatives])."""
    users = np.flatnonzero(split.val_item >= 0)
    return users, np.concatenate([split.val_item[users][:, None], split.val_negatives[users]], axis=1)


def candidate_score_fn(users: np.ndarray, items: np.ndarray, table: np.ndarray) -> ScoreFn:
    """A score_fn that answers only for the (user, items) rows it was built for
    (`table` (n, K) holds their scores); anything else is an error, not a guess."""
    row = np.full(int(users.max()) + 1 if len(users) else 0, -1, dtype=np.int64)
    row[users] = np.arange(len(users))
    row_t = torch.from_numpy(row)
    items_t = torch.from_numpy(np.ascontiguousarray(items))
    table_t = torch.from_numpy(np.ascontiguousarray(table, dtype=np.float32))

    def fn(u: torch.Tensor, it: torch.Tensor) -> torch.Tensor:
        r = row_t[u.cpu()]
        if bool((r < 0).any()) or not torch.equal(items_t[r], it.cpu()):
            raise ValueError("candidate scores asked for items they were not computed for")
        return table_t[r]

    return fn


class ReferenceContext:
    """What every reference model of one split shares, computed once on first use:
    the sparse training matrix, the Gram factors, the validation candidates, and
    the candidate scores of every (history, lambda) of the EASE grids."""

    def __init__(self, split: ImplicitSplit, progress: Progress | None = None) -> None:
        self.split = split
        self.progress = progress or NullProgress()
        self._tables: dict[tuple[float | None, float], np.ndarray] = {}
        self._neighbourhoods: dict[int, Neighbourhoods] = {}
        # wall seconds of the shared steps and of each reference model (whole selection),
        # in the order they ran; reported, never part of a result
        self.timings: dict[str, float] = {}

    def _timed(self, name: str, t0: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    @cached_property
    def x(self) -> sp.csr_matrix:
        return training_csr(self.split)

    @cached_property
    def factors(self) -> GramFactors:
        n_u, n_i = self.split.n_users, self.split.n_items
        self.progress.update(status=f"eigendecomposition of the {min(n_u, n_i)}-square Gram matrix")
        t0 = time.perf_counter()
        f = gram_factors(self.x)
        self._timed("ease: Gram eigendecomposition", t0)
        return f

    @cached_property
    def similarity(self) -> np.ndarray:
        self.progress.update(status=f"cosine similarity of {self.split.n_items} items")
        t0 = time.perf_counter()
        sim = cosine_similarity(self.x)
        self._timed("itemknn: cosine similarity", t0)
        return sim

    def neighbourhoods(self, k: int) -> Neighbourhoods:
        if k not in self._neighbourhoods:
            sim = self.similarity
            t0 = time.perf_counter()
            self._neighbourhoods[k] = neighbourhoods(sim, k)
            self._timed("itemknn: neighbourhoods (every k)", t0)
        return self._neighbourhoods[k]

    def itemknn_val_fn(self, k: int) -> ScoreFn:
        """Validation score_fn of ItemKNN with `k` neighbours: candidates only."""
        users, items = self.candidates
        return candidate_score_fn(users, items, itemknn_candidate_scores(self.x, self.neighbourhoods(k), users, items))

    def itemknn_dense(self, k: int) -> Scores:
        return itemknn_from_neighbourhoods(self.x, self.neighbourhoods(k))

    @cached_property
    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        return validation_candidates(self.split)

    def history(self, half_life: float | None) -> sp.csr_matrix:
        return self.x if half_life is None else recency_weighted_csr(self.split, half_life)

    def ease_val_fn(self, lam: float, half_life: float | None, grid_lams: Iterable[float]) -> ScoreFn:
        """Validation score_fn of EASE (half_life None) or EASE-recency; the first call
        for a history scores every lambda of `grid_lams` in one pass."""
        if (half_life, lam) not in self._tables:
            lams = sorted({float(v) for v in grid_lams} | {float(lam)})
            users, items = self.candidates
            tables = ease_candidate_scores(self.factors, self.history(half_life), lams, users, items)
            for v, t in zip(lams, tables):
                self._tables[(half_life, v)] = t
        users, items = self.candidates
        return candidate_score_fn(users, items, self._tables[(half_life, float(lam))])

    def ease_dense(self, lam: float, half_life: float | None) -> Scores:
        return ease_scores_from_factors(self.factors, self.history(half_life), lam)


@dataclass(frozen=True)
class Reference:
    """A reference model and its hyperparameter grid (each point a kwargs dict).

    `val_fn(ctx, params, grid)` scores the validation candidates of one grid point;
    `full(ctx, params)` gives the dense scores of the chosen point."""

    name: str
    val_fn: Callable[[ReferenceContext, Mapping[str, float], tuple[Mapping[str, float], ...]], ScoreFn]
    full: Callable[[ReferenceContext, Mapping[str, float]], Scores]
    grid: tuple[Mapping[str, float], ...] = field(default=({},))


def _dense_val(fit: Callable[..., Scores]) -> Callable[..., ScoreFn]:
    return lambda ctx, params, grid: score_fn(fit(ctx.split, *(int(v) for v in params.values())))


REFERENCES: tuple[Reference, ...] = (
    Reference("popularity", _dense_val(popularity_scores), lambda ctx, p: popularity_scores(ctx.split)),
    Reference(
        "itemknn",
        lambda ctx, p, grid: ctx.itemknn_val_fn(int(p["neighbours"])),
        lambda ctx, p: ctx.itemknn_dense(int(p["neighbours"])),
        tuple({"neighbours": k} for k in (20, 50, 100, 200)),
    ),
    Reference(
        "ease",
        lambda ctx, p, grid: ctx.ease_val_fn(p["lam"], None, [g["lam"] for g in grid]),
        lambda ctx, p: ctx.ease_dense(p["lam"], None),
        tuple({"lam": v} for v in (50.0, 100.0, 200.0, 400.0, 800.0, 1600.0)),
    ),
    Reference(
        "ease-recency",
        lambda ctx, p, grid: ctx.ease_val_fn(p["lam"], p["half_life"], [g["lam"] for g in grid]),
        lambda ctx, p: ctx.ease_dense(p["lam"], p["half_life"]),
        tuple({"lam": v, "half_life": h} for v in (200.0, 400.0, 800.0) for h in (5.0, 20.0, 50.0)),
    ),
)


def reference_names() -> tuple[str, ...]:
    return tuple(r.name for r in REFERENCES)


def select_on_validation(
    split: ImplicitSplit, reference: Reference, ctx: ReferenceContext | None = None
) -> dict[str, Any]:
    """Score every grid point on validation, keep the best validation HR@10 (first on
    ties), and evaluate only that one on test. Returns name, params, val, test,
    placebo and the validation HR@10 of every grid point."""
    ctx = ctx or ReferenceContext(split)
    bar = ctx.progress
    best: tuple[float, Mapping[str, float]] | None = None
    tried: list[dict[str, Any]] = []
    for params in reference.grid:
        val = finalize(evaluate_implicit(reference.val_fn(ctx, params, reference.grid), split, "val", full=False))
        tried.append({"params": dict(params), "val_hr@10": val["hr@10"]})
        if best is None or val["hr@10"] > best[0]:
            best = (val["hr@10"], params)
        label = ", ".join(f"{k}={v:g}" for k, v in params.items()) or "-"
        bar.advance(status=f"{reference.name} {label}: val hr@10 {val['hr@10']:.3f}")
    assert best is not None
    _, params = best
    bar.update(status=f"{reference.name}: full ranking of the chosen point")
    fn = score_fn(reference.full(ctx, params))
    val = finalize(evaluate_implicit(fn, split, "val", full=True))
    test = finalize(evaluate_implicit(fn, split, "test", full=True))
    bar.advance(status=f"{reference.name}: test hr@10 {test['hr@10']:.3f}")
    return {
        "name": reference.name,
        "params": dict(params),
        "val": {k: val[k] for k in ("hr@10", "ndcg@10", "full_hr@10")},
        "test": {k: test[k] for k in ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10")},
        "placebo": {"hr@10": test["placebo_hr@10"]},
        "grid": tried,
    }


def run_steps(names: Iterable[str] | None = None) -> int:
    """How many progress steps `run_references` takes: a grid point each, plus one
    per model for its chosen point."""
    wanted = set(reference_names() if names is None else names)
    return sum(len(r.grid) + 1 for r in REFERENCES if r.name in wanted)


def run_references(
    split: ImplicitSplit,
    names: Iterable[str] | None = None,
    progress: Progress | None = None,
    context: ReferenceContext | None = None,
) -> list[dict[str, Any]]:
    """`select_on_validation` for each named reference (default: all), in REFERENCES
    order, sharing one ReferenceContext (one Gram eigendecomposition, one item
    similarity); pass `context` to read its `timings` afterwards."""
    wanted = set(reference_names() if names is None else names)
    unknown = wanted - set(reference_names())
    if unknown:
        raise ValueError(f"unknown reference model(s) {sorted(unknown)}; known: {', '.join(reference_names())}")
    ctx = context or ReferenceContext(split, progress)
    results = []
    for r in REFERENCES:
        if r.name in wanted:
            t0 = time.perf_counter()
            results.append(select_on_validation(split, r, ctx))
            ctx._timed(f"{r.name} (all of it)", t0)
    return results
