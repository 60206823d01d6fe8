"""Pinned drift baselines (`llmslo drift pin`).

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llmslo_drift_baselines",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("created_unix", sa.Float(), nullable=False),
        sa.Column("start_unix", sa.BigInteger(), nullable=False),
        sa.Column("end_unix", sa.BigInteger(), nullable=False),
        sa.Column("window_seconds", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llmslo_drift_baselines")
