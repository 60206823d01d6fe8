"""Request rollups on both databases: deduplication, windows, compaction into hours."""

from __future__ import annotations

from collector.store.repository import Store
from collector.traces.normalize import RequestRecord
from collector.traces.rollup import LatencyTarget, RequestCell, RequestKey
from collector.traces.store import compact_requests, expire_span_ids, ingest, read_requests, request_volumes
from collector.traces.summary import summarize

T0 = 1_800_000_000 - 1_800_000_000 % 3600  # an hour boundary
TARGETS = {"chat": [LatencyTarget("chat-ttft", "ttft", 1.0)]}


def rec(i: int, end: float, ttft: float = 0.5, tenant: str = "acme") -> RequestRecord:
    return RequestRecord(
        i.to_bytes(16, "big"),
        i.to_bytes(8, "big"),
        end - 2,
        end,
        "gateway",
        "m",
        "chat",
        tenant,
        100,
        40,
        10,
        ttft,
        0.02,
        2.0,
        None,
        "stop",
        "",
    )


def test_duplicates_within_and_across_batches_count_once(store: Store) -> None:
    batch = [rec(1, T0 + 10), rec(2, T0 + 20), rec(1, T0 + 10)]
    assert ingest(store, batch, TARGETS) == 2
    assert ingest(store, batch, TARGETS) == 0
    s = summarize(read_requests(store, T0, T0 + 60))
    assert s.requests == 2 and s.input_tokens == 200 and s.cache_hit_ratio == 0.4
    assert s.good_ratio == {"chat-ttft": 1.0}


def test_compaction_into_hours_keeps_totals_and_percentiles(store: Store) -> None:
    records = [rec(i, T0 + i * 3.0, ttft=0.1 + (i % 50) / 100, tenant=("a", "b")[i % 2]) for i in range(2400)]
    for i in range(0, len(records), 500):
        ingest(store, records[i : i + 500], TARGETS)
    end = T0 + 2 * 3600
    before = summarize(read_requests(store, T0, end))
    assert before.requests == 2400
    compacted = compact_requests(store, now_unix=end + 3600, minute_retention=3600, hour_retention=86400 * 30)
    assert compacted > 0
    after = summarize(read_requests(store, T0, end))
    assert after.requests == before.requests and after.tenants == before.tenants
    assert after.latencies["ttft"].quantiles == before.latencies["ttft"].quantiles
    assert after.good_ratio == before.good_ratio
    # an hour row counts only in windows that hold the whole hour
    assert summarize(read_requests(store, T0 + 1800, end)).requests == 1200


def volumes_of(rows: list[tuple[RequestKey, RequestCell]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, cell in rows:
        out[key.tenant] = out.get(key.tenant, 0.0) + cell.total
    return out


def test_request_volumes_are_the_cells_read_requests_returns_summed_by_the_database(store: Store) -> None:
    """Drift chooses its busiest tenants from `request_volumes` (the database sums each cell's
    JSON total, on SQLite and PostgreSQL) and then reads only their cells: both follow the rule
    of `read_requests`, minutes and compacted hours alike, and a tenant filter leaves the rest."""
    tenants = ("tiny", "small", "mid", "big")  # big: four in seven
    records = [rec(i, T0 + i * 2.0, tenant=tenants[min(3, i % 7)]) for i in range(5400)]  # three hours
    for i in range(0, len(records), 600):
        ingest(store, records[i : i + 600], TARGETS)
    compact_requests(store, now_unix=T0 + 2 * 3600 + 60, minute_retention=3600, hour_retention=86400 * 30)
    assert read_requests(store, T0, T0 + 3600, period=3600), "the first hour is compacted"
    ranges = ((T0, T0 + 3 * 3600), (T0 + 1800, T0 + 3 * 3600), (T0, T0 + 5400), (T0 + 600, T0 + 660), (T0, T0 + 1800))
    for lo, hi in ranges:
        rows = read_requests(store, lo, hi)
        expected = volumes_of(rows)
        assert request_volumes(store, lo, hi) == expected, (lo - T0, hi - T0)
        chosen = read_requests(store, lo, hi, tenants={"big", "tiny", "nobody"})
        assert {key.tenant for key, _ in chosen} <= {"big", "tiny"}
        assert volumes_of(chosen) == {t: v for t, v in expected.items() if t in ("big", "tiny")}
    whole = request_volumes(store, T0, T0 + 3 * 3600)
    assert sum(whole.values()) == 5400 and whole["big"] > whole["tiny"] > 0
    # half of the compacted hour is outside: its hour cell is, but the later minutes are not
    assert sum(request_volumes(store, T0 + 1800, T0 + 3 * 3600).values()) == 3600
    assert request_volumes(store, T0 + 4 * 3600, T0 + 5 * 3600) == {}
    assert request_volumes(store, T0, T0 + 1800) == {}  # its minutes are in an hour cell that ends later


def test_span_ids_expire_by_the_end_of_their_span(store: Store) -> None:
    old, new = rec(1, T0 + 10), rec(2, T0 + 7200)
    assert ingest(store, [old, new], TARGETS) == 2
    assert expire_span_ids(store, older_than_unix=T0 + 3600) == 1
    # the expired id is forgotten (a retry that late counts again); the recent one still deduplicates
    assert ingest(store, [old, new], TARGETS) == 1
    assert summarize(read_requests(store, T0, T0 + 7260)).requests == 3


def test_two_collectors_sharing_a_database_count_a_span_once(db_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two writers (as two collector processes: separate engines, no shared lock) ingest the same
    batch at once. PostgreSQL: the later insert waits and skips the keys. SQLite: the later
    transaction may be refused (the client would get 503 and retry); its retry finds them stored."""
    import contextlib
    import threading

    from sqlalchemy.exc import IntegrityError, OperationalError

    import collector.traces.store as store_module

    monkeypatch.setattr(store_module, "_write_lock", contextlib.nullcontext())
    batch = [rec(i, T0 + 10 + i * 0.01) for i in range(2000)]
    stores = [Store(db_url), Store(db_url)]
    Store(db_url).close()  # tables exist before both start
    barrier = threading.Barrier(2)
    counted: list[int] = []

    def writer(s: Store) -> None:
        barrier.wait()
        for _attempt in range(5):
            try:
                counted.append(ingest(s, batch, TARGETS))
                return
            except (IntegrityError, OperationalError):  # SQLite: the other writer got there first
                continue

    threads = [threading.Thread(target=writer, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(counted) == 2 and sum(counted) == 2000, counted
    assert summarize(read_requests(stores[0], T0, T0 + 120)).requests == 2000
    for s in stores:
        s.close()


def test_ingest_now_never_waits_for_another_writer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlite3
    import threading
    import time

    import collector.traces.store as store_module
    from collector.traces.store import ingest_now

    store = Store(f"sqlite:///{tmp_path / 'llmslo.db'}")
    batch = [rec(i, T0 + 10) for i in range(10)]
    with store_module._write_lock:  # this process's other writer (compaction, expiry, a worker thread)
        assert ingest_now(store, batch, TARGETS) is None
    other = sqlite3.connect(tmp_path / "llmslo.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    started = time.perf_counter()
    assert ingest_now(store, batch, TARGETS) is None
    assert time.perf_counter() - started < 1.0  # refused at once, not after the 30 s busy timeout
    other.execute("ROLLBACK")
    assert summarize(read_requests(store, T0, T0 + 60)).requests == 0  # nothing half-stored
    assert ingest_now(store, batch, TARGETS) == 10
    assert ingest_now(store, batch, TARGETS) == 0
    # the connection's busy timeout is back: a plain ingest waits for a short transaction elsewhere
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: other.execute("ROLLBACK")).start()
    assert ingest(store, [rec(99, T0 + 20)], TARGETS) == 1
    other.close()
    store.close()
    # PostgreSQL is never ingested on the event loop's thread (network round trips)


def test_the_retired_span_id_table_of_older_versions_is_dropped(db_url: str) -> None:
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE llmslo_span_ids (trace_id VARCHAR(32), span_id VARCHAR(16))"))
    engine.dispose()
    store = Store(db_url)
    tables = inspect(store.engine).get_table_names()
    assert "llmslo_span_ids" not in tables and "llmslo_span_keys" in tables
    store.close()
