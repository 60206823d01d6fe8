"""Business-type histograms kept as sums as scrapes commit, so a derive pass does not merge every
target's buckets again.

A business type's latencies (TTFT, TPOT, e2e, queue, ...) and request lengths merge the
histograms of all its targets: at fleet size most of a derive pass's arithmetic, and it was done
again for every window on every pass. Histograms add up, so each window keeps them summed per
(business type, metric, bucket layout) and changes the sums only by what enters or leaves it:

- the sliding windows (up to `sliding_horizon`): a committed scrape is added once and subtracted
  once, when it slides out (`SlidingHistograms`);
- the minutes still open: each commit adds its cells to its minute (`OpenHistograms`);
- the long windows' closed minutes: `RunningWindow` adds and subtracts whole minutes for every
  series and keeps these sums beside its per-series cells (collector/analytics/running.py).

Each sum also counts the series cells behind it, so that a layout with no series in the window
is absent, as it is from a merge of the series. Counters and gauges stay per series: rates
divide per target, gauge extremes cannot be subtracted, and scalars are cheap to merge per pass.
The per-(target, model) figures still come from the series themselves, when someone reads them.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from collector.analytics.serving import UNASSIGNED
from collector.rollup import MINUTE_SECONDS, Cell, SeriesCell, SeriesIdent
from collector.sources.dcgm import is_gpu_metric
from collector.sources.vllm import Kind, SeriesKey

FoldKey = tuple[str, str, tuple[float, ...]]  # (business type, metric, bucket bounds)
Folded = list[tuple[FoldKey, Cell]]  # one scrape's or minute's histogram cells, by the sum they join
KEEP_MINUTES = 5  # open minutes kept without a pass asking (a pass needs two)
# a sliding sum is rebuilt from its scrapes now and then, so that float residue of many additions
# and subtractions of latency sums cannot build up (bucket counts are whole numbers: exact)
REBUILD_EVERY = 240


class Fold:
    """Which business-type sum a target's series joins (None: not a serving histogram), memoised:
    the fleet map is asked once per series."""

    def __init__(self, business_type_of: Callable[[str, str], str | None]) -> None:
        self.business_type_of = business_type_of
        self._memo: dict[tuple[str, SeriesIdent], FoldKey | None] = {}
        self.layouts = Layouts()

    def key(self, target: str, ident: SeriesIdent) -> FoldKey | None:
        ref = (target, ident)
        try:
            return self._memo[ref]
        except KeyError:
            pass
        out: FoldKey | None = None
        if ident.kind is Kind.HISTOGRAM and not is_gpu_metric(ident.key.metric):
            btype = self.business_type_of(target, ident.key.model) or UNASSIGNED
            out = (btype, ident.key.metric, ident.bounds)
        if len(self._memo) >= 1_000_000:
            self._memo.clear()  # bounded like the scrapers' series caches: only costs speed
        self._memo[ref] = out
        return out

    def cells(self, target: str, cells: dict[SeriesIdent, Cell]) -> Folded:
        """The histogram cells of one scrape (or minute) of `target`, with the sum each joins."""
        out: Folded = []
        for ident, cell in cells.items():
            if ident.kind is Kind.HISTOGRAM and (k := self.key(target, ident)) is not None:
                out.append((k, cell))
        return out

    def flat(self, target: str, cells: dict[SeriesIdent, Cell]) -> Flat:
        """`cells(target, cells)` as one array of numbers under its layout (see Flat)."""
        return self.layouts.flat(target, self.cells(target, cells))


class Layout:
    """The sums a scrape's histogram cells join, in order, with each cell's bucket count (-1:
    none). Interned (`Layouts`): equal layouts are one object, hashed and compared by identity."""

    __slots__ = ("entries",)

    def __init__(self, entries: tuple[tuple[FoldKey, int], ...]) -> None:
        self.entries = entries


class Flat(NamedTuple):
    """One scrape's histogram cells as one array: per entry of its layout, the count, the sum
    and the buckets. The targets of one vLLM version share a layout, so a window adds a scrape
    to its sums with one addition of two arrays (`LayoutSums`) instead of one per histogram:
    at a thousand targets the sliding window's sums were ~5 % of the collector's CPU, most of it
    reading floats scattered over the heap one by one (numpy adds contiguous float64 arrays,
    element by element as Python adds floats: the same sums, bit for bit)."""

    layout: Layout
    values: npt.NDArray[np.float64]


class Layouts:
    """Interns layouts; remembers each target's last one (a scrape's layout is checked against
    it by identity of its keys, not hashed)."""

    def __init__(self) -> None:
        self.interned: dict[tuple[tuple[FoldKey, int], ...], Layout] = {}
        self.last: dict[str, tuple[list[tuple[FoldKey, int]], Layout]] = {}

    def flat(self, target: str, folded: Folded) -> Flat:
        entries: list[tuple[FoldKey, int]] = []
        values: list[float] = []
        for key, cell in folded:
            buckets = cell.buckets
            entries.append((key, -1 if buckets is None else len(buckets)))
            values.append(cell.value)
            values.append(cell.sum)
            if buckets is not None:
                values.extend(buckets)
        array = np.array(values, dtype=np.float64)
        last = self.last.get(target)
        if last is not None and last[0] == entries:
            return Flat(last[1], array)
        shape = tuple(entries)
        layout = self.interned.get(shape)
        if layout is None:
            if len(self.interned) >= 100_000:
                self.interned.clear()  # bounded (layouts of a churning fleet): only costs speed
            layout = self.interned[shape] = Layout(shape)
        if len(self.last) >= 1_000_000:
            self.last.clear()
        self.last[target] = (entries, layout)
        return Flat(layout, array)


class FoldedSums:
    """Histogram cells summed per FoldKey, each with the number of series cells behind it."""

    __slots__ = ("cells", "members")

    def __init__(self) -> None:
        self.cells: dict[FoldKey, Cell] = {}
        self.members: dict[FoldKey, int] = {}

    def add(self, key: FoldKey, cell: Cell, members: int = 1) -> None:
        have = self.cells.get(key)
        if have is None:
            buckets = None if cell.buckets is None else list(cell.buckets)
            self.cells[key] = Cell(Kind.HISTOGRAM, cell.value, cell.sum, buckets)
            self.members[key] = members
            return
        have.value += cell.value
        have.sum += cell.sum
        if have.buckets is not None and cell.buckets is not None:
            have.buckets = list(map(operator.add, have.buckets, cell.buckets))
        self.members[key] += members

    def subtract(self, key: FoldKey, cell: Cell, members: int = 1) -> None:
        have = self.cells.get(key)
        if have is None:
            return
        left = self.members[key] - members
        if left <= 0:
            del self.cells[key], self.members[key]
            return
        self.members[key] = left
        have.value -= cell.value
        have.sum -= cell.sum
        if have.buckets is not None and cell.buckets is not None:
            have.buckets = list(map(operator.sub, have.buckets, cell.buckets))

    def plus(self, other: FoldedSums) -> None:
        for key, cell in other.cells.items():
            self.add(key, cell, other.members[key])

    def minus(self, other: FoldedSums) -> None:
        for key, cell in other.cells.items():
            self.subtract(key, cell, other.members[key])

    def copy(self) -> FoldedSums:
        out = FoldedSums()
        out.plus(self)
        return out

    def clear(self) -> None:
        self.cells.clear()
        self.members.clear()

    def by_business_type(self) -> dict[str, list[SeriesCell]]:
        """The sums as series cells of no target, per business type, for `derive` (they carry no
        observed time: rates come from the counters of each target)."""
        out: dict[str, list[SeriesCell]] = {}
        for (btype, metric, bounds), cell in sorted(self.cells.items()):
            ident = SeriesIdent(SeriesKey("", metric), Kind.HISTOGRAM, bounds)
            out.setdefault(btype, []).append(SeriesCell("", ident, "", cell))
        return out


class LayoutSums:
    """Flat scrapes (`Flat`) summed per layout, each sum with the number of scrapes behind it:
    a layout whose last scrape left is absent. `folded()` gives the sums per FoldKey, as adding
    every scrape's cells to a FoldedSums would (each entry of a layout with n scrapes counts n
    series cells). The arrays are this object's own (changed in place, never shared)."""

    __slots__ = ("count", "sums")

    def __init__(self) -> None:
        self.sums: dict[Layout, npt.NDArray[np.float64]] = {}
        self.count: dict[Layout, int] = {}

    def add(self, flat: Flat, scrapes: int = 1) -> None:
        layout = flat.layout
        if not layout.entries:
            return
        have = self.sums.get(layout)
        if have is None:
            self.sums[layout] = flat.values.copy()
            self.count[layout] = scrapes
        else:
            have += flat.values
            self.count[layout] += scrapes

    def subtract(self, flat: Flat) -> None:
        layout = flat.layout
        have = self.sums.get(layout)
        if have is None:
            return
        left = self.count[layout] - 1
        if left <= 0:
            del self.sums[layout], self.count[layout]
            return
        self.count[layout] = left
        have -= flat.values

    def plus(self, other: LayoutSums) -> None:
        for layout, values in other.sums.items():
            self.add(Flat(layout, values), other.count[layout])

    def clear(self) -> None:
        self.sums.clear()
        self.count.clear()

    def folded(self) -> FoldedSums:
        """The sums per FoldKey (a new FoldedSums: nothing shared with these)."""
        out = FoldedSums()
        for layout, array in self.sums.items():
            scrapes = self.count[layout]
            values: list[float] = array.tolist()
            at = 0
            for key, n in layout.entries:
                buckets = None if n < 0 else values[at + 2 : at + 2 + n]
                out.add(key, Cell(Kind.HISTOGRAM, values[at], values[at + 1], buckets), scrapes)
                at += 2 + max(0, n)
        return out


class _Slide:
    """One sliding window's sums: the scrapes with time in (lo, hi]."""

    __slots__ = ("hi", "lo", "queries", "stale", "sums")

    def __init__(self) -> None:
        self.lo = self.hi = -math.inf
        self.sums = LayoutSums()
        self.stale = True  # rebuilt from the kept scrapes on the next query
        self.queries = 0


class SlidingHistograms:
    """Per sliding window length, the histogram sums of the scrapes committed in (now - w, now],
    as `Runtime.sliding_cells` merges them per series (thread-safe)."""

    def __init__(self, windows: Iterable[float], horizon_seconds: float) -> None:
        self.horizon = horizon_seconds
        self.windows = {float(w): _Slide() for w in windows}
        # (time, order, target, cells), sorted by time: commits arrive nearly in order
        self.scrapes: list[tuple[float, int, str, Flat]] = []
        self.last: dict[str, float] = {}  # per target, the time of its last scrape
        self.order = itertools.count()
        self.lock = threading.Lock()

    def add(self, target: str, unix: float, flat: Flat) -> None:
        with self.lock:
            if unix < self.last.get(target, -math.inf):
                # the target's clock went back (a test's virtual clock): its scrapes start afresh,
                # as its scraper's own recent scrapes do
                self.scrapes = [s for s in self.scrapes if s[2] != target]
                for slide in self.windows.values():
                    slide.stale = True
            self.last[target] = unix
            cut = unix - self.horizon - 60.0  # a minute more than any window: for passes a little late
            if self.scrapes and self.scrapes[0][0] <= cut:
                del self.scrapes[: bisect.bisect_right(self.scrapes, (cut, math.inf))]
                for slide in self.windows.values():
                    if slide.lo < cut:
                        slide.stale = True  # it would have subtracted scrapes no longer kept
            bisect.insort(self.scrapes, (unix, next(self.order), target, flat))
            for slide in self.windows.values():
                if not slide.stale and slide.lo < unix <= slide.hi:
                    slide.sums.add(flat)  # late: its time is already inside the window

    def sums(self, window_seconds: float, now_unix: float) -> FoldedSums | None:
        """A copy of the window's sums at `now`; None when this window is not kept here, or
        `now` is before the window's last answer (a reader from the past reads the series)."""
        with self.lock:
            slide = self.windows.get(float(window_seconds))
            if slide is None or now_unix < slide.hi:
                return None
            lo = now_unix - window_seconds
            slide.queries += 1
            if slide.stale or slide.queries % REBUILD_EVERY == 0 or lo < slide.lo:
                slide.sums.clear()
                for _, _, _, flat in self._between(lo, now_unix):
                    slide.sums.add(flat)
                slide.stale = False
            else:
                for _, _, _, flat in self._between(slide.hi, now_unix):
                    slide.sums.add(flat)
                for _, _, _, flat in self._between(slide.lo, lo):
                    slide.sums.subtract(flat)
            slide.lo, slide.hi = lo, now_unix
            return slide.sums.folded()

    def _between(self, lo: float, hi: float) -> list[tuple[float, int, str, Flat]]:
        """The kept scrapes with time in (lo, hi]."""
        scrapes = self.scrapes
        return scrapes[bisect.bisect_right(scrapes, (lo, math.inf)) : bisect.bisect_right(scrapes, (hi, math.inf))]


class OpenHistograms:
    """Per minute not yet in the running sums, the histogram sums of the cells committed into it
    (thread-safe).

    A commit that had to read its minute's stored rows first (after a collector restart in the
    middle of that minute, or a clock that went back) brings cells this process did not count:
    that minute is marked incomplete, and windows that hold it are merged from the series."""

    def __init__(self) -> None:
        self.minutes: dict[int, LayoutSums] = {}
        self.incomplete: set[int] = set()
        self.lock = threading.Lock()

    def add(self, minute: int, flat: Flat, read_stored: bool) -> None:
        with self.lock:
            if read_stored:
                self.incomplete.add(minute)
            sums = self.minutes.get(minute)
            if sums is None:
                sums = self.minutes[minute] = LayoutSums()
                # a pass asks for the minute running and the one before (plus a grace under a
                # minute): older ones are forgotten here too, for a process that runs no passes
                for old in [m for m in self.minutes if m < minute - KEEP_MINUTES * MINUTE_SECONDS]:
                    del self.minutes[old]
                    self.incomplete.discard(old)
            sums.add(flat)

    def since(self, from_minute: int) -> FoldedSums | None:
        """The sums of the minutes from `from_minute` on (None: one of them is incomplete); the
        minutes before are forgotten (they are in the running sums)."""
        with self.lock:
            for minute in [m for m in self.minutes if m < from_minute]:
                del self.minutes[minute]
            self.incomplete = {m for m in self.incomplete if m >= from_minute}
            if self.incomplete:
                return None
            out = LayoutSums()
            for sums in self.minutes.values():
                out.plus(sums)
            return out.folded()
