"""Group commits and in-memory minute merging: exactly what one-by-one commits store, on both
databases, across a collector restart in the middle of a minute, and with a failing member."""

from __future__ import annotations

import asyncio

from collector.rollup import SeriesIdent
from collector.sources.vllm import Kind, read_scrape
from collector.store.committer import GroupCommitter
from collector.store.repository import OpenMinute, ScrapeCommit, Store
from tests.vllm_fixtures import FAMILIES, Observations, render, workload


class Target:
    """What TargetScraper keeps per target: tracker, series ids, the open minute."""

    def __init__(self, store: Store, name: str) -> None:
        self.target_id = store.ensure_target(name, f"http://127.0.0.1:1/{name}")
        self.tracker, self.ids = store.load_tracker(self.target_id)
        self.minute = OpenMinute()

    def prepare(self, obs: Observations, now: float) -> ScrapeCommit:
        snap = read_scrape(render(FAMILIES["0.33"], {("m", "0"): obs}))
        deltas = self.tracker.observe(snap, now)
        return ScrapeCommit(self.target_id, deltas, snap.units, self.ids, now, self.minute, self.tracker.baseline_unix)

    def adopt(self, item: ScrapeCommit) -> None:
        self.tracker.commit(item.deltas, item.now_unix)


def stored(
    store: Store, start: int, end: int
) -> dict[tuple[str, SeriesIdent], tuple[float, float, list[float] | None]]:
    return {
        (sc.target, sc.ident): (sc.cell.value, sc.cell.observed_seconds, sc.cell.buckets)
        for sc in store.read_window(start, end)
        if sc.ident.kind is not Kind.GAUGE
    }


def run(store: Store, targets: list[Target], steps: list[tuple[int, float]], grouped: bool) -> None:
    for k, now in steps:
        items = [t.prepare(workload(k + i), now) for i, t in enumerate(targets)]
        if grouped:
            store.commit_scrapes(items)
        else:
            for item in items:
                store.commit_scrape(item.target_id, item.deltas, item.units, item.series_ids, item.now_unix)
        for t, item in zip(targets, items, strict=True):
            t.adopt(item)


STEPS = [(1, 6000.0), (2, 6015.0), (3, 6030.0), (5, 6045.0), (6, 6060.0), (8, 6075.0), (9, 6135.0)]


def test_grouped_in_memory_merges_store_what_one_by_one_commits_store(db_url: str, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    grouped = Store(db_url)
    targets = [Target(grouped, f"t{i}") for i in range(5)]
    run(grouped, targets, STEPS, grouped=True)
    want_grouped = stored(grouped, 6000, 6180)
    grouped.close()

    reference = Store(f"sqlite:///{tmp_path_factory.mktemp('ref') / 'ref.db'}")
    ref_targets = [Target(reference, f"t{i}") for i in range(5)]
    run(reference, ref_targets, STEPS, grouped=False)
    assert want_grouped == stored(reference, 6000, 6180)
    assert len(want_grouped) > 5 * 10  # every target's counters and histograms are there
    reference.close()


def test_a_collector_restart_mid_minute_reads_the_minute_back_once(db_url: str) -> None:
    first = Store(db_url)
    a = Target(first, "a")
    run(first, [a], STEPS[:2], grouped=True)  # 6000 and 6015: minute 6000 holds one delta
    first.close()

    second = Store(db_url)  # restarted at 6030, same minute: the open minute is unknown
    b = Target(second, "a")
    item = b.prepare(workload(3), 6030.0)
    assert b.minute.known_cells(6000, b.tracker.baseline_unix) is None  # must read
    second.commit_scrapes([item])
    b.adopt(item)
    assert b.minute.minute == 6000  # ... once: now the minute is known again
    run(second, [b], [(5, 6045.0), (6, 6060.0)], grouped=True)
    totals = {
        ident.key.metric: v[0] for (_, ident), v in stored(second, 6000, 6060).items() if ident.kind is Kind.COUNTER
    }
    # prompt tokens: 5000 per workload unit; the minute saw workloads 1 -> 5 (first scrape is a baseline)
    assert totals["prompt_tokens"] == 5000.0 * 4
    second.close()


def test_a_failing_member_fails_alone_and_the_group_still_lands(store: Store) -> None:
    targets = [Target(store, f"t{i}") for i in range(3)]
    run(store, targets, STEPS[:1], grouped=True)

    async def main() -> list[BaseException | None]:
        committer = GroupCommitter(store, asyncio.Lock())
        items = [t.prepare(workload(2 + i), 6015.0) for i, t in enumerate(targets)]
        bad = items[1]
        bad.series_ids = dict(bad.series_ids)
        bad.series_ids[next(iter(bad.deltas.cells))] = 10**9  # violates the foreign key
        bad.open_minute = None
        results = await asyncio.gather(*(committer.commit(i) for i in items), return_exceptions=True)
        for t, item, result in zip(targets, items, results, strict=True):
            if result is None:
                t.adopt(item)
        assert committer.stats.retried_alone == 3
        return list(results)

    results = asyncio.run(main())
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Exception)
    counted: dict[str, float] = {}
    for (target, ident), (value, _, _) in stored(store, 6000, 6060).items():
        if ident.kind is Kind.COUNTER:
            counted[target] = counted.get(target, 0.0) + value
    # t0 and t2 counted their second scrape; t1 still holds only its baseline (zero deltas) and
    # will count the same traffic on its next scrape
    assert counted["t0"] > 0 and counted["t2"] > 0 and counted["t1"] == 0.0
    reloaded, _ = store.load_tracker(targets[1].target_id)
    assert reloaded.baseline_unix == 6000.0


def spaced_commits(store: Store, targets: list[Target], gap: float, linger: float) -> GroupCommitter:
    """Each target's second scrape handed to one committer `gap` seconds apart, as a fleet's
    writes arrive spread over the interval; returns the committer once every write is durable."""
    run(store, targets, STEPS[:1], grouped=True)

    async def main() -> GroupCommitter:
        committer = GroupCommitter(store, asyncio.Lock(), linger=linger)

        async def one(i: int, t: Target) -> None:
            await asyncio.sleep(i * gap)
            item = t.prepare(workload(2 + i), 6015.0 + i * 0.01)
            await committer.commit(item)
            t.adopt(item)

        await asyncio.gather(*(one(i, t) for i, t in enumerate(targets)))
        return committer

    return asyncio.run(main())


def test_writes_spread_over_time_share_transactions_when_they_come_often(db_url: str) -> None:
    """At a busy fleet's pace (a write every 10 ms against a 0.2 s linger) a transaction carries
    several targets, and every write is stored exactly as one-by-one commits store it."""
    store = Store(db_url)
    targets = [Target(store, f"t{i}") for i in range(40)]
    committer = spaced_commits(store, targets, gap=0.01, linger=0.2)
    assert committer.stats.scrapes == 40
    assert committer.stats.lingered >= 1
    assert committer.stats.transactions <= 40 / 3, committer.stats  # ~one per 0.2 s of writes, not 40
    counted = {t for (t, ident), (value, _, _) in stored(store, 6000, 6060).items() if value > 0}
    assert counted == {f"t{i}" for i in range(40)}  # nobody's write was lost or left waiting
    store.close()


def test_writes_that_come_seldom_do_not_wait(store: Store) -> None:
    """A small fleet (a write every 0.15 s against a 0.2 s linger: fewer than two per linger)
    commits each write at once: lingering would only delay them."""
    targets = [Target(store, f"t{i}") for i in range(6)]
    committer = spaced_commits(store, targets, gap=0.15, linger=0.2)
    assert committer.stats.lingered == 0
    assert committer.stats.transactions == 6 and committer.stats.scrapes == 6


def test_a_full_group_stops_lingering(store: Store) -> None:
    """Writes that fill a group end the wait at once: a burst is committed without the linger."""
    targets = [Target(store, f"t{i}") for i in range(12)]
    run(store, targets, STEPS[:1], grouped=True)

    async def main() -> tuple[GroupCommitter, float]:
        committer = GroupCommitter(store, asyncio.Lock(), max_group=4, linger=30.0)
        committer.mean_gap = 0.001  # as after a busy minute
        items = [t.prepare(workload(2 + i), 6015.0) for i, t in enumerate(targets)]
        started = asyncio.get_running_loop().time()

        async def one(i: int, item: ScrapeCommit) -> None:
            await asyncio.sleep(0.01 * i)  # the first waits alone; the fourth fills its group
            await committer.commit(item)

        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
        for t, item in zip(targets, items, strict=True):
            t.adopt(item)
        return committer, asyncio.get_running_loop().time() - started

    committer, took = asyncio.run(main())
    assert took < 10.0  # never the 30 s linger
    assert committer.stats.scrapes == 12 and committer.stats.largest_group == 4
    assert committer.stats.lingered >= 1
