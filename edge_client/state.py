"""The device state store: everything a device keeps on local disk.

Every file is written atomically (`atomic_write`: temp file in the same
folder, fsync, os.replace, fsync of the folder), so a crash at any instant
leaves either the old or the new version, never a mix. Array files use one
self-checking container (`encode_arrays`): magic, SHA-256 of the payload,
then an npz (never pickled) whose `__meta__` entry is a JSON object. A file
that fails any check raises `StateCorruptError` naming the file and what to
do; nothing is silently reset.

Layout under `--state-dir`:

    lock                               flock: one process per state dir
    client.json                        client name, dataset, split seed (checked on restart)
    enrollment.json                    per coordinator address: local_id -> device_id
    devices/<local_id>/identity.fms    Ed25519 identity key (private, 0600)
    devices/<local_id>/identity-csr.pem  its certificate request for the device CA (--device-ca, D33)
    devices/<local_id>/identity-cert.pem the device CA's certificate for it (put there by the operator)
    devices/<local_id>/data.fms        the device's local ratings split
    devices/<local_id>/model-<name>.fms  private model state (u_i, D_i, p_u, mask model...)
                                          plus the global version it was trained from
    devices/<local_id>/round.fms       the running round's secret seed (deleted at round end)

Nothing here is ever sent to the coordinator, except the (public) identity
certificate, which goes out with the AdvertiseKeys of active-mode rounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import serialization

MAGIC = b"FMSTATE1"
_HEADER = len(MAGIC) + 32
_META = "__meta__"
_LOCAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TEMP_MARK = ".tmp-"


#: Every state folder: owner only (files are FILE_MODE).
DIR_MODE = 0o700
#: Every state file: owner read/write only.
FILE_MODE = 0o600


class StateError(Exception):
    """A state-dir problem the user must act on (message is user-facing)."""


class StateCorruptError(StateError):
    """A state file exists but cannot be trusted (truncated, bit flips, wrong format)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"corrupted state file {path}: {problem}. The device's private state cannot be "
            f"recovered from it; move the file away to reset this part of the device (it will "
            f"re-initialise, or re-enrol), or restore it from a backup."
        )
        self.path = path
        self.problem = problem


# ---------------------------------------------------------------- atomic files


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o600,
    before_replace: Callable[[Path], None] | None = None,
) -> None:
    """Replace `path` with `data` atomically and durably.

    `before_replace(temp_path)` runs after the temp file is fsynced and before
    os.replace (tests use it to simulate a crash at that point).
    """
    path = Path(path)
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def remove_stale_temps(folder: Path) -> int:
    """Delete temp files a crash left behind (never the real files); returns how many."""
    n = 0
    if folder.is_dir():
        for p in folder.rglob(f"*{TEMP_MARK}*"):
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
    return n


def secure_delete(path: Path) -> None:
    """Overwrite then unlink (best effort on journaling/COW file systems)."""
    with contextlib.suppress(FileNotFoundError):
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()
        _fsync_dir(path.parent)


# ---------------------------------------------------------------- array container


def encode_arrays(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bytes:
    """MAGIC | sha256(payload) | payload, payload = npz of `arrays` + JSON `meta`."""
    if _META in arrays:
        raise ValueError(f"{_META!r} is reserved")
    buf = io.BytesIO()
    meta_bytes = np.frombuffer(json.dumps(dict(meta), sort_keys=True).encode(), dtype=np.uint8)
    contents = {_META: meta_bytes, **{k: np.asarray(v, order="C") for k, v in arrays.items()}}
    # numpy types savez's **kwds together with its keyword `allow_pickle: bool`,
    # so a dict of arrays cannot be spread into it as typed; the names here
    # are array names (checked above not to clash with _META).
    save: Callable[..., None] = np.savez
    save(buf, **contents)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode_arrays(data: bytes, path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if len(data) < _HEADER or data[: len(MAGIC)] != MAGIC:
        raise StateCorruptError(path, "not a fedmask state file (bad magic or truncated header)")
    payload = data[_HEADER:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC) : _HEADER]:
        raise StateCorruptError(path, "checksum mismatch (truncated or modified)")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop(_META).tobytes().decode())
    except Exception as e:  # a valid checksum over a bad payload: written by something else
        raise StateCorruptError(path, f"unreadable payload ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise StateCorruptError(path, "metadata is not an object")
    return arrays, meta


def read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays and metadata of `path`, or None when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_arrays(data, path)


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], **kw: Any) -> None:
    atomic_write(path, encode_arrays(arrays, meta), **kw)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateCorruptError(path, f"invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise StateCorruptError(path, "expected a JSON object")
    return obj


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    atomic_write(path, (json.dumps(dict(obj), indent=2, sort_keys=True) + "\n").encode(), mode=0o600)


# ---------------------------------------------------------------- stores


@dataclass(frozen=True)
class RoundSecret:
    """The secret of one device's part in one round: every per-round secret
    (the two X25519 key pairs, the self-mask seed b_u, Shamir coefficients,
    AEAD nonces) is drawn from a DRBG seeded with `seed`."""

    session_id: bytes
    round_number: int
    seed: bytes


class DeviceStore:
    """The files of one hosted device."""

    def __init__(self, folder: Path, local_id: str) -> None:
        self.folder = folder
        self.local_id = local_id

    # identity ---------------------------------------------------------
    @property
    def identity_path(self) -> Path:
        return self.folder / "identity.fms"

    def load_or_create_identity(self, rand: Callable[[int], bytes] = os.urandom) -> bytes:
        """The raw 32-byte Ed25519 private key (created on first use)."""
        got = read_arrays(self.identity_path)
        if got is not None:
            arrays, meta = got
            key = arrays.get("ed25519_private")
            if key is None or key.dtype != np.uint8 or key.shape != (32,) or meta.get("kind") != "identity":
                raise StateCorruptError(self.identity_path, "no 32-byte Ed25519 key inside")
            return key.tobytes()
        raw = rand(32)
        write_arrays(
            self.identity_path, {"ed25519_private": np.frombuffer(raw, dtype=np.uint8)}, {"kind": "identity"}
        )
        return raw

    # identity certificate (device CA mode, D33) --------------------------
    @property
    def certificate_path(self) -> Path:
        """The device CA's certificate for this device's identity key (PEM),
        put here by the operator (`fedmask certs issue-device`)."""
        return self.folder / "identity-cert.pem"

    @property
    def certificate_request_path(self) -> Path:
        """The device's request for that certificate (PEM CSR), written by the client."""
        return self.folder / "identity-csr.pem"

    def load_identity_certificate(self) -> bytes | None:
        """The identity certificate as DER, None when there is none yet;
        StateCorruptError when the file is no PEM certificate."""
        try:
            pem = self.certificate_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
        except ValueError:
            raise StateCorruptError(self.certificate_path, "not a PEM certificate") from None

    def save_certificate_request(self, pem: bytes) -> None:
        atomic_write(self.certificate_request_path, pem)

    # local data --------------------------------------------------------
    @property
    def data_path(self) -> Path:
        return self.folder / "data.fms"

    def load_data(self) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        return read_arrays(self.data_path)

    def save_data(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        write_arrays(self.data_path, arrays, {"kind": "data", **meta})

    # private model state -----------------------------------------------
    def model_path(self, model_name: str) -> Path:
        if not re.match(r"^[a-z0-9_]+$", model_name):
            raise ValueError(f"bad model name {model_name!r}")
        return self.folder / f"model-{model_name}.fms"

    def load_model(self, model_name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        return read_arrays(self.model_path(model_name))

    def save_model(
        self, model_name: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], **kw: Any
    ) -> None:
        write_arrays(self.model_path(model_name), arrays, {"kind": "model", "model": model_name, **meta}, **kw)

    # round secret --------------------------------------------------------
    @property
    def round_path(self) -> Path:
        return self.folder / "round.fms"

    def save_round_secret(self, secret: RoundSecret) -> None:
        write_arrays(
            self.round_path,
            {
                "seed": np.frombuffer(secret.seed, dtype=np.uint8),
                "session_id": np.frombuffer(secret.session_id, dtype=np.uint8),
            },
            {"kind": "round", "round_number": int(secret.round_number)},
        )

    def load_round_secret(self) -> RoundSecret | None:
        got = read_arrays(self.round_path)
        if got is None:
            return None
        arrays, meta = got
        try:
            return RoundSecret(
                session_id=arrays["session_id"].tobytes(),
                round_number=int(meta["round_number"]),
                seed=arrays["seed"].tobytes(),
            )
        except (KeyError, TypeError, ValueError):
            raise StateCorruptError(self.round_path, "round secret fields missing") from None

    def clear_round_secret(self, *, session_id: bytes | None = None, round_number: int | None = None) -> None:
        """Wipe the round secret; with `session_id`/`round_number`, only if it is that round's
        (a newer round's secret written meanwhile stays)."""
        if session_id is not None or round_number is not None:
            try:
                current = self.load_round_secret()
            except StateCorruptError:
                current = None
            if current is not None and (current.session_id, current.round_number) != (session_id, round_number):
                return
        secure_delete(self.round_path)


class ClientStore:
    """The state dir of one edge-client process (see the module doc)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock_fd: int | None = None

    def open(self) -> ClientStore:
        """Create the folder, take the process lock, delete crash leftovers."""
        try:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            (self.root / "devices").mkdir(mode=DIR_MODE, exist_ok=True)
            for folder in (self.root, self.root / "devices", *(self.root / "devices").iterdir()):
                if folder.is_dir() and not folder.is_symlink():
                    os.chmod(folder, DIR_MODE)  # also tightens a folder made by an older release
        except OSError as e:
            raise StateError(f"cannot create state dir {self.root}: {e.strerror}") from None
        if not os.access(self.root, os.W_OK):
            raise StateError(f"state dir {self.root} is not writable")
        import fcntl

        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StateError(f"state dir {self.root} is in use by another fedmask client process") from None
        self._lock_fd = fd
        remove_stale_temps(self.root)
        return self

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> ClientStore:
        return self.open() if self._lock_fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # client identity -------------------------------------------------------
    def check_client(self, expected: Mapping[str, Any]) -> dict[str, Any]:
        """Bind the state dir to one dataset/split; StateError when reused for another."""
        path = self.root / "client.json"
        got = read_json(path)
        if got is None:
            write_json(path, dict(expected))
            return dict(expected)
        for key in ("dataset", "split_seed"):
            if key in expected and got.get(key) != expected[key]:
                raise StateError(
                    f"state dir {self.root} belongs to {key}={got.get(key)!r}, not {expected[key]!r}; "
                    f"use another --state-dir"
                )
        return got

    # enrolment ---------------------------------------------------------------
    @property
    def enrollment_path(self) -> Path:
        return self.root / "enrollment.json"

    def enrolled(self, coordinator: str) -> dict[str, int]:
        got = read_json(self.enrollment_path) or {}
        devices = got.get(coordinator, {})
        if not isinstance(devices, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v >= 1 for k, v in devices.items()
        ):
            raise StateCorruptError(self.enrollment_path, f"bad entry for {coordinator!r}")
        return dict(devices)

    def save_enrolled(self, coordinator: str, devices: Mapping[str, int]) -> None:
        got = read_json(self.enrollment_path) or {}
        merged = dict(got.get(coordinator, {}))
        merged.update({k: int(v) for k, v in devices.items()})
        got[coordinator] = merged
        write_json(self.enrollment_path, got)

    # devices -------------------------------------------------------------------
    def device(self, local_id: str) -> DeviceStore:
        if not _LOCAL_ID.match(local_id):
            raise ValueError(f"bad local device id {local_id!r}")
        return DeviceStore(self.root / "devices" / local_id, local_id)

    def devices(self) -> Iterator[DeviceStore]:
        base = self.root / "devices"
        for p in sorted(base.iterdir()) if base.is_dir() else ():
            if p.is_dir() and _LOCAL_ID.match(p.name):
                yield DeviceStore(p, p.name)
