"""Pure history helpers over an in-memory store filled through the store
API: the incremental round counter and the cursors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from admin_harness import T0, fill_store

from admin.history import BadCursor, RoundCounter, cursor_pattern, decode_cursor, encode_cursor
from coordinator.store import InMemoryStore, Page, RoundRecord, RoundState


class CountingStore(InMemoryStore):
    """Records the `before` of every list_rounds call."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int | None] = []

    def list_rounds(self, *, limit: int = 50, before: int | None = None) -> Page[RoundRecord]:
        self.reads.append(before)
        return super().list_rounds(limit=limit, before=before)


def test_round_counter_reads_only_unsettled_rounds_and_stays_exact() -> None:
    store = CountingStore()
    filled = fill_store(store)
    counter = RoundCounter(page=2)
    first = counter.counts(store)
    assert len(store.reads) == 4  # 8 rounds, 2 a page
    assert first == {"committed": len(filled.committed), "aborted": len(filled.aborted), "running": 1}

    store.reads.clear()
    # the running round ends, and a new one is aborted
    running = store.get_round(filled.running)
    assert running is not None
    store.abort_round(RoundRecord(number=running.number, state=RoundState.ABORTED, abort_reason="cancelled",
                                  started_at=running.started_at, ended_at=running.started_at + timedelta(seconds=1),
                                  cohort_size=10))
    n = store.next_round_number()
    store.abort_round(RoundRecord(number=n, state=RoundState.ABORTED, abort_reason="cancelled",
                                  started_at=T0 + timedelta(hours=3), cohort_size=10))
    again = counter.counts(store)
    assert again == {"committed": len(filled.committed), "aborted": len(filled.aborted) + 2, "running": 0}
    assert store.reads == [None, n - 1]  # two pages (rounds n, n-1 = the old running one; then a settled one)
    assert counter.counts(store) == again


@pytest.mark.parametrize("kind", ["rounds", "models", "audit"])
def test_cursors_round_trip_and_refuse_anything_else(kind: str) -> None:
    import re

    for bound in (1, 9, 16, 255, 16**15 - 1):
        cursor = encode_cursor(kind, bound)
        assert re.fullmatch(cursor_pattern(kind), cursor)
        assert decode_cursor(kind, cursor) == bound
    assert decode_cursor(kind, None) is None
    other = "models" if kind != "models" else "rounds"
    for bad in ("", "R0", "R01", encode_cursor(other, 5), "R" + "1" * 16, "r5", " R5"):
        with pytest.raises(BadCursor):
            decode_cursor(kind, bad)
    with pytest.raises(ValueError):
        encode_cursor(kind, 0)


def test_a_hybrid_rounds_plaintext_devices_are_named_not_a_stage() -> None:
    from admin.history import Ledger, round_detail

    r = RoundRecord(number=3, state=RoundState.COMMITTED, started_at=T0, ended_at=T0 + timedelta(seconds=2),
                    cohort_size=5, survivors={"selected": [1, 2, 3, 4, 5], "advertise_keys": [3, 4, 5],
                                              "masked_input": [3, 4, 5], "unmasking": [3, 4, 5], "plaintext": [1, 2]},
                    metrics={"contributors": 5, "hybrid.plaintext_devices": 2, "hybrid.secure_devices": 3,
                             "hybrid.unprotected_contributions": 2})
    d = round_detail(r, produced=None, ledger=Ledger({}))
    assert d.plaintext_device_ids == [1, 2]
    assert "plaintext" not in [s.stage for s in d.stages]
    assert d.metrics["hybrid.unprotected_contributions"] == 2 and d.contributors == 5
    plain = round_detail(RoundRecord(number=4, state=RoundState.COMMITTED, started_at=T0, cohort_size=3,
                                     survivors={"selected": [1, 2, 3]}), produced=None, ledger=Ledger({}))
    assert plain.plaintext_device_ids == []


def test_the_privacy_view_names_every_rounds_unprotected_contributions() -> None:
    """Plaintext (hybrid) contributions are listed per round, with or without a
    ledger entry (DP on or off), never folded into epsilon; aborted rounds
    and rounds without plaintext devices do not count."""
    import numpy as np

    from admin.history import privacy, unprotected_rounds
    from coordinator.store import NewModelVersion, PrivacyEntry
    from coordinator.store.blobs import pack_parameters

    store = InMemoryStore()
    filled = fill_store(store)  # 5 committed rounds with ledger entries, none hybrid
    spent = store.privacy_ledger()[-1].cumulative_epsilon
    params = pack_parameters({"item_table": np.zeros((3, 4), dtype=np.float32)})
    # the running round of fill_store is taken over: a hybrid round with DP, then one without, then an abort
    numbers: list[int] = []
    for plain, dp, state in ((3, True, RoundState.COMMITTED), (2, False, RoundState.COMMITTED),
                             (4, False, RoundState.ABORTED)):
        n = store.next_round_number()
        numbers.append(n)
        rec = RoundRecord(number=n, state=state, abort_reason="too_few_survivors" if state is RoundState.ABORTED else None,
                          started_at=T0 + timedelta(hours=2, minutes=n),
                          ended_at=T0 + timedelta(hours=2, minutes=n, seconds=3), cohort_size=10,
                          base_model_version=filled.versions[-1],
                          metrics={"contributors": 8.0, "hybrid.plaintext_devices": float(plain),
                                   "hybrid.secure_devices": 5.0, "hybrid.unprotected_contributions": float(plain)})
        if state is RoundState.ABORTED:
            store.abort_round(rec)
            continue
        store.commit_round(rec, NewModelVersion(model_name="fedrap", parameters=params, created_at=rec.ended_at),
                           PrivacyEntry(round_number=n, epsilon=0.5, delta=1e-5, noise_multiplier=0.9,
                                        sampling_rate=1.0, cumulative_epsilon=spent + 0.5) if dp else None)
    hybrid_dp, hybrid_plain = numbers[:2]
    assert unprotected_rounds(store, page=2) == {hybrid_dp: 3, hybrid_plain: 2}
    p = privacy(store, budget=None, exhausted=None)
    assert p.unprotected_contributions_total == 5
    assert [(u.round_number, u.devices) for u in p.unprotected_rounds] == [(hybrid_dp, 3), (hybrid_plain, 2)]
    by_round = {e.round_number: e for e in p.ledger}
    assert by_round[hybrid_dp].unprotected_contributions == 3
    assert all(e.unprotected_contributions == 0 for n, e in by_round.items() if n != hybrid_dp)
    assert p.epsilon_spent == pytest.approx(spent + 0.5)  # the plaintext devices add nothing to epsilon


def test_a_round_charged_as_released_is_labelled_in_the_ledger_and_listed() -> None:
    """A round whose coordinator died after asking for unmasking is in the
    ledger although aborted (D94): the privacy view labels it, counts its
    masked-input devices, composes it into epsilon spent, and the round
    listings show it as aborted with its cumulative epsilon."""
    from admin.history import get_round, list_rounds, privacy
    from coordinator.store import PrivacyEntry

    store = InMemoryStore()
    filled = fill_store(store)  # the running round is in MASKED_INPUT: make it one that asked for unmasking
    running = store.get_round(filled.running)
    assert running is not None
    store.save_round_progress(RoundRecord(number=running.number, state=RoundState.UNMASKING,
                                          started_at=running.started_at, cohort_size=10,
                                          base_model_version=running.base_model_version,
                                          survivors={"selected": list(range(1, 11)), "masked_input": [1, 2, 3, 4, 5]}))
    before = store.privacy_ledger()[-1].cumulative_epsilon

    def charge(found: RoundRecord, ledger: object, groups: object) -> PrivacyEntry:
        return PrivacyEntry(round_number=found.number, epsilon=2.0, delta=1e-5, noise_multiplier=0.7,
                            sampling_rate=1.0, cumulative_epsilon=before + 2.0)

    assert store.mark_interrupted_rounds_aborted(charge=charge) == [filled.running]
    p = privacy(store, budget=before + 1.0, exhausted=True)
    by_round = {e.round_number: e for e in p.ledger}
    charged = by_round[filled.running]
    assert (charged.charged, charged.counted_devices) == ("interrupted after unmasking", 5)
    assert all(by_round[n].charged == "committed" and by_round[n].counted_devices == 8 for n in filled.committed)
    assert p.epsilon_spent == pytest.approx(before + 2.0) and p.epsilon_remaining == 0.0
    assert p.production_plan is not None  # priced with the charged round's counted devices
    detail = get_round(store, filled.running)
    assert detail is not None and detail.outcome == "aborted" and detail.epsilon == pytest.approx(before + 2.0)
    page = list_rounds(store, limit=3, cursor=None, outcome="aborted")
    assert page.items[0].number == filled.running and page.items[0].epsilon == pytest.approx(before + 2.0)
