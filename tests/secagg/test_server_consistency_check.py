"""ServerConsistencyCheck (active mode): collect and forward signatures of U3."""

from __future__ import annotations

import dataclasses

import numpy as np

from secagg.errors import AbortReason, DropReason
from secagg.messages import UnmaskingRequest
from secagg.server import ServerUnmasking
from stage_setup import close_typed, close_with_only, completed, consistency_signatures, server_aborted

# consistency_signatures() drives 6 devices in active mode: t = 5.


def test_forwards_the_closure_signatures() -> None:
    h, sigs = consistency_signatures()
    h.send({i: [m] for i, m in sigs.items()})
    out = close_typed(h, UnmaskingRequest)
    assert isinstance(h.server, ServerUnmasking)
    assert dict(out[2].signatures) == {i: m.signature for i, m in sigs.items()}
    h.send(h.deliver(out))
    h.close()
    np.testing.assert_array_equal(completed(h.server).encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_a_bad_signature_drops_the_device_and_the_round_goes_on() -> None:
    h, sigs = consistency_signatures()
    sigs[3] = dataclasses.replace(sigs[3], signature=sigs[4].signature)
    h.send({i: [m] for i, m in sigs.items()})
    assert h.server.record.dropped[3] == ("consistency_check", DropReason.INVALID_SIGNATURE)
    out = close_typed(h, UnmaskingRequest)
    assert 3 not in out and all(3 not in dict(m.signatures) for m in out.values())
    h.send(h.deliver(out))
    h.close()
    done = completed(h.server)
    assert done.counted == tuple(range(6))  # 3's masked input still counts
    np.testing.assert_array_equal(done.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_too_few_signatures_abort() -> None:
    h, sigs = consistency_signatures()
    out = close_with_only(h, sigs, range(4))
    server_aborted(h.server, AbortReason.TOO_FEW_SIGNATURES)
    assert len(out) == 6
