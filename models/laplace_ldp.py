"""The Laplace local-DP option of FREIB's paper, with the sensitivity it leaves out.

"Federated Recommendation with Explicitly Encoding Item Bias" (Wang et al.,
AAAI 2025) adds Laplace(0, lambda) noise to every parameter a platform uploads
("lambda is the LDP ratio"), lambda in {0.01, 0.02, 0.05, 0.1, 0.2}, and
states no sensitivity, so it reports no epsilon. To report one, each upload
(a row: the platform's parameter change and its prototypes) is first clipped
to L1 norm at most C (`clip_l1`), then every coordinate gets independent
Laplace noise of scale lambda (`privatize_laplace`, exact: below). Any two clipped uploads differ by at
most 2C in L1 norm, so one release is (2C / lambda, 0)-DP for the platform's
whole data set under replace-one-platform adjacency (the Laplace mechanism,
Dwork et al. 2006): `epsilon_per_release`. Releases of the same platform
over R rounds compose to at most R * 2C / lambda (basic composition,
`epsilon_total`). This is separate from the Gaussian ledger of
`models/privacy.py` (dp_accounting) and is never mixed into it.

The noise is sampled exactly (D88): a float Laplace drawn by inverting a
float uniform is Mironov's attack case ("On Significance of the Least
Significant Bits for Differential Privacy", CCS 2012), so the release is the
discrete Laplace on a grid of step lambda / T instead, drawn with integer
arithmetic only (Algorithm 2 of Canonne, Kamath and Steinke, "The Discrete
Gaussian for Differential Privacy", 2020, `dpmech.exact_sampler`):

1. clip the row to L1 norm C' = C - sqrt(D) lambda / T (D coordinates);
2. scale by T / lambda and round every coordinate randomly (unbiased), again
   until the rounded row's L1 norm is at most B = floor(C T / lambda)
   (Hoeffding: a try fails with probability <= e^-1/2, as for the
   discrete Gaussian's norm bound);
3. add integer noise with P[Y = y] proportional to exp(-|y| / T) to every
   coordinate, and scale back by lambda / T.

Two rounded uploads differ by at most 2B in L1 (an integer vector), so one
release is (2B / T, 0)-DP with 2B / T <= 2C / lambda: `epsilon_per_release`
stays an upper bound, for the mechanism that runs. T is the power of two at
which the clip loses at most a thousandth (`grid_steps`). The simulator's
random bytes come from a seeded generator (reproducible; an edge client
would read the OS's CSPRNG, `dpmech.random_source.SystemBytes`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpmech.exact_sampler import discrete_laplace
from dpmech.random_source import ByteSource, GeneratorBytes

MAX_GRID_LOG2 = 40  # T = 2^40 at most: rounded values and noise stay far inside int64


def clip_l1(rows: torch.Tensor, *, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale every row of (B, D) to L1 norm at most `clip`; returns (clipped copy, original L1 norms)."""
    if not clip > 0:
        raise ValueError(f"the L1 clip must be > 0, got {clip}")
    if rows.dim() != 2:
        raise ValueError(f"expected (B, D) rows, got shape {tuple(rows.shape)}")
    norms = rows.abs().sum(1)
    scale = torch.clamp(clip / norms.clamp(min=1e-12), max=1.0)
    return rows * scale.unsqueeze(1), norms


def grid_steps(*, clip: float, scale: float, dim: int) -> int:
    """T: the smallest power of two with sqrt(dim) scale / T <= clip / 1000
    (the clip lost to the rounding's slack), at least 2^10."""
    if not clip > 0 or not scale > 0 or dim < 1:
        raise ValueError("clip and scale must be > 0 and dim >= 1")
    need = 1000 * math.sqrt(dim) * scale / clip
    k = max(10, math.ceil(math.log2(need)))
    if k > MAX_GRID_LOG2:
        raise ValueError(f"the L1 clip {clip:g} is too small against the scale {scale:g} for {dim} coordinates")
    return 1 << k


def _source(generator: torch.Generator) -> ByteSource:
    """Random bytes for the exact sampler, seeded from the torch generator (reproducible)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    return GeneratorBytes(np.random.default_rng(seed))


def laplace_noise(shape: tuple[int, ...], *, scale: float, generator: torch.Generator,
                  steps: int = 1 << 20) -> torch.Tensor:
    """float32 draws of the discrete Laplace on the grid scale / steps with
    P[x] proportional to exp(-|x| / scale), sampled exactly (no float inside
    the sampler): the Laplace(0, scale) law, on a grid."""
    if not scale > 0:
        raise ValueError(f"the Laplace scale must be > 0, got {scale}")
    n = math.prod(shape)
    y = discrete_laplace(n, steps, _source(generator))
    return torch.from_numpy(y.astype(np.float64) * (scale / steps)).reshape(shape).to(torch.float32)


def add_laplace(rows: torch.Tensor, *, scale: float, generator: torch.Generator) -> torch.Tensor:
    """rows + the discrete Laplace of `laplace_noise`, element-wise (a new tensor)."""
    return rows + laplace_noise(tuple(rows.shape), scale=scale, generator=generator).to(rows.device)


def _round_within_l1(z: np.ndarray, bound: int, rng: np.random.Generator, max_tries: int = 10_000) -> np.ndarray:
    """Each row of z rounded randomly (unbiased), again until its L1 norm is <= bound."""
    out = np.empty(z.shape, dtype=np.int64)
    for i, row in enumerate(z):
        low = np.floor(row)
        for _ in range(max_tries):
            r = (low + (rng.random(row.shape) < row - low)).astype(np.int64)
            if int(np.abs(r).sum()) <= bound:
                out[i] = r
                break
        else:
            raise RuntimeError(f"row {i} stayed above the L1 bound after {max_tries} roundings")
    return out


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
    """The exact release of the module doc for each row of (B, D): clip in L1,
    round on the grid scale / T under the L1 bound, add the discrete Laplace
    sampled exactly. Returns (noisy rows, original L1 norms); one release is
    (2C / scale, 0)-DP at most (`epsilon_per_release`)."""
    if rows.dim() != 2:
        raise ValueError(f"expected (B, D) rows, got shape {tuple(rows.shape)}")
    dim = int(rows.shape[1])
    steps = grid_steps(clip=clip, scale=scale, dim=dim)
    norms = rows.abs().sum(1)
    tighter = clip - math.sqrt(dim) * scale / steps
    clipped = clip_l1(rows.detach().to("cpu", torch.float64), clip=tighter)[0].numpy()
    finite = np.isfinite(clipped).all(axis=1)  # a diverged row (inf or NaN) is released as NaN, as it was
    source = _source(generator)
    rng = np.random.default_rng(source.take(16).view(np.uint64).tolist())
    bound = math.floor(clip * steps / scale)
    rounded = _round_within_l1(clipped[finite] * (steps / scale), bound, rng)
    noisy = np.full(clipped.shape, np.nan)
    noisy[finite] = (rounded + discrete_laplace(rounded.size, steps, source).reshape(rounded.shape)) * (scale / steps)
    return torch.from_numpy(noisy).to(rows.dtype).to(rows.device), norms
