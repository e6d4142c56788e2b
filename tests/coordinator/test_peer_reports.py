"""The cross-round reputation rule for share-decryption reports."""

from __future__ import annotations

import pytest

from coordinator.peer_reports import PeerReports, ReportPolicy

POLICY = ReportPolicy(reporters=3, rounds=2, window=5, quarantine_rounds=4)


def test_one_liar_never_excludes_anyone_beyond_its_round() -> None:
    ledger = PeerReports(POLICY)
    for rnd in range(1, 30):
        assert ledger.record(rnd, {66: [1, 2, 3, 4, 5]}) == []
        assert ledger.quarantined(rnd + 1) == frozenset()


def test_three_reporters_in_one_round_are_not_enough() -> None:
    ledger = PeerReports(POLICY)
    assert ledger.record(7, {1: [9], 2: [9], 3: [9]}) == []
    assert ledger.quarantined(8) == frozenset()


def test_three_reporters_across_two_rounds_quarantine_for_the_set_rounds() -> None:
    ledger = PeerReports(POLICY)
    ledger.record(1, {1: [9], 2: [9]})
    assert ledger.record(2, {3: [9]}) == [9]
    assert all(ledger.quarantined(r) == {9} for r in range(3, 7))
    assert ledger.quarantined(7) == frozenset()
    # forgotten once quarantined: one new report does not start another
    assert ledger.record(8, {4: [9]}) == []


def test_reports_older_than_the_window_do_not_count() -> None:
    ledger = PeerReports(POLICY)
    ledger.record(1, {1: [9], 2: [9]})
    assert ledger.record(6, {3: [9]}) == []  # round 1 is outside 2..6
    assert ledger.record(7, {4: [9], 5: [9]}) == [9]


def test_self_reports_are_ignored() -> None:
    ledger = PeerReports(POLICY)
    for rnd in range(1, 4):
        ledger.record(rnd, {9: [9], 1: [9]})
    assert ledger.quarantined(5) == frozenset()


@pytest.mark.parametrize("kw", [{"reporters": 1}, {"rounds": 0}, {"window": 1, "rounds": 2}, {"quarantine_rounds": 0}])
def test_policy_refuses_rules_that_let_one_report_exclude(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ReportPolicy(**kw)
