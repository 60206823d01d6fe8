"""Alert episodes kept after they resolve, and stored weekly reports.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llmslo_alert_history",
        sa.Column("fingerprint", sa.String(256), primary_key=True),
        sa.Column("starts_at_unix", sa.Float(), primary_key=True),
        sa.Column("alertname", sa.String(256), nullable=False),
        sa.Column("business_type", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(32), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("ends_at_unix", sa.Float(), nullable=True),
    )
    op.create_table(
        "llmslo_reports",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("start_unix", sa.BigInteger(), nullable=False),
        sa.Column("end_unix", sa.BigInteger(), nullable=False),
        sa.Column("created_unix", sa.Float(), nullable=False),
        sa.Column("title", sa.String(256), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("html", sa.Text(), nullable=False),
        sa.Column("markdown", sa.Text(), nullable=False),
        sa.Column("deliveries", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llmslo_reports")
    op.drop_table("llmslo_alert_history")
