"""Fixed per-target scrape slots: spread, stable across restarts, no drift, overruns skip slots."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from collector.sources.scrapeloop import ScrapeLoops, next_slot, scrape_offset


def test_offsets_spread_evenly_and_stay_fixed() -> None:
    interval = 15.0
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000/metrics" for i in range(3000)]
    offsets = [scrape_offset(f"vllm-{i}", url, interval) for i, url in enumerate(urls)]
    assert all(0 <= o < interval for o in offsets)
    # evenly spread: each of the 15 one-second bins holds close to 1/15 of the targets (not bunched)
    bins = [0] * 15
    for o in offsets:
        bins[int(o)] += 1
    assert min(bins) > 150 and max(bins) < 250, bins
    # the same target keeps its phase in another process (no per-process salt) ...
    assert scrape_offset("vllm-7", "http://10.0.0.7:8000/metrics", interval) == offsets[7]
    # ... and a different URL for the same name is a different target
    assert scrape_offset("vllm-7", "http://10.0.0.8:8000/metrics", interval) != offsets[7]


def test_next_slot_is_on_the_grid_and_strictly_after_now() -> None:
    assert next_slot(100.0, 15.0, 4.0) == 109.0
    assert next_slot(109.0, 15.0, 4.0) == 124.0  # exactly on a slot: the next one
    assert next_slot(3.0, 15.0, 4.0) == 4.0


def _scraper(name: str, interval: float, work: Callable[[], Awaitable[None]]) -> Any:
    async def write_unwritten() -> None:  # nothing kept in memory (minute writes)
        return None

    return SimpleNamespace(
        target=SimpleNamespace(name=name, url=f"http://127.0.0.1:1/{name}"),
        interval=interval,
        run_scheduled=work,
        next_slot_unix=None,
        must_write_before=lambda _at: False,
        write_unwritten=write_unwritten,
    )


def test_loops_fire_on_their_slots_without_drift_and_skip_missed_slots() -> None:
    interval = 0.2
    fired: dict[str, list[float]] = {"steady": [], "slow": []}

    def recorder(name: str, busy: float) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            fired[name].append(time.time())
            if busy:
                await asyncio.sleep(busy)

        return run

    async def main() -> ScrapeLoops:
        loops = ScrapeLoops(
            [_scraper("steady", interval, recorder("steady", 0.0)), _scraper("slow", interval, recorder("slow", 0.3))],
            track=lambda job: job,
        )
        loops.start()
        await asyncio.sleep(3.0)
        loops.stop()
        await loops.wait(1.0)
        return loops

    loops = asyncio.run(main())
    steady = fired["steady"]
    assert len(steady) >= 13
    offset = scrape_offset("steady", "http://127.0.0.1:1/steady", interval)
    # every run within a few ms of its slot, and the error does not grow run after run (no drift)
    errors = [((t - offset) % interval + interval / 2) % interval - interval / 2 for t in steady]
    assert max(abs(e) for e in errors) < 0.05, errors
    assert abs(statistics.mean(errors[-5:]) - statistics.mean(errors[:5])) < 0.02
    # the slow target (0.3 s per scrape at a 0.2 s interval) never runs twice back to back: it
    # skips the slot it overran, so it fires every second slot
    slow = fired["slow"]
    gaps = [b - a for a, b in itertools.pairwise(slow)]
    assert gaps and all(g > 0.35 for g in gaps), gaps
    assert loops.skipped_slots >= len(gaps)


def test_each_scrape_is_told_its_next_slot_and_a_minute_left_in_memory_is_written_after_it() -> None:
    """Minute writes (collector/sources/scrape.py): the loop hands each scrape the slot after it,
    and writes what a scrape left in memory once the next slot is in a later minute than it."""
    interval = 0.2
    seen: list[tuple[float, float]] = []  # (when the scrape ran, the next slot it was told)
    writes: list[float] = []
    pending = {"minute": None}  # a fake "minute": the slot index a run left unwritten

    async def run() -> None:
        seen.append((time.time(), scraper.next_slot_unix))
        pending["minute"] = len(seen)

    async def write_unwritten() -> None:
        writes.append(time.time())
        pending["minute"] = None

    def must_write_before(at: float) -> bool:  # every third run leaves its "minute" to the loop
        return pending["minute"] is not None and pending["minute"] % 3 == 0 and at > 0

    scraper = SimpleNamespace(
        target=SimpleNamespace(name="t", url="http://127.0.0.1:1/t"),
        interval=interval,
        run_scheduled=run,
        next_slot_unix=None,
        must_write_before=must_write_before,
        write_unwritten=write_unwritten,
    )

    async def main() -> None:
        loops = ScrapeLoops([scraper], track=lambda job: job)
        loops.start()
        await asyncio.sleep(2.0)
        loops.stop()
        await loops.wait(1.0)

    asyncio.run(main())
    assert len(seen) >= 7
    # told the next slot on the grid: one interval after the slot it ran on
    for ran, told in seen:
        assert told is not None and 0.1 < told - ran <= interval + 0.05
    # written right after every third run, before the next run
    assert len(writes) == len(seen) // 3
    for k, w in enumerate(writes, start=1):
        assert seen[3 * k - 1][0] <= w < (seen[3 * k][0] if 3 * k < len(seen) else float("inf"))
