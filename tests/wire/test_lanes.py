"""wire/lanes.py: urgent items overtake bulk ones, each lane stays FIFO.

A property test against an independent oracle: two plain lists, and a get
takes the head of the urgent one when it is not empty.
"""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from fedmask_proto.v1 import session_pb2
from wire.lanes import LaneQueue

# an operation: ("put", value, urgent) or ("get",)
ops = st.lists(st.one_of(st.tuples(st.just("put"), st.integers(), st.booleans()), st.just(("get",))), max_size=60)


@given(ops)
def test_gets_follow_the_two_lane_oracle(script: list[tuple]) -> None:
    async def run() -> None:
        q: LaneQueue[tuple[int, bool]] = LaneQueue(lambda item: item[1])
        urgent: list[tuple[int, bool]] = []
        bulk: list[tuple[int, bool]] = []
        for op in script:
            if op[0] == "put":
                item = (op[1], op[2])
                q.put_nowait(item)
                (urgent if op[2] else bulk).append(item)
            elif urgent or bulk:
                expected = urgent.pop(0) if urgent else bulk.pop(0)
                assert await q.get() == expected
            else:
                assert q.empty()
            assert q.qsize() == len(urgent) + len(bulk)
        assert list(q._queue) == urgent + bulk  # the repr's order is the leaving order

    asyncio.run(run())


def test_a_waiting_getter_receives_an_urgent_item_put_later() -> None:
    async def run() -> None:
        q: LaneQueue[int] = LaneQueue(lambda x: x < 0)
        getter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        q.put_nowait(-1)
        assert await asyncio.wait_for(getter, 1) == -1

    asyncio.run(run())


def test_the_client_outbox_lets_a_top_k_answer_overtake_masked_inputs() -> None:
    from edge_client.session import new_outbox

    async def run() -> None:
        box = new_outbox()
        for i in range(3):
            box.put_nowait(session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=i)))
        box.put_nowait(session_pb2.ClientMessage(device_response=session_pb2.DeviceResponse(correlation_id="c")))
        first = await box.get()
        assert first.WhichOneof("message") == "device_response"
        assert [(await box.get()).heartbeat.sequence for _ in range(3)] == [0, 1, 2]

    asyncio.run(run())
