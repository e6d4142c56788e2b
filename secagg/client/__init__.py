"""Client (device) states, one per protocol stage, mirroring secagg.server.

    ClientAdvertiseKeys --start()--> ClientShareKeys --KeyList--> ClientShareCheck
      --ShareRelay--> ClientMaskedInputCollection --MaskingRequest-->
      [ClientConsistencyCheck --ConsistencyRequest-->] ClientUnmasking
      --UnmaskingRequest--> ClientCompleted;   any stage --> ClientAborted(reason)
"""

from secagg.client.advertise_keys import ClientAdvertiseKeys
from secagg.client.base import ClientAborted, ClientCompleted, ClientState
from secagg.client.consistency_check import ClientConsistencyCheck
from secagg.client.masked_input_collection import ClientMaskedInputCollection
from secagg.client.share_check import ClientShareCheck
from secagg.client.share_keys import ClientShareKeys
from secagg.client.unmasking import ClientUnmasking

__all__ = [
    "ClientAborted",
    "ClientAdvertiseKeys",
    "ClientCompleted",
    "ClientConsistencyCheck",
    "ClientMaskedInputCollection",
    "ClientShareCheck",
    "ClientShareKeys",
    "ClientState",
    "ClientUnmasking",
]
