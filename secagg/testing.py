"""Fakes and fixed keys for the secagg tests: `StepHarness` drives a round one
stage at a time. The whole-round driver and its types live in
`secagg/inprocess.py` and are re-exported here for the tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from secagg.client import ClientAdvertiseKeys, ClientState
from secagg.config import Neighbors, SecAggConfig
from secagg.errors import ProtocolMisuse
from secagg.inprocess import (
    DROPOUT_STAGES,
    FIXED_SESSION_ID,
    SERVER,
    DropoutPlan,
    Intercept,
    RoundOutcome,
    _identities,
    encode_inputs,
    identity_keys,
    run_round,
)
from secagg.messages import KeyList, Message, ShareKeys, ShareRelay
from secagg.keys import SEED_BYTES
from secagg.randomness import DeterministicRandom
from secagg.server import ServerAdvertiseKeys, ServerState
from secagg.stages import Stage

__all__ = [
    "DROPOUT_STAGES",
    "FIXED_SESSION_ID",
    "SERVER",
    "DropoutPlan",
    "Intercept",
    "RoundOutcome",
    "StepHarness",
    "encode_inputs",
    "identity_keys",
    "run_round",
]


class StepHarness:
    """Drive a round by hand, one stage at a time, for state-level tests.

    Holds n real client states and the real server state; nothing is
    serialized. Typical use:

        h = StepHarness(num_clients=4)
        keylists = h.advance_to("share_keys")    # clients wait for KeyList
        replies = h.deliver(keylists)            # {device: [ShareKeys]}
        h.send(replies)
        relays = h.close()                       # {device: ShareRelay}

    `advance_to(stage)` runs the honest flow (with `drop`: {stage: devices}
    going silent) until the server has produced the messages that open the
    client stage `stage` (a Stage or its spelling: "share_keys", "masked_input",
    "consistency_check", "unmasking") and returns them.
    """

    def __init__(
        self,
        num_clients: int = 4,
        vector_length: int = 8,
        *,
        neighbors: Neighbors = "all",
        threshold: int | None = None,
        active_adversary: bool = False,
        session_id: bytes = FIXED_SESSION_ID,
        round_idx: int = 0,
        seed: int = 0,
        config: SecAggConfig | None = None,
        removable_noise: bool = False,
    ) -> None:
        self.config = config or SecAggConfig.create(
            num_clients=num_clients,
            vector_length=vector_length,
            session_id=session_id,
            neighbors=neighbors,
            threshold=threshold,
            active_adversary=active_adversary,
            removable_noise=removable_noise,
        )
        n = self.config.num_clients
        self.round_idx = round_idx
        rng = np.random.default_rng(seed)
        self.inputs = rng.uniform(-1, 1, size=(n, self.config.vector_length))
        self.encoded = encode_inputs(self.inputs, config=self.config, seed=seed)
        self.identity_private, self.identity_public = _identities(n, seed, self.config.active_adversary)
        #: each device's removable-noise component seeds (1..m), when the config has them
        self.component_seeds = {i: tuple(DeterministicRandom(seed, f"harness-{i}-{round_idx}-c{k}")(SEED_BYTES)
                                         for k in range(1, self.config.removable_components + 1)) for i in range(n)}
        self.clients: dict[int, ClientState[Any]] = {
            i: ClientAdvertiseKeys(
                self.config,
                i,
                round_idx,
                self.encoded[i],
                rand=DeterministicRandom(seed, f"harness-{i}-{round_idx}"),
                identity_key=self.identity_private[i],
                peer_identity_keys=self.identity_public,
                removable_seeds=self.component_seeds[i],
            )
            for i in range(n)
        }
        self.server: ServerState[Any] = ServerAdvertiseKeys(self.config, round_idx, identity_keys=self.identity_public)

    def start(self, devices: Iterable[int] | None = None) -> dict[int, list[Message]]:
        """Clients `devices` (default all) start: {device: [AdvertiseKeys]}."""
        out: dict[int, list[Message]] = {}
        for i in self.config_ids() if devices is None else devices:
            client = self.clients[i]
            if not isinstance(client, ClientAdvertiseKeys):
                raise ProtocolMisuse(f"device {i} has already started")
            self.clients[i], out[i] = client.start()
        return out

    def config_ids(self) -> range:
        return range(self.config.num_clients)

    def send(self, replies: Mapping[int, Sequence[Message]]) -> None:
        """Hand client messages to the server (sender = the dict key)."""
        for i, msgs in replies.items():
            for m in msgs:
                self.server, _ = self.server.handle(i, m)

    def close(self) -> dict[int, Message]:
        """Close the server stage: {addressee: message}."""
        self.server, out = self.server.close()
        return {m.device_id: m for m in out}

    def deliver(
        self, outbound: Mapping[int, Message], devices: Iterable[int] | None = None
    ) -> dict[int, list[Message]]:
        """Hand server messages to clients (all addressees, or `devices`)."""
        replies: dict[int, list[Message]] = {}
        for i, m in outbound.items():
            if devices is not None and i not in devices:
                continue
            self.clients[i], replies[i] = self.clients[i].handle(m)
        return replies

    def advance_to(self, stage: str, drop: dict[str, Iterable[int]] | None = None) -> dict[int, Message]:
        dropping = {Stage.parse(k).value: set(v) for k, v in (drop or {}).items()}
        silent = set(dropping.get("advertise_keys", ()))
        self.send(self.start(i for i in self.config_ids() if i not in silent))
        outbound = self.close()
        while self.server.stage != stage:
            if self.server.is_terminal:
                raise RuntimeError(f"the round ended ({self.server!r}) before {stage}")
            silent |= dropping.get(self.server.stage, set())
            self.send(self.deliver(outbound, [i for i in outbound if i not in silent]))
            outbound = self.close()
        return outbound
