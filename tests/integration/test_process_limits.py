"""The stream cap and the Hello deadline of a real `fedmask coordinator`
process (127.0.0.1), flooded with idle Session streams while honest edge
clients train.

Client A connects; then the test opens many streams that never say Hello:
the coordinator admits them up to `--max-streams` (each admitted stream
gets its initial metadata at once) and refuses the rest with
RESOURCE_EXHAUSTED, a retry hint and a bounded number of log lines; the
admitted ones are ended with DEADLINE_EXCEEDED after `--hello-timeout`.
Client B starts during the flood; once the idle streams are gone it gets
in, and the round over both clients' devices commits with the exact sum.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from fedmask_proto.v1 import coordinator_service_pb2_grpc
from integration_harness import (
    LOOPBACK,
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    events,
    free_port,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

L = 16
MAX_STREAMS = 10
FLOOD = 30
HELLO_TIMEOUT = 3.0


async def flood(target: str, n: int) -> list[tuple[grpc.StatusCode, str, dict[str, str], float]]:
    """Open n Session streams at once that never send anything; for each,
    the status it ended with, its details, trailers and seconds it lasted."""
    async with grpc.aio.insecure_channel(target) as ch:
        stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)
        never = asyncio.Event()

        async def silent():
            await never.wait()
            yield  # pragma: no cover - never reached

        async def one() -> tuple[grpc.StatusCode, str, dict[str, str], float]:
            t0 = time.monotonic()
            call = stub.Session(silent())
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or "", dict(err.trailing_metadata() or ()), time.monotonic() - t0
            return grpc.StatusCode.OK, "", {}, time.monotonic() - t0

        return list(await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 30))


def test_idle_streams_are_capped_and_timed_out_while_rounds_commit(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    target = f"{LOOPBACK}:{port}"
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="synthetic", model_params={"vector_length": L},
        cohort_size=4, cohort_minimum=4, over_selection=0.0, rounds=1, seed=1, selection_deadline=60,
        training_deadline=2.0, advertise_keys_deadline=5.0, share_keys_deadline=5.0, masked_input_deadline=5.0,
        unmasking_deadline=5.0, secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        debug_record_sums=True, max_streams=MAX_STREAMS, max_streams_per_peer=MAX_STREAMS,
        hello_timeout=HELLO_TIMEOUT,
    ))
    wait_serving(port, coord)
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = procs.start("client-a", client_args(port, "1-2", a_dir, dataset="synthetic", seed=2,
                                            debug_record_inputs=True, threads=1))
    wait_until(lambda: events(coord.log(), "session_opened"), 60, what="client A's session", watch=[coord, a])

    b = procs.start("client-b", client_args(port, "3-4", b_dir, dataset="synthetic", seed=2,
                                            debug_record_inputs=True, threads=1))
    results = asyncio.run(flood(target, FLOOD))
    admitted = [r for r in results if r[0] == grpc.StatusCode.DEADLINE_EXCEEDED]
    refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(admitted) + len(refused) == FLOOD, results
    # client A holds one slot (client B may have taken another meanwhile)
    assert MAX_STREAMS - 2 <= len(admitted) <= MAX_STREAMS - 1, results
    for _, details, _, lasted in admitted:
        assert f"no Hello within {HELLO_TIMEOUT:g} s" in details and lasted >= HELLO_TIMEOUT - 0.5
    for _, details, trailer, lasted in refused:  # refused at once, with a retry hint
        assert f"at most {MAX_STREAMS}" in details and int(trailer["grpc-retry-pushback-ms"]) > 0 and lasted < 2.0

    coord.wait(90)  # --rounds 1: both clients' devices took part
    assert coord.returncode == 0, coord.tail()
    (rec,) = terminal_rounds(db)
    assert rec.state.value == "committed", rec
    counted = check_exact_aggregate(rec, [a_dir, b_dir])
    assert len(counted) == 4
    log = coord.log()
    capped = [e for e in events(log, "session_refused") if e.get("why") == "stream cap"]
    assert 1 <= len(capped) <= 5  # at most one line a second, with the count of those not logged
    assert [e for e in events(log, "session_refused") if e.get("why") == "no hello in time"]
    procs.check_alive(a, b)
