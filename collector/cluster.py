"""Sharded collectors: several `llmslo serve` processes on one PostgreSQL database, each scraping
its own shard of the targets, evaluating the SLOs over the whole fleet.

Each collector's SLO ledger (collector/slo/ledger.py) counts the events of its own commits. On
every SLO pass a collector

1. publishes what its commits counted since its last publish (`llmslo_slo_deltas`, one
   transaction, numbered per process: `publisher` is the collector's name and a token of the
   process, `seq` counts its publishes);
2. reads what the others published since it last looked (by each publisher's `seq`, so a
   transaction that commits late is not skipped) and adds it to its own ledger;
3. tries to be (or checks that it still is) the elected evaluator: the holder of a PostgreSQL
   session advisory lock on a connection of its own. The lock goes with the connection, so a
   collector that stops, crashes or loses the database hands it on to the next one that tries.

Every collector then answers `/api/v1/slos` for the whole fleet. Only the elected one keeps and
sends the fleet's alerts (the SLO burn rates, cache collapse, drift), exports the SLO status
series on /metrics and builds and delivers the weekly report; each collector keeps and sends
the alerts of its own targets (down, restarted, memory), labelled `collector`. What the others
counted reaches a collector one or two passes late, so a slice (throughput, cost) is judged
`cluster.settle` after it ends, and the last minute or so of a window holds only part of the
other shards' events.

A collector starting up fills its ledger from the stored rollups (every shard writes to the same
tables) up to the minute it started, then takes the published counts from that minute on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from collector.rollup import period_start
from collector.slo.ledger import Published, SloLedger
from collector.store.repository import Store
from collector.store.tables import slo_deltas

log = logging.getLogger(__name__)

LEADER_LOCK = 7_211_534  # pg_try_advisory_lock key of the elected evaluator (the others: store/repository.py)
KEEP_SECONDS = 2 * 3600.0  # published counts older than this are deleted (a restart backfills)
PRUNE_EVERY = 600.0
READ_MARGIN = 300.0  # published_unix is taken when a publish begins; its commit may come later
FLEET = "fleet"  # the owner of the elected evaluator's alerts (collector/slo/alerts.py)


class Leadership:
    """Who sends the fleet's alerts: the holder of a session advisory lock, on a connection kept
    for it alone (a pooled one would hand the lock to whoever borrows it next)."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = sa.create_engine(url, poolclass=NullPool)
        self.conn: Connection | None = None
        self.leader = False
        self.lock = threading.Lock()  # the SLO pass and the weekly report's job both ask

    def check(self) -> bool:
        """Take the lock if it is free; if held, confirm that its connection still lives."""
        with self.lock:
            return self._check()

    def _check(self) -> bool:
        try:
            if self.conn is None:
                self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if self.leader:
                self.conn.execute(sa.text("SELECT 1"))
            else:
                got = self.conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK}).scalar()
                if got:
                    log.info("this collector is now the elected SLO evaluator: it sends the fleet's alerts")
                self.leader = bool(got)
        except SQLAlchemyError as exc:
            if self.leader:
                log.warning("lost the elected evaluator's lock with its connection (%s)", exc)
            self.leader = False
            self._drop()
        return self.leader

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.invalidate()
                self.conn.close()
            except SQLAlchemyError:
                pass
            self.conn = None

    def close(self) -> None:
        """Hand the lock on: released on its connection before that is closed, so that another
        collector can take it at once (a closed connection's server process lets its locks go
        only as it exits, a moment after the close returns)."""
        with self.lock:
            if self.leader and self.conn is not None:
                with contextlib.suppress(SQLAlchemyError):  # else the connection is gone, and the lock with it
                    self.conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": LEADER_LOCK})
            self._drop()
            self.leader = False
        self.engine.dispose()


@dataclass
class Exchange:
    """Publishing this collector's counts and reading the others'."""

    store: Store
    name: str
    publisher: str = ""
    seq: int = 0
    seen: dict[str, int] = field(default_factory=dict)  # publisher -> last seq added
    heard: dict[str, float] = field(default_factory=dict)  # publisher -> when a new publish of it was read
    read_from: float | None = None  # published_unix to read from next time
    unsent: list[Published] = field(default_factory=list)  # taken from the ledger, not yet committed
    pruned_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.publisher:
            self.publisher = f"{self.name}/{secrets.token_hex(4)}"

    def _db_now(self, conn: Connection) -> float:
        if conn.dialect.name == "postgresql":
            return float(conn.execute(sa.text("SELECT extract(epoch from clock_timestamp())")).scalar_one())
        return time.time()

    def publish(self, rows: Sequence[Published]) -> int:
        """Commit `rows` (and any a failed publish left) as this publisher's next `seq`."""
        self.unsent.extend(rows)
        if not self.unsent:
            return 0
        with self.store.engine.begin() as conn:
            now = self._db_now(conn)
            seq = self.seq + 1
            conn.execute(
                slo_deltas.insert(),
                [
                    {
                        "publisher": self.publisher,
                        "seq": seq,
                        "key": p.key,
                        "start_unix": p.start_unix,
                        "good": p.good,
                        "total": p.total,
                        "exact": p.exact,
                        "data": None if p.work is None else json.dumps([[*k, *v] for k, v in p.work.items()]),
                        "published_unix": now,
                    }
                    for p in _merged(self.unsent)
                ],
            )
        self.seq = seq
        sent = len(self.unsent)
        self.unsent = []
        return sent

    def read(self, first_minute: int) -> list[Published]:
        """What the other publishers committed since the last read, for the minutes from
        `first_minute` on (the ledger's backfill from the store covers the minutes before)."""
        t = slo_deltas
        query = sa.select(t).where(t.c.publisher != self.publisher)
        if self.read_from is not None:
            query = query.where(t.c.published_unix >= self.read_from)
        out: list[Published] = []
        newest = self.read_from
        with self.store.engine.connect() as conn:
            rows = conn.execute(query.order_by(t.c.publisher, t.c.seq)).all()
        first = self.read_from is None
        for r in rows:
            newest = r.published_unix if newest is None else max(newest, r.published_unix)
            # a minute before `first_minute` was read from the store, whenever it was published
            if r.seq <= self.seen.get(r.publisher, 0) or r.start_unix < first_minute:
                continue
            work = None
            if r.data is not None:
                work = {(str(v[0]), str(v[1])): [float(x) for x in v[2:]] for v in json.loads(r.data)}
            out.append(Published(r.key, int(r.start_unix), r.good, r.total, bool(r.exact), work))
        now = time.time()
        for r in rows:  # after the loop: every row of a publish is taken before its seq counts as seen
            if r.seq > self.seen.get(r.publisher, 0):
                self.seen[r.publisher] = r.seq
                self.heard[r.publisher] = now
        if newest is not None:
            self.read_from = newest - READ_MARGIN
        elif first:
            self.read_from = 0.0
        return out

    def prune(self) -> int:
        """Delete published counts older than KEEP_SECONDS (the elected collector, now and then)."""
        with self.store.engine.begin() as conn:
            now = self._db_now(conn)
            if now - self.pruned_at < PRUNE_EVERY:
                return 0
            self.pruned_at = now
            return conn.execute(sa.delete(slo_deltas).where(slo_deltas.c.published_unix < now - KEEP_SECONDS)).rowcount

    def peers(self, within: float = 600.0) -> int:
        """Other collectors (by name) with a new publish read in the last `within` seconds."""
        now = time.time()
        return len({p.split("/", 1)[0] for p, t in self.heard.items() if now - t <= within})


def _merged(rows: Sequence[Published]) -> list[Published]:
    """One row per (key, start): a failed publish's rows merged with the next one's."""
    by: dict[tuple[str, int], Published] = {}
    for p in rows:
        have = by.get((p.key, p.start_unix))
        if have is None:
            by[(p.key, p.start_unix)] = p
            continue
        work = None
        if have.work is not None or p.work is not None:
            work = {k: list(v) for k, v in (have.work or {}).items()}
            for k, v in (p.work or {}).items():
                work[k] = [a + b for a, b in zip(work[k], v, strict=True)] if k in work else list(v)
        by[(p.key, p.start_unix)] = Published(
            p.key, p.start_unix, have.good + p.good, have.total + p.total, have.exact and p.exact, work
        )
    return list(by.values())


class Cluster:
    """This collector's part in a sharded fleet (`cluster.name` set)."""

    def __init__(self, store: Store, url: str, name: str) -> None:
        self.name = name
        self.exchange = Exchange(store, name)
        self.leadership = Leadership(url)
        self.leader = False
        self.published = 0  # counts published since start (rows)
        self.received = 0  # counts taken from the other collectors (rows)
        self.failures = 0  # passes whose exchange failed (the database did not answer)

    def sync(self, ledger: SloLedger) -> bool:
        """Publish, read, elect; returns whether this collector is the elected evaluator. A
        database error leaves the counts to the next pass (nothing taken is lost)."""
        self.leader = self.leadership.check()
        assert ledger.live_since is not None
        try:
            self.published += self.exchange.publish(ledger.take_outbox())
            rows = self.exchange.read(period_start(ledger.live_since))
            ledger.add_published(rows)
            self.received += len(rows)
            if self.leader:
                self.exchange.prune()
        except SQLAlchemyError as exc:
            self.failures += 1
            log.warning("exchanging SLO counts with the other collectors failed (%s); retrying next pass", exc)
        return self.leader

    def close(self) -> None:
        self.leadership.close()
