"""Derived serving metrics over a window: pure functions of merged cells.

Rates divide deltas by the scrape time they cover (not by the nominal window), so a collector
that started two minutes ago does not report a 5m rate that is 60 % too low. Ratios are ratios
of sums (never means of ratios), and histograms are merged only within one bucket layout.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from collector.analytics.percentiles import QuantileEstimate, histogram_quantiles
from collector.conventions import QUANTILES
from collector.rollup import Cell, SeriesCell, SeriesIdent
from collector.sources.dcgm import is_gpu_metric
from collector.sources.vllm import Kind

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode")
LENGTH_METRICS = ("prompt_length", "generation_length")  # tokens per request (drift)
ERROR_REASONS = frozenset({"abort", "error"})


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: float
    mean_seconds: float | None
    quantiles: tuple[QuantileEstimate, ...]
    estimated: bool = False  # True when derived from another histogram (see `source`)
    source: str = ""  # the logical histogram the numbers come from
    mixed_bucket_layouts: bool = False  # several layouts in scope; the largest one was used


@dataclass(frozen=True, slots=True)
class GaugeStats:
    last: float
    min: float
    max: float
    mean: float


@dataclass(frozen=True, slots=True)
class ServingStats:
    window_seconds: float
    observed_seconds: float
    requests: float | None = None
    requests_per_second: float | None = None
    finished: dict[str, float] = field(default_factory=dict)
    error_ratio: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    preemptions_per_second: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_ratio: float | None = None
    prefix_cache_unit: str = ""
    kv_cache_usage: GaugeStats | None = None
    requests_running: GaugeStats | None = None
    requests_waiting: GaugeStats | None = None
    latencies: dict[str, LatencyStats] = field(default_factory=dict)
    lengths: dict[str, LatencyStats] = field(default_factory=dict)  # same shape, values in tokens
    tpot_mean_estimate_seconds: float | None = None


class ScopeScalars:
    """What `derive` reads of a scope's counters and gauges, reduced as it reads them: each
    target's longest observed time (of its counter and histogram series: rates divide per
    target), each target's sum of each counter metric, request_success per finished reason, the
    units of the prefix cache counters, and the gauge cells that saw a sample.

    `derive` reduces its cells with `add`; a derive pass reduces the merged scalars of a whole
    business type without building a series cell per merge (`add_counter`, `add_gauge`)."""

    __slots__ = ("counters", "finished", "gauges", "observed", "units")

    def __init__(self) -> None:
        self.observed: dict[str, float] = {}
        self.counters: dict[str, dict[str, float]] = {}  # target -> metric -> sum of its series
        self.finished: dict[str, float] = {}
        self.units: set[str] = set()
        self.gauges: dict[str, list[Cell]] = {}

    def add(self, target: str, ident: SeriesIdent, unit: str, cell: Cell) -> None:
        """One series' cell over the scope's window (any kind)."""
        kind = ident.kind
        if kind is Kind.GAUGE:
            self.add_gauge(ident.key.metric, unit, cell)
        elif kind is Kind.COUNTER:
            self.add_counter(target, ident, unit, cell.value, cell.observed_seconds)
        else:
            self.note_observed(target, cell.observed_seconds)
            if unit and ident.key.metric == "prefix_cache_queries":
                self.units.add(unit)

    def note_observed(self, target: str, seconds: float) -> None:
        have = self.observed.get(target)
        if have is None:
            self.observed[target] = max(0.0, seconds)
        elif seconds > have:
            self.observed[target] = seconds

    def add_counter(self, target: str, ident: SeriesIdent, unit: str, value: float, observed: float) -> None:
        self.note_observed(target, observed)
        metric = ident.key.metric
        sums = self.counters.get(target)
        if sums is None:
            sums = self.counters[target] = {}
        sums[metric] = sums.get(metric, 0.0) + value
        if metric == "request_success":
            reason = dict(ident.key.labels).get("finished_reason", "unknown")
            self.finished[reason] = self.finished.get(reason, 0.0) + value
        elif unit and metric == "prefix_cache_queries":
            self.units.add(unit)

    def add_gauge(self, metric: str, unit: str, cell: Cell) -> None:
        if unit and metric == "prefix_cache_queries":
            self.units.add(unit)
        if cell.n > 0:
            self.gauges.setdefault(metric, []).append(cell)

    def total(self, metric: str) -> float | None:
        values = [v for sums in self.counters.values() if (v := sums.get(metric)) is not None]
        return sum(values) if values else None

    def rate(self, metric: str) -> float | None:
        observed = self.observed
        rates = [
            v / seconds
            for t, sums in self.counters.items()
            if (v := sums.get(metric)) is not None and (seconds := observed[t]) > 0
        ]
        return sum(rates) if rates else None


def derive(cells: Iterable[SeriesCell], window_seconds: float) -> ServingStats:
    """Serving metrics for any scope (one model of one target, or a whole business type)."""
    scalars = ScopeScalars()
    histograms: dict[str, list[SeriesCell]] = defaultdict(list)  # each figure reads its metric
    for sc in cells:
        scalars.add(sc.target, sc.ident, sc.unit, sc.cell)
        if sc.ident.kind is Kind.HISTOGRAM:
            histograms[sc.ident.key.metric].append(sc)
    return derive_scope(scalars, histograms, window_seconds)


def derive_scope(scalars: ScopeScalars, histograms: dict[str, list[SeriesCell]], window_seconds: float) -> ServingStats:
    """`derive` of a scope's reduced counters and gauges and its histogram cells by metric."""

    def of(metric: str) -> list[SeriesCell]:
        return histograms.get(metric, [])

    total, rate = scalars.total, scalars.rate
    finished = scalars.finished
    requests = sum(finished.values()) if finished else None
    error_ratio = None
    if requests:
        error_ratio = sum(v for r, v in finished.items() if r in ERROR_REASONS) / requests

    queries, hits = total("prefix_cache_queries"), total("prefix_cache_hits")
    hit_ratio = hits / queries if queries and hits is not None else None
    units = scalars.units
    if queries is None:
        # vLLM V0 (<= 0.8) only exposed a hit-rate gauge; its mean is the best there is.
        v0 = _gauge(scalars.gauges.get("prefix_cache_hit_rate_v0", []), combine_max=True)
        if v0 is not None:
            hit_ratio, units = v0.mean, {"v0_gauge"}

    latencies: dict[str, LatencyStats] = {}
    for metric in LATENCY_METRICS:
        stats = _latency(of(metric), metric)
        if stats is not None:
            latencies[metric] = stats
    lengths = {m: st for m in LENGTH_METRICS if (st := _latency(of(m), m)) is not None}
    tpot_mean = None
    if "tpot" not in latencies:
        itl = _latency(of("itl"), "itl")
        if itl is not None:
            latencies["tpot"] = LatencyStats(
                itl.count,
                itl.mean_seconds,
                itl.quantiles,
                estimated=True,
                source="itl",
                mixed_bucket_layouts=itl.mixed_bucket_layouts,
            )
        tpot_mean = _tpot_mean_estimate(of("decode"), total("generation_tokens"))

    gauges = scalars.gauges
    return ServingStats(
        window_seconds=window_seconds,
        observed_seconds=max(scalars.observed.values(), default=0.0),
        requests=requests,
        requests_per_second=rate("request_success"),
        finished=dict(finished),
        error_ratio=error_ratio,
        prompt_tokens=total("prompt_tokens"),
        generation_tokens=total("generation_tokens"),
        prompt_tokens_per_second=rate("prompt_tokens"),
        generation_tokens_per_second=rate("generation_tokens"),
        preemptions_per_second=rate("preemptions"),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_ratio=hit_ratio,
        prefix_cache_unit="/".join(sorted(units)),
        kv_cache_usage=_gauge(gauges.get("kv_cache_usage", []), combine_max=True),
        requests_running=_gauge(gauges.get("requests_running", []), combine_max=False),
        requests_waiting=_gauge(gauges.get("requests_waiting", []), combine_max=False),
        latencies=latencies,
        lengths=lengths,
        tpot_mean_estimate_seconds=tpot_mean,
    )


def _latency(cells: list[SeriesCell], metric: str) -> LatencyStats | None:
    """`cells`: the series of `metric`."""
    layouts: dict[tuple[float, ...], list[Cell]] = defaultdict(list)
    for sc in cells:
        if sc.ident.kind is Kind.HISTOGRAM and sc.cell.buckets:
            layouts[sc.ident.bounds].append(sc.cell)
    if not layouts:
        return None
    merged: dict[tuple[float, ...], Cell] = {}
    for bounds, group in layouts.items():
        if len(group) == 1:  # one series (a target's own group): read as it is, never changed
            merged[bounds] = group[0]
            continue
        acc = group[0].copy()
        for c in group[1:]:
            acc.merge(c)
        merged[bounds] = acc
    bounds, cell = max(merged.items(), key=lambda kv: kv[1].value)
    assert cell.buckets is not None
    quantiles = histogram_quantiles(QUANTILES, bounds, cell.buckets)
    mean = cell.sum / cell.value if cell.value > 0 else None
    return LatencyStats(cell.value, mean, quantiles, source=metric, mixed_bucket_layouts=len(merged) > 1)


def _tpot_mean_estimate(decode_cells: list[SeriesCell], generation_tokens: float | None) -> float | None:
    """Before vLLM 0.11 there is no per-request TPOT histogram: mean decode time per token
    after the first = decode_time_sum / (generation_tokens - requests)."""
    decode = [sc.cell for sc in decode_cells if sc.ident.kind is Kind.HISTOGRAM]
    if not decode or generation_tokens is None:
        return None
    decode_sum = sum(c.sum for c in decode)
    requests = sum(c.value for c in decode)
    tokens_after_first = generation_tokens - requests
    return decode_sum / tokens_after_first if tokens_after_first > 0 else None


def _gauge(found: list[Cell], combine_max: bool) -> GaugeStats | None:
    """Combine one gauge across series (the cells that saw a sample): counts (running,
    waiting) add up across targets and models; fractions (KV usage) take the max, since a mean
    hides the saturated replica."""
    if not found:
        return None
    if combine_max:
        return GaugeStats(
            max(c.glast for c in found),
            min(c.gmin for c in found),
            max(c.gmax for c in found),
            sum(c.sum for c in found) / sum(c.n for c in found),
        )
    return GaugeStats(
        sum(c.glast for c in found),
        sum(c.gmin for c in found),
        sum(c.gmax for c in found),
        sum(c.sum / c.n for c in found),
    )


UNASSIGNED = "unassigned"


@dataclass(frozen=True, slots=True)
class GroupStats:
    target: str
    model: str
    business_type: str
    stats: ServingStats


@dataclass(frozen=True, slots=True)
class BusinessStats:
    business_type: str
    stats: ServingStats


Member = tuple[str, str, str, list[SeriesCell]]  # (target, model, business type, cells)


class LazyGroups(Sequence[GroupStats]):
    """The (target, model) groups of a report, derived when first read.

    At a thousand targets the per-target figures are most of a derive pass, and on most passes
    nothing reads them (`/metrics` leaves them out of a fleet that large, and the fleet view of
    `/api/v1/serving` is asked for now and then): like a Prometheus query, the work is done for
    the reader who asks, once per pass. The members are given, or loaded by `load` on the first
    read (a pass that derived its business types from sums keeps no per-series cells); `count`
    is their number, known without loading them."""

    def __init__(
        self,
        members: list[Member],
        window_seconds: float,
        load: Callable[[], list[Member]] | None = None,
        count: int | None = None,
    ) -> None:
        self._members = members  # sorted
        self._load = load
        self._count = len(members) if count is None else count
        self._window_seconds = window_seconds
        self._groups: tuple[GroupStats, ...] | None = None
        self._lock = threading.Lock()

    def resolve(self) -> tuple[GroupStats, ...]:
        with self._lock:
            if self._groups is None:
                members = self._load() if self._load is not None else self._members
                self._groups = tuple(
                    GroupStats(t, m, bt, derive(cells, self._window_seconds)) for t, m, bt, cells in members
                )
                self._members, self._load = [], None  # the cells are no longer needed
            return self._groups

    def __len__(self) -> int:
        groups = self._groups
        return len(groups) if groups is not None else self._count

    @overload
    def __getitem__(self, index: int) -> GroupStats: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[GroupStats]: ...
    def __getitem__(self, index: int | slice) -> GroupStats | Sequence[GroupStats]:
        return self.resolve()[index]

    def __iter__(self) -> Iterator[GroupStats]:
        return iter(self.resolve())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"LazyGroups({len(self)} groups, {'derived' if self._groups is not None else 'not derived yet'})"


@dataclass(frozen=True, slots=True)
class ServingReport:
    """Serving metrics per (target, model) and per business type over [start_unix, end_unix)."""

    window_seconds: float
    start_unix: int
    end_unix: int
    groups: Sequence[GroupStats]  # a tuple, or LazyGroups from a derive pass
    business_types: tuple[BusinessStats, ...]


def build_report(
    cells: Iterable[SeriesCell],
    window_seconds: float,
    start_unix: int,
    end_unix: int,
    business_type_of: Callable[[str, str], str | None],
    business_type: str | None = None,
    lazy_groups: bool = False,
) -> ServingReport:
    """Group a window's cells by (target, model) and by business type, and derive each group
    (with `lazy_groups`, the (target, model) groups when first read: see LazyGroups).

    `business_type_of(target, model)` maps an engine series to its business type (from the
    configuration); series with no mapping are reported under "unassigned".
    """
    placed, by_type = place(cells, business_type_of, business_type)
    types = tuple(BusinessStats(bt, derive(members, window_seconds)) for bt, members in sorted(by_type.items()))
    groups = LazyGroups(placed, window_seconds)
    return ServingReport(window_seconds, start_unix, end_unix, groups if lazy_groups else groups.resolve(), types)


class TypeScalars:
    """The reduced counters and gauges (ScopeScalars) of each business type of one window, as
    a derive pass gathers them series by series, and how many (target, model) groups they
    come from. DCGM GPU series belong to no business type (as in `place`): leave them out."""

    __slots__ = ("_placed", "business_type_of", "types")

    def __init__(self, business_type_of: Callable[[str, str], str | None]) -> None:
        self.business_type_of = business_type_of
        self.types: dict[str, ScopeScalars] = {}
        self._placed: dict[tuple[str, str], ScopeScalars] = {}

    def scope(self, target: str, model: str) -> ScopeScalars:
        """The business type's scalars a series of `model` on `target` adds to."""
        key = (target, model)
        scope = self._placed.get(key)
        if scope is None:
            btype = self.business_type_of(target, model) or UNASSIGNED
            scope = self.types.get(btype)
            if scope is None:
                scope = self.types[btype] = ScopeScalars()
            self._placed[key] = scope
        return scope

    def add_cells(self, cells: Iterable[SeriesCell]) -> None:
        """Series cells already merged over the window (a sliding window's)."""
        for sc in cells:
            if not is_gpu_metric(sc.ident.key.metric):
                self.scope(sc.target, sc.ident.key.model).add(sc.target, sc.ident, sc.unit, sc.cell)

    @property
    def groups(self) -> int:
        return len(self._placed)


def build_report_from_sums(
    scalars: TypeScalars,
    histograms: dict[str, list[SeriesCell]],
    window_seconds: float,
    start_unix: int,
    end_unix: int,
    business_type_of: Callable[[str, str], str | None],
    all_cells: Callable[[], Iterable[SeriesCell]],
) -> ServingReport:
    """The report of a derive pass from the window's counters and gauges reduced per business
    type and its histograms summed per business type (collector/analytics/histsums.py): the
    same business-type figures as `build_report` of every cell; the (target, model) groups are
    derived from `all_cells()` when first read."""
    types = []
    for btype in sorted(scalars.types.keys() | histograms.keys()):
        scope = scalars.types.get(btype) or ScopeScalars()
        by_metric: dict[str, list[SeriesCell]] = defaultdict(list)
        for sc in histograms.get(btype, ()):
            scope.add(sc.target, sc.ident, sc.unit, sc.cell)
            by_metric[sc.ident.key.metric].append(sc)
        types.append(BusinessStats(btype, derive_scope(scope, by_metric, window_seconds)))
    groups = LazyGroups([], window_seconds, load=lambda: place(all_cells(), business_type_of)[0], count=scalars.groups)
    return ServingReport(window_seconds, start_unix, end_unix, groups, tuple(types))


def place(
    cells: Iterable[SeriesCell], business_type_of: Callable[[str, str], str | None], business_type: str | None = None
) -> tuple[list[Member], dict[str, list[SeriesCell]]]:
    """The (target, model) groups of `cells` in order, with their business type, and the cells
    of each business type (DCGM GPU series belong to neither: the cost model reads them)."""
    by_group: dict[tuple[str, str], list[SeriesCell]] = defaultdict(list)
    for sc in cells:
        if is_gpu_metric(sc.ident.key.metric):
            continue
        by_group[(sc.target, sc.ident.key.model)].append(sc)
    placed: list[Member] = []
    by_type: dict[str, list[SeriesCell]] = defaultdict(list)
    for (target, model), members in sorted(by_group.items()):
        btype = business_type_of(target, model) or UNASSIGNED
        if business_type is not None and btype != business_type:
            continue
        placed.append((target, model, btype, members))
        by_type[btype].extend(members)
    return placed, by_type
