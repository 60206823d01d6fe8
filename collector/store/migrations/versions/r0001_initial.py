"""The schema of the first releases (before migrations existed), frozen here.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "llmslo_targets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("baseline_unix", sa.Float, nullable=True),
        sa.Column("process_start_unix", sa.Float, nullable=True),
        sa.Column("created_unix", sa.Float, nullable=False),
    )
    op.create_table(
        "llmslo_series",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("target_id", sa.Integer, sa.ForeignKey("llmslo_targets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("model", sa.String(512), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("bounds", sa.Text, nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.UniqueConstraint("target_id", "model", "metric", "kind", "labels", "bounds", name="uq_llmslo_series"),
    )
    op.create_table(
        "llmslo_series_state",
        sa.Column("series_id", sa.Integer, sa.ForeignKey("llmslo_series.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("sum", sa.Float, nullable=False),
        sa.Column("buckets", sa.Text, nullable=True),
    )
    op.create_table(
        "llmslo_rollups",
        sa.Column("series_id", sa.Integer, sa.ForeignKey("llmslo_series.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("period_seconds", sa.Integer, primary_key=True),
        sa.Column("start_unix", sa.Integer, primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("sum", sa.Float, nullable=False),
        sa.Column("buckets", sa.Text, nullable=True),
        sa.Column("gmin", sa.Float, nullable=True),
        sa.Column("gmax", sa.Float, nullable=True),
        sa.Column("glast", sa.Float, nullable=True),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("observed_seconds", sa.Float, nullable=False),
        sa.Column("last_unix", sa.Float, nullable=False),
    )
    op.create_index("ix_llmslo_rollups_window", "llmslo_rollups", ["period_seconds", "start_unix"])
    op.create_table(
        "llmslo_alerts",
        sa.Column("fingerprint", sa.String(256), primary_key=True),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("annotations", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("active_since_unix", sa.Float, nullable=False),
        sa.Column("starts_at_unix", sa.Float, nullable=True),
        sa.Column("ends_at_unix", sa.Float, nullable=True),
        sa.Column("updated_unix", sa.Float, nullable=False),
        sa.Column("sent_unix", sa.Float, nullable=True),
        sa.Column("delivered_state", sa.String(16), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_unix", sa.Float, nullable=False),
    )
    op.create_table("llmslo_span_keys", sa.Column("id", sa.LargeBinary(32), primary_key=True), sqlite_with_rowid=False)
    op.create_table(
        "llmslo_request_rollups",
        sa.Column("start_unix", sa.Integer, primary_key=True),
        sa.Column("period_seconds", sa.Integer, primary_key=True),
        sa.Column("business_type", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(512), primary_key=True),
        sa.Column("tenant", sa.String(256), primary_key=True),
        sa.Column("measured_at", sa.String(16), primary_key=True),
        sa.Column("data", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "llmslo_request_rollups",
        "llmslo_span_keys",
        "llmslo_alerts",
        "llmslo_rollups",
        "llmslo_series_state",
        "llmslo_series",
        "llmslo_targets",
    ):
        op.drop_table(table)
