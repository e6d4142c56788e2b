"""Alembic environment: runs only on a connection handed over by
coordinator.store.migrate (there is no alembic.ini and no offline mode)."""

from __future__ import annotations

from alembic import context

from coordinator.store.orm import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through coordinator.store.migrate, not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite ALTERs go through batch (copy-and-move)
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
