"""Every from_proto refuses malformed input with a WireError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedmask_proto.v1 import common_pb2, secagg_pb2, session_pb2
from secagg.config import SecAggConfig
from secagg.messages import MaskedInput
from wire import RoundIds, WireError, params_from_proto, params_to_proto, secagg_config_from_proto
from wire import secagg_codec as codec
from wire.protocol import SEALED_SHARES_BYTES
from wire.round_task import secagg_settings_to_proto
from wire.tensors import tensor_from_proto, tensor_to_proto

IDS = RoundIds.from_cohort([10, 20, 30, 40])
HDR: dict[str, Any] = dict(session_id=b"sess", round_number=1, device_id=20)
SEALED = b"\x00" * SEALED_SHARES_BYTES


def test_id_mapping_is_one_based_in_proto():
    assert IDS.secagg(10) == 0 and IDS.proto_secagg_id(10) == 1 and IDS.device(3) == 40
    with pytest.raises(WireError, match="not part of this round"):
        IDS.secagg(99)
    with pytest.raises(WireError):
        RoundIds.from_cohort([1, 1])
    with pytest.raises(WireError, match="outside"):
        RoundIds.from_participants([session_pb2.Participant(device_id=5, secagg_id=0)], num_clients=2)
    with pytest.raises(WireError, match="two secagg ids"):
        RoundIds.from_participants(
            [session_pb2.Participant(device_id=5, secagg_id=1), session_pb2.Participant(device_id=5, secagg_id=2)],
            num_clients=2,
        )


@pytest.mark.parametrize(
    "msg, match",
    [
        (secagg_pb2.AdvertiseKeys(**HDR, c_pk=b"x" * 31, s_pk=b"y" * 32), "c_pk"),
        (secagg_pb2.AdvertiseKeys(**HDR, c_pk=b"x" * 32, s_pk=b"y" * 32, signature=b"z"), "signature"),
        (secagg_pb2.AdvertiseKeys(session_id=b"", round_number=1, device_id=20, c_pk=b"x" * 32, s_pk=b"y" * 32), "session_id"),
        (secagg_pb2.AdvertiseKeys(session_id=b"s", round_number=1, device_id=21, c_pk=b"x" * 32, s_pk=b"y" * 32), "not part"),
        (secagg_pb2.AdvertiseKeys(session_id=b"s", round_number=1, device_id=0), "device_id 0"),
        (secagg_pb2.ShareKeys(**HDR, shares=[secagg_pb2.EncryptedShare(sender=10, receiver=30, ciphertext=SEALED)]), "sender"),
        (secagg_pb2.ShareKeys(**HDR, shares=[secagg_pb2.EncryptedShare(sender=20, receiver=99, ciphertext=SEALED)]), "not part"),
        (secagg_pb2.ShareKeys(**HDR, shares=[secagg_pb2.EncryptedShare(sender=20, receiver=30, ciphertext=b"x")]), "ciphertext"),
        (secagg_pb2.ShareKeys(**HDR, shares=[secagg_pb2.EncryptedShare(sender=20, receiver=30, ciphertext=SEALED)] * 5), "entries"),
        (secagg_pb2.MaskedInput(**HDR, masked_vector=b"\0" * 12, length=4, modulus_bits=32), "bytes"),
        (secagg_pb2.MaskedInput(**HDR, masked_vector=b"\0" * 12, length=3, modulus_bits=32), "vector_length"),
        (secagg_pb2.MaskedInput(**HDR, masked_vector=b"\0" * 16, length=4, modulus_bits=31), "modulus_bits"),
        (secagg_pb2.ShareReceipt(**HDR, undecryptable=[77]), "not part"),
        (secagg_pb2.ConsistencyCheck(**HDR, signature=b"s" * 63), "signature"),
        (secagg_pb2.UnmaskingResponse(**HDR, b_shares=[secagg_pb2.SecretShare(owner=10, share=b"\0" * 32)]), "share"),
        (secagg_pb2.UnmaskingResponse(**HDR, b_shares=[secagg_pb2.SecretShare(owner=10, share=b"\xff" * 33)]), "field element"),
        (secagg_pb2.UnmaskingResponse(**HDR, s_sk_shares=[secagg_pb2.SecretShare(owner=11, share=b"\0" * 33)]), "not part"),
        (common_pb2.AbortNotice(**HDR), "unspecified"),
        (common_pb2.AbortNotice(session_id=b"s", round_number=1, device_id=0, reason=common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS), "device_id 0"),
        (common_pb2.AbortNotice(**HDR, reason=common_pb2.ABORT_REASON_TOO_FEW_SURVIVORS, detail="x" * 5000), "detail"),
        (session_pb2.Hello(), "not a client stage message"),
    ],
)
def test_client_messages_rejected(msg, match):
    with pytest.raises(WireError, match=match):
        codec.client_from_proto(msg, IDS, vector_length=4, modulus_bits=32)


@pytest.mark.parametrize(
    "msg, match",
    [
        (secagg_pb2.ForwardedShares(**HDR, shares=[secagg_pb2.EncryptedShare(sender=10, receiver=30, ciphertext=SEALED)]), "receiver"),
        (secagg_pb2.ForwardedShares(**HDR, shares=[secagg_pb2.EncryptedShare(sender=12, receiver=20, ciphertext=SEALED)]), "not part"),
        (secagg_pb2.UnmaskingRequest(**HDR, alive=[10, 20, 55]), "not part"),
        (secagg_pb2.UnmaskingRequest(**HDR, alive=[10] * 9), "entries"),
        (secagg_pb2.UnmaskingRequest(**HDR, signatures=[secagg_pb2.ConsistencySignature(device_id=10, signature=b"")]), "signature"),
        (secagg_pb2.ConsistencyCheckRequest(**HDR, survivors=[10, 13]), "not part"),
        (secagg_pb2.MaskingRequest(**HDR, peers=[10, 77]), "not part"),
        (secagg_pb2.AdvertisedKeys(**HDR, peers=[secagg_pb2.PeerKeys(device_id=20, c_pk=b"a" * 32, s_pk=b"b" * 32)]), "addressee"),
        (secagg_pb2.AdvertisedKeys(**HDR, peers=[secagg_pb2.PeerKeys(device_id=10, c_pk=b"a" * 3, s_pk=b"b" * 32)]), "c_pk"),
        (secagg_pb2.AdvertisedKeys(**HDR, peers=[secagg_pb2.PeerKeys(device_id=10, c_pk=b"a" * 32, s_pk=b"b" * 32, identity_public_key=b"k")]), "identity"),
    ],
)
def test_server_messages_rejected(msg, match):
    from secagg.messages import AdvertiseKeys

    own = AdvertiseKeys(session_id=b"sess", round_idx=1, device_id=1, c_public=b"c" * 32, s_public=b"s" * 32)
    with pytest.raises(WireError, match=match):
        codec.server_from_proto(msg, IDS, own=own)


def test_masked_input_is_a_zero_copy_view():
    vec = np.arange(4, dtype=np.uint32) * 1_000_000_007
    m = MaskedInput(session_id=b"sess", round_idx=1, device_id=1, vector=vec)
    p = codec.masked_input_to_proto(m, IDS, modulus_bits=32)
    assert p.masked_vector == vec.astype("<u4").tobytes()
    back = codec.masked_input_from_proto(p, IDS, vector_length=4, modulus_bits=32)
    assert np.array_equal(back.vector, vec)
    assert not back.vector.flags.writeable


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_bytes_never_escape_as_other_errors(data):
    for cls in (secagg_pb2.AdvertiseKeys, secagg_pb2.ShareKeys, secagg_pb2.ShareReceipt, secagg_pb2.MaskedInput, secagg_pb2.UnmaskingResponse):
        p = cls()
        try:
            p.ParseFromString(data)
        except Exception:  # protobuf's DecodeError: the servicer maps it separately
            continue
        try:
            codec.client_from_proto(p, IDS, vector_length=4, modulus_bits=32)
        except WireError:
            pass


def test_secagg_settings_round_trip_is_identical():
    for kw in (
        dict(num_clients=10, vector_length=3),
        dict(num_clients=100, vector_length=3, neighbors="auto"),
        dict(num_clients=12, vector_length=3, neighbors=6, threshold=5, clip=0.1),
        dict(num_clients=9, vector_length=3, precision=1e-4, active_adversary=True),
        dict(num_clients=9, vector_length=3, modulus_bits=24),
    ):
        cfg = SecAggConfig.create(session_id=b"x" * 16, **kw)
        s = secagg_settings_to_proto(cfg)
        assert secagg_config_from_proto(s, b"x" * 16) == cfg


def test_bad_secagg_settings():
    ok = secagg_settings_to_proto(SecAggConfig.create(num_clients=5, vector_length=3, session_id=b"s"))
    for change, match in (
        (dict(graph=0), "graph"),
        (dict(threshold=1), "threshold"),
        (dict(signatures=True), "both"),
        (dict(clip=float("nan")), "clip"),
        (dict(modulus_bits=40), "SecaggSettings"),
        (dict(cohort_size=1), "SecaggSettings"),
    ):
        s = session_pb2.SecaggSettings()
        s.CopyFrom(ok)
        for k, v in change.items():
            setattr(s, k, v)
        with pytest.raises(WireError, match=match):
            secagg_config_from_proto(s, b"s")


def test_params_round_trip_and_checks():
    params: dict[str, np.ndarray] = {
        "C": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32),
        "b": np.zeros(5, np.float64),
    }
    p = params_to_proto(params)
    back = params_from_proto(p, expected={"C": (3, 4), "b": (5,)})
    assert back["C"].dtype == np.float32 and np.array_equal(back["C"], params["C"])
    assert back["b"].dtype == np.float32
    with pytest.raises(WireError, match="shape"):
        params_from_proto(p, expected={"C": (4, 3), "b": (5,)})
    with pytest.raises(WireError, match="missing"):
        params_from_proto(p, expected={"C": (3, 4)})
    bad = common_pb2.ModelParameters()
    bad.CopyFrom(p)
    bad.tensors[0].tensor.data = bad.tensors[0].tensor.data[:-1]
    with pytest.raises(WireError, match="data bytes"):
        params_from_proto(bad)
    bad.CopyFrom(p)
    bad.tensors[1].tensor.dtype = common_pb2.DTYPE_FLOAT64
    with pytest.raises(WireError, match="dtype"):
        params_from_proto(bad)
    bad.CopyFrom(p)
    bad.tensors.add().CopyFrom(bad.tensors[0])
    with pytest.raises(WireError, match="twice"):
        params_from_proto(bad)
    with pytest.raises(WireError, match="floating"):
        params_to_proto({"i": np.zeros(2, np.int64)})
    with pytest.raises(WireError, match="elements"):
        params_from_proto(p, max_elements=10)
    assert params_from_proto(p, writable=True)["C"].flags.writeable


def test_tensor_any_dtype():
    for a in (np.arange(6, dtype=np.int64).reshape(2, 3), np.asarray(np.float16(1.5)), np.arange(3, dtype=np.uint32)):
        back = tensor_from_proto(tensor_to_proto(a))
        assert back.dtype == np.asarray(a).dtype and np.array_equal(back, a)
    with pytest.raises(WireError):
        tensor_from_proto(common_pb2.Tensor())
