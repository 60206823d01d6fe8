"""Group commit: scrapes of many targets share one transaction.

A scrape hands its deltas over and waits. While a transaction is running, every scrape that
arrives queues; when it ends, the next transaction carries all of them. Under light load each
scrape commits alone (no added latency); under heavy load one fsync and one set of statements serve
dozens of targets, which is what lets one process keep up with a thousand of them.

If a group's transaction fails, each of its scrapes is retried alone, so one target's bad write
(or one that loses a race with compaction) fails that target only, never its neighbours.

Linger: a fleet's writes are spread over time (each 15 s target writes once a minute, at its own
offset), so a transaction rarely finds another write queued behind it and a thousand targets made
~17 transactions a second, one per target, each paying its begin, statements and commit (on
PostgreSQL the client's part of those was most of a write's CPU). When writes arrive at least
twice per `linger` on average, the first of a group waits up to `linger` for the others (as a
database's commit_delay does): ~8 writes per transaction at a thousand targets and a 0.25 s linger
(measured; the transaction's own time adds to the wait). A scrape
that writes then finishes up to `linger` later (it is still durable before it counts as done);
under light load, as in a small fleet, nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from collector.store.repository import ScrapeCommit, Store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CommitStats:
    transactions: int = 0
    scrapes: int = 0
    largest_group: int = 0
    lingered: int = 0
    retried_alone: int = 0


class GroupCommitter:
    def __init__(self, store: Store, lock: asyncio.Lock, max_group: int = 256, linger: float = 0.0) -> None:
        self.store = store
        self.lock = lock  # held by compaction too: one writer at a time on SQLite
        self.max_group = max_group
        self.linger = linger
        self.queue: list[tuple[ScrapeCommit, asyncio.Future[None]]] = []
        self.flusher: asyncio.Task[None] | None = None
        self.stats = CommitStats()
        # the mean time between writes, smoothed over the last ~20 (what decides to linger)
        self.mean_gap = float("inf")
        self.last_arrival: float | None = None
        self.filled: asyncio.Event | None = None  # set when the queue holds a whole group

    async def commit(self, item: ScrapeCommit) -> None:
        """Return once `item` is durably stored (or raise the error its own commit met)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._note_arrival()
        self.queue.append((item, future))
        if len(self.queue) >= self.max_group and self.filled is not None:
            self.filled.set()
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush(), name="group-commit")
        await future

    def _note_arrival(self) -> None:
        now = time.monotonic()
        if self.last_arrival is not None:
            gap = now - self.last_arrival
            self.mean_gap = gap if self.mean_gap == float("inf") else 0.95 * self.mean_gap + 0.05 * gap
        self.last_arrival = now

    def lingers(self) -> bool:
        """Whether the next group waits for more writes: at least two are expected per linger."""
        return self.linger > 0 and self.mean_gap * 2 <= self.linger and len(self.queue) < self.max_group

    async def _flush(self) -> None:
        while self.queue:
            if self.lingers():
                self.filled = asyncio.Event()
                with contextlib.suppress(TimeoutError):  # the linger ran out: commit what came
                    await asyncio.wait_for(self.filled.wait(), self.linger)
                self.filled = None
                self.stats.lingered += 1
            group, self.queue = self.queue[: self.max_group], self.queue[self.max_group :]
            if await self._transaction(group) or len(group) == 1:
                continue
            for member in group:  # one member may be at fault: the others still land
                self.stats.retried_alone += 1
                await self._transaction([member])

    async def _transaction(self, group: list[tuple[ScrapeCommit, asyncio.Future[None]]]) -> bool:
        """Commit `group` in one transaction and settle its scrapes. On failure, a scrape alone
        gets the error; a group's scrapes stay pending (the caller retries them one by one)."""
        try:
            async with self.lock:
                await asyncio.to_thread(self.store.commit_scrapes, [item for item, _ in group])
        except Exception as exc:
            if len(group) == 1 and not group[0][1].done():
                group[0][1].set_exception(exc)
            return False
        self.stats.transactions += 1
        self.stats.scrapes += len(group)
        self.stats.largest_group = max(self.stats.largest_group, len(group))
        for _, future in group:
            if not future.done():
                future.set_result(None)
        return True
