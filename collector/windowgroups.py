"""A long window's (target, model) groups, as the fleet view (`/api/v1/serving`) shows them,
derived from what the derive pass already reduced instead of from a merge of every series.

`derive` of each group's merged series cells (collector/analytics/serving.py: LazyGroups) took
most of a cold fleet-view read at a thousand targets (~0.8 s of ~1 s): a copy of every closed
cell, a merge of every open cell into it, then per group a loop over its cells and, per
histogram, a quantile search in Python. Here:

- the counters and gauges come from the pass's per-(target, model) reductions of the closed and
  open minutes (collector/windowcells.py: reduce_closed, reduce_open, memoised by the pass),
  added group by group by `reduce_window` into one scope per group;
- each histogram series is a row of numbers (count, sum, observed time, buckets), one array per
  bucket count: the closed cells and the open cells are added as arrays, element by element in
  the order `Cell.merge` adds them, and the quantiles of every series of one bucket layout are
  found column-wise (collector/analytics/percentiles.py: quantile_rows).

The figures are those of `derive` of the merged cells, bit for bit (tests/unit/test_window_groups.py),
except where `reduce_window` already sums in another order: a target's counters (whole numbers:
the same) and a gauge's samples (closed minutes + the open ones summed first: a mean within
a rounding of the other). A target whose histogram cells do not match their layout (none from vLLM) is derived
from its merged cells, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collector.analytics.percentiles import QuantileEstimate, quantile_rows
from collector.analytics.running import ClosedView
from collector.analytics.serving import (
    UNASSIGNED,
    GroupStats,
    LatencyStats,
    ScopeScalars,
    _latency,
    derive,
    derive_figures,
    place,
)
from collector.conventions import QUANTILES
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.dcgm import GPU_PREFIX
from collector.sources.vllm import Kind
from collector.windowcells import PassView, add_open, reduce_closed, reduce_open, reduce_window

GroupKey = tuple[str, str]  # (target, model)
HEAD = 3  # a row's columns before its buckets: count, sum, observed seconds


class GroupScopes:
    """One ScopeScalars per (target, model): `reduce_window` reduces into these the figures it
    reduces per business type for a pass."""

    __slots__ = ("scopes",)

    def __init__(self) -> None:
        self.scopes: dict[GroupKey, ScopeScalars] = {}

    def scope(self, target: str, model: str) -> ScopeScalars:
        key = (target, model)
        scope = self.scopes.get(key)
        if scope is None:
            scope = self.scopes[key] = ScopeScalars()
        return scope


class _Series:
    """The window's histogram series as rows: `at[i]` is series i's (bucket count, row), its
    row's numbers (count, sum, observed seconds, buckets) in `flat[bucket count]`, one row after
    another; `of_group` lists each group's series by metric, in the order the merged cells would
    list them (the closed minutes' first, then those only the open ones have)."""

    def __init__(self) -> None:
        self.idents: list[SeriesIdent] = []
        self.target: list[str] = []
        self.at: list[tuple[int, int]] = []
        self.flat: dict[int, list[float]] = {}
        self.ids: dict[int, list[int]] = {}  # the series of each row, by bucket count
        self.index: dict[tuple[str, SeriesIdent], int] = {}
        self.of_group: dict[GroupKey, dict[str, list[int]]] = {}
        self.irregular: set[str] = set()  # targets with a cell that does not match its layout

    def new(self, target: str, ident: SeriesIdent, width: int) -> int:
        """A new series (its row's numbers are the caller's to append)."""
        i = len(self.idents)
        self.idents.append(ident)
        self.target.append(target)
        ids = self.ids.get(width)
        if ids is None:
            ids = self.ids[width] = []
            self.flat[width] = []
        self.at.append((width, len(ids)))
        ids.append(i)
        self.index[(target, ident)] = i
        key = ident.key
        self.of_group.setdefault((target, key.model), {}).setdefault(key.metric, []).append(i)
        return i

    def drop(self, width: int, at: int) -> None:
        """Series at row `at` of `width` has nothing left in the window: it is no longer one of
        its group's, and an open cell of it starts a new row."""
        i = self.ids[width][at]
        target, ident = self.target[i], self.idents[i]
        del self.index[(target, ident)]
        self.of_group[(target, ident.key.model)][ident.key.metric].remove(i)


def _regular(ident: SeriesIdent, cell: Cell) -> bool:
    """A histogram cell with one count per bucket of its series' layout (every vLLM cell)."""
    buckets = cell.buckets
    return buckets is not None and len(buckets) == len(ident.bounds) + 1


def _gather(closed: ClosedView, view: PassView) -> tuple[_Series, dict[int, np.ndarray]]:
    """Every histogram series of the window and its merged row (arrays by bucket count)."""
    series = _Series()
    irregular = series.irregular
    histogram = Kind.HISTOGRAM
    for sc in closed.cells.values():
        ident = sc.ident
        if ident.kind is not histogram or ident.key.metric.startswith(GPU_PREFIX):
            continue
        cell = sc.cell
        if not _regular(ident, cell):
            irregular.add(sc.target)
            continue
        assert cell.buckets is not None
        series.new(sc.target, ident, len(cell.buckets))
        flat = series.flat[len(cell.buckets)]
        flat += (cell.value, cell.sum, cell.observed_seconds)
        flat += cell.buckets
    arrays = {width: _matrix(flat, width) for width, flat in series.flat.items()}
    if closed.oldest:
        _take_grace(series, arrays, closed.oldest)
    added: dict[int, tuple[list[int], list[float]]] = {}
    closed_end = closed.closed_end
    for name, idents, _units, minutes in view.open:
        slots: dict[int, tuple[int, int] | None] = {}  # per series id: its (bucket count, row)
        for minute, cells in minutes:
            if minute < closed_end:
                continue
            for sid, cell in cells.items():
                slot = slots.get(sid, _UNSEEN)
                if slot is _UNSEEN:
                    slot = slots[sid] = _slot(series, name, idents.get(sid), cell)
                if slot is None:
                    continue
                width, at = slot
                if not cell.buckets or len(cell.buckets) != width:
                    irregular.add(name)
                    continue
                where, more = added.setdefault(width, ([], []))
                where.append(at)
                more += (cell.value, cell.sum, cell.observed_seconds)
                more += cell.buckets
    for width, flat in series.flat.items():  # rows of zeros for the series only the open minutes have
        have = arrays.get(width, _matrix(flat, width))
        rows = len(series.ids[width])
        if len(have) < rows:
            have = np.concatenate((have, np.zeros((rows - len(have), width + HEAD))))
        arrays[width] = have
    for width, (where, more) in added.items():
        # in order, one after another where a row is added to twice (two open minutes): the
        # additions Cell.merge makes, in its order
        np.add.at(arrays[width], np.array(where, dtype=np.intp), _matrix(more, width))
    return series, arrays


_UNSEEN = (-1, -1)


def _slot(series: _Series, target: str, ident: SeriesIdent | None, cell: Cell) -> tuple[int, int] | None:
    """The (bucket count, row) of an open cell's series (a new row of zeros for one the closed
    minutes do not have: 0 + x is x, exactly); None for a series that is not a serving histogram."""
    if ident is None or ident.kind is not Kind.HISTOGRAM or ident.key.metric.startswith(GPU_PREFIX):
        return None
    i = series.index.get((target, ident))
    if i is None:
        i = series.new(target, ident, len(ident.bounds) + 1)
    return series.at[i]


def _matrix(flat: list[float], width: int) -> np.ndarray:
    return np.array(flat, dtype=np.float64).reshape(-1, width + HEAD)


def _take_grace(series: _Series, arrays: dict[int, np.ndarray], oldest: list[SeriesCell]) -> None:
    """Take the minute in grace out of the closed rows as `ClosedView.copies_by_ref` takes it out
    of the cells (collector/analytics/running.py: remove): subtracted, a series with no observed
    time left is dropped (one the open minutes have again starts from zero, after the others),
    the others' counts and buckets never below zero (and NaN read as zero, as `max` reads it)."""
    gone: dict[int, tuple[list[int], list[float]]] = {}
    for sc in oldest:
        ident = sc.ident
        if ident.kind is not Kind.HISTOGRAM:
            continue
        i = series.index.get((sc.target, ident))
        if i is None:
            continue
        cell = sc.cell
        if not _regular(ident, cell):
            series.irregular.add(sc.target)
            continue
        assert cell.buckets is not None
        width, at = series.at[i]
        where, rows = gone.setdefault(width, ([], []))
        where.append(at)
        rows += (cell.value, cell.sum, cell.observed_seconds)
        rows += cell.buckets
    for width, (where, rows) in gone.items():
        chosen = np.array(where, dtype=np.intp)
        left = arrays[width][chosen] - _matrix(rows, width)
        left[:, 0] = np.where(left[:, 0] > 0, left[:, 0], 0.0)
        left[:, HEAD:] = np.where(left[:, HEAD:] > 0, left[:, HEAD:], 0.0)
        arrays[width][chosen] = left
        for k in np.flatnonzero(left[:, 2] <= 1e-9).tolist():
            series.drop(width, where[k])


class _GroupHistograms:
    """serving.py's `Histograms` of one group: a metric's one series read from the quantiles
    found column-wise; several series merged as `_latency` merges them."""

    __slots__ = ("idents", "metrics", "quantiles", "row_of", "target")

    def __init__(
        self,
        target: str,
        metrics: dict[str, list[int]],
        idents: list[SeriesIdent],
        row_of: Callable[[int], list[float]],
        quantiles: list[tuple[QuantileEstimate, ...]],
    ) -> None:
        self.target = target
        self.metrics = metrics
        self.idents = idents
        self.row_of = row_of
        self.quantiles = quantiles

    def latency(self, metric: str) -> LatencyStats | None:
        found = self.metrics.get(metric)
        if not found:
            return None
        if len(found) > 1:
            return _latency([self._cell(i) for i in found], metric)
        i = found[0]
        row = self.row_of(i)
        count, total = row[0], row[1]
        return LatencyStats(count, total / count if count > 0 else None, self.quantiles[i], source=metric)

    def totals(self, metric: str) -> tuple[float, float] | None:
        found = self.metrics.get(metric)
        if not found:
            return None
        rows = [self.row_of(i) for i in found]
        return sum(r[0] for r in rows), sum(r[1] for r in rows)

    def _cell(self, i: int) -> SeriesCell:
        row = self.row_of(i)
        cell = Cell(Kind.HISTOGRAM, row[0], row[1], row[HEAD:], observed_seconds=row[2])
        return SeriesCell(self.target, self.idents[i], "", cell)


def window_groups(
    closed: ClosedView,
    view: PassView,
    window_seconds: float,
    business_type_of: Callable[[str, str], str | None],
) -> tuple[GroupStats, ...]:
    """The (target, model) groups of a long window at the pass that took `view` (whose `closed`
    view is the window's), sorted by target and model: `derive` of each group's merged cells."""
    scopes = GroupScopes()
    reduce_window(scopes, reduce_closed(closed), reduce_open(view, closed.closed_end))
    series, arrays = _gather(closed, view)
    values: dict[int, list[list[float]]] = {width: array.tolist() for width, array in arrays.items()}
    at = series.at
    idents = series.idents

    def row_of(i: int) -> list[float]:
        width, k = at[i]
        return values[width][k]

    # the quantiles of every series, one layout at a time
    quantiles: list[tuple[QuantileEstimate, ...]] = [()] * len(idents)
    by_layout: dict[tuple[float, ...], list[int]] = {}
    for i, ident in enumerate(idents):
        by_layout.setdefault(ident.bounds, []).append(i)
    for bounds, members in by_layout.items():
        width = len(bounds) + 1
        rows = arrays[width][[at[i][1] for i in members], HEAD:]
        for i, found in zip(members, quantile_rows(QUANTILES, bounds, rows), strict=True):
            quantiles[i] = found

    irregular = series.irregular
    out: list[GroupStats] = []
    histogram_groups = {key for key, metrics in series.of_group.items() if any(metrics.values())}
    for key in sorted(scopes.scopes.keys() | histogram_groups):
        target, model = key
        if target in irregular:
            continue
        scope = scopes.scope(target, model)
        metrics = series.of_group.get(key, {})
        for members in metrics.values():
            for i in members:
                scope.note_observed(target, row_of(i)[2])  # as ScopeScalars.add notes a histogram's
        stats = derive_figures(scope, _GroupHistograms(target, metrics, idents, row_of, quantiles), window_seconds)
        out.append(GroupStats(target, model, business_type_of(target, model) or UNASSIGNED, stats))
    if irregular:
        out.extend(_merged_groups(closed, view, irregular, window_seconds, business_type_of))
        out.sort(key=lambda g: (g.target, g.model))
    return tuple(out)


def _merged_groups(
    closed: ClosedView,
    view: PassView,
    targets: set[str],
    window_seconds: float,
    business_type_of: Callable[[str, str], str | None],
) -> list[GroupStats]:
    """`derive` of the merged cells of `targets`' groups (what LazyGroups does for all)."""
    merged = closed.copies_by_ref(targets=targets)
    add_open(merged, [k for k in view.open if k[0] in targets], closed.closed_end)
    members = place(merged.values(), business_type_of)[0]
    return [GroupStats(t, m, bt, derive(cells, window_seconds)) for t, m, bt, cells in members]
