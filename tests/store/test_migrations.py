"""Schema migrations, on SQLite and PostgreSQL: a database made by the release before migrations,
with data in it, is upgraded at start-up without losing anything, and a fresh one gets exactly
the schema the code declares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, insert, inspect

from collector.rollup import MINUTE_SECONDS
from collector.store import migrate
from collector.store.repository import Store
from collector.store.tables import metadata
from collector.traces.store import read_requests
from tests.store import previous_schema as old

T0 = 1_800_000_000 - 1_800_000_000 % MINUTE_SECONDS


def make_previous_release_database(url: str) -> None:
    engine = create_engine(url)
    old.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(old.targets).values(id=1, name="vllm-0", url="http://127.0.0.1:8000/metrics", created_unix=T0)
        )
        conn.execute(
            insert(old.series).values(
                id=1, target_id=1, model="m", metric="prompt_tokens", kind="counter", labels="[]", bounds="[]", unit=""
            )
        )
        conn.execute(insert(old.series_state).values(series_id=1, value=5000.0, sum=0.0, buckets=None))
        conn.execute(
            insert(old.rollups).values(
                series_id=1,
                period_seconds=60,
                start_unix=T0,
                value=1234.0,
                sum=0.0,
                buckets=None,
                n=0,
                observed_seconds=60.0,
                last_unix=T0 + 59,
            )
        )
        cell = {"total": 3, "errors": 0, "finish": {"stop": 3}, "error_types": {}, "in": 30, "cached": 6, "out": 9}
        cell |= {"good": {}, "joint": 0, "sketches": {}, "in_len": [0] * 40, "out_len": [0] * 40}
        conn.execute(
            insert(old.request_rollups).values(
                start_unix=T0,
                period_seconds=60,
                business_type="chat",
                model="m",
                tenant="acme",
                measured_at="gateway",
                data=json.dumps(cell),
            )
        )
    engine.dispose()


def test_a_database_of_the_previous_release_is_upgraded_with_its_data(db_url: str) -> None:
    make_previous_release_database(db_url)
    store = Store(db_url)
    try:
        assert migrate.current(store.engine) == migrate.head()
        [sc] = store.read_window(T0, T0 + 60)
        assert (sc.target, sc.ident.key.metric, sc.cell.value) == ("vllm-0", "prompt_tokens", 1234.0)
        tracker, _ids = store.load_tracker(store.ensure_target("vllm-0", "http://127.0.0.1:8000/metrics"))
        assert [c.value for c in tracker.state.values()] == [5000.0]
        [(key, cell)] = read_requests(store, T0, T0 + 60)
        assert (key.tenant, cell.total, cell.cached_input_tokens, cell.cache_reported_input_tokens) == (
            "acme",
            3,
            6,
            30,
        )
        # times past January 2038 now fit (PostgreSQL's INTEGER would refuse them)
        late = 2**31 + 600
        with store.engine.begin() as conn:
            conn.execute(
                insert(metadata.tables["llmslo_request_rollups"]).values(
                    start_unix=late,
                    period_seconds=60,
                    business_type="chat",
                    model="m",
                    tenant="t",
                    measured_at="gateway",
                    data="{}",
                )
            )
        if store.engine.dialect.name == "postgresql":
            types = {c["name"]: str(c["type"]) for c in inspect(store.engine).get_columns("llmslo_rollups")}
            assert types["start_unix"] == "BIGINT"
        # upgrading again changes nothing
        assert migrate.upgrade(store.engine) == (migrate.head(), migrate.head())
    finally:
        store.close()


def test_a_fresh_database_gets_exactly_the_declared_schema(db_url: str) -> None:
    store = Store(db_url)
    try:
        with store.engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        if store.engine.dialect.name == "sqlite":  # INTEGER and BIGINT are the same 64-bit type there
            diffs = [d for d in diffs if not (isinstance(d, list) and d[0][0] == "modify_type")]
        assert diffs == []
    finally:
        store.close()


def test_llmslo_db_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    make_previous_release_database(url)
    cfg = tmp_path / "llmslo.yaml"
    cfg.write_text(f"database_url: {url}\n")
    out = subprocess.run(
        [sys.executable, "-m", "collector.cli", "db", "upgrade", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"from {migrate.FIRST} to {migrate.head()}" in out.stdout
