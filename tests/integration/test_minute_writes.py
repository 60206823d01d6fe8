"""Minute writes (collector/sources/scrape.py): a scheduled scrape whose next slot is in the same
minute is counted in memory and written with the minute's last scrape.

Each test scrapes two targets answering the same real HTTP body at the same (virtual) times: `every`
writes every scrape, as a scrape without a slot does; `kept` is given the slot a 15 s schedule would
give. What `kept` stores must be what `every` stores, minute for minute, once the minute's last
scrape (or the loop's write after a failed one, or shutdown) has written it; a collector that dies
with scrapes in memory loses no count.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from collector.config import Settings
from collector.rollup import MINUTE_SECONDS, Cell, period_start
from collector.runtime import Runtime
from collector.store import repository
from collector.store.repository import Store
from tests.targets import Behaviour, target_server, vllm_body

INTERVAL = 15.0


def settings_for(tmp_path: Path, url: str) -> Settings:
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "targets": [
                {"name": name, "url": url, "business_type": "chat", "interval": INTERVAL, "timeout": 5}
                for name in ("every", "kept")
            ],
        }
    )


def stored(store: Store, target: str, start: int, end: int) -> dict[tuple[int, Any], Cell]:
    """(minute, series) -> cell of one target's stored minute rows in [start, end)."""
    return {
        (r.start_unix, r.cell.ident): r.cell.cell
        for r in store.read_rows(start, end, target=target)
        if r.period_seconds == MINUTE_SECONDS
    }


def same_cells(a: dict[tuple[int, Any], Cell], b: dict[tuple[int, Any], Cell]) -> bool:
    def key(c: Cell) -> tuple[Any, ...]:
        return (c.value, c.sum, c.buckets, c.n, c.observed_seconds, repr(c.gmin), repr(c.gmax), repr(c.glast))

    return a.keys() == b.keys() and all(key(a[k]) == key(b[k]) for k in a)


async def scrape_both(rt: Runtime, at: float, next_slot: float | None) -> None:
    """Scrape `every` (no slot: writes) and `kept` (the slot after this one) at virtual time `at`."""
    rt.scrapers["kept"].next_slot_unix = next_slot
    for name in ("every", "kept"):
        assert await rt.scrapers[name].scrape_once(lambda: at), rt.scrapers[name].status.last_error


def counter_total(store: Store, target: str, start: int, end: int) -> float:
    return sum(
        c.value for (_, ident), c in stored(store, target, start, end).items() if ident.key.metric == "request_success"
    )


@dataclass
class Pair:
    """The two targets' server, settings, the workload's scale and the first virtual minute."""

    routes: dict[str, Behaviour]
    settings: Settings
    scale: dict[str, int]
    m0: int


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    scale = {"n": 1}
    routes = {"/m": Behaviour(vllm_body(lambda: scale["n"]))}
    with target_server(routes) as srv:
        yield Pair(routes, settings_for(tmp_path, srv.url("/m")), scale, period_start(time.time()) - 600)


async def two_kept(p: Pair) -> Runtime:
    """A started collector of the pair: its first scrape at m0 + 5 (new series: written at once),
    then two kept in memory."""
    rt = Runtime(p.settings)
    await rt.start()
    await scrape_both(rt, p.m0 + 5, p.m0 + 20)
    for k, at in enumerate((p.m0 + 20, p.m0 + 35), start=2):
        p.scale["n"] = k
        await scrape_both(rt, at, at + INTERVAL)
    assert rt.scrapers["kept"].unwritten is not None
    return rt


def test_kept_scrapes_are_written_once_with_the_minutes_last_and_match_every_scrape_written(pair: Pair) -> None:
    m0, scale, settings = pair.m0, pair.scale, pair.settings

    async def run() -> None:
        rt = Runtime(settings)
        await rt.start()
        commits = rt.scrapers["kept"].committer.stats
        await scrape_both(rt, m0 + 5, m0 + 20)  # a first scrape has new series: written at once
        written_first = dict(stored(rt.store, "kept", m0, m0 + 60))
        for k, at in enumerate((m0 + 20, m0 + 35), start=2):
            scale["n"] = k
            before = commits.scrapes
            await scrape_both(rt, at, at + INTERVAL)
            assert commits.scrapes == before + 1  # `every`'s commit only
            # nothing of `kept` written for these: the store still holds the first scrape's rows
            assert same_cells(stored(rt.store, "kept", m0, m0 + 60), written_first)
            assert rt.scrapers["kept"].unwritten is not None
            # ... while what it serves already counts them (a 2-minute window: not configured,
            # merged from the store and the scrapers' memory)
            requests = {"every": 0.0, "kept": 0.0}
            for sc in rt.window_cells(120.0, at + 1):
                if sc.ident.key.metric == "request_success":
                    requests[sc.target] += sc.cell.value
            assert requests["kept"] == requests["every"] == 20.0 * (k - 1)
        scale["n"] = 4
        await scrape_both(rt, m0 + 50, m0 + 65)  # the minute's last scrape: writes the minute
        assert rt.scrapers["kept"].unwritten is None
        every, kept = stored(rt.store, "every", m0, m0 + 60), stored(rt.store, "kept", m0, m0 + 60)
        assert same_cells(kept, every) and counter_total(rt.store, "kept", m0, m0 + 60) == 60.0
        # the delta state and baseline a restart resumes from are the same too
        ids = {n: s.target_id for n, s in rt.scrapers.items()}
        loaded = {n: rt.store.load_tracker(i or 0)[0] for n, i in ids.items()}
        assert loaded["kept"].baseline_unix == loaded["every"].baseline_unix == m0 + 50
        assert {i.key: c for i, c in loaded["kept"].state.items()} == {
            i.key: c for i, c in loaded["every"].state.items()
        }
        # the next minute: its first scrape is kept again
        scale["n"] = 5
        await scrape_both(rt, m0 + 65, m0 + 80)
        assert rt.scrapers["kept"].unwritten is not None
        assert stored(rt.store, "kept", m0 + 60, m0 + 120) == {}
        await rt.close()  # shutdown writes it
        store = Store(settings.resolved_database_url)
        try:
            assert same_cells(stored(store, "kept", m0, m0 + 120), stored(store, "every", m0, m0 + 120))
        finally:
            store.close()

    asyncio.run(run())


def test_a_failed_last_scrape_leaves_the_minute_to_the_loops_write(pair: Pair) -> None:
    m0 = pair.m0

    async def run() -> None:
        rt = await two_kept(pair)
        kept = rt.scrapers["kept"]
        assert not kept.must_write_before(m0 + 50)
        pair.routes["/m"].status = 500  # the minute's last scrape fails
        kept.next_slot_unix = m0 + 65
        assert not await kept.scrape_once(lambda: m0 + 50)
        assert kept.status.last_error_reason == "http_status"
        # the loop's check after the minute's last slot: the next slot is in a later minute
        assert kept.must_write_before(m0 + 65)
        await kept.write_unwritten()
        assert kept.unwritten is None and not kept.must_write_before(m0 + 65)
        assert same_cells(stored(rt.store, "kept", m0, m0 + 60), stored(rt.store, "every", m0, m0 + 60))
        assert counter_total(rt.store, "kept", m0, m0 + 60) == 40.0
        await rt.close()

    asyncio.run(run())


def test_a_collector_that_dies_with_scrapes_in_memory_loses_no_count(pair: Pair) -> None:
    m0 = pair.m0

    async def first_life() -> None:
        rt = await two_kept(pair)
        # killed: no shutdown, nothing written; the store is left as the process left it
        rt.store.close()

    async def second_life() -> None:
        rt = Runtime(pair.settings)
        await rt.start()
        pair.scale["n"] = 5
        await scrape_both(rt, m0 + 65, m0 + 80)
        pair.scale["n"] = 6
        await scrape_both(rt, m0 + 110, m0 + 125)
        # `every` counted 20 requests per step in each scrape's minute; `kept` lost the
        # attribution of the two scrapes in memory (their requests are counted in the next
        # scrape's minute, as after any gap), not the requests
        assert counter_total(rt.store, "every", m0, m0 + 60) == 40.0
        assert counter_total(rt.store, "kept", m0, m0 + 60) == 0.0
        assert counter_total(rt.store, "kept", m0, m0 + 120) == counter_total(rt.store, "every", m0, m0 + 120)
        assert counter_total(rt.store, "kept", m0, m0 + 120) == 100.0
        await rt.close()

    asyncio.run(first_life())
    asyncio.run(second_life())


def test_a_database_failure_on_the_minutes_last_scrape_loses_nothing_kept_in_memory(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The minute's last scrape cannot write (another process holds SQLite's write lock): it fails
    as a store error and the scrapes kept in memory stay there; the next scrape writes them with
    its own, and the store ends as the target written every scrape (which failed alike)."""
    monkeypatch.setattr(repository, "SQLITE_BUSY_TIMEOUT_MS", 200)  # give up on the lock quickly
    m0 = pair.m0

    async def run() -> None:
        rt = await two_kept(pair)
        kept = rt.scrapers["kept"]
        other = sqlite3.connect(pair.settings.resolved_database_url.removeprefix("sqlite:///"), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # a writer that does not let go
        try:
            pair.scale["n"] = 4
            kept.next_slot_unix = m0 + 65
            for scraper in (rt.scrapers["every"], kept):
                assert not await scraper.scrape_once(lambda: m0 + 50)
                assert scraper.status.last_error_reason == "store"
            assert kept.unwritten is not None and kept.must_write_before(m0 + 65)
            await kept.write_unwritten()  # the loop's write fails too, and is logged
            assert kept.unwritten is not None
        finally:
            other.execute("ROLLBACK")
            other.close()
        pair.scale["n"] = 5
        await scrape_both(rt, m0 + 65, m0 + 80)  # writes the minute kept, then its own
        assert rt.scrapers["kept"].unwritten is None
        await rt.close()
        store = Store(pair.settings.resolved_database_url)
        try:
            assert same_cells(stored(store, "kept", m0, m0 + 120), stored(store, "every", m0, m0 + 120))
            assert counter_total(store, "kept", m0, m0 + 60) == 40.0  # the two kept scrapes
            assert counter_total(store, "kept", m0, m0 + 120) == 80.0  # and the failed one's, later
        finally:
            store.close()

    asyncio.run(run())
