"""Fault injection plan: seeded per-(round, device) drop draws, validation."""

from __future__ import annotations

import pytest

from edge_client.faults import DROP_STAGES, FaultPlan


def test_drop_draws_are_reproducible_and_near_the_rate() -> None:
    plan = FaultPlan(drop_rate=0.3, drop_stage="share-keys", seed=4)
    draws = [plan.drop_stage_of(d, r) for r in range(1, 21) for d in range(1, 51)]
    assert draws == [FaultPlan(drop_rate=0.3, drop_stage="share-keys", seed=4).drop_stage_of(d, r)
                     for r in range(1, 21) for d in range(1, 51)]
    assert set(draws) == {None, "share_keys"}
    assert sum(x is not None for x in draws) / len(draws) == pytest.approx(0.3, abs=0.04)
    # a different seed or round gives another draw
    other = [FaultPlan(drop_rate=0.3, drop_stage="share-keys", seed=5).drop_stage_of(d, 1) for d in range(1, 51)]
    assert other != draws[:50]


def test_rates_zero_and_one() -> None:
    assert FaultPlan().drop_stage_of(1, 1) is None
    always = FaultPlan(drop_rate=1.0, drop_stage="unmasking")
    assert all(always.drop_stage_of(d, 3) == "unmasking" for d in range(1, 20))


def test_every_cli_stage_maps_to_a_secagg_stage() -> None:
    from secagg.testing import DROPOUT_STAGES

    assert set(DROP_STAGES.values()) <= set(DROPOUT_STAGES)


@pytest.mark.parametrize(
    "kw",
    [{"drop_rate": 1.5, "drop_stage": "unmasking"}, {"drop_rate": 0.2}, {"drop_stage": "nope"},
     {"delay_ms": -1}, {"crash_after_round": -2}],
)
def test_bad_plans(kw: dict) -> None:
    with pytest.raises(ValueError):
        FaultPlan(**kw)


def test_crash_uses_the_injected_exit() -> None:
    codes: list[int] = []
    plan = FaultPlan(crash_after_round=3, exit=codes.append)
    assert not plan.should_crash_after(2) and plan.should_crash_after(3) and plan.should_crash_after(4)
    plan.crash()
    assert codes == [75]


def test_false_reports_about_names_only_the_chosen_relayed_senders() -> None:
    from secagg.messages import ShareReceipt, ShareRelay

    sid = b"s" * 16
    relay = ShareRelay(session_id=sid, round_idx=1, device_id=0, shares=((1, b"a"), (2, b"b"), (3, b"c")))
    own = [ShareReceipt(session_id=sid, round_idx=1, device_id=0, undecryptable=(3,))]  # its honest report stays
    device_of = {1: 101, 2: 102, 3: 103}.__getitem__
    plan = FaultPlan(false_reports_about=frozenset({102, 999}))
    (receipt,) = plan.falsify_receipts(relay, own, device_of)
    assert receipt.undecryptable == (2, 3)
    (every,) = FaultPlan(false_reports=True).falsify_receipts(relay, own, device_of)
    assert every.undecryptable == (1, 2, 3)
    assert FaultPlan().falsify_receipts(relay, own, device_of) == own
