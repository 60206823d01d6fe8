"""Durable rollups: commit a scrape atomically, read windows back, compact and expire.

Works on SQLite (the embedded default) and PostgreSQL (`postgresql+psycopg://...`). A scrape's
cells, the series' new cumulative state and the target's baseline are written in one
transaction, so a collector restart resumes exactly where the last committed scrape left off.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, create_engine, delete, distinct, event, func, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from collector.rollup import (
    HOUR_SECONDS,
    MINUTE_SECONDS,
    Cell,
    Cumulative,
    DeltaTracker,
    Row,
    ScrapeDeltas,
    SeriesCell,
    SeriesIdent,
)
from collector.secrets import redact_url
from collector.sources.vllm import Kind, SeriesKey
from collector.store import migrate
from collector.store.tables import rollups, series, series_state, targets

log = logging.getLogger(__name__)

# Tables earlier versions made and nothing reads any more: dropped at start-up.
RETIRED_TABLES = ("llmslo_span_ids",)  # trace dedupe ids, replaced by llmslo_span_keys
SQLITE_BUSY_TIMEOUT_MS = 30_000  # how long a SQLite writer waits for another's transaction


def make_engine(url: str) -> Engine:
    """Create the engine; for SQLite, create the directory and use WAL so readers never block."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def _encode_floats(values: Sequence[float] | None) -> str | None:
    """JSON text of a float list. Bucket counts are finite: their JSON is each float's repr, joined
    as json.dumps joins them (a commit encodes every histogram's buckets twice, and the generic
    encoder was a fifth of a commit's CPU); a NaN or infinity takes json.dumps' spelling."""
    if values is None:
        return None
    try:
        text = "[" + ", ".join(map(float.__repr__, values)) + "]"
    except TypeError:  # not all floats (an int from an older caller): the generic encoder
        return json.dumps(list(values))
    if "n" in text:  # nan, inf: JSON spells them NaN, Infinity
        return json.dumps(list(values))
    return text


def _decode_floats(text: str | None) -> list[float] | None:
    """The floats of `_encode_floats`' text, a JSON list of numbers: parsed by orjson (eight
    times faster than float() over the split text; once per stored histogram read, most of a long
    read's CPU), each item made a float (an older writer's integers). A NaN or an infinity,
    which strict JSON has no spelling for, falls back to float() of each item, which reads
    json.dumps' NaN and Infinity."""
    if text is None:
        return None
    try:
        return list(map(float, orjson.loads(text)))
    except orjson.JSONDecodeError:
        inner = text.strip()[1:-1]
        return list(map(float, inner.split(","))) if inner.strip() else []


def _none_to_nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


class Store:
    """All database access of the collector. Methods are synchronous; call them off the event loop."""

    def __init__(self, url: str, wait_seconds: float = 0.0) -> None:
        """Connect and create the schema. `wait_seconds`: how long to keep retrying a database that
        does not answer yet (PostgreSQL starting beside llmslo), with a log line per attempt."""
        self.url = url
        self.engine = make_engine(url)
        deadline = time.monotonic() + wait_seconds
        delay = 1.0
        while True:
            try:
                migrate.upgrade(self.engine)
                break
            except OperationalError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "database %s not reachable (%s); retrying in %.0f s",
                    redact_url(url),
                    str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__,
                    delay,
                )
                time.sleep(delay)
                delay = min(30.0, delay * 2)
        with self.engine.begin() as conn:
            for table in RETIRED_TABLES:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        # series id -> (target name, identity, unit), kept across reads: a series row is never
        # changed or deleted, nor a target renamed; decoding labels and bounds, and selecting
        # these columns with every row, were most of a one-minute read at a thousand targets
        self._series: dict[int, tuple[str, SeriesIdent, str]] = {}
        # the fills reading history in two passes that compaction must not come between
        # (`history_fill`, `compaction`): how many run in this process, and the lock both take
        self._fills = 0
        self._fill_lock = threading.Lock()

    @contextmanager
    def history_fill(self) -> Iterator[None]:
        """Hold compaction off while a reader counts a stretch of history in two passes, its hour
        cells and then its minutes (the SLO ledger's fill): a compaction between them would merge
        an hour of minutes into an hour cell behind the first pass and out of the second's reach.
        Waits for a compaction running in this process; on PostgreSQL also holds off the other
        collectors' (a shared advisory lock for the fill's length, on a connection of its own)."""
        with self._fill_lock:
            self._fills += 1
        conn = None
        try:
            if self.engine.dialect.name == "postgresql":
                conn = self.engine.connect()
                conn.execute(text("SELECT pg_advisory_lock_shared(:k)"), {"k": FILL_LOCK})
                conn.commit()
            yield
        finally:
            with self._fill_lock:
                self._fills -= 1
            if conn is not None:
                try:
                    conn.execute(text("SELECT pg_advisory_unlock_shared(:k)"), {"k": FILL_LOCK})
                    conn.commit()
                finally:
                    conn.close()

    @contextmanager
    def compaction(self) -> Iterator[bool]:
        """Whether a compaction may run now (no `history_fill` under way, here or, on PostgreSQL,
        in another collector), held for the `with` block: a fill that starts meanwhile waits for
        it. A compaction put off runs at the next interval; the minutes wait in the store."""
        with self._fill_lock:
            if self._fills:
                yield False
                return
            if self.engine.dialect.name != "postgresql":
                yield True
                return
            with self.engine.connect() as conn:
                free = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": FILL_LOCK}).scalar())
                conn.commit()
                try:
                    yield free
                finally:
                    if free:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": FILL_LOCK})
                        conn.commit()

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(select(1))

    # --- targets and series identity ---------------------------------------------------------

    def ensure_target(self, name: str, url: str) -> int:
        with self.engine.begin() as conn:
            row = conn.execute(select(targets.c.id, targets.c.url).where(targets.c.name == name)).first()
            if row is not None:
                if row.url != url:
                    conn.execute(update(targets).where(targets.c.id == row.id).values(url=url))
                return int(row.id)
            result = conn.execute(insert(targets).values(name=name, url=url, created_unix=time.time()))
            pk = result.inserted_primary_key
            assert pk is not None
            return int(pk[0])

    def load_tracker(self, target_id: int) -> tuple[DeltaTracker, dict[SeriesIdent, int]]:
        """The target's delta state as of its last committed scrape, and its series ids."""
        with self.engine.connect() as conn:
            baseline, process_start = conn.execute(
                select(targets.c.baseline_unix, targets.c.process_start_unix).where(targets.c.id == target_id)
            ).one()
            rows = conn.execute(
                select(series, series_state.c.value, series_state.c.sum, series_state.c.buckets)
                .select_from(series.outerjoin(series_state, series_state.c.series_id == series.c.id))
                .where(series.c.target_id == target_id)
            ).all()
        tracker = DeltaTracker(baseline_unix=baseline, process_start_unix=process_start)
        ids: dict[SeriesIdent, int] = {}
        for row in rows:
            ident = _ident_from_row(row)
            ids[ident] = int(row.id)
            if row.value is not None:
                tracker.state[ident] = Cumulative(float(row.value), float(row.sum), _decode_floats(row.buckets))
        return tracker, ids

    # --- writing a scrape --------------------------------------------------------------------

    def commit_scrape(
        self,
        target_id: int,
        deltas: ScrapeDeltas,
        units: dict[SeriesKey, str],
        series_ids: dict[SeriesIdent, int],
        now_unix: float,
    ) -> None:
        """Commit one scrape on its own (see `commit_scrapes`), reading its minute rows back."""
        self.commit_scrapes([ScrapeCommit(target_id, deltas, units, series_ids, now_unix)])

    def commit_scrapes(self, batch: Sequence[ScrapeCommit]) -> None:
        """Add each scrape's cells to their minute rows and store the new state, all in one
        transaction (a group commit: many targets' scrapes share one fsync).

        A scrape with an `OpenMinute` whose rows are known (see there) is merged in memory; the
        others read their minute rows first. Callers' caches (`series_ids`, `OpenMinute`) change
        only after the commit succeeded (`adopt`)."""
        with self.engine.begin() as conn:
            for item in batch:
                item.new_ids = self._create_series(conn, item.target_id, item.deltas.cells, item.units, item.series_ids)
            unknown: dict[int, dict[int, Cell]] = {}  # minute -> series whose stored row must be read
            rows: list[tuple[Any, ...]] = []
            state_rows: list[tuple[Any, ...]] = []
            for item in batch:
                ids = {**item.series_ids, **item.new_ids}
                minute = item.deltas.minute
                # what earlier scrapes of the target counted in memory only (collector/sources/scrape.py)
                rows.extend(_rollup_params(sid, MINUTE_SECONDS, m, c) for m, sid, c in item.carry_rows)
                if merge_in_memory(item, ids):
                    assert item.merged is not None
                    rows.extend(_rollup_params(sid, MINUTE_SECONDS, minute, c) for sid, c in item.merged.items())
                else:
                    item.read_stored = True
                    unknown.setdefault(minute, {}).update({ids[i]: cell for i, cell in item.deltas.cells.items()})
                state_rows.extend(
                    (ids[ident], c.value, c.sum, _encode_floats(c.buckets))
                    for ident, c in itertools.chain(item.carry_state.items(), item.deltas.state.items())
                )
            read_back: dict[int, Cell] = {}
            for minute, by_id in unknown.items():
                read_back.update(self._merge_cells(conn, MINUTE_SECONDS, minute, by_id))
            for item in batch:
                if item.merged is None:
                    ids = {**item.series_ids, **item.new_ids}
                    item.merged = {ids[ident]: read_back[ids[ident]] for ident in item.deltas.cells}
            upsert_rollups(conn, rows)
            upsert_params(conn, series_state.name, STATE_COLUMNS, state_rows, ["series_id"], STATE_COLUMNS[1:])
            # each target's new baseline (and process start, when the scrape gave one) in one
            # executemany: built per target through SQLAlchemy it cost more than the upserts
            conn.exec_driver_sql(
                _baseline_sql(conn.dialect.paramstyle),
                [(item.now_unix, item.process_start_unix, item.target_id) for item in batch],
            )
        for item in batch:
            item.adopt()

    def _create_series(
        self,
        conn: Connection,
        target_id: int,
        cells: dict[SeriesIdent, Cell],
        units: dict[SeriesKey, str],
        known: dict[SeriesIdent, int],
    ) -> dict[SeriesIdent, int]:
        """Ids of the scrape's series the caller does not know yet: two selects and one
        multi-row insert however many there are (a first scrape of a many-model server)."""
        missing = {_ident_key(ident): ident for ident in cells if ident not in known}
        if not missing:
            return {}
        columns = (series.c.id, series.c.model, series.c.metric, series.c.kind, series.c.labels, series.c.bounds)

        def stored() -> dict[tuple[str, ...], int]:
            rows = conn.execute(select(*columns).where(series.c.target_id == target_id))
            return {(r.model, r.metric, r.kind, r.labels, r.bounds): int(r.id) for r in rows}

        have = stored()
        new = [
            {"target_id": target_id, "unit": units.get(ident.key, ""), **_ident_to_row(ident)}
            for key, ident in missing.items()
            if key not in have
        ]
        if new:
            conn.execute(insert(series), new)
            have = stored()
        return {ident: have[key] for key, ident in missing.items()}

    def _merge_cells(self, conn: Connection, period: int, start: int, by_id: dict[int, Cell]) -> dict[int, Cell]:
        """Add `by_id` to the stored rows of one period (read, merge, upsert); returns the merged cells."""
        if not by_id:
            return {}
        merged: dict[int, Cell] = {}
        ids = list(by_id)
        for chunk in _chunks(ids, 500):
            for row in conn.execute(
                select(rollups).where(
                    rollups.c.period_seconds == period,
                    rollups.c.start_unix == start,
                    rollups.c.series_id.in_(chunk),
                )
            ):
                merged[int(row.series_id)] = _cell_from_row(row, by_id[int(row.series_id)].kind)
        rows = []
        for sid, cell in by_id.items():
            merged[sid] = have = _merged(merged.get(sid), cell)
            rows.append(_rollup_params(sid, period, start, have))
        upsert_rollups(conn, rows)
        return merged

    # --- reading windows ---------------------------------------------------------------------

    def read_window(
        self,
        start_unix: int,
        end_unix: int,
        target: str | None = None,
        model: str | None = None,
        targets_in: Collection[str] | None = None,
    ) -> list[SeriesCell]:
        """Merge every cell lying wholly inside [start_unix, end_unix) per series.

        Hour cells count only when the whole hour is inside the window (after compaction the
        minutes they came from are gone, so nothing is counted twice). `targets_in`: only these
        targets' (a sharded collector's own, collector/cluster.py).
        """
        return merge_window(
            self.read_rows(start_unix, end_unix, target=target, model=model, targets_in=targets_in), end_unix
        )

    def read_minute(self, start_unix: int, targets_in: Collection[str] | None = None) -> list[SeriesCell]:
        """The stored cells of the minute starting at `start_unix`, one per series (what
        `read_window` of that minute returns, in another order; no merge): what the running
        windows read once a minute per window (collector/analytics/running.py)."""
        rows = self.read_rows(start_unix, start_unix + 1, period=MINUTE_SECONDS, targets_in=targets_in)
        return [r.cell for r in rows]

    def read_rows(
        self,
        start_unix: int,
        end_unix: int,
        metrics: Iterable[str] | None = None,
        target: str | None = None,
        model: str | None = None,
        period: int | None = None,
        targets_in: Collection[str] | None = None,
    ) -> list[Row]:
        """Every stored cell with start in [start_unix, end_unix), unmerged (for evaluators that
        need several windows, or time slices, from one read); `period`: minute or hour cells only.

        The rollup columns alone are read, by position; each series' target, identity and unit
        come from memory (read once per series, `_learn_series`): at a thousand targets a
        minute's read is ~2.5x faster than selecting the series and target columns with every
        row, whose row objects and attribute reads were most of the cost."""
        cond = _in_time_range(start_unix, end_unix, period)
        if target is not None or targets_in is not None or model is not None or metrics is not None:
            chosen = select(series.c.id)
            if target is not None or targets_in is not None:
                chosen = chosen.join(targets, targets.c.id == series.c.target_id)
            if metrics is not None:
                chosen = chosen.where(series.c.metric.in_(sorted(set(metrics))))
            if target is not None:
                chosen = chosen.where(targets.c.name == target)
            if targets_in is not None:
                chosen = chosen.where(targets.c.name.in_(sorted(targets_in)))
            if model is not None:
                chosen = chosen.where(series.c.model == model)
            cond.append(rollups.c.series_id.in_(chosen))
        known = self._series
        with self.engine.connect() as conn:
            rows = conn.execute(select(*READ_COLUMNS).where(*cond)).all()
            missing = [r[0] for r in rows if r[0] not in known]
            if missing:
                self._learn_series(conn, min(missing), max(missing))
        out: list[Row] = []
        append, decode, nan = out.append, _decode_floats, math.nan
        for sid, seconds, start, value, total, buckets, gmin, gmax, glast, n, observed, last in rows:
            name, ident, unit = known[sid]
            # `_cell_of` written out: this loop runs once per stored cell a reader asks for
            cell = Cell(
                ident.kind,
                float(value),
                float(total),
                None if buckets is None else decode(buckets),
                nan if gmin is None else float(gmin),
                nan if gmax is None else float(gmax),
                nan if glast is None else float(glast),
                int(n),
                float(observed),
                float(last),
            )
            append(Row(int(start), int(seconds), SeriesCell(name, ident, unit, cell)))
        return out

    def _learn_series(self, conn: Connection, lo: int, hi: int) -> None:
        """Keep the target, identity and unit of the series with ids in [lo, hi] (series ids
        grow: after the first read, those of the targets and series that appeared since)."""
        query = (
            select(series, targets.c.name.label("target_name"))
            .join(targets, targets.c.id == series.c.target_id)
            .where(series.c.id >= lo, series.c.id <= hi)
        )
        known = self._series
        for row in conn.execute(query):
            if row.id not in known:
                known[int(row.id)] = (row.target_name, _ident_from_row(row), row.unit)

    def series_count(self) -> int:
        """How many series are stored (every target's, every period)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(series)).scalar() or 0)

    def first_unix(self) -> int | None:
        """The start of the oldest stored engine cell (None: nothing stored)."""
        with self.engine.connect() as conn:  # per period: each is the first entry of its index range
            firsts = [
                conn.execute(select(func.min(rollups.c.start_unix)).where(rollups.c.period_seconds == p)).scalar()
                for p in PERIODS
            ]
        return min((int(v) for v in firsts if v is not None), default=None)

    def coverage(self, start_unix: int, end_unix: int, intervals: dict[str, float] | None = None) -> dict[str, float]:
        """Per target, the seconds of [start, end) that hold any stored cell: a minute with a good
        scrape counts the target's scrape interval (one minute in five holds a 5m scrape), a
        compacted hour counts whole. The rest are gaps (target down, collector not running); after
        compaction, gaps shorter than an hour no longer show."""
        query = (
            select(targets.c.name, rollups.c.period_seconds, func.count(distinct(rollups.c.start_unix)))
            .select_from(
                rollups.join(series, series.c.id == rollups.c.series_id).join(
                    targets, targets.c.id == series.c.target_id
                )
            )
            .where(*_in_time_range(start_unix, end_unix))
            .group_by(targets.c.name, rollups.c.period_seconds)
        )
        out: dict[str, float] = {}
        with self.engine.connect() as conn:
            for name, period, n in conn.execute(query):
                step = float(period) if period != MINUTE_SECONDS else max(60.0, (intervals or {}).get(name, 60.0))
                out[name] = out.get(name, 0.0) + step * int(n)
        return out

    def target_names(self) -> list[str]:
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(select(targets.c.name).order_by(targets.c.name))]

    def count_rollups(self, period: int | None = None) -> int:
        query = select(rollups.c.series_id)
        if period is not None:
            query = query.where(rollups.c.period_seconds == period)
        with self.engine.connect() as conn:
            return len(conn.execute(query).all())

    # --- compaction and retention ------------------------------------------------------------

    def compact(
        self, now_unix: float, minute_retention_seconds: float, hour_retention_seconds: float
    ) -> tuple[int, int]:
        """Merge minute cells of whole hours older than the minute retention into hour cells,
        then drop hour cells past their retention. Returns (minutes compacted, hours expired)."""
        cutoff = int((now_unix - minute_retention_seconds) // HOUR_SECONDS) * HOUR_SECONDS
        expire = int(now_unix - hour_retention_seconds)
        with self.engine.begin() as conn:
            hold_for_transaction(conn, COMPACT_LOCK)  # the read below then sees another's compaction
            rows = conn.execute(
                select(rollups, series.c.kind)
                .select_from(rollups.join(series, series.c.id == rollups.c.series_id))
                .where(rollups.c.period_seconds == MINUTE_SECONDS, rollups.c.start_unix < cutoff)
                .order_by(rollups.c.start_unix)
            ).all()
            hours: dict[tuple[int, int], Cell] = {}
            for row in rows:
                key = (int(row.series_id), int(row.start_unix) // HOUR_SECONDS * HOUR_SECONDS)
                cell = _cell_from_row(row, Kind(row.kind))
                if key in hours:
                    hours[key].merge(cell)
                else:
                    hours[key] = cell
            by_hour: dict[int, dict[int, Cell]] = {}
            for (sid, hour), cell in hours.items():
                by_hour.setdefault(hour, {})[sid] = cell
            for hour, cells in by_hour.items():
                self._merge_cells(conn, HOUR_SECONDS, hour, cells)
            conn.execute(
                delete(rollups).where(rollups.c.period_seconds == MINUTE_SECONDS, rollups.c.start_unix < cutoff)
            )
            expired = conn.execute(
                delete(rollups).where(rollups.c.period_seconds == HOUR_SECONDS, rollups.c.start_unix < expire)
            )
        return len(rows), int(expired.rowcount or 0)


PERIODS = (MINUTE_SECONDS, HOUR_SECONDS)  # the only periods rollups are stored at

# PostgreSQL advisory lock keys of collectors sharing one database (the migrations take 7_211_533,
# the elected evaluator of sharded collectors 7_211_534: collector/cluster.py)
COMPACT_LOCK = 7_211_535  # one compaction at a time: two would both merge the same minutes into hours
REQUEST_MINUTE_LOCK = 7_211_536  # with a minute: one read-merge-write of its request rollups at a time
FILL_LOCK = 7_211_537  # shared by the history fills, taken (tried) by compaction: `Store.history_fill`


def hold_for_transaction(conn: Connection, key: int, sub: int | None = None) -> None:
    """On PostgreSQL, wait for and hold advisory lock `key` (or the pair (key, sub)) until the
    transaction ends, so collectors sharing the database take turns. SQLite has one writer at a
    time already."""
    if conn.dialect.name != "postgresql":
        return
    if sub is None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
    else:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k, :s)"), {"k": key, "s": sub % 2**31})


def _in_time_range(start_unix: int, end_unix: int, period: int | None = None) -> list[Any]:
    """Conditions for the rollups starting in [start, end) of `period`, or of either period: the
    window index leads with the period, so a condition on the start alone scanned the whole
    table (every stored minute of every series, once a minute for the running windows)."""
    return [
        rollups.c.period_seconds.in_(PERIODS) if period is None else rollups.c.period_seconds == period,
        rollups.c.start_unix >= start_unix,
        rollups.c.start_unix < end_unix,
    ]


ROLLUP_KEYS = ["series_id", "period_seconds", "start_unix"]
ROLLUP_VALUES = ["value", "sum", "buckets", "gmin", "gmax", "glast", "n", "observed_seconds", "last_unix"]
ROLLUP_COLUMNS = [*ROLLUP_KEYS, *ROLLUP_VALUES]  # the order of `_rollup_params`
READ_COLUMNS = [rollups.c[name] for name in ROLLUP_COLUMNS]  # what `read_rows` selects, in this order
# a column added to the table must be added to `_rollup_params` too
assert sorted(ROLLUP_COLUMNS) == sorted(c.name for c in rollups.columns), "ROLLUP_COLUMNS is not the table's"
STATE_COLUMNS = ["series_id", "value", "sum", "buckets"]


class OpenMinute:
    """A target's cells of the minute it is currently writing, as stored (kept by its scraper).

    Rows of minute M are written only for scrapes made during M (with the minute's last one, or
    at once: minute writes, collector/sources/scrape.py), so when the target's previous scrape
    (its baseline) fell in an earlier minute, no row of M can exist yet and the cells here are the
    whole truth: the next scrape merges in memory and writes without reading. After a
    collector restart in the middle of a minute, or a clock that went back, the rows are read once.
    The minute before is kept too: with this one, the open minutes a derive pass and the drift
    pass read from memory (collector/windowcells.py, Runtime.open_rows), and the running windows
    the minute that just closed (`cells_of`; older minutes from the store, which with several
    collectors on one database holds every shard's targets, the scrapers' memory only this
    collector's).
    """

    __slots__ = ("cells", "first", "minute", "previous")

    def __init__(self) -> None:
        self.minute: int | None = None
        self.cells: dict[int, Cell] = {}
        self.previous: tuple[int, dict[int, Cell]] | None = None
        self.first: int | None = None  # the first minute a scrape of this process counted in

    def cells_of(self, minute: int) -> dict[int, Cell] | None:
        """The target's cells of a closed `minute`, as stored, when memory knows them: {} for a
        minute this process scraped nothing in since its first; None for a minute before that,
        older than the minute before the current one, or the current one (read from another
        thread, its cells may be changing under the reader: the store has it)."""
        current = self.minute  # read before `previous`: a scrape's adopt sets `previous` first
        previous = self.previous
        if self.first is None or current is None or minute < self.first or minute == current:
            return None
        if minute > current:
            return {}
        if previous is None or minute < previous[0]:
            return None
        return dict(previous[1]) if minute == previous[0] else {}

    def stored(self, from_minute: int) -> list[tuple[int, list[tuple[int, Cell]]]]:
        """(minute, cells by series id) of the kept minutes from `from_minute` on, as stored."""
        return [(minute, list(cells.items())) for minute, cells in self.kept(from_minute)]

    def kept(self, from_minute: int) -> list[tuple[int, dict[int, Cell]]]:
        """Like `stored`, without copying: the kept dicts themselves, to be read, never changed
        (the scraper replaces a minute's cells, it does not change them in place)."""
        out = []
        previous, minute, cells = self.previous, self.minute, self.cells
        if previous is not None and previous[0] >= from_minute:
            out.append(previous)
        if minute is not None and minute >= from_minute:
            out.append((minute, cells))
        return out

    def known_cells(self, minute: int, baseline_unix: float | None) -> dict[int, Cell] | None:
        if minute == self.minute:
            return self.cells
        if baseline_unix is None or baseline_unix < minute:
            return {}  # nothing of this target can be stored for `minute` yet
        return None


@dataclass(slots=True)
class ScrapeCommit:
    """One scrape handed to `Store.commit_scrapes`."""

    target_id: int
    deltas: ScrapeDeltas
    units: dict[SeriesKey, str]
    series_ids: dict[SeriesIdent, int]
    now_unix: float
    open_minute: OpenMinute | None = None
    baseline_unix: float | None = None
    new_ids: dict[SeriesIdent, int] = field(default_factory=dict)
    merged: dict[int, Cell] | None = None  # the minute's cells as stored by this commit
    read_stored: bool = False  # the minute's stored rows were read first (not all counted in memory)
    # written with this scrape: the cells (minute, series id, cell) and the delta state that the
    # target's earlier scrapes kept in memory only (collector/sources/scrape.py, `Unwritten`)
    carry_rows: list[tuple[int, int, Cell]] = field(default_factory=list)
    carry_state: dict[SeriesIdent, Cumulative] = field(default_factory=dict)
    carry_process_start_unix: float | None = None

    @property
    def process_start_unix(self) -> float | None:
        """The server's process start to store (None keeps the stored one)."""
        started = self.deltas.process_start_unix
        return started if started is not None else self.carry_process_start_unix

    def adopt(self) -> None:
        """After the commit: the caller's caches take what is now stored."""
        self.series_ids.update(self.new_ids)
        om = self.open_minute
        if om is None or self.merged is None:
            return
        if om.first is None:
            om.first = self.deltas.minute
        if om.minute != self.deltas.minute:
            kept = om.minute is not None and om.minute < self.deltas.minute
            om.previous = (om.minute, om.cells) if kept and om.minute is not None else None
            om.minute, om.cells = self.deltas.minute, {}
        om.cells.update(self.merged)


def merge_window(rows: Iterable[Row], end_unix: int) -> list[SeriesCell]:
    """`rows` of a window ending at `end_unix` merged per series (`Store.read_window`); the
    rows' cells are merged into, not copied."""
    merged: dict[tuple[str, SeriesIdent], SeriesCell] = {}
    merge_into(merged, rows, end_unix)
    return list(merged.values())


def merge_into(merged: dict[tuple[str, SeriesIdent], SeriesCell], rows: Iterable[Row], end_unix: int) -> None:
    """`merge_window` into `merged`, for rows read a piece at a time (an hour cell reaching past
    `end_unix` is left out)."""
    for row in rows:
        if row.start_unix + row.period_seconds > end_unix and row.period_seconds != MINUTE_SECONDS:
            continue
        key = (row.cell.target, row.cell.ident)
        have = merged.get(key)
        if have is None:
            merged[key] = SeriesCell(row.cell.target, row.cell.ident, row.cell.unit, row.cell.cell)
        else:
            have.cell.merge(row.cell.cell)


def merge_in_memory(item: ScrapeCommit, ids: dict[SeriesIdent, int] | None = None) -> bool:
    """Merge the scrape's cells into its minute's cells as the target's `OpenMinute` knows
    them (`item.merged`); False when memory cannot tell what is stored for that minute."""
    om = item.open_minute
    known = om.known_cells(item.deltas.minute, item.baseline_unix) if om is not None else None
    if known is None:
        return False
    ids = item.series_ids if ids is None else ids
    item.merged = {ids[ident]: _merged(known.get(ids[ident]), cell) for ident, cell in item.deltas.cells.items()}
    return True


def _merged(have: Cell | None, cell: Cell) -> Cell:
    if have is None:
        return cell.copy()
    out = have.copy()
    out.merge(cell)
    return out


def _chunks(items: list[int], size: int) -> Iterable[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def upsert(conn: Connection, table: Any, rows: list[dict[str, Any]], keys: list[str], update_cols: list[str]) -> None:
    """Insert rows, updating `update_cols` where the `keys` exist (one executemany).

    The statement is written once per table and dialect and handed to the driver directly: through
    SQLAlchemy's executemany each row's parameters went through its type processing, which at a
    thousand targets cost more than the database's own work."""
    if not rows:
        return
    columns = list(rows[0])
    upsert_params(conn, table.name, columns, [tuple(r[c] for c in columns) for r in rows], keys, update_cols)


def upsert_params(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    params: list[tuple[Any, ...]],
    keys: Sequence[str],
    update_cols: Sequence[str],
) -> None:
    """`upsert` of rows already in `columns`' order: the scrape commit's path, which builds its
    parameter tuples directly (one dict per row and then a tuple cost as much as the database)."""
    if not params:
        return
    sql = _upsert_sql(
        conn.dialect.name, conn.dialect.paramstyle, table, tuple(columns), tuple(keys), tuple(update_cols)
    )
    conn.exec_driver_sql(sql, params)


def _placeholder(paramstyle: str) -> str:
    return {"qmark": "?", "format": "%s", "pyformat": "%s"}[paramstyle]


@functools.cache
def _baseline_sql(paramstyle: str) -> str:
    mark = _placeholder(paramstyle)
    return (
        f"UPDATE {targets.name} SET baseline_unix = {mark}, "
        f"process_start_unix = COALESCE({mark}, process_start_unix) WHERE id = {mark}"
    )


@functools.cache
def _upsert_sql(
    dialect: str, paramstyle: str, table: str, columns: tuple[str, ...], keys: tuple[str, ...], updates: tuple[str, ...]
) -> str:
    if dialect not in ("sqlite", "postgresql"):  # pragma: no cover - the two supported backends
        raise NotImplementedError(f"unsupported database dialect {dialect!r}")
    mark = _placeholder(paramstyle)
    names = ", ".join(columns)
    marks = ", ".join([mark] * len(columns))
    sets = ", ".join(f"{c} = excluded.{c}" for c in updates)
    return f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"


def _ident_to_row(ident: SeriesIdent) -> dict[str, str]:
    return {
        "model": ident.key.model,
        "metric": ident.key.metric,
        "kind": ident.kind.value,
        "labels": json.dumps([list(p) for p in ident.key.labels]),
        "bounds": json.dumps(list(ident.bounds)),
    }


def _ident_key(ident: SeriesIdent) -> tuple[str, ...]:
    row = _ident_to_row(ident)
    return (row["model"], row["metric"], row["kind"], row["labels"], row["bounds"])


def _ident_from_row(row: Any) -> SeriesIdent:
    labels = tuple((str(k), str(v)) for k, v in json.loads(row.labels))
    bounds = tuple(float(b) for b in json.loads(row.bounds))
    return SeriesIdent(SeriesKey(row.model, row.metric, labels), Kind(row.kind), bounds)


def upsert_rollups(conn: Connection, params: list[tuple[Any, ...]]) -> None:
    """Add or replace rollup rows given as `_rollup_params` tuples."""
    upsert_params(conn, rollups.name, ROLLUP_COLUMNS, params, ROLLUP_KEYS, ROLLUP_VALUES)


def _rollup_params(series_id: int, period: int, start: int, cell: Cell) -> tuple[Any, ...]:
    """A rollup row's values in ROLLUP_COLUMNS' order (NaN gauge fields as NULL)."""
    gmin, gmax, glast = cell.gmin, cell.gmax, cell.glast
    return (
        series_id,
        period,
        start,
        cell.value,
        cell.sum,
        _encode_floats(cell.buckets),
        None if gmin != gmin else gmin,  # NaN is the only float unequal to itself
        None if gmax != gmax else gmax,
        None if glast != glast else glast,
        cell.n,
        cell.observed_seconds,
        cell.last_unix,
    )


def _cell_from_row(row: Any, kind: Kind) -> Cell:
    return _cell_of(
        kind, row.value, row.sum, row.buckets, row.gmin, row.gmax, row.glast, row.n, row.observed_seconds, row.last_unix
    )


def _cell_of(
    kind: Kind,
    value: Any,
    total: Any,
    buckets: str | None,
    gmin: Any,
    gmax: Any,
    glast: Any,
    n: Any,
    observed: Any,
    last: Any,
) -> Cell:
    """A cell from a rollup row's values (ROLLUP_VALUES, in order; NULL gauge fields as NaN)."""
    return Cell(
        kind,
        float(value),
        float(total),
        _decode_floats(buckets),
        _none_to_nan(gmin),
        _none_to_nan(gmax),
        _none_to_nan(glast),
        int(n),
        float(observed),
        float(last),
    )
