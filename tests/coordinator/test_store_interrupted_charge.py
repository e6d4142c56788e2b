"""The Store contract of `mark_interrupted_rounds_aborted(charge=...)` (D94):
a round a dead coordinator left after asking for unmasking is charged in
the privacy ledger in the same transaction that aborts it. Run against
every backend: memory, sqlite, postgresql (the `backend` fixture), with
rule stubs, and with the real rule (`InterruptedCharge`) for a round whose
groups replicas ran."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.store import (
    COORDINATOR_RESTART,
    FencedOut,
    GroupRow,
    InvalidRecordError,
    NewModelVersion,
    PrivacyEntry,
    RoundRecord,
    RoundState,
    open_store,
)

Backend = Any  # the `backend` fixture of conftest.py

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def record(number: int, state: RoundState, **kw: Any) -> RoundRecord:
    return RoundRecord(number=number, state=state, started_at=T0 + timedelta(minutes=number), cohort_size=4, **kw)


def entry(number: int, eps: float, cumulative: float) -> PrivacyEntry:
    return PrivacyEntry(round_number=number, epsilon=eps, delta=1e-5, noise_multiplier=1.5, sampling_rate=1.0,
                        cumulative_epsilon=cumulative)


def version(blob: bytes = b"p") -> NewModelVersion:
    return NewModelVersion(model_name="m", parameters=blob)


class SumRule:
    """Charges a round found in UNMASKING 0.5 (cumulative: the basic sum of
    the ledger so far plus 0.5); records what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[RoundRecord, list[int], float]] = []

    def __call__(self, found: RoundRecord, ledger: Sequence[PrivacyEntry],
                 groups: Sequence[GroupRow] = ()) -> PrivacyEntry | None:
        assert list(groups) == []  # rounds without a plan have no group rows
        self.seen.append((found, [e.round_number for e in ledger], sum(e.epsilon for e in ledger)))
        if found.state is not RoundState.UNMASKING:
            return None
        return entry(found.number, 0.5, sum(e.epsilon for e in ledger) + 0.5)


def setup_rounds(s: Any) -> None:
    s.commit_round(record(1, RoundState.COMMITTED, ended_at=T0), version(), entry(1, 0.25, 0.25))
    s.save_round_progress(record(2, RoundState.UNMASKING, survivors={"masked_input": [1, 2, 3]}))
    s.save_round_progress(record(3, RoundState.MASKED_INPUT))
    s.save_round_progress(record(4, RoundState.UNMASKING, survivors={"masked_input": [1, 2]}))


def test_interrupted_rounds_are_charged_with_their_abort(backend: Backend) -> None:
    s = backend.store
    setup_rounds(s)
    if backend.url is not None:  # a successor opens the same database
        s.close()
        s = backend.store = open_store(backend.url)
    rule = SumRule()
    at = T0 + timedelta(hours=1)
    assert s.mark_interrupted_rounds_aborted(at=at, charge=rule) == [2, 3, 4]
    # the rule saw each round as found, and the ledger including what this call charged before it
    last = {found.number: (found.state, rounds, total) for found, rounds, total in rule.seen}
    assert last == {2: (RoundState.UNMASKING, [1], 0.25), 3: (RoundState.MASKED_INPUT, [1, 2], 0.75),
                    4: (RoundState.UNMASKING, [1, 2], 0.75)}
    assert s.privacy_ledger() == [entry(1, 0.25, 0.25), entry(2, 0.5, 0.75), entry(4, 0.5, 1.25)]
    assert s.privacy_summary().cumulative_epsilon == pytest.approx(1.25)
    for n in (2, 3, 4):
        r = s.get_round(n)
        assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == COORDINATOR_RESTART
        assert r.ended_at == at
    assert s.mark_interrupted_rounds_aborted(charge=rule) == []  # terminal rounds are never charged again


@pytest.mark.parametrize("bad", ["raises", "other round"])
def test_a_refused_charge_leaves_the_store_unchanged(backend: Backend, bad: str) -> None:
    s = backend.store
    setup_rounds(s)
    before = ([s.get_round(n) for n in (1, 2, 3, 4)], s.privacy_ledger())

    def rule(found: RoundRecord, ledger: Sequence[PrivacyEntry], groups: Sequence[GroupRow]) -> PrivacyEntry | None:
        if found.number < 4:
            return SumRule()(found, ledger)
        if bad == "raises":
            raise RuntimeError("cannot price the round")
        return entry(2, 0.5, 9.0)  # round 2's (charged by this call already)

    with pytest.raises({"raises": RuntimeError, "other round": InvalidRecordError}[bad]):
        s.mark_interrupted_rounds_aborted(charge=rule)
    assert ([s.get_round(n) for n in (1, 2, 3, 4)], s.privacy_ledger()) == before


def test_a_deposed_leader_charges_nothing_and_aborts_nothing(backend: Backend) -> None:
    s = backend.store
    setup_rounds(s)
    a = s.acquire_lease("replica-a", 30.0)
    assert a is not None
    s.release_lease(a)
    b = s.acquire_lease("replica-b", 30.0)
    assert b is not None
    with pytest.raises(FencedOut):
        s.mark_interrupted_rounds_aborted(charge=SumRule(), fence=a)
    assert s.get_round(2) is not None and s.get_round(2).state is RoundState.UNMASKING
    assert [e.round_number for e in s.privacy_ledger()] == [1]
    s.fence_writes(lambda: b)  # the default fence of a leading replica applies as to a commit
    assert s.mark_interrupted_rounds_aborted(charge=SumRule()) == [2, 3, 4]
    assert [e.round_number for e in s.privacy_ledger()] == [1, 2, 4]


def test_a_live_abort_is_charged_in_its_own_transaction(backend: Backend) -> None:
    """`abort_round(privacy_entry=...)`: a round whose sum its live coordinator
    may have learned (D94) is aborted and charged at once; a second entry
    for the round, or one for another round, is refused and writes nothing."""
    from coordinator.store import ConflictError

    s = backend.store
    setup_rounds(s)
    s.abort_round(record(2, RoundState.ABORTED, ended_at=T0, abort_reason="commit_failed"), privacy_entry=entry(2, 0.5, 0.75))
    r = s.get_round(2)
    assert r is not None and r.state is RoundState.ABORTED
    assert s.privacy_ledger() == [entry(1, 0.25, 0.25), entry(2, 0.5, 0.75)]
    with pytest.raises(ConflictError):
        s.abort_round(record(2, RoundState.ABORTED, ended_at=T0, abort_reason="commit_failed"), privacy_entry=entry(2, 0.5, 0.75))
    with pytest.raises(InvalidRecordError):
        s.abort_round(record(4, RoundState.ABORTED, ended_at=T0, abort_reason="commit_failed"), privacy_entry=entry(3, 0.5, 1.25))
    r4 = s.get_round(4)
    assert r4 is not None and r4.state is RoundState.UNMASKING  # the refused write left it as it was
    s.abort_round(record(4, RoundState.ABORTED, ended_at=T0, abort_reason="commit_failed"))  # no entry: nothing charged
    assert [e.round_number for e in s.privacy_ledger()] == [1, 2]


def test_recovery_charges_a_planned_round_by_its_group_rows(backend: Backend) -> None:
    """A planned round (its groups run by replicas) is handed to the real
    charge rule (`InterruptedCharge`) with its rows as sealed: its entry
    lists exactly the groups that may have released their sums (done, and
    those the seal found in `unmasking`), each at its own figures, the
    round at the least of them; a planned round none of whose groups
    reached unmasking costs nothing whatever its record's state; a round
    without a plan is charged by its record, composed after it. The stored
    record lists every device a group may have asked in `unmasking`."""
    import dataclasses

    from test_interrupted_charge import assert_entry, charge_rule, multiplier, oracle_groups, settings
    from test_store_round_groups import Tier, assignment, encoded, plan, progress

    from coordinator.store import GroupResult, GroupState
    from models.privacy import composed_epsilon

    s = backend.store
    t = Tier(s)
    members = [(1, 2, 3), (4, 5, 6, 7), (8, 9), (10, 11), (12, 13)]

    def open_round(state: RoundState) -> int:
        n = s.next_round_number()
        groups = [assignment(n, i, (t.a, t.b)[i % 2], m) for i, m in enumerate(members)]
        s.open_planned_round(RoundRecord(number=n, state=RoundState.TRAINING, started_at=T0, cohort_size=13),
                             dataclasses.replace(plan(n, t.leader.token), cohort_size=13), groups, fence=t.leader)
        s.save_round_progress(RoundRecord(number=n, state=state, started_at=T0, cohort_size=13))
        return n

    def unmasking(n: int, i: int, asked: tuple[int, ...], masked: list[int] | None) -> None:
        member = (t.a, t.b)[i % 2]
        s.start_group(member, n, i)
        s.save_group_progress(member, progress(n, i, GroupState.UNMASKING, asked=asked,
                                               survivors={} if masked is None else {"masked_input": masked}))

    def fail(n: int, i: int) -> None:
        member = (t.a, t.b)[i % 2]
        s.start_group(member, n, i)
        s.finish_group(member, GroupResult(round_number=n, index=i, state=GroupState.FAILED, fail_reason="dropped"))

    quiet = open_round(RoundState.UNMASKING)  # its record says unmasking; no group got there
    s.start_group(t.a, quiet, 0)
    s.start_group(t.a, quiet, 2)
    fail(quiet, 3)

    n = open_round(RoundState.UNMASKING)
    unmasking(n, 0, (1, 2, 3), [1, 2, 3])  # done, 2 counted (not its 3 masked-input survivors)
    s.finish_group(t.a, GroupResult(round_number=n, index=0, state=GroupState.DONE, sum=encoded(5), counted=(1, 2),
                                    survivors={"masked_input": [1, 2, 3]}))
    unmasking(n, 1, (4, 5, 6, 7), [4, 5, 6])  # lost in unmasking by the seal: its 3 masked-input survivors
    unmasking(n, 2, (8,), None)  # lost in unmasking, nothing saved: 1
    s.start_group(t.b, n, 3)  # lost while running
    fail(n, 4)

    plain = s.next_round_number()
    s.save_round_progress(record(plain, RoundState.UNMASKING, survivors={"masked_input": [1, 2, 3]}))

    dp = settings("gaussian-float")
    rule = charge_rule(dp)
    assert s.mark_interrupted_rounds_aborted(charge=rule, fence=t.leader) == [quiet, n, plain]

    sealed = s.round_groups(n)
    assert [(g.state, g.lost_in) for g in sealed] == [
        (GroupState.DONE, None), (GroupState.LOST, GroupState.UNMASKING), (GroupState.LOST, GroupState.UNMASKING),
        (GroupState.LOST, GroupState.RUNNING), (GroupState.FAILED, None)]
    expected = oracle_groups(dp, sealed)
    assert [(g.size, g.counted) for g in expected] == [(3, 2), (4, 3), (2, 1)]
    assert oracle_groups(dp, s.round_groups(quiet)) == ()

    ledger = s.privacy_ledger()
    assert [e.round_number for e in ledger] == [n, plain]
    assert_entry(dp, ledger[0], expected, [], number=n)
    assert ledger[0] == rule.charged[n]
    # the round without a plan: its record's price (3 counted of its 4), composed after round n's entry
    z = multiplier(dp, cohort=4, counted=3)
    assert ledger[1].groups == () and ledger[1].noise_multiplier == pytest.approx(z, rel=1e-9)
    assert ledger[1].cumulative_epsilon == pytest.approx(
        composed_epsilon([(ledger[0].noise_multiplier, 1.0), (z, 1.0)], delta=dp.dp.delta), rel=1e-6)
    for number in (quiet, n, plain):
        r = s.get_round(number)
        assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == COORDINATOR_RESTART
    stored = s.get_round(n)
    assert stored is not None and stored.survivors["unmasking"] == [1, 2, 3, 4, 5, 6, 7, 8]  # not 10-13: never asked
    quiet_stored = s.get_round(quiet)
    assert quiet_stored is not None and "unmasking" not in quiet_stored.survivors
