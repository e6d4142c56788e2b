"""Round-number counter: one row holding the last round number handed out
by Store.next_round_number, so no number is ever handed out twice (also to
concurrent callers); seeded with the highest round number stored.

Revision ID: 0002_round_counter
Revises: 0001_initial
Create Date: 2025-06-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_round_counter"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    counter = op.create_table(
        "round_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_number", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_round_counter"),
    )
    highest = op.get_bind().scalar(sa.text("SELECT COALESCE(MAX(number), 0) FROM rounds"))
    op.bulk_insert(counter, [{"id": 1, "last_number": int(highest or 0)}])


def downgrade() -> None:
    op.drop_table("round_counter")
