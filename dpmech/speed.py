"""`python -m dpmech.speed`: how long the exact sampler takes for one device's noise.

Prints the median (and min, max) wall time of drawing `--dim` coordinates of
N_Z(0, sigma^2) with `dpmech.exact_sampler` from the operating system's
CSPRNG, over `--runs` runs after one warm-up, on one thread (the sampler
is single-threaded numpy); then the same for a device's whole `encode`
(clip, rotate, scale, round, noise, wrap) of a `--update-dim` update. A
benchmark, not a test: the figure depends on the machine and what else runs
on it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from dpmech.exact_sampler import check_variance, discrete_gaussian
from dpmech.mechanism import MechanismConfig, encode
from dpmech.random_source import SystemBytes


def _timed(run: Callable[[], object], runs: int) -> str:
    run()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(1000 * (time.perf_counter() - start))
    return f"median {statistics.median(times):6.1f} ms  (min {min(times):.1f}, max {max(times):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpmech.speed",
        description="Time the exact discrete Gaussian sampler for one device's noise vector "
                    "(CSPRNG, integer arithmetic). Prints the median of several runs in ms.")
    parser.add_argument("--dim", type=int, default=65_536, help="coordinates per draw (default 65536 = 2^16)")
    parser.add_argument("--sigma2", type=str, nargs="+", default=["4", "1000000", "100000000"],
                        help="noise variances, exact fractions such as 7/3 (default: 4 1e6 1e8)")
    parser.add_argument("--runs", type=int, default=11, help="timed runs per variance (default 11)")
    parser.add_argument("--update-dim", type=int, default=53_824,
                        help="also time a device's whole encode of an update this long, with the first "
                             "variance (default 53824, FedRAP on ml-100k; 0 skips it)")
    args = parser.parse_args(argv)
    if args.dim < 1 or args.runs < 1 or args.update_dim < 0:
        parser.error("--dim and --runs must be >= 1, --update-dim >= 0")
    try:
        variances = [Fraction(v) for v in args.sigma2]
        for v in variances:
            check_variance(v)
    except (ValueError, ZeroDivisionError) as exc:
        parser.error(str(exc))
    source = SystemBytes()
    print(f"exact discrete Gaussian, d = {args.dim}, {args.runs} runs after a warm-up; "
          f"python {platform.python_version()} on {platform.machine()}")
    for v in variances:
        print(f"sigma^2 = {str(v):>10}: " + _timed(lambda: discrete_gaussian(args.dim, v, source), args.runs),
              flush=True)
    if args.update_dim:
        try:
            config = MechanismConfig(dim=args.update_dim, clip=1.0, scale=2.0 ** 12, sigma2=variances[0], bits=32,
                                     devices=100)
        except ValueError as exc:
            parser.error(f"cannot time encode with sigma^2 = {variances[0]}: {exc}")
        rng = np.random.default_rng(0)
        update = rng.normal(size=args.update_dim)
        timing = _timed(lambda: encode(update, config, b"speed", rng, noise=source), args.runs)
        print(f"encode, dim {args.update_dim} -> {config.padded_dim}, sigma^2 = {variances[0]}: {timing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
