"""Every series' cells of a serving window as the scrapers hold them in memory: each target's
recent scrapes (the sliding windows) and the minutes it has not closed yet (the long windows'
open part), what a derive pass keeps of both for the groups it derives later
(collector/analytics/serving.py: LazyGroups), and a pass's reduction of a window's counters and
gauges per business type (`reduce_sliding`, `reduce_window`: serving.py's ScopeScalars), a long
window's from its closed minutes reduced per (target, model) once per minute (`reduce_closed`)
and its open minutes once per pass (`reduce_open`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from math import nan
from typing import Any

from collector.analytics.running import ClosedView
from collector.analytics.serving import ScopeScalars, TypeScalars
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.dcgm import GPU_PREFIX, is_gpu_metric
from collector.sources.scrape import RecentScrape, ScalarLayout, TargetScraper
from collector.sources.vllm import Kind, SeriesKey

Recent = list[tuple[str, list[RecentScrape]]]  # per target, its recent scrapes
Kept = list[tuple[str, dict[int, SeriesIdent], dict[SeriesKey, str], list[tuple[int, dict[int, Cell]]]]]


@dataclass(frozen=True, slots=True)
class PassView:
    """What a derive pass read, kept for the (target, model) groups derived when first read
    (collector/analytics/serving.py: LazyGroups): each target's recent scrapes, the running
    windows' closed minutes and copies of the open minutes' cells, as they were at `now_unix`."""

    now_unix: float
    recent: Recent
    closed: dict[int, ClosedView]
    open: Kept
    memo: dict[int, Reduced] = field(default_factory=dict)  # reduce_open's, by the minute it starts from


def recent_of(scrapers: dict[str, TargetScraper], target: str | None = None) -> Recent:
    return [(name, list(s.recent)) for name, s in scrapers.items() if target is None or name == target]


def open_of(scrapers: dict[str, TargetScraper], from_minute: int, target: str | None = None) -> Kept:
    """Copies of the minutes from `from_minute` on that each scraper keeps (the minute being
    written and the one before it); the scrapers go on adding to theirs."""
    return [
        (name, s.idents, s.units, [(minute, dict(cells)) for minute, cells in s.open_minute.kept(from_minute)])
        for name, s in scrapers.items()
        if target is None or name == target
    ]


def sliding_cells(
    recent: Recent,
    now_unix: float,
    window_seconds: float,
    target: str | None = None,
    model: str | None = None,
    histograms: bool = True,
) -> list[SeriesCell]:
    """Every series' deltas from the scrapes in (now - window, now], merged per target (without
    `histograms`: the counters and gauges).

    Each scrape's delta covers the time since the scrape before it, so the window covers
    `window_seconds` within one scrape interval, and rates divide by exactly that time."""
    out: list[SeriesCell] = []
    since = now_unix - window_seconds
    for name, scrapes in recent:
        if target is not None and name != target:
            continue
        inside = [scrape for scrape in scrapes if since < scrape.unix <= now_unix]
        if not inside:
            continue
        layout = inside[0].layout
        if not histograms and model is None and layout is not None and all(s.layout is layout for s in inside):
            out.extend(_merged_columns(name, layout, inside))
            continue
        merged: dict[SeriesIdent, SeriesCell] = {}
        for scrape in inside:
            for ident, cell in scrape.cells.items() if histograms else scrape.scalars:
                if model is not None and ident.key.model != model:
                    continue
                have = merged.get(ident)
                if have is None:
                    merged[ident] = SeriesCell(name, ident, scrape.units.get(ident.key, ""), cell.copy())
                else:
                    have.cell.merge(cell)
        out.extend(merged.values())
    return out


def _merged_columns(name: str, layout: ScalarLayout, inside: list[RecentScrape]) -> list[SeriesCell]:
    """The scalar cells of one target's scrapes that share `layout`, merged column by column:
    the same figures, added in the same order, as `Cell.merge` of each scrape's cells (sums of
    the deltas and samples, the gauges' extremes and last sample, the scrapes' observed time)."""
    observed, last_unix, columns = _columns(inside)
    units = inside[0].units
    gauges = set(layout.gauges)
    out: list[SeriesCell] = []
    for i, ident in enumerate(layout.idents):
        column = columns[i]
        if i in gauges:
            cell = _gauge_cell(column, observed, last_unix)
        else:
            cell = Cell(Kind.COUNTER, sum(column), 0.0, None, nan, nan, nan, 0, observed, last_unix)
        out.append(SeriesCell(name, ident, units.get(ident.key, ""), cell))
    return out


def _columns(inside: list[RecentScrape]) -> tuple[float, float, list[tuple[float, ...]]]:
    """Of scrapes that share one layout: their observed time, their last sample's time, and
    each series' values (a column, oldest scrape first)."""
    observed = sum(s.observed for s in inside)
    last_unix = max(s.last_unix for s in inside)
    return observed, last_unix, list(zip(*(s.values for s in inside), strict=True))


def _gauge_cell(column: tuple[float, ...], observed: float, last_unix: float) -> Cell:
    """A gauge's samples of one scrape each, merged as `Cell.merge` merges them."""
    return Cell(
        Kind.GAUGE, 0.0, sum(column), None, min(column), max(column), column[-1], len(column), observed, last_unix
    )


def reduce_sliding(into: TypeScalars, recent: Recent, now_unix: float, window_seconds: float) -> None:
    """Reduce a sliding window's counters and gauges into `into`: `sliding_cells(...,
    histograms=False)` of every target, but a target whose scrapes share one layout adds each
    counter column's sum and observed time without a cell (and its gauges as merged cells)."""
    since = now_unix - window_seconds
    for name, scrapes in recent:
        inside = [scrape for scrape in scrapes if since < scrape.unix <= now_unix]
        if not inside:
            continue
        layout = inside[0].layout
        if layout is None or any(s.layout is not layout for s in inside):
            into.add_cells(sliding_cells([(name, inside)], now_unix, window_seconds, histograms=False))
            continue
        observed, last_unix, columns = _columns(inside)
        units = inside[0].units
        gauges = set(layout.gauges)
        for i, ident in enumerate(layout.idents):
            metric = ident.key.metric
            if is_gpu_metric(metric):
                continue
            scope = into.scope(name, ident.key.model)
            if i in gauges:
                scope.add_gauge(metric, units.get(ident.key, ""), _gauge_cell(columns[i], observed, last_unix))
            else:
                scope.add_counter(name, ident, units.get(ident.key, ""), sum(columns[i]), observed)


def _open_items(
    kept: Kept, from_minute: int, target: str | None, model: str | None, histograms: bool
) -> Iterator[tuple[str, SeriesIdent, dict[SeriesKey, str], Cell]]:
    """(target, ident, the target's units, cell) of each kept open cell from `from_minute` on."""
    for name, idents, units, minutes in kept:
        if target is not None and name != target:
            continue
        for minute, cells in minutes:
            if minute < from_minute:
                continue
            for sid, cell in cells.items():
                ident = idents.get(sid)
                if ident is None or (model is not None and ident.key.model != model):
                    continue
                if histograms or ident.kind is not Kind.HISTOGRAM:
                    yield name, ident, units, cell


def open_cells(
    kept: Kept, from_minute: int, target: str | None = None, model: str | None = None, histograms: bool = True
) -> list[SeriesCell]:
    """The kept open minutes' cells from `from_minute` on (without `histograms`: counters and gauges)."""
    return [
        SeriesCell(name, ident, units.get(ident.key, ""), cell)
        for name, ident, units, cell in _open_items(kept, from_minute, target, model, histograms)
    ]


def add_open(
    into: dict[tuple[str, SeriesIdent], SeriesCell],
    kept: Kept,
    from_minute: int,
    target: str | None = None,
    model: str | None = None,
    histograms: bool = True,
) -> None:
    """Merge `open_cells(kept, from_minute, ...)` into `into` (series cells keyed by (target,
    ident), changed in place; a series not there yet gets a copy), without building a series
    cell for each open cell first: at a thousand targets that was a third of the merge."""
    for name, ident, units, cell in _open_items(kept, from_minute, target, model, histograms):
        have = into.get((name, ident))
        if have is None:
            into[(name, ident)] = SeriesCell(name, ident, units.get(ident.key, ""), cell.copy())
        else:
            have.cell.merge(cell)


class GroupScalars:
    """One (target, model)'s counters and gauges over a span, reduced from its series: each
    counter metric's sum, request_success per finished reason, the prefix cache counters' units,
    each counter series' observed time (and the longest: `top`, one series that has it, the
    closed minutes' series that have it, and whether every series has it), each gauge series'
    merged cell.

    A long window's closed minutes are reduced once per advance of the running windows (and once
    more for the passes in a minute's grace), the open minutes once per pass for every window;
    `reduce_window` adds the two group by group, where merging every series took a Python loop
    over all of them per window per pass. The open minutes' series are keyed by the scraper's
    series id (`idents` names them), the closed minutes' by their identity."""

    __slots__ = ("at_top", "counters", "finished", "gauges", "idents", "observed", "some", "top", "uniform", "units")

    def __init__(self, idents: dict[int, SeriesIdent] | None = None) -> None:
        self.counters: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.units: set[str] = set()
        self.observed: dict[Any, float] = {}  # series (id or identity) -> observed seconds
        self.idents = idents
        self.gauges: dict[SeriesIdent, Cell] = {}
        self.top: float | None = None
        self.some: SeriesIdent | None = None
        self.at_top: frozenset[SeriesIdent] = frozenset()
        self.uniform = True

    def seal(self) -> None:
        """Note the longest observed time once every cell is added."""
        observed = self.observed
        if not observed:
            return
        top = self.top = max(observed.values())
        at_top = [s for s, seconds in observed.items() if seconds == top]
        self.uniform = len(at_top) == len(observed)
        self.some = at_top[0] if self.idents is None else self.idents[at_top[0]]
        if self.idents is None:
            self.at_top = frozenset(at_top)

    def series_observed(self) -> Iterator[tuple[SeriesIdent, float]]:
        idents = self.idents
        for s, seconds in self.observed.items():
            yield (s if idents is None else idents[s]), seconds


Reduced = dict[tuple[str, str], GroupScalars]  # (target, model) -> its counters and gauges
_REASONS: dict[tuple[tuple[str, str], ...], str] = {}  # request_success labels -> finished reason


def _reason(labels: tuple[tuple[str, str], ...]) -> str:
    reason = _REASONS.get(labels)
    if reason is None:
        reason = _REASONS[labels] = dict(labels).get("finished_reason", "unknown")
    return reason


def _add(group: GroupScalars, series: Any, ident: SeriesIdent, unit: str | None, cell: Cell) -> None:
    """One counter or gauge cell of `group` (a series may come once per minute); `series` keys
    its observed time. `unit` matters only for prefix_cache_queries (the open minutes look it
    up for that metric alone)."""
    key = ident.key
    metric = key.metric
    if metric == "prefix_cache_queries" and unit:
        group.units.add(unit)
    if ident.kind is Kind.GAUGE:
        gauges = group.gauges
        have = gauges.get(ident)
        if have is None:
            gauges[ident] = cell
        else:  # a new cell: the ones kept are never changed
            merged = gauges[ident] = have.copy()
            merged.merge(cell)
        return
    value = cell.value
    counters = group.counters
    counters[metric] = counters.get(metric, 0.0) + value
    if metric == "request_success":
        reason = _reason(key.labels)
        group.finished[reason] = group.finished.get(reason, 0.0) + value
    observed = group.observed
    observed[series] = observed.get(series, 0.0) + cell.observed_seconds


def reduce_closed(closed: ClosedView) -> Reduced:
    """A long window's closed counters and gauges per (target, model), reduced once for every
    view of the same closed minutes (kept in the views' shared memo)."""
    reduced = closed.memo.get("scalars")
    if reduced is not None:
        return reduced  # type: ignore[return-value]
    out: Reduced = {}
    histogram = Kind.HISTOGRAM
    for sc in closed.scalars().values():
        ident = sc.ident
        if ident.kind is histogram or ident.key.metric.startswith(GPU_PREFIX):
            continue
        key = (sc.target, ident.key.model)
        group = out.get(key)
        if group is None:
            group = out[key] = GroupScalars()
        _add(group, ident, ident, sc.unit, sc.cell)
    for group in out.values():
        group.seal()
    closed.memo["scalars"] = out
    return out


def reduce_open(view: PassView, from_minute: int) -> Reduced:
    """The pass's kept open minutes' counters and gauges from `from_minute` on, per (target,
    model): reduced once per pass, shared by its long windows."""
    reduced = view.memo.get(from_minute)
    if reduced is not None:
        return reduced
    out: Reduced = {}
    histogram = Kind.HISTOGRAM
    for name, idents, units, minutes in view.open:
        model, group = None, None
        for minute, cells in minutes:
            if minute < from_minute:
                continue
            for sid, cell in cells.items():
                ident = idents.get(sid)
                if ident is None or ident.kind is histogram:
                    continue
                key = ident.key
                if key.metric.startswith(GPU_PREFIX):
                    continue
                if key.model != model or group is None:
                    model = key.model
                    group = out.get((name, model))
                    if group is None:
                        group = out[(name, model)] = GroupScalars(idents)
                unit = units.get(key, "") if key.metric == "prefix_cache_queries" else None
                _add(group, sid, ident, unit, cell)
    for group in out.values():
        group.seal()
    view.memo[from_minute] = out
    return out


def reduce_window(into: TypeScalars, closed: Reduced, opened: Reduced) -> None:
    """Reduce a long window's counters and gauges into `into`: its closed minutes' groups and
    its open minutes' groups added group by group, as merging each series' closed cell with its
    open cells and adding it would (`add_open`, then ScopeScalars.add): the sums add, a gauge
    series' cells merge, and a target's observed time is its longest series' closed plus open
    time. That longest time is found without a loop over the series when every open series has
    the same open time and one of them has the longest closed time (a target scraped every
    interval: all of them); otherwise series by series."""
    for key, c in closed.items():
        o = opened.get(key)
        scope = into.scope(*key)
        target = key[0]
        _add_sums(scope, target, c)
        if o is not None:
            _add_sums(scope, target, o)
        top = c.top if o is None else _observed(c, o)
        if top is not None:
            scope.note_observed(target, top)
        _add_gauges(scope, c, o)
    for key, o in opened.items():  # groups the closed minutes do not have
        if key in closed:
            continue
        scope = into.scope(*key)
        _add_sums(scope, key[0], o)
        if o.top is not None:
            scope.note_observed(key[0], o.top)
        _add_gauges(scope, o, None)


def _add_sums(scope: ScopeScalars, target: str, group: GroupScalars) -> None:
    sums = scope.counters.get(target)
    if not group.counters:
        pass
    elif sums is None:  # the target's first group in this scope (a target serving one model: its only one)
        scope.counters[target] = dict(group.counters)
    else:
        for metric, value in group.counters.items():
            sums[metric] = sums.get(metric, 0.0) + value
    if group.finished:
        finished = scope.finished
        for reason, value in group.finished.items():
            finished[reason] = finished.get(reason, 0.0) + value
    if group.units:
        scope.units |= group.units


def _observed(c: GroupScalars, o: GroupScalars) -> float | None:
    """The longest (closed + open) observed time of a group's counter series."""
    if c.top is None:
        return o.top
    if o.top is None:
        return c.top
    if o.uniform and o.some in c.at_top:  # every open series has o.top, and one of them c.top
        return max(c.top, c.top + o.top)
    closed = c.observed
    return max(c.top, max(closed.get(s, 0.0) + seconds for s, seconds in o.series_observed()))


def _add_gauges(scope: ScopeScalars, c: GroupScalars, o: GroupScalars | None) -> None:
    """Each gauge series' cell (the closed one merged with the open one) that saw a sample."""
    gauges = scope.gauges
    more = o.gauges if o is not None else {}
    for ident, cell in c.gauges.items():
        extra = more.get(ident)
        if extra is not None:
            cell = cell.copy()
            cell.merge(extra)
        if cell.n > 0:
            gauges.setdefault(ident.key.metric, []).append(cell)
    for ident, cell in more.items():
        if ident not in c.gauges and cell.n > 0:
            gauges.setdefault(ident.key.metric, []).append(cell)
