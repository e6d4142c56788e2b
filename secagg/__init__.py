"""Bonawitz et al. (CCS 2017) secure aggregation with the SecAgg+ sparse graphs of Bell et al. (CCS 2020).

A pure library: standard library, numpy and cryptography only; no I/O.
Protocol objects take a message and return the messages to send.

Entry points:
    SecAggConfig.create(...)                       settings of one cohort
    config.encoding.encode(x, rng)                 float update -> uint32 vector
    IntegerSumEncoding.for_encoding(enc)           exact integer sums beside it (secagg.integer_sums)
    ClientAdvertiseKeys(config, id, round, x_enc)  a device's first state (secagg.client)
    ServerAdvertiseKeys(config, round)             the server's first state (secagg.server)
    decode_message(data) / message.to_bytes()      the wire format (secagg.messages)
    secagg.inprocess.run_round(inputs, config=...) the in-process driver
    secagg.groups.partition(cohort, group_size=G, seed=...)  a round's cohort in groups (D87)
    secagg.grouped_round.run_grouped_round(...)    one instance per group, the sums added
"""

from secagg.client import ClientAborted, ClientAdvertiseKeys, ClientCompleted
from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from secagg.errors import (
    AbortReason,
    SecAggConfigError,
    DecryptionError,
    DropReason,
    EncodingRangeError,
    MalformedMessage,
    ProtocolMisuse,
    SecAggError,
)
from secagg.messages import decode_message
from secagg.server import ServerAborted, ServerAdvertiseKeys, ServerCompleted

__all__ = [
    "AbortReason",
    "ClientAborted",
    "ClientAdvertiseKeys",
    "ClientCompleted",
    "SecAggConfigError",
    "DecryptionError",
    "DropReason",
    "EncodingRangeError",
    "FixedPointEncoding",
    "MalformedMessage",
    "ProtocolMisuse",
    "SecAggConfig",
    "SecAggError",
    "ServerAborted",
    "ServerAdvertiseKeys",
    "ServerCompleted",
    "decode_message",
]
