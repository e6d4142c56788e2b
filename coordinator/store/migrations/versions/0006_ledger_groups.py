"""The groups of a round in groups in its privacy entry (D99): a nullable
JSON list of {size, counted, noise_multiplier}, one per group whose sum was
released. Additive: a coordinator of the previous release ignores the
column, so a rolling update can run both versions side by side.

Revision ID: 0006_ledger_groups
Revises: 0005_leader_lease
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006_ledger_groups"
down_revision: str | None = "0005_leader_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("privacy_ledger") as batch:
        batch.add_column(sa.Column("groups", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("privacy_ledger") as batch:
        batch.drop_column("groups")
