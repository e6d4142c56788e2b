"""FedMMF: federated masked matrix factorisation with personalised masks
(Yang, Tan, Liu, Zheng, Chen, Yang: "Practical and Secure Federated
Recommendation with Personalized Masks").

1. Before federated training every device trains a private model f_u on its
   own training ratings and the items' public side features (paper Eq. 10,
   mean squared error plus an L2 penalty `mask_reg`):
     - order "one":  linear regression  f_u(i) = w0 + <w, x_i>  (closed-form ridge);
     - order "two":  factorisation machine  w0 + <w, x_i> + sum_{a<b} <v_a, v_b> x_ia x_ib;
     - order "high": a small MLP  w0 + w2 . relu(W1 x_i + b1).
   The FM and the MLP are trained by full-batch Adam, all devices at once
   (their losses are independent, so summing them keeps the devices apart).
   The user's own profile features are a constant vector inside a per-user
   model (their effect is absorbed by the intercept w0), so only item
   features enter. f_u is evaluated once for every item and kept as the
   private (n, m) table `mask`.
2. Federated MF (the shared `ExplicitMF` core) on the masked ratings
   r - f_u(i) (Eq. 11); prediction q_i . p_u (+ b_i) + f_u(i) (Eq. 12). Only
   the item-factor updates leave the device.
3. The paper's privacy indicator J_u (Eq. 15): mean squared residual of f_u on
   the device's training ratings, kept per device (private["J"]) and
   summarised by `summary()` (mean, quantiles). In the paper a coordinator
   may let devices with a well-fitting mask (small J) send plaintext updates;
   that policy belongs to the coordinator, the indicator is produced here.
"""

from __future__ import annotations

from typing import ClassVar, Unpack

import torch

from models.base import CohortData, GlobalState, PrivateState
from models.fedmf import ExplicitMF, ExplicitMFParams
from models.keyed_random import user_normal

ORDERS: tuple[str, ...] = ("one", "two", "high")
_INIT_V, _INIT_W1, _INIT_W2 = 11, 12, 13  # tags of the keyed initialisation (p uses 1)


class FedMMF(ExplicitMF):
    name: ClassVar[str] = "fedmmf"

    def __init__(
        self,
        n_users: int,
        n_items: int,
        item_features: torch.Tensor | None,
        *,
        order: str = "two",
        mask_reg: float = 0.3,
        mask_steps: int = 300,
        mask_lr: float = 0.05,
        fm_k: int = 4,
        mlp_hidden: int = 16,
        **mf_kwargs: Unpack[ExplicitMFParams],
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown mask order {order!r}; expected one of {ORDERS}")
        super().__init__(n_users, n_items, **mf_kwargs)
        if item_features is None:
            item_features = torch.zeros(n_items, 0)
        if item_features.shape[0] != n_items:
            raise ValueError("item_features must have one row per item")
        self.item_features = item_features.to(torch.float32)
        self.order, self.mask_reg, self.mask_steps, self.mask_lr = order, mask_reg, mask_steps, mask_lr
        self.fm_k, self.mlp_hidden = fm_k, mlp_hidden

    config_keys: ClassVar[tuple[str, ...]] = ExplicitMF.config_keys + (
        "order", "mask_reg", "mask_steps", "mask_lr", "fm_k", "mlp_hidden",
    )  # fmt: skip

    # ------------------------------------------------------------------ masks
    def init_private(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        if data.ratings is None:
            raise ValueError("FedMMF is an explicit model: the cohort data needs ratings")
        state = super().init_private(data, global_, seed)
        mask, J = self.train_masks(data, seed)
        state["mask"] = mask
        state["J"] = J
        return state

    def train_masks(self, data: CohortData, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Train every device's f_u; returns (f_u(i) for all items (B, m), J (B,))."""
        assert data.ratings is not None
        dev_t = data.items.device
        X = self.item_features.to(dev_t)  # (m, F)
        msk = (data.mask if data.mask.dtype == torch.bool else data.mask.bool()).to(torch.float32)
        r = data.ratings.to(torch.float32) * msk
        xb = X[data.items] * msk.unsqueeze(2)  # (B, L, F), padding rows zero
        n = msk.sum(1).clamp(min=1.0)
        r_mean = r.sum(1) / n
        if self.order == "one":
            params = self._fit_linear(xb, r, msk, n)
        else:
            params = self._fit_adam(xb, r, msk, n, r_mean, data.users, seed)
        fit = self._mask_forward(params, xb)  # (B, L)
        J = (((r - fit) * msk) ** 2).sum(1) / n
        full = self._mask_forward(params, X.unsqueeze(0).expand(msk.shape[0], -1, -1))
        return full.detach(), J.detach()

    def _fit_linear(
        self, xb: torch.Tensor, r: torch.Tensor, msk: torch.Tensor, n: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        nb, _, nf = xb.shape
        A = torch.cat([msk.unsqueeze(2), xb], dim=2)  # intercept column (zero on padding)
        ata = torch.bmm(A.transpose(1, 2), A) / n[:, None, None]
        atr = torch.bmm(A.transpose(1, 2), r.unsqueeze(2)).squeeze(2) / n[:, None]
        pen = torch.full((nf + 1,), self.mask_reg, device=xb.device)
        pen[0] = 1e-6  # intercept (almost) unpenalised
        sol = torch.linalg.solve(ata + torch.diag(pen), atr)
        return {"w0": sol[:, 0], "w": sol[:, 1:]}

    def _fit_adam(
        self,
        xb: torch.Tensor,
        r: torch.Tensor,
        msk: torch.Tensor,
        n: torch.Tensor,
        r_mean: torch.Tensor,
        users: torch.Tensor,
        seed: int,
    ) -> dict[str, torch.Tensor]:
        nb, _, nf = xb.shape
        dev_t = xb.device

        def rnd(tag: int, *shape: int, std: float) -> torch.Tensor:
            # keyed by (seed, user): a device's mask model starts the same in any batch
            return user_normal(seed, tag, users, shape, std, device=dev_t)

        params: dict[str, torch.Tensor] = {"w0": r_mean.clone(), "w": torch.zeros(nb, nf, device=dev_t)}
        if self.order == "two":
            params["V"] = rnd(_INIT_V, nf, self.fm_k, std=0.05)
        else:
            h = self.mlp_hidden
            params["W1"] = rnd(_INIT_W1, nf, h, std=(1.0 / max(nf, 1)) ** 0.5)
            params["b1"] = torch.zeros(nb, h, device=dev_t)
            params["w2"] = rnd(_INIT_W2, h, std=(1.0 / h) ** 0.5 * 0.1)
        for p in params.values():
            p.requires_grad_(True)
        penalised = [v for key, v in params.items() if key not in ("w0", "b1")]
        opt = torch.optim.Adam(list(params.values()), lr=self.mask_lr)
        with torch.enable_grad():
            for _ in range(self.mask_steps):
                opt.zero_grad(set_to_none=True)
                fit = self._mask_forward(params, xb)
                mse = ((((r - fit) * msk) ** 2).sum(1) / n).sum()
                penalty = sum((v**2).sum() for v in penalised)
                (mse + self.mask_reg * penalty).backward()
                opt.step()
        return {key: v.detach() for key, v in params.items()}

    def _mask_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """f_u(x) for x (B, L, F) -> (B, L)."""
        out = params["w0"].unsqueeze(1) + torch.bmm(x, params["w"].unsqueeze(2)).squeeze(2)
        if "V" in params:
            V = params["V"]
            xv = torch.bmm(x, V)
            x2v2 = torch.bmm(x * x, V * V)
            out = out + 0.5 * (xv * xv - x2v2).sum(2)
        if "W1" in params:
            hid = torch.relu(torch.bmm(x, params["W1"]) + params["b1"].unsqueeze(1))
            out = out + torch.bmm(hid, params["w2"].unsqueeze(2)).squeeze(2)
        return out

    # ------------------------------------------------------------------ MF on masked ratings
    def _offset(self, private: PrivateState) -> torch.Tensor | None:
        # the MF core also subtracts `center`; the mask already predicts the level
        return private["mask"] - self.center

    def _carry(self, private: PrivateState) -> PrivateState:
        return {"mask": private["mask"], "J": private["J"]}

    def score(
        self, global_: GlobalState, private: PrivateState, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        nb = items.shape[0]
        mask = private["mask"][torch.arange(nb, device=items.device).unsqueeze(1), items]
        return self._predict(global_, private, items) - self.center + mask

    def summary(self, global_: GlobalState, private: PrivateState) -> dict[str, float]:
        """Aggregate statistics of the privacy indicator J over all devices."""
        J = private["J"].to(torch.float64)
        if J.numel() == 0:
            return {}
        q = torch.quantile(J, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device=J.device))
        return {
            "privacy_J_mean": float(J.mean()),
            "privacy_J_p10": float(q[0]),
            "privacy_J_median": float(q[1]),
            "privacy_J_p90": float(q[2]),
            "privacy_J_min": float(J.min()),
            "privacy_J_max": float(J.max()),
        }
