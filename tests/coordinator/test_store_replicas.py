"""The Store contract for the replica tier (coordinator/store/replica_interface.py):
membership terms and stream ownership, run against every backend (memory,
sqlite, postgresql: the `backend` fixture), and, on PostgreSQL, replicas
claiming the same devices from many threads at once. Expiry is the store's
clock: the tests use short terms and wait them out, as the leader-lease
tests do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from coordinator.store import (
    FencedOut,
    InMemoryStore,
    InvalidRecordError,
    Lease,
    NotFoundError,
    Store,
    StreamClaim,
    StreamOwner,
    open_store,
)
from coordinator.store import sql_replicas

Backend = Any  # the `backend` fixture of conftest.py

SHORT = 0.8  # a term the tests wait out
PAST_SHORT = 1.0  # longer than SHORT, by any clock
LONG = 60.0


def devices(store: Store, n: int) -> list[int]:
    return [store.enroll_device(bytes([i + 1]) * 32)[0].id for i in range(n)]


def join(store: Store, name: str, seconds: float = LONG) -> Lease:
    lease = store.join_tier(name, seconds, settings_digest="d" * 64)
    assert lease is not None
    return lease


def test_join_renew_and_expiry(backend: Backend) -> None:
    s = backend.store
    assert s.live_replicas() == [] and s.fleet_version() == 0
    a = s.join_tier("replica-a", SHORT, settings_digest="abc", device_address="10.0.0.1:7000",
                    admin_address="10.0.0.1:7001")
    assert a == Lease("replica-a", 1, SHORT)
    assert s.join_tier("replica-a", SHORT, settings_digest="abc") is None  # a live row of that name: not taken
    renewed = s.join_tier("replica-a", SHORT, settings_digest="abc", device_address="10.0.0.1:7000",
                          admin_address="10.0.0.1:7001", renewing=a)
    assert renewed is not None and renewed.token == a.token  # a renewal keeps the term
    [member] = s.live_replicas()
    assert (member.name, member.token, member.settings_digest, member.device_address, member.admin_address,
            member.streams_version) == ("replica-a", 1, "abc", "10.0.0.1:7000", "10.0.0.1:7001", 0)
    assert 0 < member.expires_at - member.joined_at <= 2 * SHORT
    assert s.join_tier("replica-b", LONG, settings_digest="abc") is not None  # another name: its own row
    time.sleep(PAST_SHORT)
    assert [r.name for r in s.live_replicas()] == ["replica-b"]
    again = s.join_tier("replica-a", LONG, settings_digest="abc")  # expired: a new term, the token grows
    assert again is not None and again.token == a.token + 1
    assert s.join_tier("replica-a", LONG, settings_digest="abc", renewing=a) is None  # the older term's renewal
    [member_a, _] = s.live_replicas()
    assert member_a.token == again.token and member_a.joined_at > member.joined_at


def test_renewing_an_expired_term_starts_a_new_one(backend: Backend) -> None:
    s = backend.store
    a = s.join_tier("replica-a", SHORT, settings_digest="")
    assert a is not None
    time.sleep(PAST_SHORT)
    renewed = s.join_tier("replica-a", LONG, settings_digest="", renewing=a)
    assert renewed is not None and renewed.token == a.token + 1


def test_leaving_ends_the_term_and_a_stale_leave_does_nothing(backend: Backend) -> None:
    s = backend.store
    [d1, d2] = devices(s, 2)
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    s.publish_streams(a, claims=[StreamClaim(d1, 1, True)])
    s.publish_streams(b, claims=[StreamClaim(d2, 2, True)])
    before = s.fleet_version()
    s.leave_tier(a)
    assert [r.name for r in s.live_replicas()] == ["replica-b"] and s.fleet_version() > before
    assert s.stream_owner(d1) is None and s.available_by_replica() == {"replica-b": [(d2, 2)]}
    a2 = join(s, "replica-a")  # free at once, a new term
    assert a2.token == a.token + 1
    assert s.stream_owner(d1) is None  # the left term's rows are gone, not revived
    after = s.fleet_version()
    s.leave_tier(a)  # a's term is over: a2 keeps its membership
    assert [r.name for r in s.live_replicas()] == ["replica-a", "replica-b"] and s.fleet_version() == after


def test_claims_take_devices_and_the_displaced_owner_learns_it(backend: Backend) -> None:
    s = backend.store
    [d1, d2, d3] = devices(s, 3)
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    assert s.publish_streams(a, claims=[StreamClaim(d1, 11, True), StreamClaim(d2, 12, False)]).displaced == set()
    assert s.stream_owner(d1) == StreamOwner("replica-a", 11, True)
    assert s.stream_owner(d2) == StreamOwner("replica-a", 12, False)
    assert s.stream_owner(d3) is None
    assert s.available_by_replica() == {"replica-a": [(d1, 11)]}
    # b claims d2 later: the last claim wins, whoever held the row
    assert s.publish_streams(b, claims=[StreamClaim(d2, 21, True)]).displaced == set()
    assert s.stream_owner(d2) == StreamOwner("replica-b", 21, True)
    assert s.available_by_replica() == {"replica-a": [(d1, 11)], "replica-b": [(d2, 21)]}
    # a's next publish names what it believes it holds: d2 comes back displaced, d1 does not
    sync = s.publish_streams(a, availability={d1: False, d2: True})
    assert sync.displaced == {d2}
    assert s.stream_owner(d1) == StreamOwner("replica-a", 11, False)  # its own row: updated
    assert s.stream_owner(d2) == StreamOwner("replica-b", 21, True)  # b's row: untouched
    assert s.available_by_replica() == {"replica-b": [(d2, 21)]}
    # a device never claimed, named in availability, is displaced too (no row names the term)
    assert s.publish_streams(a, availability={d1: False, d3: True}).displaced == {d3}
    assert s.stream_owner(d3) is None
    [ma, mb] = s.live_replicas()  # a's availability update is the last change, b's claim the one before
    assert (ma.streams_version, mb.streams_version) == (s.fleet_version(), s.fleet_version() - 1)


def test_an_availability_update_from_a_non_owner_changes_nothing(backend: Backend) -> None:
    s = backend.store
    [d1] = devices(s, 1)
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    s.publish_streams(a, claims=[StreamClaim(d1, 11, False)])
    version = s.fleet_version()
    assert s.publish_streams(b, availability={d1: True}).displaced == {d1}
    assert s.stream_owner(d1) == StreamOwner("replica-a", 11, False)
    assert s.available_by_replica() == {} and s.fleet_version() == version
    assert [r.streams_version for r in s.live_replicas()] == [version, 0]


def test_an_earlier_term_of_the_same_name_does_not_own_its_rows(backend: Backend) -> None:
    s = backend.store
    [d1] = devices(s, 1)
    old = s.join_tier("replica-a", SHORT, settings_digest="")
    assert old is not None
    s.publish_streams(old, claims=[StreamClaim(d1, 11, True)])
    time.sleep(PAST_SHORT)
    new = join(s, "replica-a")
    assert s.stream_owner(d1) is None and s.available_by_replica() == {}  # the old term's row does not count
    assert s.publish_streams(new, availability={d1: True}).displaced == {d1}  # nor does the new term own it
    assert s.publish_streams(new, claims=[StreamClaim(d1, 12, True)]).displaced == set()
    assert s.stream_owner(d1) == StreamOwner("replica-a", 12, True)


def test_an_expired_replicas_devices_are_not_offered(backend: Backend) -> None:
    s = backend.store
    [d1, d2] = devices(s, 2)
    a = s.join_tier("replica-a", SHORT, settings_digest="")
    assert a is not None
    b = join(s, "replica-b")
    s.publish_streams(a, claims=[StreamClaim(d1, 11, True)])
    s.publish_streams(b, claims=[StreamClaim(d2, 21, True)])
    assert s.available_by_replica() == {"replica-a": [(d1, 11)], "replica-b": [(d2, 21)]}
    time.sleep(PAST_SHORT)
    assert s.available_by_replica() == {"replica-b": [(d2, 21)]}
    assert s.stream_owner(d1) is None and s.stream_owner(d2) == StreamOwner("replica-b", 21, True)
    s.publish_streams(b, claims=[StreamClaim(d1, 22, True)])  # a live replica takes the orphaned device
    assert s.stream_owner(d1) == StreamOwner("replica-b", 22, True)


def test_a_publish_of_an_expired_or_superseded_membership_is_fenced(backend: Backend) -> None:
    s = backend.store
    [d1, d2] = devices(s, 2)
    a = s.join_tier("replica-a", SHORT, settings_digest="")
    assert a is not None
    s.publish_streams(a, claims=[StreamClaim(d1, 11, True)])
    time.sleep(PAST_SHORT)
    version = s.fleet_version()
    with pytest.raises(FencedOut, match="replica-a is not a member under token 1"):  # expired
        s.publish_streams(a, claims=[StreamClaim(d2, 12, True)], availability={d1: False})
    a2 = join(s, "replica-a")
    with pytest.raises(FencedOut):  # superseded: the row runs under a newer token
        s.publish_streams(a, claims=[StreamClaim(d2, 12, True)], released=[d1])
    with pytest.raises(FencedOut):  # never joined
        s.publish_streams(Lease("replica-z", 1, LONG), claims=[StreamClaim(d2, 12, True)])
    assert s.fleet_version() == version + 1  # a2's join only: nothing of the fenced publishes
    s.publish_streams(a2, claims=[StreamClaim(d2, 13, True)])
    assert s.stream_owner(d2) == StreamOwner("replica-a", 13, True)
    s.leave_tier(a2)
    with pytest.raises(FencedOut):  # a left membership
        s.publish_streams(a2, availability={d2: False})


def test_fleet_version_grows_on_every_change_only(backend: Backend) -> None:
    s = backend.store
    [d1, d2] = devices(s, 2)
    a = join(s, "replica-a")
    v = s.fleet_version()
    assert v >= 1  # the join started a term
    renewed = s.join_tier("replica-a", LONG, settings_digest="d" * 64, renewing=a)
    assert renewed is not None and s.fleet_version() == v  # a renewal changes no stream
    steps: list[tuple[Callable[[], object], bool]] = [
        (lambda: s.publish_streams(a, claims=[StreamClaim(d1, 1, True)]), True),
        (lambda: s.publish_streams(a, claims=[StreamClaim(d1, 1, True)]), False),  # the same claim again
        (lambda: s.publish_streams(a, availability={d1: True}), False),
        (lambda: s.publish_streams(a, availability={d1: False}), True),
        (lambda: s.publish_streams(a, claims=[StreamClaim(d1, 2, False)]), True),  # a new session key
        (lambda: s.publish_streams(a, released=[d2]), False),  # no row
        (lambda: s.publish_streams(a, released=[d1]), True),
        (lambda: s.publish_streams(a), False),
    ]
    for step, changes in steps:
        step()
        assert s.fleet_version() == v + changes, step
        v = s.fleet_version()
    assert s.stream_owner(d1) is None
    [member] = s.live_replicas()
    assert member.streams_version == v


def test_a_release_deletes_only_the_replicas_own_rows(backend: Backend) -> None:
    s = backend.store
    [d1, d2] = devices(s, 2)
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    s.publish_streams(a, claims=[StreamClaim(d1, 11, True)])
    s.publish_streams(b, claims=[StreamClaim(d2, 21, True)])
    s.publish_streams(a, released=[d1, d2])
    assert s.stream_owner(d1) is None and s.stream_owner(d2) == StreamOwner("replica-b", 21, True)


def test_a_refused_publish_writes_nothing(backend: Backend) -> None:
    s = backend.store
    [d1] = devices(s, 1)
    a = join(s, "replica-a")
    version = s.fleet_version()
    with pytest.raises(NotFoundError):
        s.publish_streams(a, claims=[StreamClaim(d1, 11, True), StreamClaim(d1 + 100, 12, True)])
    bads: list[dict[str, Any]] = [
        {"claims": [StreamClaim(d1, 1, True), StreamClaim(d1, 2, True)]},  # a device twice
        {"claims": [StreamClaim(d1, 1, True)], "availability": {d1: True}},
        {"availability": {d1: True}, "released": [d1]},
        {"availability": {d1: 1}}, {"released": [0]}, {"claims": [(d1, 1, True)]},  # not a bool, id, claim
    ]
    for bad in bads:
        with pytest.raises(InvalidRecordError):
            s.publish_streams(a, **bad)
    assert s.stream_owner(d1) is None and s.fleet_version() == version


def test_a_publish_larger_than_one_statement(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL store writes a publish in statements of a bounded number of
    rows (here 3): a publish of more rows is the same one transaction."""
    monkeypatch.setattr(sql_replicas, "_CHUNK", 3)
    s = backend.store
    ids = devices(s, 10)
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    s.publish_streams(b, claims=[StreamClaim(d, 2, True) for d in ids[:4]])
    s.publish_streams(a, claims=[StreamClaim(d, 1, d % 2 == 0) for d in ids[4:]])
    version = s.fleet_version()
    sync = s.publish_streams(a, claims=[StreamClaim(ids[0], 3, True)],
                             availability={d: True for d in ids[1:8]}, released=ids[8:])
    assert sync.displaced == set(ids[1:4]) and s.fleet_version() == version + 1
    assert s.available_by_replica() == {"replica-a": [(ids[0], 3), *((d, 1) for d in ids[4:8])],
                                        "replica-b": [(d, 2) for d in ids[1:4]]}
    assert all(s.stream_owner(d) is None for d in ids[8:])
    with pytest.raises(NotFoundError):  # the unknown device is in the last slice
        s.publish_streams(a, claims=[StreamClaim(d, 4, True) for d in [*ids[:7], ids[-1] + 1]])
    assert s.stream_owner(ids[1]) == StreamOwner("replica-b", 2, True) and s.fleet_version() == version + 1


def test_requests_no_membership_can_have_are_refused() -> None:
    s = InMemoryStore()
    joins: list[tuple[str, float, dict[str, Any]]] = [
        ("", 5.0, {}), ("x" * 256, 5.0, {}), ("a", 0.0, {}), ("a", 3601.0, {}),
        ("a", 5.0, {"settings_digest": "x" * 65}), ("a", 5.0, {"device_address": ""}),
        ("a", 5.0, {"admin_address": "x" * 256}), ("a", 5.0, {"renewing": Lease("b", 1, 5.0)}),
    ]
    for name, seconds, kwargs in joins:
        with pytest.raises(InvalidRecordError):
            s.join_tier(name, seconds, **{"settings_digest": "", **kwargs})
    claims: list[tuple[Any, Any, Any]] = [(0, 1, True), (1, 2**63, True), (1, 1, 1), (True, 1, True)]
    for bad_claim in claims:
        with pytest.raises(InvalidRecordError):
            StreamClaim(*bad_claim)
    assert s.live_replicas() == [] and s.fleet_version() == 0


def test_racing_first_joins_of_one_name_get_one_term(backend: Backend) -> None:
    s = backend.store
    won: list[Lease] = []
    start = threading.Barrier(4)

    def race() -> None:
        start.wait()
        got = s.join_tier("replica-a", LONG, settings_digest="")
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and won[0].token == 1


# ------------------------------------------------------------ concurrency
CLAIMERS_EACH = 4
PUBLISHES_EACH = 12
DEVICES = 24


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_replicas_claiming_the_same_devices_at_once_leave_one_owner_each(backend: Backend) -> None:
    """Two replicas, each with several threads (each its own store on the
    database, as separate processes would), claim overlapping sets of the
    same devices at once. Afterwards every claimed device has exactly one
    row naming one of them under its term; every publish wrote all its
    claims with one claim number, no two publishes shared one, and the
    fleet counter counted every publish; each replica, naming every device
    it claimed, is told exactly the ones the other holds."""
    main = backend.store
    ids = devices(main, DEVICES)
    members = {name: join(main, name) for name in ("replica-a", "replica-b")}
    start_version = main.fleet_version()
    stores: list[Store] = []
    errors: list[BaseException] = []
    claimed: dict[str, set[int]] = {name: set() for name in members}
    lock = threading.Lock()
    gate = threading.Barrier(2 * CLAIMERS_EACH)

    def claimer(name: str, t: int) -> Callable[[], None]:
        s = open_store(backend.url, migrate=False)
        stores.append(s)

        def run() -> None:
            try:
                gate.wait(30)
                for i in range(PUBLISHES_EACH):
                    key = publish_key(name, t, i)
                    chosen = [d for j, d in enumerate(ids) if (j + t + i) % 3 != 0]  # two thirds, shifting
                    s.publish_streams(members[name], claims=[StreamClaim(d, key, True) for d in chosen])
                    with lock:
                        claimed[name].update(chosen)
            except BaseException as exc:  # noqa: BLE001 - collected and asserted on
                errors.append(exc)

        return run

    threads = [threading.Thread(target=claimer(name, t)) for name in members for t in range(CLAIMERS_EACH)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(100)
        assert not any(th.is_alive() for th in threads), "a thread is stuck"
    finally:
        for st in stores:
            st.close()
    assert errors == [], f"{len(errors)} failed publishes, first: {errors[0]!r}"

    with backend.engine.connect() as conn:
        rows = conn.execute(text("SELECT device_id, replica, replica_token, session_key, claim FROM device_streams"
                                 " ORDER BY device_id")).all()
        per_device = conn.execute(text("SELECT count(*) FROM device_streams GROUP BY device_id")).scalars().all()
    assert sorted(r.device_id for r in rows) == ids and set(per_device) == {1}
    claim_of_publish: dict[int, set[int]] = {}
    for r in rows:
        assert r.replica in members and r.replica_token == members[r.replica].token
        assert r.session_key // 10_000 == (1 if r.replica == "replica-a" else 2)
        claim_of_publish.setdefault(r.session_key, set()).add(r.claim)
    assert all(len(claims) == 1 for claims in claim_of_publish.values()), "one publish, two claim numbers"
    assert len({c for claims in claim_of_publish.values() for c in claims}) == len(claim_of_publish)
    total = 2 * CLAIMERS_EACH * PUBLISHES_EACH  # every publish claims under a fresh key: every one changes rows
    assert main.fleet_version() == start_version + total
    assert all(start_version < r.claim <= start_version + total for r in rows)
    owners = {d: main.stream_owner(d) for d in ids}
    for name, member in members.items():
        others = {d for d, o in owners.items() if o is not None and o.replica != name}
        assert main.publish_streams(member, availability=dict.fromkeys(claimed[name], True)).displaced == (
            others & claimed[name])


def publish_key(name: str, thread: int, i: int) -> int:
    """A session key naming one publish: 1xxxx for replica-a, 2xxxx for replica-b."""
    return (1 if name == "replica-a" else 2) * 10_000 + thread * 100 + i


def test_stream_counts_count_each_live_replica_s_running_streams(backend: Backend) -> None:
    s = backend.store
    [d1, d2, d3, d4] = devices(s, 4)
    assert s.stream_counts() == {}
    a = join(s, "replica-a")
    b = join(s, "replica-b")
    assert s.stream_counts() == {"replica-a": (0, 0), "replica-b": (0, 0)}
    s.publish_streams(a, claims=[StreamClaim(d1, 1, True), StreamClaim(d2, 2, False), StreamClaim(d3, 3, True)])
    s.publish_streams(b, claims=[StreamClaim(d4, 4, False)])
    assert s.stream_counts() == {"replica-a": (3, 2), "replica-b": (1, 0)}
    s.publish_streams(b, claims=[StreamClaim(d3, 5, True)])  # b takes d3 over
    assert s.stream_counts() == {"replica-a": (2, 1), "replica-b": (2, 1)}
    s.leave_tier(a)  # a's term is over: its rows count for nobody
    assert s.stream_counts() == {"replica-b": (2, 1)}
    short = s.join_tier("replica-c", SHORT, settings_digest="d" * 64)
    assert short is not None
    s.publish_streams(short, claims=[StreamClaim(d1, 6, True)])
    assert s.stream_counts()["replica-c"] == (1, 1)
    time.sleep(PAST_SHORT)  # c's term expired
    assert s.stream_counts() == {"replica-b": (2, 1)}
