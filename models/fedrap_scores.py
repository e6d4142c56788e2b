"""FedRAP's scores: item i's embedding for device u is C_i + D_ui (either
part may be off by the variant), its score <C_i + D_ui, u_u> + b_u (+ the
public item bias c_bias_i). Pure tensor arithmetic, shared by `FedRAP.score`
and the simulator's evaluation.

- `gathered_scores`: at the scored items (B, K), with D_u already taken at
  them (B, K, k): C is gathered there too.
- `all_item_scores`: at every item (B, m), from whole rows D_u (B, m, k):
  C is broadcast instead of gathered, into a buffer the caller may keep
  across batches. The tensors summed are the same as `gathered_scores`' at
  items 0..m-1, and so is the einsum: the same scores, bit for bit.
"""

from __future__ import annotations

import torch

from models.base import GlobalState, PrivateState


def gathered_scores(global_: GlobalState, private: PrivateState, items: torch.Tensor, *, has_c: bool,
                    has_d: bool, has_bias: bool) -> torch.Tensor:
    """Scores (B, K) at `items`, private["D"] already (B, K, k) at those items."""
    e = None
    if has_c:
        e = global_["C"][items]  # (B, K, k)
    if has_d:
        d = private["D"]
        e = d if e is None else e + d
    assert e is not None
    out = torch.einsum("bkd,bd->bk", e, private["u"]) + private["b"].unsqueeze(1)
    if has_bias:
        out = out + global_["c_bias"][items]
    return out


def all_item_scores(global_: GlobalState, private: PrivateState, *, has_c: bool, has_d: bool, has_bias: bool,
                    scratch: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Scores (B, m) of every item, private["D"] whole rows (B, m, k)."""
    B = int(private["u"].shape[0])
    e: torch.Tensor | None = None
    if has_c and has_d:
        d = private["D"]
        e = torch.add(d, global_["C"].unsqueeze(0), out=_buffer(scratch, d))
    elif has_c:
        e = global_["C"].unsqueeze(0).expand(B, -1, -1).contiguous()
    elif has_d:
        e = private["D"]
    assert e is not None
    out = torch.einsum("bkd,bd->bk", e, private["u"]) + private["b"].unsqueeze(1)
    if has_bias:
        out = out + global_["c_bias"].unsqueeze(0)
    return out


def _buffer(scratch: dict[str, torch.Tensor] | None, like: torch.Tensor) -> torch.Tensor:
    """A buffer shaped like `like`, kept in the caller's `scratch` across the
    batches of one evaluation: C + D_u is written over the same pages each
    batch (fresh pages cost 2.5 times the time); a new one without scratch."""
    buf = None if scratch is None else scratch.get("score")
    if buf is None or buf.shape != like.shape or buf.dtype != like.dtype or buf.device != like.device:
        buf = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        if scratch is not None:
            scratch["score"] = buf
    return buf
