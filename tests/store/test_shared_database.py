"""Collectors sharing one PostgreSQL database (sharded, or several behind one load balancer for
traces) write the same request rollup rows and compact the same tables: neither may lose or
double what the other wrote."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

from collector.rollup import HOUR_SECONDS
from collector.store.repository import COMPACT_LOCK, Store
from collector.traces.normalize import RequestRecord
from collector.traces.store import compact_requests, ingest, read_requests

T0 = 1_800_000_000  # a whole hour


def record(i: int, minute: int) -> RequestRecord:
    t = T0 + minute * 60 + (i % 50)
    return RequestRecord(
        i.to_bytes(16, "big"), i.to_bytes(8, "big"), t - 1, t, "gateway", "m", "chat", "tenant-a",
        100, 0, 20, 0.2, 0.02, 1.0, None, "stop", "",
    )  # fmt: skip


def total(url: str, start: int, end: int) -> int:
    store = Store(url)
    try:
        return sum(c.total for _, c in read_requests(store, start, end))
    finally:
        store.close()


def send(url: str, k: int, go: Any) -> None:
    """One collector process's ingestion: 30 batches of 20 spans over three minutes."""
    store = Store(url)
    go.wait(30)
    try:
        for batch in range(30):
            ids = [10_000 * k + 100 * batch + j for j in range(20)]
            if batch % 10 == 9:  # now and then a span sent to both (every one would serialise them)
                ids += [5_000_000 + 10 * batch + j for j in range(5)]
            ingest(store, [record(i, (i + batch) % 3) for i in ids], {})
    finally:
        store.close()


def test_two_collectors_ingesting_into_the_same_minutes_lose_no_request(pg_url: str) -> None:
    """Distinct spans of the same minutes and keys from two collector processes at once, and
    some spans that reach both (a gateway retrying against the other): each counts once."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=send, args=(pg_url, k, go)) for k in range(2)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # both have imported and connected
    go.set()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert total(pg_url, T0, T0 + 180) == 2 * 30 * 20 + 3 * 5


def test_compactions_take_turns(pg_url: str) -> None:
    """A compaction waits while another holds the compaction lock, and two at once merge the
    minutes into hours once."""
    store = Store(pg_url)
    try:
        ingest(store, [record(i, i % 120) for i in range(600)], {})
        holder = store.engine.connect()
        tx = holder.begin()
        holder.exec_driver_sql(f"SELECT pg_advisory_xact_lock({COMPACT_LOCK})")
        done = threading.Event()
        waiting = threading.Thread(target=lambda: (store.compact(T0 + 10 * HOUR_SECONDS, 3600, 90 * 86400), done.set()))
        waiting.start()
        time.sleep(1.0)
        assert not done.is_set()  # waits for the lock's holder
        tx.rollback()
        holder.close()
        waiting.join(timeout=30)
        assert done.is_set()
        others = [Store(pg_url), Store(pg_url)]
        threads = [
            threading.Thread(target=compact_requests, args=(s, T0 + 10 * HOUR_SECONDS, 3600, 90 * 86400))
            for s in others
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for s in others:
            s.close()
        hours = read_requests(store, T0, T0 + 2 * HOUR_SECONDS, period=HOUR_SECONDS)
        assert read_requests(store, T0, T0 + 2 * HOUR_SECONDS, period=60) == []
        assert sum(c.total for _, c in hours) == 600  # merged once, not twice
    finally:
        store.close()


def test_a_history_fill_holds_off_compaction_here_and_in_the_other_collectors(db_url: str) -> None:
    """While a fill reads (`Store.history_fill`) no compaction may start: not in its process, nor
    (PostgreSQL) in another collector's; one started before it is waited for by the fill."""
    store, other = Store(db_url), Store(db_url)
    shared = db_url.startswith("postgresql")
    try:
        with store.history_fill():
            with store.compaction() as free:
                assert not free
            with other.compaction() as free:
                assert free is not shared  # SQLite: one collector per database file
        for s in (store, other):
            with s.compaction() as free:
                assert free
        # a compaction under way: a fill starting meanwhile waits until it is done
        entered = threading.Event()

        def fill() -> None:
            with store.history_fill():
                entered.set()

        with store.compaction() as free:
            assert free
            filling = threading.Thread(target=fill)
            filling.start()
            time.sleep(0.5)
            assert not entered.is_set()
        filling.join(timeout=10)
        assert entered.is_set()
        with other.compaction() as free:
            assert free  # the fill's lock is given back
    finally:
        store.close()
        other.close()
