"""The device state store: atomic writes, corruption detection, layout, locking."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edge_client.state import (
    ClientStore,
    RoundSecret,
    StateCorruptError,
    StateError,
    atomic_write,
    encode_arrays,
    read_arrays,
    write_arrays,
)


class Crash(Exception):
    pass


def _crash(_tmp: Path) -> None:
    raise Crash


def test_round_trip_keeps_dtypes_shapes_and_meta(tmp_path: Path) -> None:
    arrays = {"u": np.arange(4, dtype=np.float32), "b": np.array(np.float32(0.5)), "D": np.ones((3, 2), np.float32)}
    write_arrays(tmp_path / "m.fms", arrays, {"model_version": 3})
    loaded = read_arrays(tmp_path / "m.fms")
    assert loaded is not None
    got, meta = loaded
    assert meta == {"model_version": 3}
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v)
    assert read_arrays(tmp_path / "missing.fms") is None


def test_crash_between_temp_write_and_replace_leaves_the_old_state(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    dev = store.device("user-1")
    old = {"u": np.full(8, 1.0, np.float32)}
    dev.save_model("fedrap", old, {"model_version": 1})
    with pytest.raises(Crash):
        dev.save_model("fedrap", {"u": np.full(8, 2.0, np.float32)}, {"model_version": 2}, before_replace=_crash)
    loaded = dev.load_model("fedrap")
    assert loaded is not None
    arrays, meta = loaded
    assert np.array_equal(arrays["u"], old["u"]) and meta["model_version"] == 1
    assert not [p for p in dev.folder.iterdir() if ".tmp-" in p.name]  # the temp file is gone
    store.close()


def test_a_temp_file_left_by_a_killed_process_is_ignored_and_cleaned(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    dev = store.device("user-2")
    dev.save_model("fedrap", {"u": np.zeros(3, np.float32)}, {"model_version": 1})
    # what a SIGKILL after the temp write but before os.replace leaves behind
    stray = dev.folder / "model-fedrap.fms.tmp-999-abcd"
    stray.write_bytes(encode_arrays({"u": np.ones(3, np.float32)}, {"model_version": 2})[:50])
    store.close()
    store = ClientStore(tmp_path).open()
    assert not stray.exists()
    loaded = store.device("user-2").load_model("fedrap")
    assert loaded is not None
    arrays, meta = loaded
    assert meta["model_version"] == 1 and not arrays["u"].any()
    store.close()


def test_atomic_write_replaces_and_sets_private_permissions(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert (p.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda b: b[: len(b) // 2], "checksum mismatch"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum mismatch"),
        (lambda b: b[:10], "bad magic or truncated"),
        (lambda b: b"", "bad magic or truncated"),
        (lambda b: b"garbage" * 20, "bad magic"),
    ],
)
def test_corrupted_state_file_gives_a_clear_error(tmp_path: Path, damage, fragment: str) -> None:
    store = ClientStore(tmp_path).open()
    dev = store.device("user-3")
    dev.save_model("fedrap", {"D": np.ones((4, 4), np.float32)}, {"model_version": 1})
    path = dev.model_path("fedrap")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StateCorruptError, match=fragment) as info:
        dev.load_model("fedrap")
    msg = str(info.value)
    assert str(path) in msg and "move the file away" in msg
    store.close()


def test_corrupted_json_files(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    store.save_enrolled("host:1", {"user-1": 7})
    store.enrollment_path.write_text("{not json")
    with pytest.raises(StateCorruptError, match="invalid JSON"):
        store.enrolled("host:1")
    store.enrollment_path.write_text('{"host:1": {"user-1": "seven"}}')
    with pytest.raises(StateCorruptError, match="bad entry"):
        store.enrolled("host:1")
    store.close()


def test_enrolment_is_persisted_per_coordinator(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    store.save_enrolled("a:1", {"user-1": 1, "user-2": 2})
    store.save_enrolled("b:2", {"user-1": 40})
    store.close()
    store = ClientStore(tmp_path).open()
    assert store.enrolled("a:1") == {"user-1": 1, "user-2": 2}
    assert store.enrolled("b:2") == {"user-1": 40}
    assert store.enrolled("c:3") == {}
    store.close()


def test_identity_key_is_created_once(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    dev = store.device("user-4")
    k1 = dev.load_or_create_identity()
    k2 = dev.load_or_create_identity()
    assert k1 == k2 and len(k1) == 32
    assert (dev.identity_path.stat().st_mode & 0o777) == 0o600
    store.close()


def test_round_secret_save_load_and_wipe(tmp_path: Path) -> None:
    store = ClientStore(tmp_path).open()
    dev = store.device("user-5")
    secret = RoundSecret(session_id=os.urandom(16), round_number=9, seed=os.urandom(32))
    dev.save_round_secret(secret)
    assert dev.load_round_secret() == secret
    dev.clear_round_secret()
    assert dev.load_round_secret() is None and not dev.round_path.exists()
    dev.clear_round_secret()  # idempotent
    store.close()


def test_one_process_per_state_dir(tmp_path: Path) -> None:
    a = ClientStore(tmp_path).open()
    with pytest.raises(StateError, match="in use by another"):
        ClientStore(tmp_path).open()
    a.close()
    ClientStore(tmp_path).open().close()


def test_state_dir_is_bound_to_one_dataset(tmp_path: Path) -> None:
    with ClientStore(tmp_path) as store:
        store.check_client({"dataset": "ml-100k", "split_seed": 0})
        store.check_client({"dataset": "ml-100k", "split_seed": 0})
        with pytest.raises(StateError, match="belongs to dataset='ml-100k'"):
            store.check_client({"dataset": "synthetic", "split_seed": 0})


def test_bad_local_ids_are_refused(tmp_path: Path) -> None:
    with ClientStore(tmp_path) as store:
        for bad in ("../x", "", "a/b", ".hidden"):
            with pytest.raises(ValueError):
                store.device(bad)


def test_clearing_an_old_rounds_secret_keeps_a_newer_one(tmp_path: Path) -> None:
    with ClientStore(tmp_path) as store:
        dev = store.device("user-6")
        new = RoundSecret(session_id=b"n" * 16, round_number=8, seed=os.urandom(32))
        dev.save_round_secret(new)
        dev.clear_round_secret(session_id=b"o" * 16, round_number=7)  # a late wipe of round 7
        assert dev.load_round_secret() == new
        dev.clear_round_secret(session_id=b"n" * 16, round_number=8)
        assert dev.load_round_secret() is None
