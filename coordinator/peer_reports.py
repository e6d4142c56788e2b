"""Share-decryption reports across rounds: who sits out, and for how long.

At the share check a device lists the peers whose relayed shares it could
not open. The coordinator cannot tell an honest report from a lie (the
pairwise key is symmetric), so within the round a report only removes the
pair (secagg/server/share_check.py). Across rounds this ledger applies one
rule, the only way a report can keep a device out of later rounds:

    A device is left out of cohort selection for `quarantine_rounds` rounds
    once, within the last `window` rounds, at least `reporters` distinct
    devices have reported it, in at least `rounds` distinct rounds.
    Its reports are then forgotten: a new quarantine needs new reports.

What it guarantees, and its limits (decision D37):
- One lying device can never keep anyone out: it needs `reporters - 1`
  accomplices that share cohorts with the victim in `rounds` rounds.
- A coalition of `reporters` enrolled devices can keep an honest device out
  for `quarantine_rounds` rounds at a time, as often as they are drawn with
  it. That costs the victim availability, never privacy or exactness, and
  revocation stays an operator's decision (fedmask devices revoke).
- A device whose shares really fail is reported by each peer it cheats;
  with a full graph that is most of the cohort, so it sits out after two
  such rounds.
- The ledger lives in memory: a coordinator restart forgets it.

Pure: no clock, no I/O; round numbers are the only time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ReportPolicy:
    """The rule's parameters (see the module doc)."""

    reporters: int = 3
    rounds: int = 2
    window: int = 20
    quarantine_rounds: int = 10

    def __post_init__(self) -> None:
        if self.reporters < 2:
            raise ValueError("reporters must be at least 2: one report never excludes beyond its round")
        if self.rounds < 1 or self.window < self.rounds or self.quarantine_rounds < 1:
            raise ValueError("need 1 <= rounds <= window and quarantine_rounds >= 1")


@dataclass(slots=True)
class PeerReports:
    """The ledger. `record` after each share check, `quarantined` before
    each selection."""

    policy: ReportPolicy = field(default_factory=ReportPolicy)
    # reported device -> {(round, reporter)}
    _reports: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    # device -> first round number it may be selected again
    _until: dict[int, int] = field(default_factory=dict)

    def record(self, round_number: int, reports: Mapping[int, Iterable[int]]) -> list[int]:
        """Take one round's reports {reporter: reported devices}; returns the
        devices this round put in quarantine (sorted)."""
        p = self.policy
        touched: set[int] = set()
        for reporter, reported in reports.items():
            for device in reported:
                if device != reporter:
                    self._reports.setdefault(device, set()).add((round_number, reporter))
                    touched.add(device)
        started = []
        oldest = round_number - p.window + 1
        for device in sorted(touched):
            recent = {(r, who) for r, who in self._reports[device] if r >= oldest}
            self._reports[device] = recent
            if len({who for _, who in recent}) >= p.reporters and len({r for r, _ in recent}) >= p.rounds:
                self._until[device] = round_number + 1 + p.quarantine_rounds
                del self._reports[device]
                started.append(device)
        return started

    def quarantined(self, next_round: int) -> frozenset[int]:
        """Devices that may not be selected for round `next_round`."""
        for device in [d for d, until in self._until.items() if until <= next_round]:
            del self._until[device]
        return frozenset(self._until)
