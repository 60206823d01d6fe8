"""Scraping one vLLM /metrics target: fetch (bounded in time and size), parse, delta, commit.

One `TargetScraper` per target keeps that target's caches and delta state. A failure of any
kind is recorded on the target (reason, message naming the line) and counted; it never raises
into the scheduler and never touches another target's state or anything already stored.

Minute writes. The store holds one row per series and minute, so a target scraped every 15 s
would rewrite each row four times a minute. A scheduled scrape whose next slot falls in the same
minute is counted in memory only (its open minute, the sliding windows, the SLO ledger, as any
scrape) and left `Unwritten`; the last scrape of the minute writes the minute's rows and the
delta state once. The scrape loop writes what is left whenever the next slot is in a later minute
(a failed or skipped last scrape) and at shutdown, so a minute is in the store by the time its
last scrape could have committed, as before (the running windows' grace). A crash loses no count:
the stored state is that of the last write, so the next scrape's delta covers the scrapes kept
in memory (counted in its minute instead of theirs, as after any gap).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from collector import conventions as conv
from collector.config import Settings, TargetConfig
from collector.rollup import Cell, Cumulative, DeltaTracker, ScrapeDeltas, SeriesIdent, period_start
from collector.secrets import redact_url, scrub
from collector.sources.dcgm import read_dcgm
from collector.sources.expfmt import ExpositionError
from collector.sources.httpget import FetchError
from collector.sources.httpget import Target as HttpTarget
from collector.sources.vllm import EngineSnapshot, Kind, SeriesKey, SlotCache, new_cache, read_scrape
from collector.store.committer import GroupCommitter
from collector.store.repository import OpenMinute, ScrapeCommit, Store, merge_in_memory

log = logging.getLogger(__name__)

ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"


def request_headers(timeout_seconds: float) -> dict[str, str]:
    """What every scrape sends, as Prometheus does (the timeout header lets a server cut its work)."""
    return {
        "User-Agent": "llmslo",
        "Accept": ACCEPT,
        "Accept-Encoding": "gzip",
        "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_seconds:g}",
    }


class ScrapeError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(message)


@dataclass(slots=True)
class TargetStatus:
    """What the API and the self-metrics say about one target."""

    name: str
    url: str
    up: bool | None = None  # None until the first scrape finished
    last_scrape_unix: float | None = None
    last_success_unix: float | None = None
    last_duration_seconds: float = 0.0
    last_error: str | None = None
    last_error_reason: str | None = None
    samples: int = 0
    body_bytes: int = 0
    scrapes_total: int = 0
    errors_total: Counter[str] = field(default_factory=Counter)
    counter_resets_total: int = 0  # series that reset (one restart resets every counter)
    restarts_total: int = 0  # server restarts seen (once per restart, whatever the series count)
    last_restart_unix: float | None = None  # when the restarted process started (else: when seen)
    process_start_unix: float | None = None
    consecutive_failures: int = 0
    down_since_unix: float | None = None  # the first failed scrape of the current outage
    next_allowed_unix: float = 0.0
    models: tuple[str, ...] = ()


class ScalarLayout(NamedTuple):
    """The counters and gauges of one scrape in order (shared by a target's scrapes while its
    series stay the same), and which of them are gauges."""

    idents: tuple[SeriesIdent, ...]
    gauges: tuple[int, ...]


class RecentScrape(NamedTuple):
    """One committed scrape's deltas, kept in memory for the sliding short windows; `scalars`
    are its counters' and gauges' (what each derive pass merges, without the histograms: those
    are summed per business type as scrapes commit, collector/analytics/histsums.py).

    The scalars are also kept as columns: `layout` (the same object in each scrape of a target
    whose series did not change) and one value per series (a counter's delta, a gauge's sample),
    all covering `observed` seconds up to `last_unix`. A window whose scrapes share one layout
    merges them column by column (collector/windowcells.py), with the results of a merge of the
    cells; `layout` is None where a cell is not such a fresh scrape's (then the cells are merged)."""

    unix: float
    cells: dict[SeriesIdent, Cell]
    units: dict[SeriesKey, str]
    scalars: tuple[tuple[SeriesIdent, Cell], ...]  # derived from `cells`: made by `of`
    layout: ScalarLayout | None
    values: tuple[float, ...]
    observed: float
    last_unix: float

    @classmethod
    def of(
        cls,
        unix: float,
        cells: dict[SeriesIdent, Cell],
        units: dict[SeriesKey, str],
        previous: RecentScrape | None = None,
    ) -> RecentScrape:
        """`previous`: the target's scrape before, whose layout this one shares if it can."""
        scalars = tuple((ident, cell) for ident, cell in cells.items() if ident.kind is not Kind.HISTOGRAM)
        layout, values, observed, last_unix = _columns(scalars, previous.layout if previous is not None else None)
        return cls(unix, cells, units, scalars, layout, values, observed, last_unix)


def _columns(
    scalars: tuple[tuple[SeriesIdent, Cell], ...], last: ScalarLayout | None
) -> tuple[ScalarLayout | None, tuple[float, ...], float, float]:
    """(layout, values, observed, last_unix) of one scrape's scalar cells; no layout when a cell
    is not one scrape's delta or sample as `DeltaTracker.observe` makes them."""
    if not scalars:
        return None, (), 0.0, 0.0
    first = scalars[0][1]
    observed, at = first.observed_seconds, first.last_unix
    values: list[float] = []
    for ident, cell in scalars:
        if cell.observed_seconds != observed or cell.last_unix != at or cell.kind is not ident.kind:
            return None, (), 0.0, 0.0
        if cell.kind is Kind.GAUGE:
            if not (cell.n == 1 and cell.value == 0.0 and cell.gmin == cell.gmax == cell.glast == cell.sum):
                return None, (), 0.0, 0.0  # (a NaN sample too: never equal)
            values.append(cell.glast)
        elif cell.n == 0 and cell.sum == 0.0 and cell.buckets is None:
            values.append(cell.value)
        else:
            return None, (), 0.0, 0.0
    idents = tuple(ident for ident, _ in scalars)
    if last is None or last.idents != idents:
        last = ScalarLayout(idents, tuple(i for i, ident in enumerate(idents) if ident.kind is Kind.GAUGE))
    return last, tuple(values), observed, at


@dataclass(slots=True)
class Unwritten:
    """What a target's scrapes of `minute` counted in memory and have not written yet: the new
    delta state of their series, and the last one's time (the stored baseline) and process start.
    The minute's cells are its `OpenMinute`'s."""

    minute: int
    state: dict[SeriesIdent, Cumulative] = field(default_factory=dict)
    baseline_unix: float = 0.0
    process_start_unix: float | None = None


class TargetScraper:
    def __init__(
        self,
        target: TargetConfig,
        settings: Settings,
        store: Store,
        client: HttpTarget | None = None,
        committer: GroupCommitter | None = None,
    ) -> None:
        self.target = target
        self.settings = settings
        self.store = store
        self.client = client
        self.committer = committer or GroupCommitter(store, asyncio.Lock())
        self.open_minute = OpenMinute()  # this minute's rows as stored: commits merge without reading
        self.on_commit: Callable[[str, ScrapeCommit], None] | None = None  # told each committed scrape
        self.status = TargetStatus(target.name, redact_url(target.url))
        self.cache: SlotCache = new_cache()
        self.tracker = DeltaTracker()
        self.series_ids: dict[SeriesIdent, int] = {}
        self.idents: dict[int, SeriesIdent] = {}  # the reverse of series_ids
        # series_of's choices by the metrics asked for, dropped whenever `idents` gains a series
        self._chosen: dict[frozenset[str], list[tuple[int, SeriesIdent]]] = {}
        self.units: dict[SeriesKey, str] = {}  # of the last committed scrape
        self.target_id: int | None = None
        self.recent: deque[RecentScrape] = deque()  # newest last, back to settings.sliding_horizon
        # minute writes (above): the scrape loop sets the slot after the one running; a scrape
        # without one (a test's, the simulator's) writes at once
        self.next_slot_unix: float | None = None
        self.unwritten: Unwritten | None = None

    def series_of(self, metrics: frozenset[str]) -> list[tuple[int, SeriesIdent]]:
        """(series id, series) of every series of `metrics` this target has stored, chosen once
        per set of metrics and again when the target gains a series: readers that want a handful
        of its ~300 series (the drift pass's reads of the open minutes) look those up directly."""
        chosen = self._chosen.get(metrics)
        if chosen is None:
            chosen = self._chosen[metrics] = [
                (sid, i) for sid, i in list(self.idents.items()) if i.key.metric in metrics
            ]
        return chosen

    @property
    def interval(self) -> float:
        return self.settings.target_interval(self.target)

    @property
    def timeout(self) -> float:
        return self.settings.target_timeout(self.target)

    async def load(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        """Register the target and resume its delta state from the last committed scrape."""
        target_id = self.store.ensure_target(self.target.name, self.target.url)
        self.tracker, self.series_ids = self.store.load_tracker(target_id)
        self.idents = {sid: ident for ident, sid in self.series_ids.items()}
        self._chosen = {}
        self.target_id = target_id

    async def run_scheduled(self, clock: Callable[[], float] = time.time) -> None:
        """The scheduler's entry point: honours the failure backoff, never raises."""
        if clock() < self.status.next_allowed_unix:
            return
        await self.scrape_once(clock)

    async def scrape_once(self, clock: Callable[[], float] = time.time) -> bool:
        """One scrape over HTTP. Returns True when its deltas were committed."""
        started = time.perf_counter()
        now = clock()
        self.status.scrapes_total += 1
        try:
            if self.target_id is None:
                await self.load()
            body, content_type = await self._fetch()
            snapshot = self._read(body, content_type)
            await self._commit(snapshot, now)
        except Exception as exc:  # never let one target break the loop
            self._failed(exc, now, started)
            return False
        self._succeeded(snapshot, now, started)
        return True

    def ingest(
        self, body: bytes | str | None, content_type: str | None, now: float, error: ScrapeError | None = None
    ) -> bool:
        """Synchronous ingestion of a body obtained elsewhere (the simulator's fast clock hands
        bodies, or the error a real scrape would have had, with a virtual `now`)."""
        started = time.perf_counter()
        self.status.scrapes_total += 1
        try:
            if error is not None:
                raise error
            if self.target_id is None:
                self._load()
            snapshot = self._read(body or b"", content_type)
            self._store(snapshot, now)
        except Exception as exc:
            self._failed(exc, now, started)
            return False
        self._succeeded(snapshot, now, started)
        return True

    def _read(self, body: bytes | str, content_type: str | None) -> EngineSnapshot:
        t, scrape = self.target, self.settings.scrape
        if t.kind == "dcgm":
            return read_dcgm(body, scrape.sample_limit if t.sample_limit is None else t.sample_limit)
        return read_scrape(
            body,
            content_type,
            self.cache,
            t.default_model,
            scrape.sample_limit if t.sample_limit is None else t.sample_limit,
            scrape.model_limit if t.model_limit is None else t.model_limit,
            scrape.label_value_length_limit,
        )

    def _succeeded(self, snapshot: EngineSnapshot, now: float, started: float) -> None:
        status = self.status
        status.up = True
        status.last_error = None
        status.last_error_reason = None
        status.consecutive_failures = 0
        status.next_allowed_unix = 0.0
        status.last_scrape_unix = now
        status.last_success_unix = now
        status.samples = snapshot.samples
        status.models = tuple(sorted({k.model for k in (*snapshot.counters, *snapshot.histograms)}))
        status.last_duration_seconds = time.perf_counter() - started

    def _failed(self, exc: Exception, now: float, started: float) -> None:
        if isinstance(exc, ScrapeError):
            self._fail(exc.reason, exc.message, now, started)
        elif isinstance(exc, ExpositionError):
            self._fail(exc.reason, str(exc), now, started)
        else:
            log.exception("scrape of target %s failed unexpectedly", self.target.name, exc_info=exc)
            self._fail(conv.REASON_STORE, f"{type(exc).__name__}: {exc}", now, started)

    async def _fetch(self) -> tuple[bytes, str | None]:
        if self.client is None:
            raise ScrapeError(conv.REASON_CONNECT, "this scraper has no HTTP client (ingest-only)")
        if self.client.url != self.target.url:  # the target was pointed elsewhere: a new connection
            await self.client.aclose()
            self.client = self.client.to(self.target.url)
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.client.get(self.settings.scrape.max_body_bytes)
        except TimeoutError:
            raise ScrapeError(conv.REASON_TIMEOUT, f"no complete answer within {self.timeout:g}s") from None
        except FetchError as exc:
            raise ScrapeError(exc.reason, exc.message) from None
        if answer.status != 200:
            raise ScrapeError(conv.REASON_HTTP_STATUS, f"HTTP {answer.status} from {self.status.url}")
        self.status.body_bytes = len(answer.body)
        return answer.body, answer.headers.get("content-type")

    async def _commit(self, snapshot: EngineSnapshot, now: float) -> None:
        item = self._prepare(snapshot, now)
        if self._keep_in_memory(item):
            self._adopt(item, now)
            self._note_unwritten(item)
            return
        self._carry_unwritten(item)
        try:
            await self.committer.commit(item)
        except Exception as exc:
            raise _store_failed(exc) from exc
        self.unwritten = None
        self._adopt(item, now)

    def _keep_in_memory(self, item: ScrapeCommit) -> bool:
        """Whether this scrape may leave its write to a later scrape of the same minute (module
        docstring): the scheduler's next slot is in this minute, nothing of an earlier minute is
        waiting, its series all have ids, its minute's stored cells are known, and the server did
        not restart. If so, its cells are merged into the open minute (`item.merged`)."""
        deltas, nxt, waiting = item.deltas, self.next_slot_unix, self.unwritten
        if nxt is None or period_start(nxt) != deltas.minute or deltas.restarted:
            return False
        if waiting is not None and waiting.minute != deltas.minute:
            return False
        ids = self.series_ids
        if any(ident not in ids for ident in deltas.cells) or not merge_in_memory(item):
            return False
        item.adopt()
        return True

    def _note_unwritten(self, item: ScrapeCommit) -> None:
        waiting = self.unwritten
        if waiting is None:
            waiting = self.unwritten = Unwritten(item.deltas.minute)
        waiting.state.update(item.deltas.state)
        waiting.baseline_unix = item.now_unix
        if item.deltas.process_start_unix is not None:
            waiting.process_start_unix = item.deltas.process_start_unix

    def _carry_unwritten(self, item: ScrapeCommit) -> None:
        """Hand what earlier scrapes kept in memory to `item`'s write: their minute's cells as the
        open minute holds them (those `item` does not write itself) and their delta state."""
        waiting = self.unwritten
        if waiting is None:
            return
        om = self.open_minute
        cells = om.cells if om.minute == waiting.minute else {}
        if om.previous is not None and om.previous[0] == waiting.minute:
            cells = om.previous[1]
        ids = self.series_ids
        own = {ids[i] for i in item.deltas.cells if i in ids} if item.deltas.minute == waiting.minute else set()
        item.carry_rows = [(waiting.minute, sid, cell) for sid, cell in cells.items() if sid not in own]
        item.carry_state = {i: c for i, c in waiting.state.items() if i not in item.deltas.state}
        item.carry_process_start_unix = waiting.process_start_unix

    def must_write_before(self, next_slot_unix: float) -> bool:
        """Whether a minute counted in memory ends before the next slot (its last scrape failed or
        was skipped): the scrape loop then writes it at once (`write_unwritten`)."""
        return self.unwritten is not None and self.unwritten.minute < period_start(next_slot_unix)

    async def write_unwritten(self) -> None:
        """Write what scrapes kept in memory (their minute's rows and delta state), without a
        scrape. On failure it stays in memory for the next write and the error is logged."""
        waiting = self.unwritten
        if waiting is None or self.target_id is None:
            return
        deltas = ScrapeDeltas(waiting.minute, {}, {}, 0, None, unix=waiting.baseline_unix)
        # no open minute: the write changes nothing the scraper keeps (its cells are carried)
        item = ScrapeCommit(self.target_id, deltas, self.units, self.series_ids, waiting.baseline_unix)
        self._carry_unwritten(item)
        try:
            await self.committer.commit(item)
        except Exception:
            log.exception("target %s: could not write the minute its scrapes kept in memory", self.target.name)
            return
        if self.unwritten is waiting:
            self.unwritten = None

    def _store(self, snapshot: EngineSnapshot, now: float) -> None:
        """The synchronous path (fast-clock simulation): commit alone, then adopt."""
        item = self._prepare(snapshot, now)
        try:
            self.store.commit_scrapes([item])
        except Exception as exc:
            raise _store_failed(exc) from exc
        self._adopt(item, now)

    def _prepare(self, snapshot: EngineSnapshot, now: float) -> ScrapeCommit:
        """Deltas since the last committed scrape; nothing of this target changes until `_adopt`."""
        target_id = self.target_id
        assert target_id is not None
        deltas = self.tracker.observe(snapshot, now, self.settings.scrape.startup_lookback)
        return ScrapeCommit(
            target_id, deltas, snapshot.units, self.series_ids, now, self.open_minute, self.tracker.baseline_unix
        )

    def _adopt(self, item: ScrapeCommit, now: float) -> None:
        """The scrape is stored: the delta state advances, and the sliding windows see it."""
        deltas = item.deltas
        for ident, sid in item.new_ids.items():
            self.idents[sid] = ident
        if item.new_ids:
            self._chosen = {}
        self.units = item.units
        self.tracker.commit(deltas, now)
        self._remember(RecentScrape.of(now, deltas.cells, item.units, self.recent[-1] if self.recent else None))
        if self.on_commit is not None:
            self.on_commit(self.target.name, item)
        status = self.status
        status.counter_resets_total += deltas.resets
        status.process_start_unix = deltas.process_start_unix
        if deltas.restarted:
            status.restarts_total += 1
            status.last_restart_unix = deltas.process_start_unix or now
            log.info("target %s restarted (%d series reset)", self.target.name, deltas.resets)

    def _remember(self, scrape: RecentScrape) -> None:
        recent = self.recent
        if recent and scrape.unix < recent[-1].unix:
            recent.clear()  # the clock went back (a test's virtual clock): start afresh
        recent.append(scrape)
        # keep one scrape more than the horizon: its delta covers the horizon's start
        horizon = scrape.unix - self.settings.sliding_horizon - self.interval
        while len(recent) > 1 and recent[1].unix < horizon:
            recent.popleft()

    def _fail(self, reason: str, message: str, now: float, started: float) -> None:
        message = scrub(message, self.target.url)  # an HTTP error quotes the URL, credentials and all
        status = self.status
        status.up = False
        status.last_error = message
        status.last_error_reason = reason
        status.errors_total[reason] += 1
        status.consecutive_failures += 1
        if status.down_since_unix is None:
            status.down_since_unix = now
        status.last_scrape_unix = now
        status.last_duration_seconds = time.perf_counter() - started
        # Exponential backoff: the first failure retries on the next tick, then 1, 3, 7... intervals.
        # A target never scraped successfully (a server still starting) is retried every interval,
        # so its first scrape comes as soon as it answers.
        if self.tracker.baseline_unix is None:
            backoff = 0.0
        else:
            exponent = min(status.consecutive_failures - 1, 30)  # 2**30 intervals is past any cap
            backoff = min(self.settings.scrape.backoff_max, self.interval * (2**exponent - 1))
        status.next_allowed_unix = now + backoff
        log.warning("target %s down (%s): %s", self.target.name, reason, message)


def _store_failed(exc: Exception) -> ScrapeError:
    return ScrapeError(conv.REASON_STORE, f"could not store the scrape: {type(exc).__name__}: {exc}")
