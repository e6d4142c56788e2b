"""The edge client's own robustness: one damaged file affects only what it
belongs to, and says so (issue: security and robustness, part G)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from edge_client.state import DIR_MODE, ClientStore
from edge_fake_coordinator import FakeCoordinator, RoundResult, RunningClient, run_async
from fedmask_proto.v1 import common_pb2, session_pb2
from test_driver import _fedrap_globals

ROOT = Path(__file__).resolve().parents[2]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_state_dirs_are_owner_only_and_old_ones_are_tightened(tmp_path: Path) -> None:
    root = tmp_path / "state"
    (root / "devices" / "user-1").mkdir(parents=True, mode=0o755)
    os.chmod(root, 0o755)
    with ClientStore(root).open() as store:
        store.save_enrolled("127.0.0.1:1", {"user-2": 7})
        store.device("user-2").load_or_create_identity()
    for folder in (root, root / "devices", root / "devices" / "user-1", root / "devices" / "user-2"):
        assert _mode(folder) == DIR_MODE, folder


def test_a_truncated_enrolment_record_stops_the_client_with_its_name(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with ClientStore(state).open() as store:
        store.save_enrolled("127.0.0.1:1", {"user-1": 1})
        record = store.enrollment_path
    record.write_text(record.read_text()[:7])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "fedmask", "client", "--coordinator", "127.0.0.1:1", "--users", "1-2",
         "--state-dir", str(state), "--dataset", "synthetic", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 2
    said = "".join((done.stdout + done.stderr).split())  # the log wraps long lines
    assert "corruptedstatefile" in said and str(record) in said


def test_one_corrupted_private_state_stands_only_its_device_down(tmp_path: Path) -> None:
    async def go() -> None:
        async with FakeCoordinator() as fake:
            g, dim = _fedrap_globals()
            async with RunningClient(fake, tmp_path) as rc:
                s = await fake.wait_stream()

                async def round_(idx: int) -> RoundResult:
                    return await fake.run_round(
                        s, model_name="fedrap", vector_length=dim, global_parameters=g, clip=0.5,
                        hyperparameters={"k": 4, "local_epochs": 1, "round_idx": idx}, devices=[2, 3, 5],
                        dp=session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE))

                first = await round_(0)
                assert first.ok and first.counted_devices == [2, 3, 5]
                damaged = tmp_path / "devices" / "user-3" / "model-fedrap.fms"
                damaged.write_bytes(damaged.read_bytes()[:40])
                second = await round_(1)
                assert second.ok and second.counted_devices == [2, 5]
                assert [(a.device_id, a.reason) for a in second.aborts] == [(3, common_pb2.ABORT_REASON_CLIENT_ERROR)]
                assert rc.driver is not None

    run_async(go())
