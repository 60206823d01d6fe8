"""Durable, deduplicated trace ingestion: one transaction per batch, then the 2xx answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Float, cast, delete, func, or_, select, tuple_
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import OperationalError

from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS
from collector.store.repository import (
    COMPACT_LOCK,
    REQUEST_MINUTE_LOCK,
    SQLITE_BUSY_TIMEOUT_MS,
    Store,
    hold_for_transaction,
    upsert,
)
from collector.store.tables import request_rollups, span_keys
from collector.traces.normalize import RequestRecord
from collector.traces.rollup import LatencyTarget, RequestCell, RequestKey, aggregate

_write_lock = threading.Lock()  # one writer per process: dedupe checks and merges stay consistent


def span_key(r: RequestRecord) -> bytes:
    """The deduplication key: the span's end (milliseconds), then trace and span id (tables.span_keys)."""
    return _time_prefix(r.end_unix) + r.trace_id + r.span_id


def _time_prefix(unix: float) -> bytes:
    return max(0, int(unix * 1000)).to_bytes(8, "big")


def _claim(conn: Connection, keys: list[bytes]) -> list[bytes]:
    """Insert the span keys not stored yet and return them (in the order given). Plain driver SQL:
    this runs for every span, and SQLAlchemy's per-value processing of a LargeBinary would cost
    more than the lookup itself."""
    table = span_keys.name
    if conn.dialect.name == "postgresql":
        # one statement; a concurrent collector inserting the same key makes this one wait for its
        # commit and then skip the key, so the span counts once either way
        claimed = conn.exec_driver_sql(
            f"INSERT INTO {table} (id) SELECT unnest(%s::bytea[]) ON CONFLICT DO NOTHING RETURNING id", (keys,)
        )
        new = {bytes(row[0]) for row in claimed}
        return [k for k in keys if k in new]
    # SQLite: the ids already stored, then the rest inserted (one writer per process holds the lock).
    # Should another process store some of the keys between the two, the insert fails on the primary
    # key (or on a stale snapshot) and the whole transaction with it: the batch answers 503 and its
    # retry finds the keys stored.
    seen: set[bytes] = set()
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        found = conn.exec_driver_sql(f"SELECT id FROM {table} WHERE id IN ({','.join('?' * len(chunk))})", tuple(chunk))
        seen.update(bytes(row[0]) for row in found)
    fresh = [k for k in keys if k not in seen]
    # multi-row statements, not executemany: sqlite3 lets go of the GIL around every statement step,
    # and a thousand hand-overs per batch to the event loop's thread cost more than the inserts
    for i in range(0, len(fresh), 500):
        chunk = fresh[i : i + 500]
        conn.exec_driver_sql(f"INSERT INTO {table} (id) VALUES {','.join(['(?)'] * len(chunk))}", tuple(chunk))
    return fresh


Sink = Callable[[Iterable[tuple[RequestKey, RequestCell]]], None]  # told what each commit added


def ingest(
    store: Store,
    records: Sequence[RequestRecord],
    targets_of: dict[str, list[LatencyTarget]],
    sink: Sink | None = None,
) -> int:
    """Store the records not seen before (by trace id, span id and end); returns how many were new.
    When this returns, they are committed: a crash right after loses nothing. `sink` then gets the
    request cells the new records added (the SLO ledger)."""
    if not records:
        return 0
    with _write_lock:
        with store.engine.begin() as conn:
            new, cells = _ingest(conn, records, targets_of)
        if sink is not None and cells:
            sink(cells.items())
    return new


def ingest_now(
    store: Store,
    records: Sequence[RequestRecord],
    targets_of: dict[str, list[LatencyTarget]],
    sink: Sink | None = None,
) -> int | None:
    """ingest() when it can run without waiting, else None (nothing stored): for the event loop's own
    thread, which must never block on a lock. Only SQLite, whose work is local and CPU-bound, and
    only while no other writer holds this process's lock or the database's write lock. Handing a
    batch to a worker thread costs more than ingesting it: the two threads then trade the GIL."""
    if not records:
        return 0
    if store.engine.dialect.name != "sqlite" or not _write_lock.acquire(blocking=False):
        return None
    try:
        with store.engine.connect() as conn:
            sqlite = conn.connection.driver_connection  # PRAGMAs straight on sqlite3: no transaction
            assert sqlite is not None
            sqlite.execute("PRAGMA busy_timeout = 0")  # a write lock held elsewhere fails at once
            try:
                with conn.begin():
                    new, cells = _ingest(conn, records, targets_of)
                if sink is not None and cells:
                    sink(cells.items())
                return new
            except OperationalError as exc:
                if "locked" in str(exc.orig) or "busy" in str(exc.orig):
                    return None  # rolled back: the caller takes the worker thread
                raise
            finally:
                sqlite.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        _write_lock.release()


def _ingest(
    conn: Connection, records: Sequence[RequestRecord], targets_of: dict[str, list[LatencyTarget]]
) -> tuple[int, dict[RequestKey, RequestCell]]:
    """(new records, the request cells they add); the merged rows are written, `cells` untouched."""
    first: dict[bytes, RequestRecord] = {}
    for r in records:
        first.setdefault(span_key(r), r)
    keys = sorted(first)  # in time order: new keys land at the index's end, touching few pages
    fresh_keys = _claim(conn, keys)
    if not fresh_keys:
        return 0, {}
    cells = aggregate((first[k] for k in fresh_keys), targets_of)
    # collectors sharing a PostgreSQL database merge into the same minute rows: one at a time per
    # minute (in order, so two batches never wait on each other), else both read a row and the
    # second write drops the first's requests
    for minute in sorted({k.start_unix // MINUTE_SECONDS for k in cells}):
        hold_for_transaction(conn, REQUEST_MINUTE_LOCK, minute)
    existing: dict[RequestKey, RequestCell] = {}
    cell_keys = list(cells)
    for i in range(0, len(cell_keys), 200):
        key_chunk = cell_keys[i : i + 200]
        for row in conn.execute(
            select(request_rollups).where(
                request_rollups.c.period_seconds == MINUTE_SECONDS,
                tuple_(
                    request_rollups.c.start_unix,
                    request_rollups.c.business_type,
                    request_rollups.c.model,
                    request_rollups.c.tenant,
                    request_rollups.c.measured_at,
                    request_rollups.c.track,
                ).in_([tuple(k) for k in key_chunk]),
            )
        ):
            existing[
                RequestKey(row.start_unix, row.business_type, row.model, row.tenant, row.measured_at, row.track)
            ] = RequestCell.from_json(json.loads(row.data))
    rows = []
    for key, cell in cells.items():
        have = existing.get(key)
        if have is not None:
            have.merge(cell)
        rows.append(
            {
                **key._asdict(),
                "period_seconds": MINUTE_SECONDS,
                "data": json.dumps((have or cell).to_json(), separators=(",", ":")),
            }
        )
    upsert(conn, request_rollups, rows, [*RequestKey._fields, "period_seconds"], ["data"])
    return len(fresh_keys), cells


def first_request_unix(store: Store) -> int | None:
    """The start of the oldest stored request cell (None: nothing stored)."""
    with store.engine.connect() as conn:
        value = conn.execute(select(func.min(request_rollups.c.start_unix))).scalar()
    return None if value is None else int(value)


def read_requests(
    store: Store,
    start_unix: int,
    end_unix: int,
    period: int | None = None,
    tenants: Collection[str] | None = None,
) -> list[tuple[RequestKey, RequestCell]]:
    """Cells lying wholly inside [start, end): minutes, and hours after compaction (`period`: only
    minute or only hour cells; `tenants`: only these tenants' cells)."""
    cond = _wholly_inside(start_unix, end_unix, period)
    if tenants is not None:
        cond.append(request_rollups.c.tenant.in_(sorted(tenants)))
    with store.engine.connect() as conn:
        rows = conn.execute(select(request_rollups).where(*cond))
        return [
            (
                RequestKey(r.start_unix, r.business_type, r.model, r.tenant, r.measured_at, r.track),
                RequestCell.from_json(json.loads(r.data)),
            )
            for r in rows
        ]


def request_volumes(store: Store, start_unix: int, end_unix: int) -> dict[str, float]:
    """Per tenant, the requests of the cells `read_requests` would return for [start, end),
    summed by the database (the cell's JSON "total"): what choosing the busiest tenants needs,
    without reading a day of a large gateway's cells into memory."""
    data = request_rollups.c.data
    if store.engine.dialect.name == "postgresql":
        total: ColumnElement[Any] = cast(cast(data, postgresql.JSON)["total"].astext, Float)
    else:  # SQLite's JSON functions (built in since 3.38)
        total = func.json_extract(data, "$.total")
    query = (
        select(request_rollups.c.tenant, func.sum(total))
        .where(*_wholly_inside(start_unix, end_unix))
        .group_by(request_rollups.c.tenant)
    )
    with store.engine.connect() as conn:
        return {tenant: float(volume or 0.0) for tenant, volume in conn.execute(query)}


def _wholly_inside(start_unix: int, end_unix: int, period: int | None = None) -> list[ColumnElement[bool]]:
    """Conditions for the cells of `period` (or either) lying wholly inside [start, end): a
    minute cell by its start, an hour cell (after compaction) by its start and its end."""
    c = request_rollups.c
    cond = [
        c.start_unix >= start_unix,
        c.start_unix < end_unix,
        or_(c.period_seconds == MINUTE_SECONDS, c.start_unix + c.period_seconds <= end_unix),
    ]
    if period is not None:
        cond.append(c.period_seconds == period)
    return cond


def compact_requests(store: Store, now_unix: float, minute_retention: float, hour_retention: float) -> int:
    """Merge request minutes of whole hours older than the minute retention into hour rows;
    drop hour rows past their retention. Returns the minute rows compacted."""
    cutoff = int((now_unix - minute_retention) // HOUR_SECONDS) * HOUR_SECONDS
    with _write_lock, store.engine.begin() as conn:
        hold_for_transaction(conn, COMPACT_LOCK)  # another collector's compaction of the same minutes
        rows = conn.execute(
            select(request_rollups).where(
                request_rollups.c.period_seconds == MINUTE_SECONDS, request_rollups.c.start_unix < cutoff
            )
        ).all()
        hours: dict[RequestKey, RequestCell] = {}
        for r in rows:
            hour = r.start_unix // HOUR_SECONDS * HOUR_SECONDS
            key = RequestKey(hour, r.business_type, r.model, r.tenant, r.measured_at, r.track)
            cell = RequestCell.from_json(json.loads(r.data))
            if key in hours:
                hours[key].merge(cell)
            else:
                hours[key] = cell
        for key, cell in hours.items():
            have = conn.execute(
                select(request_rollups.c.data).where(
                    request_rollups.c.period_seconds == HOUR_SECONDS,
                    *(request_rollups.c[name] == value for name, value in key._asdict().items()),
                )
            ).scalar()
            if have is not None:
                cell.merge(RequestCell.from_json(json.loads(have)))
            upsert(
                conn,
                request_rollups,
                [
                    {
                        **key._asdict(),
                        "period_seconds": HOUR_SECONDS,
                        "data": json.dumps(cell.to_json(), separators=(",", ":")),
                    }
                ],
                [*RequestKey._fields, "period_seconds"],
                ["data"],
            )
        conn.execute(
            delete(request_rollups).where(
                request_rollups.c.period_seconds == MINUTE_SECONDS, request_rollups.c.start_unix < cutoff
            )
        )
        conn.execute(delete(request_rollups).where(request_rollups.c.start_unix < now_unix - hour_retention))
    return len(rows)


def expire_span_ids(store: Store, older_than_unix: float) -> int:
    """Forget the ids of spans that ended before `older_than_unix` (the deduplication horizon)."""
    with _write_lock, store.engine.begin() as conn:
        return int(conn.execute(delete(span_keys).where(span_keys.c.id < _time_prefix(older_than_unix))).rowcount or 0)
