"""A long window's counters and gauges reduced per (target, model) from its closed minutes (once
per advance) and its open minutes (once per pass), then added group by group
(collector/windowcells.py: reduce_closed, reduce_open, reduce_window), against merging every
series' closed cell with its open cells and adding each merged series (what `window_cells` and
`derive` do), on fleets a real collector sees: a series only in the closed minutes or only in the
open ones, a target serving two models in one business type and another whose models are in two,
series whose observed times differ (one appeared late, one missed a scrape) so that the longest
closed time and the longest open time belong to different series, gauges that saw no sample, a
DCGM series (in no business type) and histograms (summed elsewhere)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.analytics.running import ClosedView
from collector.analytics.serving import ScopeScalars, TypeScalars
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.vllm import Kind, SeriesKey
from collector.windowcells import PassView, add_open, reduce_closed, reduce_open, reduce_window

MINUTE = 1_800_000_000
TYPES = {("a", "llama"): "chat", ("a", "qwen"): "chat", ("b", "llama"): "chat", ("b", "qwen"): "batch"}

SERIES = [
    SeriesIdent(SeriesKey("llama", "prompt_tokens"), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "request_success", (("finished_reason", "stop"),)), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "request_success", (("finished_reason", "abort"),)), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "prefix_cache_queries"), Kind.COUNTER),
    SeriesIdent(SeriesKey("llama", "kv_cache_usage"), Kind.GAUGE),
    SeriesIdent(SeriesKey("llama", "requests_running"), Kind.GAUGE),
    SeriesIdent(SeriesKey("llama", "ttft"), Kind.HISTOGRAM, (0.1, 1.0)),
    SeriesIdent(SeriesKey("qwen", "generation_tokens"), Kind.COUNTER),
    SeriesIdent(SeriesKey("qwen", "request_success", (("finished_reason", "length"),)), Kind.COUNTER),
    SeriesIdent(SeriesKey("qwen", "requests_waiting"), Kind.GAUGE),
    SeriesIdent(SeriesKey("", "gpu_energy_joules", (("gpu", "0"),)), Kind.COUNTER),
]
UNITS = {SERIES[3].key: "tokens"}
SECONDS = (0.0, 15.0, 30.0, 45.0, 60.0)  # few values: ties and differences both happen


def cell_of(kind: Kind, draw: st.DrawFn, last_unix: float) -> Cell:
    observed = draw(st.sampled_from(SECONDS))
    if kind is Kind.GAUGE:
        n = draw(st.integers(0, 4))
        if n == 0:
            return Cell(kind, observed_seconds=observed, last_unix=last_unix)
        lo = draw(st.floats(0, 10))
        hi = lo + draw(st.floats(0, 10))
        return Cell(kind, 0.0, (lo + hi) / 2 * n, None, lo, hi, draw(st.floats(lo, hi)), n, observed, last_unix)
    if kind is Kind.HISTOGRAM:
        return Cell(kind, 3.0, 1.5, [1.0, 2.0, 3.0], observed_seconds=observed, last_unix=last_unix)
    return Cell(kind, float(draw(st.integers(0, 1000))), observed_seconds=observed, last_unix=last_unix)


@st.composite
def windows(draw: st.DrawFn) -> tuple[ClosedView, PassView, int]:
    closed: dict[tuple[str, SeriesIdent], SeriesCell] = {}
    kept = []
    from_minute = MINUTE
    for target in ("a", "b"):
        for ident in SERIES:
            if draw(st.booleans()):  # in the closed minutes
                cell = cell_of(ident.kind, draw, from_minute - 1.0)
                closed[(target, ident)] = SeriesCell(target, ident, UNITS.get(ident.key, ""), cell)
        idents = dict(enumerate(SERIES))
        minutes = []
        for minute in (from_minute - 60, from_minute, from_minute + 60):  # the first is closed already
            cells = {
                sid: cell_of(ident.kind, draw, minute + 30.0) for sid, ident in idents.items() if draw(st.booleans())
            }
            minutes.append((minute, cells))
        kept.append((target, idents, UNITS, minutes))
    view = ClosedView(from_minute, 240, closed, [], {}, {})
    return view, PassView(from_minute + 90.0, [], {300: view}, kept), from_minute


def by_type(scalars: TypeScalars) -> dict[str, object]:
    def gauges(scope: ScopeScalars) -> dict[str, list[tuple[float, ...]]]:
        return {
            m: sorted((c.n, round(c.sum, 6), c.gmin, c.gmax, c.glast, c.last_unix) for c in cells)
            for m, cells in scope.gauges.items()
        }

    return {
        bt: {
            "observed": {t: round(s, 6) for t, s in scope.observed.items()},
            "counters": {t: {m: round(v, 6) for m, v in sums.items()} for t, sums in scope.counters.items()},
            "finished": {r: round(v, 6) for r, v in scope.finished.items()},
            "units": scope.units,
            "gauges": gauges(scope),
        }
        for bt, scope in scalars.types.items()
    } | {"groups": scalars.groups}


@settings(max_examples=300, deadline=None)
@given(windows())
def test_a_windows_groups_add_up_to_a_merge_of_every_series(case: tuple[ClosedView, PassView, int]) -> None:
    closed, view, from_minute = case

    def business_type_of(target: str, model: str) -> str | None:
        return TYPES.get((target, model))

    merged = closed.copies_by_ref(histograms=False)
    add_open(merged, view.open, from_minute, histograms=False)
    want = TypeScalars(business_type_of)
    want.add_cells(merged.values())

    got = TypeScalars(business_type_of)
    reduce_window(got, reduce_closed(closed), reduce_open(view, from_minute))
    assert by_type(got) == by_type(want)
    # a second window of the same pass reads the same reductions, unchanged by the first
    again = TypeScalars(business_type_of)
    reduce_window(again, reduce_closed(closed), reduce_open(view, from_minute))
    assert by_type(again) == by_type(want)
    assert view.memo and closed.memo  # reduced once, kept for the other windows and passes


def test_the_longest_observed_time_is_one_series_closed_and_open_time() -> None:
    """The target's longest series in the closed minutes missed the open minute's scrape: the
    window's observed time is another series' closed plus open time, not the two maxima added."""
    early, late = SERIES[0], SERIES[7]
    closed = {
        ("a", early): SeriesCell("a", early, "", Cell(Kind.COUNTER, 10.0, observed_seconds=240.0)),
        ("a", late): SeriesCell("a", late, "", Cell(Kind.COUNTER, 5.0, observed_seconds=120.0)),
    }
    view = ClosedView(MINUTE, 240, closed, [], {}, {})
    kept = [("a", {0: early, 7: late}, {}, [(MINUTE, {7: Cell(Kind.COUNTER, 1.0, observed_seconds=60.0)})])]
    got = TypeScalars(lambda t, m: "chat")
    reduce_window(got, reduce_closed(view), reduce_open(PassView(MINUTE + 70.0, [], {}, kept), MINUTE))
    assert got.types["chat"].observed == {"a": 240.0}  # max(240, 120 + 60), not 240 + 60
    assert got.types["chat"].rate("prompt_tokens") == 10.0 / 240.0
    assert math.isclose(got.types["chat"].rate("generation_tokens") or 0.0, 6.0 / 240.0)
