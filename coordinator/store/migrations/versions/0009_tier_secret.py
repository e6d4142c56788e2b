"""The replica tier's secret: one row holding 32 random bytes, drawn here
(the operating system's CSPRNG) when the table is created, which every
coordinator replica on the database reads (`Store.tier_secret`) to MAC its
enrolment challenges, so any replica verifies a challenge another issued.
Additive: a coordinator of the previous release ignores the table, so a
rolling update can run both versions side by side. A downgrade drops the
secret; the next upgrade draws a new one (challenges issued under the old
one are refused: clients ask again).

The admin service's read-only role `fedmask_reader` (deploy/postgres/
initdb/10-fedmask-reader.sh), which its default privileges let read every
new table, has every privilege on `tier_secret` revoked here when it exists.

Revision ID: 0009_tier_secret
Revises: 0008_round_groups
Create Date: 2026-12-20
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_tier_secret"
down_revision: str | None = "0008_round_groups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Bytes of the secret (HMAC-SHA256's block is larger; 32 is its output).
SECRET_BYTES = 32

#: The admin service's read-only role never reads the tier's secret.
REVOKE_READER = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fedmask_reader') THEN
        REVOKE ALL ON TABLE tier_secret FROM fedmask_reader;
    END IF;
END
$$
"""


def upgrade() -> None:
    table = op.create_table(
        "tier_secret",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tier_secret"),
        sa.CheckConstraint("id = 1", name="ck_tier_secret_one_row"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(REVOKE_READER)  # before the row exists
    op.bulk_insert(table, [{"id": 1, "secret": secrets.token_bytes(SECRET_BYTES)}])


def downgrade() -> None:
    op.drop_table("tier_secret")
