"""The cross-round rule for share-decryption reports (coordinator/peer_reports.py, D37)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from coordinator.peer_reports import (
    ReportPolicy,
    countable_reports,
    credential,
    decide_quarantines,
    forgettable,
    in_force,
    releases_for_minimum,
    start_quarantines,
)
from coordinator.store.report_records import Quarantine, ShareReport

POLICY = ReportPolicy(reporters=3, rounds=2, window=5, window_s=600.0, quarantine_rounds=4, quarantine_s=60.0,
                      quota=2)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cred(device: int) -> str:
    """Devices 1..9 have their own credential; 100+k belong to credential 'c<k // 10>'."""
    return f"c{device // 10}" if device >= 100 else f"device:{device}"


class Ledger:
    """The rule driven like the coordinator drives it, on plain lists (the store's role)."""

    def __init__(self, policy: ReportPolicy = POLICY) -> None:
        self.policy = policy
        self.reports: list[ShareReport] = []
        self.quarantines: list[Quarantine] = []

    def record(self, rnd: int, reports: Mapping[int, Iterable[int]], *, at: datetime = T0,
               survivors: Iterable[int] | None = None) -> list[int]:
        kept = set(reports) if survivors is None else set(survivors)
        self.reports += countable_reports(rnd, at, reports, survivors=kept, credential_of=cred)
        started = start_quarantines(self.policy, self.reports, self.quarantines, rnd, at)
        for i, q in enumerate(started, start=len(self.quarantines) + 1):
            self.quarantines.append(replace(q, id=i))
        gone = {q.device_id for q in started}
        self.reports = [r for r in self.reports if r.reported not in gone]
        return [q.device_id for q in started]

    def quarantined(self, next_round: int, at: datetime = T0) -> set[int]:
        return {q.device_id for q in in_force(self.quarantines, next_round, at)}


def test_one_liar_never_excludes_anyone_beyond_its_round() -> None:
    ledger = Ledger()
    for rnd in range(1, 30):
        assert ledger.record(rnd, {66: [1, 2, 3, 4, 5]}) == []
        assert ledger.quarantined(rnd + 1) == set()


def test_three_reporters_in_one_round_are_not_enough() -> None:
    ledger = Ledger()
    assert ledger.record(7, {1: [9], 2: [9], 3: [9]}) == []
    assert ledger.quarantined(8) == set()


def test_three_credentials_across_two_rounds_quarantine_for_the_set_rounds() -> None:
    ledger = Ledger()
    ledger.record(1, {1: [9], 2: [9]})
    assert ledger.record(2, {3: [9]}) == [9]
    assert all(ledger.quarantined(r) == {9} for r in range(3, 7))
    assert ledger.quarantined(7) == set()
    # forgotten once quarantined: one new report does not start another
    assert ledger.record(8, {4: [9]}) == []


def test_quarantine_expires_in_time_when_rounds_stall() -> None:
    ledger = Ledger()
    ledger.record(1, {1: [9], 2: [9]})
    ledger.record(2, {3: [9]})
    assert ledger.quarantined(3, T0 + timedelta(seconds=59)) == {9}
    assert ledger.quarantined(3, T0 + timedelta(seconds=60)) == set()  # still round 3: time ended it


def test_reports_older_than_the_window_in_rounds_or_time_do_not_count() -> None:
    ledger = Ledger()
    ledger.record(1, {1: [9], 2: [9]})
    assert ledger.record(6, {3: [9]}) == []  # round 1 is outside 2..6
    assert ledger.record(7, {4: [9], 5: [9]}) == [9]
    ledger = Ledger()
    ledger.record(1, {1: [8], 2: [8]})
    assert ledger.record(2, {3: [8]}, at=T0 + timedelta(seconds=601)) == []  # round 1's reports are too old


def test_self_reports_and_reports_within_one_credential_are_ignored() -> None:
    ledger = Ledger()
    for rnd in range(1, 4):  # 101..103 are one credential (c10) reporting 104, also c10
        ledger.record(rnd, {9: [9], 101: [104], 102: [104], 103: [104]})
    assert ledger.quarantined(5) == set()


def test_devices_of_one_credential_are_one_reporter() -> None:
    ledger = Ledger()  # 101, 102, 103 (c10) and 111 (c11): two credentials, not four reporters
    ledger.record(1, {101: [9], 102: [9], 111: [9]})
    assert ledger.record(2, {103: [9], 111: [9]}) == []
    assert ledger.record(3, {121: [9]}) == [9]  # a third credential: now three


def test_reporters_the_share_check_removed_do_not_count() -> None:
    ledger = Ledger()
    for rnd in range(1, 5):  # three liars report everyone and are removed by the share check
        assert ledger.record(rnd, {1: [4, 5, 6], 2: [4, 5, 6], 3: [4, 5, 6]}, survivors=[4, 5, 6]) == []
    assert ledger.quarantined(6) == set()


def test_a_coalition_starts_at_most_its_bound_per_window() -> None:
    # k = 3 credentials (c10, c11, c12) report 10 honest devices every round
    coalition = {100: list(range(1, 10)), 110: list(range(1, 10)), 120: list(range(1, 10))}
    ledger = Ledger()
    started: list[int] = []
    for rnd in range(1, 11):
        started += ledger.record(rnd, coalition, at=T0 + timedelta(seconds=rnd))
    assert len(started) == POLICY.bound(3) == 2  # floor(3 * 2 / 3)
    # the window passes: the quota is back
    later = T0 + timedelta(seconds=POLICY.window_s + 20)
    more = ledger.record(20, coalition, at=later) + ledger.record(21, coalition, at=later)
    assert len(more) == 2
    assert POLICY.bound(2) == 0 and ReportPolicy(quota=3).bound(4) == 4


def test_the_quota_refusal_names_the_device_and_who_had_quota_left() -> None:
    # k = 3 credentials accuse 4 honest devices: two quarantines spend the quota, the other two are refused
    coalition = {100: [1, 2, 3, 4], 110: [1, 2, 3, 4], 120: [1, 2, 3, 4]}
    ledger = Ledger()
    ledger.record(1, coalition, at=T0)
    assert ledger.record(2, coalition, at=T0) == [1, 2]
    decision = decide_quarantines(POLICY, ledger.reports, ledger.quarantines, 2, T0)
    assert decision.started == []
    assert [(r.device_id, r.reporters, r.with_quota) for r in decision.refused] == [
        (3, ("c10", "c11", "c12"), ()), (4, ("c10", "c11", "c12"), ())]
    # too few reporters is not a quota refusal
    thin = [r for rnd in (3, 4) for r in countable_reports(rnd, T0, {100: [5], 110: [5]}, survivors=[100, 110],
                                                          credential_of=cred)]
    assert decide_quarantines(POLICY, thin, [], 4, T0) == decide_quarantines(POLICY, [], [], 4, T0)


def test_a_garbage_sealer_is_still_quarantined_by_honest_credentials() -> None:
    ledger = Ledger()  # honest devices of three credentials all fail to open 9's shares
    ledger.record(1, {101: [9], 111: [9], 121: [9]}, survivors=[101, 111, 121])
    assert ledger.record(2, {102: [9], 112: [9]}, survivors=[102, 112]) == [9]


def test_release_for_the_minimum_takes_the_earliest_expiry_first() -> None:
    def q(i: int, device: int, seconds: int) -> Quarantine:
        return Quarantine(id=i, device_id=device, started_round=1, started_at=T0, until_round=10,
                          until=T0 + timedelta(seconds=seconds))

    held = [q(1, 5, 30), q(2, 6, 10), q(3, 7, 20), q(4, 99, 1)]  # 99 is not eligible anyway
    assert releases_for_minimum(held, [1, 2, 3, 5, 6, 7], 3) == []
    assert [r.device_id for r in releases_for_minimum(held, [1, 2, 5, 6, 7], 4)] == [6, 7]
    assert [r.device_id for r in releases_for_minimum(held, [5, 6, 7], 5)] == [6, 7, 5]


def test_released_and_stale_quarantines() -> None:
    live = Quarantine(id=1, device_id=5, started_round=1, started_at=T0, until_round=10, until=T0 + timedelta(60))
    done = Quarantine(id=2, device_id=6, started_round=1, started_at=T0, until_round=3,
                      until=T0 + timedelta(seconds=1), released_at=T0)
    assert in_force([live, done], 2, T0) == [live]
    assert forgettable(POLICY, [live, done], 2, T0 + timedelta(seconds=601)) == [2]
    assert credential(7, None) == "device:7" and credential(7, "edge-a") == "edge-a"


@pytest.mark.parametrize("kw", [{"reporters": 1}, {"rounds": 0}, {"window": 1, "rounds": 2}, {"quarantine_rounds": 0},
                                {"quota": 0}, {"window_s": 0}, {"quarantine_s": 0}])
def test_policy_refuses_rules_that_let_one_report_exclude(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ReportPolicy(**kw)
