"""Wire format: round trips, sizes, and refusal of anything malformed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.errors import AbortReason, MalformedMessage
from secagg.messages import (
    AdvertiseKeys,
    ClientAbort,
    ConsistencyRequest,
    ConsistencySignature,
    KeyEntry,
    KeyList,
    MaskedInput,
    MaskingRequest,
    Message,
    ServerAbort,
    ShareKeys,
    ShareReceipt,
    ShareRelay,
    UnmaskingRequest,
    UnmaskingResponse,
    decode_message,
)
from secagg.shamir import PRIME

H: dict[str, Any] = {"session_id": b"session-16-bytes", "round_idx": 2**40 + 3, "device_id": 7}

SAMPLES: list[Message] = [
    AdvertiseKeys(**H, c_public=b"c" * 32, s_public=b"s" * 32),
    AdvertiseKeys(**H, c_public=b"c" * 32, s_public=b"s" * 32, signature=b"g" * 64),
    KeyList(**H, entries=(KeyEntry(1, b"a" * 32, b"b" * 32), KeyEntry(9, b"c" * 32, b"d" * 32, b"e" * 64))),
    ShareKeys(**H, shares=((1, b"x" * 94), (3, b"y" * 94))),
    ShareRelay(**H, shares=((2, b"z" * 94),)),
    ShareReceipt(**H, undecryptable=()),
    ShareReceipt(**H, undecryptable=(2, 9)),
    MaskingRequest(**H, peers=(0, 1, 5)),
    ConsistencyRequest(**H, alive=(0, 1, 5)),
    ConsistencySignature(**H, signature=b"q" * 64),
    UnmaskingRequest(**H, alive=(1, 7), dropped=(3,), signatures=((1, b"r" * 64),)),
    UnmaskingResponse(**H, b_shares=((1, PRIME - 1), (7, 0)), s_shares=((3, 12345),)),
    ClientAbort(**H, reason=AbortReason.INVALID_UNMASKING_REQUEST),
    ServerAbort(**H, reason=AbortReason.TOO_FEW_SHARED),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_roundtrip(msg: Message) -> None:
    assert decode_message(msg.to_bytes()) == msg


def test_masked_input_roundtrip_and_size() -> None:
    L = 53_824
    v = np.arange(L, dtype=np.uint32) * np.uint32(2654435761)
    m = MaskedInput(**H, vector=v)
    back = decode_message(m.to_bytes())
    assert isinstance(back, MaskedInput)
    np.testing.assert_array_equal(back.vector, v)
    assert back.vector.dtype == np.uint32
    plain = m.to_bytes()
    assert len(plain) == 4 * L + 19 + len(H["session_id"])
    assert len(plain) <= 4 * L + 1024


@pytest.mark.parametrize("msg", SAMPLES[2:4] + SAMPLES[7:9], ids=lambda m: type(m).__name__)
def test_every_truncation_and_trailing_byte_is_refused(msg: Message) -> None:
    data = msg.to_bytes()
    for cut in range(len(data)):
        with pytest.raises(MalformedMessage):
            decode_message(data[:cut])
    with pytest.raises(MalformedMessage):
        decode_message(data + b"\x00")


def test_bad_header_fields() -> None:
    data = bytearray(SAMPLES[0].to_bytes())
    for pos, value in ((0, 1), (1, 99)):  # the old wire version, an unknown type
        bad = bytearray(data)
        bad[pos] = value
        with pytest.raises(MalformedMessage):
            decode_message(bytes(bad))
    abort = bytearray(SAMPLES[-1].to_bytes())
    abort[-1] = 250
    with pytest.raises(MalformedMessage):
        decode_message(bytes(abort))


def test_huge_counts_are_refused_without_allocating() -> None:
    data = bytearray(ConsistencyRequest(**H, alive=()).to_bytes())
    data[-4:] = (2**32 - 1).to_bytes(4, "big")
    with pytest.raises(MalformedMessage):
        decode_message(bytes(data))


@pytest.mark.parametrize(
    "msg",
    [
        MaskedInput(**H, vector=np.zeros(4, np.float32)),
        MaskedInput(**H, vector=np.zeros((2, 2), np.uint32)),
        AdvertiseKeys(**H, c_public=b"c" * 31, s_public=b"s" * 32),
        ShareKeys(**H, shares=((-1, b"x"),)),
        UnmaskingResponse(**H, b_shares=((1, 2**300),), s_shares=()),
        ConsistencySignature(**H, signature=b"short"),
    ],
)
def test_unencodable_messages(msg: Message) -> None:
    with pytest.raises(MalformedMessage):
        msg.to_bytes()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    try:
        decode_message(data)
    except MalformedMessage:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_random_corruption_never_crashes_the_decoder(msg: Message, data) -> None:
    raw = bytearray(msg.to_bytes())
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except MalformedMessage:
        pass
