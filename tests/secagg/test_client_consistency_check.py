"""ClientConsistencyCheck (active mode): sign U3 after checking it."""

from __future__ import annotations

import dataclasses

import pytest

from secagg import identity
from secagg.client import ClientAborted, ClientUnmasking
from secagg.errors import AbortReason
from secagg.messages import ConsistencySignature, UnmaskingRequest
from secagg.testing import StepHarness


def _setup(n: int = 6, **kw):
    h = StepHarness(num_clients=n, active_adversary=True, **kw)
    requests = h.advance_to("consistency_check", drop=kw.pop("drop", None))
    return h, requests


def test_signs_the_survivor_set() -> None:
    h, requests = _setup()
    state, (msg,) = h.clients[1].handle(requests[1])
    assert isinstance(state, ClientUnmasking) and isinstance(msg, ConsistencySignature)
    payload = identity.consistency_payload(h.config.session_id, 0, requests[1].alive)
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
def test_invalid_requests_abort(alive) -> None:
    h, requests = _setup()
    state, out = h.clients[1].handle(dataclasses.replace(requests[1], alive=alive))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.INVALID_CONSISTENCY_REQUEST
    assert out[0].reason is AbortReason.INVALID_CONSISTENCY_REQUEST


def test_a_neighbour_that_never_shared_cannot_be_alive() -> None:
    h = StepHarness(num_clients=6, active_adversary=True)
    requests = h.advance_to("consistency_check", drop={"share_keys": [5]})
    assert 5 not in requests[1].alive
    state, _ = h.clients[1].handle(dataclasses.replace(requests[1], alive=requests[1].alive + (5,)))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.INVALID_CONSISTENCY_REQUEST


def test_wrong_type_and_replay() -> None:
    h, requests = _setup()
    req = UnmaskingRequest(session_id=h.config.session_id, round_idx=0, device_id=1, alive=(1,), dropped=())
    state, _ = h.clients[1].handle(req)
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.UNEXPECTED_MESSAGE
    state, _ = h.clients[2].handle(dataclasses.replace(requests[2], session_id=b"old-session"))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.WRONG_SESSION_OR_ROUND
