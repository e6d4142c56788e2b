"""Rounds run in groups by the replica tier: each such round's plan (written
by its leader), one row per group (the replica and membership term running
it, its state and what its replica last saved) and each done group's
unmasked sum while the round runs (deleted when the round is sealed).
Additive: a coordinator of the previous release ignores the tables, so a
rolling update can run both versions side by side.

The group sums are what the server learns of each group (D34/D87/D99); the
admin service's read-only role `fedmask_reader` (deploy/postgres/initdb/
10-fedmask-reader.sh), which its default privileges let read every new
table, has SELECT on `round_group_sums` revoked here when it exists.

Revision ID: 0008_round_groups
Revises: 0007_replica_streams
Create Date: 2026-12-16
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008_round_groups"
down_revision: str | None = "0007_replica_streams"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The admin service's read-only role never reads the group sums.
REVOKE_READER = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fedmask_reader') THEN
        REVOKE ALL ON TABLE round_group_sums FROM fedmask_reader;
    END IF;
END
$$
"""


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "round_plans",
        sa.Column("round_number", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("lease_token", sa.BigInteger(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("model_version", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("hyperparameters", _json(), nullable=False),
        sa.Column("metric_names", _json(), nullable=False),
        sa.Column("cohort_size", sa.Integer(), nullable=False),
        sa.Column("minimum", sa.Integer(), nullable=False),
        sa.Column("rotation_key", sa.LargeBinary(), nullable=False),
        sa.Column("deadlines", _json(), nullable=False),
        sa.Column("task_deadlines", _json(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("devices_left_out", sa.Integer(), nullable=False),
        sa.Column("left_out", _json(), nullable=False),
        sa.Column("new_model_version", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("round_number", name="pk_round_plans"),
        sa.ForeignKeyConstraint(["round_number"], ["rounds.number"], name="fk_round_plans_round_number_rounds"),
    )
    op.create_table(
        "round_groups",
        sa.Column("round_number", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("group_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("replica", sa.String(255), nullable=False),
        sa.Column("replica_token", sa.BigInteger(), nullable=False),
        sa.Column("members", _json(), nullable=False),
        sa.Column("secagg_settings", sa.LargeBinary(), nullable=False),
        sa.Column("session_id", sa.LargeBinary(), nullable=False),
        sa.Column("dp_settings", sa.LargeBinary(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lost_in", sa.String(16), nullable=True),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("asked", _json(), nullable=True),
        sa.Column("survivors", _json(), nullable=False),
        sa.Column("dropouts", _json(), nullable=False),
        sa.Column("timings", _json(), nullable=False),
        sa.Column("completion", _json(), nullable=False),
        sa.Column("counted", _json(), nullable=True),
        sa.Column("share_reports", _json(), nullable=False),
        sa.Column("share_check_survivors", _json(), nullable=False),
        sa.Column("fail_reason", sa.String(64), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("round_number", "group_index", name="pk_round_groups"),
        sa.ForeignKeyConstraint(["round_number"], ["round_plans.round_number"],
                                name="fk_round_groups_round_number_round_plans"),
    )
    op.create_table(
        "round_group_sums",
        sa.Column("round_number", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("group_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("encoded_sum", sa.LargeBinary(), nullable=False),
        sa.Column("metric_limbs", sa.LargeBinary(), nullable=False),
        sa.Column("vector_length", sa.Integer(), nullable=False),
        sa.Column("metric_coordinates", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("round_number", "group_index", name="pk_round_group_sums"),
        sa.ForeignKeyConstraint(["round_number", "group_index"],
                                ["round_groups.round_number", "round_groups.group_index"],
                                name="fk_round_group_sums_group"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(REVOKE_READER)


def downgrade() -> None:
    op.drop_table("round_group_sums")
    op.drop_table("round_groups")
    op.drop_table("round_plans")
