"""The hosted device: one type for everything this process knows of a device.

A `Device` is user `number` (1-based) of the dataset, hosted by this
process. It has a state store under --state-dir (`edge_client.state`), an
Ed25519 identity key once the store has loaded or made one, and the
coordinator's device id once it is enrolled. The trainer and local data
key devices by `number`; the session driver keys them by `device_id`.
`device_id` changes when the coordinator forgets a device and it enrols
again; nothing else about a device ever changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.state import DeviceStore

#: `device_id` of a device not enrolled yet (the coordinator's ids start at 1).
NOT_ENROLLED = 0


def local_id_of(number: int) -> str:
    """The device's name in this process and on disk: user 7 is "user-7"."""
    return f"user-{number}"


@dataclass(eq=False)
class Device:
    """One device of this process (see the module doc)."""

    number: int  # user number (1-based) in the dataset
    store: DeviceStore
    identity_key: Ed25519PrivateKey | None = None
    device_id: int = NOT_ENROLLED

    @property
    def user(self) -> int:
        """Dense user id (0-based) in the dataset."""
        return self.number - 1

    @property
    def local_id(self) -> str:
        return self.store.local_id

    def require_identity_key(self) -> Ed25519PrivateKey:
        """The identity key; ValueError before it is loaded."""
        if self.identity_key is None:
            raise ValueError(f"{self.local_id} has no identity key loaded")
        return self.identity_key

    @property
    def identity_public(self) -> bytes:
        """The raw Ed25519 public key (32 bytes); ValueError before the key is loaded."""
        if self.identity_key is None:
            raise ValueError(f"{self.local_id} has no identity key loaded")
        return self.identity_key.public_key().public_bytes_raw()
