"""ServerCompleted and ServerAborted: the end states of a round."""

from __future__ import annotations

import numpy as np
import pytest

from secagg.errors import AbortReason, ProtocolMisuse
from secagg.server import ServerAborted
from stage_setup import adverts, completed, harness, unmasking_requests


def test_completed_holds_the_exact_sum_and_decodes_it() -> None:
    h, out = unmasking_requests(5, vector_length=6)
    h.send(h.deliver(out, devices=[0, 1, 2, 3]))  # 4 does not answer
    h.close()
    done = completed(h.server)
    assert done.is_terminal
    assert done.counted == (0, 1, 2, 3, 4)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded.sum(0, dtype=np.uint32))
    np.testing.assert_allclose(done.decoded_sum(), h.inputs.sum(0), atol=5 * h.config.encoding.step)
    np.testing.assert_allclose(done.decoded_mean(), h.inputs.mean(0), atol=h.config.encoding.step)
    assert done.record.survivors["unmasking"] == (0, 1, 2, 3)


def test_aborted_records_why_and_where() -> None:
    h = harness(5)
    h.send(h.start([0, 1]))
    state, _ = h.server.close()
    assert isinstance(state, ServerAborted)
    assert (state.reason, state.at_stage) == (AbortReason.TOO_FEW_ADVERTISED, "advertise_keys")
    assert "TOO_FEW_ADVERTISED" in repr(state)
    assert state.pending == frozenset()
    with pytest.raises(ProtocolMisuse):
        state.close()
    with pytest.raises(ProtocolMisuse):
        state.abort()
    adv = adverts(5)[1][2]
    assert state.handle(2, adv) == (state, [])
