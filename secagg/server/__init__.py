"""Server states, one per protocol stage, mirroring secagg.client.

    ServerAdvertiseKeys --close()--> ServerShareKeys --close()--> ServerShareCheck
      --close()--> ServerMaskedInputCollection --close()--> [ServerConsistencyCheck --close()-->] ServerUnmasking --close()--> ServerCompleted
    any close() with too few devices --> ServerAborted(reason)
"""

from secagg.server.advertise_keys import ServerAdvertiseKeys
from secagg.server.base import Rejection, ServerAborted, ServerCompleted, ServerRound, ServerState
from secagg.server.consistency_check import ServerConsistencyCheck
from secagg.server.masked_input_collection import ServerMaskedInputCollection
from secagg.server.share_check import ServerShareCheck
from secagg.server.share_keys import ServerShareKeys
from secagg.server.unmasking import ServerUnmasking

__all__ = [
    "Rejection",
    "ServerAborted",
    "ServerAdvertiseKeys",
    "ServerCompleted",
    "ServerConsistencyCheck",
    "ServerMaskedInputCollection",
    "ServerRound",
    "ServerShareCheck",
    "ServerShareKeys",
    "ServerState",
    "ServerUnmasking",
]
