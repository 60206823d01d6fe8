"""When each target is scraped: a fixed phase per target, as Prometheus does.

Every target is scraped at `offset + k * interval` (wall clock), where `offset` comes from a hash of
the target's name and URL. Targets spread evenly over the interval whatever their number, a target
keeps its phase across collector restarts, and the schedule never drifts (each slot is computed from
the grid, not from when the previous scrape happened to run). A scrape that overruns its interval
skips the slots it missed instead of firing twice in a row.

One asyncio task per target; a sleeping task costs a timer entry, so thousands are cheap.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from collector.sources.scrape import TargetScraper

log = logging.getLogger(__name__)


def scrape_offset(name: str, url: str, interval: float) -> float:
    """Where in each interval this target is scraped, in [0, interval): fixed by its identity."""
    digest = hashlib.blake2b(f"{name}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * interval


def next_slot(now: float, interval: float, offset: float) -> float:
    """The first slot `offset + k * interval` strictly after `now`."""
    return offset + (math.floor((now - offset) / interval) + 1) * interval


class ScrapeLoops:
    """Runs every target's scrapes on its slots until `stop()`.

    `track` wraps each scrape so that shutdown waits for scrapes in flight (Runtime.tracked)."""

    def __init__(
        self,
        scrapers: list[TargetScraper],
        track: Callable[[Callable[[], Awaitable[None]]], Callable[[], Awaitable[None]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scrapers = scrapers
        self.track = track
        self.clock = clock
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.busy: set[str] = set()
        self.stopping = False
        self.skipped_slots = 0  # slots missed because a scrape overran its interval

    def start(self) -> None:
        for scraper in self.scrapers:
            name = scraper.target.name
            self.tasks[name] = asyncio.create_task(self._loop(scraper), name=f"scrape:{name}")

    def stop(self) -> None:
        """No new scrapes; sleeping loops end now, a loop in a scrape ends when that scrape does."""
        self.stopping = True
        for name, task in self.tasks.items():
            if name not in self.busy:
                task.cancel()

    async def wait(self, timeout: float) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks.values()), timeout=timeout)

    async def _loop(self, scraper: TargetScraper) -> None:
        name = scraper.target.name
        interval = scraper.interval
        offset = scrape_offset(name, scraper.target.url, interval)
        run = self.track(scraper.run_scheduled)
        write = self.track(scraper.write_unwritten)
        at = next_slot(self.clock(), interval, offset)
        while not self.stopping:
            delay = at - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.stopping:
                return
            self.busy.add(name)
            try:
                # a scrape whose next slot is in the same minute leaves its write to a later one
                # (minute writes, collector/sources/scrape.py)
                scraper.next_slot_unix = at + interval
                await run()
            except Exception:  # run_scheduled never raises; keep the loop alive if it ever does
                log.exception("scrape loop of target %s: unexpected error", name)
            at += interval
            now = self.clock()
            if at <= now:
                missed = next_slot(now, interval, offset)
                self.skipped_slots += round((missed - at) / interval)
                at = missed
            try:
                if scraper.must_write_before(at):  # the minute's last scrape failed or was skipped
                    await write()
            except Exception:  # write_unwritten logs its own failures
                log.exception("scrape loop of target %s: unexpected error", name)
            finally:
                self.busy.discard(name)
