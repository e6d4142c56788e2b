"""Operator audit log, and user handles unique: the `audit_log` table (who
did what, when, with what outcome) and a unique index on non-empty
devices.local_id (the handle RecommendTopK looks devices up by).

A database enrolled before handles were unique may hold one local_id
several times: every device but the oldest holding it is renamed
"<local_id>#<device id>" first, so the index can be built (the renamed
devices keep working; their handle is the new name).

Revision ID: 0003_audit_log
Revises: 0002_round_counter
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003_audit_log"
down_revision: str | None = "0002_round_counter"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types of that time (never import orm.py here).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)
_HANDLE = "uq_devices_local_id_handle"


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("operator", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(1024), nullable=False),
        sa.Column("details", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    bind = op.get_bind()
    duplicates = bind.execute(sa.text(
        "SELECT d.id, d.local_id FROM devices d WHERE d.local_id <> '' AND EXISTS "
        "(SELECT 1 FROM devices o WHERE o.local_id = d.local_id AND o.id < d.id)"
    )).all()
    for device_id, local_id in duplicates:
        bind.execute(sa.text("UPDATE devices SET local_id = :new WHERE id = :id"),
                     {"new": f"{local_id[:230]}#{device_id}", "id": device_id})
    op.create_index(_HANDLE, "devices", ["local_id"], unique=True,
                    sqlite_where=sa.text("local_id <> ''"), postgresql_where=sa.text("local_id <> ''"))


def downgrade() -> None:
    op.drop_index(_HANDLE, table_name="devices")
    op.drop_table("audit_log")
