"""The SLO ledger's saved counts (collector/slo/saved.py). A collector that restarts reads its
counts back and counts only the last stretch of stored rollups again: its statuses are those of a
collector fed the same traffic that never stopped (both databases; the minutes compacted into
hours included, which a re-read of the rollups can only judge by the hour). A changed objective
is counted afresh from the rollups; a crash loses nothing the rollups do not give back."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from collector.rollup import MINUTE_SECONDS, Row, period_start
from collector.runtime import Runtime, ShuttingDown
from collector.slo import saved as saved_counts
from collector.slo.evaluate import RECOUNTING, period_bounds
from collector.slo.ledger import WORK_FIELDS, Ring
from collector.store.repository import Store
from collector.traces.store import ingest
from tests.slo.test_ledger import RULES, T0, Server, comparable, settings, spans

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def feed(rts: list[Runtime], rng: random.Random, servers: dict[str, Server], t_from: int, t_to: int) -> None:
    """test_ledger's traffic (an incident on chat from the 200th minute, a vLLM restart at the
    150th, gateway spans), the same scrapes and spans committed into every collector of `rts`."""
    for t in range(t_from, t_to, 15):
        minute = (t - T0) // 60
        incident = 200 <= minute < 230
        for name, server in servers.items():
            if name == "batch-0":
                server.traffic(rng.randint(0, 3) if minute % 37 else 0, 0.0, 0.001)
            else:
                server.traffic(rng.randint(2, 6), 0.5 if incident else 0.02, 0.2 if incident else 0.002)
            body = server.body()
            for rt in rts:
                rt.scrapers[name].ingest(body, "text/plain", float(t))
        if minute == 150 and t % 60 == 0:
            servers["chat-1"] = Server(rng, float(t - 5))
        records = spans(rng, t, rng.randint(0, 4), t * 10)
        for rt in rts:
            ingest(rt.store, records, rt.traces.targets_of(), rt.ledger.add_requests if rt.ledger else None)


def collector(tmp_path: Path, db_url: str, live_from: int | None = None) -> Runtime:
    """A collector on `db_url`; `live_from`: it starts counting live there, as `serve` does at
    start-up (what was stored of that minute read first, each target's counters resumed)."""
    rt = Runtime(settings(tmp_path, db_url))
    assert rt.ledger is not None and rt.saves_slo_counts
    if live_from is None:
        rt.ledger.live_since = T0
    else:
        rt.begin_live_counting(live_from)
        for scraper in rt.scrapers.values():
            asyncio.run(scraper.load())
    return rt


def open_slices(rt: Runtime) -> tuple[object, object]:
    """The ledger's open throughput slices (tokens, requests) and cost slices (each target's work)."""
    assert rt.ledger is not None
    throughput = {
        slo: {s: [round(x, 6) for x in v] for s, v in slots.items()} for slo, slots in rt.ledger.slices.items()
    }
    cost = {
        (size, s): {pair: [round(getattr(w, f), 6) for f in WORK_FIELDS] for pair, w in inputs.work.items()}
        for size, slots in rt.ledger.cost_open.items()
        for s, inputs in slots.items()
    }
    return throughput, cost


def rows_of_the_period(rt: Runtime, now: float) -> int:
    """The stored rollup rows a ledger without saved counts reads for its period."""
    assert rt.rules is not None
    start, _ = period_bounds(rt.rules, now)
    return len(rt.store.read_rows(start, period_start(now), metrics=rt.slo_metrics))


@pytest.mark.parametrize("graceful", [False, True])
def test_a_restart_reads_the_saved_counts_and_matches_a_collector_that_never_stopped(
    tmp_path: Path, db_url: str, graceful: bool
) -> None:
    rng = random.Random(5)
    (tmp_path / "oracle").mkdir()
    oracle = collector(tmp_path / "oracle", f"sqlite:///{tmp_path / 'oracle' / 'llmslo.db'}")
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    restart = T0 + 4 * 3600 + 25  # 25 s into a minute
    last_pass = restart - 25 - 480  # the first process' last pass: ~8 minutes before it stops
    for start in range(T0, restart, 600):
        end = min(start + 600, restart)
        feed([rt, oracle], rng, servers, start, end)
        if end <= last_pass:
            rt.evaluate_slos(end - 1.0)
            oracle.evaluate_slos(end - 1.0)
    if graceful:  # a shutdown saves what closed since the last pass (Runtime.close)
        rt.save_slo_counts(restart - 1.0)
    for r in (rt, oracle):
        r.compact(restart)  # minutes older than the 3 h kept become hours
    rt.store.close()

    rt = collector(tmp_path, db_url, live_from=restart)
    feed([rt, oracle], rng, servers, restart, restart + 600)
    now = restart + 600 - 1.0
    got, want = rt.evaluate_slos(now), oracle.evaluate_slos(now)
    assert comparable(got) == comparable(want)
    assert open_slices(rt) == open_slices(oracle) and open_slices(rt)[1]  # the slices still open, to the token
    # the saved counts were read back with the open slices' parts (the 30-minute cost slice and
    # the 5-minute throughput slice running then), and the rollups counted again only from where
    # the save ended, not the whole period
    resumed = rt.slo_counts_resumed_from
    assert resumed is not None and resumed % 60 == 0
    assert restart - 1500 <= resumed <= period_start(restart) and (resumed > restart - 120) == graceful
    assert rt.slo_backfill_rows < rows_of_the_period(rt, now) / 4
    if not graceful:  # the minutes after the last pass' save: counted from the rollups
        assert rt.slo_backfill_rows > 0
    statuses = {s.objective.slo: s for s in got}
    assert statuses["chat-ttft"].period.events.bad > 0  # the first process' incident, restored
    assert not statuses["chat-ttft-between"].exact  # exactness is saved too
    assert statuses["batch-throughput"].period.events.total >= 40  # 5-minute slices, judged live
    assert statuses["batch-cost"].period.events.total >= 8
    checked = sum(1 for s in got if s.period.events.total > 0)
    assert checked >= 6

    # the restarted collector goes on saving: after a second stop (half a minute of traffic
    # scraped by neither), it resumes later still, and agrees again
    rt.store.close()
    feed([], rng, servers, restart + 600, restart + 630)
    rt = collector(tmp_path, db_url, live_from=restart + 630)
    feed([rt, oracle], rng, servers, restart + 630, restart + 900)
    now = restart + 899.0
    assert comparable(rt.evaluate_slos(now)) == comparable(oracle.evaluate_slos(now))
    assert rt.slo_counts_resumed_from is not None and rt.slo_counts_resumed_from >= resumed
    rt.store.close()
    oracle.store.close()


def saved_rows_of(rt: Runtime, key: str) -> dict[tuple[int, int], tuple[float, float]]:
    return {(p, s): (round(g, 6), round(t, 6)) for k, p, s, g, t in saved_counts.load(rt.store).rows if k == key}


def test_a_changed_objective_is_counted_again_from_the_rollups_while_the_others_resume(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three objectives change while the collector is down: chat's engine and gateway TTFT
    thresholds, and the batch cost ceiling. The first pass resumes the five others from their
    saved counts (a few minutes of rollups read) and gives them their status at once; the changed
    ones have no status, keep the alert they had, and are counted again from the whole period's
    rollups in the background (a late span of an earlier minute, committed meanwhile, is the
    recount's to count). Then every status is what a re-read of the rollups gives, their saved
    rows are replaced, and the next restart resumes all eight."""
    rng = random.Random(8)
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    restart = T0 + 13200 + 40  # the 220th minute: in the middle of chat's incident
    for start in range(T0, restart, 600):
        end = min(start + 600, restart)
        feed([rt], rng, servers, start, end)
        rt.evaluate_slos(end - 1.0)
    rt.save_slo_counts(restart - 1.0)
    page = [i for i in rt.alerts.active() if i.labels.get("slo") == "chat-ttft" and i.state == "firing"]
    assert page, "the incident fires chat's TTFT alert before the restart"
    # an hour the old definition counted and the new one does not (events the rollups lack)
    with rt.store.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO llmslo_slo_counts (owner, key, period_seconds, start_unix, good, total) "
            f"VALUES ('', 'chat-ttft', 3600, {T0 - 3600}, 1, 5)"
        )
    old_ttft = saved_rows_of(rt, "chat-ttft")
    rt.compact(restart)
    rt.store.close()
    # chat's TTFT threshold moves from 1 s to 2 s, the batch cost ceiling from 0.5 to 0.4 USD
    changed = (
        RULES.replace("metric: ttft, threshold: 1s", "metric: ttft, threshold: 2s")
        .replace("threshold: 800ms", "threshold: 500ms")
        .replace("max_usd_per_million_tokens: 0.5", "max_usd_per_million_tokens: 0.4")
        .replace("min_tokens_per_second: 40", "min_tokens_per_second: 30")
    )
    assert changed.count("2s") == 1 and "0.4" in changed and "500ms" in changed and ": 30," in changed
    rewritten = {"chat-ttft", "chat-gw-ttft", "batch-cost", "batch-throughput"}

    def restarted(at: int) -> Runtime:
        cfg = settings(tmp_path, db_url)  # writes RULES; the changed rules replace them
        (tmp_path / "rules.yaml").write_text(changed)
        r = Runtime(cfg)
        r.alerts.load()
        r.begin_live_counting(at)
        for scraper in r.scrapers.values():
            asyncio.run(scraper.load())
        return r

    rt = restarted(restart)
    assert rt.rules is not None and rt.ledger is not None
    feed([rt], rng, servers, restart, restart + 300)
    now = restart + 299.0
    asked: list[float] = []
    with monkeypatch.context() as m:
        m.setattr(rt, "start_recount", asked.append)
        got = {s.objective.slo: s for s in rt.evaluate_slos(now)}
    assert asked == [now] and rt.recount_thread is None
    want, _ = rt._evaluate_from_store(rt.rules, now)  # counted from the rollups, as a re-read does
    for slo in rewritten:  # no status until counted again; the firing page is kept as it was
        assert got[slo].no_data_reason == RECOUNTING and got[slo].budget_remaining is None
    kept = [s for s in want if s.objective.slo not in rewritten]
    assert comparable([got[s.objective.slo] for s in kept]) == comparable(kept)
    assert sum(1 for s in kept if s.period.events.total > 0) >= 4
    assert rt.slo_counts_resumed_from is not None  # the others resumed: a few minutes read, not the period
    assert rt.slo_backfill_rows < rows_of_the_period(rt, now) / 4
    assert [i.fingerprint for i in rt.alerts.active() if i.state == "firing" and i.labels["slo"] == "chat-ttft"] == [
        i.fingerprint for i in page
    ]
    assert saved_rows_of(rt, "chat-ttft") == old_ttft  # not saved while counted again
    # a later pass, the recount still running: the slices open at the start (the 30-minute cost
    # slice, 5-minute throughput slices) have ended, and wait for the part the recount brings
    feed([rt], rng, servers, restart + 300, restart + 1200)
    now = restart + 1199.0
    with monkeypatch.context() as m:
        m.setattr(rt, "start_recount", asked.append)
        got = {s.objective.slo: s for s in rt.evaluate_slos(now)}
    assert all(got[slo].no_data_reason == RECOUNTING for slo in rewritten)
    assert [i.fingerprint for i in rt.alerts.active() if i.state == "firing" and i.labels["slo"] == "chat-ttft"] == [
        i.fingerprint for i in page
    ]
    # spans of minutes before the start, exported late: live for the others, the recount's for these
    late = spans(random.Random(1), restart - 900, 30, 10**9)
    ingest(rt.store, late, rt.traces.targets_of(), rt.ledger.add_live_requests)
    # a shutdown while they are counted again: the recount stops at its next piece, and they stay
    # pending and unsaved (the next start counts them again)
    pending = set(rt.ledger.pending)
    reads = stop_at_read(rt, 1)
    with pytest.raises(ShuttingDown):
        rt.recount(now)
    assert len(reads) == 1 and rt.ledger.pending == pending and saved_rows_of(rt, "chat-ttft") == old_ttft
    del rt.store.read_rows
    rt.stopping.clear()  # (this test's collector goes on)
    rt.start_recount(now)
    recount = rt.recount_thread
    assert recount is not None
    recount.join(timeout=120)
    assert not recount.is_alive() and not rt.ledger.pending and rt.slo_recount_seconds is not None
    # the changed objectives' own series were read, not every SLO series (errors' and the
    # latency histograms other than TTFT are left out)
    assert 0 < rt.slo_recount_rows < rows_of_the_period(rt, now) * 0.9

    feed([rt], rng, servers, restart + 1200, restart + 1320)
    now = restart + 1319.0
    got_all = rt.evaluate_slos(now)
    want, _ = rt._evaluate_from_store(rt.rules, now)
    assert comparable(got_all) == comparable(want)
    assert {s.objective.slo for s in got_all if s.period.events.total > 0} >= rewritten
    # the page's episode went on through the recount (it ends only once its status says so)
    firing = {i.fingerprint: i for i in rt.alerts.active() if i.state == "firing"}
    assert all(firing[p.fingerprint].starts_at_unix == p.starts_at_unix for p in page if p.fingerprint in firing)
    # that pass replaced the changed keys' rows: they are the new definition's counts
    new_ttft = saved_rows_of(rt, "chat-ttft")
    assert new_ttft and new_ttft != old_ttft and (3600, T0 - 3600) not in new_ttft
    assert sum(g for (p, _), (g, _) in new_ttft.items() if p == 3600) > sum(
        g for (p, _), (g, _) in old_ttft.items() if p == 3600
    )  # more requests under 2 s than under 1 s
    fingerprints = saved_counts.load(rt.store).fingerprint
    assert all(fingerprints[k] == fp for k, fp in rt._count_fingerprints().items())

    # the next restart resumes every objective from the saved counts, and agrees with a re-read
    rt.store.close()
    rt = restarted(restart + 1350)
    feed([rt], rng, servers, restart + 1350, restart + 1500)
    now = restart + 1499.0
    got_all = rt.evaluate_slos(now)
    want, _ = rt._evaluate_from_store(rt.rules, now)  # type: ignore[arg-type]
    assert comparable(got_all) == comparable(want)
    assert rt.slo_counts_resumed_from is not None and rt.recount_thread is None
    rt.store.close()


def test_each_pass_saves_the_slots_closed_since_the_last_one(tmp_path: Path) -> None:
    """A pass writes the minutes (and hours) closed since the last pass: at most one row per key
    and closed slot, however many targets; the minute still open is not written."""
    db_url = f"sqlite:///{tmp_path / 'llmslo.db'}"
    rng = random.Random(2)
    rt = collector(tmp_path, db_url)
    assert rt.ledger is not None
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    feed([rt], rng, servers, T0, T0 + 600)
    rt.evaluate_slos(T0 + 599.0)  # the first pass: everything counted so far is written
    written: list[int] = []
    real = saved_counts.save

    def counting(store, rows, *args, **kwargs):  # type: ignore[no-untyped-def]
        written.append(len(rows))
        return real(store, rows, *args, **kwargs)

    saved_counts.save = counting  # type: ignore[assignment]
    try:
        for start in range(T0 + 600, T0 + 1200, 60):
            feed([rt], rng, servers, start, start + 60)
            rt.evaluate_slos(start + 59.0)
    finally:
        saved_counts.save = real  # type: ignore[assignment]
    keys = len(rt.ledger.count_keys())
    assert len(written) == 10 and all(0 < n <= keys for n in written), written
    saved = saved_counts.load(rt.store)
    minutes = [(k, s) for k, p, s, _, _ in saved.rows if p == MINUTE_SECONDS]
    assert len(minutes) == len(set(minutes))
    through = period_start(T0 + 1199 - rt.running.grace)
    assert set(saved.through.values()) == {through}
    assert max(s for _, s in minutes) < through  # the minute not yet closed is not saved
    assert sorted({s for _, s in minutes}) == list(range(T0, through, MINUTE_SECONDS))
    rt.store.close()


@pytest.mark.parametrize("with_saved", [True, False])
def test_a_fill_that_fails_half_way_leaves_nothing_behind(tmp_path: Path, with_saved: bool) -> None:
    """The database fails in the middle of the first pass' fill (after the saved counts were read
    back, or half way through the stored rollups): that pass fails, and the next one fills afresh,
    counting nothing twice, while the live commits in between are kept."""
    rng = random.Random(4)
    db_url = f"sqlite:///{tmp_path / 'llmslo.db'}"
    (tmp_path / "oracle").mkdir()
    oracle = collector(tmp_path / "oracle", f"sqlite:///{tmp_path / 'oracle' / 'llmslo.db'}")
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    restart = T0 + 3 * 3600 + 10
    for start in range(T0, restart, 600):
        end = min(start + 600, restart)
        feed([rt, oracle], rng, servers, start, end)
        rt.evaluate_slos(end - 1.0)
        oracle.evaluate_slos(end - 1.0)
    if not with_saved:  # a collector from before the saved counts: the whole period is counted
        with rt.store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM llmslo_slo_count_keys")
    rt.store.close()
    rt = collector(tmp_path, db_url, live_from=restart)
    feed([rt, oracle], rng, servers, restart, restart + 300)
    real, read, calls = rt.store.read_rows, [0], [0]

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        # the second read after the saved counts were read back; else the read after the first
        # one that brought rows (what a refill would count twice)
        if calls[0] == 2 if with_saved else read[0] > 0:
            raise OperationalError("SELECT", {}, Exception("the database went away"))
        rows = real(*args, **kwargs)
        read[0] += len(rows)
        return rows

    rt.store.read_rows = failing  # type: ignore[method-assign]
    with pytest.raises(OperationalError):
        rt.evaluate_slos(restart + 299.0)
    assert rt.ledger is not None and not rt.ledger.ready and (with_saved or read[0] > 0)
    rt.store.read_rows = real  # type: ignore[method-assign]
    feed([rt, oracle], rng, servers, restart + 300, restart + 600)  # live commits meanwhile
    now = restart + 599.0
    assert comparable(rt.evaluate_slos(now)) == comparable(oracle.evaluate_slos(now))
    assert (rt.slo_counts_resumed_from is not None) == with_saved
    rt.store.close()
    oracle.store.close()


def stop_at_read(rt: Runtime, n: int) -> list[int]:
    """Shutdown begins (`Runtime.stop_reading`) as the `n`th rollup read from now on returns;
    returns the rows each read brought."""
    real, reads = rt.store.read_rows, []

    def reading(*args, **kwargs):  # type: ignore[no-untyped-def]
        rows = real(*args, **kwargs)
        reads.append(len(rows))
        if len(reads) == n:
            rt.stop_reading()
        return rows

    rt.store.read_rows = reading  # type: ignore[method-assign]
    return reads


@pytest.mark.parametrize("with_saved", [False, True])
def test_a_shutdown_stops_the_first_fill_and_drifts_build_at_their_next_piece(tmp_path: Path, with_saved: bool) -> None:
    """SIGTERM during a first start's fill (at fleet size many minutes of reads): the fill stops at
    its next piece instead of holding the process up until it ends, saves nothing, and the next
    start fills the ledger whole. Drift's first pass waits for that fill (both read the stored
    history and would compete for the interpreter), and its reference build stops likewise."""
    rng = random.Random(6)
    db_url = f"sqlite:///{tmp_path / 'llmslo.db'}"
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    restart = T0 + 3600 + 10
    for start in range(T0, restart, 1200):
        feed([rt], rng, servers, start, min(start + 1200, restart))
        if with_saved:
            rt.evaluate_slos(min(start + 1200, restart) - 1.0)
    if not with_saved:
        with rt.store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM llmslo_slo_count_keys")
    saved_before = sorted(saved_counts.load(rt.store).rows)
    rt.store.close()

    rt = collector(tmp_path, db_url, live_from=restart)
    feed([rt], rng, servers, restart, restart + 120)
    now = restart + 119.0
    assert rt.ledger is not None and rt.drift is not None and rt.drift_waits(now)
    reads = stop_at_read(rt, 1)
    with pytest.raises(ShuttingDown):
        rt.evaluate_slos(now)
    assert len(reads) == 1 and not rt.ledger.ready
    assert rt.drift_waits(now)  # stopped, not failed
    with pytest.raises(ShuttingDown):  # drift's reference build: no read once shutdown has begun
        rt.drift.evaluate(now)
    assert len(reads) == 1 and rt.drift.reference is None
    asyncio.run(rt.close())  # as `serve` stops: the unwritten minute written, the unfilled ledger not saved
    store = Store(db_url)
    assert sorted(saved_counts.load(store).rows) == saved_before
    store.close()

    rt = collector(tmp_path, db_url, live_from=restart + 150)
    feed([rt], rng, servers, restart + 150, restart + 300)
    now = restart + 299.0
    reads = stop_at_read(rt, 10**9)
    got = rt.evaluate_slos(now)
    assert rt.ledger is not None and rt.ledger.ready and len(reads) > 1  # the fill stopped after its first of these
    assert (rt.slo_counts_resumed_from is not None) == with_saved
    want, _ = rt._evaluate_from_store(rt.rules, now)  # type: ignore[arg-type]
    assert comparable(got) == comparable(want)
    assert not rt.drift_waits(now)
    # drift's first build, stopped after two hours of its reads (ten minutes each): what it read
    # is saved an hour at a time, and the next start's build loads it instead of reading it again
    assert rt.drift is not None
    reads = stop_at_read(rt, 13)
    with pytest.raises(ShuttingDown):
        rt.drift.evaluate(now)
    assert len(reads) == 13
    rt.store.close()
    rt = collector(tmp_path, db_url, live_from=restart + 330)
    assert rt.drift is not None
    rt.drift.evaluate(restart + 359.0)
    assert rt.drift.minutes_read["saved"] >= 60 and rt.drift.reference is not None
    rt.store.close()


@pytest.mark.parametrize("with_saved", [False, True])
def test_compaction_waits_for_the_fill_that_reads_the_hours_it_would_merge(
    tmp_path: Path, db_url: str, with_saved: bool
) -> None:
    """The collector was down long enough for its oldest minutes to be due for compaction. The
    first pass' fill reads the hour cells, then the minutes: a compaction between the two (the
    compaction job runs 30 s after the start) would merge an hour of minutes into an hour cell
    behind the first read and out of the second's reach, and the ledger would lose that hour for
    good (its saved counts then too). Compaction is put off while a fill reads, and runs after."""
    rng = random.Random(12)
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    stop = T0 + 3 * 3600 + 10
    for start in range(T0, stop, 600):
        end = min(start + 600, stop)
        feed([rt], rng, servers, start, end)
        rt.evaluate_slos(end - 1.0)
    if not with_saved:  # the whole period is counted
        with rt.store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM llmslo_slo_count_keys")
    rt.store.close()
    feed([], rng, servers, stop, stop + 5400)  # 90 minutes down: the first hours are due
    restart = stop + 5400 + 20
    rt = collector(tmp_path, db_url, live_from=restart)
    real, compacted = rt.store.read_rows, []

    def compacting(lo: int, hi: int, metrics: object = None, period: int | None = None):  # type: ignore[no-untyped-def]
        if period == MINUTE_SECONDS and not compacted:  # the hour cells read: the compaction job's turn
            compacted.append(rt.compact(restart + 30))
        return real(lo, hi, metrics=metrics, period=period)

    rt.store.read_rows = compacting  # type: ignore[method-assign]
    feed([rt], rng, servers, restart, restart + 120)
    now = restart + 119.0
    got = rt.evaluate_slos(now)
    rt.store.read_rows = real  # type: ignore[method-assign]
    assert compacted == [(0, 0)]  # put off
    assert rt.rules is not None
    want, _ = rt._evaluate_from_store(rt.rules, now)  # what is stored, read at once
    assert comparable(got) == comparable(want)
    minutes, _ = rt.compact(restart + 150)  # after the fill it runs
    assert minutes > 0
    rt.store.close()


def test_a_long_read_in_pieces_holds_compaction_off_until_it_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long readers (the report, cost, compare: `Runtime.read_spans`) read a large fleet's
    minutes a few at a time: a compaction while one is inside an hour due for it would take the
    rest of that hour's minutes away (its hour cell starts before the next piece). It is put off
    until the read is done."""
    rng = random.Random(3)
    rt = collector(tmp_path, f"sqlite:///{tmp_path / 'llmslo.db'}")
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    feed([rt], rng, servers, T0, T0 + 5 * 3600)
    monkeypatch.setattr(rt.store, "series_count", lambda: 24_000)  # 1,000 targets: 4-minute pieces

    def requests(rows: list[Row]) -> float:
        return sum(r.cell.cell.value for r in rows if r.cell.ident.key.metric == "request_success")

    whole = requests(rt.store.read_rows(T0, T0 + 5 * 3600))
    read, compactions = 0.0, []
    for i, rows in enumerate(rt.read_pieces(T0, T0 + 5 * 3600)):
        if i == 1:  # inside the first hour, which the compaction below is due to merge
            compactions.append(rt.compact(T0 + 5 * 3600 + 60))
        read += requests(rows)
    assert compactions == [(0, 0)] and whole > 0 and round(read, 6) == round(whole, 6)
    minutes, _ = rt.compact(T0 + 5 * 3600 + 60)  # the read done, it runs
    assert minutes > 0
    assert round(requests(rt.store.read_rows(T0, T0 + 5 * 3600)), 6) == round(whole, 6)
    rt.store.close()


def test_a_ring_absorbs_another_as_adding_each_of_its_slots_would() -> None:
    """Ring.absorb (arrays added where both rings reach) against adding the other ring's slots
    one by one, for rings that are empty, behind, level or ahead, and a slot number wrapped."""
    rng = random.Random(1)
    for _ in range(200):
        live, filled, want = Ring(60, 10), Ring(60, 10), Ring(60, 10)
        for minute in sorted(rng.sample(range(40), rng.randint(0, 6))):
            g, t = float(rng.randint(0, 5)), float(rng.randint(5, 9))
            filled.add(minute * 60, g, t)
        for minute in sorted(rng.sample(range(30, 60), rng.randint(0, 4))):
            g, t = float(rng.randint(0, 5)), float(rng.randint(5, 9))
            live.add(minute * 60, g, t)
            want.add(minute * 60, g, t)
        for n in filled.held():
            i = n % filled.slots
            want.add(n * 60, filled.good[i], filled.total[i])
        live.absorb(filled)
        assert live.latest == want.latest
        assert [live.sum(m * 60, m * 60 + 60) for m in range(60)] == [want.sum(m * 60, m * 60 + 60) for m in range(60)]
        assert live.dirty >= filled.dirty


def test_llmslo_db_recount_slos_forgets_the_saved_counts(tmp_path: Path) -> None:
    """`llmslo db recount-slos` (collectors stopped) makes the next start count the SLO period from
    the stored rollups; it refuses while a collector seems to be saving, unless forced."""
    rng = random.Random(6)
    db_url = f"sqlite:///{tmp_path / 'llmslo.db'}"
    rt = collector(tmp_path, db_url)
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    feed([rt], rng, servers, T0, T0 + 1200)
    rt.evaluate_slos(T0 + 1199.0)
    rt.store.close()
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"data_dir: {tmp_path}\ndatabase_url: {db_url}\n")
    cli = [sys.executable, "-m", "collector.cli", "db", "recount-slos", "--config", str(config)]
    # the saved counts end in the (virtual) future: as if a collector were saving right now
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "stop every collector" in refused.stderr, refused
    store = Store(db_url)
    assert len(saved_counts.load(store).fingerprint) == 10  # untouched: 8 objectives, 2 caches
    done = subprocess.run([*cli, "--force"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "forgot the saved SLO counts (10 keys" in done.stdout, done
    assert saved_counts.load(store) == saved_counts.Saved()
    store.close()
    rt = collector(tmp_path, db_url, live_from=T0 + 1230)
    feed([rt], rng, servers, T0 + 1230, T0 + 1500)
    rt.evaluate_slos(T0 + 1499.0)
    assert rt.slo_counts_resumed_from is None and rt.slo_backfill_rows > 0
    rt.store.close()
