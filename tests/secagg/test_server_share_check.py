"""ServerShareCheck: receipts remove pairs, then the survivors are pruned."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secagg.errors import AbortReason, DropReason
from secagg.messages import MaskingRequest, ServerAbort
from secagg.server import ServerCompleted, ServerMaskedInputCollection
from secagg.testing import StepHarness
from stage_setup import close_typed, completed, ill_typed, server_aborted, share_receipts


def _finish(h: StepHarness, masking: dict[int, MaskingRequest]) -> ServerCompleted:
    """Deliver the MaskingRequests and run the round to its end, no dropouts."""
    h.send(h.deliver(masking))
    out = h.close()
    h.send(h.deliver(out))
    h.close()
    return completed(h.server)


def _receive(h: StepHarness, receipts: dict, reports: dict[int, tuple[int, ...]]) -> None:
    for i, m in receipts.items():
        h.server, _ = h.server.handle(i, dataclasses.replace(m, undecryptable=reports.get(i, ())))


def test_no_reports_every_device_masks_with_every_relayed_peer() -> None:
    h, receipts = share_receipts(n=6)
    _receive(h, receipts, {})
    masking = close_typed(h, MaskingRequest)
    assert isinstance(h.server, ServerMaskedInputCollection)
    assert all(m.peers == tuple(u for u in range(6) if u != v) for v, m in masking.items())
    assert h.server.record.survivors["share_check"] == tuple(range(6))
    done = _finish(h, masking)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


@pytest.mark.parametrize("bad", [(9,), (1, 1), (2,), "x"])
def test_bad_receipts_drop_the_device(bad: object) -> None:
    h, receipts = share_receipts(n=6)
    h.server, _ = h.server.handle(2, dataclasses.replace(receipts[2], undecryptable=ill_typed(bad)))
    assert h.server.record.dropped[2] == ("share_check", DropReason.MALFORMED_MESSAGE)


def test_one_report_removes_the_pair_only() -> None:
    h, receipts = share_receipts(n=6)
    _receive(h, receipts, {1: (0,)})
    masking = close_typed(h, MaskingRequest)
    assert 1 not in masking[0].peers and 0 not in masking[1].peers
    assert set(masking) == set(range(6)) and not h.server.record.dropped
    done = _finish(h, masking)
    assert done.counted == tuple(range(6))
    np.testing.assert_array_equal(done.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_a_sender_whose_shares_fail_widely_leaves_and_the_round_commits() -> None:
    # t = 4 of 6: three of its five peers report device 0, so its closure
    # keeps three members (< t) and it is left out before anyone masks.
    h, receipts = share_receipts(n=6)
    _receive(h, receipts, {1: (0,), 2: (0,), 3: (0,)})
    h.server, out = h.server.close()
    assert h.server.record.dropped[0] == ("share_check", DropReason.REPORTED_UNDECRYPTABLE)
    notices = [m for m in out if isinstance(m, ServerAbort)]
    assert [(m.device_id, m.reason) for m in notices] == [(0, AbortReason.SHARES_UNDECRYPTABLE)]
    masking = {m.device_id: m for m in out if isinstance(m, MaskingRequest)}
    assert set(masking) == {1, 2, 3, 4, 5} and all(0 not in m.peers for m in masking.values())
    done = _finish(h, masking)
    assert done.counted == (1, 2, 3, 4, 5)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[[1, 2, 3, 4, 5]].sum(0, dtype=np.uint32))


def test_a_device_that_reports_everyone_only_removes_itself() -> None:
    h, receipts = share_receipts(n=6)
    _receive(h, receipts, {1: (0, 2, 3, 4, 5)})
    h.server, out = h.server.close()
    assert h.server.record.dropped == {1: ("share_check", DropReason.NEIGHBOURHOOD_TOO_SMALL)}
    assert [(m.device_id, m.reason) for m in out if isinstance(m, ServerAbort)] == [(1, AbortReason.TOO_FEW_CHECKED)]
    masking = {m.device_id: m for m in out if isinstance(m, MaskingRequest)}
    assert set(masking) == {0, 2, 3, 4, 5}  # every honest device goes on
    done = _finish(h, masking)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[[0, 2, 3, 4, 5]].sum(0, dtype=np.uint32))


def test_silent_devices_are_not_masked_with() -> None:
    h, receipts = share_receipts(n=6)
    del receipts[4]
    _receive(h, receipts, {})
    masking = close_typed(h, MaskingRequest)
    assert set(masking) == {0, 1, 2, 3, 5} and all(4 not in m.peers for m in masking.values())
    done = _finish(h, masking)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[[0, 1, 2, 3, 5]].sum(0, dtype=np.uint32))


def test_too_few_left_after_the_check_aborts() -> None:
    h, receipts = share_receipts(n=6)
    for i in (0, 1, 2):
        del receipts[i]
    _receive(h, receipts, {})
    h.server, _ = h.server.close()
    server_aborted(h.server, AbortReason.TOO_FEW_CHECKED)
