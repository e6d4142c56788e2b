"""Share reports and quarantines in the store (D37): the `share_reports`
table (counted share-check reports) and the `quarantines` table, so that
every coordinator replica applies the same report rule.

Revision ID: 0004_share_reports
Revises: 0003_audit_log
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_share_reports"
down_revision: str | None = "0003_audit_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types of that time (never import orm.py here).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "share_reports",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("round_number", sa.BigInteger(), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("reporter", sa.String(255), nullable=False),
        sa.Column("reported", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_share_reports"),
    )
    op.create_index("ix_share_reports_round_number", "share_reports", ["round_number"])
    op.create_index("ix_share_reports_reported", "share_reports", ["reported"])
    op.create_table(
        "quarantines",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("device_id", sa.BigInteger(), nullable=False),
        sa.Column("started_round", sa.BigInteger(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("until_round", sa.BigInteger(), nullable=False),
        sa.Column("until", _TS, nullable=False),
        sa.Column("charged", _JSON, nullable=False),
        sa.Column("released_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_quarantines"),
    )
    op.create_index("ix_quarantines_device_id", "quarantines", ["device_id"])


def downgrade() -> None:
    op.drop_index("ix_quarantines_device_id", table_name="quarantines")
    op.drop_table("quarantines")
    op.drop_index("ix_share_reports_reported", table_name="share_reports")
    op.drop_index("ix_share_reports_round_number", table_name="share_reports")
    op.drop_table("share_reports")
