"""ServerMaskedInputCollection: validate and add masked inputs; plan unmasking."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from secagg.errors import AbortReason, DropReason
from secagg.messages import ClientAbort, ConsistencyRequest, UnmaskingRequest
from secagg.server import ServerCompleted, ServerConsistencyCheck, ServerUnmasking
from secagg.testing import StepHarness
from stage_setup import close_typed, close_with_only, completed, ill_typed, masked_inputs, server_aborted


def _finish(h: StepHarness) -> ServerCompleted:
    out = h.close()
    h.send(h.deliver(out))
    h.close()
    return completed(h.server)


def test_requests_list_alive_and_dropped_per_device() -> None:
    h, mi = masked_inputs()
    for i, m in mi.items():
        if i != 5:  # 5 drops after sharing keys
            h.server, _ = h.server.handle(i, m)
    assert h.server.pending == frozenset({5})
    out = close_typed(h, UnmaskingRequest)
    assert isinstance(h.server, ServerUnmasking)
    assert out[0].alive == (0, 1, 2, 3, 4) and out[0].dropped == (5,)
    assert h.server.record.survivors["masked_input"] == (0, 1, 2, 3, 4)


@pytest.mark.parametrize(
    "vector",
    [
        pytest.param(np.zeros(7, np.uint32), id="short"),
        pytest.param(np.zeros(9, np.uint32), id="long"),
        pytest.param(np.zeros(8, np.float32), id="float32"),
        pytest.param(np.zeros(8, np.int64), id="int64"),
        pytest.param(np.zeros((2, 4), np.uint32), id="2-d"),
        pytest.param([0] * 8, id="list"),
    ],
)
def test_malformed_vectors_drop_the_device_and_the_round_goes_on(vector: object) -> None:
    h, mi = masked_inputs()
    for i, m in mi.items():
        h.server, _ = h.server.handle(i, dataclasses.replace(m, vector=ill_typed(vector)) if i == 2 else m)
    assert h.server.record.dropped[2] == ("masked_input", DropReason.MALFORMED_MESSAGE)
    done = _finish(h)
    assert done.counted == (0, 1, 3, 4, 5)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[[0, 1, 3, 4, 5]].sum(0, dtype=np.uint32))


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"round_idx": 3}, DropReason.WRONG_SESSION_OR_ROUND),
        ({"session_id": b"old"}, DropReason.WRONG_SESSION_OR_ROUND),
        ({"device_id": 4}, DropReason.SPOOFED_SENDER),
    ],
)
def test_replayed_or_spoofed_inputs_drop_the_device(change: dict[str, Any], reason: DropReason) -> None:
    h, mi = masked_inputs()
    for i, m in mi.items():
        h.server, _ = h.server.handle(i, dataclasses.replace(m, **change) if i == 1 else m)
    assert h.server.record.dropped[1] == ("masked_input", reason)
    done = _finish(h)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[[0, 2, 3, 4, 5]].sum(0, dtype=np.uint32))


def test_a_second_masked_input_is_ignored() -> None:
    h, mi = masked_inputs()
    for i, m in mi.items():
        h.server, _ = h.server.handle(i, m)
    h.server, _ = h.server.handle(0, dataclasses.replace(mi[0], vector=np.ones(8, np.uint32)))
    assert 0 not in h.server.record.dropped
    done = _finish(h)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_a_device_leaving_after_its_input_is_still_counted() -> None:
    h, mi = masked_inputs()
    for i, m in mi.items():
        h.server, _ = h.server.handle(i, m)
    h.server, _ = h.server.handle(
        3, ClientAbort(session_id=h.config.session_id, round_idx=0, device_id=3, reason=AbortReason.CANCELLED)
    )
    out = h.close()
    assert 3 not in out  # not asked to unmask
    h.send(h.deliver(out))
    h.close()
    assert completed(h.server).counted == (0, 1, 2, 3, 4, 5)


def test_too_few_masked_inputs_abort() -> None:
    h, mi = masked_inputs()  # t = 4
    out = close_with_only(h, mi, (0, 1, 2))
    server_aborted(h.server, AbortReason.TOO_FEW_MASKED_INPUTS)
    assert {m.device_id for m in out} == set(range(6))


def test_active_mode_asks_for_consistency_signatures() -> None:
    h, mi = masked_inputs(active_adversary=True)
    for i, m in mi.items():
        h.server, _ = h.server.handle(i, m)
    out = close_typed(h, ConsistencyRequest)
    assert isinstance(h.server, ServerConsistencyCheck)
    assert all(m.alive == tuple(range(6)) for m in out.values())
