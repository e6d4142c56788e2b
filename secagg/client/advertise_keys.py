"""Client stage 0, AdvertiseKeys: make the round's two X25519 key pairs and
send their public halves (signed with the identity key in active mode)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Never

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg import identity
from secagg.client.base import ClientRound, ClientState, Transition
from secagg.client.share_keys import ClientShareKeys
from secagg.config import SecAggConfig
from secagg.errors import ProtocolMisuse
from secagg.keys import SEED_BYTES, generate_key_pair
from secagg.messages import AdvertiseKeys
from secagg.randomness import RandomSource, system_random
from secagg.stages import Stage


class ClientAdvertiseKeys(ClientState[Never]):
    """The initial state of a device for one round.

    `encoded_input` is the device's update already encoded
    (`config.encoding.encode(x, rng)`): np.uint32 of length L. In active mode
    `identity_key` (the device's Ed25519 key) and `peer_identity_keys` (id ->
    raw public key of every cohort member) are required. `rand` supplies every
    random byte the device uses (keys, seeds, Shamir coefficients, nonces).
    With `config.removable_noise`, `removable_seeds` are the m =
    `config.removable_components` 32-byte seeds of the noise components 1..m
    already added to `encoded_input` (component k is the one removed when
    at most n - k devices are counted); they are secret-shared like b_v.

    `start()` sends AdvertiseKeys and returns ClientShareKeys. No server
    message is expected before that (any message is unexpected).
    """

    stage = Stage.ADVERTISE_KEYS
    expects = None
    __slots__ = ()

    def __init__(
        self,
        config: SecAggConfig,
        device_id: int,
        round_idx: int,
        encoded_input: np.ndarray,
        *,
        rand: RandomSource = system_random,
        identity_key: Ed25519PrivateKey | None = None,
        peer_identity_keys: Mapping[int, bytes] | None = None,
        removable_seeds: Sequence[bytes] = (),
    ) -> None:
        if not isinstance(config, SecAggConfig):
            raise TypeError("config must be a SecAggConfig")
        if not (isinstance(device_id, int) and 0 <= device_id < config.num_clients):
            raise ValueError(f"device_id must be in 0..{config.num_clients - 1}, got {device_id!r}")
        if not (isinstance(round_idx, int) and 0 <= round_idx < 1 << 64):
            raise ValueError(f"round_idx must be a non-negative int, got {round_idx!r}")
        if not isinstance(encoded_input, np.ndarray) or encoded_input.dtype != np.uint32:
            raise TypeError("encoded_input must be an np.uint32 array (see FixedPointEncoding.encode)")
        if encoded_input.shape != (config.vector_length,):
            raise ValueError(f"encoded_input must have shape ({config.vector_length},), got {encoded_input.shape}")
        if config.active_adversary and (identity_key is None or peer_identity_keys is None):
            raise ProtocolMisuse("active-adversary mode needs identity_key and peer_identity_keys")
        seeds = tuple(removable_seeds)
        if len(seeds) != config.removable_components or any(
                not isinstance(c, bytes) or len(c) != SEED_BYTES for c in seeds):
            raise ProtocolMisuse(f"need {config.removable_components} removable seeds of {SEED_BYTES} bytes "
                                 f"(config.removable_components), got {len(seeds)}")
        super().__init__(
            ClientRound(
                config=config,
                device_id=device_id,
                round_idx=round_idx,
                rand=rand,
                graph=config.graph(round_idx),
                encoded_input=encoded_input,
                identity_key=identity_key,
                peer_identity_keys=peer_identity_keys,
                removable_seeds=seeds,
            )
        )

    def start(self) -> Transition:
        """Generate the c- and s-key pairs and advertise their public keys."""
        self._use()
        r = self._round
        r.c_pair = generate_key_pair(r.rand)
        r.s_pair = generate_key_pair(r.rand)
        signature = b""
        if r.config.active_adversary:
            signature = identity.sign(
                r.signing_key(),
                identity.advertise_payload(r.config.session_id, r.round_idx, r.device_id, r.c_pair.public, r.s_pair.public),
            )
        msg = AdvertiseKeys(**self._header(), c_public=r.c_pair.public, s_public=r.s_pair.public, signature=signature)
        return ClientShareKeys(r), [msg]
