"""Schema migrations, on SQLite and PostgreSQL: a database made by the release before migrations,
with data in it, is upgraded at start-up without losing anything, and a fresh one gets exactly
the schema the code declares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, insert, inspect, text

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
        assert (key.tenant, key.track, cell.total, cell.cached_input_tokens, cell.cache_reported_input_tokens) == (
            "acme",
            "",
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


def test_the_track_revision_downgrades_without_losing_a_request(db_url: str) -> None:
    """0005 keys request rollups by track; going back to 0004 folds each tracked row into the row
    of the same minute, model and tenant without one (the counts stay, only the track goes)."""
    store = Store(db_url)
    try:
        table = metadata.tables["llmslo_request_rollups"]
        row = {"start_unix": T0, "period_seconds": 60, "business_type": "chat", "model": "m", "tenant": "acme"}
        cell = {"total": 3, "errors": 1, "finish": {"stop": 2, "error": 1}, "error_types": {"boom": 1}}
        cell |= {"in": 30, "cached": 0, "out": 9, "good": {}, "joint": 0, "sketches": {}, "in_len": [1] * 22}
        cell |= {"out_len": [0] * 22}
        with store.engine.begin() as conn:
            for track in ("", "canary", "stable"):
                conn.execute(insert(table).values(**row, measured_at="gateway", track=track, data=json.dumps(cell)))
            conn.execute(insert(table).values(**row, measured_at="engine", track="canary", data=json.dumps(cell)))
        with store.engine.begin() as conn:
            command.downgrade(migrate._config(conn), "0004")
        assert "track" not in {c["name"] for c in inspect(store.engine).get_columns("llmslo_request_rollups")}
        with store.engine.connect() as conn:
            left = {
                r.measured_at: json.loads(r.data) for r in conn.execute(text("SELECT * FROM llmslo_request_rollups"))
            }
        assert {k: (v["total"], v["errors"], v["finish"]) for k, v in left.items()} == {
            "gateway": (9, 3, {"stop": 6, "error": 3}),
            "engine": (3, 1, {"stop": 2, "error": 1}),
        }
        assert migrate.upgrade(store.engine) == ("0004", migrate.head())
        assert {k.track for k, _ in read_requests(store, T0, T0 + 60)} == {""}
    finally:
        store.close()
