"""The shared adapter between `secagg` messages and the fedmask.v1 protos.

Used by both the coordinator and the edge client (which never import each
other). Imports only secagg, dpmech (the DP mechanism, D88), fedmask_proto,
numpy and google.protobuf.

    wire.ids           RoundIds: enrolled device_id <-> 0-based secagg id
                       (proto Participant.secagg_id is 1-based = secagg id + 1)
    wire.secagg_codec  *_to_proto / *_from_proto for every stage message,
                       client_/server_ to/from_proto dispatchers, abort reasons
    wire.tensors       numpy <-> Tensor / ModelParameters (float32 LE)
    wire.round_task    SecaggSettings <-> SecAggConfig, build/parse RoundTask
    wire.round_metrics the round metrics' slots, appended as integer limbs
                       to every masked input (D35)
    wire.dp_task       DpSettings <-> the discrete Gaussian both sides
                       derive (D88), the round's rotation seed
    WireError          the one exception for malformed input

See docs/wire-notes.md for the stage sequence on the session stream.
"""

from wire.errors import WireError
from wire.ids import RoundIds
from wire.round_task import (
    RoundTaskView,
    build_round_task,
    parse_round_task,
    secagg_config_from_proto,
    secagg_settings_to_proto,
)
from wire.secagg_codec import (
    CLIENT_FIELDS,
    SERVER_FIELDS,
    client_from_proto,
    client_to_proto,
    server_from_proto,
    server_to_proto,
)
from wire.tensors import params_from_proto, params_to_proto, tensor_from_proto, tensor_to_proto

__all__ = [
    "CLIENT_FIELDS",
    "SERVER_FIELDS",
    "RoundIds",
    "RoundTaskView",
    "WireError",
    "build_round_task",
    "client_from_proto",
    "client_to_proto",
    "params_from_proto",
    "params_to_proto",
    "parse_round_task",
    "secagg_config_from_proto",
    "secagg_settings_to_proto",
    "server_from_proto",
    "server_to_proto",
    "tensor_from_proto",
    "tensor_to_proto",
]
