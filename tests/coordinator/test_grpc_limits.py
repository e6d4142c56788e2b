"""Each limit of `settings.limits` over real gRPC against an in-process
coordinator (127.0.0.1): the Hello deadline, the stream caps, the per-peer
rates of Enroll and new streams, the per-stream rate of control messages,
the cap on announced devices, the rate of store look-ups of unknown ids;
and what a peer's strings do to the log and to status details."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import test_grpc_end_to_end as e2e
from coordinator.store import InMemoryStore
from coordinator_fakes import FakeClient, FakeDevice, enroll, identity_private
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2, session_pb2
from secagg import identity
from wire.possession import session_payload
from wire.protocol import PROTOCOL_VERSION, RETRY_PUSHBACK_KEY

RE = grpc.StatusCode.RESOURCE_EXHAUSTED
PUSHBACK = RETRY_PUSHBACK_KEY


def settings(**limits: object):
    return e2e.make_settings(rounds=None, **{f"limits.{k}": v for k, v in limits.items()})


class Stream:
    """A raw Session stream: sends the first of `first` (the Hello), answers
    the SessionChallenge with proofs by `keys` (device id -> identity key;
    none by default, which proves nothing), then sends the rest of `first`
    and what `send` puts, until `close()` (a half-close); `outcome` ends
    with (code, details, trailing metadata as a dict, messages received
    after the challenge)."""

    def __init__(self, stub: coordinator_service_pb2_grpc.CoordinatorServiceStub,
                 *first: session_pb2.ClientMessage, keys: dict[int, Any] | None = None,
                 answer_challenge: bool = True) -> None:
        self.queue: asyncio.Queue[session_pb2.ClientMessage | None] = asyncio.Queue()
        if first:
            self.queue.put_nowait(first[0])
        self.after_challenge = list(first[1:])
        self.keys = keys or {}
        self.answer_challenge = answer_challenge
        self.nonce = b""
        self.received: list[session_pb2.ServerMessage] = []
        self.first = asyncio.Event()
        self.call = stub.Session(self._requests())
        self.outcome = asyncio.create_task(self._run())

    async def _requests(self) -> AsyncIterator[session_pb2.ClientMessage]:
        while (m := await self.queue.get()) is not None:
            yield m

    async def _run(self) -> tuple[grpc.StatusCode, str, dict[str, str], list[session_pb2.ServerMessage]]:
        try:
            async for m in self.call:
                if m.WhichOneof("message") == "challenge":
                    self.nonce = nonce = bytes(m.challenge.nonce)
                    if not self.answer_challenge:
                        continue
                    self.send(session_pb2.ClientMessage(proof=session_pb2.DeviceProofs(proofs=[
                        session_pb2.DeviceProof(device_id=d, signature=identity.sign(k, session_payload(nonce, d)))
                        for d, k in self.keys.items()])))
                    for later in self.after_challenge:
                        self.send(later)
                    continue
                self.received.append(m)
                self.first.set()
            return grpc.StatusCode.OK, "", {}, self.received
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or "", dict(err.trailing_metadata() or ()), self.received
        finally:
            self.first.set()

    def send(self, m: session_pb2.ClientMessage) -> None:
        self.queue.put_nowait(m)

    def close(self) -> None:
        self.queue.put_nowait(None)

    async def result(self, timeout: float = 10.0):
        return await asyncio.wait_for(asyncio.shield(self.outcome), timeout)

    async def welcomed(self, timeout: float = 5.0) -> bool:
        await asyncio.wait_for(self.first.wait(), timeout)
        return bool(self.received) and self.received[0].WhichOneof("message") == "welcome"


def hello(*ids: int, version: str = PROTOCOL_VERSION, name: str = "t") -> session_pb2.ClientMessage:
    return session_pb2.ClientMessage(hello=session_pb2.Hello(client_name=name, protocol_version=version,
                                                             available_device_ids=list(ids)))


def check_in(*ids: int) -> session_pb2.ClientMessage:
    return session_pb2.ClientMessage(check_in=session_pb2.CheckIn(available_device_ids=list(ids)))


def heartbeat(seq: int) -> session_pb2.ClientMessage:
    return session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=seq))


@contextlib.asynccontextmanager
async def stub_for(target: str):
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        yield coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)


async def _until(pred, timeout: float = 5.0, step: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(step)


def test_a_stream_without_hello_is_ended_and_frees_its_slot():
    async def main():
        async with e2e.running(settings(hello_timeout_s=0.3, max_streams=2, max_streams_per_peer=2)) as (
                coord, target, store, rounds):
            (dev, _), = await enroll(target, 1)
            async with stub_for(target) as stub:
                t0 = time.monotonic()
                idle = [Stream(stub), Stream(stub)]
                for s in idle:
                    code, details, _, got = await s.result(5)
                    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no Hello within 0.3 s" in details
                    assert got == []
                assert time.monotonic() - t0 < 3
                ok = Stream(stub, hello(dev))  # both slots are free again
                assert await ok.welcomed()
                ok.close()
                assert (await ok.result())[0] == grpc.StatusCode.OK
                # the SessionChallenge shares the Hello's deadline: no proofs in time, no session
                mute = Stream(stub, hello(dev), answer_challenge=False)
                code, details, _, got = await mute.result(5)
                assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no DeviceProofs within 0.3 s" in details
                assert got == []
            assert not rounds.done()

    asyncio.run(main())


def test_the_stream_cap_counts_streams_before_hello_and_refuses_the_next():
    async def main():
        cap = 4
        async with e2e.running(settings(max_streams=cap, max_streams_per_peer=cap, hello_timeout_s=15.0)) as (
                coord, target, store, rounds):
            (dev, _), = await enroll(target, 1)
            async with stub_for(target) as stub:
                idle = [Stream(stub) for _ in range(cap)]  # never say Hello
                for s in idle:  # the server sends initial metadata once a stream holds a slot
                    await asyncio.wait_for(s.call.initial_metadata(), 5)
                refused = await Stream(stub, hello(dev)).result()
                code, details, trailer, _ = refused
                assert code == RE and f"{cap} open streams (at most {cap})" in details and "retry in" in details
                assert int(trailer[PUSHBACK]) > 0
                assert all(not s.outcome.done() for s in idle)  # the idle ones are still open
                idle[0].close()  # one leaves: the next one gets in
                assert (await idle[0].result())[0] == grpc.StatusCode.OK
                ok = Stream(stub, hello(dev))
                assert await ok.welcomed()
                for s in [ok, *idle[1:]]:
                    s.close()
                    await s.result()
            assert not rounds.done()

    asyncio.run(main())


def test_the_per_peer_stream_cap():
    async def main():
        async with e2e.running(settings(max_streams=50, max_streams_per_peer=2)) as (coord, target, store, rounds):
            enrolled = await enroll(target, 3)
            async with stub_for(target) as stub:
                a, b = Stream(stub, hello(enrolled[0][0])), Stream(stub, hello(enrolled[1][0]))
                assert await a.welcomed() and await b.welcomed()
                code, details, trailer, _ = await Stream(stub, hello(enrolled[2][0])).result()
                assert code == RE and "this peer has 2 open streams (at most 2)" in details and PUSHBACK in trailer
                for s in (a, b):
                    s.close()
                    await s.result()

    asyncio.run(main())


def test_new_streams_per_peer_are_rate_limited_with_a_retry_hint():
    async def main():
        async with e2e.running(settings(session_rate=0.5, session_burst=3)) as (coord, target, store, rounds):
            (dev, _), = await enroll(target, 1)
            async with stub_for(target) as stub:
                for _ in range(3):
                    s = Stream(stub, hello(dev))
                    assert await s.welcomed()
                    s.close()
                    await s.result()
                code, details, trailer, got = await Stream(stub, hello(dev)).result()
                assert code == RE and "too many new Session streams" in details and got == []
                assert 0 < int(trailer[PUSHBACK]) <= 2000 and "retry in" in details
            assert not rounds.done()

    asyncio.run(main())


def test_enroll_calls_per_peer_are_rate_limited_with_a_retry_hint():
    async def main():
        # an enrolment is two calls of one bucket (EnrollChallenge, Enroll)
        async with e2e.running(settings(enroll_rate=0.5, enroll_burst=4)) as (coord, target, store, rounds):
            await enroll(target, 1)
            await enroll(target, 1)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await enroll(target, 1)
            err = info.value
            assert err.code() == RE and "too many Enroll calls" in err.details()
            assert 0 < int(dict(err.trailing_metadata())[PUSHBACK]) <= 2000
            assert not rounds.done()

    asyncio.run(main())


def test_control_messages_per_stream_are_rate_limited():
    async def main():
        async with e2e.running(settings(message_rate=0.1, message_burst=5)) as (coord, target, store, rounds):
            (dev, _), = await enroll(target, 1)
            async with stub_for(target) as stub:
                s = Stream(stub, hello(dev))
                assert await s.welcomed()
                for i in range(5):  # the burst passes, each echoed
                    s.send(heartbeat(i))
                await _until(lambda: sum(m.WhichOneof("message") == "heartbeat" for m in s.received) == 5)
                # one more is over the rate (only one: a client write after the server ended the
                # stream makes grpc.aio report INTERNAL instead of the server's status, grpc#36066)
                s.send(heartbeat(100))
                code, details, trailer, got = await s.result()
                assert code == RE and "too many heartbeat messages" in details and int(trailer[PUSHBACK]) > 0
                assert sum(m.WhichOneof("message") == "heartbeat" for m in got) == 5
                assert coord.registry.sessions == {}  # the session is closed
                # another stream of the same peer is not affected
                other = Stream(stub, hello(dev), heartbeat(1))
                assert await other.welcomed()
                other.close()
                await other.result()
            assert not rounds.done()

    asyncio.run(main())


def test_a_hello_or_check_in_announcing_too_many_devices_is_refused():
    async def main():
        async with e2e.running(settings(max_announced_devices=5)) as (coord, target, store, rounds):
            enrolled = await enroll(target, 2)
            ids = [d for d, _ in enrolled]
            async with stub_for(target) as stub:
                code, details, _, got = await Stream(stub, hello(*range(1000, 1006))).result()
                assert code == RE and "6 devices announced in one message (at most 5" in details and got == []
                ok = Stream(stub, hello(*ids, 1000, 1001, 1002))  # 5 is fine
                assert await ok.welcomed()
                ok.send(check_in(*ids, 1000, 1001, 1002, 1003))
                code, details, _, _ = await ok.result()
                assert code == RE and "6 devices announced" in details
            assert coord.eligible() == []
            assert not rounds.done()

    asyncio.run(main())


class CountingStore(InMemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.lists = 0

    def get_device(self, device_id):
        self.gets += 1
        return super().get_device(device_id)

    def list_devices(self, *, status=None):
        self.lists += 1
        return super().list_devices(status=status)


def test_unknown_ids_are_looked_up_at_most_once_per_interval_and_capped():
    async def main():
        store = CountingStore()
        s = settings(device_lookup_interval_s=0.5, max_device_lookups=50)
        async with e2e.running(s, store) as (coord, target, _, rounds):
            (dev, key), = await enroll(target, 1)
            lists_at_start = store.lists
            async with stub_for(target) as stub:
                c = Stream(stub, hello(dev, *range(10_000, 12_000)), keys={dev: key})  # 2000 unknown: one look-up of 50
                assert await c.welcomed()
                assert store.gets == 50 and coord.registry.lookups == 1
                for _ in range(10):  # within the interval: no look-up at all
                    c.send(check_in(dev, *range(20_000, 21_000)))
                await _until(lambda: sum(m.WhichOneof("message") == "check_in_ack" for m in c.received) == 10)
                assert store.gets == 50 and coord.registry.lookups == 1
                # a device enrolled in the store by another path is found by the next allowed look-up
                other = identity_private(55)
                rec, _ = store.enroll_device(identity.public_bytes(other), local_id="out-of-band")
                await asyncio.sleep(0.55)
                c.send(session_pb2.ClientMessage(check_in=session_pb2.CheckIn(
                    available_device_ids=[dev, rec.id],
                    proofs=[session_pb2.DeviceProof(device_id=rec.id, signature=identity.sign(
                        other, session_payload(c.nonce, rec.id)))])))
                await _until(lambda: sum(m.WhichOneof("message") == "check_in_ack" for m in c.received) == 11)
                ack = [m.check_in_ack for m in c.received if m.WhichOneof("message") == "check_in_ack"][-1]
                assert sorted(ack.accepted_device_ids) == sorted([dev, rec.id])
                assert coord.registry.lookups == 2 and store.gets == 51
                c.close()
                await c.result()
            assert store.lists == lists_at_start  # the device table is never reloaded whole

    asyncio.run(main())


def test_a_4_mib_protocol_version_grows_the_log_by_a_bounded_amount():
    async def main():
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        log = logging.getLogger("fedmask.coordinator")
        log.addHandler(handler)
        old_level = log.level
        log.setLevel(logging.INFO)
        try:
            big = "v" * (4 << 20)
            s = e2e.make_settings(rounds=None, max_receive_message_bytes=16 << 20)
            async with e2e.running(s) as (coord, target, store, rounds):
                (dev, _), = await enroll(target, 1)
                async with stub_for(target) as stub:
                    before = len(buf.getvalue())
                    for i in range(3):
                        line_breaker = f"\nevent=forged_{i} " + big
                        code, details, _, _ = await Stream(stub, hello(dev, version=line_breaker)).result()
                        assert code == grpc.StatusCode.FAILED_PRECONDITION and len(details) < 600
                        assert "\n" not in details
                    # a valid version with a 4 MiB client name is admitted, its name clipped
                    ok = Stream(stub, hello(dev, name="n\r" * (2 << 20)))
                    assert await ok.welcomed()
                    ok.close()
                    await ok.result()
                    grown = len(buf.getvalue()) - before
        finally:
            log.removeHandler(handler)
            log.setLevel(old_level)
        text = buf.getvalue()
        assert grown < 8_000, grown  # 3 x 4 MiB + 4 MiB sent; a few lines logged
        assert "event=forged" not in text.replace("\\nevent=forged", "")  # no line starts a forged event
        assert all(len(line) < 2_000 for line in text.splitlines())
        assert "\r" not in text and "client='n\\rn\\r" in text  # the name's carriage returns escaped

    asyncio.run(main())


def test_an_allowed_token_in_clear_is_a_warning_at_start(caplog: pytest.LogCaptureFixture):
    from coordinator.server import serve

    s = e2e.make_settings(**{"listen_address": "0.0.0.0:0", "debug.record_sums": False, "auth.mode": "token",
                             "auth.token": "t" * 20, "auth.allow_insecure_token": True})

    async def main():
        stop = asyncio.Event()
        return await serve(s, store=InMemoryStore(), stop=stop, on_ready=lambda c, port: stop.set(), grace=0.1)

    with caplog.at_level(logging.WARNING, logger="fedmask.coordinator"):
        assert asyncio.run(main()) == 0
    warnings = [r for r in caplog.records if "event=insecure_token_transport" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING and "in clear" in warnings[0].getMessage()
    assert "t" * 20 not in caplog.text
