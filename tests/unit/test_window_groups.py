"""The fleet view's (target, model) groups of a long window from the pass's reductions and the
histograms read as arrays (collector/windowgroups.py), against `derive` of each group's merged
series cells (what LazyGroups did for every group), and the column-wise quantiles against the
quantile of each histogram on its own (collector/analytics/percentiles.py).

The windows are what a real collector holds: several series of one histogram in a group (a
data-parallel vLLM's engines), two bucket layouts of one metric (a version upgrade mid-window),
series only in the closed minutes or only in the open ones, a series whose whole time in the
window is the minute in its grace (dropped, then back in the open minutes), a target serving two
models, a group with histograms and nothing else, a cell whose buckets do not match its layout,
a DCGM series, empty histograms and gauges that saw no sample."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.analytics.percentiles import histogram_quantiles, quantile_rows
from collector.analytics.running import ClosedView
from collector.analytics.serving import ServingStats, derive, place
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.vllm import Kind, SeriesKey
from collector.windowcells import PassView, add_open
from collector.windowgroups import window_groups

MINUTE = 1_800_000_000
TYPES = {("a", "llama"): "chat", ("b", "qwen"): "batch"}
FAST, SLOW = (0.1, 0.5, 1.0), (0.25, 1.0, 2.5, 10.0)

SERIES = [
    SeriesIdent(SeriesKey("llama", "request_success", (("finished_reason", "stop"),)), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "generation_tokens"), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "kv_cache_usage"), Kind.GAUGE),
    SeriesIdent(SeriesKey("llama", "ttft", (("engine", "0"),)), Kind.HISTOGRAM, FAST),
    SeriesIdent(SeriesKey("llama", "ttft", (("engine", "1"),)), Kind.HISTOGRAM, FAST),
    SeriesIdent(SeriesKey("llama", "ttft", (("engine", "0"),)), Kind.HISTOGRAM, SLOW),  # a new layout
    SeriesIdent(SeriesKey("llama", "itl"), Kind.HISTOGRAM, FAST),
    SeriesIdent(SeriesKey("llama", "decode"), Kind.HISTOGRAM, SLOW),
    SeriesIdent(SeriesKey("qwen", "e2e"), Kind.HISTOGRAM, SLOW),  # a group of histograms alone
    SeriesIdent(SeriesKey("qwen", "prompt_length"), Kind.HISTOGRAM, FAST),
    SeriesIdent(SeriesKey("", "gpu_utilization", (("gpu", "0"),)), Kind.GAUGE),
]
SECONDS = (0.0, 15.0, 30.0, 60.0)


@st.composite
def histogram_cell(draw: st.DrawFn, bounds: tuple[float, ...], observed: float, irregular: bool = False) -> Cell:
    counts = draw(st.lists(st.integers(0, 40), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    cumulative = [float(sum(counts[: i + 1])) for i in range(len(counts))]
    total = cumulative[-1]
    mean = draw(st.floats(0.01, 5.0))
    buckets = None if irregular else cumulative  # a count and sum without buckets: not this series' layout
    return Cell(Kind.HISTOGRAM, total, total * mean, buckets, observed_seconds=observed, last_unix=MINUTE)


@st.composite
def cell_of(draw: st.DrawFn, ident: SeriesIdent, irregular: bool = False) -> Cell:
    observed = draw(st.sampled_from(SECONDS))
    if ident.kind is Kind.HISTOGRAM:
        return draw(histogram_cell(ident.bounds, observed, irregular))
    if ident.kind is Kind.GAUGE:
        n = draw(st.integers(0, 3))
        lo = draw(st.floats(0, 1))
        return Cell(Kind.GAUGE, 0.0, lo * n, None, lo, lo, lo, n, observed, MINUTE) if n else Cell(Kind.GAUGE)
    return Cell(Kind.COUNTER, float(draw(st.integers(0, 500))), observed_seconds=observed, last_unix=MINUTE)


@st.composite
def windows(draw: st.DrawFn) -> tuple[ClosedView, PassView]:
    closed: dict[tuple[str, SeriesIdent], SeriesCell] = {}
    oldest: list[SeriesCell] = []
    kept = []
    odd = draw(st.sampled_from([None, "a", "b"]))  # a target with a cell off its layout
    for target in ("a", "b"):
        for ident in SERIES:
            if draw(st.booleans()):
                cell = draw(cell_of(ident))
                closed[(target, ident)] = SeriesCell(target, ident, "", cell)
                if draw(st.integers(0, 3)) == 0:  # the minute in grace: all of it, or a part
                    gone = cell.copy() if draw(st.booleans()) else draw(cell_of(ident))
                    oldest.append(SeriesCell(target, ident, "", gone))
        idents = dict(enumerate(SERIES))
        minutes = []
        for minute in (MINUTE - 60, MINUTE, MINUTE + 60):  # the first is in the closed ones already
            cells = {}
            for sid, ident in idents.items():
                if draw(st.booleans()):
                    irregular = target == odd and ident.kind is Kind.HISTOGRAM and draw(st.integers(0, 4)) == 0
                    cells[sid] = draw(cell_of(ident, irregular))
            minutes.append((minute, cells))
        kept.append((target, idents, {}, minutes))
    in_grace = draw(st.booleans())
    view = ClosedView(MINUTE, 240, closed, oldest if in_grace else [], {}, {})
    return view, PassView(MINUTE + 90.0, [], {300: view}, kept)


def business_type_of(target: str, model: str) -> str | None:
    return TYPES.get((target, model))


@settings(max_examples=200, deadline=None)
@given(windows())
def test_a_windows_groups_are_derive_of_each_groups_merged_cells(case: tuple[ClosedView, PassView]) -> None:
    closed, view = case
    merged = closed.copies_by_ref()
    add_open(merged, view.open, closed.closed_end)
    want = tuple(derive(cells, 300.0) for _, _, _, cells in place(merged.values(), business_type_of)[0])
    keys = [(t, m, bt) for t, m, bt, _ in place(merged.values(), business_type_of)[0]]

    got = window_groups(closed, view, 300.0, business_type_of)
    assert [(g.target, g.model, g.business_type) for g in got] == keys
    assert [_rounded(g.stats) for g in got] == [_rounded(s) for s in want]
    for g, s in zip(got, want, strict=True):
        _assert_gauge_means_close(g.stats, s)
    again = window_groups(closed, view, 300.0, business_type_of)  # nothing read was changed
    assert [_rounded(g.stats) for g in again] == [_rounded(s) for s in want]


GAUGES = ("kv_cache_usage", "requests_running", "requests_waiting")


def _rounded(stats: ServingStats) -> ServingStats:
    """`stats` with each gauge's mean left out: every other figure compares bit for bit (the
    same additions in the same order); a gauge's samples are summed closed minutes + (open
    minutes), as the per-business-type scopes sum them, not minute after minute."""
    gauges = {name: getattr(stats, name) for name in GAUGES}
    return replace(stats, **{n: g and replace(g, mean=0.0) for n, g in gauges.items()})


def _assert_gauge_means_close(got: ServingStats, want: ServingStats) -> None:
    for name in GAUGES:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None and b is not None:
            assert math.isclose(a.mean, b.mean, rel_tol=1e-12, abs_tol=1e-300), (name, a.mean, b.mean)


def test_a_group_with_two_engines_and_an_upgrade_reads_the_largest_layout_of_the_merged_engines() -> None:
    """One target, ttft from two engines on the old layout and one on the new, in the closed
    and the open minutes: the old layout's two engines merge, and outnumber the new one."""
    old0, old1, new0 = SERIES[3], SERIES[4], SERIES[5]

    def hist(bounds: tuple[float, ...], counts: list[float], observed: float) -> Cell:
        return Cell(Kind.HISTOGRAM, counts[-1], counts[-1] * 0.3, counts, observed_seconds=observed)

    closed = {
        ("a", old0): SeriesCell("a", old0, "", hist(FAST, [1.0, 2.0, 3.0, 4.0], 240.0)),
        ("a", old1): SeriesCell("a", old1, "", hist(FAST, [0.0, 1.0, 2.0, 3.0], 240.0)),
    }
    opened = {3: hist(FAST, [1.0, 1.0, 1.0, 1.0], 30.0), 5: hist(SLOW, [2.0, 4.0, 5.0, 6.0, 6.0], 30.0)}
    kept = [("a", {3: old0, 4: old1, 5: new0}, {}, [(MINUTE, opened)])]
    view = ClosedView(MINUTE, 240, closed, [], {}, {})
    (group,) = window_groups(view, PassView(MINUTE + 30.0, [], {300: view}, kept), 300.0, business_type_of)
    ttft = group.stats.latencies["ttft"]
    assert ttft.count == 8.0 and ttft.mixed_bucket_layouts  # 4 + 1 + 3 of the old layout, not the new one's 6
    assert group.stats.observed_seconds == 270.0  # engine 0's closed and open time
    assert group.stats.requests is None  # histograms alone: no counters


def rows_of(draw: st.DrawFn, width: int) -> list[list[float]]:
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        counts = draw(st.lists(st.integers(0, 9), min_size=width, max_size=width))
        row = [float(sum(counts[: i + 1])) for i in range(width)]
        shape = draw(st.sampled_from(["monotone", "decreasing", "nan", "negative"]))
        if shape == "decreasing" and width > 1:
            row[0] = row[-1] + 1.0  # never from vLLM: read by the scalar search
        elif shape == "nan":
            row[-1] = math.nan
        elif shape == "negative":
            row = [-x for x in row]
        rows.append(row)
    return rows


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([(), (1.0,), (0.0, 1.0), FAST, SLOW]))
def test_column_wise_quantiles_are_each_histograms_own(data: st.DataObject, bounds: tuple[float, ...]) -> None:
    rows = rows_of(data.draw, len(bounds) + 1)
    qs = data.draw(st.lists(st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.99, 1.0]), min_size=1, max_size=4))
    array = np.array(rows, dtype=np.float64).reshape(-1, len(bounds) + 1)
    assert quantile_rows(qs, bounds, array) == [histogram_quantiles(qs, bounds, row) for row in rows]


def test_column_wise_quantiles_refuse_what_the_scalar_search_refuses() -> None:
    with pytest.raises(ValueError, match="quantile must be in"):
        quantile_rows((0.5, 1.5), FAST, np.zeros((1, 4)))
    with pytest.raises(ValueError, match="4 columns"):
        quantile_rows((0.5,), FAST, np.zeros((1, 3)))
