"""Initial schema: devices, rounds, model_versions, privacy_ledger.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types of that time (never import orm.py here).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("local_id", sa.String(255), nullable=False),
        sa.Column("client_id", sa.String(255), nullable=True),
        sa.Column("identity_public_key", sa.LargeBinary(), nullable=False),
        sa.Column("enrolled_at", _TS, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_seen_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("identity_public_key", name="uq_devices_identity_public_key"),
    )
    op.create_table(
        "rounds",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("abort_reason", sa.String(64), nullable=True),
        sa.Column("cohort_size", sa.Integer(), nullable=False),
        sa.Column("base_model_version", sa.BigInteger(), nullable=True),
        sa.Column("survivors", _JSON, nullable=False),
        sa.Column("dropouts", _JSON, nullable=False),
        sa.Column("timings", _JSON, nullable=False),
        sa.Column("metrics", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rounds"),
        sa.UniqueConstraint("number", name="uq_rounds_number"),
    )
    op.create_index("ix_rounds_state", "rounds", ["state"])
    op.create_table(
        "model_versions",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("round_number", sa.BigInteger(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("model_name", sa.String(64), nullable=False),
        sa.Column("parameters", sa.LargeBinary(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("hyperparameters", _JSON, nullable=False),
        sa.ForeignKeyConstraint(
            ["round_number"], ["rounds.number"], name="fk_model_versions_round_number_rounds"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_model_versions"),
        sa.UniqueConstraint("round_number", name="uq_model_versions_round_number"),
    )
    op.create_index("ix_model_versions_model_name", "model_versions", ["model_name"])
    op.create_table(
        "privacy_ledger",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("round_number", sa.BigInteger(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("noise_multiplier", sa.Double(), nullable=False),
        sa.Column("sampling_rate", sa.Double(), nullable=False),
        sa.Column("cumulative_epsilon", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_number"], ["rounds.number"], name="fk_privacy_ledger_round_number_rounds"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_privacy_ledger"),
        sa.UniqueConstraint("round_number", name="uq_privacy_ledger_round_number"),
    )


def downgrade() -> None:
    op.drop_table("privacy_ledger")
    op.drop_index("ix_model_versions_model_name", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_index("ix_rounds_state", table_name="rounds")
    op.drop_table("rounds")
    op.drop_table("devices")
