"""The coordinator's INSECURE plaintext rounds (benchmark baseline) are
answered only by a client started with --debug-allow-insecure-plaintext; any
other client withdraws its devices (AbortNotice PROTOCOL_VIOLATION) and
sends nothing of its updates. With the opt-in, a device sends exactly its
encoded update, unmasked, and records it with --debug-record-inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_fake_coordinator import FakeCoordinator, RunningClient, run_async
from fedmask_proto.v1 import common_pb2

PLAINTEXT = {"insecure_plaintext": True, "seed": 5}


def test_a_client_refuses_plaintext_rounds_without_the_opt_in(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, users="1-3"):
            s = await fake.wait_stream()
            res = await fake.run_round(s, vector_length=8, hyperparameters=PLAINTEXT, first_stage_timeout=3,
                                       commit=False)
            assert not res.ok
            assert [a.reason for a in res.aborts] == [common_pb2.ABORT_REASON_PROTOCOL_VIOLATION]
            assert "plaintext" in res.aborts[0].detail
            kinds = {m.WhichOneof("message") for m in fake.received}
            assert not kinds & {"advertise_keys", "masked_input"}

    run_async(go())


def test_with_the_opt_in_devices_upload_their_encoded_update(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, users="1-3", allow_insecure_plaintext=True,
                                                            debug_record_inputs=True):
            s = await fake.wait_stream()
            # the coordinator's plaintext round machine sums what arrives
            res = await fake.run_round(s, vector_length=8, hyperparameters=PLAINTEXT, first_stage_timeout=3,
                                       commit=False)
            assert res.ok and res.counted_devices == [1, 2, 3]
            got = [m.masked_input for m in fake.received if m.WhichOneof("message") == "masked_input"]
            assert sorted(m.device_id for m in got) == [1, 2, 3]
            recorded = []
            for m in got:
                rec = np.load(tmp_path / "debug" / "inputs" / f"round-{m.round_number:06d}" / f"device-{m.device_id}.npy")
                assert np.frombuffer(m.masked_vector, dtype="<u4").tolist() == rec.tolist()
                recorded.append(rec)
            want = np.sum(recorded, axis=0, dtype=np.uint64).astype(np.uint32)
            assert res.machine.result is not None
            assert np.array_equal(res.machine.result.encoded_sum, want)
            assert not [m for m in fake.received if m.WhichOneof("message") == "advertise_keys"]

    run_async(go())


def test_even_with_the_opt_in_no_metric_of_one_device_goes_out_in_the_clear(tmp_path: Path) -> None:
    """A plaintext round that asks for metric coordinates would put each
    device's own metrics on the wire unmasked: the client withdraws (D35)."""
    async def go() -> None:
        async with FakeCoordinator() as fake, RunningClient(fake, tmp_path, users="1-3", allow_insecure_plaintext=True):
            s = await fake.wait_stream()
            res = await fake.run_round(s, vector_length=8, hyperparameters=PLAINTEXT, first_stage_timeout=3,
                                       commit=False, task_tamper=lambda t: t.metric_names.append("devices"))
            assert not res.ok
            assert [a.reason for a in res.aborts] == [common_pb2.ABORT_REASON_PROTOCOL_VIOLATION]
            assert "metrics" in res.aborts[0].detail
            assert not [m for m in fake.received if m.WhichOneof("message") == "masked_input"]

    run_async(go())
