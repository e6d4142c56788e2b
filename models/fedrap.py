"""FedRAP: Federated Recommendation with Additive Personalization (Li, Long, Zhou; ICLR 2024).

Each device i keeps a user vector u_i (plus a scalar bias b_i, the bias of the
reference implementation's affine output; it does not change any ranking) and
a personal item table D_i (m x k); the server keeps the global item table C
(m x k). The score of item j is sigmoid(<u_i, (D_i + C)_j> + b_i).

Objective (paper Eq. 3), per device i and round a:

    sum_{(i,j)} BCE(r_ij, r_hat_ij)  -  lambda(a) * ||D_i - C||_F^2  +  mu(a) * ||C||_1

with lambda(a) = c(a) * v1 and mu(a) = c(a) * v2 for a curriculum c (tanh(a/10)
by default; fixed / sin / square / frac for the ablations). The *minus* sign is
the paper's: Eq. (2) *maximises* ||D_i - C||_F^2 so that the two views are
complementary (docs/design.md's "- lambda(a) * ||D_i - C||^2" is the same
term). Maximising a squared distance is unbounded, so v1 must stay small; it
is a tuned hyperparameter (docs/tuning.md). The curriculum weights are really
applied here (the published code computes them and then uses the constants).

Optimisation (one round, per device, all devices of the cohort at once):
- `local_epochs` full-batch gradient steps on the BCE part (positives plus
  `n_neg` fresh uniform negatives per positive and epoch, drawn from all items
  minus the device's training items). The BCE gradient only touches the rows
  of the sampled items, so these steps are sparse scatter-adds into the
  (B*m, k) tables. u_i and b_i use the gradient of the per-device *mean* BCE
  (`lr_user`); the item rows of D_i and of the device's copy of C use the
  gradient of the *summed* BCE as in Eq. (3) (`lr_item`).
- then one step on the dense regulariser -lambda(a)||D_i - C_i||^2 of length
  local_epochs * lr (Lie-Trotter splitting: the E small dense steps are taken
  as one; the difference is O((lr*lambda*E)^2)). It pushes D_i and C_i apart.
- the device sends C_i - C (flattened, update_dim = m*k). D_i, u_i, b_i never
  leave it.

Server (`apply_mean_update`): C <- prox(C + server_lr * mean_update). The
L1 term mu(a)||C||_1 is applied as a proximal soft-threshold *on the server*,
after averaging, with threshold server_lr * local_epochs * lr_item * mu(a)
(what E proximal steps of the devices' item learning rate amount to). Doing
it on the server is exact proximal gradient on the averaged objective, keeps
C itself sparse (an average of individually thresholded copies is not), keeps
it sparse under DP noise, and costs O(m k) instead of O(B m k). The L2
ablation uses the proximal map of mu||C||_F^2 (a shrink by 1/(1 + 2t)).

Learning rates and extra L2 terms (the published code has one SGD
optimiser with `weight_decay` over all of u, D and C): `lr_item` for the
device's copy of C, `lr_personal` for D_i (None: lr_item), `lr_user` for
u_i and b_i, all multiplied by lr_decay**a; `weight_decay_u` on u_i (in its
gradient) and `weight_decay_d` on D_i (applied as the proximal map of
wd/2 ||D_i||^2 in the split step, stable for any step length).

The sent vector is (C_i - C) / `update_scale` and the server multiplies the
mean back: the unit only matters where something acts on the vector itself,
i.e. DP clipping (tau refers to this unit) and the SecAgg fixed-point range.

Randomness: u_i (and D_i when init_std_d > 0) start from keyed normals and the
negatives of epoch e of round a are keyed draws (models/keyed_random.py), so a
device trains the same in any cohort.

Item biases (`item_bias=True`; an addition to the paper, off by default: it
tied the default on validation, docs/tuning.md, D73): the server also keeps a
public per-item bias c (m,), learnt like C. The score becomes
sigmoid(<u_i, (D_i + C)_j> + c_j + b_i); each device takes its E steps on its
copy of c with the gradient of the summed BCE (`lr_bias`, default 0.01, None:
lr_item, which diverges at lr_item 3; times lr_decay**a) and sends c_i - c
after the C part of the update (update_dim = m*k + m); the server adds
server_lr times the mean, with no regulariser. c carries what every user
agrees on (popularity), which a held-out item's row can use; D_i cannot.
FedRAP-D (no C, nothing sent) has no c: item_bias is ignored there.

Recency weighting (`recency`, 2 by default, 0 turns it off; an addition to the
paper, on the device only; chosen on validation with v2 3e-4 and
weight_decay_u 0.05, docs/tuning.md and D78):
each training positive's BCE term is weighted by exp(-recency * age), age =
(L - 1 - j) / L for the j-th of the device's L training items in time order,
scaled to mean 1 per device. The device uses its own history's order, which
it has; nothing it sends changes in kind (docs/decisions.md D78).

Variants (paper Sec. 4.5): variant="full" (default), "c_only" (FedRAP-C: no
D_i), "d_only" (FedRAP-D: no C, nothing is sent, update_dim = 0);
reg="l1" | "l2" | "none"; curriculum="tanh" | "fixed" | "sin" | "square" | "frac".

Kernel (`kernel`, D97): "torch" (default) or "compiled", the same maths as one numba
loop per device (models/fedrap_compiled.py; CPU only), equal up to float32 rounding.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from models import fedrap_compiled, fedrap_sizing
from models.base import CohortData, FederatedRecommender, GlobalState, LocalRound, PrivateState, take_cohort
from models.batched import Flat, flatten, negative_counts, randn, reuse_or_empty, soft_threshold
from models.fedrap_scores import all_item_scores, gathered_scores
from models.keyed_random import check_seed, user_normal

Curriculum = Literal["tanh", "fixed", "sin", "square", "frac"]
CURRICULA: tuple[str, ...] = ("tanh", "fixed", "sin", "square", "frac")
VARIANTS: tuple[str, ...] = ("full", "c_only", "d_only")
REGS: tuple[str, ...] = ("l1", "l2", "none")
_CHUNKS_PER_DRAW = fedrap_sizing.CHUNKS_PER_DRAW
_INIT_U, _INIT_D = 1, 2  # tags of the keyed initialisation (models/keyed_random.py)


def curriculum_weight(kind: str, a: int) -> float:
    """c(a) in [0, 1]: the factor of v1 / v2 at round a (0-based).

    tanh: tanh(a/10) (the paper's choice); fixed: 1; sin: (sin(a/10) + 1)/2
    (the paper writes sin(a/10), which turns negative after a ~ 31 and would
    contradict its own "between 0 and v" statement; the published code uses
    this shifted form); square: 0 on rounds [0,10), 1 on [10,20), ... (the
    paper's "alternates between 0 and v every 10 iterations", starting from
    full personalisation); frac: 1/(a+1).
    """
    if kind == "tanh":
        return math.tanh(a / 10.0)
    if kind == "fixed":
        return 1.0
    if kind == "sin":
        return (math.sin(a / 10.0) + 1.0) / 2.0
    if kind == "square":
        return float((a // 10) % 2)
    if kind == "frac":
        return 1.0 / (a + 1.0)
    raise ValueError(f"unknown curriculum {kind!r}; expected one of {CURRICULA}")


@dataclass(frozen=True)
class _RoundWork:
    """One `FedRAP.local_update` call: its inputs, learning rates, per-device constants
    and output tables. Its chunks of devices share it; each reads and writes only its
    own devices' rows of the tables."""

    flat: Flat
    data: CohortData
    private: PrivateState
    seed: int
    round_idx: int
    device: torch.device
    lr_u: float  # u_i and b_i
    lr_i: float  # the device's copy of C
    lr_d: float  # D_i
    lr_b: float  # the device's copy of the item bias c
    lr_w: float  # W = D_i + (C_i - C): the sum of the item tables' steps
    lam: float  # lambda(a)
    t_c: float  # lengths of the one split step on the dense regulariser
    t_d: float
    C: torch.Tensor | None  # the global tables (None: not in this variant)
    cb: torch.Tensor | None
    n_per: torch.Tensor  # float32 (B,): samples per device and epoch (at least 1)
    pos_start: torch.Tensor  # (B,): where each device's positives start in `flat`
    pos_w: torch.Tensor | None  # recency weight of each positive (None: recency off)
    u_all: torch.Tensor  # outputs: fresh copies of u and b, trained in place,
    b_all: torch.Tensor
    d_out: torch.Tensor  # the new D (B, m, k), (0,) without D,
    upd: torch.Tensor  # and the updates (B, update_dim), (B, 0) when they are summed into `total`
    chunk: int  # devices per inner chunk
    total: torch.Tensor | None = None  # float64 (update_dim,): the updates' sum (LocalRound.sum_into)


def _positives(r: _RoundWork, sl: slice) -> tuple[int, int]:
    """Where the training positives of devices `sl` start and end in `r.flat` (device-major)."""
    return int(r.pos_start[sl.start]), int(r.pos_start[sl.stop - 1] + r.flat.counts[sl.stop - 1])


class FedRAP(FederatedRecommender):
    name: ClassVar[str] = "fedrap"
    kind: ClassVar[Literal["implicit", "explicit"]] = "implicit"

    def __init__(
        self,
        n_users: int,
        n_items: int,
        *,
        k: int = 32,
        variant: str = "full",
        reg: str = "l2",
        curriculum: str = "tanh",
        v1: float = 1e-5,
        v2: float = 3e-4,
        local_epochs: int = 10,
        n_neg: int = 4,
        lr_user: float = 5.0,
        lr_item: float = 3.0,
        lr_personal: float | None = 0.01,
        lr_decay: float = 0.98,
        item_bias: bool = False,
        lr_bias: float | None = 0.01,
        server_lr: float = 10.0,
        weight_decay_d: float = 0.0,
        weight_decay_u: float = 0.05,
        update_scale: float = 1.0,
        init_std_c: float = 0.1,
        init_std_d: float = 0.0,
        init_std_u: float = 0.1,
        chunk: int = 8,
        recency: float = 2.0,
        kernel: str = "torch",
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown FedRAP variant {variant!r}; expected one of {VARIANTS}")
        if reg not in REGS:
            raise ValueError(f"unknown regulariser {reg!r}; expected one of {REGS}")
        curriculum_weight(curriculum, 0)  # validates the name
        if k < 1 or local_epochs < 1 or n_neg < 0:
            raise ValueError("k and local_epochs must be >= 1 and n_neg >= 0")
        if not (recency >= 0 and math.isfinite(recency)):
            raise ValueError(f"recency must be a finite number >= 0, got {recency!r}")
        self.n_users, self.n_items, self.k = n_users, n_items, k
        self.variant, self.reg, self.curriculum = variant, reg, curriculum
        self.v1, self.v2 = v1, v2
        self.local_epochs, self.n_neg = local_epochs, n_neg
        self.lr_user, self.lr_item, self.lr_decay = lr_user, lr_item, lr_decay
        self.lr_personal = lr_item if lr_personal is None else lr_personal
        self.item_bias = bool(item_bias)
        self.lr_bias = lr_item if lr_bias is None else lr_bias
        self.server_lr = server_lr
        self.weight_decay_d = weight_decay_d
        self.weight_decay_u = weight_decay_u
        if not update_scale > 0:
            raise ValueError("update_scale must be > 0")
        self.update_scale = update_scale
        self.init_std_c, self.init_std_d, self.init_std_u = init_std_c, init_std_d, init_std_u
        self.chunk = chunk
        self.recency = recency
        self.kernel = fedrap_compiled.check_kernel(kernel)

    # ------------------------------------------------------------------ helpers
    @property
    def has_c(self) -> bool:
        return self.variant != "d_only"

    @property
    def has_d(self) -> bool:
        return self.variant != "c_only"

    def lam(self, a: int) -> float:
        """lambda(a, v1): weight of -||D_i - C||_F^2 at round a."""
        return curriculum_weight(self.curriculum, a) * self.v1

    def mu(self, a: int) -> float:
        """mu(a, v2): weight of the sparsity term on C at round a."""
        return 0.0 if self.reg == "none" else curriculum_weight(self.curriculum, a) * self.v2

    def _lrs(self, a: int) -> tuple[float, float, float]:
        """(user, shared item table C, personal table D) learning rates at round a."""
        f = self.lr_decay**a
        return self.lr_user * f, self.lr_item * f, self.lr_personal * f

    config_keys: ClassVar[tuple[str, ...]] = tuple(
        (
            "k variant reg curriculum v1 v2 local_epochs n_neg lr_user lr_item lr_personal lr_decay item_bias lr_bias "
            "server_lr weight_decay_d weight_decay_u update_scale init_std_c init_std_d init_std_u recency"
        ).split()
    )

    def config(self) -> dict[str, object]:
        """`config_keys`, plus `kernel` when it is not torch's (D97)."""
        return super().config() | ({"kernel": self.kernel} if self.kernel != "torch" else {})

    # ------------------------------------------------------------------ interface
    @property
    def has_bias(self) -> bool:
        return self.has_c and self.item_bias

    @property
    def update_dim(self) -> int:
        if not self.has_c:
            return 0
        return self.n_items * self.k + (self.n_items if self.has_bias else 0)

    def init_global(self, generator: torch.Generator) -> GlobalState:
        if not self.has_c:
            return {}
        state = {"C": randn((self.n_items, self.k), self.init_std_c, generator)}
        if self.has_bias:
            state["c_bias"] = torch.zeros(self.n_items, device=state["C"].device)
        return state

    def _std_d(self) -> float:
        # D-only needs a random start (with D = 0 and no C every score is 0 and u gets no gradient).
        return self.init_std_d if self.has_c or self.init_std_d > 0 else self.init_std_c

    def zero_at_init(self) -> tuple[str, ...]:
        """D_i starts at zero (the default init_std_d = 0 with C): a device's D is written once it trains."""
        return ("D",) if self.has_d and self._std_d() == 0.0 else ()

    def init_private(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        b = int(data.users.shape[0])
        check_seed(seed)
        std_d = self._std_d()
        state = {
            "u": user_normal(seed, _INIT_U, data.users, (self.k,), self.init_std_u),
            "b": torch.zeros(b, device=data.users.device),
        }
        if self.has_d:
            state["D"] = user_normal(seed, _INIT_D, data.users, (self.n_items, self.k), std_d)
        return state

    def _recency_weights(self, flat: Flat, pos_start: torch.Tensor) -> torch.Tensor:
        """The weight of each training positive (flat order) in the BCE: exp(-recency * age) with
        age = (L - 1 - j) / L for the j-th of a device's L training items in time order (the
        split keeps each device's items in timestamp order), scaled to mean 1 on every device
        so that a device's positives weigh as much in total as without it."""
        rank = torch.arange(flat.dev.shape[0], device=flat.dev.device) - pos_start[flat.dev]
        n = flat.counts[flat.dev].to(torch.float32)
        w = torch.exp(-self.recency * (n - 1.0 - rank.to(torch.float32)) / n)
        per_dev = torch.zeros(flat.n_devices, device=w.device).index_add_(0, flat.dev, w)
        return w * (flat.counts.clamp(min=1).to(torch.float32) / per_dev.clamp(min=1e-30))[flat.dev]

    def local_update(self, job: LocalRound) -> tuple[PrivateState, torch.Tensor]:
        r = self._start_round(job)
        self._train_groups(r)
        new_private: PrivateState = {"u": r.u_all, "b": r.b_all}
        if self.has_d:
            new_private["D"] = r.d_out
        return new_private, r.upd

    def _start_round(self, job: LocalRound) -> _RoundWork:
        """The round's learning rates, per-device constants and fresh output tables."""
        global_, private, data, round_idx, seed = job.global_, job.private, job.data, job.round_idx, job.seed
        m, k, n_ep = self.n_items, self.k, self.local_epochs
        flat = flatten(data)
        nb = flat.n_devices
        dev_t = flat.item.device
        lr_u, lr_i, lr_d = self._lrs(round_idx)
        pos_start = torch.cumsum(flat.counts, 0) - flat.counts  # flat is device-major
        if self.kernel == "compiled" and dev_t.type != "cpu":
            raise ValueError(f"FedRAP's compiled kernel runs on the CPU only, not on {dev_t.type}: use kernel=torch")
        total = job.sum_into if self.sums_updates() else None
        if total is not None and (total.shape != (self.update_dim,) or total.dtype != torch.float64):
            raise ValueError(f"sum_into must be a float64 ({self.update_dim},) table")
        return _RoundWork(
            flat=flat,
            data=data,
            private=private,
            seed=seed,
            round_idx=round_idx,
            device=dev_t,
            lr_u=lr_u,
            lr_i=lr_i,
            lr_d=lr_d,
            lr_b=self.lr_bias * self.lr_decay**round_idx,
            # both item tables get the same BCE gradient; W = D_i + (C_i - C) moves by the sum of their steps
            lr_w=(lr_i if self.has_c else 0.0) + (lr_d if self.has_d else 0.0),
            lam=self.lam(round_idx),
            t_c=n_ep * lr_i,  # lengths of the one split step on the dense regulariser
            t_d=n_ep * lr_d,
            C=global_["C"] if self.has_c else None,
            cb=global_["c_bias"] if self.has_bias else None,
            n_per=(flat.counts * (1 + self.n_neg)).clamp(min=1).to(torch.float32),
            pos_start=pos_start,
            pos_w=self._recency_weights(flat, pos_start) if self.recency > 0 else None,
            u_all=private["u"].clone(),
            b_all=private["b"].clone(),
            # the outputs: written over the spare tables when the engine has them (D97)
            d_out=(reuse_or_empty(job.spare.get("D") if job.spare else None, (nb, m, k), dev_t) if self.has_d
                   else torch.empty(0)),  # (0,): no D
            upd=(reuse_or_empty(job.spare_updates, (nb, self.update_dim), dev_t) if self.has_c and total is None
                 else torch.zeros(nb, 0, device=dev_t)),
            # CPU: small chunks stay in the processor's cache; an accelerator wants the largest
            # chunk its free memory holds, so that a round is a few hundred kernel launches
            chunk=self.chunk if dev_t.type == "cpu" else self.accelerator_chunk(nb, int(flat.item.shape[0]), dev_t),
            total=total,
        )

    def _train_groups(self, r: _RoundWork) -> None:
        """Train the cohort, `_CHUNKS_PER_DRAW` chunks at a time.

        Devices are independent and every group writes only its own rows of the
        outputs, so the groups run on as many worker threads as torch has
        intra-op threads, each worker single-threaded (torch's ops release the GIL).
        On an accelerator the chunks run one after the other (its kernels are the parallelism)."""
        starts = range(0, r.flat.n_devices, _CHUNKS_PER_DRAW * r.chunk)
        threads = torch.get_num_threads()
        workers = min(threads, len(starts)) if r.device.type == "cpu" else 1
        if workers <= 1:
            for g in starts:
                self._train_group(r, g, r.total)
            return
        # summed updates: each worker adds its groups (fixed in advance: a run's sum does not
        # depend on the threads' timing) into its own float64 table, added in worker order at the end
        partials: list[torch.Tensor | None] = [None] * workers
        if r.total is not None:
            partials = [torch.zeros_like(r.total) for _ in range(workers)]

        def run_single_threaded(w: int) -> None:
            torch.set_num_threads(1)
            for g in starts[w::workers]:
                self._train_group(r, g, partials[w])

        try:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run_single_threaded, range(workers)))
        finally:  # the setting can be process-wide: the caller's count comes back
            torch.set_num_threads(threads)
        for part in partials:
            if r.total is not None and part is not None:
                r.total.add_(part)

    def _train_group(self, r: _RoundWork, g: int, total: torch.Tensor | None) -> None:
        """Draw the negatives of the group of chunks starting at device g at once (keyed
        draws: the same as the whole cohort would draw for these devices), then train its chunks."""
        m, k, chunk = self.n_items, self.k, r.chunk
        members = torch.arange(g, min(r.flat.n_devices, g + _CHUNKS_PER_DRAW * chunk), device=r.device)
        negc = negative_counts(
            take_cohort(r.data, members), m, self.n_neg, self.local_epochs, seed=r.seed, round_idx=r.round_idx
        )
        # the scratch: one (m, k) table a device (torch), or one for the whole chunk (compiled, device by device)
        acc = torch.empty(1 if self.kernel == "compiled" else min(chunk, members.numel()), m, k, device=r.device)
        for s in range(g, g + members.numel(), chunk):
            self._train_chunk(r, s, negc[:, s - g : s - g + chunk], acc, total)

    def _train_chunk(self, r: _RoundWork, s: int, negc: torch.Tensor, acc: torch.Tensor,
                     total: torch.Tensor | None) -> None:
        """Train devices s .. s + chunk - 1; negc: their negative counts (E, bc, m);
        acc: a scratch (chunk, m, k) table; total: the float64 sum their updates are
        added to (summed rounds, compiled kernel only)."""
        sl = slice(s, min(r.flat.n_devices, s + r.chunk))
        bc = sl.stop - sl.start
        if self.kernel == "compiled":
            self._train_chunk_compiled(r, sl, negc, acc[0], total)
            return
        # A = sum_e g_e (x) u_e (u at the start of epoch e), nonzero on the sampled rows only.
        # Both item tables take every step, so after epoch e the device's W = D_i + (C_i - C)
        # is D_i - lr_w A, and at the end C_i - C = -lr_i A and D_i' = D_i - lr_d A.
        A = acc[:bc].zero_()
        D = r.private["D"][sl] if self.has_d else None
        cb_i = self._bce_epochs(r, sl, negc, A, D)
        self._split_step(r, sl, A, D, cb_i)

    def _train_chunk_compiled(self, r: _RoundWork, sl: slice, negc: torch.Tensor, scratch: torch.Tensor,
                              total: torch.Tensor | None) -> None:
        """`_train_chunk` as one compiled loop (models/fedrap_compiled.py)."""
        p0, p1 = _positives(r, sl)
        fedrap_compiled.train_chunk(
            pos_item=r.flat.item[p0:p1], pos_counts=r.flat.counts[sl], pos_w=None if r.pos_w is None else r.pos_w[p0:p1],
            negc=negc, u=r.u_all[sl], bias=r.b_all[sl], D=r.private["D"][sl] if self.has_d else None, C=r.C, cb=r.cb,
            d_out=r.d_out[sl] if self.has_d else None, upd=r.upd[sl], n_per=r.n_per[sl],
            rates=(r.lr_w, r.lr_u, r.lr_b, r.lr_i, r.lr_d, r.lam, r.t_c, r.t_d, self.weight_decay_u,
                   self.weight_decay_d, self.update_scale), scratch=scratch, total=total)

    def _bce_epochs(
        self, r: _RoundWork, sl: slice, negc: torch.Tensor, A: torch.Tensor, D: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The `local_epochs` BCE steps of the devices `sl`: u_i and b_i (their rows of
        r.u_all, r.b_all) in place, the item steps accumulated in A (bc, m, k). Returns the
        devices' copies of the item bias c after their steps (None without item biases)."""
        m, k, flat = self.n_items, self.k, r.flat
        bc = sl.stop - sl.start
        u = r.u_all[sl]  # views: updated in place (u_all is a fresh copy)
        bias = r.b_all[sl]
        inv_n = 1.0 / r.n_per[sl]
        a_rows = A.view(bc * m, k)
        d_rows = D.reshape(bc * m, k) if D is not None else None
        p0, p1 = _positives(r, sl)
        pos_dev, pos_item = flat.dev[p0:p1] - sl.start, flat.item[p0:p1]
        n_pos = pos_dev.shape[0]
        cb_i = r.cb.expand(bc, m).clone() if r.cb is not None else None  # the devices' copies of c
        for e in range(self.local_epochs):
            # The epoch's samples: every positive once and every drawn negative with its count.
            # The BCE gradient is zero on every other (device, item), so only these rows move.
            neg_c = negc[e]
            neg_dev, neg_item = neg_c.nonzero(as_tuple=True)
            dev_s = torch.cat([pos_dev, neg_dev])
            item_s = torch.cat([pos_item, neg_item])
            rows = dev_s * m + item_s
            emb = a_rows.index_select(0, rows).mul_(-r.lr_w)  # (S, k): the rows of W at the epoch's start
            if d_rows is not None:
                emb += d_rows.index_select(0, rows)
            if r.C is not None:
                emb += r.C.index_select(0, item_s)
            u_s = u.index_select(0, dev_s)
            z = (emb * u_s).sum(1) + bias.index_select(0, dev_s)
            if cb_i is not None:
                z += cb_i.view(-1).index_select(0, rows)
            p = torch.sigmoid(z)
            # summed BCE gradient w.r.t. each sampled logit: a positive contributes p - 1,
            # a negative drawn c times contributes c * p (negatives never hit a training positive)
            g_pos = p[:n_pos] - 1.0 if r.pos_w is None else (p[:n_pos] - 1.0) * r.pos_w[p0:p1]
            g = torch.cat([g_pos, p[n_pos:] * neg_c[neg_dev, neg_item].to(torch.float32)])
            grad_u = torch.zeros(bc, k, device=r.device).index_add_(0, dev_s, emb.mul_(g.unsqueeze(1)))
            a_rows.index_add_(0, rows, u_s.mul_(g.unsqueeze(1)))
            g_dev = torch.zeros(bc, device=r.device).index_add_(0, dev_s, g)
            if self.weight_decay_u > 0:
                grad_u += self.weight_decay_u * u * r.n_per[sl].unsqueeze(1)
            u.sub_(grad_u * inv_n.unsqueeze(1), alpha=r.lr_u)
            bias.sub_(g_dev * inv_n, alpha=r.lr_u)
            if cb_i is not None:
                cb_i.view(-1).index_add_(0, rows, g, alpha=-r.lr_b)
        return cb_i

    def _split_step(
        self, r: _RoundWork, sl: slice, A: torch.Tensor, D: torch.Tensor | None, cb_i: torch.Tensor | None
    ) -> None:
        """The devices `sl`'s new D_i (into r.d_out) and update (into r.upd) from their
        accumulated item steps A and their copies of c, `cb_i`."""
        m, k = self.n_items, self.k
        mk = m * k
        bc = sl.stop - sl.start
        d_new = torch.add(D, A, alpha=-r.lr_d, out=r.d_out[sl]) if D is not None else None
        dc = None
        if r.C is not None:  # C_i - C, formed in the update's own rows when the update is nothing else
            dc = torch.empty(bc, m, k, device=r.device) if r.cb is not None else r.upd[sl].view(bc, m, k)
            torch.mul(A, -r.lr_i, out=dc)
        # the split step: ascent on lambda ||D_i - C_i||^2, and the prox of wd/2 ||D_i||^2 (stable for any step)
        if d_new is not None:
            delta = torch.sub(d_new, dc).sub_(r.C) if dc is not None and r.C is not None and r.lam > 0 else None
            if self.weight_decay_d > 0:
                d_new.div_(1.0 + r.t_d * self.weight_decay_d)
            if delta is not None and dc is not None:
                d_new.add_(delta, alpha=2.0 * r.lam * r.t_d)
                dc.sub_(delta, alpha=2.0 * r.lam * r.t_c)
        if dc is not None:
            if self.update_scale != 1.0:
                dc.div_(self.update_scale)
            if r.cb is not None and cb_i is not None:
                r.upd[sl, :mk] = dc.view(bc, mk)
                r.upd[sl, mk:] = cb_i.sub_(r.cb).div_(self.update_scale)

    def chunk_bytes(self, history: int) -> int:
        """Scratch bytes one device of an inner chunk needs (models/fedrap_sizing.py)."""
        return fedrap_sizing.chunk_bytes(self, history)

    def accelerator_chunk(self, nb: int, positives: int, device: torch.device) -> int:
        """Devices per inner chunk on an accelerator (models/fedrap_sizing.py)."""
        return fedrap_sizing.accelerator_chunk(self, nb, positives, device)

    def sums_updates(self) -> bool:
        """The compiled kernel adds a plain round's updates into `sum_into` (D102)."""
        return self.kernel == "compiled" and self.has_c

    def train_memory(self, private_bytes: int, max_history: int, *, in_place: bool = False,
                     summed: bool = False) -> tuple[int, int]:
        """local_update's working set (models/fedrap_sizing.py; FederatedRecommender.train_memory)."""
        return fedrap_sizing.train_memory(self, private_bytes, max_history, in_place=in_place, summed=summed)

    def apply_mean_update(
        self, global_: GlobalState, mean_update: torch.Tensor, round_idx: int
    ) -> GlobalState:
        if not self.has_c:
            return dict(global_)
        step = self.server_lr * self.update_scale
        mk = self.n_items * self.k
        C = global_["C"] + step * mean_update[:mk].view(self.n_items, self.k)
        _, lr_i, _ = self._lrs(round_idx)
        thr = self.server_lr * self.local_epochs * lr_i * self.mu(round_idx)
        if self.reg == "l1":
            C = soft_threshold(C, thr)
        elif self.reg == "l2" and thr > 0:
            C = C / (1.0 + 2.0 * thr)
        if self.has_bias:
            return {"C": C, "c_bias": global_["c_bias"] + step * mean_update[mk:]}
        return {"C": C}

    def score(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        if not self.has_d:
            return self.score_gathered(global_, private, users, items)
        rows = torch.arange(items.shape[0], device=items.device).unsqueeze(1)
        return self.score_gathered(global_, {**private, "D": private["D"][rows, items]}, users, items)

    def gathered_tables(self) -> tuple[str, ...]:
        return ("D",) if self.has_d else ()

    def score_gathered(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """`score` with D_i already taken at the items: private["D"] is (B, K, k)."""
        return gathered_scores(global_, private, items, has_c=self.has_c, has_d=self.has_d, has_bias=self.has_bias)

    def score_all(self, global_: GlobalState, private: PrivateState, users: torch.Tensor,
                  scratch: dict[str, torch.Tensor] | None = None) -> torch.Tensor | None:
        return all_item_scores(global_, private, has_c=self.has_c, has_d=self.has_d, has_bias=self.has_bias,
                               scratch=scratch)  # fmt: skip

    # ------------------------------------------------------------------ reporting
    def summary(self, global_: GlobalState, private: PrivateState) -> dict[str, float]:
        """Sparsity of C (fraction of exact zeros and of |c| <= 1e-2 / 1e-1)."""
        if not self.has_c:
            return {}
        C = global_["C"]
        n = C.numel()
        return {
            "c_zero_fraction": float((C == 0).sum()) / n,
            "c_abs_gt_1e-2": float((C.abs() > 1e-2).sum()) / n,
            "c_abs_gt_1e-1": float((C.abs() > 1e-1).sum()) / n,
        }

