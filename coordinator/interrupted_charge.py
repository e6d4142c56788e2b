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

A live coordinator charges its own aborting round the same way
(`abort_charge`, written with the abort by `RoundOutcomes.save_abort`) when
it reconstructed the sum but did not commit it (a rollback during the
round, a store failure at commit), or when it holds at least t unmasking
answers (a round cancelled or stopped during unmasking).

A round whose groups replicas ran (a round with a plan, the store's
group_interface) is charged by its group rows rather than its record: when
any group may have released its sum (in `unmasking` or `done`, or lost in
`unmasking`), group by group at the noise its own members split
(`InterruptedCharge.group_charges`).

Not charged: a round whose record never reached `unmasking` (nobody was
asked), and a round that aborts at unmasking with fewer than t answers (no
sum can be reconstructed from fewer than t shares).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from coordinator.grouped_rounds import AnyRound, Grouped
from coordinator.round_report import PrivacyLedger
from coordinator.store import GroupCharge, GroupRow, PrivacyEntry, RoundRecord, RoundState

if TYPE_CHECKING:
    from dpmech.mechanism import MechanismConfig

#: The stage whose survivors' inputs are in the sum (secagg's U3).
COUNTED_AT = "masked_input"


def asked_to_unmask(found: RoundRecord) -> bool:
    """Whether the round, as its dead coordinator left it, had sent its unmasking requests."""
    return found.state is RoundState.UNMASKING


def counted_devices(found: RoundRecord) -> int:
    """The devices whose inputs (and noise) the round's sum holds (see the
    module doc). In a round in groups, the groups' own counts are not in the
    record: the smallest group threshold (`metrics["threshold"]`), below
    which no group's sum could be reconstructed."""
    listed = found.survivors.get(COUNTED_AT)
    if listed and not in_groups(found):
        return len(listed)
    threshold = found.metrics.get("threshold")
    return max(1, int(threshold)) if threshold else 1


def cohort_size(found: RoundRecord) -> int:
    """The devices the round selected."""
    cohort = found.metrics.get("cohort")
    if cohort:
        return int(cohort)
    return len(found.survivors.get("selected", ())) or found.cohort_size


def in_groups(found: RoundRecord) -> bool:
    """Whether the round ran in groups (D99; its record says how many)."""
    return found.metrics.get("groups", 1) > 1


def noise_shares(found: RoundRecord) -> int:
    """The devices one released sum's distributed noise was split among,
    as the charge prices it: the cohort, or in a round in groups its
    largest group (the fewest shares' noise a device added: no group's sum
    carried less than the price says)."""
    if in_groups(found) and found.metrics.get("group_size_max"):
        return int(found.metrics["group_size_max"])
    return cohort_size(found)


def learnable_count(*, reconstructed: int | None, unmasking_answers: int, threshold: int,
                    masked_input: int) -> int | None:
    """A live coordinator's aborting round: how many devices' noise is in a
    sum it may have learned, or None when it cannot have learned one.

    `reconstructed`: the devices counted when it reconstructed the sum (the
    round then failed to commit: a rollback during the round, a store
    failure), None when it did not. Without a reconstruction, at least t
    unmasking answers (`unmasking_answers` >= `threshold`; a round cancelled
    or stopped during unmasking) still give it enough shares to reconstruct:
    the sum of the `masked_input` counted devices (at least 1). Fewer than t
    answers: no sum can be reconstructed, nothing is charged (D85)."""
    if reconstructed is not None:
        return max(1, reconstructed)
    if unmasking_answers >= threshold:
        return max(1, masked_input)
    return None


def abort_charge(ledger: PrivacyLedger, r: AnyRound, history: Sequence[PrivacyEntry]) -> PrivacyEntry | None:
    """The ledger entry of live round `r`, which ends aborted, when its sum
    may have been learned (`learnable_count`), priced as a committed round's
    with the noise of the devices it counted; `history`: the ledger so far.
    A round in groups (D99) is priced group by group, each group whose sum
    may have been learned at the noise its own devices split, the round at
    the least of them. None without DP or when nothing was learnable.
    Blocking (the accountant)."""
    if not ledger.enabled:
        return None
    groups: list[GroupCharge] = []
    for m in r.machines if isinstance(r, Grouped) else (r,):
        survivors = m.survivors()
        counted = learnable_count(
            reconstructed=len(m.result.counted) if m.result is not None else None,
            unmasking_answers=len(survivors.get(RoundState.UNMASKING.value, ())),
            threshold=m.config.threshold, masked_input=len(survivors.get(COUNTED_AT, ())))
        if counted is not None:
            z = ledger.round_multiplier(cohort=len(m.cohort), counted=counted, mechanism=m.mechanism)
            groups.append(GroupCharge(size=len(m.cohort), counted=counted, noise_multiplier=z))
    if not groups:
        return None
    z = min(g.noise_multiplier for g in groups)
    return ledger.charge(r.number, z, history, tuple(groups) if isinstance(r, Grouped) else ())


class InterruptedCharge:
    """The store's charge rule (`Store.mark_interrupted_rounds_aborted`):
    pure apart from the accountant, so a retried transaction may run it
    again. `mechanism_for(cohort, shares)`: the round's discrete Gaussian
    (None without it), as the round loop plans it, with the distributed
    noise split among `shares` devices.

    The rule runs inside the store's write transaction, which holds the
    leader lease's row: a slow rule would delay the lease's renewal. So
    `warm` prices the rounds before the transaction (the accountant's and
    the mechanism's imports, the calibration of each cohort size), and the
    rule reuses those multipliers."""

    def __init__(self, ledger: PrivacyLedger, mechanism_for: Callable[[int, int], MechanismConfig | None]) -> None:
        self._ledger = ledger
        self._mechanism_for = mechanism_for
        self._multipliers: dict[tuple[int, int, int], float] = {}
        #: round number -> the entry charged (the last call's, for the log line)
        self.charged: dict[int, PrivacyEntry] = {}

    def multiplier(self, found: RoundRecord) -> float:
        """The noise multiplier the round is charged at (memoized per cohort and count)."""
        key = cohort_size(found), noise_shares(found), counted_devices(found)
        if key not in self._multipliers:
            cohort, shares, counted = key
            self._multipliers[key] = self._ledger.round_multiplier(cohort=shares, counted=counted,
                                                                   mechanism=self._mechanism_for(cohort, shares))
        return self._multipliers[key]

    def warm(self, records: Iterable[RoundRecord], ledger: Sequence[PrivacyEntry]) -> None:
        """Price the chargeable rounds among `records` ahead of the
        transaction (blocking; an optimisation only)."""
        for found in records:
            if self._ledger.enabled and asked_to_unmask(found):
                self._ledger.charge(found.number, self.multiplier(found), ledger)

    def group_charges(self, groups: Sequence[GroupRow]) -> tuple[GroupCharge, ...]:
        """A round run in groups by replicas (its group rows, as sealed):
        one charge per group whose devices may have been asked to unmask
        (`GroupRow.may_have_asked`: in `unmasking` or `done`, lost in
        `unmasking`, or failed after its asked devices were saved), priced at the noise its own members split and the
        devices its sum counted: the `counted` of a done group, else the
        group's masked-input survivors as saved, else 1 (fewer never price
        lower)."""
        cohort = sum(len(g.assignment.members) for g in groups)
        out = []
        for g in groups:
            if not g.may_have_asked:
                continue
            size = len(g.assignment.members)
            counted = len(g.counted or g.survivors.get(COUNTED_AT, ())) or 1
            key = cohort, size, counted
            if key not in self._multipliers:
                self._multipliers[key] = self._ledger.round_multiplier(
                    cohort=size, counted=counted, mechanism=self._mechanism_for(cohort, size))
            out.append(GroupCharge(size=size, counted=counted, noise_multiplier=self._multipliers[key]))
        return tuple(out)

    def __call__(self, found: RoundRecord, ledger: Sequence[PrivacyEntry],
                 groups: Sequence[GroupRow] = ()) -> PrivacyEntry | None:
        """The charge of `found` (see the module doc). With `groups` (a
        round whose groups replicas ran), the groups decide: charged when
        any group may have released its sum (`group_charges`), at the least
        noise of those groups; without, the record decides as always."""
        if not self._ledger.enabled:
            return None
        if groups:
            charges = self.group_charges(groups)
            if not charges:
                return None
            z = min(c.noise_multiplier for c in charges)
            entry = self._ledger.charge(found.number, z, ledger, charges)
        elif asked_to_unmask(found):
            entry = self._ledger.charge(found.number, self.multiplier(found), ledger)
        else:
            return None
        if entry is not None:
            self.charged[found.number] = entry
        return entry


__all__ = ["COUNTED_AT", "InterruptedCharge", "abort_charge", "asked_to_unmask", "cohort_size", "counted_devices",
           "in_groups", "learnable_count", "noise_shares"]
