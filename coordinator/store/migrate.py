"""Alembic, configured from code (no alembic.ini): the coordinator brings
the database to the latest schema at start-up with `upgrade_to_head`.

To write a new migration after changing orm.py (developers):
    .venv/bin/python -m coordinator.store.migrate revision -m "what changed"
which autogenerates a revision file in migrations/versions/ against a
scratch SQLite database upgraded to head; review it before committing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from coordinator.store.engine import create_store_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config pointing at our migrations; `connection` is handed
    to migrations/env.py (which refuses to run without one)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


#: PostgreSQL advisory lock held by an upgrade for its transaction, so that
#: replicas starting together upgrade one after the other (the later ones
#: find the schema at head and do nothing). Leadership never uses it (D90).
MIGRATION_LOCK_KEY = 0x666D_6D67  # "fmmg"


def upgrade_to_head(engine: Engine) -> None:
    """Apply every pending migration in one transaction (idempotent; on
    PostgreSQL concurrent callers wait for each other)."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        command.upgrade(alembic_config(connection), "head")


def _revision(message: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_store_engine(f"sqlite:///{tmp}/scratch.db")
        upgrade_to_head(engine)
        with engine.begin() as connection:
            command.revision(alembic_config(connection), message=message, autogenerate=True)
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fedmask store migrations")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rev = sub.add_parser("revision", help="autogenerate a new migration")
    rev.add_argument("-m", "--message", required=True)
    up = sub.add_parser("upgrade", help="upgrade a database to head")
    up.add_argument("url")
    args = parser.parse_args(argv)
    if args.cmd == "revision":
        _revision(args.message)
    else:
        engine = create_store_engine(args.url)
        upgrade_to_head(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
