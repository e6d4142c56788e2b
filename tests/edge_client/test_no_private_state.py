"""Private device state never appears in a message to the coordinator.

Every ClientMessage case the client can send is produced through the
client's own code paths against the fake coordinator (hello, check-in after
a re-enrolment, heartbeats, all five secagg stages in active mode with the
round metrics inside the masked inputs, an AbortNotice after a malformed
message, a top-k answer),
and the serialized bytes of every message are searched for the devices'
private tensors (u_i, D_i, p_u, ...), their raw ratings and item lists,
their identity keys, round secrets, and the plaintext updates (float and
fixed-point encoded) before masking.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

import edge_client.secure_update as secure_update_mod
from edge_client.state import ClientStore
from edge_client.transport import session_message_kinds
from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask_proto.v1 import secagg_pb2
from models.registry import build_model

N = 6
IMPLICIT_METRICS = ("devices", "examples", "update_norm", "val_sampled_hits@10", "val_sampled_ndcg@10",
                    "val_sampled_count")
EXPLICIT_METRICS = ("devices", "examples", "update_norm", "val_sse", "val_sae", "val_rating_count")


def _globals(name: str, **kw) -> tuple[dict[str, np.ndarray], int]:
    m = build_model(name, explicit=kw.pop("explicit", False), n_users=200, n_items=300, overrides=kw)
    return {k: v.numpy() for k, v in m.init_global(torch.Generator().manual_seed(3)).items()}, m.update_dim


def _needles_from_array(a: np.ndarray, min_bytes: int = 16) -> list[bytes]:
    """High-entropy chunks of a private array: whole rows along the last axis
    (rows containing a zero are skipped: zeros are not secret and not distinctive)."""
    a = np.ascontiguousarray(a)
    if a.ndim == 0:
        return []
    rows = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    out = []
    for r in rows:
        if r.nbytes >= min_bytes and np.count_nonzero(r) == r.size:
            out.append(r.tobytes())
    return out


def _windows(b: bytes, size: int = 32, stride: int = 32) -> list[bytes]:
    return [b[i : i + size] for i in range(0, max(len(b) - size + 1, 1), stride)]


def test_no_private_state_in_any_client_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    encoded_inputs: list[np.ndarray] = []
    float_updates: list[np.ndarray] = []
    seeds: list[bytes] = []
    snapshots: list[dict[str, np.ndarray]] = []

    real_ctor = secure_update_mod.ClientAdvertiseKeys

    def recording_ctor(config, device_id, round_idx, encoded_input, **kw):
        encoded_inputs.append(np.array(encoded_input))
        return real_ctor(config, device_id, round_idx, encoded_input, **kw)

    monkeypatch.setattr(secure_update_mod, "ClientAdvertiseKeys", recording_ctor)

    def snapshot() -> None:
        for f in sorted(tmp_path.glob("devices/*/model-*.fms")):
            from edge_client.state import read_arrays

            loaded = read_arrays(f)
            assert loaded is not None
            arrays, _ = loaded
            snapshots.append(arrays)

    received: list = []

    async def go() -> None:
        fake = FakeCoordinator(heartbeat_s=0.2)
        fake.received = received
        await fake.start()
        fake.reject_unknown = True  # -> re-enrolment and a CheckIn
        rc = RunningClient(fake, tmp_path)
        async with rc:
            s = await fake.wait_stream()
            for _ in range(200):
                if any(m.WhichOneof("message") == "check_in" for m in fake.received):
                    break
                await asyncio.sleep(0.02)
            fake.reject_unknown = False
            drv = rc.driver
            real_random = drv.secure_random

            def recording_random(n: int) -> bytes:
                b = real_random(n)
                seeds.append(b)
                return b

            drv.secure_random = recording_random
            real_train = drv.trainer.train

            def recording_train(spec, numbers):
                out = real_train(spec, numbers)
                float_updates.append(np.array(out.updates))
                return out

            drv.trainer.train = recording_train

            # round 1: FedRAP, active-adversary mode (signatures + consistency check)
            g, dim = _globals("fedrap", k=4)
            res = await fake.run_round(s, model_name="fedrap", vector_length=dim, global_parameters=g, clip=0.5,
                                       hyperparameters={"k": 4, "local_epochs": 2}, active=True,
                                       metric_names=IMPLICIT_METRICS)
            assert res.ok and len(res.counted_devices) == N
            assert res.metric_totals()[1]["devices"] == N
            snapshot()
            assert (await fake.top_k(s, 1, 10)).WhichOneof("response") == "top_k"

            # round 2: explicit FedMF (ratings), one device gets a malformed relay -> AbortNotice
            def tamper(p):
                if isinstance(p, secagg_pb2.ForwardedShares) and p.device_id == 2:
                    p.shares[0].ciphertext = b"x"
                return p

            g2, dim2 = _globals("fedmf", k=4, explicit=True)
            res2 = await fake.run_round(s, model_name="fedmf", vector_length=dim2, global_parameters=g2, clip=0.5,
                                        hyperparameters={"k": 4, "explicit": True}, tamper=tamper,
                                        metric_names=EXPLICIT_METRICS)
            assert res2.ok and res2.aborts
            assert res2.metric_totals()[1]["devices"] == len(res2.counted_devices)
            snapshot()
            await asyncio.sleep(0.3)  # a heartbeat or two
        await fake.stop()

    run_async(go())

    # every ClientMessage case was produced
    assert {m.WhichOneof("message") for m in received} == set(session_message_kinds())

    # what must never leave a device
    needles: list[bytes] = []
    for arrays in snapshots:  # u_i, b_i, D_i / p_u of every device after each round
        for a in arrays.values():
            needles += _needles_from_array(a)
    with ClientStore(tmp_path) as store:
        for dev in store.devices():
            loaded = dev.load_data()
            assert loaded is not None
            data, _ = loaded
            for key in ("imp_train", "exp_train_items", "exp_train_ratings", "exp_val_items", "exp_test_items"):
                v = data[key]
                if v.nbytes >= 16:
                    needles.append(v.tobytes())
                    needles.append(v.astype(np.float64).tobytes())
            needles.append(dev.load_or_create_identity())
    needles += [s for s in seeds if len(s) >= 16]
    for x in encoded_inputs:
        needles += _windows(x.astype("<u4").tobytes())
    for u in float_updates:
        for row in u:
            needles += _windows(row.tobytes()) + _windows(row.astype(np.float32).tobytes())
    assert len(needles) > 1000 and snapshots and encoded_inputs and float_updates and seeds

    # the search does find such bytes when they are there (a leaky message would fail)
    from fedmask_proto.v1 import session_pb2

    leaky_masked = session_pb2.ClientMessage(masked_input=secagg_pb2.MaskedInput(
        masked_vector=encoded_inputs[0].astype("<u4").tobytes(), length=len(encoded_inputs[0])))
    row = next(nd for arrays in snapshots for nd in _needles_from_array(arrays["D"] if "D" in arrays else arrays["p"]))
    leaky_metrics = session_pb2.ClientMessage(device_response=session_pb2.DeviceResponse(
        top_k=session_pb2.TopKResult(scores=np.frombuffer(row, np.float32).tolist())))
    for leaky in (leaky_masked, leaky_metrics):
        assert any(nd in leaky.SerializeToString() for nd in needles)

    blobs = [m.SerializeToString() for m in received]
    leaks = [(i, received[i].WhichOneof("message")) for i, b in enumerate(blobs) for nd in needles if nd in b]
    assert not leaks, f"private bytes found in client messages: {leaks[:5]}"

