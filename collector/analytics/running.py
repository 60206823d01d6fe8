"""Long windows of the serving view kept as running sums, so a derive pass does not re-read them.

A window of `w` seconds is split in two: the closed minutes, merged into one cell per series and
updated once per minute (the minute that closed is added, the minute that left the window is
subtracted; one minute of rows each, the one that closed from the scrapers' memory while serving
and the one that left from the store: `read_minutes`), and the minute or two still open,
as each scraper keeps them in memory (`OpenMinute`, as stored). A derive pass then costs a merge
of the open minutes, whatever the window's length; the store is read for two minutes per window
per minute instead of the whole window every pass.

Subtraction is exact for counters and histograms (integers in practice) and for the gauges' sum and
sample count; a gauge's min and max cannot be subtracted, so each gauge series keeps its per-minute
min and max for the longest window (a few floats per gauge) and recomputes them.

A minute is closed `grace` seconds after it ends (a scrape started in the last second of a minute
commits into that minute a little later). Windows longer than the minute-rollup retention (hours
compacted away) are not kept here: those reports read the store as before.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

from collector.analytics.histsums import Fold, FoldedSums
from collector.rollup import MINUTE_SECONDS, Cell, SeriesCell, SeriesIdent, period_start
from collector.sources.vllm import Kind

SeriesRef = tuple[str, SeriesIdent]  # (target, series)
ReadMinutes = Callable[[int, int], list[SeriesCell]]  # merged cells of the minutes in [start, end)


def subtract(have: Cell, gone: Cell) -> None:
    """Take `gone` (a minute that left the window) out of `have` (the window's running cell)."""
    have.value -= gone.value
    have.sum -= gone.sum
    if have.buckets is not None and gone.buckets is not None and len(have.buckets) == len(gone.buckets):
        have.buckets = [a - b for a, b in zip(have.buckets, gone.buckets, strict=True)]
    have.n -= gone.n
    have.observed_seconds -= gone.observed_seconds


class RunningWindow:
    """One window's closed minutes [closed_end - span, closed_end) merged per series, where
    `span` is the window less the minute still running; `oldest` holds the cells of its oldest
    minute (subtracted on the next advance, and while the previous minute is still in its grace).

    With a `fold`, the histogram series are also kept summed per business type (`folded`, see
    collector/analytics/histsums.py), each sum changing exactly as its series do; `in_grace` is
    what taking `oldest` out would take from those sums."""

    __slots__ = ("cells", "fold", "folded", "in_grace", "memos", "oldest", "seconds", "span")

    def __init__(self, seconds: int, fold: Fold | None = None) -> None:
        self.seconds = seconds
        self.span = seconds - MINUTE_SECONDS
        self.cells: dict[SeriesRef, SeriesCell] = {}
        self.oldest: list[SeriesCell] = []
        self.fold = fold
        self.folded = FoldedSums()
        self.in_grace = FoldedSums()
        self.memos: dict[bool, dict[str, object]] = {}  # ClosedView.memo, in the grace or not

    def changed(self) -> None:
        """The cells changed (an advance ended): the views taken from now on share new memos."""
        self.memos = {}
        self.note_grace()

    def add(self, cells: Iterable[SeriesCell]) -> set[SeriesRef]:
        """Add a minute's cells; returns the series given a new cell (no view holds them yet:
        `remove` may change those in place until the advance ends)."""
        into, fold, folded = self.cells, self.fold, self.folded
        fresh = set()
        for sc in cells:
            ref = (sc.target, sc.ident)
            have = into.get(ref)
            if have is None:
                into[ref] = SeriesCell(sc.target, sc.ident, sc.unit, sc.cell.copy())
            else:  # a new cell, never a change in place: a pass's ClosedView keeps the old one
                merged = have.cell.copy()
                merged.merge(sc.cell)
                into[ref] = SeriesCell(sc.target, sc.ident, sc.unit, merged)
            fresh.add(ref)
            if fold is not None and sc.ident.kind is Kind.HISTOGRAM and (key := fold.key(sc.target, sc.ident)):
                folded.add(key, sc.cell, 1 if have is None else 0)
        return fresh

    def remove(self, cells: Iterable[SeriesCell], fresh: set[SeriesRef] | frozenset[SeriesRef] = frozenset()) -> None:
        """Take a minute's cells out (`fresh`: series whose cell `add` just made, changed in place)."""
        fold, folded, into = self.fold, self.folded, self.cells
        for sc in cells:
            ref = (sc.target, sc.ident)
            have = into.get(ref)
            if have is None:
                continue
            if fold is not None and sc.ident.kind is Kind.HISTOGRAM and (key := fold.key(sc.target, sc.ident)):
                folded.subtract(key, *_taken(have.cell, sc.cell))
            remove(into, (sc,), in_place=ref in fresh)

    def note_grace(self) -> None:
        """What `remove(oldest)` would take from the folded sums (read while the previous minute
        is in its grace, so that the closed part is one minute shorter)."""
        self.in_grace = grace = FoldedSums()
        if self.fold is None:
            return
        for sc in self.oldest:
            if sc.ident.kind is not Kind.HISTOGRAM:
                continue
            have = self.cells.get((sc.target, sc.ident))
            key = self.fold.key(sc.target, sc.ident)
            if have is not None and key is not None:
                grace.add(key, *_taken(have.cell, sc.cell))


def _taken(have: Cell, gone: Cell) -> tuple[Cell, int]:
    """What taking `gone` out of a series' window cell `have` takes from its folded sum, and how
    many series: when nothing of the series is left (`remove` then drops it), all it held."""
    if have.observed_seconds - gone.observed_seconds <= 1e-9 and have.n - gone.n <= 0:
        return have, 1
    return gone, 0


def add(into: dict[SeriesRef, SeriesCell], cells: Iterable[SeriesCell]) -> None:
    for sc in cells:
        ref = (sc.target, sc.ident)
        have = into.get(ref)
        if have is None:
            into[ref] = SeriesCell(sc.target, sc.ident, sc.unit, sc.cell.copy())
        else:
            have.cell.merge(sc.cell)


def remove(into: dict[SeriesRef, SeriesCell], cells: Iterable[SeriesCell], in_place: bool = True) -> None:
    """Take `cells` out of `into` (without `in_place`, a changed series gets a new cell)."""
    for sc in cells:
        ref = (sc.target, sc.ident)
        have = into.get(ref)
        if have is None:
            continue
        if not in_place:
            have = into[ref] = SeriesCell(have.target, have.ident, have.unit, have.cell.copy())
        subtract(have.cell, sc.cell)
        c = have.cell
        if c.observed_seconds <= 1e-9 and c.n <= 0:
            del into[ref]  # nothing of this series is left in the window
        elif c.kind is not Kind.GAUGE:
            # float residue of many additions and subtractions never shows as a negative count
            c.value = max(0.0, c.value)
            if c.buckets is not None:
                c.buckets = [max(0.0, b) for b in c.buckets]


class RunningWindows:
    """The configured long windows, advanced minute by minute (thread-safe)."""

    def __init__(
        self, windows: Iterable[float], read_minutes: ReadMinutes, grace_seconds: float, fold: Fold | None = None
    ) -> None:
        self.windows = {int(w): RunningWindow(int(w), fold) for w in windows if w > MINUTE_SECONDS}
        self.read_minutes = read_minutes
        self.grace = grace_seconds
        self.closed_end: int | None = None  # minutes before this are in the sums
        self.longest = max((w.span for w in self.windows.values()), default=0)
        # per gauge series: (minute, min, max) of the minutes still in the longest window
        self.gauge_minutes: dict[SeriesRef, deque[tuple[int, float, float]]] = {}
        self.lock = threading.Lock()
        self.rebuilds = 0
        self.minutes_read = 0

    def closed_before(self, now_unix: float) -> int:
        """Minutes starting before this are closed at `now`."""
        return period_start(now_unix - self.grace)

    def _read(self, minute: int) -> list[SeriesCell]:
        self.minutes_read += 1
        return self.read_minutes(minute, minute + MINUTE_SECONDS)

    def advance(self, now_unix: float) -> None:
        """Bring every window up to the minutes closed at `now` (reads the store)."""
        with self.lock:
            target = self.closed_before(now_unix)
            if self.closed_end is not None and target <= self.closed_end:
                return
            if self.closed_end is None or target - self.closed_end >= self.longest:
                self._rebuild(target)
                return
            # per window, the series whose cells this advance made: no view holds them yet, so
            # they change in place (the others copy-on-write)
            fresh: dict[int, set[SeriesRef]] = {seconds: set() for seconds in self.windows}
            for minute in range(self.closed_end, target, MINUTE_SECONDS):
                arrived = self._read(minute)
                self._note_gauges(minute, arrived)
                end = minute + MINUTE_SECONDS
                for w in self.windows.values():
                    made = fresh[w.seconds]
                    made |= w.add(arrived)
                    w.remove(w.oldest, made)  # the minute end - span - 60 left
                    w.oldest = self._read(end - w.span) if w.span > MINUTE_SECONDS else arrived
            self.closed_end = target
            self._fix_gauges(fresh)
            for w in self.windows.values():
                w.changed()

    def _rebuild(self, target: int) -> None:
        """Start afresh from the store (first pass, or after a pause longer than the longest window)."""
        self.rebuilds += 1
        self.gauge_minutes.clear()
        for w in self.windows.values():
            w.cells.clear()
            w.folded.clear()
            w.oldest = []
        for minute in range(target - self.longest, target, MINUTE_SECONDS):
            cells = self._read(minute)
            self._note_gauges(minute, cells)
            for w in self.windows.values():
                if minute >= target - w.span:
                    w.add(cells)
                if minute == target - w.span:
                    w.oldest = cells
        self.closed_end = target
        self._fix_gauges()
        for w in self.windows.values():
            w.changed()

    def _note_gauges(self, minute: int, cells: Iterable[SeriesCell]) -> None:
        for sc in cells:
            if sc.ident.kind is Kind.GAUGE and sc.cell.n:
                self.gauge_minutes.setdefault((sc.target, sc.ident), deque()).append(
                    (minute, sc.cell.gmin, sc.cell.gmax)
                )

    def _fix_gauges(self, fresh: dict[int, set[SeriesRef]] | None = None) -> None:
        """Min and max of every gauge over each window's minutes (they cannot be subtracted);
        `fresh`: per window, the series whose cells the advance made (changed in place)."""
        assert self.closed_end is not None
        oldest = self.closed_end - self.longest
        for ref in list(self.gauge_minutes):
            minutes = self.gauge_minutes[ref]
            while minutes and minutes[0][0] < oldest:
                minutes.popleft()
            if not minutes:
                del self.gauge_minutes[ref]
                continue
            for w in self.windows.values():
                sc = w.cells.get(ref)
                if sc is None:
                    continue
                if fresh is not None and ref in fresh[w.seconds]:
                    _min_max(sc.cell, minutes, self.closed_end - w.span, self.closed_end)
                else:
                    cell = sc.cell.copy()  # copy-on-write, as in RunningWindow.add
                    _min_max(cell, minutes, self.closed_end - w.span, self.closed_end)
                    w.cells[ref] = SeriesCell(sc.target, sc.ident, sc.unit, cell)

    def view(self, seconds: float, now_unix: float) -> ClosedView | None:
        """The window's closed minutes as they are at `now`, kept as they are (the windows change
        their series copy-on-write): what `closed` copies from, now or later. None when this
        window is not kept here or `now` is not where the sums are."""
        w = self.windows.get(int(seconds))
        if w is None:
            return None
        with self.lock:
            closed_end = self.closed_end
            if closed_end is None or self.closed_before(now_unix) != closed_end:
                return None
            in_grace = closed_end < period_start(now_unix)  # the previous minute is still open
            gauges = {}
            if in_grace:
                gauges = {
                    ref: tuple(self.gauge_minutes[ref])
                    for ref, sc in w.cells.items()
                    if sc.ident.kind is Kind.GAUGE and ref in self.gauge_minutes
                }
            memo = w.memos.setdefault(in_grace, {})
            return ClosedView(closed_end, w.span, dict(w.cells), w.oldest if in_grace else [], gauges, memo)

    def closed(self, seconds: float, now_unix: float, histograms: bool = True) -> tuple[int, list[SeriesCell]] | None:
        """(end of the closed minutes, copies of the cells of the window's closed minutes at `now`),
        or None when this window is not kept here or `now` is not where the sums are; without
        `histograms`, the counters and gauges only (`closed_histograms` has their sums)."""
        view = self.view(seconds, now_unix)
        return None if view is None else (view.closed_end, view.copies(histograms))

    def closed_histograms(self, seconds: float, now_unix: float) -> tuple[int, FoldedSums] | None:
        """Like `closed`, the window's histograms summed per business type (a copy), from the
        sums kept as minutes enter and leave; None where `closed` is None or nothing is folded."""
        w = self.windows.get(int(seconds))
        if w is None or w.fold is None:
            return None
        with self.lock:
            closed_end = self.closed_end
            if closed_end is None or self.closed_before(now_unix) != closed_end:
                return None
            sums = w.folded.copy()
            if closed_end < period_start(now_unix):
                sums.minus(w.in_grace)
            return closed_end, sums


class ClosedView(NamedTuple):
    """One window's closed minutes at one moment (see RunningWindows.view).

    The report's window is the minute running at `now` plus the `seconds - 60` before it; while
    the previous minute is still in its grace it is open too, and the closed part is one minute
    shorter: `oldest` is then the minute taken out, and `gauges` the per-minute extremes that give
    the gauges' min and max without it."""

    closed_end: int
    span: int
    cells: dict[SeriesRef, SeriesCell]  # as kept: never changed, read only
    oldest: list[SeriesCell]
    gauges: dict[SeriesRef, tuple[tuple[int, float, float], ...]]
    # what readers derive from these closed minutes, shared by every view of them until the next
    # advance (collector/windowcells.py: reduce_closed)
    memo: dict[str, object]

    def copies(self, histograms: bool = True) -> list[SeriesCell]:
        """Copies of the window's closed cells (without `histograms`: counters and gauges)."""
        return list(self.copies_by_ref(histograms).values())

    def scalars(self) -> dict[SeriesRef, SeriesCell]:
        """The window's closed counters and gauges (and its histograms, left as they are: read
        them from the sums), read only: the kept cells themselves, but new cells for the series
        that the minute in grace changes (what `copies_by_ref` copies and changes)."""
        if not self.oldest:
            return self.cells
        cells = dict(self.cells)  # histograms too (unchanged: the reader skips them)
        self._take_grace(cells, histograms=False, copies=False)
        return cells

    def copies_by_ref(self, histograms: bool = True) -> dict[SeriesRef, SeriesCell]:
        """`copies`, keyed by (target, ident): what open minutes are merged into."""
        cells = {
            ref: SeriesCell(sc.target, sc.ident, sc.unit, sc.cell.copy())
            for ref, sc in self.cells.items()
            if histograms or sc.ident.kind is not Kind.HISTOGRAM
        }
        if self.oldest:
            self._take_grace(cells, histograms, copies=True)
        return cells

    def _take_grace(self, cells: dict[SeriesRef, SeriesCell], histograms: bool, copies: bool) -> None:
        """Take the minute in grace (`oldest`) out of `cells`, and give each gauge the extremes
        of the minutes left. `copies`: the cells are this caller's own, changed in place; else
        a changed series gets a new cell and the view's cells are never changed."""
        gone = self.oldest if histograms else [sc for sc in self.oldest if sc.ident.kind is not Kind.HISTOGRAM]
        remove(cells, gone, in_place=copies)
        start = self.closed_end - self.span + MINUTE_SECONDS
        for ref, minutes in self.gauges.items():
            sc = cells.get(ref)
            if sc is None:
                continue
            if copies:
                _min_max(sc.cell, minutes, start, self.closed_end)
            else:
                cell = sc.cell.copy()
                _min_max(cell, minutes, start, self.closed_end)
                cells[ref] = SeriesCell(sc.target, sc.ident, sc.unit, cell)


def _min_max(cell: Cell, minutes: Iterable[tuple[int, float, float]], start: int, end: int) -> None:
    inside = [(lo, hi) for m, lo, hi in minutes if start <= m < end]
    cell.gmin = min((lo for lo, _ in inside), default=math.nan)
    cell.gmax = max((hi for _, hi in inside), default=math.nan)
