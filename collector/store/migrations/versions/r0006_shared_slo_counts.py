"""Collectors sharing one PostgreSQL database, each scraping a shard of the targets, evaluate
the SLOs fleet-wide (collector/cluster.py): each publishes the SLO events its own commits
counted (`llmslo_slo_deltas`) and reads the others'; alert instances name the collector that owns
them (`owner`: a collector's name for the alerts of its own targets, "fleet" for the SLO and
business-type alerts the elected collector sends, "" for a collector that is not sharded).

Revision ID: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("llmslo_alerts", sa.Column("owner", sa.String(128), nullable=False, server_default=""))
    op.create_table(
        "llmslo_slo_deltas",
        sa.Column("publisher", sa.String(160), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("start_unix", sa.BigInteger(), primary_key=True),
        sa.Column("good", sa.Float(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("exact", sa.Boolean(), nullable=False),
        sa.Column("data", sa.Text(), nullable=True),
        sa.Column("published_unix", sa.Float(), nullable=False),
    )
    op.create_index("ix_llmslo_slo_deltas_published", "llmslo_slo_deltas", ["published_unix"])


def downgrade() -> None:
    op.drop_index("ix_llmslo_slo_deltas_published", "llmslo_slo_deltas")
    op.drop_table("llmslo_slo_deltas")
    with op.batch_alter_table("llmslo_alerts") as batch:  # SQLite cannot drop a column in place
        batch.drop_column("owner")
