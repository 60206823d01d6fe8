"""Group commit: scrapes of many targets share one transaction.

A scrape hands its deltas over and waits. While a transaction is running, every scrape that
arrives queues; when it ends, the next transaction carries all of them. Under light load each
scrape commits alone (no added latency); under heavy load one fsync and one set of statements serve
dozens of targets, which is what lets one process keep up with a thousand of them.

If a group's transaction fails, each of its scrapes is retried alone, so one target's bad write
(or one that loses a race with compaction) fails that target only, never its neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from collector.store.repository import ScrapeCommit, Store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CommitStats:
    transactions: int = 0
    scrapes: int = 0
    largest_group: int = 0
    retried_alone: int = 0


class GroupCommitter:
    def __init__(self, store: Store, lock: asyncio.Lock, max_group: int = 256) -> None:
        self.store = store
        self.lock = lock  # held by compaction too: one writer at a time on SQLite
        self.max_group = max_group
        self.queue: list[tuple[ScrapeCommit, asyncio.Future[None]]] = []
        self.flusher: asyncio.Task[None] | None = None
        self.stats = CommitStats()

    async def commit(self, item: ScrapeCommit) -> None:
        """Return once `item` is durably stored (or raise the error its own commit met)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append((item, future))
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush(), name="group-commit")
        await future

    async def _flush(self) -> None:
        while self.queue:
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
