"""Counter deltas and mergeable per-period cells: the internal currency of llmslo.

A scrape gives cumulative values; `DeltaTracker` turns consecutive scrapes into deltas that
never go negative (a restarted server's counters start again from zero: the delta is the new
value). Deltas land in `Cell`s keyed by (series, period start); cells merge associatively,
so any window is a merge of minute (or, after compaction, hour) cells.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from collector.sources.vllm import EngineSnapshot, Kind, SeriesKey

MINUTE_SECONDS = 60
K = TypeVar("K", bound=Hashable)
HOUR_SECONDS = 3600
# A server's clock may run a little ahead of ours: a process start up to this far in our future
# still counts as "just started"; further ahead, the start time is not believable.
CLOCK_SKEW_SECONDS = 60.0


class SeriesIdent(NamedTuple):
    """A stored series of one target. Histograms include their bucket bounds: a new layout is a
    new series, and cells of different layouts are never merged."""

    key: SeriesKey
    kind: Kind
    bounds: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class SeriesCell:
    """One series' cell merged over a window, and the target it came from."""

    target: str
    ident: SeriesIdent
    unit: str
    cell: Cell


class Row(NamedTuple):
    """One stored cell (a minute or, after compaction, an hour) of one series."""

    start_unix: int
    period_seconds: int
    cell: SeriesCell


@dataclass(slots=True)
class Cumulative:
    """The last cumulative value seen for a series (what the next delta is taken against)."""

    value: float  # counter value, or histogram count
    sum: float = 0.0
    buckets: list[float] | None = None


@dataclass(slots=True)
class Cell:
    """One series aggregated over one period. Fields by kind:

    counter: value = delta.  histogram: value = count delta, sum = sum delta, buckets = per
    bound cumulative count deltas (last = +Inf).  gauge: min/max/last, sum and n of samples.
    observed_seconds is the scrape time the deltas cover, so rate = delta / observed_seconds.
    """

    kind: Kind
    value: float = 0.0
    sum: float = 0.0
    buckets: list[float] | None = None
    gmin: float = math.nan
    gmax: float = math.nan
    glast: float = math.nan
    n: int = 0
    observed_seconds: float = 0.0
    last_unix: float = 0.0

    def merge(self, other: Cell) -> None:
        """Fold `other` (a later or concurrent cell of the same series) into this one."""
        self.value += other.value
        self.sum += other.sum
        if other.buckets is not None:
            if self.buckets is None:
                self.buckets = list(other.buckets)
            elif len(self.buckets) != len(other.buckets):
                raise ValueError(f"cannot merge {len(other.buckets)} buckets into {len(self.buckets)}")
            else:  # the hottest loop of a derive pass: map, not a comprehension
                self.buckets = list(map(operator.add, self.buckets, other.buckets))
        if other.n:
            self.gmin = other.gmin if not self.n else min(self.gmin, other.gmin)
            self.gmax = other.gmax if not self.n else max(self.gmax, other.gmax)
            if other.last_unix >= self.last_unix:
                self.glast = other.glast
        self.n += other.n
        self.observed_seconds += other.observed_seconds
        if other.last_unix > self.last_unix:
            self.last_unix = other.last_unix

    def copy(self) -> Cell:
        return Cell(
            self.kind,
            self.value,
            self.sum,
            None if self.buckets is None else list(self.buckets),
            self.gmin,
            self.gmax,
            self.glast,
            self.n,
            self.observed_seconds,
            self.last_unix,
        )


def add_counts(into: dict[K, list[float]], key: K, counts: Sequence[float]) -> None:
    """Add a histogram's bucket counts into `into[key]` (a copy on first sight): how windows,
    drift populations and capacity hours merge the buckets of one layout."""
    have = into.get(key)
    if have is None:
        into[key] = list(counts)
    elif len(have) != len(counts):
        raise ValueError(f"cannot add {len(counts)} bucket counts to {len(have)}")
    else:  # map, not a comprehension: a report adds millions of these
        into[key] = list(map(operator.add, have, counts))


def period_start(unix: float, period_seconds: int = MINUTE_SECONDS) -> int:
    return int(unix // period_seconds) * period_seconds


@dataclass(slots=True)
class ScrapeDeltas:
    """What one scrape adds: one cell per series for the scrape's minute, and the new state of
    the series whose cumulative values changed (or that are new): an unchanged series' stored
    state is already right, and an idle server's counters need no write every scrape.

    `restarted` says the server restarted since the previous committed scrape (a new process
    start time, or a counter that went down); `resets` counts the series that reset.
    `from_process_start` says the counters were counted from zero because the server started
    recently (created-timestamp semantics on a first scrape)."""

    minute: int
    cells: dict[SeriesIdent, Cell]
    state: dict[SeriesIdent, Cumulative]
    resets: int
    process_start_unix: float | None = None
    restarted: bool = False
    from_process_start: bool = False
    observed_seconds: float = 0.0
    unix: float = 0.0  # when the scrape ran (the SLO ledger's fine slots, for scaled windows)


@dataclass(slots=True)
class DeltaTracker:
    """Per-target memory of the previous scrape. `baseline_unix` is the time of the last
    successful scrape (None before the first), persisted so a collector restart resumes."""

    state: dict[SeriesIdent, Cumulative] = field(default_factory=dict)
    baseline_unix: float | None = None
    process_start_unix: float | None = None  # of the server at the last committed scrape

    def observe(self, snapshot: EngineSnapshot, now_unix: float, startup_lookback_seconds: float = 0.0) -> ScrapeDeltas:
        """Deltas since the previous scrape. Pure with respect to `self` until `commit()`.

        Like Prometheus with created timestamps, counting starts from zero when the server's
        process started after the last committed scrape: a restart (the delta is the new value,
        covering only the time since the process started), or, on a target's first scrape, a
        server that started at most `startup_lookback_seconds` ago. Otherwise a first scrape is a
        baseline (its deltas are zero: what came before it is not attributable to any window).
        """
        started = snapshot.process_start_unix
        baseline = self.baseline_unix
        restarted = False
        if baseline is None:
            from_zero = started is not None and -CLOCK_SKEW_SECONDS <= now_unix - started <= startup_lookback_seconds
            observed = max(0.0, now_unix - started) if from_zero and started is not None else 0.0
        else:
            from_zero = True  # a series appearing after the first scrape started from zero since then
            observed = max(0.0, now_unix - baseline)
            if started is not None:
                # A new process start time means a restart even if a counter is already back at its
                # old value (equal values are otherwise indistinguishable from no traffic).
                known = self.process_start_unix
                restarted = started != known if known is not None else started > baseline
        cells: dict[SeriesIdent, Cell] = {}
        state: dict[SeriesIdent, Cumulative] = {}
        resets = 0
        prev_state: dict[SeriesIdent, Cumulative] = {} if restarted else self.state
        counter_cells: list[Cell] = []
        for key, value in snapshot.counters.items():
            ident = SeriesIdent(key, Kind.COUNTER)
            prev = prev_state.get(ident)
            if prev is None:
                delta = value if from_zero else 0.0
            elif value < prev.value:
                delta = value
                resets += 1
            else:
                delta = value - prev.value
            cells[ident] = cell = Cell(Kind.COUNTER, value=delta, last_unix=now_unix)
            counter_cells.append(cell)
            if prev is None or value != prev.value:
                state[ident] = Cumulative(value)
        for key, value in snapshot.gauges.items():
            ident = SeriesIdent(key, Kind.GAUGE)
            cells[ident] = Cell(
                Kind.GAUGE,
                sum=value,
                gmin=value,
                gmax=value,
                glast=value,
                n=1,
                observed_seconds=observed,
                last_unix=now_unix,
            )
        for key, point in snapshot.histograms.items():
            ident = SeriesIdent(key, Kind.HISTOGRAM, point.bounds)
            prev = prev_state.get(ident)
            cur = point.cumulative
            if prev is None or prev.buckets is None:
                if from_zero:
                    buckets, count, total = list(cur), point.count, point.sum
                else:
                    buckets, count, total = [0.0] * len(cur), 0.0, 0.0
            elif len(cur) != len(prev.buckets):
                raise ValueError(f"{key.metric}: {len(cur)} buckets after {len(prev.buckets)} in the same layout")
            elif point.count < prev.value or any(map(operator.lt, cur, prev.buckets)):  # map: per bucket in C
                buckets, count, total = list(cur), point.count, point.sum
                resets += 1
            else:
                buckets = list(map(operator.sub, cur, prev.buckets))
                count, total = point.count - prev.value, point.sum - prev.sum
            cells[ident] = cell = Cell(Kind.HISTOGRAM, value=count, sum=total, buckets=buckets, last_unix=now_unix)
            counter_cells.append(cell)
            if prev is None or point.count != prev.value or point.sum != prev.sum or prev.buckets != cur:
                state[ident] = Cumulative(point.count, point.sum, list(cur))
        if restarted:
            resets += len(counter_cells)
            if started is not None and baseline is not None:
                # the new process counted only since it started, not over the whole gap
                observed = max(0.0, now_unix - max(started, baseline))
        elif resets:
            restarted = True  # a counter went down: a restart the process start time did not show
        for cell in counter_cells:
            cell.observed_seconds = observed
        return ScrapeDeltas(
            period_start(now_unix),
            cells,
            state,
            resets,
            started,
            restarted=restarted,
            from_process_start=baseline is None and from_zero,
            observed_seconds=observed,
            unix=now_unix,
        )

    def commit(self, deltas: ScrapeDeltas, now_unix: float) -> None:
        """Adopt the scrape's state once its cells are durably stored."""
        self.state.update(deltas.state)
        self.baseline_unix = now_unix
        if deltas.process_start_unix is not None:
            self.process_start_unix = deltas.process_start_unix


def hour_pieces(start: int, end: int, first: int | None) -> Iterator[tuple[int, int]]:
    """[start, end) cut at the hours of the clock, from the hour holding `first` (the oldest
    stored cell: nothing before it to read; None: nothing at all)."""
    if first is None:
        return
    lo = max(start, first - first % HOUR_SECONDS)
    while lo < end:
        hi = min(end, lo - lo % HOUR_SECONDS + HOUR_SECONDS)
        yield lo, hi
        lo = hi


READ_CELLS = 100_000  # cells per read for the readers of long periods (~250 MB of rows in memory)


def read_step(series: int) -> int:
    """Seconds of minute cells per read: the most whole minutes dividing an hour whose cells for
    `series` series stay within READ_CELLS (at least one minute)."""
    fitting = [m for m in (60, 30, 20, 15, 12, 10, 6, 5, 4, 3, 2, 1) if m * max(1, series) <= READ_CELLS]
    return (fitting[0] if fitting else 1) * MINUTE_SECONDS
