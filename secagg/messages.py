"""Typed protocol messages and their compact wire format.

Every message carries the header (session_id, round_idx, device_id):
`device_id` is the sender of a client message and the addressee of a server
message. Handlers reject a header from another session or round (replays)
and a device_id that is not the expected one.

Wire format (all integers big-endian, except vector words):

    header  = version u8 (=1) | type u8 | len(session) u8 | session
              | round u64 | device u32                     (15 + len(session))
    ids     = count u32 | id u32 * count
    blob    = len u16 | bytes

    AdvertiseKeys         header | c_pk[32] | s_pk[32] | signature blob
    KeyList               header | count u32 | (id u32 | c_pk | s_pk | signature blob)*
    ShareKeys             header | count u32 | (receiver u32 | sealed blob)*
    ShareRelay            header | count u32 | (sender u32 | sealed blob)*
    ShareReceipt          header | undecryptable ids
    MaskingRequest        header | peer ids
    MaskedInput           header | L u32 | L little-endian uint32 words
    ConsistencyRequest    header | alive ids
    ConsistencySignature  header | signature[64]
    UnmaskingRequest      header | alive ids | dropped ids | count u32 | (id u32 | signature[64])*
    UnmaskingResponse     header | count u32 | (owner u32 | share[33])* (b-shares)
                                 | count u32 | (owner u32 | share[33])* (s-shares)
                                 | count u32 | (owner u32 | k u32 | share[33])* (component seeds)
    ClientAbort/ServerAbort header | reason u8

So a masked input is 4L + 19 + len(session) bytes, and one encrypted share
pair (two 33-byte field elements under AES-GCM) is a 94-byte sealed blob.
`decode_message` raises MalformedMessage on any deviation, including trailing
bytes.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from secagg.errors import ABORT_REASON_BY_CODE, ABORT_REASON_CODES, AbortReason, MalformedMessage
from secagg.shamir import ELEMENT_BYTES

WIRE_VERSION = 2  # 2: ShareReceipt and MaskingRequest; MaskedInput without ids
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class MessageType(enum.IntEnum):
    ADVERTISE_KEYS = 1
    KEY_LIST = 2
    SHARE_KEYS = 3
    SHARE_RELAY = 4
    MASKED_INPUT = 5
    CONSISTENCY_REQUEST = 6
    CONSISTENCY_SIGNATURE = 7
    UNMASKING_REQUEST = 8
    UNMASKING_RESPONSE = 9
    CLIENT_ABORT = 10
    SERVER_ABORT = 11
    SHARE_RECEIPT = 12
    MASKING_REQUEST = 13


class _Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self.parts.append(struct.pack(">B", v))

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack(">I", v))

    def raw(self, b: bytes, length: int | None = None) -> None:
        if length is not None and len(b) != length:
            raise ValueError(f"expected {length} bytes, got {len(b)}")
        self.parts.append(bytes(b))

    def blob(self, b: bytes) -> None:
        self.parts.append(struct.pack(">H", len(b)))
        self.parts.append(bytes(b))

    def ids(self, ids: tuple[int, ...]) -> None:
        self.parts.append(struct.pack(f">I{len(ids)}I", len(ids), *ids))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


def _write_id_blobs(w: _Writer, items: tuple[tuple[int, bytes], ...]) -> None:
    w.u32(len(items))
    pack = struct.Struct(">IH").pack
    for ident, blob in items:
        w.parts.append(pack(ident, len(blob)))
        w.parts.append(bytes(blob))


def _read_id_blobs(r: _Reader) -> tuple[tuple[int, bytes], ...]:
    n = r.count(6)
    data, pos, end = r.data, r.pos, len(r.data)
    unpack = struct.Struct(">IH").unpack_from
    out = []
    for _ in range(n):
        if pos + 6 > end:
            raise MalformedMessage("truncated message")
        ident, size = unpack(data, pos)
        pos += 6
        if pos + size > end:
            raise MalformedMessage("truncated message")
        out.append((ident, data[pos : pos + size]))
        pos += size
    r.pos = pos
    return tuple(out)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise MalformedMessage("truncated message")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "big")

    def blob(self) -> bytes:
        return self.take(struct.unpack(">H", self.take(2))[0])

    def count(self, item_bytes: int) -> int:
        n = self.u32()
        if n * item_bytes > len(self.data) - self.pos:
            raise MalformedMessage("count exceeds the message")
        return n

    def ids(self) -> tuple[int, ...]:
        n = self.count(4)
        return struct.unpack(f">{n}I", self.take(4 * n))

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage("trailing bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """Base of every message. Not instantiated directly."""

    TYPE: ClassVar[MessageType]
    session_id: bytes
    round_idx: int
    device_id: int

    def to_bytes(self) -> bytes:
        """The wire encoding (see module doc). MalformedMessage if a field
        cannot be encoded (wrong type, size or range)."""
        w = _Writer()
        try:
            w.u8(WIRE_VERSION)
            w.u8(self.TYPE)
            w.u8(len(self.session_id))
            w.raw(self.session_id)
            w.parts.append(struct.pack(">QI", self.round_idx, self.device_id))
            self._write_body(w)
        except (struct.error, ValueError, TypeError, OverflowError, AttributeError) as exc:
            raise MalformedMessage(f"cannot encode {type(self).__name__}: {exc}") from None
        return w.getvalue()

    def _write_body(self, w: _Writer) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> Message:  # pragma: no cover - abstract
        raise NotImplementedError


# --------------------------------------------------------------------------- client -> server


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvertiseKeys(Message):
    """Round 0: the device's two X25519 public keys (c: share encryption,
    s: pairwise masks); signed with its identity key in active mode."""

    TYPE: ClassVar[MessageType] = MessageType.ADVERTISE_KEYS
    c_public: bytes
    s_public: bytes
    signature: bytes = b""

    def _write_body(self, w: _Writer) -> None:
        w.raw(self.c_public, PUBLIC_KEY_BYTES)
        w.raw(self.s_public, PUBLIC_KEY_BYTES)
        w.blob(self.signature)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> AdvertiseKeys:
        return cls(**header, c_public=r.take(32), s_public=r.take(32), signature=r.blob())


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareKeys(Message):
    """Round 1: (receiver, sealed shares of b_u and s_u^SK) per neighbour."""

    TYPE: ClassVar[MessageType] = MessageType.SHARE_KEYS
    shares: tuple[tuple[int, bytes], ...]

    def _write_body(self, w: _Writer) -> None:
        _write_id_blobs(w, self.shares)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ShareKeys:
        return cls(**header, shares=_read_id_blobs(r))


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareReceipt(Message):
    """Share check: the peers whose relayed shares failed to decrypt at this
    device (it holds no usable share of theirs). Empty when all opened."""

    TYPE: ClassVar[MessageType] = MessageType.SHARE_RECEIPT
    undecryptable: tuple[int, ...] = ()

    def _write_body(self, w: _Writer) -> None:
        w.ids(self.undecryptable)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ShareReceipt:
        return cls(**header, undecryptable=r.ids())


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MaskedInput(Message):
    """Round 2: y_u (uint32, length L), masked with the peers the
    MaskingRequest named."""

    TYPE: ClassVar[MessageType] = MessageType.MASKED_INPUT
    vector: np.ndarray

    def _write_body(self, w: _Writer) -> None:
        v = self.vector
        if not isinstance(v, np.ndarray) or v.dtype != np.uint32 or v.ndim != 1:
            raise ValueError("vector must be a 1-D np.uint32 array")
        w.u32(v.shape[0])
        w.parts.append(v.astype("<u4", copy=False).tobytes())

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> MaskedInput:
        length = r.count(4)
        start = r.pos
        r.take(4 * length)
        vector = np.frombuffer(r.data, dtype="<u4", count=length, offset=start)
        return cls(**header, vector=vector)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencySignature(Message):
    """Active mode: the device's Ed25519 signature of the survivor set."""

    TYPE: ClassVar[MessageType] = MessageType.CONSISTENCY_SIGNATURE
    signature: bytes

    def _write_body(self, w: _Writer) -> None:
        w.raw(self.signature, SIGNATURE_BYTES)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ConsistencySignature:
        return cls(**header, signature=r.take(SIGNATURE_BYTES))


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskingResponse(Message):
    """Round 3: shares of b_v for the listed alive peers (owner, element) and
    of s_v^SK for the listed dropped peers; with removable noise, shares of
    the alive peers' component seeds (owner, k, element)."""

    TYPE: ClassVar[MessageType] = MessageType.UNMASKING_RESPONSE
    b_shares: tuple[tuple[int, int], ...]
    s_shares: tuple[tuple[int, int], ...]
    component_shares: tuple[tuple[int, int, int], ...] = ()

    def _write_body(self, w: _Writer) -> None:
        for shares in (self.b_shares, self.s_shares):
            w.u32(len(shares))
            for owner, value in shares:
                w.u32(owner)
                w.parts.append(value.to_bytes(ELEMENT_BYTES, "big"))
        w.u32(len(self.component_shares))
        for owner, k, value in self.component_shares:
            w.u32(owner)
            w.u32(k)
            w.parts.append(value.to_bytes(ELEMENT_BYTES, "big"))

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> UnmaskingResponse:
        lists = []
        for _ in range(2):
            n = r.count(4 + ELEMENT_BYTES)
            lists.append(tuple((r.u32(), int.from_bytes(r.take(ELEMENT_BYTES), "big")) for _ in range(n)))
        n = r.count(8 + ELEMENT_BYTES)
        components = tuple((r.u32(), r.u32(), int.from_bytes(r.take(ELEMENT_BYTES), "big")) for _ in range(n))
        return cls(**header, b_shares=lists[0], s_shares=lists[1], component_shares=components)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientAbort(Message):
    """The device leaves the round (its own choice or a check failed)."""

    TYPE: ClassVar[MessageType] = MessageType.CLIENT_ABORT
    reason: AbortReason

    def _write_body(self, w: _Writer) -> None:
        w.u8(ABORT_REASON_CODES[self.reason])

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ClientAbort:
        return cls(**header, reason=_reason(r.u8()))


# --------------------------------------------------------------------------- server -> client


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One advertised device in a KeyList."""

    device_id: int
    c_public: bytes
    s_public: bytes
    signature: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyList(Message):
    """End of round 0: the advertised keys of the addressee's closure."""

    TYPE: ClassVar[MessageType] = MessageType.KEY_LIST
    entries: tuple[KeyEntry, ...]

    def _write_body(self, w: _Writer) -> None:
        w.u32(len(self.entries))
        for e in self.entries:
            w.u32(e.device_id)
            w.raw(e.c_public, PUBLIC_KEY_BYTES)
            w.raw(e.s_public, PUBLIC_KEY_BYTES)
            w.blob(e.signature)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> KeyList:
        n = r.count(70)
        return cls(
            **header,
            entries=tuple(KeyEntry(r.u32(), r.take(32), r.take(32), r.blob()) for _ in range(n)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareRelay(Message):
    """End of round 1: (sender, sealed shares) addressed to this device."""

    TYPE: ClassVar[MessageType] = MessageType.SHARE_RELAY
    shares: tuple[tuple[int, bytes], ...]

    def _write_body(self, w: _Writer) -> None:
        _write_id_blobs(w, self.shares)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ShareRelay:
        return cls(**header, shares=_read_id_blobs(r))


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskingRequest(Message):
    """End of the share check: the peers the addressee masks with, a subset
    of those whose shares were relayed to it (senders some device reported
    as undecryptable, and devices that sent no receipt, are left out)."""

    TYPE: ClassVar[MessageType] = MessageType.MASKING_REQUEST
    peers: tuple[int, ...]

    def _write_body(self, w: _Writer) -> None:
        w.ids(self.peers)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> MaskingRequest:
        return cls(**header, peers=r.ids())


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyRequest(Message):
    """Active mode: the survivor set U3 of masked-input collection, to sign."""

    TYPE: ClassVar[MessageType] = MessageType.CONSISTENCY_REQUEST
    alive: tuple[int, ...]

    def _write_body(self, w: _Writer) -> None:
        w.ids(self.alive)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ConsistencyRequest:
        return cls(**header, alive=r.ids())


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskingRequest(Message):
    """Round 3: which of the addressee's share owners are alive (reveal the
    b-share) and which dropped (reveal the s-share); in active mode, the
    consistency signatures of the addressee's closure."""

    TYPE: ClassVar[MessageType] = MessageType.UNMASKING_REQUEST
    alive: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: tuple[tuple[int, bytes], ...] = field(default=())

    def _write_body(self, w: _Writer) -> None:
        w.ids(self.alive)
        w.ids(self.dropped)
        w.u32(len(self.signatures))
        for signer, sig in self.signatures:
            w.u32(signer)
            w.raw(sig, SIGNATURE_BYTES)

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> UnmaskingRequest:
        alive = r.ids()
        dropped = r.ids()
        n = r.count(4 + SIGNATURE_BYTES)
        sigs = tuple((r.u32(), r.take(SIGNATURE_BYTES)) for _ in range(n))
        return cls(**header, alive=alive, dropped=dropped, signatures=sigs)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAbort(Message):
    """The round is over for the addressee (aborted, or the device was dropped)."""

    TYPE: ClassVar[MessageType] = MessageType.SERVER_ABORT
    reason: AbortReason

    def _write_body(self, w: _Writer) -> None:
        w.u8(ABORT_REASON_CODES[self.reason])

    @classmethod
    def _read_body(cls, r: _Reader, header: dict[str, Any]) -> ServerAbort:
        return cls(**header, reason=_reason(r.u8()))


def _reason(code: int) -> AbortReason:
    try:
        return ABORT_REASON_BY_CODE[code]
    except KeyError:
        raise MalformedMessage(f"unknown abort reason code {code}") from None


CLIENT_MESSAGES = (AdvertiseKeys, ShareKeys, ShareReceipt, MaskedInput, ConsistencySignature, UnmaskingResponse, ClientAbort)
SERVER_MESSAGES = (KeyList, ShareRelay, MaskingRequest, ConsistencyRequest, UnmaskingRequest, ServerAbort)
_BY_TYPE: dict[int, type[Message]] = {cls.TYPE: cls for cls in CLIENT_MESSAGES + SERVER_MESSAGES}


def decode_message(data: bytes) -> Message:
    """Parse one message; MalformedMessage on anything but an exact encoding."""
    data = bytes(data)
    r = _Reader(data)
    if r.u8() != WIRE_VERSION:
        raise MalformedMessage("unknown wire version")
    cls = _BY_TYPE.get(r.u8())
    if cls is None:
        raise MalformedMessage("unknown message type")
    session_id = r.take(r.u8())
    round_idx = r.u64()
    device_id = r.u32()
    msg = cls._read_body(r, {"session_id": session_id, "round_idx": round_idx, "device_id": device_id})
    r.end()
    return msg
