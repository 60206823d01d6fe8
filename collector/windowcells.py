"""Every series' cells of a serving window as the scrapers hold them in memory: each target's
recent scrapes (the sliding windows) and the minutes it has not closed yet (the long windows'
open part), what a derive pass keeps of both for the groups it derives later
(collector/analytics/serving.py: LazyGroups), and a pass's reduction of a window's counters and
gauges per business type (`reduce_sliding`, `reduce_window`: serving.py's ScopeScalars)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import nan

from collector.analytics.running import ClosedView, SeriesRef
from collector.analytics.serving import TypeScalars
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.dcgm import is_gpu_metric
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


def reduce_window(into: TypeScalars, closed: dict[SeriesRef, SeriesCell], kept: Kept, from_minute: int) -> None:
    """Reduce a long window's counters and gauges into `into`: each series' closed cell (from
    `ClosedView.scalars`; histograms are skipped) merged with its kept open cells from
    `from_minute` on, as `add_open` merges them into copies, without a copy or a series cell
    per series (a counter adds its values and observed time; only gauges merge cells)."""
    opened: dict[SeriesRef, tuple[dict[SeriesKey, str], list[Cell]]] = {}
    for name, ident, units, cell in _open_items(kept, from_minute, None, None, histograms=False):
        have = opened.get((name, ident))
        if have is None:
            opened[(name, ident)] = (units, [cell])
        else:
            have[1].append(cell)
    pop = opened.pop
    for ref, sc in closed.items():
        ident = sc.ident
        kind = ident.kind
        if kind is Kind.HISTOGRAM or is_gpu_metric(ident.key.metric):
            continue
        scope = into.scope(sc.target, ident.key.model)
        more = pop(ref, None)
        if more is None:
            scope.add(sc.target, ident, sc.unit, sc.cell)
        elif kind is Kind.COUNTER:
            value, observed = sc.cell.value, sc.cell.observed_seconds
            for cell in more[1]:
                value += cell.value
                observed += cell.observed_seconds
            scope.add_counter(sc.target, ident, sc.unit, value, observed)
        else:
            merged = sc.cell.copy()
            for cell in more[1]:
                merged.merge(cell)
            scope.add_gauge(ident.key.metric, sc.unit, merged)
    for (name, ident), (units, cells) in opened.items():  # series the closed minutes do not have
        if is_gpu_metric(ident.key.metric):
            continue
        merged = cells[0].copy()
        for cell in cells[1:]:
            merged.merge(cell)
        into.scope(name, ident.key.model).add(name, ident, units.get(ident.key, ""), merged)
