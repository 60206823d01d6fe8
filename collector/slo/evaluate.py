"""SLO evaluation: SLIs from minute rollups, error budgets and multi-window burn rates.

Pure functions of the rows a window holds and an explicit `now`. Every SLI is a count of good
and total events summed over its window (never a mean of per-minute ratios, which turns NaN
after one idle minute); a window without events is "no data", never good and never bad.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from collector.analytics.percentiles import fraction_at_or_below
from collector.cost.allocation import CostInputs
from collector.cost.slo import CostOf, judge, slice_inputs
from collector.rollup import MINUTE_SECONDS, Row, add_counts, period_start
from collector.slo.spec import BusinessType, Objective, SloRules
from collector.slo.windows import BurnPair
from collector.sources.vllm import Kind
from collector.traces.normalize import SHADOW
from collector.traces.rollup import RequestCell, RequestKey

ERROR_REASONS = frozenset({"abort", "error"})
NEEDS_TRACES = "needs trace ingestion (gateway spans)"
NEEDS_COSTS = "needs the cost model"
RECOUNTING = "its definition changed: counting its events again from the stored rollups"


@dataclass(frozen=True, slots=True)
class Events:
    good: float
    total: float
    exact: bool = True  # False when a latency threshold fell between bucket bounds

    @property
    def bad(self) -> float:
        return self.total - self.good

    def plus(self, other: Events) -> Events:
        return Events(self.good + other.good, self.total + other.total, self.exact and other.exact)


NO_EVENTS = Events(0.0, 0.0)


@dataclass(frozen=True, slots=True)
class WindowSli:
    seconds: float
    events: Events

    @property
    def sli(self) -> float | None:
        return self.events.good / self.events.total if self.events.total > 0 else None


@dataclass(frozen=True, slots=True)
class PairState:
    pair: BurnPair
    long: WindowSli
    short: WindowSli
    long_burn: float | None
    short_burn: float | None
    firing: bool
    reason: str  # why it does or does not fire, for the API


@dataclass(frozen=True, slots=True)
class SloStatus:
    objective: Objective
    now_unix: float
    windows: dict[float, WindowSli]
    period: WindowSli
    budget_remaining: float | None  # 1 = untouched, 0 = spent, < 0 = overspent; None = no data
    pairs: tuple[PairState, ...]
    no_data_reason: str = ""
    exact: bool = True

    def burn_rate(self, seconds: float) -> float | None:
        return burn(self.windows[seconds].events, self.objective)


def burn(events: Events, objective: Objective) -> float | None:
    """Error rate / error budget: 1 = burning exactly the budget."""
    if events.total <= 0:
        return None
    return (events.bad / events.total) / objective.error_budget


def period_bounds(rules: SloRules, now_unix: float) -> tuple[int, int]:
    end = period_start(now_unix) + MINUTE_SECONDS
    if rules.calendar == "month":
        now = datetime.fromtimestamp(now_unix, UTC)
        return int(datetime(now.year, now.month, 1, tzinfo=UTC).timestamp()), end
    return end - int(rules.period_seconds), end


def windows_needed(rules: SloRules) -> list[float]:
    return sorted({s for p in rules.pairs for s in (p.long_seconds, p.short_seconds)})


BusinessTypeOf = Callable[[str, str], str | None]  # (target, model) -> business type


def evaluate(
    rules: SloRules,
    rows: Sequence[Row],
    now_unix: float,
    request_rows: Sequence[tuple[RequestKey, RequestCell]] = (),
    business_type_of: BusinessTypeOf | None = None,
    cost_of: CostOf | None = None,
) -> list[SloStatus]:
    """Evaluate every objective of `rules` on the stored engine rows and trace request rows
    (both must cover the period). Goodput and trace-sourced latency SLIs use the request rows.

    `business_type_of(target, model)` places engine rows (the fleet map); without it, the rules'
    model regexes alone decide. `cost_of` prices a slice's inputs (the cost model; without an
    inventory, cost-ceiling objectives have no data)."""
    end = period_start(now_unix) + MINUTE_SECONDS
    period_start_unix, _ = period_bounds(rules, now_unix)
    windows = windows_needed(rules)
    place: BusinessTypeOf = business_type_of or (lambda _target, model: rules.business_type_of(model))
    by_type: dict[str | None, list[Row]] = defaultdict(list)
    placed: dict[tuple[str, str], str | None] = {}
    for r in rows:
        key = (r.cell.target, r.cell.ident.key.model)
        if key not in placed:
            placed[key] = place(*key)
        by_type[placed[key]].append(r)
    out: list[SloStatus] = []
    cost_slices: dict[int, dict[int, dict[str, tuple[float, float]]]] = {}  # slice size -> slot -> costs
    for bt in rules.business_types:
        mine = by_type.get(bt.name, [])
        requests = [(k, c) for k, c in request_rows if k.business_type == bt.name]
        for objective in bt.objectives:
            if objective.sli == "goodput" or (objective.sli == "latency" and objective.source == "traces"):
                out.append(_evaluate_from_traces(rules, objective, requests, windows, end, period_start_unix, now_unix))
                continue
            if objective.sli == "cost_ceiling" and cost_of is not None:
                size = int(objective.slice_seconds)
                if size not in cost_slices:
                    cost_slices[size] = {
                        slot: cost_of(inputs, slot, slot + size) for slot, inputs in slice_inputs(rows, size).items()
                    }
                out.append(
                    _evaluate_cost(rules, objective, cost_slices[size], windows, end, period_start_unix, now_unix)
                )
                continue
            out.append(_evaluate_objective(rules, bt, objective, mine, windows, end, period_start_unix, now_unix))
    return out


def _evaluate_objective(
    rules: SloRules,
    bt: BusinessType,
    o: Objective,
    rows: list[Row],
    windows: list[float],
    end: int,
    period_start_unix: int,
    now_unix: float,
) -> SloStatus:
    reason = NEEDS_COSTS if o.sli == "cost_ceiling" else ""
    per_window: dict[float, WindowSli] = {}
    for w in windows:
        start = end - int(w)
        per_window[w] = WindowSli(
            w, NO_EVENTS if reason else events_for(o, [r for r in rows if _inside(r, start, end)], start, end)
        )
    period = (
        NO_EVENTS
        if reason
        else events_for(o, [r for r in rows if _inside(r, period_start_unix, end)], period_start_unix, end)
    )
    events = {w: sli.events for w, sli in per_window.items()}
    return make_status(rules, o, now_unix, events, period, end - period_start_unix, reason)


def make_status(
    rules: SloRules,
    o: Objective,
    now_unix: float,
    per_window: dict[float, Events],
    period: Events,
    period_seconds: float,
    reason: str = "",
) -> SloStatus:
    """An objective's status from its events per burn-rate window and over the budget period
    (shared by the full re-read here and the incremental ledger, collector/slo/ledger.py)."""
    windows = {w: WindowSli(w, e) for w, e in per_window.items()}
    remaining = None
    if period.total > 0:
        remaining = 1.0 - (period.bad / period.total) / o.error_budget
    pairs = tuple(_pair_state(rules, o, p, windows) for p in rules.pairs)
    exact = all(e.exact for e in per_window.values()) and period.exact
    return SloStatus(o, now_unix, windows, WindowSli(period_seconds, period), remaining, pairs, reason, exact)


def _trace_events(o: Objective, rows: Iterable[tuple[RequestKey, RequestCell]], start: int, end: int) -> Events:
    """Per-request events: exact, whatever the threshold (no buckets involved)."""
    good = total = 0
    for key, cell in rows:
        if start <= key.start_unix < end and key.measured_at != SHADOW:  # shadow responses were not shown
            total += cell.total
            good += cell.jointly_good if o.sli == "goodput" else cell.good.get(o.slo, 0)
    return Events(float(good), float(total))


def _evaluate_from_traces(
    rules: SloRules,
    o: Objective,
    rows: list[tuple[RequestKey, RequestCell]],
    windows: list[float],
    end: int,
    period_start_unix: int,
    now_unix: float,
) -> SloStatus:
    per_window = {w: _trace_events(o, rows, end - int(w), end) for w in windows}
    period = _trace_events(o, rows, period_start_unix, end)
    reason = "" if period.total > 0 else NEEDS_TRACES
    return make_status(rules, o, now_unix, per_window, period, end - period_start_unix, reason)


def cost_events(o: Objective, slices: dict[int, dict[str, tuple[float, float]]], start: int, end: int) -> Events:
    """Complete slices starting inside [start, end) (`end` is the end of the running minute)."""
    assert o.max_usd_per_million_tokens is not None
    size = int(o.slice_seconds)
    done_before = end - MINUTE_SECONDS
    good = total = 0.0
    for slot, costs in slices.items():
        if slot < start or slot + size > done_before:
            continue
        judged = judge(costs, o.business_type, o.max_usd_per_million_tokens)
        if judged is not None:
            good, total = good + judged[0], total + judged[1]
    return Events(good, total)


def _evaluate_cost(
    rules: SloRules,
    o: Objective,
    slices: dict[int, dict[str, tuple[float, float]]],
    windows: list[float],
    end: int,
    period_start_unix: int,
    now_unix: float,
) -> SloStatus:
    per_window = {w: cost_events(o, slices, end - int(w), end) for w in windows}
    period = cost_events(o, slices, period_start_unix, end)
    return make_status(rules, o, now_unix, per_window, period, end - period_start_unix)


def _inside(row: Row, start: int, end: int) -> bool:
    """Whether a stored cell lies wholly inside [start, end) (hour cells too)."""
    return start <= row.start_unix and row.start_unix + row.period_seconds <= end


def _pair_state(rules: SloRules, o: Objective, pair: BurnPair, per_window: dict[float, WindowSli]) -> PairState:
    long, short = per_window[pair.long_seconds], per_window[pair.short_seconds]
    lb, sb = burn(long.events, o), burn(short.events, o)
    if lb is None or sb is None:
        return PairState(pair, long, short, lb, sb, False, "no data")
    if long.events.total < rules.min_events:
        return PairState(
            pair,
            long,
            short,
            lb,
            sb,
            False,
            f"low traffic: {long.events.total:.0f} events < min_events {rules.min_events}",
        )
    firing = lb > pair.factor and sb > pair.factor
    return PairState(
        pair,
        long,
        short,
        lb,
        sb,
        firing,
        f"burn {lb:.2f}x over long and {sb:.2f}x over short vs {pair.factor:g}x",
    )


def events_for(o: Objective, rows: Iterable[Row], start: int, end: int) -> Events:
    """Good and total events of one objective over the rows of one window."""
    rows = list(rows)
    if o.sli == "latency":
        return _latency_events(o, rows)
    if o.sli == "error_ratio":
        total = bad = 0.0
        for r in rows:
            key = r.cell.ident.key
            if key.metric == "request_success" and r.cell.ident.kind is Kind.COUNTER:
                total += r.cell.cell.value
                if dict(key.labels).get("finished_reason") in ERROR_REASONS:
                    bad += r.cell.cell.value
        return Events(total - bad, total)
    if o.sli == "throughput":
        return _throughput_events(o, rows, start, end)
    return NO_EVENTS


def _latency_events(o: Objective, rows: list[Row]) -> Events:
    assert o.threshold_seconds is not None and o.metric is not None
    by_layout: dict[tuple[float, ...], list[float]] = {}
    for r in rows:
        ident = r.cell.ident
        if ident.key.metric != o.metric or ident.kind is not Kind.HISTOGRAM or r.cell.cell.buckets is None:
            continue
        add_counts(by_layout, ident.bounds, r.cell.cell.buckets)
    return _latency_share(o, by_layout)


def _latency_share(o: Objective, by_layout: dict[tuple[float, ...], list[float]]) -> Events:
    """Good events: each bucket layout's cumulative counts at the threshold (interpolated
    inside a bucket, which makes the events inexact)."""
    assert o.threshold_seconds is not None
    events = NO_EVENTS
    for bounds, cumulative in by_layout.items():
        share = fraction_at_or_below(o.threshold_seconds, bounds, cumulative)
        if share is None:
            continue
        fraction, exact = share
        total = cumulative[-1]
        events = events.plus(Events(fraction * total, total, exact))
    return events


def _throughput_events(o: Objective, rows: list[Row], start: int, end: int) -> Events:
    """Time slices (aligned to the epoch, `slice` long): a slice with traffic is good when it
    generated at least the minimum rate."""
    size = int(o.slice_seconds)
    tokens: dict[int, float] = defaultdict(float)
    requests: dict[int, float] = defaultdict(float)
    for r in rows:
        key = r.cell.ident.key
        if r.cell.ident.kind is not Kind.COUNTER:
            continue
        slot = r.start_unix - r.start_unix % size
        if key.metric == "generation_tokens":
            tokens[slot] += r.cell.cell.value
        elif key.metric == "request_success":
            requests[slot] += r.cell.cell.value
    return _judged_slices(o, tokens, requests, start, end)


def _judged_slices(o: Objective, tokens: dict[int, float], requests: dict[int, float], start: int, end: int) -> Events:
    """Throughput slices judged: a slice counts in a window when it starts inside it and is
    complete (its last minute has passed: `end` is the end of the minute still running, which
    is not judged yet); one without requests is no data."""
    assert o.min_tokens_per_second is not None
    size = int(o.slice_seconds)
    done_before = end - MINUTE_SECONDS
    good = total = 0.0
    for slot, count in requests.items():
        if count <= 0 or slot < start or slot + size > done_before:
            continue  # no traffic is no data
        total += 1
        if tokens.get(slot, 0.0) / size >= o.min_tokens_per_second:
            good += 1
    return Events(good, total)


def period_events(
    rules: SloRules,
    rows: Sequence[Row],
    request_rows: Sequence[tuple[RequestKey, RequestCell]],
    start: int,
    end: int,
    business_type_of: BusinessTypeOf | None = None,
    cost_of: CostOf | None = None,
) -> list[tuple[Objective, Events]]:
    """Each objective's good and total events over a closed period [start, end) (a past week, a
    day): the same SLIs as the burn-rate windows, with every time slice ending by `end` judged.
    Events add up across consecutive periods (latency shares are linear in the bucket counts), so
    a week is the sum of its days. `PeriodCounter` takes the rows a piece at a time."""
    counter = PeriodCounter(rules, start, end, business_type_of, cost_of)
    counter.add(rows, request_rows)
    return counter.events()


class PeriodCounter:
    """`period_events` fed a piece of the period at a time (a few minutes or an hour of the
    fleet's rows, then the next): it keeps only what the events are made of, so memory does not grow with the rows
    read. Per business type: the latency objectives' bucket counts per layout, the error ratio's
    totals, the throughput slices' tokens and requests, the trace objectives' counts; per cost
    slice size, each slice's cost inputs (judged by `events`, once every piece is in). A row
    counts when it lies wholly inside [start, end), whichever piece brings it."""

    def __init__(
        self,
        rules: SloRules,
        start: int,
        end: int,
        business_type_of: BusinessTypeOf | None = None,
        cost_of: CostOf | None = None,
    ) -> None:
        self.rules, self.start, self.end, self.cost_of = rules, start, end, cost_of
        self.place: BusinessTypeOf = business_type_of or (lambda _target, model: rules.business_type_of(model))
        self.placed: dict[tuple[str, str], str | None] = {}
        # what each business type's engine objectives read
        self.latency: dict[str, dict[str, dict[tuple[float, ...], list[float]]]] = {}  # bt -> metric -> layout
        self.errors: dict[str, list[float]] = {}  # bt -> [total, bad]
        self.throughput: dict[str, dict[int, tuple[dict[int, float], dict[int, float]]]] = {}  # bt -> size -> sums
        self.cost: dict[int, dict[int, CostInputs]] = {}  # slice size -> slot -> inputs (every business type)
        self.traces: dict[int, list[float]] = {}  # id(objective) -> [good, total]
        for bt in rules.business_types:
            for o in bt.objectives:
                if o.sli == "goodput" or (o.sli == "latency" and o.source == "traces"):
                    self.traces[id(o)] = [0.0, 0.0]
                elif o.sli == "latency":
                    assert o.metric is not None
                    self.latency.setdefault(bt.name, {}).setdefault(o.metric, {})
                elif o.sli == "error_ratio":
                    self.errors.setdefault(bt.name, [0.0, 0.0])
                elif o.sli == "throughput":
                    self.throughput.setdefault(bt.name, {}).setdefault(int(o.slice_seconds), ({}, {}))
                elif o.sli == "cost_ceiling" and cost_of is not None:
                    self.cost.setdefault(int(o.slice_seconds), {})

    def add(self, rows: Iterable[Row], request_rows: Iterable[tuple[RequestKey, RequestCell]] = ()) -> None:
        """One piece's engine rows and trace request cells (each row or cell once in all)."""
        start, end, placed = self.start, self.end, self.placed
        for r in rows:
            at = r.start_unix
            if at < start or at + r.period_seconds > end:  # `_inside`, written out: once per row read
                continue
            sc = r.cell
            ident, cell = sc.ident, sc.cell
            key = (sc.target, ident.key.model)
            bt = placed.get(key, "")
            if bt == "":
                bt = placed[key] = self.place(*key)
            for size, slots in self.cost.items():
                slot = at - at % size
                inputs = slots.get(slot)
                if inputs is None:
                    inputs = slots[slot] = CostInputs()
                inputs.add(sc.target, ident, cell)
            if bt is None:
                continue
            metric = ident.key.metric
            if ident.kind is Kind.HISTOGRAM:
                layouts = self.latency.get(bt, {}).get(metric)
                if layouts is not None and cell.buckets is not None:
                    add_counts(layouts, ident.bounds, cell.buckets)
            elif ident.kind is Kind.COUNTER:
                errors = self.errors.get(bt)
                if errors is not None and metric == "request_success":
                    errors[0] += cell.value
                    if dict(ident.key.labels).get("finished_reason") in ERROR_REASONS:
                        errors[1] += cell.value
                for size, (tokens, requests) in self.throughput.get(bt, {}).items():
                    sums = (
                        tokens if metric == "generation_tokens" else requests if metric == "request_success" else None
                    )
                    if sums is not None:
                        slot = r.start_unix - r.start_unix % size
                        sums[slot] = sums.get(slot, 0.0) + cell.value
        if not self.traces:
            return
        wanted = [
            (bt.name, o, self.traces[id(o)])
            for bt in self.rules.business_types
            for o in bt.objectives
            if id(o) in self.traces
        ]
        for rk, rc in request_rows:
            if not start <= rk.start_unix < end or rk.measured_at == SHADOW:  # shadow responses were not shown
                continue
            for name, o, counts in wanted:
                if rk.business_type == name:
                    counts[0] += rc.jointly_good if o.sli == "goodput" else rc.good.get(o.slo, 0)
                    counts[1] += rc.total

    def events(self) -> list[tuple[Objective, Events]]:
        """Every objective's events over the period from what the pieces added."""
        closed_end = self.end + MINUTE_SECONDS  # the slice functions stop a minute before their `end`
        cost_slices: dict[int, dict[int, dict[str, tuple[float, float]]]] = {}
        out: list[tuple[Objective, Events]] = []
        for bt in self.rules.business_types:
            for o in bt.objectives:
                if id(o) in self.traces:
                    good, total = self.traces[id(o)]
                    out.append((o, Events(float(good), float(total))))
                elif o.sli == "latency":
                    assert o.metric is not None
                    out.append((o, _latency_share(o, self.latency[bt.name][o.metric])))
                elif o.sli == "error_ratio":
                    total, bad = self.errors[bt.name]
                    out.append((o, Events(total - bad, total)))
                elif o.sli == "throughput":
                    tokens, requests = self.throughput[bt.name][int(o.slice_seconds)]
                    out.append((o, _judged_slices(o, tokens, requests, self.start, closed_end)))
                elif o.sli == "cost_ceiling" and self.cost_of is not None:
                    size = int(o.slice_seconds)
                    if size not in cost_slices:
                        cost_of = self.cost_of
                        cost_slices[size] = {
                            slot: cost_of(inputs, slot, slot + size) for slot, inputs in self.cost[size].items()
                        }
                    out.append((o, cost_events(o, cost_slices[size], self.start, closed_end)))
                else:
                    out.append((o, NO_EVENTS))
        return out
