"""The SLO ledger's counts, saved as minutes and hours close (collector/slo/saved.py): a restart
reads them instead of re-counting every stored rollup of the SLO period.

Revision ID: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llmslo_slo_counts",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("period_seconds", sa.Integer(), primary_key=True),
        sa.Column("start_unix", sa.BigInteger(), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("good", sa.Float(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("data", sa.Text(), nullable=True),
    )
    op.create_table(
        "llmslo_slo_count_keys",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("exact", sa.Boolean(), nullable=False),
        sa.Column("through_unix", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llmslo_slo_count_keys")
    op.drop_table("llmslo_slo_counts")
