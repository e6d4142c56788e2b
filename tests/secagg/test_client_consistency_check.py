"""ClientConsistencyCheck (active mode): sign U3 after checking it."""

from __future__ import annotations

import dataclasses

import pytest

from secagg import identity
from secagg.client import ClientAborted, ClientUnmasking
from secagg.errors import AbortReason
from secagg.messages import ConsistencySignature, UnmaskingRequest
from stage_setup import assert_client_aborted, consistency_requests, ill_typed


def test_signs_the_survivor_set() -> None:
    h, requests = consistency_requests()
    state, (msg,) = h.clients[1].handle(requests[1])
    assert isinstance(state, ClientUnmasking) and isinstance(msg, ConsistencySignature)
    payload = identity.consistency_payload(h.config.session_id, 0, requests[1].alive)
    assert h.identity_public is not None
    assert identity.verify(h.identity_public[1], msg.signature, payload)
    assert state._round.signed_alive == frozenset(range(6))


@pytest.mark.parametrize(
    "alive",
    [
        pytest.param((0, 2, 3, 4, 5), id="self-missing"),
        pytest.param((0, 1, 1, 2, 3, 4), id="duplicate"),
        pytest.param((0, 1, 2, 3, 4, 6), id="unknown-id"),
        pytest.param((1, 2, 3), id="fewer-than-t"),
        pytest.param(("1", 2, 3, 4, 5), id="not-an-int"),
    ],
)
def test_invalid_requests_abort(alive: tuple[object, ...]) -> None:
    h, requests = consistency_requests()
    state, out = h.clients[1].handle(dataclasses.replace(requests[1], alive=ill_typed(alive)))
    assert_client_aborted(state, out, AbortReason.INVALID_CONSISTENCY_REQUEST)


def test_a_neighbour_that_never_shared_cannot_be_alive() -> None:
    h, requests = consistency_requests(drop={"share_keys": [5]})
    assert 5 not in requests[1].alive
    state, _ = h.clients[1].handle(dataclasses.replace(requests[1], alive=requests[1].alive + (5,)))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.INVALID_CONSISTENCY_REQUEST


def test_wrong_type_and_replay() -> None:
    h, requests = consistency_requests()
    req = UnmaskingRequest(session_id=h.config.session_id, round_idx=0, device_id=1, alive=(1,), dropped=())
    state, _ = h.clients[1].handle(req)
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.UNEXPECTED_MESSAGE
    state, _ = h.clients[2].handle(dataclasses.replace(requests[2], session_id=b"old-session"))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.WRONG_SESSION_OR_ROUND
