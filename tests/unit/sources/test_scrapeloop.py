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
    return SimpleNamespace(
        target=SimpleNamespace(name=name, url=f"http://127.0.0.1:1/{name}"), interval=interval, run_scheduled=work
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
