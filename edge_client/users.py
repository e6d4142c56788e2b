"""`--users` ranges: which of a dataset's users this process hosts.

Syntax: comma-separated items, each a user number `N` or an inclusive range
`A-B` (whitespace ignored), e.g. ``1-100,200,300-310``. User numbers are
**1-based positions in the dataset's user order**: user N is the dataset's
dense user id N-1. For MovieLens (whose raw user ids are 1..n in order) user
N is exactly the raw user id N of the data files; for `synthetic` it is the
generator's user N-1. Duplicates and overlapping ranges are refused (each
user is one device, hosted once).
"""

from __future__ import annotations

import re

_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


class UserRangeError(ValueError):
    """A `--users` value that cannot be parsed or does not fit the dataset (user-facing message)."""


def parse_user_ranges(spec: str) -> list[int]:
    """The 1-based user numbers of `spec`, in the order given (no duplicates)."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserRangeError("--users is empty; give user numbers like 1-100,200,300-310")
    out: list[int] = []
    seen: set[int] = set()
    for raw in spec.split(","):
        item = raw.replace(" ", "").replace("\t", "")
        m = _ITEM.match(item)
        if not m:
            raise UserRangeError(
                f"bad item {raw.strip()!r} in --users {spec!r}: expected N or A-B with positive integers"
            )
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if a < 1:
            raise UserRangeError(f"user numbers are 1-based: {raw.strip()!r} in --users {spec!r}")
        if b < a:
            raise UserRangeError(f"descending range {raw.strip()!r} in --users {spec!r}")
        if b - a >= 10_000_000:
            raise UserRangeError(f"range {raw.strip()!r} is too large")
        for u in range(a, b + 1):
            if u in seen:
                raise UserRangeError(f"user {u} is listed twice in --users {spec!r}")
            seen.add(u)
            out.append(u)
    return out


def check_users_fit(users: list[int], n_users: int, dataset: str) -> None:
    """UserRangeError if a user number is beyond the dataset's `n_users`."""
    beyond = [u for u in users if u > n_users]
    if beyond:
        shown = ", ".join(str(u) for u in beyond[:5]) + (" ..." if len(beyond) > 5 else "")
        raise UserRangeError(
            f"{len(beyond)} user(s) beyond dataset {dataset!r}, which has users 1..{n_users}: {shown}"
        )


def format_user_ranges(users: list[int]) -> str:
    """The compact form of a user list (sorted): [1,2,3,7] -> '1-3,7'."""
    s = sorted(users)
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)
