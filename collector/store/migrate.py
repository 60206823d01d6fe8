"""Schema migrations (Alembic, the SQLAlchemy project's tool): applied at start-up, or by
`llmslo db upgrade`. Revisions live in collector/store/migrations/versions/, the first one being
the schema of the releases before migrations existed; a database from those releases is taken
as that revision and upgraded from there."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text

from collector.store.tables import metadata

MIGRATIONS = Path(__file__).parent / "migrations"
FIRST = "0001"
# the tables revision 0001 creates (versions/r0001_initial.py)
FIRST_TABLES = (
    "llmslo_targets",
    "llmslo_series",
    "llmslo_series_state",
    "llmslo_rollups",
    "llmslo_alerts",
    "llmslo_span_keys",
    "llmslo_request_rollups",
)
ADVISORY_LOCK = 7_211_533  # PostgreSQL: one migrating collector at a time


def _config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    script = ScriptDirectory(str(MIGRATIONS))
    return str(script.get_current_head())


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the database to the newest revision. Returns (revision before, revision after)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK})
        before = MigrationContext.configure(conn).get_current_revision()
        cfg = _config(conn)
        if before is None and "llmslo_targets" in inspect(conn).get_table_names():
            # made by a release before migrations: its schema is the first revision's (plus any
            # of that revision's tables it lacked); the later revisions then run as on any database
            metadata.create_all(conn, tables=[metadata.tables[name] for name in FIRST_TABLES])
            command.stamp(cfg, FIRST)
            before = FIRST
        command.upgrade(cfg, "head")
        after = MigrationContext.configure(conn).get_current_revision()
    return before, str(after)
