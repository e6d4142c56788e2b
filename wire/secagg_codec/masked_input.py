"""Stage 2 (masked input): MaskedInput <-> MaskedInput, client -> server.

The proto carries the masked vector as little-endian uint32 bytes, with its
length and the round's modulus_bits, both checked against the round.
"""

from __future__ import annotations

import numpy as np

from fedmask_proto.v1 import secagg_pb2
from secagg import messages as sm
from wire.errors import WireError
from wire.ids import RoundIds
from wire.secagg_codec import fields


def masked_input_to_proto(m: sm.MaskedInput, ids: RoundIds, *, modulus_bits: int) -> secagg_pb2.MaskedInput:
    v = m.vector
    if not isinstance(v, np.ndarray) or v.dtype != np.uint32 or v.ndim != 1:
        raise WireError("MaskedInput.vector must be a 1-D np.uint32 array")
    return secagg_pb2.MaskedInput(
        **fields.header_to_proto(m, ids),
        masked_vector=v.astype("<u4", copy=False).tobytes(),
        length=v.shape[0],
        modulus_bits=modulus_bits,
    )


def masked_input_from_proto(
    p: secagg_pb2.MaskedInput, ids: RoundIds, *, vector_length: int, modulus_bits: int
) -> sm.MaskedInput:
    """The vector is a read-only zero-copy view of the proto's bytes
    (np.frombuffer); the secagg server adds it into its sum in place.

    Note: secagg masks modulo 2^32 whatever modulus_bits is, so the words
    are arbitrary uint32; `modulus_bits` is only checked to match the round."""
    what = "MaskedInput"
    header = fields.header_from_proto(p, ids, what)
    if p.length != vector_length:
        raise WireError(f"{what}.length is {p.length}, the round's vector_length is {vector_length}")
    if len(p.masked_vector) != 4 * vector_length:
        raise WireError(f"{what}.masked_vector is {len(p.masked_vector)} bytes, expected 4 * {vector_length}")
    if p.modulus_bits != modulus_bits:
        raise WireError(f"{what}.modulus_bits is {p.modulus_bits}, the round's is {modulus_bits}")
    vector = np.frombuffer(p.masked_vector, dtype="<u4")
    if vector.dtype != np.uint32:  # big-endian host: one conversion
        vector = vector.astype(np.uint32)
    return sm.MaskedInput(**header, vector=vector)
