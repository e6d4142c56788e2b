"""Obtain public datasets reproducibly, without ever committing them.

Two kinds of source (`SOURCES`); the files always land in `<data_dir>/<name>/`
(`data/` is git-ignored):

- `WheelSource` (ml-100k): MovieLens-100K from the `recbole==1.2.1` wheel on
  PyPI, which ships it in RecBole's atomic format under
  `recbole/dataset_example/ml-100k/`. The wheel is *downloaded, never installed*
  (`pip download --no-deps --only-binary=:all:`); its sha256 is pinned, and so
  is the sha256 of every file taken out of it.
- `ArchiveSource` (ml-latest-small, ml-1m, lastfm): an archive fetched over
  HTTP(S) from a fixed URL, its sha256 pinned, and the named files taken out of
  it. ml-latest-small comes from the `lenskit==2025.8.1` *source distribution*
  on PyPI (its `data/ml-latest-small/`, with GroupLens' README allowing
  redistribution); `pip download` cannot fetch that sdist without building its
  metadata (a Rust crate, which needs crates.io), so its PyPI file URL is used
  directly, hash-pinned like the wheel. ml-1m and lastfm come from GroupLens'
  official archives. Files whose sha256 is not pinned (ml-1m, lastfm members:
  their archives are pinned, their members were never seen here) get their
  hash recorded at fetch time in `<dir>/fetched.json`, against which later
  runs verify them. A base URL (`base_url` or $FEDMASK_DATA_BASE_URL) replaces
  the official address with `<base>/<archive file name>` (a mirror, or a
  test's local server); the archive's pinned hash still applies.

Everything here is a pure function except `fetch_dataset` and `http_download`,
the functions that do I/O; they take their subprocess runner, URL opener and
progress callback as arguments so tests can inject them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

DATA_DIR_ENV = "FEDMASK_DATA_DIR"
DEFAULT_DATA_DIR = "data"
BASE_URL_ENV = "FEDMASK_DATA_BASE_URL"
MANIFEST_NAME = "fetched.json"

RECBOLE_REQUIREMENT = "recbole==1.2.1"
RECBOLE_WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"
RECBOLE_WHEEL_SHA256 = "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"


@dataclass(frozen=True)
class DatasetSource:
    """A dataset inside a wheel fetched with `pip download` (never installed)."""

    name: str
    requirement: str  # what `pip download` is asked for
    wheel_name: str
    wheel_sha256: str
    member_prefix: str  # folder inside the wheel
    files: Mapping[str, str]  # file name -> sha256 hex


WheelSource = DatasetSource


@dataclass(frozen=True)
class ArchiveSource:
    """A dataset inside a .zip or .tar.gz archive fetched over HTTP(S).

    `files` maps each required file (under `member_prefix` in the archive) to its
    pinned sha256, or to None when only the archive's hash is known (the file's
    hash is then recorded at fetch time, see the module docstring). `extras` are
    taken when present (licence READMEs), never required, never pinned.
    """

    name: str
    url: str  # the official address; its last path segment is the archive's file name
    archive_sha256: str | None  # None: not pinned, recorded at fetch time
    archive_format: Literal["zip", "tar.gz"]
    member_prefix: str
    files: Mapping[str, str | None]
    extras: tuple[str, ...] = ()

    @property
    def archive_name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


Source = DatasetSource | ArchiveSource

# lenskit 2025.8.1's sdist, as listed by PyPI's simple index (https://pypi.org/simple/lenskit/).
LENSKIT_SDIST_URL = (
    "https://files.pythonhosted.org/packages/85/d4/"
    "b0f120bd01fe614520281afd21b80b4222ef138e687f861a3f3ea4bbab7a/lenskit-2025.8.1.tar.gz"
)

GROUPLENS_DATASETS = "https://files.grouplens.org/datasets/"


def _grouplens_zip(name: str, path: str, archive_sha256: str, member_prefix: str, files: tuple[str, ...],
                   readme: str) -> ArchiveSource:
    """A GroupLens .zip: the archive's hash pinned, its files' hashes recorded
    at fetch time (module docstring), its licence README taken when present."""
    return ArchiveSource(
        name=name, url=GROUPLENS_DATASETS + path, archive_sha256=archive_sha256, archive_format="zip",
        member_prefix=member_prefix, files=dict.fromkeys(files), extras=(readme,),
    )


def _catalogue(*sources: Source) -> dict[str, Source]:
    return {source.name: source for source in sources}


SOURCES: dict[str, Source] = _catalogue(
    DatasetSource(
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
    # MovieLens "latest small", October 2016 release: 100,004 ratings, 671 users, 9,066 rated movies.
    ArchiveSource(
        name="ml-latest-small",
        url=LENSKIT_SDIST_URL,
        archive_sha256="954b22a81e8a0d2012a173340079aa3d0c68dcc8cb9954e488fc228d77d4cb55",
        archive_format="tar.gz",
        member_prefix="lenskit-2025.8.1/data/ml-latest-small/",
        files={
            "ratings.csv": "b4239649fbf90ebf405c56c3ae1d929d9e7c86fc1a3a80cbef1c884df593ef73",
            "movies.csv": "43d1736d3c688eb5b7856473c36d86a1c345676cab256c91720c1f6984d263b5",
            "README.txt": "59be481ddf3fab0f9f7cf2f73e0db4d0920a413a313c911b62bd01ee8816ea2f",
        },
    ),
    # Archive hashes: not downloadable from here; the values are the ones several
    # independent public projects pin for these URLs (docs/decisions.md, "Datasets by URL").
    _grouplens_zip("ml-1m", "movielens/ml-1m.zip", "a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
                   "ml-1m/", ("ratings.dat", "users.dat", "movies.dat"), "README"),
    _grouplens_zip("lastfm", "hetrec2011/hetrec2011-lastfm-2k.zip",
                   "6738f48195667ff03caaab4d32ca9a3133d8cc026b7c3cdaf6ce1010e913c59c",
                   "", ("user_artists.dat", "artists.dat"), "readme.txt"),
)


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


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise FetchError(f"unknown dataset {name!r}; fetchable datasets: {known}") from None


def read_manifest(directory: Path) -> dict[str, str]:
    """File -> sha256 recorded by a previous fetch ({} when absent or unreadable)."""
    try:
        data = json.loads((directory / MANIFEST_NAME).read_text())
        files = data.get("files", {})
        return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def expected_hashes(source: Source, directory: Path) -> dict[str, str | None]:
    """Each required file's expected sha256: pinned, else recorded in the manifest, else None."""
    recorded = read_manifest(directory)
    return {f: (h if h is not None else recorded.get(f)) for f, h in source.files.items()}


def invalid_files(source: Source, directory: Path) -> list[str]:
    """Names of the dataset's files that are missing or have the wrong (or no known) hash."""
    bad = []
    for fname, digest in expected_hashes(source, directory).items():
        p = directory / fname
        if digest is None or not p.is_file() or sha256_file(p) != digest:
            bad.append(fname)
    return bad


def resolve_base_url(base_url: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Explicit argument > $FEDMASK_DATA_BASE_URL > None (the official URLs)."""
    if base_url:
        return base_url
    env = os.environ if env is None else env
    return env.get(BASE_URL_ENV) or None


def archive_url(source: ArchiveSource, base_url: str | None = None) -> str:
    """The official URL, or `<base_url>/<archive file name>`."""
    return source.url if not base_url else f"{base_url.rstrip('/')}/{source.archive_name}"


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


def _archive_members(fmt: str, data: bytes, names: Sequence[str]) -> dict[str, bytes]:
    """The named members that exist in the archive (regular files only), read in memory."""
    out: dict[str, bytes] = {}
    wanted = set(names)
    try:
        if fmt == "zip":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    if info.filename in wanted and not info.is_dir():
                        out[info.filename] = zf.read(info)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
                for member in tf.getmembers():
                    if member.name in wanted and member.isfile():
                        f = tf.extractfile(member)
                        if f is not None:
                            out[member.name] = f.read()
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise FetchError(f"not a readable {fmt} archive: {e}") from e
    return out


def read_verified_archive(source: ArchiveSource, data: bytes) -> tuple[str, dict[str, bytes], dict[str, bytes]]:
    """Check the archive's hash (when pinned) and layout, then each required file's
    pinned hash. Returns (archive sha256, required files, extras found)."""
    actual = sha256_bytes(data)
    if source.archive_sha256 is not None and actual != source.archive_sha256:
        raise HashMismatchError(source.archive_name, source.archive_sha256, actual)
    members = {source.member_prefix + f: f for f in (*source.files, *source.extras)}
    found = _archive_members(source.archive_format, data, list(members))
    missing = [m for m in (source.member_prefix + f for f in source.files) if m not in found]
    if missing:
        raise FetchError(
            f"{source.archive_name} does not have the expected layout: no {', '.join(missing)}; nothing was written"
        )
    files: dict[str, bytes] = {}
    for fname, digest in source.files.items():
        blob = found[source.member_prefix + fname]
        got = sha256_bytes(blob)
        if digest is not None and got != digest:
            raise HashMismatchError(f"{source.member_prefix}{fname} in {source.archive_name}", digest, got)
        files[fname] = blob
    extras = {f: found[source.member_prefix + f] for f in source.extras if source.member_prefix + f in found}
    return actual, files, extras


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


# ---------------------------------------------------------------- the I/O functions

Runner = Callable[..., subprocess.CompletedProcess]
Opener = Callable[..., IO[bytes]]

HTTP_TIMEOUT_S = 60.0


def http_download(
    url: str,
    *,
    progress: Callable[[str], None] | None = None,
    opener: Opener = urllib.request.urlopen,
    timeout: float = HTTP_TIMEOUT_S,
    chunk: int = 1 << 20,
) -> bytes:
    """GET `url` into memory (the archives are a few MB). Every failure is a DownloadError
    naming the URL: unreachable server, HTTP error status, or a truncated body."""
    say = progress or (lambda _msg: None)
    try:
        with opener(url, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
            total = int(length) if length and length.isdigit() else None
            parts: list[bytes] = []
            got = 0
            while block := resp.read(chunk):
                parts.append(block)
                got += len(block)
                say(f"downloading {url}: {got / 1e6:.1f}" + (f" / {total / 1e6:.1f} MB" if total else " MB"))
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: the server answered HTTP {e.code} {e.reason}", output=str(e)) from e
    except urllib.error.URLError as e:
        raise DownloadError(
            f"could not reach {url}: {e.reason}. Check the network (or set ${BASE_URL_ENV} / --base-url "
            "to a mirror that serves the same archive)",
            output=str(e),
        ) from e
    except (OSError, ValueError) as e:  # timeouts, resets, malformed URLs
        raise DownloadError(f"downloading {url} failed: {e}", output=str(e)) from e
    if total is not None and got != total:
        raise DownloadError(f"{url}: got {got} bytes, the server announced {total} (truncated download)")
    return b"".join(parts)


def _write_files(directory: Path, files: Mapping[str, bytes], say: Callable[[str], None]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for fname, data in files.items():
        say(f"writing {directory / fname}")
        _atomic_write(directory / fname, data)


def fetch_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    python: str = sys.executable,
    runner: Runner = subprocess.run,
    wheel_path: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    opener: Opener = urllib.request.urlopen,
) -> FetchResult:
    """Make `<data_dir>/<name>/` hold the dataset's files with their expected hashes.

    Idempotent: when every file is already present and valid nothing is
    downloaded (unless `force`). Nothing is written unless every check passed.
    Wheel sources: `wheel_path` uses a local copy of the wheel instead of running
    `pip download` (still hash-checked); `base_url` does not apply (pip has its
    own index settings). Archive sources: `base_url` (default
    $FEDMASK_DATA_BASE_URL) replaces the official URL, see `archive_url`.
    """
    say = progress or (lambda _msg: None)
    source = get_source(name)
    directory = resolve_data_dir(data_dir) / source.name
    paths = tuple(directory / f for f in source.files)

    if not force and directory.is_dir():
        say(f"checking {directory}")
        if not invalid_files(source, directory):
            return FetchResult(source.name, directory, paths, downloaded=False)

    if isinstance(source, ArchiveSource):
        url = archive_url(source, resolve_base_url(base_url))
        say(f"downloading {url}")
        data = http_download(url, progress=say, opener=opener)
        pinned = f" (sha256 {source.archive_sha256[:12]}…)" if source.archive_sha256 else ""
        say(f"verifying {source.archive_name}{pinned}")
        archive_sha, files, extras = read_verified_archive(source, data)
        _write_files(directory, {**files, **extras}, say)
        manifest = {
            "source": url,
            "archive": source.archive_name,
            "archive_sha256": archive_sha,
            "archive_sha256_pinned": source.archive_sha256 is not None,
            "files": {f: sha256_bytes(b) for f, b in files.items()},
        }
        _atomic_write(directory / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())
        return FetchResult(source.name, directory, paths, downloaded=True)

    if base_url:
        raise FetchError(
            f"{source.name} is fetched with `pip download {source.requirement}`; --base-url does not apply "
            "(point pip at a mirror with PIP_INDEX_URL instead)"
        )
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

    _write_files(directory, members, say)
    return FetchResult(source.name, directory, paths, downloaded=True)


def fetch_hint(name: str) -> str:
    return f"run `fedmask data fetch {name}` (or pass --data-dir / set ${DATA_DIR_ENV})"


__all__: Sequence[str] = [
    "ArchiveSource",
    "BASE_URL_ENV",
    "DATA_DIR_ENV",
    "MANIFEST_NAME",
    "archive_url",
    "http_download",
    "read_verified_archive",
    "resolve_base_url",
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
