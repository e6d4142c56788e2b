"""A throwaway PostgreSQL server on 127.0.0.1: for `fedmask bench scale` and
for the tests (tests/conftest_pg.py builds its fixtures on it).

`start_server(base)` runs initdb into `base/data` (trust authentication,
UTF8, the C locale) and starts the server on a free 127.0.0.1 port, its unix
socket in `base/sock`, durability off (fsync, synchronous_commit,
full_page_writes: nothing here outlives the run). It returns a
`RunningServer`, whose `stop()` stops the server at once (`-m immediate`);
deleting `base` is the caller's. `admin(server, statement, *identifiers)`
runs one statement as the superuser (CREATE / DROP DATABASE).

Binaries: $FEDMASK_PG_BINDIR, else /usr/lib/postgresql/15/bin (Debian's
postgresql-15; other versions there are tried next), else initdb/pg_ctl on
PATH (symlinks resolved), else `pg_config --bindir`.

initdb refuses to run as root: as root the server runs as the `postgres`
user (created by the Debian package), which must own `base` and be able to
traverse its parents (use a folder under /tmp, not a 0700 one).

Every failure to provide the server is a `PgUnavailable` with the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import LiteralString

PG_PREFERRED_MAJOR = "15"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_START_TIMEOUT_S = 60


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str
    bindir: Path
    version: str

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server, as the superuser."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"


class PgUnavailable(RuntimeError):
    """The throwaway server could not be provided (reason in the message)."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / b, os.X_OK) for b in _SERVER_BINARIES)


def find_pg_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    candidates: list[Path] = []
    if os.environ.get("FEDMASK_PG_BINDIR"):
        candidates.append(Path(os.environ["FEDMASK_PG_BINDIR"]))
    debian = Path("/usr/lib/postgresql")
    candidates.append(debian / PG_PREFERRED_MAJOR / "bin")
    if debian.is_dir():
        majors = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True
        )
        candidates += [p / "bin" for p in majors]
    for exe in ("initdb", "pg_ctl"):
        found = shutil.which(exe)
        if found:
            candidates.append(Path(found).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    return next((c for c in candidates if _has_server(c)), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Runner:
    """Runs PostgreSQL binaries as an unprivileged user when we are root."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.user: str | None = None
        self._ids = (-1, -1)
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PgUnavailable(
                    "running as root and there is no 'postgres' user for initdb "
                    "(install postgresql-15: .ci/ensure-postgres)"
                ) from None
            self.user = pw.pw_name
            self._ids = (pw.pw_uid, pw.pw_gid)
            os.chown(base, *self._ids)

    def mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if self.user:
            os.chown(path, *self._ids)

    def write(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self.user:
            os.chown(path, *self._ids)

    def run(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        # As self.user (its group, no supplementary groups) when set; else as we are.
        group = pwd.getpwnam(self.user).pw_gid if self.user else None
        extra_groups: list[int] | None = [] if self.user else None
        env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PGTZ": "UTC"}
        return subprocess.run(
            argv, cwd=self.base, env=env, capture_output=True, text=True, timeout=timeout,
            check=False, user=self.user or None, group=group, extra_groups=extra_groups,
        )


def _check(proc: subprocess.CompletedProcess[str], what: str, log: Path | None = None) -> None:
    if proc.returncode == 0:
        return
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- server log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise PgUnavailable(f"{what} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}{tail}")


@dataclass(frozen=True)
class RunningServer:
    """A started throwaway server (see the module doc)."""

    server: PgServer
    data: Path
    runner: _Runner

    def stop(self) -> None:
        """Stop the server at once; its files stay in the base folder."""
        self.runner.run([str(self.server.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                        timeout=60)


def start_server(base: Path, bindir: Path | None = None, *, max_connections: int = 50) -> RunningServer:
    """initdb into `base/data` and start the server (see the module doc);
    `bindir`: the binaries' folder (default: `find_pg_bindir()`)."""
    bindir = bindir or find_pg_bindir()
    if bindir is None:
        raise PgUnavailable("no initdb/pg_ctl/postgres found (run .ci/ensure-postgres or set FEDMASK_PG_BINDIR)")
    runner = _Runner(base)
    data, log, sock = base / "data", base / "server.log", base / "sock"
    version = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    proc = runner.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
         "--locale=C", "--no-sync", "--no-instructions"],
        timeout=120,
    )
    _check(proc, "initdb")
    runner.mkdir(sock)
    for attempt in range(3):
        port = _free_port()
        settings = {
            "listen_addresses": "'127.0.0.1'", "port": str(port), "unix_socket_directories": f"'{sock}'",
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "max_connections": str(max_connections), "shared_buffers": "16MB", "timezone": "'UTC'",
        }
        runner.write(data / "postgresql.auto.conf", "".join(f"{k} = {v}\n" for k, v in settings.items()))
        proc = runner.run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", str(_START_TIMEOUT_S), "start"],
            timeout=_START_TIMEOUT_S + 10,
        )
        if proc.returncode == 0:
            return RunningServer(PgServer("127.0.0.1", port, "postgres", bindir, version), data, runner)
        if attempt == 2 or "already in use" not in (log.read_text(errors="replace") if log.exists() else ""):
            _check(proc, "pg_ctl start", log)
    raise AssertionError("unreachable")


def admin(server: PgServer, statement: LiteralString, *identifiers: str) -> None:
    """Run `statement` as the superuser on database postgres; its `{}`
    placeholders take `identifiers`, quoted as SQL identifiers."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=server.host, port=server.port, user=server.user, dbname="postgres", autocommit=True, connect_timeout=10
    ) as conn:
        conn.execute(sql.SQL(statement).format(*(sql.Identifier(i) for i in identifiers)))


__all__ = ["PgServer", "PgUnavailable", "RunningServer", "admin", "find_pg_bindir", "start_server"]
