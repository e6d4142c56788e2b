"""Whole rounds through the driver with a man in the middle: tampered,
misrouted, replayed and malformed messages are rejected with a clear record
and the round goes on without the device concerned (or aborts, typed, when
too few are left)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason
from secagg.messages import (
    AdvertiseKeys,
    MaskedInput,
    ShareKeys,
    ShareReceipt,
    ShareRelay,
    UnmaskingRequest,
    UnmaskingResponse,
)
from secagg.server.base import ServerRound
from secagg.testing import SERVER, DropoutPlan, RoundOutcome, StepHarness, encode_inputs, run_round

N, L = 8, 16


def _config(**kw: Any) -> SecAggConfig:
    base: dict[str, Any] = {"num_clients": N, "vector_length": L, "session_id": b"adversarial"}
    base.update(kw)
    return SecAggConfig.create(**base)


def _record(out: RoundOutcome) -> ServerRound:
    """The server's record of the round (run_round always keeps the final state)."""
    assert out.server_state is not None
    return out.server_state.record


def _inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(N, L))


def _assert_exact(outcome, counted) -> None:
    assert outcome.ok, (outcome.abort_reason, outcome.abort_detail)
    assert outcome.counted == tuple(counted)
    assert outcome.exact
    enc = encode_inputs(_inputs(), config=outcome.config, seed=0)
    np.testing.assert_array_equal(outcome.encoded_sum, enc[list(counted)].sum(0, dtype=np.uint32))


def test_honest_round_has_no_rejections_and_every_device_completes() -> None:
    out = run_round(_inputs(), config=_config())
    _assert_exact(out, range(N))
    assert _record(out).rejections == []
    assert set(out.client_states.values()) == {"ClientCompleted"}


def test_a_tampered_ciphertext_is_reported_and_the_round_stays_exact() -> None:
    def flip(sender, receiver, msg):
        if isinstance(msg, ShareRelay) and receiver == 3:
            u, blob = msg.shares[0]
            return dataclasses.replace(msg, shares=((u, blob[:20] + bytes([blob[20] ^ 0x80]) + blob[21:]),) + msg.shares[1:])
        return msg

    out = run_round(_inputs(), config=_config(), intercept=flip)
    _assert_exact(out, range(N))
    assert _record(out).undecryptable == {3: frozenset({0})}


def test_ciphertexts_relayed_to_the_wrong_device_fail_their_associated_data() -> None:
    relays = {}

    def swap(sender, receiver, msg):
        if isinstance(msg, ShareRelay):
            relays[receiver] = msg
            if receiver == 2:  # give 2 the blob 5 sent to 1, under 5's name
                return dataclasses.replace(msg, shares=tuple((u, dict(relays[1].shares)[5]) if u == 5 else (u, b) for u, b in msg.shares))
        return msg

    out = run_round(_inputs(), config=_config(), intercept=swap)
    _assert_exact(out, range(N))
    assert _record(out).undecryptable == {2: frozenset({5})}


def _capture(config, round_idx, kind, device):
    got = {}

    def keep(sender, receiver, msg):
        if isinstance(msg, kind) and sender == device:
            got["msg"] = msg
        return msg

    run_round(_inputs(), config=config, round_idx=round_idx, intercept=keep)
    return got["msg"]


def test_a_masked_input_replayed_from_another_round_drops_the_device() -> None:
    old = _capture(_config(), 0, MaskedInput, 4)

    def replay(sender, receiver, msg):
        return old if isinstance(msg, MaskedInput) and sender == 4 else msg

    out = run_round(_inputs(), config=_config(), round_idx=1, intercept=replay)
    assert out.server_dropped[4] == ("masked_input", DropReason.WRONG_SESSION_OR_ROUND)
    _assert_exact(out, [i for i in range(N) if i != 4])  # 4's masks removed through its s-key


def test_keys_replayed_from_another_session_drop_the_device() -> None:
    old = _capture(_config(session_id=b"previous-session"), 0, AdvertiseKeys, 6)

    def replay(sender, receiver, msg):
        return old if isinstance(msg, AdvertiseKeys) and sender == 6 else msg

    out = run_round(_inputs(), config=_config(), intercept=replay)
    assert out.server_dropped[6] == ("advertise_keys", DropReason.WRONG_SESSION_OR_ROUND)
    _assert_exact(out, [i for i in range(N) if i != 6])


def test_an_unmasking_request_replayed_to_a_device_from_another_round_is_refused() -> None:
    old = _capture(_config(), 0, UnmaskingRequest, SERVER)
    # The captured request is the last one sent (to device N-1); replay it to that device.

    def replay(sender, receiver, msg):
        return old if isinstance(msg, UnmaskingRequest) and receiver == old.device_id else msg

    out = run_round(_inputs(), config=_config(), round_idx=5, intercept=replay)
    assert out.client_aborts[old.device_id].reason is AbortReason.WRONG_SESSION_OR_ROUND
    _assert_exact(out, range(N))  # others' shares suffice


@pytest.mark.parametrize(
    "kind,mutate,stage",
    [
        (MaskedInput, lambda m: dataclasses.replace(m, vector=m.vector[:-1]), "masked_input"),
        (ShareReceipt, lambda m: dataclasses.replace(m, undecryptable=(99,)), "share_check"),
        (ShareKeys, lambda m: dataclasses.replace(m, shares=m.shares + ((42, m.shares[0][1]),)), "share_keys"),
        (ShareKeys, lambda m: dataclasses.replace(m, shares=m.shares + m.shares[:1]), "share_keys"),
        (ShareKeys, lambda m: dataclasses.replace(m, shares=m.shares[1:]), "share_keys"),
        (UnmaskingResponse, lambda m: dataclasses.replace(m, b_shares=m.b_shares + m.b_shares[:1]), "unmasking"),
        (UnmaskingResponse, lambda m: dataclasses.replace(m, b_shares=m.b_shares + ((77, 1),)), "unmasking"),
        (AdvertiseKeys, lambda m: dataclasses.replace(m, device_id=0), "advertise_keys"),
    ],
    ids=["short-vector", "unknown-undecryptable", "unknown-receiver", "duplicate-share", "missing-share",
         "duplicate-unmasking-share", "unknown-owner", "spoofed-sender"],
)
def test_malformed_messages_drop_the_sender_and_the_round_goes_on(kind, mutate, stage) -> None:
    bad_device = 5

    def tamper(sender, receiver, msg):
        return mutate(msg) if isinstance(msg, kind) and sender == bad_device else msg

    out = run_round(_inputs(), config=_config(), intercept=tamper)
    assert out.server_dropped[bad_device][0] == stage
    assert out.server_dropped[bad_device][1] in (DropReason.MALFORMED_MESSAGE, DropReason.SPOOFED_SENDER)
    counted = range(N) if stage == "unmasking" else [i for i in range(N) if i != bad_device]
    _assert_exact(out, counted)


def test_wrong_dtype_without_the_wire() -> None:
    def tamper(sender, receiver, msg):
        if isinstance(msg, MaskedInput) and sender == 1:
            return dataclasses.replace(msg, vector=msg.vector.astype(np.float64))
        return msg

    out = run_round(_inputs(), config=_config(), intercept=tamper, wire=False)
    assert out.server_dropped[1] == ("masked_input", DropReason.MALFORMED_MESSAGE)
    _assert_exact(out, [i for i in range(N) if i != 1])


def test_a_device_refuses_a_request_that_lists_itself_dropped() -> None:
    def lie(sender, receiver, msg):
        if isinstance(msg, UnmaskingRequest) and receiver == 2:
            return dataclasses.replace(msg, alive=tuple(i for i in msg.alive if i != 2), dropped=(2,))
        return msg

    out = run_round(_inputs(), config=_config(), intercept=lie)
    assert out.client_aborts[2].reason is AbortReason.INVALID_UNMASKING_REQUEST
    _assert_exact(out, range(N))  # 2's input still counts; the others' shares of b_2 suffice


def test_a_lie_about_a_peer_yields_one_kind_of_share_only() -> None:
    """Passive mode cannot see this lie (the consistency check of active mode
    does), but the device still reveals only the s-share of the peer, and with
    t a strict majority the server cannot gather t of each kind."""
    responses = {}

    def lie(sender, receiver, msg):
        if isinstance(msg, UnmaskingRequest) and receiver == 2:
            return dataclasses.replace(msg, alive=tuple(i for i in msg.alive if i != 3), dropped=(3,))
        if isinstance(msg, UnmaskingResponse):
            responses[sender] = msg
        return msg

    out = run_round(_inputs(), config=_config(), intercept=lie)
    assert 3 in dict(responses[2].s_shares) and 3 not in dict(responses[2].b_shares)
    # The honest server did not ask for that share: the response is refused.
    assert out.server_dropped[2] == ("unmasking", DropReason.MALFORMED_MESSAGE)
    _assert_exact(out, range(N))


def test_too_few_left_aborts_with_a_typed_reason() -> None:
    cfg = _config()  # t = 5 of 8
    for stage, reason in (
        ("advertise_keys", AbortReason.TOO_FEW_ADVERTISED),
        ("share_keys", AbortReason.TOO_FEW_SHARED),
        ("masked_input", AbortReason.TOO_FEW_MASKED_INPUTS),
        ("unmasking", AbortReason.TOO_FEW_UNMASKING_RESPONSES),
    ):
        out = run_round(_inputs(), config=cfg, dropouts=DropoutPlan.at(stage, range(4)))
        assert not out.ok and out.abort_reason is reason and out.encoded_sum is None
        assert {a.reason for a in out.client_aborts.values()} <= {AbortReason.SERVER_ABORTED}


def test_private_device_state_never_appears_in_any_message() -> None:
    h = StepHarness(num_clients=5, vector_length=4)
    wire: list[bytes] = []
    out = h.advance_to("share_keys")
    while not h.server.is_terminal:
        replies = h.deliver(out)
        wire += [m.to_bytes() for m in out.values()] + [m.to_bytes() for ms in replies.values() for m in ms]
        h.send(replies)
        out = h.close()
    blob = b"".join(wire)
    for state in h.clients.values():
        r = state._round
        for secret in (r.c_keys().private_bytes(), r.s_keys().private_bytes(), r.b_seed):
            assert secret not in blob
        assert h.encoded[r.device_id].tobytes() not in blob
