"""FREIB and the platform-level baselines: models whose clients are platforms.

"Federated Recommendation with Explicitly Encoding Item Bias" (Wang et al.,
AAAI 2025). M platforms each hold all ratings of their own users; the server
averages what they upload (FedAvg, 1/M each). FREIB's local model:

- backbone NCF (He et al. 2017): r_o = f_o(GMF(u, i) (+) MLP(u, i)) + c, with
  GMF = p_u^g * q_i^g, MLP = ReLU layers over [p_u^m, q_i^m], f_o linear, and
  c a public constant (the middle of the rating scale: a shift of the output
  bias that needs no data);
- explicit item-bias encoder (Eq. 3-5): an item-bias table E_bias (n_items x
  d_bias) and a linear score S_bias; r_bias = r_o + S_bias(e_i);
- loss (Eq. 15), every term a mean squared error over the platform's
  mini-batch: L = L_CE(r_o, r) + L_bias(r_bias, r) + L_distill(r_bias,
  r_bias_fixed) + tau * L_proto, where r_bias_fixed is the prediction of the
  model the platform received at the start of the round, frozen (global
  knowledge guidance, Eq. 7-9; from the second round on, "after the first
  communication epoch"), and L_proto = mean over the batch of
  mean_d (e_i - G_k)^2 for the sample's rating level k (Eq. 14);
- after local training, local prototypes P_k^m = the mean item-bias
  embedding over the platform's training ratings of level k (Eq. 10); the
  server's G_k is their mean over the platforms that have level k (Eq. 12;
  the paper's 1/M sum when every platform has every level).
Ablations (paper Table 4): `bias_encoder=False` (r = r_o, no L_bias, no
prototypes), `guidance=False`, `prototypes=False` (tau = 0, none uploaded).

Which parameters are shared: everything of the model except the user
embeddings. A user lives on exactly one platform (models/data/platforms.py),
so its embedding stays private to that platform (averaging it with the M-1
platforms that never touch it would only divide its steps by M).

Baselines on the same platforms (`backbone`):
- "mf" (FedMF, Chai et al. 2021): r = <p_u, q_i> + c; Q shared, P private;
- "biasedmf": r = <p_u, q_i> + b_u + b_i + c (the centralised yardstick runs
  it with one platform holding every user);
- "pfedrec" (PFedRec, Zhang et al. 2023, made explicit and given users): the
  item table Q is shared, each platform keeps a private score function
  r = w_m . (p_u * q_i) + b_m + c and scores with its own copy of Q as it
  left local training (dual personalisation).

Local training (`local_train`) is mini-batch SGD with momentum and weight
decay (the paper's optimiser), `local_epochs` passes over the platform's
training ratings in a keyed random order (seed, round, epoch, platform id);
with `local_fraction` < 1 an epoch stops after that share of the order (a
fresh keyed subset every round, so the server averages more often per pass).
It is a pure function of (the platform's data, its private rows, the public
global parameters and prototypes, round, seed): an edge client hosting one
platform calls it with M = 1 and gets the same result as its row in the
stacked simulation (up to float rounding of batched matrix products). The
stacked version runs all M platforms in one set of tensor ops; a platform
with fewer mini-batches sits out the remaining steps of each epoch (its
parameters and momentum are frozen then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import torch

from models.keyed_random import KeyedStream, Purpose, check_seed, user_normal

Backbone = Literal["ncf", "mf", "biasedmf", "pfedrec"]
#: Embedding tables (a row per user or item): with decay_embeddings=False only the per-rating l2 regularises them.
EMBEDDING_TABLES = frozenset({"Pg", "Pm", "Qg", "Qm", "P", "Q", "Eb", "bu", "bi"})
Scope = Literal["shared", "user", "platform"]
Params = dict[str, torch.Tensor]


def params_to(params: Params, device: torch.device | str) -> Params:
    """The same tensors on `device`."""
    return {k: v.to(device) for k, v in params.items()}


_PLATFORM_STREAM = 0x46524549  # "FREI": keyed draws of platform-level training


@dataclass(frozen=True)
class PlatformModel:
    """Hyperparameters of a platform-level model (defaults: docs/decisions.md D27)."""

    n_users: int
    n_items: int
    n_levels: int
    backbone: Backbone = "ncf"
    bias_encoder: bool = True
    guidance: bool = True
    prototypes: bool = True
    tau: float = 10.0
    k: int = 32
    k_bias: int = 10
    mlp: tuple[int, ...] = (32, 16)
    user_bias: bool = False  # NCF only: a private per-user offset b_u added to r_o (D67)
    center: float = 3.0
    lr: float = 0.01
    lr_decay: float = 1.0  # the learning rate of round r is lr * lr_decay^r
    momentum: float = 0.9
    weight_decay: float = 1e-5
    decay_embeddings: bool = True  # False: weight_decay on the network weights only, l2 on embedding rows (D67)
    l2: float = 0.0
    batch_size: int = 256
    local_epochs: int = 2
    local_fraction: float = 1.0  # each local epoch passes over this share of the platform's ratings (keyed draw)
    init_std: float = 0.1

    def __post_init__(self) -> None:
        if self.backbone not in ("ncf", "mf", "biasedmf", "pfedrec"):
            raise ValueError(f"unknown backbone {self.backbone!r}")
        if min(self.k, self.k_bias, self.batch_size, self.local_epochs, self.n_levels) < 1:
            raise ValueError("k, k_bias, batch_size, local_epochs and n_levels must be >= 1")
        if not 0 < self.lr_decay <= 1:
            raise ValueError("lr_decay must be in (0, 1]")
        if not 0 < self.local_fraction <= 1:
            raise ValueError("local_fraction must be in (0, 1]")
        if self.lr <= 0 or not 0 <= self.momentum < 1 or min(self.weight_decay, self.tau, self.l2) < 0:
            raise ValueError("need lr > 0, 0 <= momentum < 1, weight_decay >= 0, l2 >= 0, tau >= 0")

    def config(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("n_users", "n_items")}

    @property
    def uses_prototypes(self) -> bool:
        return self.bias_encoder and self.prototypes and self.tau > 0

    # ------------------------------------------------------------ parameters
    def specs(self) -> list[tuple[str, Scope, tuple[int, ...], float]]:
        """(name, scope, shape without the leading axis, init std) of every
        parameter; std < 0 means zeros. Shared names are sorted in the update."""
        k, m = self.k, self.n_items
        out: list[tuple[str, Scope, tuple[int, ...], float]] = []
        if self.backbone == "ncf":
            out += [("Pg", "user", (k,), self.init_std), ("Pm", "user", (k,), self.init_std)]
            out += [("Qg", "shared", (m, k), self.init_std), ("Qm", "shared", (m, k), self.init_std)]
            fan = 2 * k
            for j, h in enumerate(self.mlp):
                out += [(f"W{j}", "shared", (fan, h), 1.0 / math.sqrt(fan)), (f"b{j}", "shared", (h,), -1.0)]
                fan = h
            out += [("fw", "shared", (k + fan,), 1.0 / math.sqrt(k + fan)), ("fb", "shared", (), -1.0)]
            if self.user_bias:
                out += [("bu", "user", (), -1.0)]
        else:
            out += [("P", "user", (k,), self.init_std), ("Q", "shared", (m, k), self.init_std)]
            if self.backbone == "biasedmf":
                out += [("bu", "user", (), -1.0), ("bi", "shared", (m,), -1.0)]
            if self.backbone == "pfedrec":
                out += [("sw", "platform", (k,), -2.0), ("sb", "platform", (), -1.0)]  # -2: ones
        if self.bias_encoder:
            kb = self.k_bias
            out += [("Eb", "shared", (m, kb), self.init_std), ("Sw", "shared", (kb,), 1.0 / math.sqrt(kb))]
            out += [("Sb", "shared", (), -1.0)]
        return out

    def shared_names(self) -> list[str]:
        return sorted(n for n, s, _, _ in self.specs() if s == "shared")

    def shared_dim(self) -> int:
        return sum(math.prod(shape) for n, s, shape, _ in self.specs() if s == "shared")

    @property
    def update_dim(self) -> int:
        """Flat upload: shared-parameter change, then K x d_bias prototypes and K presence flags."""
        extra = self.n_levels * (self.k_bias + 1) if self.uses_prototypes else 0
        return self.shared_dim() + extra

    def init_shared(self, generator: torch.Generator) -> Params:
        """The server's initial shared parameters (seeded generator, CPU)."""
        out: Params = {}
        for name, scope, shape, std in self.specs():
            if scope != "shared":
                continue
            out[name] = torch.zeros(shape) if std < 0 else torch.randn(shape, generator=generator) * std
        return out

    def init_user(self, users: torch.Tensor, seed: int) -> Params:
        """Private user rows (n, ...) for the dense user ids `users`, keyed by (seed, user)."""
        out: Params = {}
        for tag, (name, scope, shape, std) in enumerate(self.specs()):
            if scope == "user":
                out[name] = (
                    torch.zeros((users.shape[0], *shape))
                    if std < 0
                    else user_normal(check_seed(seed), 100 + tag, users, shape, std)
                )
        return out

    def init_platform(self, n_platforms: int) -> Params:
        """Private per-platform parameters (M, ...): PFedRec's score function starts at w = 1, b = 0
        (so it begins as FedMF)."""
        out: Params = {}
        for name, scope, shape, std in self.specs():
            if scope == "platform":
                out[name] = torch.ones((n_platforms, *shape)) if std == -2.0 else torch.zeros((n_platforms, *shape))
        return out


# ================================================================ forward


def forward(
    model: PlatformModel, params: Params, users: torch.Tensor, items: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(r_o, r_pred, e_bias, sq) for (M, S) users/items; shared and platform
    parameters are stacked (M, ...), user parameters are (n_users, ...).
    r_pred = r_bias with the item-bias encoder, else r_o; sq (M, S) is the
    summed square of the user and item embedding rows each rating used (the
    per-rating L2 term of matrix factorisation)."""
    M = users.shape[0]
    mi = torch.arange(M, device=users.device).unsqueeze(1)
    if model.backbone == "ncf":
        pg, pm = params["Pg"][users], params["Pm"][users]
        qg, qm = params["Qg"][mi, items], params["Qm"][mi, items]
        sq = (pg**2).sum(2) + (pm**2).sum(2) + (qg**2).sum(2) + (qm**2).sum(2)
        h = torch.cat([pm, qm], dim=2)
        for j in range(len(model.mlp)):
            h = torch.relu(torch.baddbmm(params[f"b{j}"].unsqueeze(1), h, params[f"W{j}"]))
        z = torch.cat([pg * qg, h], dim=2)
        r_o = (z * params["fw"].unsqueeze(1)).sum(2) + params["fb"].unsqueeze(1)
        if model.user_bias:
            r_o = r_o + params["bu"][users]
    else:
        p, q = params["P"][users], params["Q"][mi, items]
        sq = (p**2).sum(2) + (q**2).sum(2)
        if model.backbone == "pfedrec":
            r_o = (p * q * params["sw"].unsqueeze(1)).sum(2) + params["sb"].unsqueeze(1)
        else:
            r_o = (p * q).sum(2)
        if model.backbone == "biasedmf":
            r_o = r_o + params["bu"][users] + params["bi"][mi, items]
    r_o = r_o + model.center
    if not model.bias_encoder:
        return r_o, r_o, None, sq
    e = params["Eb"][mi, items]
    r_b = r_o + (e * params["Sw"].unsqueeze(1)).sum(2) + params["Sb"].unsqueeze(1)
    return r_o, r_b, e, sq + (e**2).sum(2)


# ================================================================ data of M platforms


@dataclass(frozen=True)
class PlatformData:
    """The training ratings of M platforms, padded to (M, Lmax).

    `platforms` are the platform ids (keys of the random order), `level` the
    rating-level index of every rating (prototype it belongs to)."""

    platforms: torch.Tensor  # int64 (M,)
    users: torch.Tensor  # int64 (M, L)
    items: torch.Tensor  # int64 (M, L)
    ratings: torch.Tensor  # float32 (M, L)
    level: torch.Tensor  # int64 (M, L)
    lengths: torch.Tensor  # int64 (M,)

    @property
    def mask(self) -> torch.Tensor:
        L = self.users.shape[1]
        return torch.arange(L, device=self.users.device).unsqueeze(0) < self.lengths.unsqueeze(1)

    def to(self, device: torch.device | str) -> PlatformData:
        """The same ratings on `device`."""
        return PlatformData(
            self.platforms.to(device), self.users.to(device), self.items.to(device), self.ratings.to(device),
            self.level.to(device), self.lengths.to(device),
        )  # fmt: skip

    def row(self, m: int) -> PlatformData:
        """Platform m alone (M = 1), trimmed."""
        n = int(self.lengths[m])
        return PlatformData(
            self.platforms[m : m + 1], self.users[m : m + 1, :n], self.items[m : m + 1, :n],
            self.ratings[m : m + 1, :n], self.level[m : m + 1, :n], self.lengths[m : m + 1],
        )  # fmt: skip


def _order(data: PlatformData, seed: int, round_idx: int, epoch: int) -> torch.Tensor:
    """(M, L) a keyed random order of each platform's ratings (padding last)."""
    st = KeyedStream.of(check_seed(seed), Purpose.SHUFFLE, _PLATFORM_STREAM, round_idx, epoch)
    L = data.users.shape[1]
    keys = st.uniform(data.platforms.unsqueeze(1), torch.arange(L, device=data.users.device).unsqueeze(0))
    keys = keys.masked_fill(~data.mask, math.inf)
    return torch.argsort(keys, dim=1)


def _masked_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(M,) per-platform mean of x (M, S) with weights w (M, S) in {0, 1}."""
    return (x * w).sum(1) / w.sum(1).clamp(min=1.0)


@dataclass(frozen=True)
class LocalResult:
    user: Params  # the platforms' user rows after training (full tables, other rows unchanged)
    platform: Params  # (M, ...) private platform parameters (PFedRec: score function and its own Q)
    update: torch.Tensor  # (M, update_dim) the uploads
    losses: dict[str, float]  # mean of each loss term over the last epoch's steps, averaged over platforms


def _stack(shared: Params, M: int) -> Params:
    return {k: v.unsqueeze(0).expand(M, *v.shape).clone() for k, v in shared.items()}


def local_train(
    model: PlatformModel,
    shared: Params,
    user: Params,
    platform: Params,
    data: PlatformData,
    protos: torch.Tensor | None,
    round_idx: int,
    seed: int,
) -> LocalResult:
    """LocalUpdating of FREIB's Algorithm 1 for the M platforms of `data`.

    `shared`: the global parameters (unstacked); `user`: user tables
    (n_users, ...); `platform`: (M, ...) private platform parameters;
    `protos`: (K, d_bias) global prototypes with NaN rows for levels no
    platform had, or None before the first aggregation. Nothing passed in is
    modified."""
    M = data.users.shape[0]
    dev = data.users.device
    shared_names = model.shared_names()
    par: Params = _stack(shared, M)
    for name, v in user.items():
        par[name] = v.clone()
    for name, v in platform.items():
        if name != "Q_local":
            par[name] = v.clone()
    for v in par.values():
        v.requires_grad_(True)
    # activity mask of each parameter row: user rows follow their platform
    user_plat = torch.full((model.n_users,), -1, dtype=torch.int64, device=dev)
    valid = data.mask
    user_plat[data.users[valid]] = torch.arange(M, device=dev).unsqueeze(1).expand_as(data.users)[valid]
    scope = {name: s for name, s, _, _ in model.specs()}

    guide = model.guidance and round_idx >= 1
    fixed: Params = {k: v.detach().clone() for k, v in par.items()} if guide else {}
    use_proto = model.uses_prototypes and protos is not None
    if use_proto:
        assert protos is not None
        g_ok = ~torch.isnan(protos).any(1)
        g = torch.nan_to_num(protos)
    bufs: Params = {k: torch.zeros_like(v) for k, v in par.items()}
    # an epoch visits the first ceil(fraction x length) ratings of the keyed order (float64: exact at 1.0)
    n_use = torch.ceil(data.lengths.to(torch.float64) * model.local_fraction).long()
    n_steps = (n_use + model.batch_size - 1) // model.batch_size
    t_max = int(n_steps.max()) if M else 0
    bs = model.batch_size
    lr = model.lr * model.lr_decay**round_idx
    sums = {"ce": 0.0, "bias": 0.0, "distill": 0.0, "proto": 0.0}
    count = 0
    for epoch in range(model.local_epochs):
        order = _order(data, seed, round_idx, epoch)
        for t in range(t_max):
            idx = order[:, t * bs : (t + 1) * bs]
            pos = torch.arange(t * bs, t * bs + idx.shape[1], device=dev).unsqueeze(0)
            w = (pos < n_use.unsqueeze(1)).to(torch.float32)
            u = torch.gather(data.users, 1, idx)
            it = torch.gather(data.items, 1, idx)
            r = torch.gather(data.ratings, 1, idx)
            r_o, r_p, e, sq = forward(model, par, u, it)
            loss_m = _masked_mean((r_o - r) ** 2, w)
            if model.l2 > 0:
                loss_m = loss_m + model.l2 * _masked_mean(sq, w)
            last = epoch == model.local_epochs - 1
            if last:
                sums["ce"] += float(loss_m.detach().mean())
            if model.bias_encoder:
                lb = _masked_mean((r_p - r) ** 2, w)
                loss_m = loss_m + lb
                if last:
                    sums["bias"] += float(lb.detach().mean())
            if guide:
                with torch.no_grad():
                    _, r_fix, _, _ = forward(model, fixed, u, it)
                ld = _masked_mean((r_p - r_fix) ** 2, w)
                loss_m = loss_m + ld
                if last:
                    sums["distill"] += float(ld.detach().mean())
            if use_proto and e is not None:
                lv = torch.gather(data.level, 1, idx)
                wp = w * g_ok[lv].to(torch.float32)
                lp = _masked_mean(((e - g[lv]) ** 2).mean(2), wp)
                loss_m = loss_m + model.tau * lp
                if last:
                    sums["proto"] += float(lp.detach().mean())
            count += int(last)
            for v in par.values():
                v.grad = None
            loss_m.sum().backward()
            active = (n_steps > t).to(torch.float32)  # (M,)
            with torch.no_grad():
                for name, p in par.items():
                    if p.grad is None:
                        continue
                    a = active if scope[name] != "user" else torch.where(
                        user_plat >= 0, active[user_plat.clamp(min=0)], torch.zeros((), device=dev)
                    )
                    a = a.view(-1, *([1] * (p.dim() - 1)))
                    grad = p.grad
                    if model.weight_decay > 0 and (model.decay_embeddings or name not in EMBEDDING_TABLES):
                        grad = grad + model.weight_decay * p
                    b = bufs[name]
                    b.mul_(1.0 - a * (1.0 - model.momentum)).add_(grad * a)
                    p.sub_(lr * a * b)

    with torch.no_grad():
        out_user = {k: par[k].detach() for k in user}
        out_plat: Params = {k: par[k].detach() for k in platform if k != "Q_local"}
        if model.backbone == "pfedrec":
            out_plat["Q_local"] = par["Q"].detach().clone()
        parts = [(par[n].detach() - shared[n].unsqueeze(0)).reshape(M, -1) for n in shared_names]
        if model.uses_prototypes:
            P, has = local_prototypes(model, par["Eb"].detach(), data)
            parts += [(P * has.unsqueeze(2)).reshape(M, -1), has]
        update = torch.cat(parts, dim=1)
    losses = {k: v / max(count, 1) for k, v in sums.items()}
    return LocalResult(out_user, out_plat, update, losses)


def local_prototypes(model: PlatformModel, Eb: torch.Tensor, data: PlatformData) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K, d_bias) mean item-bias embedding per rating level over each
    platform's training ratings (Eq. 10), and (M, K) 1.0 where the platform has the level."""
    M, K = data.users.shape[0], model.n_levels
    mi = torch.arange(M, device=Eb.device).unsqueeze(1).expand_as(data.items)
    valid = data.mask
    e = Eb[mi[valid], data.items[valid]]
    slot = mi[valid] * K + data.level[valid]
    s = torch.zeros(M * K, Eb.shape[2], device=Eb.device).index_add_(0, slot, e)
    c = torch.bincount(slot, minlength=M * K).to(torch.float32)
    has = (c > 0).to(torch.float32).view(M, K)
    return (s / c.clamp(min=1.0).unsqueeze(1)).view(M, K, -1), has


def server_step(
    model: PlatformModel, shared: Params, mean_update: torch.Tensor, n_platforms: int
) -> tuple[Params, torch.Tensor | None]:
    """FedAvg of the shared parameters (theta += mean change) and the global
    prototypes G_k = sum_m P_k^m / #platforms with level k (NaN where none;
    with Laplace noise on the flags, a level counts when its summed flags exceed 1/2)."""
    out: Params = {}
    off = 0
    for n in model.shared_names():
        v = shared[n]
        size = v.numel()
        out[n] = v + mean_update[off : off + size].view(v.shape)
        off += size
    if not model.uses_prototypes:
        return out, None
    K, kb = model.n_levels, model.k_bias
    psum = mean_update[off : off + K * kb].view(K, kb) * n_platforms
    hsum = mean_update[off + K * kb : off + K * kb + K] * n_platforms
    ok = hsum > 0.5
    G = psum / hsum.clamp(min=0.5).unsqueeze(1)
    G[~ok] = math.nan
    return out, G


def predict(
    model: PlatformModel,
    shared: Params,
    user: Params,
    platform: Params,
    m: int,
    users: torch.Tensor,
    items: torch.Tensor,
) -> torch.Tensor:
    """Predicted ratings (N,) of platform m for its users' (users, items) pairs."""
    par: Params = {k: v.unsqueeze(0) for k, v in shared.items()}
    par.update(user)
    for k, v in platform.items():
        par[k] = v[m : m + 1]
    if "Q_local" in par:  # PFedRec scores with the platform's own item table
        par["Q"] = par.pop("Q_local")
    _, r, _, _ = forward(model, par, users.unsqueeze(0), items.unsqueeze(0))
    return r[0]
