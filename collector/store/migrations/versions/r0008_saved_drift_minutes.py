"""The drift reference's engine minutes, saved as they settle (collector/drift/saved.py): a restart
reads them instead of a day of every target's rollups.

Revision ID: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llmslo_drift_minutes",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("start_unix", sa.BigInteger(), primary_key=True),
        sa.Column("business_type", sa.String(128), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llmslo_drift_minutes")
