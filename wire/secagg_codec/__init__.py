"""secagg stage messages <-> fedmask.v1 proto messages, both directions.

    secagg (0-based ids)        proto (enrolled device ids)      direction    module
    AdvertiseKeys           <-> AdvertiseKeys                    c -> s       keys
    KeyList                 <-> AdvertisedKeys (self excluded)   s -> c       keys
    ShareKeys               <-> ShareKeys                        c -> s       shares
    ShareRelay              <-> ForwardedShares                  s -> c       shares
    ShareReceipt            <-> ShareReceipt                     c -> s       shares
    MaskingRequest          <-> MaskingRequest                   s -> c       shares
    MaskedInput             <-> MaskedInput (LE uint32 bytes)    c -> s       masked_input
    ConsistencyRequest      <-> ConsistencyCheckRequest          s -> c       consistency
    ConsistencySignature    <-> ConsistencyCheck                 c -> s       consistency
    UnmaskingRequest        <-> UnmaskingRequest                 s -> c       unmasking
    UnmaskingResponse       <-> UnmaskingResponse                c -> s       unmasking
    ClientAbort             <-> AbortNotice                      c -> s       aborts
    ServerAbort             <-> AbortNotice                      s -> c       aborts

`dispatch` converts any stage message of either side; `abort_reasons` maps
the abort and drop reasons; `fields` holds the header and field checks all
of them share. This package is the public face: import from
`wire.secagg_codec`.

Every ``*_to_proto`` takes the secagg message and the round's `RoundIds`
(see wire.ids for the 1-based/0-based mapping); every ``*_from_proto`` takes
the proto message and the same map and returns the secagg message, after
checking sizes, ids and list lengths: anything off raises `WireError`.

Not checked here (the caller's job): that (session_id, round_number) is the
device's current round (replay rule: the receiver *discards* such messages),
and that the sending stream hosts `device_id`. Semantic checks (signatures,
the neighbourhood, duplicates inside the protocol) are the secagg states'.

A proto AbortNotice with device_id == 0 ("the whole round" / "all my
devices") has no single secagg counterpart: expand it with `expand_abort`
first.
"""

from wire.secagg_codec.abort_reasons import (
    ProtoAbortReason,
    abort_reason_from_proto,
    abort_reason_to_proto,
    drop_notice_reason,
    reason_name,
)
from wire.secagg_codec.aborts import (
    MAX_DETAIL_CHARS,
    abort_to_proto,
    client_abort_from_proto,
    expand_abort,
    round_abort_notice,
    server_abort_from_proto,
)
from wire.secagg_codec.consistency import (
    consistency_check_from_proto,
    consistency_check_to_proto,
    consistency_request_from_proto,
    consistency_request_to_proto,
)
from wire.secagg_codec.dispatch import (
    CLIENT_FIELDS,
    SERVER_FIELDS,
    ClientStageProto,
    ServerStageProto,
    client_from_proto,
    client_to_proto,
    server_from_proto,
    server_to_proto,
)
from wire.secagg_codec.keys import (
    advertise_keys_from_proto,
    advertise_keys_to_proto,
    key_list_from_proto,
    key_list_to_proto,
)
from wire.secagg_codec.masked_input import masked_input_from_proto, masked_input_to_proto
from wire.secagg_codec.shares import (
    masking_request_from_proto,
    masking_request_to_proto,
    share_keys_from_proto,
    share_keys_to_proto,
    share_receipt_from_proto,
    share_receipt_to_proto,
    share_relay_from_proto,
    share_relay_to_proto,
)
from wire.secagg_codec.unmasking import (
    SHARE_BYTES,
    unmasking_request_from_proto,
    unmasking_request_to_proto,
    unmasking_response_from_proto,
    unmasking_response_to_proto,
)

__all__ = [
    "CLIENT_FIELDS",
    "MAX_DETAIL_CHARS",
    "SERVER_FIELDS",
    "SHARE_BYTES",
    "ClientStageProto",
    "ProtoAbortReason",
    "ServerStageProto",
    "abort_reason_from_proto",
    "abort_reason_to_proto",
    "abort_to_proto",
    "advertise_keys_from_proto",
    "advertise_keys_to_proto",
    "client_abort_from_proto",
    "client_from_proto",
    "client_to_proto",
    "consistency_check_from_proto",
    "consistency_check_to_proto",
    "consistency_request_from_proto",
    "consistency_request_to_proto",
    "drop_notice_reason",
    "expand_abort",
    "key_list_from_proto",
    "key_list_to_proto",
    "masked_input_from_proto",
    "masked_input_to_proto",
    "masking_request_from_proto",
    "masking_request_to_proto",
    "reason_name",
    "round_abort_notice",
    "server_abort_from_proto",
    "server_from_proto",
    "server_to_proto",
    "share_keys_from_proto",
    "share_keys_to_proto",
    "share_receipt_from_proto",
    "share_receipt_to_proto",
    "share_relay_from_proto",
    "share_relay_to_proto",
    "unmasking_request_from_proto",
    "unmasking_request_to_proto",
    "unmasking_response_from_proto",
    "unmasking_response_to_proto",
]
