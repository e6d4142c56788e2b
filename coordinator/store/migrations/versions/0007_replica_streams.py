"""The replica tier: each coordinator replica's membership (a lease per
name: its fencing token, expiry and join time by the database's clock,
settings digest, addresses), which replica and term hold each device's
stream, and the one-row fleet counter that grows on every change of them.
Additive: a coordinator of the previous release ignores the tables, so a
rolling update can run both versions side by side.

Revision ID: 0007_replica_streams
Revises: 0006_ledger_groups
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_replica_streams"
down_revision: str | None = "0006_ledger_groups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("joined_at", sa.Double(), nullable=False),
        sa.Column("settings_digest", sa.String(64), nullable=False),
        sa.Column("device_address", sa.String(255), nullable=True),
        sa.Column("admin_address", sa.String(255), nullable=True),
        sa.Column("streams_version", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True),
        sa.Column("state_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_replicas"),
    )
    op.create_table(
        "device_streams",
        sa.Column("device_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("replica", sa.String(255), nullable=False),
        sa.Column("replica_token", sa.BigInteger(), nullable=False),
        sa.Column("session_key", sa.BigInteger(), nullable=False),
        sa.Column("available", sa.Boolean(), nullable=False),
        sa.Column("claim", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", name="pk_device_streams"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_device_streams_device_id_devices"),
    )
    op.create_index("ix_device_streams_replica", "device_streams", ["replica"])
    counter = op.create_table(
        "fleet_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleet_counter"),
        sa.CheckConstraint("id = 1", name="ck_fleet_counter_one_row"),
    )
    op.bulk_insert(counter, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("fleet_counter")
    op.drop_index("ix_device_streams_replica", table_name="device_streams")
    op.drop_table("device_streams")
    op.drop_table("replicas")
