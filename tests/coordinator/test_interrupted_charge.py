"""A round whose coordinator died after asking for unmasking is charged in
the privacy ledger as if its sum had been released (D94,
coordinator/interrupted_charge.py): the successor's start-up writes the
entry with the abort, priced as a committed round with the devices counted
at masked input, and the epsilon spent, the budget check and the next
commit compose it. Over real processes on PostgreSQL:
tests/integration/test_replica_spent_version.py. A round whose groups
replicas ran is charged by its group rows instead (the oracle below);
through the store: tests/coordinator/test_store_interrupted_charge.py."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from coordinator.interrupted_charge import InterruptedCharge, cohort_size, counted_devices
from coordinator.model_host import build_server_model
from coordinator.round_policy import dp_mechanism_for
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import (
    COORDINATOR_RESTART,
    EncodedSum,
    GroupAssignment,
    GroupCharge,
    GroupProgress,
    GroupResult,
    GroupRow,
    GroupState,
    InMemoryStore,
    NewModelVersion,
    PrivacyEntry,
    RoundRecord,
    RoundState,
)
from coordinator.store.blobs import pack_parameters
from fedmask_proto.v1 import common_pb2
from dpmech.calibrate import noise_multiplier_of
from dpmech.mechanism import privacy_rho
from models.privacy import composed_epsilon

T0 = datetime(2026, 1, 1, tzinfo=UTC)
L = 16
Z = 1.2


def settings(mechanism: str, **over: Any) -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides={
        "listen_address": "127.0.0.1:0", "database_url": "memory://", "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": L}, "cohort.size": 4, "cohort.minimum": 3,
        "dp.mode": "distributed", "dp.mechanism": mechanism, "dp.noise_multiplier": Z, "seed": 3, **over})


def multiplier(s: CoordinatorSettings, *, cohort: int, counted: int) -> float:
    """The oracle: the noise multiplier of a sum of `counted` of `cohort`
    devices' shares, from the mechanism's definitions (not the ledger)."""
    if s.dp.mechanism == "gaussian-float":
        return Z * math.sqrt(counted / cohort)
    mechanism = dp_mechanism_for(s, cohort, L)
    assert mechanism is not None
    return noise_multiplier_of(privacy_rho(mechanism, counted))


def record(number: int, state: RoundState, *, masked: list[int] | None, **kw: Any) -> RoundRecord:
    survivors = {"selected": [1, 2, 3, 4], "advertise_keys": [1, 2, 3, 4]}
    if masked is not None:
        survivors["masked_input"] = masked
    return RoundRecord(number=number, state=state, started_at=T0, cohort_size=4, base_model_version=1,
                       survivors=survivors, metrics={"cohort": 4.0, "threshold": 3.0, "neighbours": 3.0}, **kw)


def left_by_a_dead_leader(s: CoordinatorSettings) -> InMemoryStore:
    """Round 1 committed with all 4 counted; round 2 asked 4 devices to
    unmask, 3 counted at masked input; round 3 died before unmasking;
    round 4 asked for unmasking, its masked-input survivors unlisted."""
    store = InMemoryStore()
    model = build_server_model(s.model.name, s.model.hyperparameters)
    blob = pack_parameters(model.init_parameters(3))
    z1 = multiplier(s, cohort=4, counted=4)
    eps1 = composed_epsilon([(z1, 1.0)], delta=s.dp.delta)
    store.commit_round(record(1, RoundState.COMMITTED, masked=[1, 2, 3, 4], ended_at=T0),
                       NewModelVersion(model_name="synthetic", parameters=blob, hyperparameters={"step": 1}),
                       PrivacyEntry(round_number=1, epsilon=eps1, delta=s.dp.delta, noise_multiplier=z1,
                                    sampling_rate=1.0, cumulative_epsilon=eps1))
    store.save_round_progress(record(2, RoundState.UNMASKING, masked=[1, 2, 4]))
    store.save_round_progress(record(3, RoundState.MASKED_INPUT, masked=None))
    store.save_round_progress(record(4, RoundState.UNMASKING, masked=None))
    return store


async def _start(s: CoordinatorSettings, store: InMemoryStore) -> tuple[float, float]:
    coord = Coordinator(s, store=store, model=build_server_model(s.model.name, s.model.hyperparameters))
    await coord.start()
    try:  # what the budget check and the next commit compose: a round of 4 devices, 3 counted
        return coord.outcomes.epsilon_spent, coord.ledger.epsilon_after(
            cohort=4, counted=3, mechanism=dp_mechanism_for(s, 4, L))
    finally:
        await coord.shutdown("test over")


@pytest.mark.parametrize("mechanism", ["discrete-gaussian", "gaussian-float"])
def test_a_round_interrupted_after_unmasking_is_charged_as_released(mechanism: str) -> None:
    s = settings(mechanism)
    store = left_by_a_dead_leader(s)
    spent, next_round = asyncio.run(_start(s, store))
    ledger = store.privacy_ledger()
    assert [e.round_number for e in ledger] == [1, 2, 4]  # round 3 asked nobody: no charge
    z1, z2 = multiplier(s, cohort=4, counted=4), multiplier(s, cohort=4, counted=3)
    z4 = multiplier(s, cohort=4, counted=3)  # unlisted: the threshold, the fewest a commit can count
    assert z2 < z1 and ledger[1].noise_multiplier == pytest.approx(z2, rel=1e-9)
    assert ledger[2].noise_multiplier == pytest.approx(z4, rel=1e-9)
    assert ledger[1].epsilon == pytest.approx(composed_epsilon([(z2, 1.0)], delta=s.dp.delta), rel=1e-6)
    assert ledger[1].cumulative_epsilon == pytest.approx(composed_epsilon([(z1, 1.0), (z2, 1.0)], delta=s.dp.delta),
                                                         rel=1e-6)
    three = composed_epsilon([(z1, 1.0), (z2, 1.0), (z4, 1.0)], delta=s.dp.delta)
    assert ledger[2].cumulative_epsilon == pytest.approx(three, rel=1e-6)
    assert spent == pytest.approx(three, rel=1e-6) and spent > ledger[0].cumulative_epsilon
    four = composed_epsilon([(z1, 1.0), (z2, 1.0), (z4, 1.0), (z2, 1.0)], delta=s.dp.delta)
    assert next_round == pytest.approx(four, rel=1e-6)
    for n in (2, 3, 4):
        r = store.get_round(n)
        assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == COORDINATOR_RESTART


def test_without_dp_nothing_is_charged_and_the_counts_never_under_report() -> None:
    s = settings("gaussian-float", **{"dp.mode": "none", "dp.noise_multiplier": 0.0})
    store = left_by_a_dead_leader(settings("gaussian-float"))
    asyncio.run(_start(s, store))
    assert [e.round_number for e in store.privacy_ledger()] == [1]
    aborted = store.get_round(2)
    assert aborted is not None and aborted.state is RoundState.ABORTED
    bare = RoundRecord(number=9, state=RoundState.UNMASKING, started_at=T0, cohort_size=5)
    assert (counted_devices(bare), cohort_size(bare)) == (1, 5)  # nothing known: the fewest counted
    assert counted_devices(record(9, RoundState.UNMASKING, masked=[1, 2, 3, 4])) == 4


@pytest.mark.parametrize(("reconstructed", "answers", "masked", "expected"), [
    (5, 0, 6, 5),        # reconstructed, then not committed (rollback, store failure): its counted devices
    (0, 0, 0, 1),        # never fewer than one device's noise
    (None, 3, 6, 6),     # t answers held: reconstructable, priced at the masked-input count
    (None, 3, 0, 1),
    (None, 2, 6, None),  # fewer than t answers: nothing can be learned (D85)
])
def test_a_live_abort_is_charged_when_its_sum_was_learnable(reconstructed: int | None, answers: int, masked: int,
                                                           expected: int | None) -> None:
    from coordinator.interrupted_charge import learnable_count

    assert learnable_count(reconstructed=reconstructed, unmasking_answers=answers, threshold=3,
                           masked_input=masked) == expected


def test_a_live_round_that_reconstructed_its_sum_but_aborts_is_charged() -> None:
    """A round that unmasked (its sum reconstructed) and then failed to
    commit (a store failure, a rollback meanwhile) released its sum to this
    coordinator: `abort_charge` prices it as a committed round's, with the
    counted devices' noise; a round cancelled before unmasking costs nothing."""
    from test_round_machine import Driver

    from coordinator.interrupted_charge import abort_charge
    from coordinator.round_report import PrivacyLedger

    s = settings("gaussian-float")
    ledger = PrivacyLedger(s.dp, InMemoryStore())
    d = Driver(n=4, silent={103: "unmasking"})  # one device does not answer unmasking: 4 counted, 3 answers
    d.run()
    assert d.m.result is not None
    counted = len(d.m.result.counted)
    d.apply(d.m.commit_failed("disk full", 5.0))
    assert d.m.phase is RoundState.ABORTED
    charged = abort_charge(ledger, d.m, [])
    assert charged is not None and charged.round_number == d.m.number
    assert charged.noise_multiplier == pytest.approx(multiplier(s, cohort=4, counted=counted), rel=1e-9)
    assert charged.epsilon == pytest.approx(composed_epsilon([(charged.noise_multiplier, 1.0)], delta=s.dp.delta))

    early = Driver(n=4)
    early.apply(early.m.cancel(common_pb2.ABORT_REASON_COORDINATOR_SHUTDOWN, "shutting down", 1.0))
    assert abort_charge(ledger, early.m, []) is None


@pytest.mark.parametrize("mechanism", ["discrete-gaussian", "gaussian-float"])
def test_a_round_in_groups_interrupted_after_unmasking_is_charged_at_its_weakest_possible_group(mechanism: str) -> None:
    """D99: a record of a round in groups does not say what each group
    counted. The charge takes the fewest a released group could count (the
    smallest group threshold) over the most shares a device's noise was
    split into (the largest group): at or below every group's own
    multiplier, never above."""
    s = settings(mechanism, **{"cohort.size": 12, "cohort.minimum": 6, "secagg.group_size": 4})
    found = RoundRecord(number=1, state=RoundState.UNMASKING, started_at=T0, cohort_size=12, base_model_version=1,
                        survivors={"selected": list(range(12)), "masked_input": list(range(12))},
                        metrics={"cohort": 12.0, "threshold": 3.0, "neighbours": 4.0, "groups": 2.0,
                                 "group_size_max": 6.0})
    from coordinator.interrupted_charge import in_groups, noise_shares
    from coordinator.round_report import PrivacyLedger

    assert in_groups(found) and noise_shares(found) == 6 and counted_devices(found) == 3
    charge = InterruptedCharge(PrivacyLedger(s.dp, InMemoryStore()),
                               lambda n, shares: dp_mechanism_for(s, n, L, shares))
    entry = charge(found, [])
    assert entry is not None
    if mechanism == "gaussian-float":
        assert entry.noise_multiplier == pytest.approx(Z * math.sqrt(3 / 6))
    else:
        mechanism_6 = dp_mechanism_for(s, 12, L, 6)
        assert mechanism_6 is not None
        assert entry.noise_multiplier == pytest.approx(noise_multiplier_of(privacy_rho(mechanism_6, 3)), rel=1e-9)
    # a group of 4 that counted its threshold of 3 carries more: the charge is the lower bound
    assert entry.noise_multiplier <= Z * math.sqrt(3 / 4)


# ---------------------------------------------------------------- rounds in groups run by replicas (group rows)
#
# The oracle restates the rule of a round whose groups replicas ran, from the
# group state machine (coordinator/store/group_records.py), not from
# `InterruptedCharge`:
#
#   released = groups in `unmasking` or `done`, or `lost` while in `unmasking`
#              (their devices may have been asked to unmask, D94)
#   none released -> no charge
#   each released group g: size |members(g)|, counted = |counted(g)| when done,
#       else |survivors(g)["masked_input"]| as saved, else 1; its multiplier
#       the ledger's price of a sum of `counted` of `size` shares, the group's
#       discrete Gaussian calibrated for the round's cohort split `size` ways
#   the round: at the least multiplier of its released groups, composed with
#       the ledger before it.

def group_row(index: int, size: int, state: GroupState, *, lost_in: GroupState | None = None,
              masked: int | None = None, counted: int | None = None, asked: bool = False) -> GroupRow:
    """Group `index` of round 7 with `size` devices (10 index + 1, ...), driven through the
    store's own transition rules to `state` (through `lost_in` when lost):
    `masked` of its members saved as masked-input survivors, `counted` of
    them counted by a done group; a group in unmasking asked all its members,
    and so did a failed one with `asked` (it failed after asking)."""
    from coordinator.store.group_records import finished, lost, new_group_row, progressed

    members = tuple(range(10 * index + 1, 10 * index + 1 + size))
    row = new_group_row(GroupAssignment(round_number=7, index=index, replica="replica-a", replica_token=1,
                                        members=members, secagg_settings=b"s", session_id=b"i"), 0.0)
    reached = lost_in if state is GroupState.LOST else state
    assert reached is not None
    survivors = {} if masked is None else {"masked_input": list(members[:masked])}
    if reached is not GroupState.ASSIGNED:
        row = progressed(row, GroupProgress(round_number=7, index=index, state=GroupState.RUNNING,
                                            phase="running"), 1.0)
    if reached in (GroupState.UNMASKING, GroupState.DONE) or (reached is GroupState.FAILED and asked):
        row = progressed(row, GroupProgress(round_number=7, index=index, state=GroupState.UNMASKING, phase="unmasking",
                                            asked=members, survivors=survivors), 2.0)
    if reached is GroupState.DONE:
        assert counted is not None
        total = EncodedSum(np.zeros(4, np.uint32), np.zeros(1, np.uint32), 4, 1)
        row = finished(row, GroupResult(round_number=7, index=index, state=GroupState.DONE, sum=total,
                                        counted=members[:counted], survivors=survivors), 3.0)
    if reached is GroupState.FAILED:
        row = finished(row, GroupResult(round_number=7, index=index, state=GroupState.FAILED,
                                        fail_reason="too_few_survivors", survivors=survivors), 3.0)
    if state is GroupState.LOST:
        row = lost(row, 4.0)
    assert (row.state, row.lost_in) == (state, lost_in)
    return row


def oracle_groups(s: CoordinatorSettings, rows: list[GroupRow]) -> tuple[GroupCharge, ...]:
    """The released groups' charges (see the rule above), each priced by a
    ledger of its own through `PrivacyLedger.round_multiplier`."""
    from coordinator.round_report import PrivacyLedger

    pricing = PrivacyLedger(s.dp, InMemoryStore())
    cohort = sum(len(g.assignment.members) for g in rows)
    out = []
    for g in rows:
        if not (g.state in (GroupState.UNMASKING, GroupState.DONE)
                or (g.state is GroupState.LOST and g.lost_in is GroupState.UNMASKING)
                or (g.state is GroupState.FAILED and g.asked)):  # failed after asking: it may have held t answers
            continue
        size = len(g.assignment.members)
        if g.state is GroupState.DONE:
            assert g.counted is not None
            counted = len(g.counted)
        else:
            counted = len(g.survivors.get("masked_input", ())) or 1
        z = pricing.round_multiplier(cohort=size, counted=counted, mechanism=dp_mechanism_for(s, cohort, L, size))
        out.append(GroupCharge(size=size, counted=counted, noise_multiplier=z))
    return tuple(out)


def group_multiplier(s: CoordinatorSettings, *, cohort: int, size: int, counted: int) -> float:
    """The same price from the mechanism's definitions (not the ledger): a
    cross-check of `oracle_groups`."""
    if s.dp.mechanism == "gaussian-float":
        return Z * math.sqrt(counted / size)
    mechanism = dp_mechanism_for(s, cohort, L, size)
    assert mechanism is not None
    return noise_multiplier_of(privacy_rho(mechanism, counted))


def charge_rule(s: CoordinatorSettings) -> InterruptedCharge:
    """The rule as the coordinator builds it (`Coordinator.start`), on a ledger of its own."""
    from coordinator.round_report import PrivacyLedger

    return InterruptedCharge(PrivacyLedger(s.dp, InMemoryStore()), lambda n, shares: dp_mechanism_for(s, n, L, shares))


def found_round(state: RoundState = RoundState.UNMASKING) -> RoundRecord:
    """Round 7's record as its dead leader left it (the groups decide, not it)."""
    return RoundRecord(number=7, state=state, started_at=T0, cohort_size=12, base_model_version=1,
                       survivors={"selected": list(range(1, 13))}, metrics={"cohort": 12.0, "threshold": 2.0})


def prior(s: CoordinatorSettings) -> PrivacyEntry:
    """A committed round 6 before it: the charge composes with it."""
    z = multiplier(s, cohort=4, counted=4)
    eps = composed_epsilon([(z, 1.0)], delta=s.dp.delta)
    return PrivacyEntry(round_number=6, epsilon=eps, delta=s.dp.delta, noise_multiplier=z, sampling_rate=1.0,
                        cumulative_epsilon=eps)


def assert_entry(s: CoordinatorSettings, entry: PrivacyEntry | None, expected: tuple[GroupCharge, ...],
                 history: list[PrivacyEntry], number: int = 7) -> None:
    """`entry` is round `number`'s at the oracle's groups, the least multiplier, composed after `history`."""
    assert entry is not None and entry.round_number == number
    assert [(g.size, g.counted) for g in entry.groups] == [(g.size, g.counted) for g in expected]
    for got, want in zip(entry.groups, expected, strict=True):
        assert got.noise_multiplier == pytest.approx(want.noise_multiplier, rel=1e-9)
    z = min(g.noise_multiplier for g in expected)
    assert entry.noise_multiplier == pytest.approx(z, rel=1e-9) and entry.sampling_rate == 1.0
    assert entry.epsilon == pytest.approx(composed_epsilon([(z, 1.0)], delta=s.dp.delta), rel=1e-6)
    assert entry.cumulative_epsilon == pytest.approx(
        composed_epsilon([(e.noise_multiplier, 1.0) for e in history] + [(z, 1.0)], delta=s.dp.delta), rel=1e-6)


@pytest.mark.parametrize("rows", [
    [(GroupState.ASSIGNED, None), (GroupState.RUNNING, None)],
    [(GroupState.FAILED, None), (GroupState.LOST, GroupState.RUNNING), (GroupState.LOST, GroupState.ASSIGNED)],
    [(GroupState.RUNNING, None), (GroupState.FAILED, None), (GroupState.LOST, GroupState.RUNNING)],
])
def test_a_round_in_groups_none_of_which_reached_unmasking_is_not_charged(
        rows: list[tuple[GroupState, GroupState | None]]) -> None:
    """No group asked anyone to unmask: nothing to charge, whatever the
    record says (the groups decide, D94), and nothing remembered as charged."""
    s = settings("discrete-gaussian")
    groups = [group_row(i, 4, state, lost_in=lost_in, masked=3) for i, (state, lost_in) in enumerate(rows)]
    assert oracle_groups(s, groups) == ()
    charge = charge_rule(s)
    assert charge.group_charges(groups) == ()
    assert charge(found_round(RoundState.UNMASKING), [prior(s)], groups) is None
    assert charge.charged == {}


@pytest.mark.parametrize("mechanism", ["discrete-gaussian", "gaussian-float"])
@pytest.mark.parametrize(("masked", "counted"), [(3, 3), (None, 1), (0, 1)])
def test_one_group_in_unmasking_is_charged_at_its_own_size_and_survivors(mechanism: str, masked: int | None,
                                                                        counted: int) -> None:
    """One group of 5 asked its devices to unmask, its neighbours did not
    get there: the round is charged at that group's size and its saved
    masked-input survivors (1 when none are saved: fewer never price lower),
    whatever the record's own state and threshold say."""
    s = settings(mechanism)
    groups = [group_row(0, 4, GroupState.RUNNING), group_row(1, 5, GroupState.UNMASKING, masked=masked),
              group_row(2, 3, GroupState.LOST, lost_in=GroupState.RUNNING, masked=3)]
    expected = oracle_groups(s, groups)
    assert [(g.size, g.counted) for g in expected] == [(5, counted)]
    assert expected[0].noise_multiplier == pytest.approx(group_multiplier(s, cohort=12, size=5, counted=counted),
                                                         rel=1e-9)
    history = [prior(s)]
    charge = charge_rule(s)
    for found in (found_round(RoundState.UNMASKING), found_round(RoundState.MASKED_INPUT)):
        entry = charge(found, history, groups)
        assert_entry(s, entry, expected, history)
        assert charge.charged[7] == entry


@pytest.mark.parametrize("mechanism", ["discrete-gaussian", "gaussian-float"])
def test_mixed_groups_list_exactly_the_possibly_released_ones_at_the_least_multiplier(mechanism: str) -> None:
    """Done, unmasking, lost in unmasking, failed (before and after asking),
    lost while running: the entry lists exactly the done, unmasking,
    lost-in-unmasking and failed-after-asking groups,
    each at its own size and count (a done group's counted devices, not its
    masked-input survivors), the round at the least of their multipliers."""
    s = settings(mechanism)
    groups = [group_row(0, 4, GroupState.DONE, masked=4, counted=3),
              group_row(1, 3, GroupState.FAILED, masked=3),
              group_row(2, 3, GroupState.UNMASKING, masked=3),
              group_row(3, 4, GroupState.LOST, lost_in=GroupState.UNMASKING, masked=2),
              group_row(4, 2, GroupState.LOST, lost_in=GroupState.RUNNING, masked=1),
              group_row(5, 5, GroupState.FAILED, masked=4, asked=True)]
    expected = oracle_groups(s, groups)
    assert [(g.size, g.counted) for g in expected] == [(4, 3), (3, 3), (4, 2), (5, 4)]
    for g in expected:
        assert g.noise_multiplier == pytest.approx(group_multiplier(s, cohort=21, size=g.size, counted=g.counted),
                                                   rel=1e-9)
    least = min(expected, key=lambda g: g.noise_multiplier)
    assert (least.size, least.counted) == (4, 2)  # the lost group: the figures are not all alike
    history = [prior(s)]
    entry = charge_rule(s)(found_round(), history, groups)
    assert_entry(s, entry, expected, history)
    assert entry is not None and all(g.noise_multiplier >= entry.noise_multiplier for g in entry.groups)


def test_without_group_rows_the_record_decides_as_before() -> None:
    """The path without group rows (a round without a plan): an explicit
    empty `groups` is the default, the record's state and survivors decide."""
    s = settings("gaussian-float")
    charge = charge_rule(s)
    asked = record(2, RoundState.UNMASKING, masked=[1, 2, 4])
    entry = charge(asked, [], ())
    assert entry is not None and entry.groups == () and entry == charge(asked, [])
    assert entry.noise_multiplier == pytest.approx(multiplier(s, cohort=4, counted=3), rel=1e-9)
    assert charge(record(3, RoundState.MASKED_INPUT, masked=None), [], ()) is None
