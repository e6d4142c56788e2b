"""The leader lease of replicated coordinators (D90): one row holding the
leading replica, its expiry by the database's clock (seconds since the
epoch) and the fencing token that grows on every takeover. Additive: a
coordinator of the previous release ignores the table, so a rolling update
can run both versions side by side.

Revision ID: 0005_leader_lease
Revises: 0004_share_reports
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_leader_lease"
down_revision: str | None = "0004_share_reports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    lease = op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_leader_lease"),
        sa.CheckConstraint("id = 1", name="ck_leader_lease_one_row"),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": None, "token": 0, "expires_at": 0.0}])


def downgrade() -> None:
    op.drop_table("leader_lease")
