"""The drift monitor of a running collector: rebuilds the reference every `drift.refresh`, judges
the current window on each pass, keeps the latest findings for the API, /metrics and alerts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

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
from collector.rollup import MINUTE_SECONDS, Row
from collector.traces.rollup import RequestCell, RequestKey

log = logging.getLogger(__name__)
WEEK = 7 * 86400
DATING_SECONDS = 1800  # how far back a drifted signal's start is looked for

ReadRows = Callable[[int, int, Sequence[str]], Sequence[Row]]
ReadRequests = Callable[[int, int], Sequence[tuple[RequestKey, RequestCell]]]


def reference_ranges(config: DriftConfig, start: int, end: int) -> list[tuple[int, int]]:
    """Where the reference lies for a current window [start, end)."""
    if config.reference == "hour_of_week":
        half = 1800  # the surrounding hour of each past week, for volume
        return [(start - k * WEEK - half, end - k * WEEK + half) for k in range(config.weeks, 0, -1)]
    return [(start - int(config.reference_length), start)]


class DriftMonitor:
    def __init__(
        self,
        config: DriftConfig,
        read_rows: ReadRows,
        read_requests: ReadRequests,
        place: Callable[[str, str], str | None],
        top_tenants: int = 20,
        fetch_pinned: Callable[[str], tuple[Reference, int] | None] | None = None,
    ) -> None:
        self.config = config
        self.read_rows = read_rows
        self.read_requests = read_requests
        self.place = place
        self.top_tenants = top_tenants
        self.fetch_pinned = fetch_pinned
        self.missing_pin_logged = False
        self.pinned_checked = 0.0
        self.tenants: set[str] = set()  # judged per tenant: the busiest in the reference
        self.reference: Reference | None = None
        self.latest: list[Finding] = []
        self.evaluated_unix: float | None = None
        self.lock = threading.Lock()

    def _minutes(self, start: int, end: int, pick_tenants: bool = False) -> Minutes:
        minutes = engine_minutes(self.read_rows(start, end, DRIFT_METRICS), self.place)
        if self.config.tenants:
            requests = self.read_requests(start, end)
            if pick_tenants:  # the busiest tenants of the reference, at most top_tenants of them
                volume: dict[str, int] = {}
                for key, cell in requests:
                    volume[key.tenant] = volume.get(key.tenant, 0) + cell.total
                busy = [t for t in volume if volume[t] >= self.config.min_events]
                self.tenants = set(sorted(busy, key=lambda t: (-volume[t], t))[: self.top_tenants])
            for group, by_minute in span_minutes(requests, self.tenants).items():
                minutes[group] = by_minute
        return minutes

    def build(self, start: int, end: int, window: int, now: float) -> Reference:
        """A reference over [start, end) with thresholds for `window` (what `drift pin` stores)."""
        return build_reference(self._minutes(start, end, pick_tenants=True), [(start, end)], window,
                               self.config.min_events, now)  # fmt: skip

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
            lo, hi = ranges[0][0], ranges[-1][1]
            minutes = {}
            if len(ranges) == 1:
                minutes = self._minutes(lo, hi, pick_tenants=True)
            else:
                for i, (r_lo, r_hi) in enumerate(ranges):
                    for group, by_minute in self._minutes(r_lo, r_hi, pick_tenants=i == 0).items():
                        minutes.setdefault(group, {}).update(by_minute)
            ref = build_reference(minutes, ranges, window, c.min_events, now)
            self.reference = ref
            log.info("drift reference rebuilt over %d range(s) in %.2f s", len(ranges), time.perf_counter() - started)
        assert ref is not None
        current = self._minutes(start, end)
        out = [f for f in findings(ref, current, start, end, c.min_events) if f.signal in c.signals]
        earlier = end - DATING_SECONDS - MINUTE_SECONDS
        if any(f.drifted for f in out) and earlier < start:  # date the shifts: read the minutes before
            for group, by_minute in self._minutes(earlier, start).items():
                current.setdefault(group, {}).update(by_minute)
            out = [f for f in findings(ref, current, start, end, c.min_events) if f.signal in c.signals]
        with self.lock:
            self.latest = sorted(out, key=lambda f: (not f.drifted, f.business_type, f.tenant, f.signal))
            self.evaluated_unix = now
        return self.latest
