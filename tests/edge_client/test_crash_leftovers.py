"""A crash in the middle of wiping a round secret (secure_delete writes
zeroes, fsyncs, then unlinks) leaves a zeroed round.fms behind. At the next
start the device must decline that round and wipe the leftover, not fail
every session with StateCorruptError (found by the SIGKILL integration test)."""

from __future__ import annotations

from pathlib import Path

from edge_client.devices import Device
from edge_client.secure_update import decline_unfinished_rounds
from edge_client.state import ClientStore, RoundSecret


def test_a_zeroed_round_secret_is_declined_and_wiped(tmp_path: Path) -> None:
    with ClientStore(tmp_path) as store:
        ok, zeroed = store.device("user-1"), store.device("user-2")
        for ds in (ok, zeroed):
            ds.save_round_secret(RoundSecret(b"s" * 16, 3, b"k" * 32))
        zeroed.round_path.write_bytes(b"\0" * zeroed.round_path.stat().st_size)
        devices = [Device(i, ds, device_id=i) for i, ds in enumerate((ok, zeroed), start=1)]
        assert decline_unfinished_rounds(devices) == 2
        assert not ok.round_path.exists() and not zeroed.round_path.exists()
        assert decline_unfinished_rounds(devices) == 0
