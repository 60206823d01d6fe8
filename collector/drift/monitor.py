"""The drift monitor of a running collector: rebuilds the reference every `drift.refresh`, judges
the current window on each pass, keeps the latest findings for the API, /metrics and alerts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from collector.config import DriftConfig
from collector.drift.engine import (
    DRIFT_METRICS,
    Finding,
    Minutes,
    Reference,
    build_reference,
    current_bounds,
    engine_minutes,
    findings,
    span_minutes,
)
from collector.drift.saved import SavedMinutes, minute_starts
from collector.rollup import MINUTE_SECONDS, Row
from collector.traces.rollup import RequestCell, RequestKey

log = logging.getLogger(__name__)
WEEK = 7 * 86400
DATING_SECONDS = 1800  # how far back a drifted signal's start is looked for
SETTLE_SECONDS = 180  # minutes older than this are complete (late spans, the last scrapes) and kept
# a minute of the current window is complete this long after it ended: every scrape inside it has
# been committed (spans later than this count from the next reference on, not in this window)
RECENT_SETTLE_SECONDS = 60
OPEN_METRICS = frozenset(DRIFT_METRICS)
# the spans' part of the reference is read whole again this often: the busiest tenants chosen
# again, late spans seen. The engines' minutes are not: once settled they never change (a scrape's
# rows are written with its minute; a scrape whose write failed is counted in a later minute), and
# a day of a thousand targets' rows is ~16 million, minutes of CPU to read again every hour.
FULL_REBUILD_SECONDS = 3600
# the engines' rows are read this many seconds at a time (and reduced to their business types'
# minutes before the next piece): the whole day of a first build at a thousand targets held
# gigabytes of rows at once
READ_CHUNK_SECONDS = 600
# the spans' cells are read an hour at a time, on the hour: a cell compacted into an hour lies
# wholly inside one piece exactly when it lies wholly inside the range (read_requests' rule)
SPAN_CHUNK_SECONDS = 3600
SAVE_CHUNK_SECONDS = 3600  # the reference's engine minutes read from the rollups are saved an hour at a time

ReadRows = Callable[[int, int, Sequence[str]], Sequence[Row]]
# The engine rows of the minutes still being written, from the scrapers' memory (as stored);
# None when memory cannot answer for [start, end) (then the store is read).
ReadOpen = Callable[[int, int, frozenset[str]], Sequence[Row] | None]
# The span cells of [start, end) of the given tenants (all of them with None)
ReadRequests = Callable[[int, int, Collection[str] | None], Sequence[tuple[RequestKey, RequestCell]]]
# Per tenant, the requests of [start, end) (summed by the store: collector/traces/store.py)
ReadVolumes = Callable[[int, int], Mapping[str, float]]


def reference_ranges(config: DriftConfig, start: int, end: int) -> list[tuple[int, int]]:
    """Where the reference lies for a current window [start, end)."""
    if config.reference == "hour_of_week":
        half = 1800  # the surrounding hour of each past week, for volume
        return [(start - k * WEEK - half, end - k * WEEK + half) for k in range(config.weeks, 0, -1)]
    return [(start - int(config.reference_length), start)]


@dataclass
class HeldMinutes:
    """Minutes read from the store and kept between passes. A minute that ended before the
    `settled` time given to `fill` is complete and never read again; later ones are read each time."""

    minutes: Minutes = field(default_factory=dict)
    complete: set[int] = field(default_factory=set)

    def keep(self, wanted: Callable[[int], bool]) -> None:
        """Drop the minutes (by their minute start) that `wanted` refuses."""
        for group in list(self.minutes):
            by_minute = self.minutes[group]
            for m in [m for m in by_minute if not wanted(m - m % MINUTE_SECONDS)]:
                del by_minute[m]
            if not by_minute:
                del self.minutes[group]
        self.complete = {m for m in self.complete if wanted(m)}

    def fill(self, lo: int, hi: int, settled: int, read: Callable[[int, int], Minutes]) -> int:
        """Read the minutes of [lo, hi) not complete yet; returns how many were read."""
        count = 0
        for gap_lo, gap_hi in _gaps(self.complete, lo, hi):
            for group, by_minute in read(gap_lo, gap_hi).items():
                self.minutes.setdefault(group, {}).update(by_minute)
            span = range(gap_lo - gap_lo % MINUTE_SECONDS, gap_hi, MINUTE_SECONDS)
            self.complete.update(m for m in span if m + MINUTE_SECONDS <= settled)
            count += len(span)
        return count


class DriftMonitor:
    def __init__(
        self,
        config: DriftConfig,
        read_rows: ReadRows,
        read_requests: ReadRequests,
        read_volumes: ReadVolumes,
        place: Callable[[str, str], str | None],
        top_tenants: int = 20,
        fetch_pinned: Callable[[str], tuple[Reference, int] | None] | None = None,
        read_open: ReadOpen | None = None,
        saved: SavedMinutes | None = None,
    ) -> None:
        self.config = config
        # the reference's engine minutes saved as they settle, loaded by a new process instead of
        # reading them from the rollups again (collector/drift/saved.py)
        self.saved = saved
        self.minutes_read: dict[str, int] = {"saved": 0, "rollups": 0}  # the reference's engine minutes, by source
        self.forget_before = 0  # saved minutes before this have left the reference
        self.read_rows = read_rows
        self.read_open = read_open
        self.read_requests = read_requests
        self.read_volumes = read_volumes
        self.place = place
        self.top_tenants = top_tenants
        self.fetch_pinned = fetch_pinned
        self.missing_pin_logged = False
        self.pinned_checked = 0.0
        self.tenants: set[str] = set()  # judged per tenant: the busiest in the reference
        self.reference: Reference | None = None
        # The reference's minutes, kept between rebuilds: a rebuild reads only the minutes not
        # held yet (those that entered the reference since the last one) and drops those that
        # left it, instead of re-reading the whole reference (a day of every target's rows). The
        # engines' and the spans' apart: only the spans' are read whole again (FULL_REBUILD_SECONDS).
        self.held = HeldMinutes()
        self.held_spans = HeldMinutes()
        self.full_read_unix: float | None = None
        # the current window's (and the dating half hour's) settled minutes, likewise kept
        self.recent = HeldMinutes()
        self.recent_tenants: set[str] = set()
        self.latest: list[Finding] = []
        self.evaluated_unix: float | None = None
        self.lock = threading.Lock()

    def _minutes(self, start: int, end: int, pick_tenants: bool = False, open_rows: bool = False) -> Minutes:
        """Every group's minutes of [start, end): the engines' and the spans' (`_engines`, `_spans`)."""
        minutes = self._engines(start, end, open_rows)
        minutes.update(self._spans(start, end, pick_tenants))  # (business type, tenant): never an engine's group
        return minutes

    def _engines(self, start: int, end: int, open_rows: bool = False) -> Minutes:
        """Each business type's engine minutes of [start, end): from the store, READ_CHUNK_SECONDS
        at a time, or with `open_rows` from the scrapers' memory when it can answer."""
        rows = self.read_open(start, end, OPEN_METRICS) if open_rows and self.read_open is not None else None
        if rows is not None:
            return engine_minutes(rows, self.place)
        minutes: Minutes = {}
        for lo, hi in pieces(start, end, READ_CHUNK_SECONDS):
            for group, by_minute in engine_minutes(self.read_rows(lo, hi, DRIFT_METRICS), self.place).items():
                minutes.setdefault(group, {}).update(by_minute)  # a row's minute is in one piece
        return minutes

    def _reference_engines(self, lo: int, hi: int, settled: int) -> Minutes:
        """The engines' minutes of [lo, hi) for the reference: those saved loaded, the others read
        from the rollups (`_engines`) and saved once settled. A failed load reads the rollups; a
        failed save is logged and tried again by the next process to read those minutes."""
        saved = self.saved
        if saved is None:
            self.minutes_read["rollups"] += len(range(lo - lo % MINUTE_SECONDS, hi, MINUTE_SECONDS))
            return self._engines(lo, hi)
        try:
            minutes, covered = saved.load(lo, hi)
        except Exception:
            log.exception("drift: could not load the saved reference minutes of [%d, %d); reading the rollups", lo, hi)
            minutes, covered = {}, set()
        self.minutes_read["saved"] += len(covered)
        # read and saved an hour at a time: a build stopped half way (a shutdown, a failed read)
        # keeps what it read for the next one (a first build at fleet size reads for many minutes)
        gaps = [piece for gap in _gaps(covered, lo, hi) for piece in pieces(*gap, SAVE_CHUNK_SECONDS)]
        for gap_lo, gap_hi in gaps:
            part = self._engines(gap_lo, gap_hi)
            self.minutes_read["rollups"] += len(range(gap_lo - gap_lo % MINUTE_SECONDS, gap_hi, MINUTE_SECONDS))
            for group, by_minute in part.items():
                minutes.setdefault(group, {}).update(by_minute)
            settled_starts = minute_starts(gap_lo, gap_hi, settled)
            if not settled_starts:
                continue
            try:
                saved.save(part, settled_starts, self.forget_before)
            except Exception:
                log.exception("drift: could not save the reference minutes of [%d, %d)", gap_lo, gap_hi)
        return minutes

    def _spans(self, start: int, end: int, pick_tenants: bool = False) -> Minutes:
        """The busiest tenants' span minutes of [start, end) (none unless `drift.tenants`); with
        `pick_tenants`, the busiest are chosen again first, at most top_tenants of them, from
        each tenant's requests summed by the store. Only their cells are read, an hour at a time:
        a day of a large gateway's cells (a million and more) was read into memory at once."""
        if not self.config.tenants:
            return {}
        if pick_tenants:
            volume = self.read_volumes(start, end)
            busy = [t for t in volume if volume[t] >= self.config.min_events]
            self.tenants = set(sorted(busy, key=lambda t: (-volume[t], t))[: self.top_tenants])
        minutes: Minutes = {}
        if not self.tenants:
            return minutes
        for lo, hi in pieces(start, end, SPAN_CHUNK_SECONDS):
            for group, by_minute in span_minutes(self.read_requests(lo, hi, self.tenants), self.tenants).items():
                minutes.setdefault(group, {}).update(by_minute)  # a cell's minute is in one piece
        return minutes

    def build(self, start: int, end: int, window: int, now: float) -> Reference:
        """A reference over [start, end) with thresholds for `window` (what `drift pin` stores)."""
        return build_reference(self._minutes(start, end, pick_tenants=True), [(start, end)], window,
                               self.config.min_events, now)  # fmt: skip

    def _recent(self, lo: int, hi: int, now: float) -> Minutes:
        """The minutes of [lo, hi) for the current window (and the half hour before it, to date a
        shift): a minute that ended more than RECENT_SETTLE_SECONDS ago is read once and kept
        (its scrapes are all committed by then); the later ones (the minute running and the one
        before it) are taken on every pass from the scrapers' memory, where they are kept as
        stored, or read from the store when memory cannot answer (not serving)."""
        if self.recent_tenants != self.tenants:  # the busiest tenants were chosen again
            self.recent, self.recent_tenants = HeldMinutes(), set(self.tenants)
        keep_from = hi - DATING_SECONDS - 2 * MINUTE_SECONDS
        self.recent.keep(lambda m: m >= keep_from)
        settled = int(now) - RECENT_SETTLE_SECONDS
        unsettled = max(lo, min(hi, settled - settled % MINUTE_SECONDS))  # minutes from here end after `settled`
        self.recent.fill(lo, unsettled, settled, self._minutes)
        out = {g: {m: v for m, v in bm.items() if lo <= m < unsettled} for g, bm in self.recent.minutes.items()}
        if unsettled < hi:
            for group, by_minute in self._minutes(unsettled, hi, open_rows=True).items():
                out.setdefault(group, {}).update(by_minute)
        return out

    def _hold(self, ranges: list[tuple[int, int]], now: float) -> int:
        """Bring the held minutes up to `ranges`: read the minutes missing (the spans' all of them
        on a full read, choosing the busiest tenants again), drop those outside. Returns the
        engines' minutes read."""
        full = self.full_read_unix is None or not 0 <= now - self.full_read_unix < FULL_REBUILD_SECONDS
        if full:
            self.held_spans, self.full_read_unix = HeldMinutes(), now
        wanted = {m for lo, hi in ranges for m in range(lo - lo % MINUTE_SECONDS, hi, MINUTE_SECONDS)}
        self.held.keep(wanted.__contains__)  # what left the reference
        self.held_spans.keep(wanted.__contains__)
        settled = int(now) - SETTLE_SECONDS
        self.forget_before = min(lo for lo, _ in ranges)
        read = 0
        for i, (lo, hi) in enumerate(ranges):
            read += self.held.fill(lo, hi, settled, partial(self._reference_engines, settled=settled))
            pick = full and i == 0  # a full read chooses the busiest tenants from the first range
            self.held_spans.fill(lo, hi, settled, partial(self._spans, pick_tenants=pick))
        return read

    def evaluate(self, now: float) -> list[Finding]:
        """One pass (blocking: reads the store)."""
        c = self.config
        start, end = current_bounds(now, c.window)
        window = int(c.window)
        ref = self.reference
        ranges = reference_ranges(c, start, end)
        stale = ref is None or now - ref.built_unix >= c.refresh or now < ref.built_unix or ref.end > start
        if c.reference == "pinned":
            if ref is None or time.time() - self.pinned_checked >= c.refresh:
                self.pinned_checked = time.time()
                pinned = self.fetch_pinned(c.baseline) if self.fetch_pinned is not None else None
                if pinned is None:
                    if not self.missing_pin_logged:
                        log.warning("drift.reference is pinned but no baseline %r is stored: run `llmslo drift pin`",
                                    c.baseline)  # fmt: skip
                        self.missing_pin_logged = True
                    self.latest, self.evaluated_unix = [], now
                    return self.latest
                ref = self.reference = pinned[0]
                self.tenants = {t for (_bt, t), _s in ref.totals if t}
            stale = False
        if stale:
            started = time.perf_counter()
            before = dict(self.minutes_read)
            read = self._hold(ranges, now)
            ref = build_reference({**self.held.minutes, **self.held_spans.minutes}, ranges, window, c.min_events, now)
            self.reference = ref
            log.info("drift reference rebuilt over %d range(s) in %.2f s (%d minutes: %d saved, %d from the rollups)",
                     len(ranges), time.perf_counter() - started, read, self.minutes_read["saved"] - before["saved"],
                     self.minutes_read["rollups"] - before["rollups"])  # fmt: skip
        assert ref is not None
        current = self._recent(start, end, now)
        out = [f for f in findings(ref, current, start, end, c.min_events) if f.signal in c.signals]
        earlier = end - DATING_SECONDS - MINUTE_SECONDS
        if any(f.drifted for f in out) and earlier < start:  # date the shifts: the minutes before too
            current = self._recent(earlier, end, now)
            out = [f for f in findings(ref, current, start, end, c.min_events) if f.signal in c.signals]
        with self.lock:
            self.latest = sorted(out, key=lambda f: (not f.drifted, f.business_type, f.tenant, f.signal))
            self.evaluated_unix = now
        return self.latest


def pieces(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """[start, end) cut on the multiples of `size` (each piece at most `size` long)."""
    out = []
    lo = start
    while lo < end:
        hi = min(end, lo - lo % size + size)
        out.append((lo, hi))
        lo = hi
    return out


def _gaps(held: set[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs of minutes in [lo, hi) not in `held`, as [start, end) ranges."""
    out: list[tuple[int, int]] = []
    m = lo
    while m < hi:
        step = MINUTE_SECONDS - m % MINUTE_SECONDS
        if m - m % MINUTE_SECONDS in held:
            m += step
            continue
        start = m
        while m < hi and m - m % MINUTE_SECONDS not in held:
            m += MINUTE_SECONDS - m % MINUTE_SECONDS
        out.append((start, min(m, hi)))
    return out
