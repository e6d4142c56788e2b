"""PFedRec: dual personalisation (Zhang et al., IJCAI 2023).

Each device keeps a private score function S_i (the paper's one-layer MLP: a
linear map k -> 1 with bias, then a sigmoid) and a personalised item
embedding E_i; the server keeps the global item embedding E (m x k). There is
no user embedding. Score of item j on device i: sigmoid(<w_i, E_i[j]> + b_i).

ClientUpdate (paper Alg. 1), all devices of the cohort at once:
  E_i <- E (the global embedding: personalisation restarts from it each round);
  S_i <- its latest value;
  negatives: `n_neg` per positive, uniform over all items minus the device's
  training items (fresh every epoch);
  for each epoch, for each mini-batch of `batch_size` samples of the device:
      1. S_i <- S_i - lr * grad_S BCE_mean(batch)      (item embedding fixed)
      2. E_i <- E_i - lr_item * grad_E BCE_sum(batch)   (with the updated S_i)
  upload E_i (as the update E_i - E, update_dim = m*k); keep S_i and E_i.
`weight_decay` is an L2 term on the score function's weight (the published
code's `l2_regularization`), applied in the batches a device takes part in.
Server: E <- E + server_lr * mean(E_i - E) (server_lr = 1 is the paper's plain
average of the uploaded embeddings). The score function never leaves the
device (partial aggregation). The published code uses `lr * n_items * lr_eta`
on the *mean* batch loss for the item step; `lr_item` here is the step on the
*summed* loss, i.e. that product divided by the batch size.

Batching: within a device, samples are shuffled into mini-batches; all devices
take their t-th mini-batch at the same time (a device with fewer batches sits
out the remaining ones). Devices are processed in chunks sorted by their
number of mini-batches, and each chunk's tables are dense (chunk, m, k):
the gradient of a mini-batch w.r.t. every logit is `c_neg * p + c_pos * (p - 1)`
from per-batch count tables, which is exact and needs no per-sample scatter.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from models.base import CohortData, FederatedRecommender, GlobalState, LocalRound, PrivateState
from models.batched import (
    flatten,
    negative_sampler,
    negative_samples,
    negatives_stream,
    randn,
    shuffle_ranks,
    shuffle_stream,
    within_device_index,
)
from models.keyed_random import check_seed, user_normal
from models.pfedrec_sparse import Settings, pfedrec_sparse_round
from models.sparse import ItemRows, SparseResult, SparseTraining, SparseView, touched_with_negatives


class PFedRec(FederatedRecommender, SparseTraining):
    name: ClassVar[str] = "pfedrec"
    kind: ClassVar[Literal["implicit", "explicit"]] = "implicit"

    def __init__(
        self,
        n_users: int,
        n_items: int,
        *,
        k: int = 32,
        local_epochs: int = 1,
        batch_size: int = 256,
        n_neg: int = 4,
        lr: float = 1.0,
        lr_item: float = 0.1,
        lr_decay: float = 1.0,
        server_lr: float = 300.0,
        weight_decay: float = 0.03,
        init_std_e: float = 0.1,
        init_std_w: float = 0.1,
        chunk: int = 64,
    ) -> None:
        if k < 1 or local_epochs < 1 or batch_size < 1 or n_neg < 0:
            raise ValueError("k, local_epochs and batch_size must be >= 1 and n_neg >= 0")
        self.n_users, self.n_items, self.k = n_users, n_items, k
        self.local_epochs, self.batch_size, self.n_neg = local_epochs, batch_size, n_neg
        self.lr, self.lr_item, self.lr_decay, self.server_lr = lr, lr_item, lr_decay, server_lr
        self.weight_decay = weight_decay
        self.init_std_e, self.init_std_w = init_std_e, init_std_w
        self.chunk = chunk

    config_keys: ClassVar[tuple[str, ...]] = tuple(
        "k local_epochs batch_size n_neg lr lr_item lr_decay server_lr weight_decay init_std_e init_std_w".split()
    )

    @property
    def update_dim(self) -> int:
        return self.n_items * self.k

    def init_global(self, generator: torch.Generator) -> GlobalState:
        return {"E": randn((self.n_items, self.k), self.init_std_e, generator)}

    def init_private(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        nb = int(data.users.shape[0])
        return self.init_dense(data, global_, seed) | {
            # before its first round a device scores with the global embedding it received
            "E": global_["E"].unsqueeze(0).expand(nb, -1, -1).clone(),
        }

    def init_dense(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        nb = int(data.users.shape[0])
        return {
            "w": user_normal(check_seed(seed), 1, data.users, (self.k,), self.init_std_w),
            "b": torch.zeros(nb, device=data.users.device),
        }

    def local_update(self, job: LocalRound) -> tuple[PrivateState, torch.Tensor]:
        m, k, bs = self.n_items, self.k, self.batch_size
        check_seed(job.seed)
        Eg = job.global_["E"]
        flat = flatten(job.data)
        nb = flat.n_devices
        dev_t = Eg.device
        f = self.lr_decay**job.round_idx
        lr, lr_item = self.lr * f, self.lr_item * f

        w_all = job.private["w"].clone()
        b_all = job.private["b"].clone()
        e_out = torch.empty(nb, m, k, device=dev_t)
        upd = torch.empty(nb, m * k, device=dev_t)
        n_samples = flat.counts * (1 + self.n_neg)
        n_batches = (n_samples + bs - 1) // bs

        # samples of every epoch: (epoch, device, item, label, mini-batch id)
        ep_dev, ep_item, ep_y, ep_bid = [], [], [], []
        # a sample's identity inside its device: positive p -> p, its negative (p, j) -> L_d + p * n_neg + j
        pos_idx = within_device_index(flat.dev, flat.counts)
        neg_idx = (flat.counts[flat.dev] + pos_idx * self.n_neg).repeat_interleave(self.n_neg) + torch.arange(
            self.n_neg, device=dev_t
        ).repeat(pos_idx.numel())
        sample_idx = torch.cat([pos_idx, neg_idx])
        sampler = negative_sampler(job.data, m, self.n_neg)
        for e in range(self.local_epochs):
            ndev, nitem = negative_samples(job.data, m, self.n_neg, negatives_stream(job.seed, job.round_idx, e), sampler)
            dev = torch.cat([flat.dev, ndev])
            item = torch.cat([flat.item, nitem])
            y = torch.cat([torch.ones_like(flat.item), torch.zeros_like(nitem)]).to(torch.float32)
            # keyed random rank of each sample inside its device -> mini-batch id
            rank = shuffle_ranks(dev, sample_idx, n_samples, job.data.users, shuffle_stream(job.seed, job.round_idx, e))
            ep_dev.append(dev)
            ep_item.append(item)
            ep_y.append(y)
            ep_bid.append(rank // bs)

        perm = torch.argsort(n_batches, stable=True)  # chunks of similar batch counts
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(nb, device=perm.device)
        for s in range(0, nb, self.chunk):
            rows = perm[s : s + self.chunk]
            bc = rows.shape[0]
            t_max = int(n_batches[rows].max()) if bc else 0
            w = w_all[rows]
            bias = b_all[rows]
            W = torch.zeros(bc, m, k, device=dev_t)  # E_i - E
            for e in range(self.local_epochs):
                local = inv[ep_dev[e]] - s  # position inside the chunk
                sel = (local >= 0) & (local < bc)
                li, it, yy, bi = local[sel], ep_item[e][sel], ep_y[e][sel], ep_bid[e][sel]
                idx = (bi * bc + li) * m + it
                size = t_max * bc * m
                cpos = torch.bincount(idx, weights=yy, minlength=size).view(t_max, bc, m).float()
                call = torch.bincount(idx, minlength=size).view(t_max, bc, m).float()
                cneg = call - cpos
                nbatch = call.sum(2).clamp(min=1.0)  # (t_max, bc) samples per device and batch
                for t in range(t_max):
                    # 1. score function, item embedding fixed (mean BCE of the batch)
                    z = torch.bmm(W, w.unsqueeze(2)).squeeze(2) + w @ Eg.T + bias.unsqueeze(1)
                    p = torch.sigmoid(z)
                    g = cneg[t] * p + cpos[t] * (p - 1.0)
                    gw = (torch.bmm(g.unsqueeze(1), W).squeeze(1) + g @ Eg) / nbatch[t].unsqueeze(1)
                    if self.weight_decay > 0:  # the reference code's l2_regularization, on S_i
                        gw = gw + self.weight_decay * w * (call[t].sum(1, keepdim=True) > 0)
                    w = w - lr * gw
                    bias = bias - lr * g.sum(1) / nbatch[t]
                    # 2. item embedding with the updated score function (summed BCE)
                    z = torch.bmm(W, w.unsqueeze(2)).squeeze(2) + w @ Eg.T + bias.unsqueeze(1)
                    p = torch.sigmoid(z)
                    g = cneg[t] * p + cpos[t] * (p - 1.0)
                    W.baddbmm_(g.unsqueeze(2), w.unsqueeze(1), alpha=-lr_item)
            w_all[rows] = w
            b_all[rows] = bias
            upd[rows] = W.view(bc, m * k)
            e_out[rows] = W.add_(Eg)
        return {"w": w_all, "b": b_all, "E": e_out}, upd

    def apply_mean_update(
        self, global_: GlobalState, mean_update: torch.Tensor, round_idx: int
    ) -> GlobalState:
        return {"E": global_["E"] + self.server_lr * mean_update.view(self.n_items, self.k)}

    def score(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        nb = items.shape[0]
        e = private["E"][torch.arange(nb, device=items.device).unsqueeze(1), items]
        return self._score_rows(e, private)

    @staticmethod
    def _score_rows(e: torch.Tensor, private: PrivateState) -> torch.Tensor:
        """Scores from the devices' item rows e (B, K, k) and score functions."""
        return torch.einsum("bkd,bd->bk", e, private["w"]) + private["b"].unsqueeze(1)

    # ------------------------------------------------------------ the sparse path (D89)

    #: E_i is the global E of the round device i last trained in plus its rows W_i = E_i - E
    base_keys: ClassVar[tuple[str, ...]] = ("E",)

    def local_update_sparse(self, job: LocalRound) -> SparseResult:
        """`local_update` on the rows the cohort sampled (models/pfedrec_sparse.py). The
        new private rows and the update are the same rows: W_i = E_i - E."""
        check_seed(job.seed)
        f = self.lr_decay**job.round_idx
        settings = Settings(
            n_items=self.n_items, k=self.k, local_epochs=self.local_epochs, batch_size=self.batch_size,
            n_neg=self.n_neg, weight_decay=self.weight_decay, lr=self.lr * f, lr_item=self.lr_item * f,
        )  # fmt: skip
        dense, W = pfedrec_sparse_round(settings, job)
        return SparseResult(dense=dense, rows=W, update=W)

    def score_sparse(
        self, global_: GlobalState, view: SparseView, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """`score` on E_i = base E + W_i: <E_j, w_i> for every item j as one product per
        base (no (B, K, k) gather), plus <W_ij, w_i> on the rows device i has; the same
        sums as the dense table's in another float32 order."""
        nb = items.shape[0]
        dev = items.device
        w = view.dense["w"]
        z = torch.empty(nb, items.shape[1], device=dev)
        for v, base in enumerate(view.bases):
            sel = torch.nonzero(view.base_of == v).squeeze(1)
            if sel.numel():
                z[sel] = (w.index_select(0, sel) @ base["E"].T).gather(1, items.index_select(0, sel))
        rows = view.rows
        if rows is not None and rows.nnz:
            owner = rows.devices()
            slot = torch.full((nb * self.n_items,), -1, dtype=torch.int64, device=dev)
            slot[owner * self.n_items + rows.items] = torch.arange(rows.nnz, device=dev)
            at = slot.view(nb, self.n_items).gather(1, items)
            hit = at >= 0
            own = (rows.values * w.index_select(0, owner)).sum(1)  # <W_ij, w_i> of every row
            z[hit] += own.index_select(0, at[hit])
        return z + view.dense["b"].unsqueeze(1)

    def touched_rows(self, lengths: torch.Tensor) -> torch.Tensor:
        return touched_with_negatives(lengths, self.n_items, self.n_neg * self.local_epochs)

    def sparse_train_bytes(self, lengths: torch.Tensor) -> int:
        """Every epoch's samples are kept (device, item, label, batch: 8 bytes each, with
        their sort keys and order: 40 more); per mini-batch step the batch's embedding and
        gradient rows (k floats, three of them); W (k floats per touched row) and its key."""
        k = self.k
        samples = int(lengths.sum()) * (1 + self.n_neg)
        touched = int(self.touched_rows(lengths).sum())
        return self.local_epochs * samples * 72 + samples * (3 * 4 * k + 48) + touched * (4 * k + 16)
