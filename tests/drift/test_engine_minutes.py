"""`engine_minutes` adds each stored row straight into its business type's minute populations. It
must give what merging one Population per row gives (the plain reading of the signals' rules),
number for number, for any mix of rows: histograms of the drift signals and of other metrics,
bucketless cells, finish reasons with and without their label, prefix-cache counters, zero and
negative counter deltas, several bucket layouts, models no rule places, hour rows beside minutes."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.drift.engine import (
    ALL_TENANTS,
    HIST_SIGNALS,
    Minutes,
    Population,
    engine_minutes,
    prefix_cache_shares,
)
from collector.drift.stats import decumulate
from collector.rollup import Cell, Row, SeriesCell, SeriesIdent
from collector.sources.vllm import Kind, SeriesKey

PLACES = {("a", "m1"): "chat", ("a", "m2"): "batch", ("b", "m1"): "chat", ("b", "m2"): None}
LAYOUTS = ((0.5, 1.0, 5.0), (1.0, 10.0), (2.0,))


def place(target: str, model: str) -> str | None:
    return PLACES[(target, model)]


@st.composite
def rows(draw: st.DrawFn) -> Row:
    target, model = draw(st.sampled_from(sorted(PLACES)))
    start = draw(st.sampled_from((0, 60, 120, 3600)))
    period = 3600 if start == 3600 else 60
    kind = draw(st.sampled_from((Kind.HISTOGRAM, Kind.COUNTER, Kind.GAUGE)))
    value = float(draw(st.integers(-3, 50)))
    if kind is Kind.HISTOGRAM:
        metric = draw(st.sampled_from(("prompt_length", "generation_length", "queue", "prefill", "decode", "ttft")))
        bounds = draw(st.sampled_from(LAYOUTS))
        buckets = None
        if draw(st.booleans()) or metric != "ttft":
            steps = draw(st.lists(st.integers(0, 9), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
            buckets = [float(sum(steps[: i + 1])) for i in range(len(steps))]
        cell = Cell(kind, value, draw(st.floats(0, 1e4, allow_nan=False)), buckets if draw(st.booleans()) else None)
        return Row(start, period, SeriesCell(target, SeriesIdent(SeriesKey(model, metric), kind, bounds), "", cell))
    metric = draw(
        st.sampled_from(("request_success", "prefix_cache_hits", "prefix_cache_queries", "prompt_tokens", "queue"))
    )
    labels: tuple[tuple[str, str], ...] = ()
    if metric == "request_success" and draw(st.booleans()):
        labels = (("finished_reason", draw(st.sampled_from(("stop", "length", "abort")))),)
    cell = Cell(kind, value, 0.0, None, value, value, value, 1)
    return Row(start, period, SeriesCell(target, SeriesIdent(SeriesKey(model, metric, labels), kind), "", cell))


def merged_row_by_row(found: list[Row]) -> Minutes:
    """One Population per row, merged with Population.add in row order."""
    signal_of = {metric: signal for signal, (metric, _unit) in HIST_SIGNALS.items()}
    out: Minutes = defaultdict(lambda: defaultdict(dict))
    for r in found:
        ident, cell = r.cell.ident, r.cell.cell
        bt = place(r.cell.target, ident.key.model)
        if bt is None:
            continue
        signals = out[(bt, ALL_TENANTS)][r.start_unix]
        metric = ident.key.metric
        adds: list[tuple[str, Population]] = []
        if ident.kind is Kind.HISTOGRAM and cell.buckets is not None and metric in signal_of:
            adds.append(
                (signal_of[metric], Population({ident.bounds: decumulate(cell.buckets)}, {}, cell.sum, cell.value))
            )
        elif ident.kind is Kind.COUNTER and cell.value > 0:
            if metric == "request_success":
                reason = dict(ident.key.labels).get("finished_reason", "unknown")
                adds.append(("finish_reason", Population(cats={reason: cell.value}, events=cell.value)))
                adds.append(("model_mix", Population(cats={ident.key.model: cell.value}, events=cell.value)))
            elif metric == "prefix_cache_hits":
                adds.append(("prefix_cache", Population(cats={"hit": cell.value})))
            elif metric == "prefix_cache_queries":
                adds.append(("prefix_cache", Population(cats={"queried": cell.value})))
        for signal, pop in adds:
            signals.setdefault(signal, Population()).add(pop)
    prefix_cache_shares(out)  # the same last step: what is compared is the merge of the rows
    return out


def plain(minutes: Minutes) -> dict[object, object]:
    return {g: {m: dict(sigs) for m, sigs in by_minute.items()} for g, by_minute in minutes.items()}


@settings(max_examples=400, deadline=None)
@given(st.lists(rows(), max_size=60))
def test_rows_added_in_place_equal_a_population_per_row(found: list[Row]) -> None:
    assert plain(engine_minutes(found, place)) == plain(merged_row_by_row(found))


def test_every_signal_of_a_minute_and_the_unplaced_model_left_out() -> None:
    stop = (("finished_reason", "stop"),)

    def counter(target: str, model: str, metric: str, value: float, labels: tuple[tuple[str, str], ...] = ()) -> Row:
        ident = SeriesIdent(SeriesKey(model, metric, labels), Kind.COUNTER)
        return Row(60, 60, SeriesCell(target, ident, "", Cell(Kind.COUNTER, value)))

    hist = SeriesIdent(SeriesKey("m1", "queue"), Kind.HISTOGRAM, (1.0, 10.0))
    found = [
        counter("a", "m1", "request_success", 30, stop),
        counter("b", "m1", "request_success", 10),  # no finished_reason label
        counter("b", "m2", "request_success", 99, stop),  # a model no rule places
        counter("a", "m1", "prefix_cache_queries", 1000),
        counter("a", "m1", "prefix_cache_hits", 250),
        Row(60, 60, SeriesCell("a", hist, "", Cell(Kind.HISTOGRAM, 40, 55.0, [10.0, 30.0, 40.0]))),
        Row(60, 60, SeriesCell("b", hist, "", Cell(Kind.HISTOGRAM, 4, 2.0, [4.0, 4.0, 4.0]))),
    ]
    chat = engine_minutes(found, place)[("chat", ALL_TENANTS)][60]
    assert set(engine_minutes(found, place)) == {("chat", ALL_TENANTS)}
    assert chat["finish_reason"].cats == {"stop": 30.0, "unknown": 10.0} and chat["finish_reason"].events == 40.0
    assert chat["model_mix"].cats == {"m1": 40.0}
    assert chat["prefix_cache"].cats == {"hit": 250.0, "miss": 750.0} and chat["prefix_cache"].events == 40.0
    assert chat["queue_time"].hist == {(1.0, 10.0): [14.0, 20.0, 10.0]}
    assert (chat["queue_time"].total, chat["queue_time"].events) == (57.0, 44.0)
