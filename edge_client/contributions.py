"""How often a device contributes to a secure sum (pure rule + its file).

Two sums over the same (model, task) that differ by one device reveal that
device's update to whoever sees both sums: a coordinator can run the same
model version and step with cohorts {1,2,3,4} then {1,2,3}. Each device
therefore keeps, in its private state directory, the rounds it contributed
to, and:

- contributes at most once to a given training key (`wire.round_binding.
  training_key`: model, global parameters, hyper-parameters with the
  curriculum step, DP mechanism / clip / multiplier);
- contributes to at most `max_rounds` rounds per `window_s` seconds.

"Contributing" means answering a round's unmasking request: only then can
the coordinator remove the device's masks from a sum. A round that aborts
before unmasking does not count, so a round retried after a coordinator
restart can still open. The device claims its contribution (the file is
written, atomically, 0600) BEFORE it sends its unmasking answer.

The file keeps the newest MAX_RECORDS entries (about 100 KB); a key older than
that can be contributed to again, which takes a coordinator MAX_RECORDS
rounds with this device first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_client.state import StateCorruptError, atomic_write

MAX_RECORDS = 1024
FILE_NAME = "contributions.json"


@dataclass(frozen=True)
class ContributionRule:
    """At most `max_rounds` contributions per `window_s` seconds (0: no cap),
    and one per training key. The default, 600 an hour, is one round every 6 s
    on average, with bursts: above the demo's and the benchmarks' cadence
    (docs/decisions.md D85)."""

    max_rounds: int = 600
    window_s: float = 3600.0
    #: False only for tests of the round mechanics that repeat one task.
    once_per_key: bool = True

    def __post_init__(self) -> None:
        if self.max_rounds < 0 or not self.window_s > 0:
            raise ValueError("--max-rounds-per-hour must be >= 0")

    def refusal(self, records: Sequence[tuple[str, float]], key: bytes, now: float) -> str | None:
        """Why a device with these records will not contribute to `key` now, or None."""
        if self.once_per_key and any(k == key.hex() for k, _ in records):
            return "this device already contributed to a round on this model and task"
        if self.max_rounds:
            recent = sum(1 for _, t in records if now - self.window_s < t <= now)
            if recent >= self.max_rounds:
                return (f"this device contributed to {recent} rounds in the last {self.window_s:g}s, "
                        f"its maximum")
        return None


def read_records(path: Path) -> list[tuple[str, float]]:
    """The (training key hex, unix time) records; [] when there is no file."""
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateCorruptError(path, f"invalid JSON ({e})") from None
    try:
        return [(str(k), float(t)) for k, t in obj["contributions"]]
    except (KeyError, TypeError, ValueError):
        raise StateCorruptError(path, "expected {'contributions': [[key, time], ...]}") from None


class Contributions:
    """One device's contribution record (its state dir's contributions.json)."""

    def __init__(self, folder: Path, rule: ContributionRule) -> None:
        self.path = folder / FILE_NAME
        self.rule = rule

    def refusal(self, key: bytes, now: float) -> str | None:
        """Why the device will not contribute to `key` now, or None (an
        unreadable record refuses: the device cannot know it is safe)."""
        try:
            return self.rule.refusal(read_records(self.path), key, now)
        except StateCorruptError as e:
            return f"unreadable contribution record ({e.problem})"

    def claim(self, key: bytes, now: float) -> str | None:
        """Record a contribution to `key` at `now` (durable when this returns
        None); otherwise why not, and nothing is recorded."""
        why = self.refusal(key, now)
        if why is not None:
            return why
        records = [*read_records(self.path), (key.hex(), now)][-MAX_RECORDS:]
        atomic_write(self.path, json.dumps({"contributions": records}).encode(), mode=0o600)
        return None


__all__ = ["FILE_NAME", "MAX_RECORDS", "ContributionRule", "Contributions", "read_records"]
