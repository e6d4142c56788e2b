"""ClientCompleted and ClientAborted: the end states of a device."""

from __future__ import annotations

import dataclasses

import pytest

from secagg.client import ClientAborted, ClientCompleted
from secagg.errors import AbortReason, ProtocolMisuse
from secagg.messages import ClientAbort, ServerAbort
from secagg.messages import UnmaskingRequest
from secagg.testing import StepHarness
from stage_setup import ill_typed, key_lists, unmasking_requests


def _completed() -> tuple[StepHarness, dict[int, UnmaskingRequest], ClientCompleted]:
    h, requests = unmasking_requests(4)
    state, _ = h.clients[0].handle(requests[0])
    assert isinstance(state, ClientCompleted) and state.is_terminal
    return h, requests, state


def test_completed_ignores_late_messages_but_not_a_server_abort() -> None:
    h, requests, done = _completed()
    assert done.handle(requests[0]) == (done, [])
    abort = ServerAbort(session_id=h.config.session_id, round_idx=0, device_id=0, reason=AbortReason.CANCELLED)
    state, out = done.handle(abort)
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.SERVER_ABORTED
    assert state.at_stage == "completed" and out == []
    # An abort for another device or session changes nothing.
    assert done.handle(dataclasses.replace(abort, device_id=1))[0] is done
    assert done.handle(dataclasses.replace(abort, session_id=b"x"))[0] is done


def test_aborted_ignores_everything_and_cannot_abort_again() -> None:
    h, keylists = key_lists(4)
    aborted, (notice,) = h.clients[0].abort()
    assert isinstance(notice, ClientAbort)
    assert isinstance(aborted, ClientAborted) and aborted.reason is AbortReason.CANCELLED
    assert notice.reason is AbortReason.CANCELLED and aborted.at_stage == "share_keys"
    assert aborted.handle(keylists[0]) == (aborted, [])
    assert "CANCELLED" in repr(aborted)
    with pytest.raises(ProtocolMisuse):
        aborted.abort()
    with pytest.raises(TypeError):
        aborted.handle(ill_typed(None))
