"""Requests relayed to devices over their session stream: the pending-request
registry and the top-k codec (coordinator/relay.py), then
`DeviceRelay.request_top_k` (coordinator/device_relay.py, the `Coordinator`'s
relay) on in-memory sessions (no gRPC: the servicer's receive loop is
`coordinator.handle`, its stream end `close_session`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest

from coordinator.errors import (
    DeviceAnswerError,
    DeviceDisconnected,
    DeviceNotConnected,
    DeviceTimeout,
    InvalidArgument,
    InvalidDeviceAnswer,
    Unavailable,
    UnknownDevice,
)
from coordinator.logs import LOGGER_NAME
from coordinator.model_host import SyntheticModel
from coordinator.relay import (
    PendingRequests,
    TopKAnswer,
    check_top_k,
    device_error_code,
    top_k_answer,
    top_k_request,
)
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import InMemoryStore
from coordinator_fakes import identity_private, signed_enroll_request
from fedmask_proto.v1 import enrollment_pb2, session_pb2
from secagg import identity
from wire.possession import session_payload
from wire.protocol import PROTOCOL_VERSION

S = session_pb2


def run(coro):
    return asyncio.run(coro)


def top_k_response(cid: str, device: int, items, scores=(), version: int = 3,
                   seen_excluded: bool | None = None) -> S.DeviceResponse:
    """A TopKResult; `scores` as a device built before D84 sent them, `seen_excluded` None: not said."""
    result = S.TopKResult(item_ids=items, scores=scores, model_version=version)
    if seen_excluded is not None:
        result.seen_excluded = seen_excluded
    return S.DeviceResponse(correlation_id=cid, device_id=device, top_k=result)


def error_response(cid: str, device: int, code: S.DeviceErrorCode.ValueType, message: str = "") -> S.DeviceResponse:
    return S.DeviceResponse(correlation_id=cid, device_id=device, error=S.DeviceError(code=code, message=message))


# ============================================================ the registry


def test_resolve_hands_the_answer_to_its_request() -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        assert p.correlation_id in reg and len(reg) == 1
        waiter = asyncio.create_task(reg.wait(p, 5.0))
        await asyncio.sleep(0)
        answer = top_k_response(p.correlation_id, 7, [2, 1], [0.9, 0.5])
        assert reg.resolve(1, answer) is True
        assert await waiter == answer
        assert len(reg) == 0

    run(main())


def test_correlation_ids_are_unique_even_with_a_constant_token_source() -> None:
    async def main() -> None:
        reg = PendingRequests(token=lambda n: b"\x00" * n)
        ids = {reg.open(1, d, "top_k").correlation_id for d in range(50)}
        assert len(ids) == 50

    run(main())


def test_timeout_raises_and_forgets_the_request() -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        with pytest.raises(DeviceTimeout, match="device 7 did not answer within 0.05 s") as info:
            await reg.wait(p, 0.05)
        assert info.value.device_id == 7 and info.value.timeout_s == 0.05
        assert len(reg) == 0 and p.future.cancelled()

    run(main())


def test_a_late_answer_after_the_timeout_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        with pytest.raises(DeviceTimeout):
            await reg.wait(p, 0.01)
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            assert reg.resolve(1, top_k_response(p.correlation_id, 7, [1], [0.5])) is False
        assert "event=device_response_unmatched" in caplog.text

    run(main())


def test_stream_close_fails_only_that_streams_pending_requests() -> None:
    async def main() -> None:
        reg = PendingRequests()
        a1, a2 = reg.open(1, 7, "top_k"), reg.open(1, 8, "top_k")
        b = reg.open(2, 9, "top_k")
        waiters = [asyncio.create_task(reg.wait(p, 5.0)) for p in (a1, a2, b)]
        await asyncio.sleep(0)
        assert reg.fail_session(1, "client closed the stream") == 2
        for w, device in zip(waiters[:2], (7, 8), strict=True):
            with pytest.raises(DeviceDisconnected, match=f"device {device} is not connected: .*client closed") as info:
                await w
            assert isinstance(info.value, DeviceNotConnected) and info.value.device_id == device
        assert len(reg) == 1 and not waiters[2].done()
        assert reg.fail_session(1, "again") == 0  # nothing leaks, nothing is failed twice
        assert reg.fail_all("coordinator shutting down") == 1
        with pytest.raises(DeviceDisconnected, match="coordinator shutting down"):
            await waiters[2]
        assert len(reg) == 0

    run(main())


def test_unknown_correlation_id_is_ignored_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            assert reg.resolve(1, top_k_response("no-such-id", 7, [1], [0.5])) is False
        assert "event=device_response_unmatched" in caplog.text and "correlation=no-such-id" in caplog.text
        assert p.correlation_id in reg and not p.future.done()

    run(main())


def test_an_answer_from_another_stream_or_for_another_device_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            assert reg.resolve(2, top_k_response(p.correlation_id, 7, [1], [0.5])) is False
            assert reg.resolve(1, top_k_response(p.correlation_id, 8, [1], [0.5])) is False
        assert caplog.text.count("event=device_response_unmatched") == 2
        assert "went out on session 1" in caplog.text and "was for device 7" in caplog.text
        assert not p.future.done()
        assert reg.resolve(1, top_k_response(p.correlation_id, 7, [1], [0.5])) is True

    run(main())


def test_a_cancelled_caller_leaves_nothing_behind() -> None:
    async def main() -> None:
        reg = PendingRequests()
        p = reg.open(1, 7, "top_k")
        waiter = asyncio.create_task(reg.wait(p, 5.0))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(reg) == 0

    run(main())


def test_too_many_requests_in_flight_are_refused() -> None:
    async def main() -> None:
        reg = PendingRequests(max_pending=2)
        reg.open(1, 1, "top_k")
        reg.open(1, 2, "top_k")
        with pytest.raises(Unavailable, match="2 device requests in flight"):
            reg.open(1, 3, "top_k")

    run(main())


# ============================================================ the top-k codec


@pytest.mark.parametrize("k, n_items, timeout, match", [
    (0, 10, 1.0, "k must be an integer in 1..10"),
    (11, 10, 1.0, "k must be an integer in 1..10"),
    (2.0, 10, 1.0, "k must be an integer"),
    (True, 10, 1.0, "k must be an integer"),
    (3, None, 1.0, "need a recommender model"),
    (3, 10, 0.0, "timeout_s"),
    (3, 10, float("inf"), "timeout_s"),
    (3, 10, 301.0, "timeout_s"),
])
def test_check_top_k_refuses(k, n_items, timeout, match) -> None:
    with pytest.raises(InvalidArgument, match=match):
        check_top_k(k, n_items=n_items, max_k=100, timeout_s=timeout)


def test_check_top_k_accepts_up_to_the_catalogue_or_the_cap() -> None:
    check_top_k(1, n_items=10, max_k=100, timeout_s=0.5)
    check_top_k(10, n_items=10, max_k=100, timeout_s=300)
    check_top_k(100, n_items=1682, max_k=100, timeout_s=1)


def test_check_top_k_refuses_more_than_the_deployments_cap() -> None:
    # the catalogue allows 1682, the deployment 100 (admin.max_top_k, D84)
    with pytest.raises(InvalidArgument, match=r"1\.\.100 \(the model's 1682 items, at most 100"):
        check_top_k(101, n_items=1682, max_k=100, timeout_s=1)
    with pytest.raises(InvalidArgument, match=r"1\.\.5 "):
        check_top_k(6, n_items=1682, max_k=5, timeout_s=1)


def test_top_k_request_message() -> None:
    msg = top_k_request("5-ab", 7, k=4, exclude_seen=False, timeout_s=2.5)
    req = msg.device_request
    assert msg.WhichOneof("message") == "device_request" and req.WhichOneof("request") == "top_k"
    assert (req.correlation_id, req.device_id, req.top_k.k, req.top_k.exclude_seen) == ("5-ab", 7, 4, False)
    assert req.timeout.seconds == 2 and req.timeout.nanos == 500_000_000


def test_top_k_answer_accepts_a_valid_result() -> None:
    got = top_k_answer(top_k_response("c", 7, [4, 0, 9], version=12, seen_excluded=True), k=3, n_items=10,
                       exclude_seen=False)
    assert got == TopKAnswer(device_id=7, item_ids=(4, 0, 9), model_version=12, seen_excluded=True)
    empty = top_k_answer(top_k_response("c", 7, []), k=3, n_items=10, exclude_seen=True)  # fewer than k is allowed
    assert empty.item_ids == () and empty.seen_excluded is True


def test_top_k_answer_drops_the_scores_of_an_older_device() -> None:
    # a device built before D84 sends scores and no seen_excluded: checked, then dropped; it did as asked
    got = top_k_answer(top_k_response("c", 7, [4, 0, 9], [0.75, 0.75, -1.0], version=12), k=3, n_items=10,
                       exclude_seen=False)
    assert got == TopKAnswer(device_id=7, item_ids=(4, 0, 9), model_version=12, seen_excluded=False)
    assert not hasattr(got, "scores")


def test_top_k_answer_refuses_seen_items_kept_when_asked_to_leave_them_out() -> None:
    with pytest.raises(InvalidDeviceAnswer, match="says it kept them"):
        top_k_answer(top_k_response("c", 7, [1, 2], seen_excluded=False), k=3, n_items=10, exclude_seen=True)


def test_top_k_answer_raises_the_devices_error_code() -> None:
    with pytest.raises(DeviceAnswerError, match="device 7 answered not_ready: no trained model") as info:
        top_k_answer(error_response("c", 7, S.DEVICE_ERROR_CODE_NOT_READY, "no trained model"), k=3, n_items=10,
                     exclude_seen=True)
    assert info.value.code == "not_ready" and info.value.device_message == "no trained model"
    assert device_error_code(S.DEVICE_ERROR_CODE_UNKNOWN_DEVICE) == "unknown_device"
    assert device_error_code(99) == "code_99"


@pytest.mark.parametrize("response, why", [
    (S.DeviceResponse(correlation_id="c", device_id=7), "expected top_k"),
    (top_k_response("c", 7, [1, 2], [0.5]), "2 item ids but 1 scores"),
    (top_k_response("c", 7, [1, 2, 3, 4], [4, 3, 2, 1]), "4 items for k=3"),
    (top_k_response("c", 7, [1, 10], [0.5, 0.4]), "below 10"),
    (top_k_response("c", 7, [1, 1], [0.5, 0.4]), "distinct"),
    (top_k_response("c", 7, [1, 2], [0.4, 0.5]), "descending"),
    (top_k_response("c", 7, [1, 2], [float("nan"), 0.5]), "descending"),
    (S.DeviceResponse(correlation_id="c", device_id=7, top_k=S.TopKResult(
        item_ids=[1, 2], scores=[0.5, 0.4], dataset_item_ids=["11"])), "1 dataset_item_ids for 2 items"),
    (S.DeviceResponse(correlation_id="c", device_id=7, top_k=S.TopKResult(
        item_ids=[1], scores=[0.5], titles=["A"])), "titles without dataset_item_ids"),
    (S.DeviceResponse(correlation_id="c", device_id=7, top_k=S.TopKResult(
        item_ids=[1], scores=[0.5], dataset_item_ids=["x" * 513])), "longer than 512"),
])
def test_top_k_answer_refuses_a_broken_contract(response, why) -> None:
    with pytest.raises(InvalidDeviceAnswer, match=why):
        top_k_answer(response, k=3, n_items=10, exclude_seen=True)


# ============================================================ DeviceRelay.request_top_k


@dataclass
class CatalogueModel(SyntheticModel):
    """The synthetic model with a catalogue, so top-k queries are allowed."""

    items: int = 20

    @property
    def n_items(self) -> int:
        return self.items


def _settings() -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides={"database_url": "memory://", "model.name": "synthetic",
                                               "model.hyperparameters": {"vector_length": 4}})


async def _coordinator(model=None) -> tuple[Coordinator, list[int]]:
    coord = Coordinator(_settings(), store=InMemoryStore(), model=model or CatalogueModel(4))
    await coord.start()
    resp = await coord.enroll(signed_enroll_request(coord.enroll_challenge().challenge, list(KEYS.values()),
                                                    client_name="t"), client_id=None)
    return coord, [d.device_id for d in resp.devices]


#: Identity keys of the three enrolled devices (ids 1..3 on a fresh store).
KEYS = {i + 1: identity_private(i) for i in range(3)}


async def _session(coord: Coordinator, devices: list[int]):
    nonce = coord.session_nonce()
    proofs = [S.DeviceProof(device_id=d, signature=identity.sign(KEYS[d], session_payload(nonce, d)))
              for d in devices if d in KEYS]
    s = await coord.open_session(S.Hello(client_name="c", protocol_version=PROTOCOL_VERSION,
                                         available_device_ids=devices), nonce=nonce, proofs=proofs, client_id=None)
    first = s.outbox.get_nowait()
    assert isinstance(first, S.ServerMessage) and first.WhichOneof("message") == "welcome"
    return s


async def _next_request(session) -> S.DeviceRequest:
    msg = await asyncio.wait_for(session.outbox.get(), 5)
    assert msg.WhichOneof("message") == "device_request", msg
    return msg.device_request


def test_request_top_k_goes_to_the_stream_hosting_the_device(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        coord, (d1, d2, _d3) = await _coordinator()
        s1, s2 = await _session(coord, [d1]), await _session(coord, [d2])
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            call = asyncio.create_task(coord.relay.request_top_k(d2, 3, exclude_seen=True, timeout_s=5))
            req = await _next_request(s2)
            assert s1.outbox.empty()
            assert (req.device_id, req.top_k.k, req.top_k.exclude_seen) == (d2, 3, True)
            await coord.handle(s2, S.ClientMessage(device_response=top_k_response(
                req.correlation_id, d2, [5, 2, 11], version=1, seen_excluded=True)))
            answer = await call
        assert answer == TopKAnswer(device_id=d2, item_ids=(5, 2, 11), model_version=1, seen_excluded=True)
        assert "event=device_request" in caplog.text and "outcome=ok" in caplog.text
        assert len(coord.relay) == 0
        await coord.shutdown()

    run(main())


def test_k_out_of_range_is_refused_before_anything_is_sent() -> None:
    async def main() -> None:
        coord, (d1, _, _) = await _coordinator()
        s = await _session(coord, [d1])
        for k in (0, 21):
            with pytest.raises(InvalidArgument, match=r"1\.\.20"):
                await coord.relay.request_top_k(d1, k)
        assert s.outbox.empty() and len(coord.relay) == 0
        await coord.shutdown()

    run(main())


def test_the_deployments_cap_on_k_is_the_relays() -> None:
    async def main() -> None:
        settings = CoordinatorSettings.load(overrides={
            "database_url": "memory://", "model.name": "synthetic", "model.hyperparameters": {"vector_length": 4},
            "admin.max_top_k": 5})
        coord = Coordinator(settings, store=InMemoryStore(), model=CatalogueModel(4))
        await coord.start()
        try:
            assert coord.relay.max_k == 5
            with pytest.raises(InvalidArgument, match=r"1\.\.5 \(the model's 20 items, at most 5"):
                await coord.relay.request_top_k(1, 6)
            assert len(coord.relay) == 0
        finally:
            await coord.shutdown()

    run(main())
    assert CoordinatorSettings.load(overrides={"database_url": "memory://"}).admin.max_top_k == 100


def test_a_model_without_items_refuses_top_k() -> None:
    async def main() -> None:
        coord, (d1, _, _) = await _coordinator(SyntheticModel(4))
        await _session(coord, [d1])
        with pytest.raises(InvalidArgument, match="recommender model"):
            await coord.relay.request_top_k(d1, 1)
        await coord.shutdown()

    run(main())


def test_unknown_and_unconnected_devices_are_told_apart() -> None:
    async def main() -> None:
        coord, (d1, d2, _) = await _coordinator()
        await _session(coord, [d1])
        with pytest.raises(UnknownDevice, match="device 999 is not connected: no such enrolled device"):
            await coord.relay.request_top_k(999, 3)
        with pytest.raises(DeviceNotConnected, match=f"device {d2} is not connected: no open session") as info:
            await coord.relay.request_top_k(d2, 3)
        assert not isinstance(info.value, UnknownDevice)
        await coord.shutdown()

    run(main())


def test_the_stream_closing_fails_the_pending_request() -> None:
    async def main() -> None:
        coord, (d1, _, _) = await _coordinator()
        s = await _session(coord, [d1])
        call = asyncio.create_task(coord.relay.request_top_k(d1, 3, timeout_s=30))
        await _next_request(s)
        coord.close_session(s, "client closed the stream")
        with pytest.raises(DeviceDisconnected, match="client closed the stream"):
            await asyncio.wait_for(call, 5)
        assert len(coord.relay) == 0
        with pytest.raises(DeviceNotConnected):  # and the next one is not sent at all
            await coord.relay.request_top_k(d1, 3)
        await coord.shutdown()

    run(main())


def test_shutdown_fails_pending_requests_and_refuses_new_ones() -> None:
    async def main() -> None:
        coord, (d1, _, _) = await _coordinator()
        s = await _session(coord, [d1])
        call = asyncio.create_task(coord.relay.request_top_k(d1, 3, timeout_s=30))
        await _next_request(s)
        await coord.shutdown()
        with pytest.raises(DeviceDisconnected, match="coordinator shutting down"):
            await asyncio.wait_for(call, 5)
        with pytest.raises(Unavailable):
            await coord.relay.request_top_k(d1, 3)

    run(main())


def test_device_error_timeout_and_late_answer(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        coord, (d1, _, _) = await _coordinator()
        s = await _session(coord, [d1])
        call = asyncio.create_task(coord.relay.request_top_k(d1, 3))
        req = await _next_request(s)
        await coord.handle(s, S.ClientMessage(device_response=error_response(
            req.correlation_id, d1, S.DEVICE_ERROR_CODE_NOT_READY, "no trained model on this device yet")))
        with pytest.raises(DeviceAnswerError, match="not_ready") as info:
            await call
        assert info.value.code == "not_ready"

        call = asyncio.create_task(coord.relay.request_top_k(d1, 3, timeout_s=0.05))
        req = await _next_request(s)
        with pytest.raises(DeviceTimeout):
            await call
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):  # the late answer: logged, dropped, stream goes on
            await coord.handle(s, S.ClientMessage(device_response=top_k_response(req.correlation_id, d1, [1], [0.5])))
        assert "event=device_response_unmatched" in caplog.text and not s.closed

        call = asyncio.create_task(coord.relay.request_top_k(d1, 2))
        req = await _next_request(s)
        await coord.handle(s, S.ClientMessage(device_response=top_k_response(req.correlation_id, d1, [1, 2], [0, 1])))
        with pytest.raises(InvalidDeviceAnswer, match="descending"):
            await call
        assert not s.closed and len(coord.relay) == 0
        await coord.shutdown()

    run(main())
