"""The Store contract for rounds run in groups by the replica tier
(coordinator/store/group_interface.py): the leader's plan and group rows,
the replicas' fenced group writes, the sums, the sealing of a terminal
round, and crash recovery; on every backend (memory, sqlite, postgresql:
the `backend` fixture), plus, on PostgreSQL, the race of a leader closing a
group against its replica saving `unmasking` (D94, group by group) and the
read-only role's refusal to read the group sums."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from coordinator.store import (
    COORDINATOR_RESTART,
    ConflictError,
    EncodedSum,
    FencedOut,
    GroupAssignment,
    GroupClosed,
    GroupProgress,
    GroupResult,
    GroupRow,
    GroupState,
    InvalidRecordError,
    Lease,
    NewModelVersion,
    NotFoundError,
    PrivacyEntry,
    RoundOutcome,
    RoundPlan,
    RoundRecord,
    RoundState,
    Store,
    open_store,
)
from coordinator.store.migrate import upgrade_to_head
from coordinator.store.engine import create_store_engine

Backend = Any  # the `backend` fixture of conftest.py

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
A_MEMBERS, B_MEMBERS = (1, 2, 3), (4, 5, 6)
REPO = Path(__file__).resolve().parents[2]


def record(number: int, state: RoundState = RoundState.TRAINING, **kw: Any) -> RoundRecord:
    return RoundRecord(number=number, state=state, started_at=T0, cohort_size=6, **kw)


def plan(number: int, token: int) -> RoundPlan:
    return RoundPlan(round_number=number, lease_token=token, nonce=b"n" * 16, model_name="m", model_version=1,
                     step=3, hyperparameters={"lr": 0.1}, metric_names=("loss",), cohort_size=6, minimum=4,
                     rotation_key=b"r" * 32, deadlines={"advertise_keys": 30.0}, task_deadlines={"train": 60.0},
                     opened_at=T0, closes_at=T0 + timedelta(minutes=5), devices_left_out=1,
                     left_out={"unavailable": [7]})


def assignment(number: int, index: int, member: Lease, members: Sequence[int]) -> GroupAssignment:
    return GroupAssignment(round_number=number, index=index, replica=member.holder, replica_token=member.token,
                           members=tuple(members), secagg_settings=b"s%d" % index, session_id=b"i%d" % index,
                           dp_settings=b"dp" if index else None)


class Tier:
    """A leader and two member replicas on one store, and a planned round:
    group 0 (devices 1-3) run by replica-a, group 1 (4-6) by replica-b."""

    def __init__(self, s: Store) -> None:
        self.s = s
        leader = s.acquire_lease("leader", 60.0)
        a = s.join_tier("replica-a", 60.0, settings_digest="")
        b = s.join_tier("replica-b", 60.0, settings_digest="")
        assert leader is not None and a is not None and b is not None
        self.leader, self.a, self.b = leader, a, b

    def open(self) -> int:
        n = self.s.next_round_number()
        self.s.open_planned_round(record(n), plan(n, self.leader.token), self.groups(n), fence=self.leader)
        return n

    def groups(self, n: int) -> list[GroupAssignment]:
        return [assignment(n, 0, self.a, A_MEMBERS), assignment(n, 1, self.b, B_MEMBERS)]


def progress(n: int, index: int, state: GroupState = GroupState.RUNNING, **kw: Any) -> GroupProgress:
    return GroupProgress(round_number=n, index=index, state=state, phase=state.value, **kw)


def encoded(seed: int, length: int = 9, limbs: int = 2) -> EncodedSum:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**32, size=length, dtype=np.uint64).astype(np.uint32)
    values[0], values[1] = 0xFFFFFFFF, 0  # the extremes survive the round trip
    return EncodedSum(values, values[-limbs:].copy(), length, limbs)


def done(n: int, index: int, counted: Sequence[int], total: EncodedSum) -> GroupResult:
    return GroupResult(round_number=n, index=index, state=GroupState.DONE, sum=total, counted=tuple(counted),
                       survivors={"masked_input": list(counted)}, timings={"unmasking": 0.5},
                       completion={"answers": len(counted)}, share_reports=((counted[0], counted[-1]),),
                       share_check_survivors=tuple(counted))


def to_unmasking(t: Tier, n: int, member: Lease, index: int, asked: Sequence[int]) -> GroupRow:
    t.s.start_group(member, n, index)
    return t.s.save_group_progress(member, progress(n, index, GroupState.UNMASKING, asked=tuple(asked),
                                                    survivors={"masked_input": list(asked)}))


def states(s: Store, n: int) -> list[tuple[GroupState, GroupState | None]]:
    return [(g.state, g.lost_in) for g in s.round_groups(n)]


def test_opening_a_round_is_fenced_and_writes_round_plan_and_groups(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = s.next_round_number()
    stale = Lease("leader", t.leader.token + 1, 60.0)
    with pytest.raises(FencedOut):
        s.open_planned_round(record(n), plan(n, stale.token), t.groups(n), fence=stale)
    assert s.get_round(n) is None and s.round_plan(n) is None and s.round_groups(n) == []
    with pytest.raises(InvalidRecordError):  # the plan names another lease term than the fence
        s.open_planned_round(record(n), plan(n, t.leader.token + 1), t.groups(n), fence=t.leader)
    with pytest.raises(InvalidRecordError):  # a device in two groups
        s.open_planned_round(record(n), plan(n, t.leader.token),
                             [assignment(n, 0, t.a, (1, 2, 3)), assignment(n, 1, t.b, (3, 4, 5, 6))], fence=t.leader)
    assert s.get_round(n) is None
    s.open_planned_round(record(n), plan(n, t.leader.token), t.groups(n), fence=t.leader)
    assert s.get_round(n) == record(n)
    assert s.round_plan(n) == plan(n, t.leader.token)
    rows = s.round_groups(n)
    assert [g.assignment for g in rows] == t.groups(n)
    assert [(g.state, g.lost_in, g.asked, g.counted, g.sum) for g in rows] == [(GroupState.ASSIGNED, None, None,
                                                                                None, None)] * 2
    with pytest.raises(ConflictError):  # a round has one plan
        s.open_planned_round(record(n), plan(n, t.leader.token), t.groups(n), fence=t.leader)
    assert s.round_outcome(n) == RoundOutcome(RoundState.TRAINING, None, None)
    assert s.round_outcome(n + 1) is None


def test_assigned_groups_are_those_of_the_membership_term(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    assert [(g.round_number, g.index) for g in s.assigned_groups(t.a)] == [(n, 0)]
    assert [(g.round_number, g.index) for g in s.assigned_groups(t.b)] == [(n, 1)]
    assert s.assigned_groups(Lease("replica-a", t.a.token + 1, 60.0)) == []  # another term of that name
    s.start_group(t.a, n, 0)
    assert s.assigned_groups(t.a) == []  # running: no longer waiting
    s.abort_round(record(n, RoundState.ABORTED, abort_reason="x"), fence=t.leader)
    assert s.assigned_groups(t.b) == []  # a terminal round's groups are offered to nobody


def test_the_group_state_machine_moves_forward_only(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    with pytest.raises(InvalidRecordError):  # unmasking without the devices asked (D94)
        progress(n, 0, GroupState.UNMASKING)
    with pytest.raises(GroupClosed):  # done only after unmasking
        s.finish_group(t.a, done(n, 0, A_MEMBERS, encoded(1)))
    assert s.start_group(t.a, n, 0).state is GroupState.RUNNING
    assert s.start_group(t.a, n, 0).state is GroupState.RUNNING  # starting a running group changes nothing
    s.save_group_progress(t.a, progress(n, 0, survivors={"advertise_keys": [1, 2, 3]}))
    with pytest.raises(InvalidRecordError):  # device 4 is not a member of group 0
        s.save_group_progress(t.a, progress(n, 0, survivors={"advertise_keys": [1, 4]}))
    with pytest.raises(InvalidRecordError):
        s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 4)))
    row = s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2)))
    assert (row.state, row.asked) == (GroupState.UNMASKING, (1, 2))
    before = s.round_groups(n)
    with pytest.raises(GroupClosed):  # backwards
        s.save_group_progress(t.a, progress(n, 0, GroupState.RUNNING))
    with pytest.raises(GroupClosed):
        s.start_group(t.a, n, 0)
    with pytest.raises(GroupClosed):  # the devices asked are never forgotten
        s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1,)))
    assert s.round_groups(n) == before
    s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2, 3)))
    finished = s.finish_group(t.a, done(n, 0, (1, 2, 3), encoded(2)))
    assert (finished.state, finished.counted, finished.asked) == (GroupState.DONE, (1, 2, 3), (1, 2, 3))
    for write in (lambda: s.start_group(t.a, n, 0),
                  lambda: s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2, 3))),
                  lambda: s.finish_group(t.a, GroupResult(round_number=n, index=0, state=GroupState.FAILED,
                                                          fail_reason="late"))):
        with pytest.raises(GroupClosed):
            write()
    s.start_group(t.b, n, 1)
    failed = s.finish_group(t.b, GroupResult(round_number=n, index=1, state=GroupState.FAILED,
                                             fail_reason="too_few_survivors", dropouts={"share_keys": [5]}))
    assert (failed.state, failed.fail_reason, failed.dropouts) == (GroupState.FAILED, "too_few_survivors",
                                                                   {"share_keys": (5,)})


def test_records_refuse_what_no_group_can_hold() -> None:
    total = encoded(3)
    with pytest.raises(InvalidRecordError):  # stated length is not the array's
        EncodedSum(total.encoded_sum, total.metric_limbs, 8, 2)
    with pytest.raises(InvalidRecordError):  # more metric limbs than coordinates
        EncodedSum(total.encoded_sum[:1], total.metric_limbs, 1, 2)
    with pytest.raises(InvalidRecordError):
        EncodedSum(total.encoded_sum.astype(np.int64), total.metric_limbs, 9, 2)
    with pytest.raises(InvalidRecordError):  # done without counted devices
        GroupResult(round_number=1, index=0, state=GroupState.DONE, sum=total)
    with pytest.raises(InvalidRecordError):  # failed with a sum
        GroupResult(round_number=1, index=0, state=GroupState.FAILED, sum=total, fail_reason="x")
    with pytest.raises(InvalidRecordError):
        GroupAssignment(round_number=1, index=0, replica="r", replica_token=1, members=(1, 1), secagg_settings=b"s",
                        session_id=b"i")
    with pytest.raises(InvalidRecordError):
        RoundPlan(**{**{f: getattr(plan(1, 1), f) for f in RoundPlan.__dataclass_fields__}, "minimum": 7})


def test_sums_read_back_bit_for_bit_and_only_when_asked(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    total = encoded(4, length=1000, limbs=7)
    to_unmasking(t, n, t.a, 0, A_MEMBERS)
    returned = s.finish_group(t.a, done(n, 0, A_MEMBERS, total))
    assert returned.sum is None
    assert [g.sum for g in s.round_groups(n)] == [None, None]
    [g0, g1] = s.round_groups(n, sums=True)
    assert g1.sum is None and g0.sum is not None
    assert g0.sum.encoded_sum.dtype == np.uint32 and g0.sum.encoded_sum.tobytes() == total.encoded_sum.tobytes()
    assert g0.sum.metric_limbs.tobytes() == total.metric_limbs.tobytes() and g0.sum.sha256 == total.sha256
    assert (g0.sum.vector_length, g0.sum.metric_coordinates) == (1000, 7)
    assert (g0.counted, g0.completion, g0.share_reports, g0.timings) == (
        A_MEMBERS, {"answers": 3}, ((1, 3),), {"unmasking": 0.5})
    as_bytes = EncodedSum(total.encoded_sum.tobytes(), total.metric_limbs.tobytes(), 1000, 7)  # type: ignore[arg-type]
    assert as_bytes == total


def test_refused_replica_writes_write_nothing(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    s.start_group(t.a, n, 0)
    s.start_group(t.b, n, 1)
    closed = s.close_groups(n, replicas=["replica-b"], fence=t.leader)
    assert [(g.index, g.state, g.lost_in) for g in closed] == [(1, GroupState.LOST, GroupState.RUNNING)]
    before = s.round_groups(n)
    with pytest.raises(GroupClosed):  # a lost group
        s.save_group_progress(t.b, progress(n, 1, GroupState.UNMASKING, asked=(4, 5)))
    with pytest.raises(GroupClosed):  # another replica's group
        s.save_group_progress(t.b, progress(n, 0))
    with pytest.raises(GroupClosed):  # no such group
        s.start_group(t.a, n, 5)
    with pytest.raises(FencedOut):  # another term of replica-a
        s.save_group_progress(Lease("replica-a", t.a.token + 1, 60.0), progress(n, 0))
    s.leave_tier(t.a)
    with pytest.raises(FencedOut):  # a term that ended
        s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2)))
    assert s.round_groups(n) == before
    with pytest.raises(FencedOut):  # a deposed leader closes nothing
        s.close_groups(n, fence=Lease("leader", t.leader.token + 1, 60.0))
    with pytest.raises(NotFoundError):
        s.close_groups(n + 1, fence=t.leader)
    assert s.round_groups(n) == before


def test_a_terminal_round_takes_no_group_write(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    s.start_group(t.a, n, 0)
    s.abort_round(record(n, RoundState.ABORTED, abort_reason="cancelled"), fence=t.leader)
    before = s.round_groups(n)
    with pytest.raises(GroupClosed):
        s.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2)))
    with pytest.raises(GroupClosed):
        s.start_group(t.b, n, 1)
    with pytest.raises(ConflictError):
        s.close_groups(n, fence=t.leader)
    assert s.round_groups(n) == before


def sums_stored(backend: Backend) -> int | None:
    """The rows of round_group_sums (None for the memory store)."""
    if backend.url is None:
        return None
    with backend.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM round_group_sums")).scalar_one())


def test_a_commit_seals_the_rounds_groups(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    to_unmasking(t, n, t.a, 0, A_MEMBERS)
    s.finish_group(t.a, done(n, 0, A_MEMBERS, encoded(5)))
    s.start_group(t.b, n, 1)
    assert sums_stored(backend) in (None, 1)
    with pytest.raises(FencedOut):  # a deposed leader's commit seals nothing
        s.commit_round(record(n, RoundState.COMMITTED, ended_at=T0), NewModelVersion(model_name="m", parameters=b"p"),
                       None, fence=Lease("leader", t.leader.token + 1, 60.0))
    assert s.round_groups(n, sums=True)[0].sum == encoded(5)
    model = s.commit_round(record(n, RoundState.COMMITTED, ended_at=T0),
                           NewModelVersion(model_name="m", parameters=b"p"), None, fence=t.leader)
    assert states(s, n) == [(GroupState.DONE, None), (GroupState.LOST, GroupState.RUNNING)]
    assert [g.sum for g in s.round_groups(n, sums=True)] == [None, None]
    assert sums_stored(backend) in (None, 0)
    sealed = s.round_plan(n)
    assert sealed is not None and sealed.new_model_version == model.id
    assert s.round_outcome(n) == RoundOutcome(RoundState.COMMITTED, model.id, None)


def test_an_abort_seals_the_rounds_groups(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    n = t.open()
    to_unmasking(t, n, t.a, 0, (1, 2))
    s.finish_group(t.a, done(n, 0, (1, 2), encoded(6)))
    to_unmasking(t, n, t.b, 1, (4, 5, 6))
    s.abort_round(record(n, RoundState.ABORTED, abort_reason="too_few_groups"), fence=t.leader)
    assert states(s, n) == [(GroupState.DONE, None), (GroupState.LOST, GroupState.UNMASKING)]
    assert s.round_groups(n)[1].may_have_asked and s.round_groups(n)[1].asked == (4, 5, 6)
    assert [g.sum for g in s.round_groups(n, sums=True)] == [None, None] and sums_stored(backend) in (None, 0)
    after = s.round_plan(n)
    assert after is not None and after.new_model_version is None
    assert s.round_outcome(n) == RoundOutcome(RoundState.ABORTED, None, "too_few_groups")


def test_a_round_without_a_plan_is_written_as_before(backend: Backend) -> None:
    s = backend.store
    n = s.next_round_number()
    s.save_round_progress(record(n))
    model = s.commit_round(record(n, RoundState.COMMITTED, ended_at=T0),
                           NewModelVersion(model_name="m", parameters=b"p"), None)
    assert s.round_groups(n) == [] and s.round_plan(n) is None
    assert s.round_outcome(n) == RoundOutcome(RoundState.COMMITTED, model.id, None)


def test_recovery_closes_groups_merges_asked_and_hands_the_rows_to_the_charge_rule(backend: Backend) -> None:
    t = Tier(backend.store)
    s = t.s
    plain = s.next_round_number()
    s.save_round_progress(record(plain, RoundState.UNMASKING, survivors={"masked_input": [8, 9]}))
    n = t.open()
    to_unmasking(t, n, t.a, 0, (1, 2))
    to_unmasking(t, n, t.b, 1, (4, 5))
    s.finish_group(t.b, done(n, 1, (4, 5, 6), encoded(7)))
    s.save_round_progress(record(n, RoundState.UNMASKING, survivors={"unmasking": [3]}))
    seen: dict[int, tuple[RoundRecord, list[GroupRow]]] = {}

    def rule(found: RoundRecord, ledger: Sequence[PrivacyEntry], groups: Sequence[GroupRow]) -> PrivacyEntry | None:
        seen[found.number] = (found, list(groups))
        if not any(g.may_have_asked for g in groups):
            return None
        return PrivacyEntry(round_number=found.number, epsilon=0.5, delta=1e-5, noise_multiplier=1.0,
                            sampling_rate=1.0, cumulative_epsilon=0.5)

    assert s.mark_interrupted_rounds_aborted(charge=rule, fence=t.leader) == [plain, n]
    assert seen[plain][1] == []  # no plan: no rows, the record as before
    found, rows = seen[n]
    assert found.survivors == {"unmasking": [3]} and found.state is RoundState.UNMASKING  # as it was stored
    assert [(g.state, g.lost_in) for g in rows] == [(GroupState.LOST, GroupState.UNMASKING), (GroupState.DONE, None)]
    assert all(g.sum is None for g in rows)
    stored = s.get_round(n)
    assert stored is not None and stored.state is RoundState.ABORTED and stored.abort_reason == COORDINATOR_RESTART
    assert stored.survivors["unmasking"] == [1, 2, 3, 4, 5]  # every device a group may have asked
    assert s.get_round(plain).survivors == {"masked_input": [8, 9]}  # type: ignore[union-attr]
    assert [e.round_number for e in s.privacy_ledger()] == [n]
    assert states(s, n) == [(GroupState.LOST, GroupState.UNMASKING), (GroupState.DONE, None)]
    assert sums_stored(backend) in (None, 0)


RACES = 200


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_close_and_an_unmasking_save_never_both_win(backend: Backend) -> None:
    """D94 group by group: the leader closes a running group while its
    replica saves it entering `unmasking` (two stores, as two processes).
    In every iteration exactly one wins: the save (it returns, and the
    group is then lost in `unmasking`) or the close (the save is refused
    with GroupClosed, and the group is lost in `running`)."""
    t = Tier(backend.store)
    leader_store, replica_store = open_store(backend.url, migrate=False), open_store(backend.url, migrate=False)
    wins = {"save": 0, "close": 0}
    try:
        for _ in range(RACES):
            n = t.open()
            t.s.start_group(t.a, n, 0)
            gate = threading.Barrier(2)
            saved: list[bool] = []
            errors: list[BaseException] = []

            def close(n: int = n, gate: threading.Barrier = gate) -> None:
                try:
                    gate.wait(10)
                    leader_store.close_groups(n, replicas=["replica-a"], fence=t.leader)
                except BaseException as exc:  # noqa: BLE001 - asserted on
                    errors.append(exc)

            def save(n: int = n, gate: threading.Barrier = gate) -> None:
                try:
                    gate.wait(10)
                    replica_store.save_group_progress(t.a, progress(n, 0, GroupState.UNMASKING, asked=(1, 2, 3)))
                    saved.append(True)
                except GroupClosed:
                    saved.append(False)
                except BaseException as exc:  # noqa: BLE001 - asserted on
                    errors.append(exc)

            threads = [threading.Thread(target=close), threading.Thread(target=save)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            assert errors == [] and len(saved) == 1
            [g0, _] = t.s.round_groups(n)
            assert g0.state is GroupState.LOST
            if saved[0]:
                assert g0.lost_in is GroupState.UNMASKING and g0.asked == (1, 2, 3)
            else:
                assert g0.lost_in is GroupState.RUNNING and g0.asked is None
            wins["save" if saved[0] else "close"] += 1
            t.s.abort_round(record(n, RoundState.ABORTED, abort_reason="x"), fence=t.leader)
    finally:
        leader_store.close()
        replica_store.close()
    assert sum(wins.values()) == RACES, wins
    print("D94 race wins:", wins)


def test_the_read_only_role_cannot_read_the_group_sums(postgresql_url: str, postgresql_server: Any,
                                                       tmp_path: Path) -> None:
    """deploy/postgres/initdb/10-fedmask-reader.sh, run as the image runs it
    on an empty database, then the coordinator's migrations: fedmask_reader
    reads the rounds but not round_group_sums (the migration revokes what
    the default privileges granted), also after a downgrade and upgrade."""
    database = postgresql_url.rsplit("/", 1)[1]
    password = tmp_path / "reader-password"
    password.write_text("reader")
    env = {**os.environ, "FEDMASK_READER_PASSWORD_FILE": str(password), "POSTGRES_USER": postgresql_server.user,
           "POSTGRES_DB": database, "PGHOST": postgresql_server.host, "PGPORT": str(postgresql_server.port)}
    subprocess.run(["bash", str(REPO / "deploy/postgres/initdb/10-fedmask-reader.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    reader_url = postgresql_url.replace(f"//{postgresql_server.user}@", "//fedmask_reader@")
    engine = create_store_engine(postgresql_url)
    reader = create_engine(reader_url)
    try:
        for _ in range(2):
            upgrade_to_head(engine)
            with reader.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM rounds")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM round_groups")).scalar() == 0
                with pytest.raises(ProgrammingError, match="permission denied"):
                    conn.execute(text("SELECT count(*) FROM round_group_sums"))
            from alembic import command

            from coordinator.store.migrate import alembic_config

            with engine.begin() as conn:
                command.downgrade(alembic_config(conn), "0007_replica_streams")
    finally:
        reader.dispose()
        with engine.begin() as conn:
            conn.execute(text("DROP OWNED BY fedmask_reader"))
        engine.dispose()
        subprocess.run(["psql", "-h", postgresql_server.host, "-p", str(postgresql_server.port), "-U",
                        postgresql_server.user, "-d", "postgres", "-c", "DROP ROLE IF EXISTS fedmask_reader"],
                       check=False, capture_output=True, timeout=60)
