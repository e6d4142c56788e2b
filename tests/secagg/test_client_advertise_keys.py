"""ClientAdvertiseKeys: the initial device state."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secagg import identity
from secagg.client import ClientAborted, ClientAdvertiseKeys, ClientShareKeys
from secagg.config import SecAggConfig
from secagg.errors import AbortReason, ProtocolMisuse
from secagg.messages import AdvertiseKeys, ClientAbort, KeyList, ServerAbort
from secagg.randomness import DeterministicRandom
from secagg.testing import identity_keys
from stage_setup import ill_typed

CFG = SecAggConfig.create(num_clients=4, vector_length=6, session_id=b"sess")
X = np.zeros(6, dtype=np.uint32)


def test_start_advertises_two_fresh_keys_from_the_injected_randomness() -> None:
    rand = DeterministicRandom(1, "dev")
    expected = DeterministicRandom(1, "dev")(64)
    state, msgs = ClientAdvertiseKeys(CFG, 2, 5, X, rand=rand).start()
    assert isinstance(state, ClientShareKeys)
    (msg,) = msgs
    assert isinstance(msg, AdvertiseKeys)
    assert (msg.session_id, msg.round_idx, msg.device_id) == (b"sess", 5, 2)
    c = X25519PrivateKey.from_private_bytes(expected[:32]).public_key().public_bytes_raw()
    s = X25519PrivateKey.from_private_bytes(expected[32:]).public_key().public_bytes_raw()
    assert (msg.c_public, msg.s_public) == (c, s)
    assert msg.signature == b""


def test_active_mode_signs_the_keys() -> None:
    cfg = SecAggConfig.create(num_clients=4, vector_length=6, session_id=b"sess", active_adversary=True)
    priv, pub = identity_keys(4)
    _, (msg,) = ClientAdvertiseKeys(cfg, 1, 0, X, identity_key=priv[1], peer_identity_keys=pub).start()
    assert isinstance(msg, AdvertiseKeys)
    payload = identity.advertise_payload(b"sess", 0, 1, msg.c_public, msg.s_public)
    assert identity.verify(pub[1], msg.signature, payload)
    assert not identity.verify(pub[2], msg.signature, payload)


def test_start_twice_is_misuse() -> None:
    state = ClientAdvertiseKeys(CFG, 0, 0, X)
    state.start()
    with pytest.raises(ProtocolMisuse):
        state.start()


@pytest.mark.parametrize(
    "args,exc",
    [
        ((CFG, 0, 0, np.zeros(6, np.float32)), TypeError),
        ((CFG, 0, 0, [0] * 6), TypeError),
        ((CFG, 0, 0, np.zeros(5, np.uint32)), ValueError),
        ((CFG, 4, 0, X), ValueError),
        ((CFG, -1, 0, X), ValueError),
        ((CFG, 0, -1, X), ValueError),
        (("config", 0, 0, X), TypeError),
    ],
)
def test_constructor_misuse(args: tuple[object, ...], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        ClientAdvertiseKeys(*ill_typed(args))


def test_active_mode_needs_identity_keys() -> None:
    cfg = SecAggConfig.create(num_clients=4, vector_length=6, session_id=b"sess", active_adversary=True)
    with pytest.raises(ProtocolMisuse):
        ClientAdvertiseKeys(cfg, 0, 0, X)


def test_a_server_message_before_start_is_unexpected() -> None:
    kl = KeyList(session_id=b"sess", round_idx=0, device_id=0, entries=())
    state, out = ClientAdvertiseKeys(CFG, 0, 0, X).handle(kl)
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.UNEXPECTED_MESSAGE
    assert isinstance(out[0], ClientAbort) and out[0].reason is AbortReason.UNEXPECTED_MESSAGE


def test_server_abort_before_start() -> None:
    state, out = ClientAdvertiseKeys(CFG, 0, 0, X).handle(
        ServerAbort(session_id=b"sess", round_idx=0, device_id=0, reason=AbortReason.CANCELLED)
    )
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.SERVER_ABORTED and out == []


def test_not_a_message_is_misuse() -> None:
    with pytest.raises(TypeError):
        ClientAdvertiseKeys(CFG, 0, 0, X).handle(ill_typed({"type": "KeyList"}))


def test_device_can_cancel() -> None:
    state, (msg,) = ClientAdvertiseKeys(CFG, 3, 0, X).abort()
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.CANCELLED
    assert msg.device_id == 3
    with pytest.raises(ProtocolMisuse):
        state.abort()
