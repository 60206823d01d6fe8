"""The running collector: settings, store, one scraper per target, and the derived snapshot.

The scheduler and the API both talk to this object; the work itself lives in plain functions
(`read_scrape`, `DeltaTracker`, `Store`, `build_report`) that tests call with an explicit `now`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import certifi
import httpx
from sqlalchemy.exc import SQLAlchemyError

from collector import conventions as conv
from collector import gcpolicy
from collector.analytics.histsums import Fold, OpenHistograms, SlidingHistograms
from collector.analytics.running import RunningWindows
from collector.analytics.serving import LazyGroups, ServingReport, TypeScalars, build_report, build_report_from_sums
from collector.cluster import FLEET, Cluster
from collector.config import Settings, TargetConfig
from collector.cost.allocation import (
    COST_METRICS,
    CostInputs,
    CostMeter,
    CostReport,
    Line,
    attribute,
    tenant_lines,
)
from collector.cost.capacity import CAPACITY_METRICS, Capacity, CapacityCounter
from collector.cost.inventory import Inventory
from collector.cost.slo import CostOf
from collector.drift.baseline import fetch as fetch_baseline
from collector.drift.compare import (
    COMPARE_METRICS,
    Comparison,
    Selector,
    SelectorError,
    Side,
    Tolerances,
    align_sketches,
    collect,
    collect_spans,
    compare_sides,
)
from collector.drift.monitor import DriftMonitor
from collector.drift.saved import SavedMinutes, mapping_fingerprint
from collector.fleetmap import FleetMap
from collector.rollup import (
    HOUR_SECONDS,
    MINUTE_SECONDS,
    Row,
    SeriesCell,
    SeriesIdent,
    hour_pieces,
    period_start,
    read_step,
)
from collector.slo import saved as saved_counts
from collector.slo.alerts import AlertBook, deliver, held_by
from collector.slo.evaluate import Events, PeriodCounter, SloStatus, evaluate, period_bounds
from collector.slo.incidents import (
    MemoryReading,
    TargetHealth,
    Wanted,
    cache_alerts,
    cache_alerts_from,
    drift_alerts,
    memory_alerts,
    target_alerts,
)
from collector.slo.ledger import SloLedger
from collector.slo.spec import Objective, SloRules, load_rules
from collector.sources.dcgm import USED_RATIO
from collector.sources.httpget import Target as HttpTarget
from collector.sources.scrape import TargetScraper, request_headers
from collector.sources.scrapeloop import ScrapeLoops
from collector.store.committer import GroupCommitter
from collector.store.repository import ScrapeCommit, Store, merge_into, merge_window
from collector.traces.rollup import RequestCell, RequestKey
from collector.traces.service import TraceIngest
from collector.traces.store import (
    compact_requests,
    expire_span_ids,
    first_request_unix,
    read_requests,
    request_volumes,
)
from collector.traces.summary import RequestSummary, summarize
from collector.windowcells import (
    Kept,
    PassView,
    add_open,
    open_cells,
    open_of,
    recent_of,
    reduce_closed,
    reduce_open,
    reduce_sliding,
    reduce_window,
    sliding_cells,
)

log = logging.getLogger(__name__)
P = ParamSpec("P")
# the logical engine metrics SLO evaluation reads
SLO_METRICS = (
    "ttft",
    "tpot",
    "itl",
    "e2e",
    "queue",
    "request_success",
    "generation_tokens",
    "prefix_cache_hits",  # the prefix-cache collapse ticket
    "prefix_cache_queries",
)


RECOUNT_STOP_SECONDS = 30.0  # how long shutdown waits for a recount to reach its next piece


class ShuttingDown(Exception):
    """A long read of the stored history (the SLO ledger's fill or recount, drift's reference
    build) stopped at its next piece because the process is shutting down (`Runtime.stop_reading`)."""


def window_bounds(now_unix: float, window_seconds: float) -> tuple[int, int]:
    """A window is the minute holding `now` plus the whole minutes before it: [start, end)."""
    end = period_start(now_unix) + MINUTE_SECONDS
    return end - int(window_seconds), end


@dataclass(slots=True)
class Snapshot:
    """Derived reports per configured window, refreshed on a schedule; read by /metrics."""

    computed_unix: float = 0.0
    reports: dict[float, ServingReport] = field(default_factory=dict)


@dataclass
class JobTimings:
    """Per periodic job: runs, total and last duration, when it last ran."""

    runs: dict[str, int] = field(default_factory=dict)
    total_seconds: dict[str, float] = field(default_factory=dict)
    last_seconds: dict[str, float] = field(default_factory=dict)
    last_unix: dict[str, float] = field(default_factory=dict)

    def record(self, job: str, seconds: float, now: float) -> None:
        self.runs[job] = self.runs.get(job, 0) + 1
        self.total_seconds[job] = self.total_seconds.get(job, 0.0) + seconds
        self.last_seconds[job] = seconds
        self.last_unix[job] = now


class Runtime:
    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or Store(settings.resolved_database_url, settings.database_wait)
        # One TLS context for every client (loading the CA bundle costs milliseconds and memory each).
        self.tls = ssl.create_default_context(cafile=certifi.where())
        self.client = httpx.AsyncClient(follow_redirects=False, trust_env=False, verify=self.tls)  # Alertmanager
        self.store_lock = asyncio.Lock()
        self.committer = GroupCommitter(self.store, self.store_lock, linger=settings.scrape.commit_linger)
        # sharded (collector/cluster.py), the targets of this collector's shard; the others are
        # still known (the fleet map, the cost inventory) but scraped by another collector
        self.scrapers: dict[str, TargetScraper] = {
            t.name: TargetScraper(t, settings, self.store, self._scrape_client(t), self.committer)
            for t in settings.targets
            if settings.cluster.scrapes(t.name)
        }
        self.loops = ScrapeLoops(list(self.scrapers.values()), self.tracked)
        # sharded, the serving views (the running windows, /api/v1/serving) are this shard's
        self.shard: frozenset[str] | None = frozenset(self.scrapers) if settings.cluster.name is not None else None
        # long windows of the serving view as running sums (collector/analytics/running.py); a
        # minute closes once its last scrapes can have committed; the open ones are in memory
        # (at most 55 s: the scrapers keep two minutes; a scrape slower than that which commits
        # later still lands in the store, but not in the running sums)
        grace = min(55.0, max([settings.target_timeout(t) for t in settings.targets] + [0.0]) + 5.0)
        # the business types' histograms of every window summed as scrapes commit
        # (collector/analytics/histsums.py): a derive pass merges no target's buckets
        self.fold = Fold(self.business_type_of)
        self.running = RunningWindows(
            [w for w in settings.windows if settings.sliding_horizon < w <= settings.retention.minute_rollups],
            self._closed_minutes,
            grace,
            self.fold,
        )
        self.sliding_histograms = SlidingHistograms(
            [w for w in settings.windows if w <= settings.sliding_horizon], settings.sliding_horizon
        )
        self.open_histograms = OpenHistograms()
        self.targets: dict[str, TargetConfig] = {t.name: t for t in settings.targets}
        self.snapshot = Snapshot()
        # called at the end of each derive pass, in its thread (the app renders /metrics' text)
        self.after_pass: list[Callable[[], None]] = []
        self.rules: SloRules | None = load_rules(settings.rules).rules if settings.rules else None
        self.fleet = FleetMap(settings.targets, self.rules)
        self.inventory = Inventory.from_settings(settings)
        # the cost-ceiling SLI prices slices with the inventory; without one it has no data
        self.cost_of: CostOf | None = self._slice_costs if self.inventory else None
        self.cost_meter = CostMeter()
        self.drift = (
            DriftMonitor(
                settings.drift,
                self._drift_rows,
                self._drift_requests,
                lambda lo, hi: request_volumes(self.store, lo, hi),
                self.business_type_of,
                settings.traces.top_tenants,
                lambda name: fetch_baseline(self.store, name),
                self.open_rows,
                SavedMinutes(self.store, settings.cluster.name or "", mapping_fingerprint(settings.targets, self.rules))
                if settings.drift.reference == "trailing"
                else None,
            )
            if settings.drift.enabled
            else None
        )
        self.memory_high_since: dict[str, float] = {}  # deployment -> when its memory went above the threshold
        self.slo_metrics = tuple(sorted({*SLO_METRICS, *COST_METRICS})) if self.inventory else SLO_METRICS
        # SLO events kept incrementally as scrapes and spans commit (collector/slo/ledger.py)
        self.ledger = (
            SloLedger(self.rules, self.business_type_of, settings.retention.minute_rollups, self.cost_of)
            if self.rules
            else None
        )
        for scraper in self.scrapers.values():
            scraper.on_commit = self._committed
        self.alerts = AlertBook(self.store)
        # sharded collectors on one PostgreSQL database (collector/cluster.py)
        self.cluster: Cluster | None = None
        if self.ledger is not None and settings.cluster.name is None:
            self.ledger.keep_recent()  # saved counts keep the open slices' parts (collector/slo/saved.py)
        if settings.cluster.name is not None:
            self.cluster = Cluster(self.store, settings.resolved_database_url, settings.cluster.name)
            self.alerts.fleet_owner, self.alerts.local_owner = FLEET, settings.cluster.name
            self.alerts.owners = frozenset({settings.cluster.name})  # the fleet's once elected
            if self.ledger is not None:
                self.ledger.share(settings.cluster.settle)
        self.slo_statuses: list[SloStatus] = []
        # the ledger's first fill: where the saved counts ended (None: counted from the rollups
        # alone), how many rollup rows it read, and whether the next save replaces every count
        self.slo_counts_resumed_from: int | None = None
        self.slo_backfill_rows = 0
        self.slo_fill_seconds = 0.0
        self.slo_fill_failed = False
        self.drift_waiting = False  # drift's pass was put off for the fill (`drift_waits`), which is not done
        self.slo_counts_saved_through: int | None = None  # the last save's end
        self._replace_saved_counts = False
        # changed objectives counted again after the first pass (`recount`): its thread, what was
        # stored of the minute live counting started in, and how long the last one took
        self.recount_thread: threading.Thread | None = None
        self._recount_start: tuple[Sequence[Row], Sequence[tuple[RequestKey, RequestCell]]] = ((), ())
        self.slo_recount_seconds: float | None = None
        self.slo_recount_rows = 0
        # set at shutdown: the long history reads stop at their next piece (`ShuttingDown`), or a
        # stop during a first start's fill would wait for it (at fleet size, many minutes)
        self.stopping = threading.Event()
        self.traces = TraceIngest(self)
        self.request_snapshot: dict[tuple[float, str, str], RequestSummary] = {}
        self.started = False
        self.closed_from_memory = 0  # closed minutes the running windows took from the scrapers' memory
        self.inflight: set[asyncio.Task[object]] = set()
        self.job_timings = JobTimings()
        # the fleet view's encodes by when they ran ("ahead", "on_request"): count, seconds
        self.view_encodes: dict[str, list[float]] = {"ahead": [0, 0.0], "on_request": [0, 0.0]}
        # the switch interval while a pass computes (collector/gcpolicy.py)
        self.pass_switching = gcpolicy.PassSwitching(settings.server.pass_switch_interval)

    def _committed(self, target: str, item: ScrapeCommit) -> None:
        """A scrape of `target` is stored: the SLO ledger and the histogram sums count it."""
        deltas = item.deltas
        if self.ledger is not None:
            self.ledger.add_engine(target, deltas)
        flat = self.fold.flat(target, deltas.cells)
        self.sliding_histograms.add(target, deltas.unix, flat)
        self.open_histograms.add(deltas.minute, flat, item.read_stored)

    async def start(self) -> None:
        """Register every target and resume its state (one bad target does not stop the others)."""
        await asyncio.to_thread(self.alerts.load)
        await asyncio.to_thread(self.begin_live_counting, time.time())
        for scraper in self.scrapers.values():
            try:
                await scraper.load()
            except Exception:
                log.exception(
                    "could not load state of target %s; it will retry on its first scrape",
                    scraper.target.name,
                )
        self.started = True

    def tracked(self, job: Callable[P, Awaitable[None]], name: str | None = None) -> Callable[P, Awaitable[None]]:
        """Wrap a scheduled job so that shutdown can wait for it instead of cancelling it mid-write
        (and, given a `name`, time it for /metrics)."""

        async def run(*args: P.args, **kwargs: P.kwargs) -> None:
            task = asyncio.current_task()
            if task is not None:
                self.inflight.add(task)
            started = time.perf_counter()
            try:
                await job(*args, **kwargs)
            except asyncio.CancelledError:
                # shutdown stopped waiting for it (`drain`'s limit passed on a loaded machine): say
                # so in a line, not a scheduler traceback; a worker thread it started ends on its own
                log.warning("%s was still running at shutdown and was not waited for", name or "a scheduled job")
            finally:
                if task is not None:
                    self.inflight.discard(task)
                # how long each periodic job took (wall time, its worker thread included), for
                # /metrics: a derive pass near its interval means the collector is near its limit
                if name is not None:
                    self.job_timings.record(name, time.perf_counter() - started, time.time())

        return run

    def background(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` beside the request that asked for it (a report's deliveries); shutdown
        waits for it like a scheduled job."""
        task = asyncio.get_running_loop().create_task(work)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return task

    async def drain(self) -> None:
        """Let in-flight jobs finish (each scrape is bounded by its timeout)."""
        if self.inflight:
            limit = max([self.settings.target_timeout(t) for t in self.settings.targets] + [1.0]) + 5.0
            await asyncio.wait(set(self.inflight), timeout=limit)

    async def write_unwritten(self) -> None:
        """Write what the scrapers counted in memory and have not written yet (minute writes,
        collector/sources/scrape.py), in one group commit: at shutdown, after the last scrapes."""
        await asyncio.gather(*(s.write_unwritten() for s in self.scrapers.values() if s.unwritten is not None))

    def _scrape_client(self, target: TargetConfig) -> HttpTarget:
        """A kept connection per target, as Prometheus keeps one (collector/sources/httpget.py)."""
        return HttpTarget(target.url, request_headers(self.settings.target_timeout(target)), self.tls)

    def stop_reading(self) -> None:
        """Shutdown begins: the long history reads under way stop at their next piece."""
        self.stopping.set()

    def check_stopping(self) -> None:
        """Raise `ShuttingDown` once shutdown has begun (the long history reads, before each piece)."""
        if self.stopping.is_set():
            raise ShuttingDown

    def _drift_rows(self, lo: int, hi: int, metrics: Sequence[str]) -> list[Row]:
        self.check_stopping()
        return self.store.read_rows(lo, hi, metrics=metrics)

    def _drift_requests(
        self, lo: int, hi: int, tenants: Collection[str] | None
    ) -> list[tuple[RequestKey, RequestCell]]:
        self.check_stopping()
        return read_requests(self.store, lo, hi, tenants=tenants)

    async def close(self) -> None:
        self.stop_reading()
        await self.drain()
        recount = self.recount_thread
        if recount is not None:  # it stops at its next piece; not saved, it is counted at the next start
            await asyncio.to_thread(recount.join, RECOUNT_STOP_SECONDS)
        await self.write_unwritten()
        try:  # the counts of the minutes closed since the last pass: a restart reads them back
            await asyncio.to_thread(self.save_slo_counts, self.now())
        except Exception:
            log.exception("saving the SLO counts at shutdown failed")
        await self.client.aclose()
        if self.cluster is not None:
            self.cluster.close()  # hands the elected evaluator's lock on at once
        for scraper in self.scrapers.values():
            if scraper.client is not None:
                await scraper.client.aclose()
        self.store.close()

    def begin_live_counting(self, now_unix: float) -> None:
        """The SLO ledger counts the commits from `now` on as they land (blocking). Run before
        the first commit: what an earlier process stored of this minute is read now, for the
        backfill (sharded, that process' counts come from what it published instead)."""
        ledger = self.ledger
        if ledger is None:
            return
        ledger.live_since = now_unix
        if self.cluster is not None:
            return
        try:
            ledger.hold_start_minute(
                lambda lo, hi, period: self.store.read_rows(lo, hi, metrics=self.slo_metrics, period=period),
                lambda lo, hi, period: read_requests(self.store, lo, hi, period),
            )
        except SQLAlchemyError as exc:
            log.warning("could not read the stored part of the minute this collector started in (%s): "
                        "the SLO counts of that minute lack what an earlier process stored of it", exc)  # fmt: skip

    def business_type_of(self, target: str, model: str) -> str | None:
        """The fleet map's answer (collector/fleetmap.py): the target configuration, then the rules."""
        return self.fleet.business_type_of(target, model)

    def evaluate_slos(self, now_unix: float) -> list[SloStatus]:
        """Evaluate every SLO and advance the alert lifecycle (blocking).

        While serving, from the incremental ledger (filled from the store once, on the first pass);
        for a `now` the ledger has not seen live (tests, the fast-clock simulator), by re-reading
        the period's rollups."""
        if self.rules is None:
            return []
        ledger = self.ledger
        if ledger is not None and ledger.covers(now_unix):
            if not ledger.ready:
                try:
                    self._fill_ledger(ledger, now_unix)
                except ShuttingDown:
                    raise
                except Exception:
                    self.slo_fill_failed = True  # drift's first build waits no longer (`drift_waits`)
                    raise
            if self.cluster is not None:
                self._sync_cluster(ledger)
            # before the statuses: a recount ending in between must not leave an alert unheld whose
            # status was still the recount's "no data" (it would resolve, and page again next pass)
            pending, _ = ledger.save_state()
            statuses = ledger.statuses(now_unix)
            counted = [bt for bt in ledger.cache if "cache:" + bt not in pending]
            incidents = cache_alerts_from(self.rules, now_unix, counted, ledger.cache_sums)
            self.save_slo_counts(now_unix)
            if pending:
                self.start_recount(now_unix)
        else:
            pending = frozenset()
            statuses, incidents = self._evaluate_from_store(self.rules, now_unix)
        if self.drift is not None:
            incidents |= drift_alerts(self.rules, self.drift.latest, self.settings.drift.severity)
        # the alerts of this collector's own targets: sharded, each collector keeps its own
        local = target_alerts(self.rules, self.target_health(), now_unix)
        local |= memory_alerts(self.rules, self.memory_readings(now_unix), self.memory_high_since, now_unix)
        # an objective (or cache) counted again keeps the alerts it had until its count is back
        self.alerts.apply(self.rules, statuses, now_unix, incidents=incidents, local=local, hold=held_by(pending))
        self.slo_statuses = statuses
        return statuses

    def drift_waits(self, now_unix: float) -> bool:
        """Whether drift's pass waits for the SLO ledger's first fill: both read the stored
        history (on a first start at fleet size, every SLO rollup of the period and a day of engine
        minutes); read side by side, they compete for one interpreter and each takes as long as
        both in a row, so the SLO status (and its pages) came only when drift's build was done
        too. A fill that failed is not waited for."""
        ledger = self.ledger
        return ledger is not None and ledger.covers(now_unix) and not ledger.ready and not self.slo_fill_failed

    @property
    def saves_slo_counts(self) -> bool:
        """Whether the ledger's counts are saved in the store (collector/slo/saved.py)."""
        ledger = self.ledger
        return ledger is not None and ledger.slot == MINUTE_SECONDS

    def _count_fingerprints(self) -> dict[str, str]:
        assert self.rules is not None
        prices = sorted(self.inventory.deployments.items()) if self.inventory else None
        return saved_counts.fingerprints(self.rules, prices)

    def _fill_ledger(self, live: SloLedger, now_unix: float) -> None:
        """The ledger's first pass: the saved counts read back, and the stored rollups counted
        from where they end (all of the SLO period when there are none to use), into a ledger of
        their own that the live one takes over once it is filled (`SloLedger.absorb`).

        Keys whose definition changed since their counts were saved (`saved_counts.fingerprints`)
        are left out of this fill when the other keys' saves can be used: those have their
        status at once, and the changed ones are counted again from the whole period's rollups
        after it, in the background (`recount`), with no status until then."""
        started = time.perf_counter()
        assert self.rules is not None and live.live_since is not None
        log.info("SLO ledger: filling from the saved counts and the stored rollups (no SLO status until it ends)")
        rows_read = [0]
        resume: int | None = None
        judged_before: int | None = None  # the saved slices' end of judging (collector/slo/saved.py)
        stale: set[str] = set()
        saved: saved_counts.Saved | None = None
        with_slices = False
        if self.saves_slo_counts:
            try:
                saved = saved_counts.load(self.store, self.settings.cluster.name or "")
                wanted = self._count_fingerprints()
                stale = live.recount_group(saved_counts.changed(saved, wanted))
                kept = {k: fp for k, fp in wanted.items() if k not in stale}
                found = saved_counts.resume_from(
                    saved,
                    kept,
                    period_start(live.live_since),
                    math.lcm(MINUTE_SECONDS, *live.slice_sizes()),
                    int(self.settings.retention.minute_rollups),
                )
                if found is None:
                    stale = set()
                    if saved.fingerprint:
                        log.info("the saved SLO counts were counted for other rules: counting the stored rollups again")
                else:
                    resume, with_slices = found
            except SQLAlchemyError as exc:
                log.warning("could not read the saved SLO counts (%s): counting the stored rollups again", exc)
                resume, stale, saved = None, set(), None
        ledger = self._filling_ledger(live, None if resume is None else set(live.count_keys()) - stale)
        if resume is not None and saved is not None:
            ledger.restore(saved.rows, saved.exact, resume)
            if with_slices:  # the open slices as the save left them: their later part comes next
                ledger.add_published(p for p in saved.slices if _slice_counted(ledger, p.key))
                judged_before = saved.through.get(saved_counts.JUDGED)
        self._backfill(ledger, now_unix, resume, rows_read)
        if judged_before is not None and resume is not None:
            ledger.drop_judged(resume, judged_before)
        self.slo_counts_resumed_from = resume
        self.slo_backfill_rows = rows_read[0]
        if resume is None:
            ledger.touch_all()  # the next save writes every count, in place of what was there
        if stale:
            # the stored part of the minute live counting started in: the recount's too
            self._recount_start = (live.start_rows, live.start_requests)
            with live.lock:
                live.pending = set(stale)
            log.info(
                "SLO objectives changed since their counts were saved (%s): counting them again from the "
                "stored rollups after the first pass; the others resume from their saved counts",
                ", ".join(sorted(stale)),
            )
        live.absorb(ledger)
        self._replace_saved_counts = resume is None
        self.slo_fill_seconds = time.perf_counter() - started
        log.info(
            "SLO ledger filled in %.1f s: %s, then %d stored rollup rows",
            self.slo_fill_seconds,
            f"saved counts up to {time.strftime('%Y-%m-%d %H:%M', time.gmtime(resume))}" if resume else "nothing saved",
            rows_read[0],
        )

    def _filling_ledger(self, live: SloLedger, only: Collection[str] | None) -> SloLedger:
        """An empty ledger of the live one's rules (of its keys `only`), to be filled from the
        store and absorbed."""
        assert self.rules is not None
        ledger = SloLedger(
            self.rules, self.business_type_of, self.settings.retention.minute_rollups, self.cost_of, only=only
        )
        ledger.live_since = live.live_since
        ledger.start_rows, ledger.start_requests = live.start_rows, live.start_requests
        return ledger

    def _backfill(
        self,
        ledger: SloLedger,
        now_unix: float,
        resume: int | None,
        rows_read: list[int],
        metrics: Sequence[str] | None = None,
    ) -> None:
        """Fill `ledger` from the store (`SloLedger.backfill`), reading `metrics`' rollups (the
        SLO series by default); compaction waits meanwhile (`Store.history_fill`: the fill reads
        the hour cells, then the minutes)."""
        chosen = self.slo_metrics if metrics is None else metrics

        def read_rows(lo: int, hi: int, period: int) -> list[Row]:
            self.check_stopping()
            rows = self.store.read_rows(lo, hi, metrics=chosen, period=period)
            rows_read[0] += len(rows)
            return rows

        def read_cells(lo: int, hi: int, period: int) -> list[tuple[RequestKey, RequestCell]]:
            self.check_stopping()
            return read_requests(self.store, lo, hi, period)

        # where minutes are kept, a few at a time at fleet size (read_spans' pieces: an hour of 300
        # targets' SLO rows took the fill from 222 to 409 MiB)
        with self.store.history_fill():
            ledger.backfill(
                read_rows,
                read_cells,
                now_unix,
                resume,
                read_step(self.store.series_count()),
                self.minutes_kept_from(now_unix),
            )

    def recount(self, now_unix: float) -> None:
        """Count the ledger's pending keys (changed objectives) again from the stored rollups of
        the whole period, and hand them to the live ledger (blocking; the first pass starts it
        in the background: `start_recount`). A failure leaves them pending for the next pass."""
        live = self.ledger
        if live is None:
            return
        keys, _ = live.save_state()
        if not keys:
            return
        started = time.perf_counter()
        ledger = self._filling_ledger(live, keys)
        ledger.start_rows, ledger.start_requests = self._recount_start
        rows_read = [0]
        # the changed objectives' own series: a TTFT threshold reads the TTFT histograms alone
        metrics = sorted(ledger.engine_metrics() & {*self.slo_metrics})
        self._backfill(ledger, now_unix, None, rows_read, metrics)
        live.absorb(ledger, recounted=True)
        self._recount_start = ((), ())
        self.slo_recount_seconds = time.perf_counter() - started
        self.slo_recount_rows = rows_read[0]
        log.info(
            "SLO objectives %s counted again in %.1f s from %d stored rollup rows",
            ", ".join(sorted(keys)),
            self.slo_recount_seconds,
            rows_read[0],
        )

    def start_recount(self, now_unix: float) -> None:
        """Run `recount` in a thread of its own, unless one runs: the SLO passes go on meanwhile."""
        if self.recount_thread is not None and self.recount_thread.is_alive():
            return

        def run() -> None:
            try:
                self.recount(now_unix)
            except ShuttingDown:
                log.info("counting the changed SLO objectives again stopped at shutdown; the next start counts them")
            except Exception:
                log.exception("counting the changed SLO objectives again failed; the next pass tries again")

        self.recount_thread = threading.Thread(target=run, name="llmslo-slo-recount", daemon=True)
        self.recount_thread.start()

    def save_slo_counts(self, now_unix: float) -> None:
        """Save the ledger's slots that closed since the last save (blocking; after a pass, and
        at shutdown). A failed save is tried again with the next pass."""
        ledger = self.ledger
        if ledger is None or not ledger.ready or not self.saves_slo_counts:
            return
        # the slices that ended are judged first (at shutdown no pass has yet): a save must not
        # pass a slice still open, whose traffic so far only the ledger's memory holds
        ledger.close_slices(now_unix)
        through = min(period_start(now_unix - self.running.grace), ledger.closed_before)
        # changed objectives still being counted again are not saved (a restart counts them again
        # too); once counted, their rows replace what their old definition saved
        pending, fresh = ledger.save_state()
        rows = ledger.take_closed(through, skip=pending)
        slices = ledger.settled_slices(through)
        keep_minutes = through - int(self.settings.retention.minute_rollups) - 2 * HOUR_SECONDS
        keep_hours = through - (max(c.hours.slots for c in ledger.count_keys().values()) + 1) * HOUR_SECONDS
        try:
            saved_counts.save(
                self.store,
                rows,
                ledger,
                self._count_fingerprints(),
                through,
                keep_minutes,
                keep_hours,
                replace=self._replace_saved_counts,
                owner=self.settings.cluster.name or "",
                slices=slices,
                skip=pending,
                replace_keys=fresh,
            )
            ledger.saved_fresh(fresh)
            self._replace_saved_counts = False
            self.slo_counts_saved_through = through
        except SQLAlchemyError as exc:
            ledger.untake(rows)
            log.warning("could not save the SLO counts (%s); trying again with the next pass", exc)

    def _sync_cluster(self, ledger: SloLedger) -> None:
        """Exchange SLO counts with the other collectors and take on (or give up) the fleet's
        alerts with the elected evaluator's lock."""
        assert self.cluster is not None
        own = self.settings.cluster.name or ""
        leader = self.cluster.sync(ledger)
        self.alerts.set_owners(frozenset({own, FLEET, ""}) if leader else frozenset({own}))

    @property
    def exports_slo_status(self) -> bool:
        """Whether /metrics carries the SLO status series: sharded, only the elected evaluator's
        (every collector's ledger holds the same fleet, and one copy is what a dashboard wants)."""
        return self.cluster is None or self.cluster.leader

    def _evaluate_from_store(self, rules: SloRules, now_unix: float) -> tuple[list[SloStatus], Wanted]:
        start, end = period_bounds(rules, now_unix)
        rows = self.store.read_rows(start, end, metrics=self.slo_metrics)
        requests = read_requests(self.store, start, end)
        statuses = evaluate(rules, rows, now_unix, requests, self.business_type_of, self.cost_of)
        return statuses, cache_alerts(rules, rows, now_unix, self.business_type_of)

    def slo_attainment(
        self, start_unix: int, end_unix: int, cuts: Sequence[int] = ()
    ) -> tuple[list[tuple[Objective, Events]], list[list[Events]]]:
        """Every objective's events over the closed period [start, end) and per piece between
        `cuts` (default: whole days from `start`), each piece counted from its rows a few minutes
        or an hour at a time (`read_spans`, `PeriodCounter`), so that memory grows neither with
        the period nor with the fleet's rows per piece. The period's events are the sum of its pieces' (blocking)."""
        if self.rules is None:
            return [], []
        bounds = sorted({start_unix, end_unix, *(c for c in cuts if start_unix < c < end_unix)})
        if not cuts:
            bounds = [*range(start_unix, end_unix, 86400), end_unix]
        # a piece that ends before the oldest stored cell has no events: not read (a period from
        # 1970 is 20,000 days, each two queries)
        first = self.first_stored_unix()
        objectives = [o for bt in self.rules.business_types for o in bt.objectives]
        pieces: list[list[Events]] = []
        for lo, hi in itertools.pairwise(bounds):
            counter = PeriodCounter(self.rules, lo, hi, self.business_type_of, self.cost_of)
            for a, b in self.read_spans(lo, hi, first):
                counter.add(self.store.read_rows(a, b, metrics=self.slo_metrics), self.piece_requests(a, b, lo, hi))
            pieces.append([e for _, e in counter.events()])
        totals = [Events(0.0, 0.0) for _ in objectives]
        for piece in pieces:
            totals = [t.plus(e) for t, e in zip(totals, piece, strict=True)]
        return list(zip(objectives, totals, strict=True)), pieces

    def first_stored_unix(self) -> int | None:
        """The start of the oldest stored cell, engine or request (None: nothing stored)."""
        firsts = [t for t in (self.store.first_unix(), first_request_unix(self.store)) if t is not None]
        return min(firsts, default=None)

    def memory_readings(self, now_unix: float) -> list[MemoryReading]:
        """Per deployment of the inventory, from each target's last scrape (if recent): the
        highest GPU framebuffer ratio its DCGM exporters report, else the highest KV-cache usage
        of its vLLM servers. The DCGM threshold sits 5 points above the deployment's
        gpu_memory_utilization (what vLLM reserves anyway), and at least at the KV threshold."""
        if self.rules is None or self.rules.thresholds.kv_cache_usage is None:
            return []
        kv_threshold = self.rules.thresholds.kv_cache_usage
        out = []
        for d in self.inventory.deployments.values():
            best: dict[str, tuple[float, str]] = {}
            for name in d.targets:
                scraper = self.scrapers.get(name)
                if scraper is None or not scraper.recent or not scraper.status.up:
                    continue
                last = scraper.recent[-1]
                if now_unix - last.unix > 2 * scraper.interval + 5:
                    continue  # stale
                for ident, cell in last.cells.items():
                    metric = ident.key.metric
                    source = "dcgm" if metric == USED_RATIO else "kv_cache" if metric == "kv_cache_usage" else None
                    if source is None or not cell.n:
                        continue
                    where = f"{name} {ident.key.model}" if source == "dcgm" else name
                    if source not in best or cell.glast > best[source][0]:
                        best[source] = (cell.glast, where)
            if "dcgm" in best:
                threshold = round(min(0.99, max(kv_threshold, d.config.gpu_memory_utilization + 0.05)), 4)
                out.append(MemoryReading(d.name, "dcgm", best["dcgm"][0], threshold, best["dcgm"][1]))
            elif "kv_cache" in best:
                out.append(MemoryReading(d.name, "kv_cache", best["kv_cache"][0], kv_threshold, best["kv_cache"][1]))
        return out

    def target_health(self) -> list[TargetHealth]:
        """Each target's state for the incident alerts, with the business types it serves."""
        out = []
        for name, scraper in self.scrapers.items():
            st = scraper.status
            cfg = self.targets[name]
            types = {self.business_type_of(name, m) for m in st.models}
            types |= {cfg.business_type, *cfg.models.values()}
            types.discard(None)
            out.append(
                TargetHealth(name, frozenset(t for t in types if t), st.up, st.down_since_unix, st.last_restart_unix)
            )
        return out

    async def deliver_alerts(self, now_unix: float) -> int:
        if self.rules is None or not self.rules.alertmanager_url:
            return 0
        return await deliver(
            self.alerts,
            self.client,
            self.rules.alertmanager_url,
            now_unix,
            self.rules.resend_interval_seconds,
            self.rules.alertmanager_timeout_seconds,
        )

    def report(
        self,
        window_seconds: float,
        now_unix: float,
        target: str | None = None,
        model: str | None = None,
        business_type: str | None = None,
        lazy_groups: bool = False,
    ) -> ServingReport:
        """Derived serving metrics over one window (blocking: may read the database; see
        `window_cells`); with `lazy_groups`, the (target, model) groups are derived when first read."""
        start, end = self.window_span(window_seconds, now_unix)
        cells = self.window_cells(window_seconds, now_unix, target, model)
        return build_report(cells, window_seconds, start, end, self.business_type_of, business_type, lazy_groups)

    def window_span(self, window_seconds: float, now_unix: float) -> tuple[int, int]:
        """[start, end) of a window at `now`: a sliding window ends now, a longer one with the
        minute holding `now` (`window_bounds`)."""
        if window_seconds <= self.settings.sliding_horizon:
            return int(now_unix - window_seconds), int(now_unix)
        return window_bounds(now_unix, window_seconds)

    def report_between(
        self,
        start_unix: int,
        end_unix: int,
        target: str | None = None,
        model: str | None = None,
        business_type: str | None = None,
    ) -> ServingReport:
        """Derived serving metrics over any past period, merged from the stored rollups an hour
        at a time (`read_pieces`)."""
        merged: dict[tuple[str, SeriesIdent], SeriesCell] = {}
        for rows in self.read_pieces(start_unix, end_unix, target=target, model=model):
            merge_into(merged, rows, end_unix)
        cells = list(merged.values())
        seconds = max(60, end_unix - start_unix)
        return build_report(cells, seconds, start_unix, end_unix, self.business_type_of, business_type)

    def pass_view(self, now_unix: float) -> PassView:
        """What the windows hold at `now`, kept for the (target, model) groups derived later."""
        closed = {w: v for w in self.running.windows if (v := self.running.view(w, now_unix)) is not None}
        from_minute = min((v.closed_end for v in closed.values()), default=None)
        return PassView(
            now_unix,
            recent_of(self.scrapers),
            closed,
            open_of(self.scrapers, from_minute) if from_minute is not None else [],
        )

    def pass_report(self, window_seconds: float, now_unix: float, view: PassView | None = None) -> ServingReport:
        """The whole fleet's report over one configured window, as a derive pass publishes it:
        the business types from the histogram sums and the counters and gauges of each series,
        the (target, model) groups when first read, from the `view` the pass took. Where the sums
        cannot answer (a `now` they have not seen, a minute read back from the store) the report
        merges every series."""
        report = self.report_from_sums(window_seconds, now_unix, view)
        return report if report is not None else self.report(window_seconds, now_unix, lazy_groups=True)

    def report_from_sums(
        self, window_seconds: float, now_unix: float, view: PassView | None = None
    ) -> ServingReport | None:
        """`pass_report` from the histogram sums, or None where they cannot answer."""
        w = window_seconds
        seen = view if view is not None else self.pass_view(now_unix)
        if w <= self.settings.sliding_horizon:
            sums = self.sliding_histograms.sums(w, now_unix)
            if sums is None:
                return None
            scalars = TypeScalars(self.business_type_of)
            reduce_sliding(scalars, seen.recent, now_unix, w)
        else:
            closed_sums = self.running.closed_histograms(w, now_unix)
            closed = seen.closed.get(int(w))
            if closed_sums is None or closed is None or closed_sums[0] != closed.closed_end:
                return None
            sums = closed_sums[1]
            open_sums = self.open_histograms.since(closed.closed_end)
            if open_sums is None:
                return None
            sums.plus(open_sums)
            scalars = TypeScalars(self.business_type_of)
            reduce_window(scalars, reduce_closed(closed), reduce_open(seen, closed.closed_end))
        start, end = self.window_span(w, now_unix)
        return build_report_from_sums(
            scalars,
            sums.by_business_type(),
            w,
            start,
            end,
            self.business_type_of,
            lambda: self.window_cells(w, now_unix, view=seen),
        )

    def window_cells(
        self,
        window_seconds: float,
        now_unix: float,
        target: str | None = None,
        model: str | None = None,
        view: PassView | None = None,
    ) -> list[SeriesCell]:
        """Every series' cells of the window at `now` (as the pass that took `view` saw them),
        merged per series (blocking: may read the database). Windows up to `sliding_horizon`
        slide over the scrapes of the last `window_seconds` (in memory). Longer configured windows
        are the running sums of their closed minutes plus the open minutes the scrapers keep in
        memory; any other window merges stored minute rollups."""
        if window_seconds <= self.settings.sliding_horizon:
            recent = view.recent if view is not None else recent_of(self.scrapers, target)
            return sliding_cells(recent, now_unix, window_seconds, target, model)
        closed = (
            view.closed.get(int(window_seconds)) if view is not None else self.running.view(window_seconds, now_unix)
        )
        if closed is None:
            start, end = window_bounds(now_unix, window_seconds)
            return merge_window(self.read_rows(start, end, target=target, model=model, targets_in=self.shard), end)
        merged = closed.copies_by_ref()  # copies: the open minutes are merged into them
        if target is not None or model is not None:
            merged = {
                ref: sc
                for ref, sc in merged.items()
                if (target is None or sc.target == target) and (model is None or sc.ident.key.model == model)
            }
        kept = view.open if view is not None else open_of(self.scrapers, closed.closed_end, target)
        add_open(merged, kept, closed.closed_end, target, model)
        return list(merged.values())

    def sliding_cells(
        self, now_unix: float, window_seconds: float, target: str | None = None, model: str | None = None
    ) -> list[SeriesCell]:
        """Every series' deltas from the scrapes in (now - window, now], merged per target."""
        return sliding_cells(recent_of(self.scrapers, target), now_unix, window_seconds, target, model)

    def open_cells(self, from_minute: int, target: str | None = None, model: str | None = None) -> list[SeriesCell]:
        """The stored cells of the minutes from `from_minute` on that the scrapers keep in memory
        (the minute being written and the one before it)."""
        return open_cells(open_of(self.scrapers, from_minute, target), from_minute, target, model)

    def open_rows(self, start: int, end: int, metrics: frozenset[str]) -> list[Row] | None:
        """The stored cells of `metrics` in the minutes of [start, end) the scrapers keep in
        memory (the minute being written and the one before), as rows; None when memory cannot
        answer: not serving (no scraper has committed in this process), or a minute before those."""
        if not self.started or start < period_start(time.time()) - MINUTE_SECONDS:
            return None
        return self._kept_rows(start, end, metrics)[0]

    def _kept_rows(
        self,
        start: int,
        end: int,
        metrics: frozenset[str] | None,
        target: str | None = None,
        model: str | None = None,
        targets_in: Collection[str] | None = None,
        copy: bool = False,
    ) -> tuple[list[Row], set[tuple[str, int]]]:
        """The cells the scrapers keep in memory for the minutes of [start, end) (of `metrics`,
        else every series), as rows (copies with `copy`: the scrapers' own are never changed),
        and the (target, minute) pairs memory answers for, cells or not."""
        out: list[Row] = []
        covered: set[tuple[str, int]] = set()
        for name, scraper in list(self.scrapers.items()):
            if (target is not None and name != target) or (targets_in is not None and name not in targets_in):
                continue
            units = scraper.units
            chosen = scraper.series_of(metrics) if metrics is not None else list(scraper.idents.items())
            for minute, by_sid in scraper.open_minute.kept(start):
                if minute >= end:
                    continue
                covered.add((name, minute))
                for sid, ident in chosen:
                    cell = by_sid.get(sid)
                    if cell is not None and (model is None or ident.key.model == model):
                        sc = SeriesCell(name, ident, units.get(ident.key, ""), cell.copy() if copy else cell)
                        out.append(Row(minute, MINUTE_SECONDS, sc))
        return out, covered

    def _closed_minutes(self, start: int, end: int) -> list[SeriesCell]:
        """The running windows' read of the minutes of [start, end) once closed: while serving,
        a single minute is taken from the memory of the scrapers that still keep it (the one that
        just closed), the others' from the store; older minutes from the store."""
        if end - start != MINUTE_SECONDS:
            return self.store.read_window(start, end, targets_in=self.shard)
        if not self.started:
            return self.store.read_minute(start, targets_in=self.shard)
        kept: Kept = []
        missing: list[str] = []  # a scraper still in that minute, or that no longer keeps it
        for name, scraper in list(self.scrapers.items()):
            cells = scraper.open_minute.cells_of(start)
            if cells is None:
                missing.append(name)
            else:
                kept.append((name, scraper.idents, scraper.units, [(start, cells)]))
        if len(missing) == len(self.scrapers):
            return self.store.read_minute(start, targets_in=self.shard)
        self.closed_from_memory += 1
        out = open_cells(kept, start)
        if missing:
            out.extend(self.store.read_minute(start, targets_in=missing))
        return out

    def read_rows(
        self,
        start: int,
        end: int,
        metrics: Iterable[str] | None = None,
        target: str | None = None,
        model: str | None = None,
        targets_in: Collection[str] | None = None,
    ) -> list[Row]:
        """The stored rows of [start, end), with the minutes this collector's scrapers keep in
        memory taken from there: a minute's rows are written with its last scrape (minute writes,
        collector/sources/scrape.py), so the store lags the minute running. A scraper keeps its
        last two minutes as stored plus what it has not written (`OpenMinute`)."""
        rows = self.store.read_rows(start, end, metrics=metrics, target=target, model=model, targets_in=targets_in)
        wanted = frozenset(metrics) if metrics is not None else None
        kept, covered = self._kept_rows(start, end, wanted, target, model, targets_in, copy=True)
        out = [r for r in rows if r.period_seconds != MINUTE_SECONDS or (r.cell.target, r.start_unix) not in covered]
        return out + kept

    def read_pieces(
        self,
        start: int,
        end: int,
        metrics: Iterable[str] | None = None,
        target: str | None = None,
        model: str | None = None,
    ) -> Iterator[list[Row]]:
        """`read_rows` of [start, end) a piece at a time (`read_spans`: an hour of compacted
        cells, a few minutes of minute cells), for readers that add the rows up as they come (a
        report of a week, the cost of a month): what they hold at once is about READ_CELLS of the
        fleet's cells, not the period's (a day of 1,000 targets' minutes is 34 million). Hours
        before the oldest stored or kept cell are not read (a period from 1970 is not 490,000
        queries)."""
        for lo, hi in self.read_spans(start, end, self._first_engine_unix()):
            yield self.read_rows(lo, hi, metrics=metrics, target=target, model=model)

    def read_spans(self, start: int, end: int, first: int | None) -> Iterator[tuple[int, int]]:
        """[start, end) cut where the readers of long periods read (`read_pieces`, the report):
        at the hours of the clock (compacted hours: one cell per series each), and where the
        store keeps minutes (the minute-rollup retention to now, with an hour's margin) every few
        minutes, as many as make about READ_CELLS cells of the fleet's series (an hour at 1,600
        series, four minutes at 24,000: 1,000 targets of 24 series). Nothing before `first` (the
        oldest stored cell; None: nothing stored).

        A piece shorter than an hour is one read of several within its hour: compaction, which
        would merge the rest of that hour's minutes into a cell starting before the next piece, is
        put off until the reader is done with the pieces (`Store.history_fill`)."""
        fine_from = self.minutes_kept_from(time.time())
        pieces = iter(hour_pieces(start, end, first))
        for lo, hi in pieces:
            if hi > fine_from:
                break
            yield lo, hi
        else:
            return
        fine = read_step(self.store.series_count())
        with self.store.history_fill() if fine < HOUR_SECONDS else contextlib.nullcontext():
            for a, b in itertools.chain([(lo, hi)], pieces):
                at = a
                while at < b:
                    upto = min(b, at - at % fine + fine)
                    yield at, upto
                    at = upto

    def minutes_kept_from(self, now_unix: float) -> int:
        """From where the store may still hold minute cells at `now`: the minute retention, with
        an hour's margin for a compaction not yet run. The long readers read a few minutes of a
        large fleet at a time from here on (`read_spans`, the SLO ledger's fill), and before it
        (compacted hours) an hour or a day at a time."""
        return int(now_unix - self.settings.retention.minute_rollups) - HOUR_SECONDS

    def request_cells(self, start: int, end: int) -> Iterator[tuple[RequestKey, RequestCell]]:
        """The gateway's request cells lying wholly inside [start, end) (`read_requests`), read an
        hour of the clock at a time for readers that add them up as they come (the report's
        summary, the cost per tenant): a month of a large gateway's cells is millions."""
        for a, b in hour_pieces(start, end, first_request_unix(self.store)):
            yield from read_requests(self.store, a, b)

    def piece_requests(self, a: int, b: int, start: int, end: int) -> list[tuple[RequestKey, RequestCell]]:
        """The gateway request cells that the piece [a, b) of `read_spans(start, end, ...)` brings
        along with its engine rows: with the first piece of each hour of the clock, the cells lying
        wholly inside that hour (within [start, end)); with the others, none. Request cells are
        read an hour at a time even where engine rows are read a few minutes at a time: a
        compacted hour lies wholly inside no shorter piece (`read_requests`' rule), and the few-minute
        pieces reach back to hours that may have been compacted since (the minute retention's
        margin). An hour of cells is bounded by the gateway's per-minute caps on tenants, models
        and tracks (`traces.max_*_per_minute`), not by the fleet."""
        hour = a - a % HOUR_SECONDS
        lo = max(hour, start)
        if a != lo:
            return []
        return read_requests(self.store, lo, min(hour + HOUR_SECONDS, end))

    def _first_engine_unix(self) -> int | None:
        """The start of the oldest engine cell, stored or in the scrapers' memory (None: none)."""
        firsts = [t for t in (self.store.first_unix(),) if t is not None]
        for scraper in list(self.scrapers.values()):
            firsts.extend(minute for minute, _ in itertools.islice(scraper.open_minute.kept(0), 1))
        return min(firsts, default=None)

    def advance_cost_meter(self, now_unix: float) -> None:
        """Count the minutes closed since the last pass into the /metrics dollar counters (a
        minute is closed once its last scrapes can have committed: the running windows' grace)."""
        if not self.inventory:
            return
        meter = self.cost_meter
        if self.cluster is not None and not self.cluster.leadership.check():
            # sharded: the counters price the whole fleet's stored minutes, so the elected
            # collector alone counts them (each would else count every shard: sum() = N times);
            # elected again later, it counts from then on, not the minutes another one counted
            meter.until = None
            return
        closed = period_start(now_unix - self.running.grace)
        if meter.until is None:
            meter.until = closed  # count from the first whole minute this process sees
            return
        if closed > meter.until:
            meter.add(self.cost_report(meter.until, closed))

    def refresh_snapshot(self, now_unix: float) -> Snapshot:
        self.advance_cost_meter(now_unix)
        self.running.advance(now_unix)
        view = self.pass_view(now_unix)
        reports = {w: self.pass_report(w, now_unix, view) for w in self.settings.windows}
        # /metrics shows the per-(target, model) figures of a fleet up to metrics_target_limit
        # pairs: derived here, so that a scrape of llmslo does not wait for them; a larger fleet's
        # are derived for the first reader of the fleet view (/api/v1/serving), if any
        if max((len(r.groups) for r in reports.values()), default=0) <= self.settings.server.metrics_target_limit:
            for r in reports.values():
                if isinstance(r.groups, LazyGroups):
                    r.groups.resolve()
        self.snapshot = Snapshot(now_unix, reports)
        self.request_snapshot = self._request_summaries(now_unix)
        for prepare in list(self.after_pass):  # e.g. /metrics' derived text, rendered here, not per request
            try:
                prepare()
            except Exception:  # the snapshot is published: a reader renders or encodes it instead
                log.exception("preparing the derive pass's output for readers failed")
        return self.snapshot

    def _request_summaries(self, now_unix: float) -> dict[tuple[float, str, str], RequestSummary]:
        """Per window, business type and tenant; only the top tenants by requests keep their name."""
        out: dict[tuple[float, str, str], RequestSummary] = {}
        top_n = self.settings.traces.top_tenants
        for w in self.settings.windows:
            start, end = window_bounds(now_unix, w)
            rows = read_requests(self.store, start, end)
            volume: dict[str, int] = {}
            for key, cell in rows:
                volume[key.tenant] = volume.get(key.tenant, 0) + cell.total
            top = set(sorted(volume, key=lambda t: (-volume[t], t))[:top_n])
            grouped: dict[tuple[str, str], list[tuple[RequestKey, RequestCell]]] = {}
            for key, cell in rows:
                tenant = key.tenant if key.tenant in top else conv.OTHER_TENANTS
                grouped.setdefault((key.business_type, tenant), []).append((key, cell))
            for (business_type, tenant), members in grouped.items():
                out[(w, business_type, tenant)] = summarize(members)
        return out

    def cost_report(self, start_unix: int, end_unix: int) -> CostReport:
        """The cost model over [start, end) from the stored rollups, read an hour at a time
        (blocking)."""
        inputs = CostInputs()
        for rows in self.read_pieces(start_unix, end_unix, metrics=COST_METRICS):
            inputs.add_rows(
                r for r in rows if r.period_seconds == MINUTE_SECONDS or r.start_unix + r.period_seconds <= end_unix
            )
        return self.cost_from(inputs, start_unix, end_unix)

    def cost_from(self, inputs: CostInputs, start_unix: int, end_unix: int) -> CostReport:
        """The cost model over [start, end) from the work already added up in `inputs`."""
        return attribute(inputs, self.inventory, self.settings.cost, start_unix, end_unix, self.business_type_of)

    def _slice_costs(self, inputs: CostInputs, start_unix: int, end_unix: int) -> dict[str, tuple[float, float]]:
        report = attribute(inputs, self.inventory, self.settings.cost, start_unix, end_unix, self.business_type_of)
        return report.business_type_costs()

    def capacity(self, start_unix: int, end_unix: int, counter: CapacityCounter | None = None) -> list[Capacity]:
        """Capacity per deployment from the stored rollups of [start, end), read an hour at a
        time (blocking), added to what `counter` holds already (`capacity_counter`)."""
        counter = counter if counter is not None else self.capacity_counter()
        for rows in self.read_pieces(start_unix, end_unix, metrics=CAPACITY_METRICS):
            counter.add(rows)
        th = self.rules.thresholds if self.rules is not None else None
        return counter.report(
            self.settings.cost,
            self.rules,
            kv_limit=(th.kv_cache_usage if th and th.kv_cache_usage else 0.95),
            queue_limit=(th.queue_waiting if th and th.queue_waiting else 10.0),
        )

    def capacity_counter(self) -> CapacityCounter:
        """An empty capacity count for this inventory, to add rows to (`capacity`)."""
        return CapacityCounter(self.inventory, self.business_type_of)

    def compare(
        self,
        baseline: Selector,
        candidate: Selector,
        start: int,
        end: int,
        source: str = "auto",
        tolerances: Tolerances | None = None,
    ) -> Comparison:
        """Candidate against baseline over [start, end) (blocking: reads the store), judged
        against `tolerances` (default: the `compare:` configuration).

        `source`: `engines` (vLLM's histograms of the chosen targets/models), `spans` (gateway span
        rollups: exact latencies to 1 %, tenants, tracks, shadow traffic) or `auto`: spans when both
        selectors can choose spans and both sides have some, else engines."""
        window_seconds = float(max(60, end - start))
        names = (baseline.text, candidate.text)
        tol = tolerances or Tolerances(**self.settings.compare.model_dump())
        if source in ("spans", "auto") and baseline.on_spans and candidate.on_spans:
            rows = read_requests(self.store, start, end)
            base = collect_spans(rows, baseline.matches_span)
            cand = collect_spans(rows, candidate.matches_span)
            if source == "spans" or (base.requests > 0 and cand.requests > 0):
                align_sketches(base, cand)
                return compare_sides(base, cand, names, window_seconds, tol, source="spans")
        if source == "spans":
            raise SelectorError(
                "source=spans: both selectors must be model=, track=, tenant=, business_type= or shadow="
            )
        for sel in (baseline, candidate):
            if not sel.on_engines:
                raise SelectorError(f"selector {sel.text!r} chooses gateway spans only: use source=spans")

        def chooser(sel: Selector) -> Callable[[str, str], bool]:
            chosen: dict[tuple[str, str], bool] = {}  # asked once per (target, model), not per row

            def choose(target: str, model: str) -> bool:
                found = chosen.get((target, model))
                if found is None:
                    if sel.kind == "business_type":
                        found = self.business_type_of(target, model) in sel.values
                    else:
                        cfg = self.targets.get(target)
                        labels = cfg.labels if cfg is not None else {}
                        d = self.inventory.deployment_of(target)
                        track = self.settings.traces.track_label
                        found = sel.matches(target, model, labels, d.name if d else None, track)
                    chosen[(target, model)] = found
                return found

            return choose

        # a piece at a time (`read_pieces`): a day of a large fleet's minutes is tens of millions
        # of rows, more memory than the collector serving the request should ever take at once
        base_side, cand_side = Side(), Side()
        take_base, take_cand = chooser(baseline), chooser(candidate)
        for rows_engine in self.read_pieces(start, end, metrics=COMPARE_METRICS):
            collect(rows_engine, take_base, base_side)
            collect(rows_engine, take_cand, cand_side)
        return compare_sides(base_side, cand_side, names, window_seconds, tol, source="engines")

    def cost_lines(self, report: CostReport, group_by: str) -> dict[str, Line]:
        """The report's groups by deployment, business type, model, target, or (from the gateway
        spans of the same window) tenant."""
        if group_by == "tenant":
            cells = self.request_cells(report.start_unix, report.end_unix)
            return tenant_lines(report, cells, self.settings.cost.cached_token_weight)
        return report.by(group_by)

    def compact(self, now_unix: float) -> tuple[int, int]:
        """Merge the minutes past their retention into hours and expire what is past its own
        (engine rollups, request rollups, span ids); put off while the SLO ledger's fill reads
        history (`Store.compaction`): (0, 0) then."""
        r = self.settings.retention
        expire_span_ids(self.store, now_unix - self.settings.traces.dedupe_horizon)
        with self.store.compaction() as free:
            if not free:
                log.info("compaction put off while the SLO ledger counts the stored rollups: it runs next interval")
                return 0, 0
            compact_requests(self.store, now_unix, r.minute_rollups, r.hour_rollups)
            return self.store.compact(now_unix, r.minute_rollups, r.hour_rollups)

    async def scrape_all_once(self) -> None:
        """Scrape every target concurrently (used by tests and `llmslo scrape`)."""
        await asyncio.gather(*(s.scrape_once() for s in self.scrapers.values()))

    @staticmethod
    def now() -> float:
        return time.time()


def _slice_counted(ledger: SloLedger, key: str) -> bool:
    """Whether a saved open slice's part (slice:<slo>, cost:<seconds>) is one `ledger` counts."""
    kind, _, name = key.partition(":")
    if kind == "slice":
        return name in ledger.slices
    return kind == "cost" and name.isdigit() and int(name) in ledger.cost_open
