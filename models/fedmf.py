"""FedMF: plain federated matrix factorisation (Chai et al. 2020; the baseline of
every paper here), in two modes.

- `FedMF` (implicit): score sigmoid(<p_u, q_j> + b_u); BCE on the positives and
  `n_neg` fresh uniform negatives per positive (from all items minus the
  device's training items), `local_epochs` full-batch steps per round. It is
  FedRAP without the personal table and the curriculum
  (`FedRAP(variant="c_only", curriculum="fixed")`), so the two share one code
  path; the global table is stored under the key "C". `reg="l2"` with weight
  `v2` is the L2 term of the MF objective on the item table (applied as the
  server-side proximal step), `weight_decay_u` the one on p_u.
- `FedMFExplicit` (`--explicit`): prediction <p_u, q_i> (+ an optional item
  bias b_i) + a public constant `center` (the middle of the rating scale; no
  data is needed to know it); loss per device = 1/2 sum (r - r_hat)^2 +
  reg/2 * sum_(u,i) (||p_u||^2 + ||q_i||^2) (paper Eq. 2: the L2 terms are
  counted once per rating). `local_epochs` full-batch gradient steps on p_u
  (mean-normalised, `lr_user`) and on the device's copy of the rated rows of Q
  (summed loss, `lr_item`); the device sends Q_u - Q (and b_u - b), flattened.
  Options: `user_bias` (a private b_u), `user_solver="exact"` (each round the
  device first sets p_u, b_u to the exact ridge solution for the received Q:
  the ALS step of federated collaborative filtering, Ammad-ud-din et al.
  2019; then `local_epochs` steps on its copy of the rated rows of Q).
  Server: Q <- Q + server_lr * mean. With local_epochs = 1, server_lr = B
  (the cohort size) is exactly the paper's "sum of the item gradients" step.

`ExplicitMF` is the batched core shared with FedMMF (which adds a private
additive mask to the prediction and trains Q on the masked ratings).
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypedDict

import torch

from models.base import CohortData, FederatedRecommender, GlobalState, LocalRound, PrivateState
from models.batched import flatten, negative_sampler, negative_samples, negatives_stream, randn
from models.fedrap import FedRAP
from models.keyed_random import check_seed, user_normal
from models.sparse import ItemRows, SparseResult, SparseTraining, SparseView, touched_with_negatives


class FedMF(FedRAP, SparseTraining):
    """Implicit FedMF (see the module docstring). Its private state is u and b
    only and its update is zero off the rows a device sampled, so the simulator
    trains it on those rows (`local_update_sparse`, D89)."""

    name: ClassVar[str] = "fedmf"
    kind: ClassVar[Literal["implicit", "explicit"]] = "implicit"

    def __init__(
        self,
        n_users: int,
        n_items: int,
        *,
        k: int = 32,
        local_epochs: int = 10,
        n_neg: int = 4,
        lr_user: float = 5.0,
        lr_item: float = 3.0,
        lr_decay: float = 0.98,
        server_lr: float = 10.0,
        reg: str = "l2",
        v2: float = 1e-4,
        weight_decay_u: float = 0.03,
        update_scale: float = 1.0,
        init_std_c: float = 0.1,
        init_std_u: float = 0.1,
        chunk: int = 64,
    ) -> None:
        super().__init__(
            n_users,
            n_items,
            k=k,
            variant="c_only",
            item_bias=False,
            reg=reg,
            curriculum="fixed",
            v1=0.0,
            v2=v2,
            weight_decay_u=weight_decay_u,
            update_scale=update_scale,
            local_epochs=local_epochs,
            n_neg=n_neg,
            lr_user=lr_user,
            lr_item=lr_item,
            lr_decay=lr_decay,
            server_lr=server_lr,
            init_std_c=init_std_c,
            init_std_u=init_std_u,
            chunk=chunk,
            recency=0.0,  # FedMF weighs every positive alike (FedRAP's recency weighting is FedRAP's, D78)
        )

    config_keys: ClassVar[tuple[str, ...]] = tuple(
        "k local_epochs n_neg lr_user lr_item lr_decay server_lr reg v2 weight_decay_u update_scale init_std_c init_std_u".split()
    )

    def summary(self, global_: GlobalState, private: PrivateState) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------ the sparse path (D89)

    def init_dense(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        return self.init_private(data, global_, seed)

    def local_update_sparse(self, job: LocalRound) -> SparseResult:
        """FedRAP-C's `local_update` on the rows the cohort sampled: the same float32
        operations, in the same order per device, as the dense path's BCE epochs, with
        the accumulated item steps A kept for those rows only (A is zero elsewhere,
        and the update is -lr_item A / update_scale)."""
        m, k, flat = self.n_items, self.k, flatten(job.data)
        nb, n_pos = flat.n_devices, int(flat.item.numel())
        lr_u, lr_i, _ = self._lrs(job.round_idx)
        C = job.global_["C"]
        n_per = (flat.counts * (1 + self.n_neg)).clamp(min=1).to(torch.float32)
        inv_n = 1.0 / n_per
        u, bias = job.private["u"].clone(), job.private["b"].clone()
        epochs = self._sparse_samples(job, flat.dev * m + flat.item)
        touched, row_of = torch.unique(torch.cat([keys for keys, _ in epochs]), return_inverse=True)  # device-major
        A = torch.zeros(touched.numel(), k, device=C.device)
        start = 0
        for keys, neg_count in epochs:  # one full-batch step per epoch
            rows = row_of[start : start + keys.numel()]  # positives, then negatives by (device, item)
            start += keys.numel()
            dev_s = torch.div(keys, m, rounding_mode="floor")
            emb = A.index_select(0, rows).mul_(-lr_i)  # the rows of C_i - C at the epoch's start
            emb += C.index_select(0, keys - dev_s * m)
            u_s = u.index_select(0, dev_s)
            p = torch.sigmoid((emb * u_s).sum(1) + bias.index_select(0, dev_s))
            g = torch.cat([p[:n_pos] - 1.0, p[n_pos:] * neg_count.to(torch.float32)])
            grad_u = torch.zeros(nb, k, device=C.device).index_add_(0, dev_s, emb.mul_(g.unsqueeze(1)))
            A.index_add_(0, rows, u_s.mul_(g.unsqueeze(1)))
            g_dev = torch.zeros(nb, device=C.device).index_add_(0, dev_s, g)
            if self.weight_decay_u > 0:
                grad_u += self.weight_decay_u * u * n_per.unsqueeze(1)
            u.sub_(grad_u * inv_n.unsqueeze(1), alpha=lr_u)
            bias.sub_(g_dev * inv_n, alpha=lr_u)
        upd = A.mul_(-lr_i)
        if self.update_scale != 1.0:
            upd.div_(self.update_scale)
        return SparseResult(dense={"u": u, "b": bias}, rows=None, update=ItemRows.from_keys(touched, upd, nb, m))

    def _sparse_samples(self, job: LocalRound, pos_key: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per epoch: the keys (device * n_items + item) of its samples, the positives
        first, then the distinct drawn negatives, sorted; and how often each negative
        was drawn (the dense path's negative counts)."""
        m = self.n_items
        sampler = negative_sampler(job.data, m, self.n_neg)
        out = []
        for e in range(self.local_epochs):
            ndev, nitem = negative_samples(job.data, m, self.n_neg, negatives_stream(job.seed, job.round_idx, e), sampler)
            key, count = torch.unique(ndev * m + nitem, return_counts=True)
            out.append((torch.cat([pos_key, key]), count))
        return out

    def score_sparse(
        self, global_: GlobalState, view: SparseView, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """`score` as one product with the whole table, then the items' columns: the
        same sums (float32, another order) without gathering (B, K, k) rows."""
        z = view.dense["u"] @ global_["C"].T
        return z.gather(1, items) + view.dense["b"].unsqueeze(1)

    def touched_rows(self, lengths: torch.Tensor) -> torch.Tensor:
        return touched_with_negatives(lengths, self.n_items, self.n_neg * self.local_epochs)

    def sparse_train_bytes(self, lengths: torch.Tensor) -> int:
        """Per epoch's samples: their keys, rows and devices (int64), the embedding, user and
        gradient rows (k floats each) and a few scalars; all epochs' negatives are drawn
        first (key and count, and the sampler's draw); A and the update (k floats per
        touched row) and its key."""
        k, ep = self.k, self.local_epochs
        pos = int(lengths.sum())
        samples, neg = pos * (1 + self.n_neg), pos * self.n_neg
        touched = int(self.touched_rows(lengths).sum())
        return samples * (3 * 8 + 3 * 4 * k + 24) + ep * neg * 24 + 3 * neg * 8 + touched * (8 * k + 16)


class ExplicitMFParams(TypedDict, total=False):
    """The keyword hyperparameters of ExplicitMF (for subclasses passing them on)."""

    k: int
    item_bias: bool
    user_bias: bool
    user_solver: str
    center: float
    local_epochs: int
    lr_user: float
    lr_item: float
    lr_decay: float
    server_lr: float
    reg: float
    init_std: float
    chunk: int


class ExplicitMF(FederatedRecommender):
    """Batched explicit MF core: global Q (m, k) [+ item bias bq (m,)], private p (n, k).

    Subclasses may add a private per-(device, item) offset through `_offset`.
    """

    kind: ClassVar[Literal["implicit", "explicit"]] = "explicit"

    def __init__(
        self,
        n_users: int,
        n_items: int,
        *,
        k: int = 16,
        item_bias: bool = True,
        user_bias: bool = False,
        user_solver: str = "exact",
        center: float = 3.0,
        local_epochs: int = 1,
        lr_user: float = 0.5,
        lr_item: float = 0.2,
        lr_decay: float = 1.0,
        server_lr: float = 10.0,
        reg: float = 0.12,
        init_std: float = 0.1,
        chunk: int = 64,
    ) -> None:
        if k < 1 or local_epochs < 1:
            raise ValueError("k and local_epochs must be >= 1")
        if user_solver not in ("gd", "exact"):
            raise ValueError(f"user_solver must be 'gd' or 'exact', not {user_solver!r}")
        self.n_users, self.n_items, self.k = n_users, n_items, k
        self.item_bias, self.user_bias, self.user_solver, self.center = item_bias, user_bias, user_solver, center
        self.local_epochs = local_epochs
        self.lr_user, self.lr_item, self.lr_decay, self.server_lr = lr_user, lr_item, lr_decay, server_lr
        self.reg, self.init_std, self.chunk = reg, init_std, chunk

    config_keys: ClassVar[tuple[str, ...]] = (
        "k", "item_bias", "user_bias", "user_solver", "center", "local_epochs", "lr_user", "lr_item", "lr_decay",
        "server_lr", "reg", "init_std",
    )  # fmt: skip

    @property
    def update_dim(self) -> int:
        return self.n_items * self.k + (self.n_items if self.item_bias else 0)

    def init_global(self, generator: torch.Generator) -> GlobalState:
        g: GlobalState = {"Q": randn((self.n_items, self.k), self.init_std, generator)}
        if self.item_bias:
            g["bq"] = torch.zeros(self.n_items, device=generator.device)
        return g

    def init_private(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        nb = int(data.users.shape[0])
        state: PrivateState = {"p": user_normal(check_seed(seed), 1, data.users, (self.k,), self.init_std)}
        if self.user_bias:
            state["bu"] = torch.zeros(nb, device=data.users.device)
        return state

    # hook for FedMMF: private additive term of the prediction, (B, m) for the cohort rows
    def _offset(self, private: PrivateState) -> torch.Tensor | None:
        return None

    def _carry(self, private: PrivateState) -> PrivateState:
        """Private entries that local training leaves unchanged."""
        return {}

    def local_update(self, job: LocalRound) -> tuple[PrivateState, torch.Tensor]:
        if job.data.ratings is None:
            raise ValueError(f"{self.name} is an explicit model: the cohort data needs ratings")
        m, k = self.n_items, self.k
        Q = job.global_["Q"]
        bq = job.global_.get("bq")
        flat = flatten(job.data)
        nb = flat.n_devices
        dev_t = Q.device
        f = self.lr_decay**job.round_idx
        lr_u, lr_i = self.lr_user * f, self.lr_item * f
        assert flat.rating is not None
        # dense (B, m) tables of the targets and of which entries are rated
        rated = torch.zeros(nb * m, device=dev_t)
        rated[flat.dev * m + flat.item] = 1.0
        target = torch.zeros(nb * m, device=dev_t)
        target[flat.dev * m + flat.item] = flat.rating
        rated, target = rated.view(nb, m), target.view(nb, m)
        target = target - self.center
        off = self._offset(job.private)
        if off is not None:
            target = target - off
        n_r = flat.counts.clamp(min=1).to(torch.float32)

        p_all = job.private["p"].clone()
        bu_all = job.private["bu"].clone() if self.user_bias else None
        upd = torch.empty(nb, self.update_dim, device=dev_t)
        mk = m * k
        for s in range(0, nb, self.chunk):
            sl = slice(s, min(nb, s + self.chunk))
            bc = sl.stop - sl.start
            p = p_all[sl]
            bu = bu_all[sl] if bu_all is not None else None
            r_c, t_c = rated[sl], target[sl]
            if self.user_solver == "exact":
                self._solve_users(Q, bq, r_c, t_c, n_r[sl], p, bu)
            W = torch.zeros(bc, m, k, device=dev_t)  # Q_u - Q
            wb = torch.zeros(bc, m, device=dev_t) if bq is not None else None  # b_u - b
            for _ in range(self.local_epochs):
                pred = torch.bmm(W, p.unsqueeze(2)).squeeze(2) + p @ Q.T
                if bq is not None and wb is not None:
                    pred = pred + bq + wb
                if bu is not None:
                    pred = pred + bu.unsqueeze(1)
                g = r_c * (pred - t_c)  # d (1/2 sum err^2) / d pred, rated entries only
                grad_p = torch.bmm(g.unsqueeze(1), W).squeeze(1) + g @ Q + self.reg * n_r[sl, None] * p
                # item rows: g * p + reg * q for every rating of the item
                shrink = (W + Q).mul_(r_c.unsqueeze(2)) if self.reg > 0 else None
                W.baddbmm_(g.unsqueeze(2), p.unsqueeze(1), alpha=-lr_i)
                if shrink is not None:
                    W.sub_(shrink, alpha=lr_i * self.reg)
                if wb is not None:
                    wb.sub_(g, alpha=lr_i)
                if self.user_solver == "gd":
                    if bu is not None:
                        bu.sub_(g.sum(1) / n_r[sl], alpha=lr_u)
                    p.sub_(grad_p / n_r[sl, None], alpha=lr_u)
            upd[sl, :mk] = W.view(bc, mk)
            if wb is not None:
                upd[sl, mk:] = wb
        new_private: PrivateState = {"p": p_all}
        if bu_all is not None:
            new_private["bu"] = bu_all
        new_private.update(self._carry(job.private))
        return new_private, upd

    def _solve_users(
        self,
        Q: torch.Tensor,
        bq: torch.Tensor | None,
        rated: torch.Tensor,
        target: torch.Tensor,
        n_r: torch.Tensor,
        p: torch.Tensor,
        bu: torch.Tensor | None,
    ) -> None:
        """ALS step of federated collaborative filtering (Ammad-ud-din et al. 2019):
        each device sets p_u (and b_u) to the exact ridge solution for the current
        item table, in place: min 1/2 sum (t - b_i - b_u - p.q_i)^2 + reg/2 n_u ||p||^2
        (b_u unpenalised)."""
        qa = Q if bu is None else torch.cat([Q, torch.ones(Q.shape[0], 1, device=Q.device)], 1)
        kk = qa.shape[1]
        y = target - (bq if bq is not None else 0.0)
        A = torch.einsum("bm,mi,mj->bij", rated, qa, qa)
        diag = torch.full((kk,), 1.0, device=Q.device)
        if bu is not None:
            diag[-1] = 1e-6
        A = A + self.reg * n_r[:, None, None] * torch.diag(diag) + 1e-6 * torch.eye(kk, device=Q.device)
        rhs = (rated * y) @ qa
        sol = torch.linalg.solve(A, rhs)
        p.copy_(sol[:, : self.k])
        if bu is not None:
            bu.copy_(sol[:, -1])

    def apply_mean_update(
        self, global_: GlobalState, mean_update: torch.Tensor, round_idx: int
    ) -> GlobalState:
        mk = self.n_items * self.k
        out: GlobalState = {"Q": global_["Q"] + self.server_lr * mean_update[:mk].view(self.n_items, self.k)}
        if self.item_bias:
            out["bq"] = global_["bq"] + self.server_lr * mean_update[mk:]
        return out

    def _predict(
        self, global_: GlobalState, private: PrivateState, items: torch.Tensor
    ) -> torch.Tensor:
        q = global_["Q"][items]  # (B, K, k)
        pred = torch.einsum("bkd,bd->bk", q, private["p"]) + self.center
        if self.item_bias:
            pred = pred + global_["bq"][items]
        if self.user_bias:
            pred = pred + private["bu"].unsqueeze(1)
        return pred

    def score(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        return self._predict(global_, private, items)


class FedMFExplicit(ExplicitMF):
    """Explicit FedMF (`fedmask simulate --model fedmf --explicit`)."""

    name: ClassVar[str] = "fedmf"
