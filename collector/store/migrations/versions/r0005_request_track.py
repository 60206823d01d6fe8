"""Request rollups keep the deployment track of their spans (`llmslo.track`, a target's `track`
label): the canary comparison's `track=` selector. Existing rows get the empty track.

Revision ID: 0005
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLE = "llmslo_request_rollups"
KEY = ["start_unix", "period_seconds", "business_type", "model", "tenant", "measured_at"]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_on_sqlite(with_track=True)
        return
    op.add_column(TABLE, sa.Column("track", sa.String(64), nullable=False, server_default=""))
    op.drop_constraint(f"{TABLE}_pkey", TABLE, type_="primary")
    op.create_primary_key(f"{TABLE}_pkey", TABLE, [*KEY, "track"])


def downgrade() -> None:
    _fold_tracks_into_untracked()
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_on_sqlite(with_track=False)
        return
    op.drop_constraint(f"{TABLE}_pkey", TABLE, type_="primary")
    op.drop_column(TABLE, "track")
    op.create_primary_key(f"{TABLE}_pkey", TABLE, KEY)


def _rebuild_on_sqlite(with_track: bool) -> None:
    """SQLite cannot change a primary key in place: copy the rows into a table with the new key."""
    new = f"{TABLE}_new"
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("start_unix", sa.BigInteger(), primary_key=True),
        sa.Column("period_seconds", sa.Integer(), primary_key=True),
        sa.Column("business_type", sa.String(128), primary_key=True),
        sa.Column("model", sa.String(512), primary_key=True),
        sa.Column("tenant", sa.String(256), primary_key=True),
        sa.Column("measured_at", sa.String(16), primary_key=True),
    ]
    if with_track:
        columns.append(sa.Column("track", sa.String(64), primary_key=True, server_default=""))
    op.create_table(new, *columns, sa.Column("data", sa.Text(), nullable=False))
    copied = ", ".join([*KEY, "data"])
    op.execute(sa.text(f"INSERT INTO {new} ({copied}) SELECT {copied} FROM {TABLE}"))
    op.drop_table(TABLE)
    op.rename_table(new, TABLE)


def _fold_tracks_into_untracked() -> None:
    """Merge every row that has a track into the row of the same key without one, so the
    downgrade loses no request (only which track it went to)."""
    from collector.traces.rollup import RequestCell

    conn = op.get_bind()
    table = sa.table(TABLE, *(sa.column(c) for c in [*KEY, "track", "data"]))
    merged: dict[tuple[object, ...], RequestCell] = {}
    for row in conn.execute(sa.select(table).where(table.c.track != "")).mappings():
        key = tuple(row[c] for c in KEY)
        cell = RequestCell.from_json(json.loads(row["data"]))
        if key in merged:
            merged[key].merge(cell)
        else:
            merged[key] = cell
    for key, cell in merged.items():
        match = [table.c[c] == v for c, v in zip(KEY, key, strict=True)]
        have = conn.execute(sa.select(table.c.data).where(*match, table.c.track == "")).scalar()
        if have is not None:
            cell.merge(RequestCell.from_json(json.loads(have)))
            conn.execute(sa.delete(table).where(*match, table.c.track == ""))
        data = json.dumps(cell.to_json(), separators=(",", ":"))
        conn.execute(sa.insert(table).values(**dict(zip(KEY, key, strict=True)), track="", data=data))
    conn.execute(sa.delete(table).where(table.c.track != ""))
