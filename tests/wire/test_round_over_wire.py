"""A whole secagg round where every message crosses the proto wire.

Real client and server states; each message goes secagg -> proto ->
serialized bytes -> proto -> secagg with the id maps each side really has
(the coordinator: the whole cohort; a client: what its RoundTask lists).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedmask_proto.v1 import common_pb2, secagg_pb2, session_pb2
from secagg import identity
from secagg.client import ClientAdvertiseKeys, ClientState
from secagg.config import SecAggConfig
from secagg.messages import AdvertiseKeys, KeyList, Message
from secagg.randomness import DeterministicRandom
from secagg.server import ServerAborted, ServerAdvertiseKeys, ServerCompleted, ServerState
from secagg.testing import encode_inputs, identity_keys
from wire import RoundIds, build_round_task, parse_round_task
from wire import secagg_codec as codec

DEVICE_IDS = [9_000_000_000_017, 42, 7, 123456, 5, 88, 1_000_003, 64]


def _reparse(p):
    q = type(p)()
    q.ParseFromString(p.SerializeToString())
    return q


def run_over_wire(config: SecAggConfig, *, drop: dict[str, set[int]] | None = None, round_number: int = 3):
    drop = drop or {}
    n = config.num_clients
    cohort = DEVICE_IDS[:n]
    server_ids = RoundIds.from_cohort(cohort)
    rng = np.random.default_rng(1)
    inputs = rng.uniform(-1, 1, size=(n, config.vector_length))
    encoded = encode_inputs(inputs, config=config, seed=1)
    id_priv, id_pub = identity_keys(n, 1) if config.active_adversary else ([None] * n, None)
    # Two edge clients: even and odd secagg positions.
    hosts = [cohort[0::2], cohort[1::2]]
    views = {}
    for hosted in hosts:
        task = build_round_task(
            config=config, round_number=round_number, ids=server_ids, devices=hosted, model_name="synthetic",
            model_version=1, global_parameters={"w": np.zeros(3, np.float32)},
            deadlines={"advertise_keys": 5.0},
        )
        view = parse_round_task(_reparse(task), hosted=hosted)
        assert view.config == config
        for d in hosted:
            views[d] = view
    clients: dict[int, ClientState[Any]] = {}
    own: dict[int, AdvertiseKeys] = {}
    peer_identity: dict[int, dict[int, bytes]] = {}
    for d in cohort:
        v = views[d].devices[d]
        peer_identity[d] = {}
        clients[d] = ClientAdvertiseKeys(
            views[d].config, v, round_number, encoded[v], rand=DeterministicRandom(1, f"d{d}"),
            identity_key=id_priv[v], peer_identity_keys=peer_identity[d] if config.active_adversary else None,
        )
    server: ServerState[Any] = ServerAdvertiseKeys(config, round_number, identity_keys=id_pub)

    def up(d: int, msgs: list[Message]) -> None:
        nonlocal server
        for m in msgs:
            p = _reparse(codec.client_to_proto(m, views[d].ids, modulus_bits=config.encoding.modulus_bits))
            if isinstance(m, AdvertiseKeys):
                own[d] = m
            back = codec.client_from_proto(
                p, server_ids, vector_length=config.vector_length, modulus_bits=config.encoding.modulus_bits
            )
            server, _ = server.handle(server_ids.secagg(d), back)

    silent = set(drop.get("advertise_keys", ()))
    for d in cohort:
        if d not in silent:
            fresh = clients[d]
            assert isinstance(fresh, ClientAdvertiseKeys)
            clients[d], msgs = fresh.start()
            up(d, msgs)
    while not server.is_terminal:
        server, out = server.close()
        silent |= set(drop.get(server.stage, ()))
        for m in out:
            d = server_ids.device(m.device_id)
            if d in silent:
                continue
            p = _reparse(codec.server_to_proto(m, server_ids, identity_keys=id_pub))
            ids = views[d].ids
            back: Message
            if isinstance(p, secagg_pb2.AdvertisedKeys):
                back, ident = codec.key_list_from_proto(
                    p, ids, own[d], own_identity_public_key=None if id_pub is None else id_pub[m.device_id]
                )
                assert isinstance(back, KeyList)
                peer_identity[d].update(ident)
            else:
                back = codec.server_from_proto(p, ids)
            clients[d], replies = clients[d].handle(back)
            up(d, replies)
    return server, encoded, server_ids


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_clients=5, vector_length=16),
        dict(num_clients=8, vector_length=7, neighbors=4),
        dict(num_clients=6, vector_length=5, active_adversary=True),
        dict(num_clients=8, vector_length=5, neighbors=4, active_adversary=True),
        dict(num_clients=5, vector_length=9, modulus_bits=20),
    ],
)
def test_exact_sum_over_the_wire(kwargs):
    config = SecAggConfig.create(session_id=b"wire-test-session", **kwargs)
    server, encoded, _ = run_over_wire(config)
    assert isinstance(server, ServerCompleted), server
    expected = encoded.sum(axis=0, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(server.encoded_sum, expected)


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "masked_input", "unmasking"])
def test_one_dropout_per_stage(stage):
    config = SecAggConfig.create(num_clients=6, vector_length=8, session_id=b"wire-drop")
    server, encoded, ids = run_over_wire(config, drop={stage: {DEVICE_IDS[2]}})
    assert isinstance(server, ServerCompleted), server
    counted = list(server.counted)
    if stage in ("advertise_keys", "share_keys", "masked_input"):
        assert ids.secagg(DEVICE_IDS[2]) not in counted
    expected = encoded[counted].sum(axis=0, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(server.encoded_sum, expected)


def test_too_many_dropouts_abort():
    config = SecAggConfig.create(num_clients=5, vector_length=4, session_id=b"wire-abort")
    server, _, _ = run_over_wire(config, drop={"share_keys": set(DEVICE_IDS[:3])})
    assert isinstance(server, ServerAborted)


def test_abort_notices_round_trip():
    ids = RoundIds.from_cohort([11, 12, 13])
    from secagg.errors import AbortReason
    from secagg.messages import ClientAbort, ServerAbort

    for reason in AbortReason:
        m = ServerAbort(session_id=b"s", round_idx=2, device_id=1, reason=reason)
        p = _reparse(codec.abort_to_proto(m, ids, "why"))
        assert p.device_id == 12 and p.detail.startswith(reason.value)
        assert codec.server_abort_from_proto(p, ids) == m
        c = ClientAbort(session_id=b"s", round_idx=2, device_id=0, reason=reason)
        assert codec.client_abort_from_proto(_reparse(codec.abort_to_proto(c, ids)), ids) == c
    # A notice from another implementation (no secagg prefix) maps to a representative.
    p = common_pb2.AbortNotice(session_id=b"s", round_number=2, device_id=13,
                               reason=common_pb2.ABORT_REASON_DEADLINE_MISSED, detail="late")
    assert codec.server_abort_from_proto(p, ids).reason is AbortReason.CANCELLED
    whole = codec.round_abort_notice(b"s", 2, common_pb2.ABORT_REASON_COORDINATOR_SHUTDOWN)
    assert [q.device_id for q in codec.expand_abort(whole, [11, 13])] == [11, 13]


def test_identity_keys_travel_with_advertised_keys():
    config = SecAggConfig.create(num_clients=4, vector_length=3, session_id=b"ik", active_adversary=True)
    ids = RoundIds.from_cohort([4, 3, 2, 1])
    _, pub = identity_keys(4, 0)
    from secagg.messages import KeyEntry

    entries = tuple(KeyEntry(i, bytes([i + 1]) * 32, bytes([i + 9]) * 32, b"\x01" * 64) for i in range(4))
    m = KeyList(session_id=b"ik", round_idx=0, device_id=1, entries=entries)
    p = codec.key_list_to_proto(m, ids, pub)
    assert [x.device_id for x in p.peers] == [1, 2, 4]  # ascending device ids, self (3) excluded
    own = AdvertiseKeys(session_id=b"ik", round_idx=0, device_id=1, c_public=entries[1].c_public,
                        s_public=entries[1].s_public, signature=entries[1].signature)
    back, ident = codec.key_list_from_proto(p, ids, own)
    assert back == m
    assert ident == {i: pub[i] for i in (0, 2, 3)}
    assert identity.IDENTITY_PUBLIC_BYTES == 32
    del config


def test_round_task_roundtrip_and_graph_check():
    config = SecAggConfig.create(num_clients=8, vector_length=10, session_id=b"rt", neighbors=4, clip=0.25)
    ids = RoundIds.from_cohort(DEVICE_IDS)
    task = build_round_task(
        config=config, round_number=9, ids=ids, devices=DEVICE_IDS[:3], model_name="fedrap", model_version=4,
        global_parameters={"C": np.arange(6, dtype=np.float32).reshape(2, 3)}, hyperparameters={"lr": 0.1},
        deadlines={"share_keys": 1.5},
        dp=session_pb2.DpSettings(mode=session_pb2.DP_MODE_LOCAL, clip_norm=0.1, noise_multiplier=1.0, noise_stddev=0.1),
    )
    view = parse_round_task(_reparse(task), hosted=DEVICE_IDS)
    assert view.config == config
    assert view.deadlines == {"share_keys": 1.5}
    assert view.hyperparameters == {"lr": 0.1}
    assert view.devices == {d: ids.secagg(d) for d in DEVICE_IDS[:3]}
    assert np.array_equal(view.global_parameters["C"], np.arange(6, dtype=np.float32).reshape(2, 3))
    # Tampered neighbourhood is refused.
    bad = _reparse(task)
    bad.assignments[0].neighbours.pop()
    with pytest.raises(Exception, match="neighbours"):
        parse_round_task(bad)
