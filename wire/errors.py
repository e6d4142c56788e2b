"""The one exception of the wire adapter."""

from __future__ import annotations


class WireError(ValueError):
    """A proto message (or a secagg message to encode) that breaks the wire
    contract: wrong sizes, unknown ids, oversized lists, garbage bytes, an
    impossible combination of settings. The text says what and where; it
    never contains key material or vector contents."""
