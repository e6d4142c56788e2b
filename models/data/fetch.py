"""Obtain public datasets reproducibly, without ever committing them.

MovieLens-100K is taken from the `recbole==1.2.1` wheel on PyPI, which ships it
in RecBole's atomic format under `recbole/dataset_example/ml-100k/`. The wheel
is *downloaded, never installed* (`pip download --no-deps --only-binary=:all:`),
its sha256 is pinned, and so is the sha256 of every file taken out of it. The
files land in `<data_dir>/ml-100k/` (`data/` is git-ignored).

Everything here is a pure function except `fetch_dataset`, the one function
that does I/O; it takes its subprocess runner and progress callback as
arguments so tests can inject them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "FEDMASK_DATA_DIR"
DEFAULT_DATA_DIR = "data"

RECBOLE_REQUIREMENT = "recbole==1.2.1"
RECBOLE_WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"
RECBOLE_WHEEL_SHA256 = "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset comes from and what its files must hash to."""

    name: str
    requirement: str  # what `pip download` is asked for
    wheel_name: str
    wheel_sha256: str
    member_prefix: str  # folder inside the wheel
    files: Mapping[str, str]  # file name -> sha256 hex


SOURCES: dict[str, DatasetSource] = {
    "ml-100k": DatasetSource(
        name="ml-100k",
        requirement=RECBOLE_REQUIREMENT,
        wheel_name=RECBOLE_WHEEL_NAME,
        wheel_sha256=RECBOLE_WHEEL_SHA256,
        member_prefix="recbole/dataset_example/ml-100k/",
        files={
            "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
            "ml-100k.user": "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972",
            "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
        },
    ),
}


class FetchError(RuntimeError):
    """A dataset could not be obtained."""


class DownloadError(FetchError):
    """`pip download` failed (network, index or pip problem); `output` holds pip's output."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


class HashMismatchError(FetchError):
    """A downloaded or extracted file does not have its pinned sha256."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(
            f"sha256 mismatch for {what}: expected {expected}, got {actual}. "
            "The download may be corrupted or the upstream file changed; nothing was written."
        )
        self.what = what
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class FetchResult:
    name: str
    directory: Path
    files: tuple[Path, ...]
    downloaded: bool  # False when every file was already present and valid


# ---------------------------------------------------------------- pure helpers


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def resolve_data_dir(
    data_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Explicit argument > $FEDMASK_DATA_DIR > `data/` relative to the cwd."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir)
    env = os.environ if env is None else env
    from_env = env.get(DATA_DIR_ENV, "")
    return Path(from_env) if from_env else Path(DEFAULT_DATA_DIR)


def get_source(name: str) -> DatasetSource:
    try:
        return SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise FetchError(f"unknown dataset {name!r}; fetchable datasets: {known}") from None


def invalid_files(source: DatasetSource, directory: Path) -> list[str]:
    """Names of the dataset's files that are missing or have the wrong hash."""
    bad = []
    for fname, digest in source.files.items():
        p = directory / fname
        if not p.is_file() or sha256_file(p) != digest:
            bad.append(fname)
    return bad


def pip_download_command(
    source: DatasetSource, dest: str | os.PathLike[str], python: str = sys.executable
) -> list[str]:
    return [
        python,
        "-m",
        "pip",
        "download",
        source.requirement,
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "-d",
        str(dest),
    ]


def read_verified_members(source: DatasetSource, wheel_path: Path) -> dict[str, bytes]:
    """Check the wheel's hash, then read and hash-check each dataset file (in memory)."""
    actual = sha256_file(wheel_path)
    if actual != source.wheel_sha256:
        raise HashMismatchError(source.wheel_name, source.wheel_sha256, actual)
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel_path) as zf:
        names = set(zf.namelist())
        for fname, digest in source.files.items():
            member = source.member_prefix + fname
            if member not in names:
                raise FetchError(f"{source.wheel_name} has no member {member}")
            data = zf.read(member)
            got = sha256_bytes(data)
            if got != digest:
                raise HashMismatchError(f"{member} in {source.wheel_name}", digest, got)
            out[fname] = data
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- the I/O function

Runner = Callable[..., subprocess.CompletedProcess]


def fetch_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    python: str = sys.executable,
    runner: Runner = subprocess.run,
    wheel_path: str | os.PathLike[str] | None = None,
) -> FetchResult:
    """Make `<data_dir>/<name>/` hold the dataset's files with their pinned hashes.

    Idempotent: when every file is already present and valid nothing is
    downloaded (unless `force`). `wheel_path` uses a local copy of the wheel
    instead of running `pip download` (still hash-checked).
    """
    say = progress or (lambda _msg: None)
    source = get_source(name)
    directory = resolve_data_dir(data_dir) / source.name
    paths = tuple(directory / f for f in source.files)

    if not force and directory.is_dir():
        say(f"checking {directory}")
        if not invalid_files(source, directory):
            return FetchResult(source.name, directory, paths, downloaded=False)

    with tempfile.TemporaryDirectory(prefix="fedmask-fetch-") as tmp:
        if wheel_path is None:
            say(f"downloading {source.requirement} wheel from the package index (not installing it)")
            cmd = pip_download_command(source, tmp, python)
            try:
                proc = runner(cmd, capture_output=True, text=True, check=False)
            except OSError as e:
                raise DownloadError(f"could not run pip ({' '.join(cmd)}): {e}") from e
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-8:])
                raise DownloadError(
                    f"`pip download {source.requirement}` failed (exit {proc.returncode}):\n{tail}",
                    output=f"{proc.stdout or ''}\n{proc.stderr or ''}",
                )
            wheel = Path(tmp) / source.wheel_name
            if not wheel.is_file():
                found = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
                raise DownloadError(f"pip download did not produce {source.wheel_name} (found: {found})")
        else:
            wheel = Path(wheel_path)
        say(f"verifying {source.wheel_name} (sha256 {source.wheel_sha256[:12]}…)")
        members = read_verified_members(source, wheel)

    directory.mkdir(parents=True, exist_ok=True)
    for fname, data in members.items():
        say(f"writing {directory / fname}")
        _atomic_write(directory / fname, data)
    return FetchResult(source.name, directory, paths, downloaded=True)


def fetch_hint(name: str) -> str:
    return f"run `fedmask data fetch {name}` (or pass --data-dir / set ${DATA_DIR_ENV})"


__all__: Sequence[str] = [
    "DATA_DIR_ENV",
    "SOURCES",
    "DatasetSource",
    "DownloadError",
    "FetchError",
    "FetchResult",
    "HashMismatchError",
    "fetch_dataset",
    "fetch_hint",
    "get_source",
    "invalid_files",
    "pip_download_command",
    "read_verified_members",
    "resolve_data_dir",
    "sha256_file",
]
