"""The privacy charge of a round whose coordinator died after asking for
unmasking (D94).

The coordinator is the party differential privacy protects against. Once
it asked a round's devices to unmask (the round's record is saved in state
`unmasking` before any request goes out, `unmasking_guard`), the devices
answer it, and with t answers it can reconstruct the round's sum. If it
then dies (killed, host lost, deposed and fenced out), nobody can tell
whether it did: its successor marks the round aborted
(`coordinator_restart`, `recovery`) and charges it in the privacy ledger
as if the sum had been released, in the same transaction.

The charge is what the round would have cost committed (`PrivacyLedger`'s
rule, priced with the successor's DP settings): the noise that reached the
sum is that of the devices counted at masked input, as the record lists
them (`survivors["masked_input"]`); when the record does not list them, the
smallest count a commit could have had, the round's Shamir threshold
(`metrics["threshold"]`), or 1 when that is unknown too: fewer counted
devices never price a round lower. The cumulative epsilon composes it with
every entry before it, committed or charged. A round the successor's
settings cannot price (its discrete Gaussian does not fit the round's
cohort: `dp_mechanism_for` raises) stops the start-up with that error, and
the store is unchanged: no figure is written that could under-report.

Not charged: a round whose record never reached `unmasking` (nobody was
asked), and a round a live coordinator saw abort at unmasking with fewer
than t answers (no sum can be reconstructed from fewer than t shares; that
round is aborted by its own coordinator, never by `recovery`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from coordinator.round_report import PrivacyLedger
from coordinator.store import PrivacyEntry, RoundRecord, RoundState

if TYPE_CHECKING:
    from dpmech.mechanism import MechanismConfig

#: The stage whose survivors' inputs are in the sum (secagg's U3).
COUNTED_AT = "masked_input"


def asked_to_unmask(found: RoundRecord) -> bool:
    """Whether the round, as its dead coordinator left it, had sent its unmasking requests."""
    return found.state is RoundState.UNMASKING


def counted_devices(found: RoundRecord) -> int:
    """The devices whose inputs (and noise) the round's sum holds (see the module doc)."""
    listed = found.survivors.get(COUNTED_AT)
    if listed:
        return len(listed)
    threshold = found.metrics.get("threshold")
    return max(1, int(threshold)) if threshold else 1


def cohort_size(found: RoundRecord) -> int:
    """The devices the round selected."""
    cohort = found.metrics.get("cohort")
    if cohort:
        return int(cohort)
    return len(found.survivors.get("selected", ())) or found.cohort_size


class InterruptedCharge:
    """The store's charge rule (`Store.mark_interrupted_rounds_aborted`):
    pure apart from the accountant, so a retried transaction may run it
    again. `mechanism_for(cohort)`: the round's discrete Gaussian (None
    without it), as the round loop plans it.

    The rule runs inside the store's write transaction, which holds the
    leader lease's row: a slow rule would delay the lease's renewal. So
    `warm` prices the rounds before the transaction (the accountant's and
    the mechanism's imports, the calibration of each cohort size), and the
    rule reuses those multipliers."""

    def __init__(self, ledger: PrivacyLedger, mechanism_for: Callable[[int], MechanismConfig | None]) -> None:
        self._ledger = ledger
        self._mechanism_for = mechanism_for
        self._multipliers: dict[tuple[int, int], float] = {}
        #: round number -> the entry charged (the last call's, for the log line)
        self.charged: dict[int, PrivacyEntry] = {}

    def multiplier(self, found: RoundRecord) -> float:
        """The noise multiplier the round is charged at (memoized per cohort and count)."""
        key = cohort_size(found), counted_devices(found)
        if key not in self._multipliers:
            cohort, counted = key
            self._multipliers[key] = self._ledger.round_multiplier(cohort=cohort, counted=counted,
                                                                   mechanism=self._mechanism_for(cohort))
        return self._multipliers[key]

    def warm(self, records: Iterable[RoundRecord], ledger: Sequence[PrivacyEntry]) -> None:
        """Price the chargeable rounds among `records` ahead of the
        transaction (blocking; an optimisation only)."""
        for found in records:
            if self._ledger.enabled and asked_to_unmask(found):
                self._ledger.charge(found.number, self.multiplier(found), ledger)

    def __call__(self, found: RoundRecord, ledger: Sequence[PrivacyEntry]) -> PrivacyEntry | None:
        if not self._ledger.enabled or not asked_to_unmask(found):
            return None
        entry = self._ledger.charge(found.number, self.multiplier(found), ledger)
        if entry is not None:
            self.charged[found.number] = entry
        return entry


__all__ = ["COUNTED_AT", "InterruptedCharge", "asked_to_unmask", "cohort_size", "counted_devices"]
