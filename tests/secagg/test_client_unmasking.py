"""ClientUnmasking: the malicious-server checks, then one b- or s-share per owner."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from secagg import shamir
from secagg.client import ClientAborted, ClientCompleted, ClientState
from secagg.errors import AbortReason, ProtocolMisuse
from secagg.messages import MaskingRequest, Message, ServerAbort, UnmaskingRequest, UnmaskingResponse
from secagg.testing import StepHarness
from stage_setup import (
    assert_client_aborted,
    close_typed,
    consistency_requests,
    ill_typed,
    share_relays,
    unmasking_requests,
)


def _refused(
    state: ClientState[Any], out: list[Message], reason: AbortReason = AbortReason.INVALID_UNMASKING_REQUEST
) -> None:
    # Nothing revealed: the only message is the abort notice.
    assert_client_aborted(state, out, reason)


def test_reveals_b_for_alive_and_s_for_dropped() -> None:
    h, requests = unmasking_requests(drop={"masked_input": [4]})
    req = requests[0]
    assert req.alive == (0, 1, 2, 3, 5) and req.dropped == (4,)
    state, (msg,) = h.clients[0].handle(req)
    assert isinstance(state, ClientCompleted) and isinstance(msg, UnmaskingResponse)
    held = h.clients[0]._round.held
    assert dict(msg.b_shares) == {0: h.clients[0]._round.own_b_share} | {u: held[u][0] for u in (1, 2, 3, 5)}
    assert dict(msg.s_shares) == {4: held[4][1]}


def test_the_revealed_s_shares_rebuild_the_dropped_key() -> None:
    h, requests = unmasking_requests(drop={"masked_input": [4]})
    shares: dict[int, int] = {}
    for v, req in requests.items():
        _, (msg,) = h.clients[v].handle(req)
        assert isinstance(msg, UnmaskingResponse)
        shares[shamir.x_of(v)] = dict(msg.s_shares)[4]
    xs = sorted(shares)[: h.config.threshold]
    s = shamir.combine(xs, [shares[x] for x in xs])
    assert shamir.int_to_secret(s) == h.clients[4]._round.s_keys().private_bytes()


@pytest.mark.parametrize(
    "alive,dropped",
    [
        pytest.param((1, 2, 3, 5), (0,), id="self-listed-dropped"),
        pytest.param((0, 1, 2, 3, 5), (5,), id="alive-and-dropped"),
        pytest.param((1, 2, 3, 5), (), id="self-not-alive"),
        pytest.param((0, 1, 2, 3, 5, 9), (), id="unknown-id"),
        pytest.param((0, 1, 2, 3, 5, 6), (), id="id-beyond-cohort"),
        pytest.param((0, 1, 1, 2, 3, 5), (), id="duplicate-alive"),
        pytest.param((0, 1, 2, 3, 5), (4, 4), id="duplicate-dropped"),
        pytest.param((0, 1, 2), (3, 5), id="fewer-than-t-alive"),
        pytest.param((0, 1, 2, "3"), (), id="not-an-int"),
        pytest.param(None, (), id="not-a-list"),
    ],
)
def test_malicious_requests_are_refused(alive: object, dropped: tuple[int, ...]) -> None:
    h, requests = unmasking_requests(drop={"masked_input": [4]})
    state, out = h.clients[0].handle(dataclasses.replace(requests[0], alive=ill_typed(alive), dropped=dropped))
    _refused(state, out)


def test_harary_neighbourhood_threshold_is_checked_per_device() -> None:
    h, requests = unmasking_requests(n=12, neighbors=4)  # t = 3 of each closure of 5
    v = 0
    closure = sorted(h.config.graph(0).closure(v))
    state, out = h.clients[v].handle(dataclasses.replace(requests[v], alive=(v, next(u for u in closure if u != v))))
    _refused(state, out)


def test_one_answer_only_so_never_both_shares_of_a_peer() -> None:
    h, requests = unmasking_requests(drop={"masked_input": [4]})
    spent = h.clients[0]
    done, _ = spent.handle(requests[0])
    with pytest.raises(ProtocolMisuse):
        spent.handle(dataclasses.replace(requests[0], alive=(0, 1, 2, 3, 4, 5), dropped=()))
    # The completed device ignores a second request.
    again, out = done.handle(dataclasses.replace(requests[0], alive=(0, 1, 2, 3, 5, 4), dropped=()))
    assert again is done and out == []


def test_server_abort_after_completion() -> None:
    h, requests = unmasking_requests()
    done, _ = h.clients[0].handle(requests[0])
    abort = ServerAbort(session_id=h.config.session_id, round_idx=0, device_id=0, reason=AbortReason.TOO_FEW_UNMASKING_RESPONSES)
    state, out = done.handle(abort)
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.SERVER_ABORTED and out == []
    # An abort for another round does not count.
    state, _ = done.handle(dataclasses.replace(abort, round_idx=3))
    assert state is done
    with pytest.raises(ProtocolMisuse):
        done.abort()


@pytest.mark.parametrize("change", [{"round_idx": 9}, {"session_id": b"x"}])
def test_request_from_another_round_or_session(change: dict[str, Any]) -> None:
    h, requests = unmasking_requests()
    state, out = h.clients[0].handle(dataclasses.replace(requests[0], **change))
    _refused(state, out, AbortReason.WRONG_SESSION_OR_ROUND)


def test_a_reported_pair_is_neither_masked_nor_asked_about() -> None:
    h, relays = share_relays()
    shares = list(relays[0].shares)
    reported = shares[0][0]
    shares[0] = (reported, b"\x00" * 94)
    relays[0] = dataclasses.replace(relays[0], shares=tuple(shares))
    h.send(h.deliver(relays))
    masking = close_typed(h, MaskingRequest)
    assert reported not in masking[0].peers and 0 not in masking[reported].peers
    h.send(h.deliver(masking))
    requests = close_typed(h, UnmaskingRequest)
    assert reported not in requests[0].alive + requests[0].dropped
    _, (msg,) = h.clients[0].handle(requests[0])
    assert isinstance(msg, UnmaskingResponse)
    assert reported not in dict(msg.b_shares)


class TestActiveMode:
    def _setup(self) -> tuple[StepHarness, dict[int, UnmaskingRequest]]:
        h, cons = consistency_requests()
        h.send(h.deliver(cons))
        return h, close_typed(h, UnmaskingRequest)

    def test_valid_signatures_are_accepted(self) -> None:
        h, requests = self._setup()
        assert len(requests[0].signatures) == 6
        state, (msg,) = h.clients[0].handle(requests[0])
        assert isinstance(state, ClientCompleted) and isinstance(msg, UnmaskingResponse)

    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(lambda s: s[:3], id="fewer-than-t"),
            pytest.param(lambda s: [(s[0][0], s[1][1])] + s[1:], id="forged"),
            pytest.param(lambda s: s + [s[0]], id="repeated-signer"),
            pytest.param(lambda s: s[:-1] + [(9, s[-1][1])], id="unknown-signer"),
            pytest.param(lambda s: s + ["junk"], id="junk"),
        ],
    )
    def test_bad_signatures(self, mutate: Callable[[list[Any]], list[Any]]) -> None:
        h, requests = self._setup()
        req = dataclasses.replace(requests[0], signatures=tuple(mutate(list(requests[0].signatures))))
        state, out = h.clients[0].handle(req)
        _refused(state, out, AbortReason.INVALID_SIGNATURE)

    def test_lists_must_agree_with_the_signed_set(self) -> None:
        h, requests = self._setup()
        req = dataclasses.replace(requests[0], alive=(0, 1, 2, 3, 4), dropped=(5,))
        state, out = h.clients[0].handle(req)
        _refused(state, out)
