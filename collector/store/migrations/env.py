"""Alembic environment: always run from `collector.store.migrate` with an open connection."""

from __future__ import annotations

from alembic import context

from collector.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
