"""Rollup start times as 64-bit integers: PostgreSQL's INTEGER ends in January 2038.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("llmslo_rollups", "llmslo_request_rollups")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite's INTEGER is already 64-bit
    for table in TABLES:
        op.alter_column(table, "start_unix", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table in TABLES:
        op.alter_column(table, "start_unix", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False)
