"""`--debug-record-inputs` writes each device's encoded input in the clear:
as private as the state dir, whatever the umask (0700 folders, 0600 files),
and folders an older release made 0755 are tightened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from edge_client.round_run import record_input
from edge_client.state import DIR_MODE, FILE_MODE


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_recorded_inputs_are_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=DIR_MODE)
    inputs = root / "debug" / "inputs"
    old = os.umask(0o022)  # the usual umask: plain mkdir / open give 0755 / 0644
    try:
        record_input(inputs, 3, 17, np.arange(5, dtype=np.uint32))
        (inputs / "round-000004").mkdir(mode=0o755)  # as an older release left it
        (inputs / "round-000004" / ".device-18.npy.tmp").write_bytes(b"crash leftover")
        os.chmod(inputs / "round-000004" / ".device-18.npy.tmp", 0o644)
        record_input(inputs, 4, 18, np.arange(5, dtype=np.uint32))
    finally:
        os.umask(old)
    for folder in (root / "debug", inputs, inputs / "round-000003", inputs / "round-000004"):
        assert _mode(folder) == DIR_MODE, folder
    for f in (inputs / "round-000003" / "device-17.npy", inputs / "round-000004" / "device-18.npy"):
        assert _mode(f) == FILE_MODE, f
        assert np.array_equal(np.load(f, allow_pickle=False), np.arange(5, dtype=np.uint32))
    assert not list(inputs.rglob("*.tmp"))
