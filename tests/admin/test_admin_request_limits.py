"""The pure parts of the admin service's request limits (D82): the body
rule of the request gate, the event-stream slots, the refusal audit's
rate, the settings' checks, and the coordinator's check of a reported
refusal. The limits over a real `fedmask admin` process are in
tests/integration/test_security_admin_limits.py."""

from __future__ import annotations

import asyncio

import pytest

from admin.auth import Principal
from admin.refusal_audit import RefusalAudit
from admin.request_gate import declared_body_refusal, declares_body
from admin.settings import AdminSettings, EventStreamSlots, Role, SettingsError
from admin.stream_slots import Slot, SlotRefusal, StreamSlots
from coordinator.credential_watch import end_when_withdrawn, recheck_interval_s, token_file_interval_s
from coordinator.errors import InvalidArgument
from coordinator.operator_actions import check_refusal


@pytest.mark.parametrize(("headers", "limit", "refused"), [
    ([], 0, False),
    ([(b"content-length", b"0")], 0, False),
    ([(b"content-length", b"1")], 0, True),
    ([(b"transfer-encoding", b"chunked")], 0, True),
    ([(b"transfer-encoding", b"chunked")], 100, False),  # counted as it arrives
    ([(b"content-length", b"100")], 100, False),
    ([(b"content-length", b"101")], 100, True),
    ([(b"content-length", b"2e9")], 100, True),
])
def test_a_declared_body_is_refused_before_it_is_read(headers: list[tuple[bytes, bytes]], limit: int,
                                                      refused: bool) -> None:
    assert (declared_body_refusal(headers, limit) is not None) is refused


@pytest.mark.parametrize(("headers", "body"), [
    ([], False), ([(b"content-length", b"0")], False), ([(b"content-length", b"3")], True),
    ([(b"transfer-encoding", b"chunked")], True),
])
def test_only_a_request_with_a_body_is_matched_against_every_route(headers: list[tuple[bytes, bytes]],
                                                                    body: bool) -> None:
    assert declares_body(headers) is body


def who(name: str, role: Role = Role.VIEWER) -> Principal:
    return Principal(name, role)


def test_a_token_holds_its_share_and_operators_keep_their_reserve() -> None:
    slots = StreamSlots(EventStreamSlots(max_streams=6, per_token=2, operator_reserved=2))
    a = [slots.acquire(who("a")) for _ in range(3)]
    assert isinstance(a[0], Slot) and isinstance(a[1], Slot)
    assert isinstance(a[2], SlotRefusal) and a[2].status == 429
    b = [slots.acquire(who("b")) for _ in range(2)]
    assert all(isinstance(s, Slot) for s in b)
    c = slots.acquire(who("c"))  # 4 = 6 - 2 taken by viewers: the rest is the operators'
    assert isinstance(c, SlotRefusal) and c.status == 503 and "reserved for operators" in c.detail
    ops = [slots.acquire(who("ops", Role.OPERATOR)) for _ in range(2)]
    assert all(isinstance(s, Slot) for s in ops) and slots.open == 6
    full = slots.acquire(who("ops2", Role.OPERATOR))
    assert isinstance(full, SlotRefusal) and full.status == 503
    first = a[0]
    assert isinstance(first, Slot)
    first.release()
    first.release()  # idempotent
    assert slots.open == 5 and slots.open_to_others == 3 and slots.held_by("a") == 1
    assert isinstance(slots.acquire(who("c")), Slot)


def test_refusal_audits_are_rate_limited_per_token() -> None:
    now = [0.0]
    sent: list[tuple[str, int]] = []

    async def record(operator: str, action: str, reason: str, role: str, suppressed: int) -> int:
        sent.append((operator, suppressed))
        return len(sent)

    audit = RefusalAudit(record, per_minute=3, clock=lambda: now[0])
    assert [audit.take("v") for _ in range(5)] == [0, 0, 0, None, None]
    assert audit.take("other") == 0  # per token
    now[0] = 20.0  # one token back after 60 / 3 s
    assert audit.take("v") == 2 and audit.take("v") is None

    async def flow() -> None:
        audit.refused(who("w"), "pause", "role 'viewer' may not use this route")
        await audit.drain()

    asyncio.run(flow())
    assert sent == [("w", 0)]


def test_a_failed_refusal_audit_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def record(*_: object) -> int:
        raise ConnectionError("coordinator down")

    async def flow() -> None:
        audit = RefusalAudit(record, per_minute=1)
        audit.refused(who("w"), "pause", "no")
        await audit.drain()

    asyncio.run(flow())
    assert "could not audit the refused pause of w" in caplog.text


@pytest.mark.parametrize(("values", "message"), [
    ({"event_streams": {"max_streams": 4, "operator_reserved": 4}}, "operator_reserved must be below"),
    ({"event_streams": {"max_streams": 4, "per_token": 5, "operator_reserved": 1}}, "per_token must not exceed"),
    ({"limits": {"max_connections": 90}}, "limits.max_connections (90) must exceed"),
    ({"limits": {"request_timeout_s": 5}}, "limits.request_timeout_s (5) must exceed"),
    ({"limits": {"max_body_bytes": 10}}, "FEDMASK_ADMIN_LIMITS__MAX_BODY_BYTES"),
])
def test_the_limits_are_checked_when_the_settings_load(values: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        AdminSettings.load(overrides={f"{group}.{k}": v for group, kv in values.items() for k, v in kv.items()})
    assert message in str(err.value)


def test_the_limits_have_defaults() -> None:
    s = AdminSettings.load()
    assert s.limits.max_header_bytes == s.limits.max_body_bytes == 16 * 1024
    assert (s.event_streams.max_streams, s.event_streams.per_token, s.event_streams.operator_reserved) == (32, 4, 4)


@pytest.mark.parametrize(("operator", "action", "reason", "role"), [
    ("", "pause", "no", "viewer"),
    ("v", "Pause!", "no", "viewer"),
    ("v", "pause", "", "viewer"),
    ("v", "pause", "x" * 1025, "viewer"),
    ("v", "pause", "line\nbreak", "viewer"),
    ("v", "pause", "no", "r" * 65),
])
def test_a_malformed_refusal_report_is_invalid(operator: str, action: str, reason: str, role: str) -> None:
    with pytest.raises(InvalidArgument):
        check_refusal(operator, action, reason, role)
    check_refusal("viewer-1", "abort_round", "role 'viewer' may not use this route", "viewer")


def test_a_stream_ends_once_its_token_is_withdrawn() -> None:
    accepted = {"yes"}
    ended: list[float] = []

    async def flow() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(end_when_withdrawn(lambda md: md in accepted, "yes", 0.05,
                                                      lambda: ended.append(loop.time())))
        await asyncio.sleep(0.2)
        assert not ended
        accepted.clear()
        await asyncio.wait_for(task, 1)

    asyncio.run(flow())
    assert len(ended) == 1
    # the token files are re-read within a quarter interval and streams checked every half: within one interval
    assert recheck_interval_s(10) + token_file_interval_s(10) < 10
    assert recheck_interval_s(1) + token_file_interval_s(1) < 1
