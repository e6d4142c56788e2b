"""ServerConsistencyCheck (active mode): collect and forward signatures of U3."""

from __future__ import annotations

import dataclasses

import numpy as np

from secagg.errors import AbortReason, DropReason
from secagg.messages import UnmaskingRequest
from secagg.server import ServerAborted, ServerUnmasking
from secagg.testing import StepHarness


def _setup(n: int = 6):
    h = StepHarness(num_clients=n, active_adversary=True)  # t = 5
    requests = h.advance_to("consistency_check")
    sigs = {i: msgs[0] for i, msgs in h.deliver(requests).items()}
    return h, sigs


def test_forwards_the_closure_signatures() -> None:
    h, sigs = _setup()
    h.send({i: [m] for i, m in sigs.items()})
    out = h.close()
    assert isinstance(h.server, ServerUnmasking)
    assert all(isinstance(m, UnmaskingRequest) for m in out.values())
    assert dict(out[2].signatures) == {i: m.signature for i, m in sigs.items()}
    h.send(h.deliver(out))
    h.close()
    np.testing.assert_array_equal(h.server.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_a_bad_signature_drops_the_device_and_the_round_goes_on() -> None:
    h, sigs = _setup()
    sigs[3] = dataclasses.replace(sigs[3], signature=sigs[4].signature)
    h.send({i: [m] for i, m in sigs.items()})
    assert h.server.record.dropped[3] == ("consistency_check", DropReason.INVALID_SIGNATURE)
    out = h.close()
    assert 3 not in out and all(3 not in dict(m.signatures) for m in out.values())
    h.send(h.deliver(out))
    h.close()
    assert h.server.counted == tuple(range(6))  # 3's masked input still counts
    np.testing.assert_array_equal(h.server.encoded_sum, h.encoded.sum(0, dtype=np.uint32))


def test_too_few_signatures_abort() -> None:
    h, sigs = _setup()
    h.send({i: [sigs[i]] for i in range(4)})
    h.server, out = h.server.close()
    assert isinstance(h.server, ServerAborted) and h.server.reason is AbortReason.TOO_FEW_SIGNATURES
    assert len(out) == 6
