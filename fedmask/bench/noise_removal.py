"""The figures `fedmask bench round --dp-dropouts` adds: what each way of
handling dropped devices' noise (D19's and Dordis's, D110) costs a round.

- `removal_seconds(log_text)`: round number -> (seconds, components) of the
  coordinator's surplus removal, from its `surplus_removed` log lines.
- `message_bytes(...)`: the wire size (protobuf ByteSize) of one device's
  ShareKeys and of one UnmaskingResponse, built with the round's real
  shapes (n devices, m component seeds, s counted): the messages the
  removable noise makes larger.
- `epsilons(...)`: a round's epsilon at the ledger's delta by the proven
  bound (what the ledger records) and, for removable noise, by the bound for
  shares of different variances (`dpmech.removable_noise`), which extends
  Kairouz, Liu and Steinke's by a step this project has checked numerically
  against the exact divergence but not proved: reported beside the ledger's,
  never instead of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpmech import accounting
from dpmech.mechanism import MechanismConfig, privacy_rho
from dpmech.removable_encoding import RemovableNoise
from dpmech.removable_noise import kept_rho
from fedmask_proto.v1 import secagg_pb2
from secagg.shamir import ELEMENT_BYTES
from wire.protocol import sealed_shares_bytes

_REMOVED = re.compile(r"event=surplus_removed round=(\d+) components=(\d+) seconds=([0-9.]+)")
_SESSION_ID_BYTES = 48  # a round's session id on the wire (as the MaskedInput figure assumes)


def removal_seconds(log_text: str) -> dict[int, tuple[float, int]]:
    """Round number -> (seconds, components regenerated) of each surplus removal logged."""
    return {int(m.group(1)): (float(m.group(3)), int(m.group(2))) for m in _REMOVED.finditer(log_text)}


@dataclass(frozen=True)
class MessageBytes:
    share_keys: int  # one device's ShareKeys: n - 1 sealed blobs
    unmasking_response: int  # one device's answer when s of n are counted


def message_bytes(devices: int, components: int, counted: int, removed_per_device: int) -> MessageBytes:
    """Protobuf ByteSize of one device's ShareKeys and UnmaskingResponse in
    a complete-graph round of `devices` (ids up to `devices`, a 48-byte
    session id), `components` seeds per device, `counted` survivors whose
    `removed_per_device` components each are revealed (0: D19's round)."""
    blob = bytes(sealed_shares_bytes(components))
    share_keys = secagg_pb2.ShareKeys(
        session_id=bytes(_SESSION_ID_BYTES), round_number=1, device_id=devices,
        shares=[secagg_pb2.EncryptedShare(sender=devices, receiver=u, ciphertext=blob) for u in range(1, devices)])
    share = bytes(ELEMENT_BYTES)
    response = secagg_pb2.UnmaskingResponse(
        session_id=bytes(_SESSION_ID_BYTES), round_number=1, device_id=devices,
        b_shares=[secagg_pb2.SecretShare(owner=u, share=share) for u in range(1, counted + 1)],
        s_sk_shares=[secagg_pb2.SecretShare(owner=u, share=share) for u in range(counted + 1, devices + 1)],
        component_shares=[secagg_pb2.ComponentShare(owner=u, component=components - k, share=share)
                          for u in range(1, counted + 1) for k in range(removed_per_device)])
    return MessageBytes(share_keys=share_keys.ByteSize(), unmasking_response=response.ByteSize())


def epsilons(mechanism: MechanismConfig, devices: int, threshold: int, counted: int, delta: float,
             removable: bool) -> dict[str, float]:
    """One round's epsilon at `delta`: "proven" (the ledger's: the counted
    devices' shares of the mechanism's sigma^2, which under removable noise
    is the best single component's bound) and, with `removable`,
    "unequal_shares" (every kept component, by the unproven extension)."""
    out = {"proven": accounting.epsilon([privacy_rho(mechanism, counted)], delta)}
    if removable:
        noise = RemovableNoise.for_group(mechanism, devices, threshold)
        l2, l1 = accounting.sensitivities(mechanism.bound_sq, mechanism.padded_dim)
        rho = kept_rho(l2=l2, l1=l1, variances=noise.variances, devices=devices, threshold=threshold,
                       survivors=counted, padded_dim=mechanism.padded_dim)
        out["unequal_shares"] = accounting.epsilon([rho], delta)
    return out


__all__ = ["MessageBytes", "epsilons", "message_bytes", "removal_seconds"]
