"""ServerUnmasking: validate responses, rebuild secrets, remove masks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np
import pytest

from secagg import shamir
from secagg.errors import AbortReason, DropReason, ProtocolMisuse
from secagg.messages import UnmaskingResponse
from secagg.testing import StepHarness
from stage_setup import close_with_only, completed, ill_typed, server_aborted, unmasking_responses


def _expected(h: StepHarness, counted: Iterable[int]) -> np.ndarray:
    return h.encoded[list(counted)].sum(0, dtype=np.uint32)


def test_exact_sum_with_dropouts_at_masked_input_and_unmasking() -> None:
    h, resp = unmasking_responses(n=8, drop={"masked_input": [2, 5]})  # t = 5
    for i, m in resp.items():
        if i != 7:  # 7 sent its masked input but does not answer
            h.server, _ = h.server.handle(i, m)
    h.server, out = h.server.close()
    done = completed(h.server)
    assert out == []
    assert done.counted == (0, 1, 3, 4, 6, 7)
    np.testing.assert_array_equal(done.encoded_sum, _expected(h, done.counted))
    np.testing.assert_allclose(
        done.decoded_mean(), h.inputs[[0, 1, 3, 4, 6, 7]].mean(0), atol=h.config.encoding.step
    )


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: dataclasses.replace(m, b_shares=m.b_shares + m.b_shares[:1]), id="duplicate-share"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=m.b_shares + ((5, 1),)), id="unrequested-owner"),
        pytest.param(lambda m: dataclasses.replace(m, s_shares=m.s_shares + ((0, 1),)), id="s-share-of-alive"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=((m.b_shares[0][0], shamir.PRIME),)), id="not-in-field"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=ill_typed(((0, "x"),))), id="not-an-int"),
        pytest.param(lambda m: dataclasses.replace(m, b_shares=ill_typed(None)), id="not-a-list"),
        pytest.param(lambda m: dataclasses.replace(m, round_idx=1), id="another-round"),
    ],
)
def test_a_malformed_response_is_dropped_whole_and_the_round_goes_on(
    mutate: Callable[[UnmaskingResponse], UnmaskingResponse],
) -> None:
    h, resp = unmasking_responses(drop={"masked_input": [5]})
    for i, m in resp.items():
        h.server, _ = h.server.handle(i, mutate(m) if i == 1 else m)
    assert h.server.record.dropped[1][1] in (DropReason.MALFORMED_MESSAGE, DropReason.WRONG_SESSION_OR_ROUND)
    h.server, _ = h.server.close()
    np.testing.assert_array_equal(completed(h.server).encoded_sum, _expected(h, (0, 1, 2, 3, 4)))


def test_too_few_responses_abort() -> None:
    h, resp = unmasking_responses()  # t = 4
    out = close_with_only(h, resp, (0, 1, 2))
    server_aborted(h.server, AbortReason.TOO_FEW_UNMASKING_RESPONSES)
    assert {m.device_id for m in out} == set(range(6))


def test_a_corrupted_s_share_is_caught_by_the_public_key_check() -> None:
    h, resp = unmasking_responses(n=5, drop={"masked_input": [4]})  # t = 3; responders 0..3
    for i, m in resp.items():
        if i == 0:
            m = dataclasses.replace(m, s_shares=((4, (m.s_shares[0][1] + 1) % shamir.PRIME),))
        h.server, _ = h.server.handle(i, m)
    h.server, _ = h.server.close()
    server_aborted(h.server, AbortReason.RECONSTRUCTION_FAILED)


def test_terminal_states_ignore_late_messages() -> None:
    h, resp = unmasking_responses()
    h.send({i: [m] for i, m in resp.items()})
    done, _ = h.server.close()
    state, out = done.handle(0, resp[0])
    assert state is done and out == [] and done.record.rejections[-1].detail == "round is over"
    with pytest.raises(ProtocolMisuse):
        done.close()
    with pytest.raises(ProtocolMisuse):
        done.abort()
    with pytest.raises(TypeError):
        done.handle(0, ill_typed("late"))


def test_answers_are_recorded_as_they_arrive_so_a_cancelled_round_lists_them() -> None:
    """A device that answered unmasking spent its contribution to the task
    (D85): a round aborted during unmasking must still say who answered."""
    h, resp = unmasking_responses()
    for i in (0, 3):
        h.server, _ = h.server.handle(i, resp[i])
    h.server, _ = h.server.handle(1, dataclasses.replace(resp[1], round_idx=1))  # dropped: not an answer
    assert h.server.record.survivors["unmasking"] == (0, 3)
    h.server, _ = h.server.abort(AbortReason.CANCELLED, "operator")
    server_aborted(h.server, AbortReason.CANCELLED)
    assert h.server.record.survivors["unmasking"] == (0, 3)
