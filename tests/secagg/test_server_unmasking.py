"""ServerUnmasking: validate responses, rebuild secrets, remove masks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secagg import shamir
from secagg.errors import AbortReason, DropReason, ProtocolMisuse
from secagg.server import ServerAborted, ServerCompleted
from secagg.testing import StepHarness


def _setup(n: int = 6, drop=None, **kw):
    h = StepHarness(num_clients=n, **kw)
    requests = h.advance_to("unmasking", drop=drop)
    responses = {i: msgs[0] for i, msgs in h.deliver(requests).items()}
    return h, responses


def _expected(h, counted) -> np.ndarray:
    return h.encoded[list(counted)].sum(0, dtype=np.uint32)


def test_exact_sum_with_dropouts_at_masked_input_and_unmasking() -> None:
    h, resp = _setup(n=8, drop={"masked_input": [2, 5]})  # t = 5
    for i, m in resp.items():
        if i != 7:  # 7 sent its masked input but does not answer
            h.server, _ = h.server.handle(i, m)
    h.server, out = h.server.close()
    assert isinstance(h.server, ServerCompleted) and out == []
    assert h.server.counted == (0, 1, 3, 4, 6, 7)
    np.testing.assert_array_equal(h.server.encoded_sum, _expected(h, h.server.counted))
    np.testing.assert_allclose(
        h.server.decoded_mean(), h.inputs[[0, 1, 3, 4, 6, 7]].mean(0), atol=h.config.encoding.step
    )


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: dataclasses.replace(m, b_shares=m.b_shares + m.b_shares[:1]), id="duplicate-share"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=m.b_shares + ((5, 1),)), id="unrequested-owner"),
        pytest.param(lambda m: dataclasses.replace(m, s_shares=m.s_shares + ((0, 1),)), id="s-share-of-alive"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=((m.b_shares[0][0], shamir.PRIME),)), id="not-in-field"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=((0, "x"),)), id="not-an-int"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=None), id="not-a-list"),
        pytest.param(lambda m: dataclasses.replace(m, round_idx=1), id="another-round"),
    ],
)
def test_a_malformed_response_is_dropped_whole_and_the_round_goes_on(mutate) -> None:
    h, resp = _setup(drop={"masked_input": [5]})
    for i, m in resp.items():
        h.server, _ = h.server.handle(i, mutate(m) if i == 1 else m)
    assert h.server.record.dropped[1][1] in (DropReason.MALFORMED_MESSAGE, DropReason.WRONG_SESSION_OR_ROUND)
    h.server, _ = h.server.close()
    assert isinstance(h.server, ServerCompleted)
    np.testing.assert_array_equal(h.server.encoded_sum, _expected(h, (0, 1, 2, 3, 4)))


def test_too_few_responses_abort() -> None:
    h, resp = _setup()  # t = 4
    for i in (0, 1, 2):
        h.server, _ = h.server.handle(i, resp[i])
    h.server, out = h.server.close()
    assert isinstance(h.server, ServerAborted) and h.server.reason is AbortReason.TOO_FEW_UNMASKING_RESPONSES
    assert {m.device_id for m in out} == set(range(6))


def test_a_corrupted_s_share_is_caught_by_the_public_key_check() -> None:
    h, resp = _setup(n=5, drop={"masked_input": [4]})  # t = 3; responders 0..3
    for i, m in resp.items():
        if i == 0:
            m = dataclasses.replace(m, s_shares=((4, (m.s_shares[0][1] + 1) % shamir.PRIME),))
        h.server, _ = h.server.handle(i, m)
    h.server, _ = h.server.close()
    assert isinstance(h.server, ServerAborted) and h.server.reason is AbortReason.RECONSTRUCTION_FAILED


def test_terminal_states_ignore_late_messages() -> None:
    h, resp = _setup()
    h.send({i: [m] for i, m in resp.items()})
    done, _ = h.server.close()
    state, out = done.handle(0, resp[0])
    assert state is done and out == [] and done.record.rejections[-1].detail == "round is over"
    with pytest.raises(ProtocolMisuse):
        done.close()
    with pytest.raises(ProtocolMisuse):
        done.abort()
    with pytest.raises(TypeError):
        done.handle(0, "late")
