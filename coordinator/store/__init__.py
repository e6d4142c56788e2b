"""Persistence of the coordinator: devices, model versions, rounds and the
privacy ledger and the operators' audit log, behind one interface (`Store`) with an in-memory and a SQL
implementation (SQLite file by default, PostgreSQL by URL; Alembic
migrations applied from code).

    store = open_store("sqlite:///./fedmask.db")   # migrated to head
    store.mark_interrupted_rounds_aborted()         # crash recovery at start-up
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from coordinator.store import errors, group_records, lease_records, records, replica_records, report_records
from coordinator.store.errors import *  # errors.__all__
from coordinator.store.group_records import *  # group_records.__all__
from coordinator.store.interface import Store
from coordinator.store.memory import InMemoryStore
from coordinator.store.lease_records import *  # lease_records.__all__
from coordinator.store.records import *  # records.__all__
from coordinator.store.replica_records import *  # replica_records.__all__
from coordinator.store.report_records import *  # report_records.__all__
from coordinator.store.url import MEMORY_URL

# The package's names: the store, its errors and records (each module's own
# __all__, so a new record or error is exported where it is defined).
__all__ = ["MEMORY_URL", "InMemoryStore", "Store", "open_store"]
__all__ += errors.__all__
__all__ += records.__all__
__all__ += report_records.__all__
__all__ += lease_records.__all__
__all__ += replica_records.__all__
__all__ += group_records.__all__


def open_store(url: str, *, migrate: bool = True, clock: Callable[[], datetime] = utc_now,
               idle_in_transaction_s: float | None = None) -> Store:
    """Open the store at `url`: "memory://" for an InMemoryStore, otherwise a
    SQL URL (see coordinator.store.engine, also for `idle_in_transaction_s`),
    upgraded to the latest schema unless `migrate` is False. Raises
    StoreError on a bad URL or database."""
    if url == MEMORY_URL:
        return InMemoryStore(clock=clock)
    # Imported lazily so in-memory users do not load SQLAlchemy/Alembic.
    from sqlalchemy.exc import SQLAlchemyError

    from coordinator.store.engine import create_store_engine
    from coordinator.store.migrate import upgrade_to_head
    from coordinator.store.sql import SqlStore

    engine = create_store_engine(url, idle_in_transaction_s=idle_in_transaction_s)
    if migrate:
        try:
            upgrade_to_head(engine)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise StoreError(f"cannot migrate {engine.url.render_as_string(hide_password=True)}: {exc}") from exc
    store = SqlStore(engine, clock=clock)
    if idle_in_transaction_s is not None:
        store.stuck_after_s = idle_in_transaction_s
    return store
