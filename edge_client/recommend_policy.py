"""What a device lets leave it for a top-k request (pure).

A top-k request comes from the coordinator, which relays it for an admin
API caller holding a recommender token (D45). Neither of them decides what
the device discloses: the device's owner does, here, with the client's
flags (`fedmask client --max-top-k N --recommend-seen-items`); D84 says why.

- `serve`: answer top-k requests at all (`--no-serve-recommendations`
  refuses every one with DEVICE_ERROR_CODE_REFUSED).
- `max_k`: the most items one answer holds (default 100). A larger k is
  answered with `max_k` items, never refused: the caller sees fewer items
  than it asked for, as when the user has seen most of the catalogue.
- `share_seen`: whether a request may ask for the user's seen items
  (exclude_seen = false). Off by default: the difference between an answer
  with and one without them is exactly the user's rating history, which
  federated training exists to keep on the device. When it is off, such a
  request is answered with the seen items left out, and the answer says so
  (TopKResult.seen_excluded); it is not refused.

Scores never leave the device: an answer is ranked item ids (and the
dataset's ids and titles), in rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.protocol import DEFAULT_MAX_TOP_K, MAX_TOP_K_LIMIT


@dataclass(frozen=True, slots=True)
class TopKPlan:
    """What one answer holds: at most `k` items, the seen ones left out
    when `exclude_seen`."""

    k: int
    exclude_seen: bool


@dataclass(frozen=True, slots=True)
class RecommendationPolicy:
    """See the module doc."""

    serve: bool = True
    max_k: int = DEFAULT_MAX_TOP_K
    share_seen: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.max_k <= MAX_TOP_K_LIMIT:
            raise ValueError(f"--max-top-k must be in 1..{MAX_TOP_K_LIMIT}, got {self.max_k}")

    def plan(self, k: int, *, exclude_seen: bool) -> TopKPlan:
        """What this device answers to a request for `k` items (k >= 1,
        checked by the caller) with the caller's `exclude_seen`."""
        return TopKPlan(k=min(k, self.max_k), exclude_seen=exclude_seen or not self.share_seen)


__all__ = ["DEFAULT_MAX_TOP_K", "MAX_TOP_K_LIMIT", "RecommendationPolicy", "TopKPlan"]
