"""Write a synthetic population as `user,item,rating,timestamp` CSV (for benchmarks).

The population is models/data/synthetic.py's: latent factors, a log-normal
number of interactions per user, items chosen by Gumbel-top-k over affinity
plus a Zipf-like popularity (a long tail), ratings 1..5 and increasing
timestamps. It is made in blocks of users (models/data/synthetic_population.py),
so memory grows with the interactions and one block, never users x items: the
ML-20M shape (20M interactions, a 474 MB file) took 1.6 GB of memory and 6.5
minutes on two cores (docs/performance.md, "Memory and scale"). The output
depends on the flags and the seed, not on --block-users.

The default is the long-tailed population `fedmask reference` is timed on:
8,000 users x 12,000 items, ~1.06M interactions (median item 27 users, top 1%
of items 25% of interactions).

    python scripts/make_synthetic_csv.py data/synthetic-8k.csv
    python scripts/make_synthetic_csv.py data/sparse-8k.csv --preset sparse-8k
    python scripts/make_synthetic_csv.py data/synthetic-ml20m.csv --preset ml-20m

Presets (flags given after --preset override its values):
  sparse-8k: --users 8072 --items 11830 --mean-interactions 6.5 --min-interactions 3
             (63,573 interactions, 3 to 54 per user: the sparse catalogues of the FedRAP
             and PFedRec papers)
  ml-20m:    --users 138493 --items 26744 --mean-interactions 120 --min-interactions 20
             (19,902,555 interactions, 20 to 1,903 per user: MovieLens-20M's shape)

--mean-interactions is the median of the log-normal count (sigma 0.6, so its mean is
about 1.2 times larger), before the counts are rounded and clipped to
[--min-interactions, --max-interactions]. On long work a progress line per block
of users goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models.data.synthetic_population import Shape, choose_items, default_block_users, draw_latent, rate_and_time

PRESETS: dict[str, list[str]] = {
    "sparse-8k": ["--users", "8072", "--items", "11830", "--mean-interactions", "6.5", "--min-interactions", "3"],
    "ml-20m": ["--users", "138493", "--items", "26744", "--mean-interactions", "120", "--min-interactions", "20"],
}
_ROWS_PER_WRITE = 1 << 20


def population_shape(
    users: int, items: int, *, mean_interactions: float = 110.0, min_interactions: int = 10,
    max_interactions: int = 3000, popularity: float = 1.1,
) -> Shape:
    """The generator's shape for these flags (ValueError for impossible ones)."""
    return Shape(users, items, mean_interactions=mean_interactions, min_interactions=min_interactions,
                 max_interactions=max_interactions, popularity=popularity)  # fmt: skip


def write_population(
    out: Path, users: int, items: int, *, mean_interactions: float = 110.0, min_interactions: int = 10,
    max_interactions: int = 3000, popularity: float = 1.1, seed: int = 0, block_users: int | None = None,
    progress: Callable[[int, int], None] | None = None, note: Callable[[str], None] | None = None,
) -> int:
    """Write a long-tailed synthetic population to `out` as user,item,rating,timestamp CSV;
    returns its number of interactions. `progress(users_done, users)` after each block,
    `note(text)` when the ratings are made and as the rows are written."""
    shape = population_shape(users, items, mean_interactions=mean_interactions, min_interactions=min_interactions,
                             max_interactions=max_interactions, popularity=popularity)  # fmt: skip
    rng = np.random.default_rng(seed)
    lat = draw_latent(rng, shape)
    item, affinity = choose_items(rng, shape, lat, block_users=block_users, progress=progress)
    t0 = time.perf_counter()
    user, item, rating, timestamp = rate_and_time(rng, shape, lat, item, affinity)
    del affinity
    say = note or (lambda _: None)
    n = len(user)
    say(f"ratings and timestamps in {time.perf_counter() - t0:.0f} s; writing {n:,} rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="ascii") as f:
        f.write("user,item,rating,timestamp\n")
        for lo in range(0, n, _ROWS_PER_WRITE):
            hi = lo + _ROWS_PER_WRITE
            rows = np.stack([user[lo:hi], item[lo:hi], rating[lo:hi].astype(np.int64), timestamp[lo:hi]], axis=1)
            np.savetxt(f, rows, fmt="%d", delimiter=",")
            if hi < n and (hi // _ROWS_PER_WRITE) % 4 == 0:
                say(f"{hi:,}/{n:,} rows written")
    return n


def say(text: str) -> None:
    """A progress line on stderr."""
    print(f"[synthetic] {text}", file=sys.stderr, flush=True)


class BlockProgress:
    """`[synthetic] users 1,234/138,493 (0.9%), 12 s, about 1,300 s left` on stderr after each block,
    at most one line every `every` seconds (and always the last)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.t0 = time.perf_counter()
        self.last = -float("inf")

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == 0:  # the blocks start (after the two passes over the affinities)
            say(f"affinity mean and spread in {now - self.t0:.0f} s; choosing items")
            self.t0 = now
            return
        if done < total and now - self.last < self.every:
            return
        self.last = now
        spent = now - self.t0
        left = spent * (total - done) / done
        say(f"users {done:,}/{total:,} ({100 * done / total:.1f}%) chosen, {spent:.0f} s, about {left:.0f} s left")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="CSV file to write (its folder is created)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named shape (see above)")
    ap.add_argument("--users", type=int, default=8000, help="users (>= 1)")
    ap.add_argument("--items", type=int, default=12000, help="items (>= 2)")
    ap.add_argument("--mean-interactions", type=float, default=110.0,
                    help="median interactions per user, before rounding and clipping (> 0)")
    ap.add_argument("--min-interactions", type=int, default=10, help="fewest interactions of a user (>= 1)")
    ap.add_argument("--max-interactions", type=int, default=3000,
                    help="most interactions of a user (>= --min-interactions; capped at --items)")
    ap.add_argument("--popularity", type=float, default=1.1, help="Zipf-like exponent of item popularity (>= 0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every draw (>= 0)")
    ap.add_argument("--block-users", type=int, default=None,
                    help="users per block (default: about 16.8M user-item cells per block); memory only")
    ap.add_argument("--progress-every", type=float, default=5.0,
                    help="seconds between progress lines on stderr (0: one per block)")
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, a preset's first (explicit flags override it); exits with code 2 and a message for bad input."""
    ap = parser()
    args = list(sys.argv[1:] if argv is None else argv)
    first = ap.parse_args(args)
    a = ap.parse_args(PRESETS[first.preset] + args) if first.preset else first
    problems = [
        msg for bad, msg in (
            (a.users < 1, f"--users must be >= 1, not {a.users}"),
            (a.items < 2, f"--items must be >= 2, not {a.items}"),
            (not a.mean_interactions > 0, f"--mean-interactions must be > 0, not {a.mean_interactions}"),
            (a.min_interactions < 1, f"--min-interactions must be >= 1, not {a.min_interactions}"),
            (a.max_interactions < a.min_interactions,
             f"--max-interactions ({a.max_interactions}) must be >= --min-interactions ({a.min_interactions})"),
            (a.min_interactions > a.items,
             f"--min-interactions ({a.min_interactions}) cannot exceed --items ({a.items})"),
            (not a.popularity >= 0, f"--popularity must be >= 0, not {a.popularity}"),
            (a.seed < 0, f"--seed must be >= 0, not {a.seed}"),
            (a.block_users is not None and a.block_users < 1, f"--block-users must be >= 1, not {a.block_users}"),
            (a.out.is_dir(), f"{a.out} is a folder; give a file name"),
        ) if bad
    ]  # fmt: skip
    if problems:
        ap.error("; ".join(problems))
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    block = min(a.users, a.block_users or default_block_users(a.items))
    say(f"{a.users:,} users x {a.items:,} items in blocks of {block:,} users -> {a.out}")
    t0 = time.perf_counter()
    n = write_population(
        a.out, a.users, a.items, mean_interactions=a.mean_interactions, min_interactions=a.min_interactions,
        max_interactions=a.max_interactions, popularity=a.popularity, seed=a.seed, block_users=block,
        progress=BlockProgress(a.progress_every), note=say,
    )  # fmt: skip
    say(f"written in {time.perf_counter() - t0:.0f} s")
    print(f"{a.out}: {a.users} users, {a.items} items, {n} interactions")


if __name__ == "__main__":
    main()
