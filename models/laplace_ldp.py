"""The Laplace local-DP option of FREIB's paper, with the sensitivity it leaves out.

"Federated Recommendation with Explicitly Encoding Item Bias" (Wang et al.,
AAAI 2025) adds Laplace(0, lambda) noise to every parameter a platform uploads
("lambda is the LDP ratio"), lambda in {0.01, 0.02, 0.05, 0.1, 0.2}, and
states no sensitivity, so it reports no epsilon. To report one, each upload
(a row: the platform's parameter change and its prototypes) is first clipped
to L1 norm at most C (`clip_l1`), then every coordinate gets independent
Laplace(0, lambda) noise (`add_laplace`). Any two clipped uploads differ by at
most 2C in L1 norm, so one release is (2C / lambda, 0)-DP for the platform's
whole data set under replace-one-platform adjacency (the Laplace mechanism,
Dwork et al. 2006): `epsilon_per_release`. Releases of the same platform
over R rounds compose to at most R * 2C / lambda (basic composition,
`epsilon_total`). This is separate from the Gaussian ledger of
`models/privacy.py` (dp_accounting) and is never mixed into it.

The noise is drawn from a seeded torch.Generator in simulation (an edge
client must draw it from the OS, as the Gaussian noise).
"""

from __future__ import annotations

import torch


def clip_l1(rows: torch.Tensor, *, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale every row of (B, D) to L1 norm at most `clip`; returns (clipped copy, original L1 norms)."""
    if not clip > 0:
        raise ValueError(f"the L1 clip must be > 0, got {clip}")
    if rows.dim() != 2:
        raise ValueError(f"expected (B, D) rows, got shape {tuple(rows.shape)}")
    norms = rows.abs().sum(1)
    scale = torch.clamp(clip / norms.clamp(min=1e-12), max=1.0)
    return rows * scale.unsqueeze(1), norms


def laplace_noise(shape: tuple[int, ...], *, scale: float, generator: torch.Generator) -> torch.Tensor:
    """float32 Laplace(0, scale) samples by inversion: -scale * sign(u) * log(1 - 2|u|), u ~ U(-1/2, 1/2)."""
    if not scale > 0:
        raise ValueError(f"the Laplace scale must be > 0, got {scale}")
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device) - 0.5
    # 1 - 2|u| lies in (0, 1]: u = -0.5 exactly has probability 2^-53 and is mapped to the largest finite draw
    x = -scale * torch.sign(u) * torch.log1p(-(2.0 * u.abs()).clamp(max=1.0 - 2.0**-53))
    return x.to(torch.float32)


def add_laplace(rows: torch.Tensor, *, scale: float, generator: torch.Generator) -> torch.Tensor:
    """rows + Laplace(0, scale) element-wise (a new tensor)."""
    return rows + laplace_noise(tuple(rows.shape), scale=scale, generator=generator).to(rows.device)


def epsilon_per_release(*, clip: float, scale: float) -> float:
    """epsilon of one clipped, Laplace-noised upload: L1 sensitivity 2C over the scale lambda."""
    if not clip > 0 or not scale > 0:
        raise ValueError("clip and scale must be > 0")
    return 2.0 * clip / scale


def epsilon_total(*, clip: float, scale: float, releases: int) -> float:
    """Basic composition of `releases` uploads of one platform."""
    if releases < 0:
        raise ValueError("releases must be >= 0")
    return releases * epsilon_per_release(clip=clip, scale=scale)


def privatize_laplace(
    rows: torch.Tensor, *, clip: float, scale: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip each row to L1 norm `clip`, then add Laplace(0, scale); returns (noisy rows, original L1 norms)."""
    clipped, norms = clip_l1(rows, clip=clip)
    return add_laplace(clipped, scale=scale, generator=generator), norms
