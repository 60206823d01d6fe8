"""Capacity per deployment: does a replica fit its GPUs at the load it actually sees, how much it
serves while its SLOs hold, how many replicas the peak needs, and when the trend runs out.

Everything here reads hour buckets of the stored rollups (hour cells, or minutes merged into their
hour), grouped by deployment:

- memory: weights + KV at the measured peak concurrency x p95 / p99 context (prompt + output
  length quantiles, the upper bucket bound: vLLM's length histograms are coarse), times the
  activation headroom, against GPU memory x gpu_memory_utilization (collector/cost/formulas.py);
- throughput at SLO: the highest hourly tokens/s (and requests/s) per replica among the hours in
  which every engine latency and error objective of the deployment's business types held;
- demand: the peak hourly tokens/s of each hour of the week; replicas needed = peak demand /
  (throughput at SLO x (1 - capacity_headroom));
- forecast: a least-squares line through weekly peaks (KV-cache usage, queue depth, tokens/s)
  and the date it crosses its limit, with the range the slope's 95 % interval gives.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from collector.analytics.percentiles import fraction_at_or_below, histogram_quantile
from collector.config import CostConfig
from collector.cost.allocation import BusinessTypeOf
from collector.cost.formulas import GIB, MemoryFit, memory_fit, remedies
from collector.cost.inventory import Deployment, Inventory
from collector.rollup import HOUR_SECONDS, Row, add_counts
from collector.slo.spec import Objective, SloRules
from collector.sources.dcgm import USED_RATIO, is_gpu_metric
from collector.sources.vllm import BUSY, Kind

WEEK_SECONDS = 7 * 86400
CAPACITY_METRICS = (
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "prompt_length",
    "generation_length",
    "ttft",
    "tpot",
    "e2e",
    "queue",
    BUSY,
    USED_RATIO,  # DCGM
)
CAPACITY_SET = frozenset(CAPACITY_METRICS)


@dataclass(frozen=True, slots=True)
class Trend:
    """y = intercept + slope x t (t in weeks from the first point) through weekly peaks."""

    points: int
    slope_per_week: float
    intercept: float
    slope_stderr: float | None  # None with two points (no residual to estimate it from)
    limit: float
    first_week_unix: int
    crosses_unix: float | None  # when the line reaches the limit (None: flat or falling)
    crosses_range_unix: tuple[float | None, float | None]  # with slope +- 1.96 stderr
    latest: float


def fit_trend(points: Sequence[tuple[int, float]], limit: float) -> Trend | None:
    """Least squares through (week start unix, weekly peak); None with fewer than two weeks."""
    if len(points) < 2:
        return None
    t0 = points[0][0]
    xs = [(t - t0) / WEEK_SECONDS for t, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    stderr = None
    if len(points) > 2:
        residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
        stderr = math.sqrt(residual / (len(points) - 2) / sxx)

    def crossing(s: float) -> float | None:
        if s <= 0:
            return None
        return t0 + (limit - intercept) / s * WEEK_SECONDS

    low = high = None
    if stderr is not None:
        low, high = crossing(slope + 1.96 * stderr), crossing(slope - 1.96 * stderr)
    return Trend(len(points), slope, intercept, stderr, limit, t0, crossing(slope), (low, high), ys[-1])


@dataclass(slots=True)
class _Hour:
    tokens: float = 0.0
    requests: float = 0.0
    replica_seconds: float = 0.0
    targets: set[str] = field(default_factory=set)
    hist: dict[tuple[str, tuple[float, ...]], list[float]] = field(default_factory=dict)
    errors: float = 0.0
    running_max: float = 0.0
    waiting_max: float = 0.0
    kv_max: float = 0.0
    gpu_memory_max: float | None = None  # DCGM framebuffer used ratio, when exporters are scraped


@dataclass(slots=True)
class Capacity:
    deployment: str
    gpu: str
    replicas_seen: float  # mean over the hours with data
    peak_concurrency: float | None  # per replica (max of vllm:num_requests_running)
    context_p95: float | None  # tokens: prompt p95 + output p95 (bucket upper bounds)
    context_p99: float | None
    kv_usage_peak: float | None
    gpu_memory_peak: float | None  # DCGM framebuffer used ratio (None: no exporter scraped)
    memory_p95: MemoryFit | None
    memory_p99: MemoryFit | None
    advice: list[str]
    slo_hours: int  # hours judged against the SLOs
    slo_hours_held: int
    peak_tokens_per_second_at_slo: float | None  # per replica
    peak_requests_per_second_at_slo: float | None
    peak_demand_tokens_per_second: float | None  # the whole deployment
    peak_demand_hour_of_week: int | None  # 0 = Monday 00:00 UTC
    replicas_needed: int | None
    forecasts: dict[str, Trend] = field(default_factory=dict)


def _objectives(rules: SloRules | None, business_types: Iterable[str]) -> list[Objective]:
    if rules is None:
        return []
    wanted = set(business_types)
    return [
        o
        for bt in rules.business_types
        if bt.name in wanted
        for o in bt.objectives
        if (o.sli == "latency" and o.source == "engine") or o.sli == "error_ratio"
    ]


def _held(hour: _Hour, objectives: list[Objective], min_events: int) -> bool | None:
    """Whether every objective held over the hour; None when it had too few requests to say."""
    if hour.requests < max(1, min_events) or not objectives:
        return None
    for o in objectives:
        if o.sli == "error_ratio":
            if hour.errors / hour.requests > 1 - o.objective:
                return False
            continue
        for (metric, bounds), buckets in hour.hist.items():
            if metric != o.metric or o.threshold_seconds is None:
                continue
            share = fraction_at_or_below(o.threshold_seconds, bounds, buckets)
            if share is not None and share[0] < o.objective:
                return False
    return True


def _quantile_upper(hists: dict[tuple[float, ...], list[float]], q: float) -> float | None:
    """The largest bucket upper bound holding quantile q over the layouts seen (conservative)."""
    best: float | None = None
    for bounds, buckets in hists.items():
        est = histogram_quantile(q, bounds, buckets)
        if est is not None:
            value = est.upper_bound if math.isfinite(est.upper_bound) else est.value
            best = value if best is None else max(best, value)
    return best


def capacity_report(
    rows: Iterable[Row],
    inventory: Inventory,
    config: CostConfig,
    rules: SloRules | None,
    business_type_of: BusinessTypeOf,
    kv_limit: float = 0.95,
    queue_limit: float = 10.0,
) -> list[Capacity]:
    counter = CapacityCounter(inventory, business_type_of)
    counter.add(rows)
    return counter.report(config, rules, kv_limit, queue_limit)


class CapacityCounter:
    """What capacity reads of the rows (per deployment and hour: replicas, tokens, requests and
    errors, peaks, latency histograms; the length histograms), added a piece at a time: the
    weekly report feeds it the rows it reads for its other sections."""

    def __init__(self, inventory: Inventory, business_type_of: BusinessTypeOf) -> None:
        self.inventory, self.business_type_of = inventory, business_type_of
        self.hours: dict[str, dict[int, _Hour]] = defaultdict(lambda: defaultdict(_Hour))
        self.lengths: dict[str, dict[str, dict[tuple[float, ...], list[float]]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        self.types: dict[str, set[str]] = defaultdict(set)
        # per (target, model): its deployment's name (None: in none) and business type, asked once
        self._placed: dict[tuple[str, str], tuple[str | None, str | None]] = {}

    def _place(self, target: str, model: str) -> tuple[str | None, str | None]:
        d = self.inventory.deployment_of(target)
        placed = (None, None) if d is None else (d.name, self.business_type_of(target, model))
        self._placed[(target, model)] = placed
        return placed

    def add(self, rows: Iterable[Row]) -> None:
        """Rows of CAPACITY_METRICS (others are left out), each once."""
        hours, lengths, types, placed = self.hours, self.lengths, self.types, self._placed
        for r in rows:
            ident, cell = r.cell.ident, r.cell.cell
            metric = ident.key.metric
            if metric not in CAPACITY_SET:
                continue
            target = r.cell.target
            found = placed.get((target, ident.key.model))
            name, bt = self._place(target, ident.key.model) if found is None else found
            if name is None:
                continue
            h = hours[name][r.start_unix - r.start_unix % HOUR_SECONDS]
            if is_gpu_metric(metric):
                if metric == USED_RATIO and cell.n:
                    h.gpu_memory_max = max(h.gpu_memory_max or 0.0, cell.gmax)
                continue
            if bt:
                types[name].add(bt)
            h.targets.add(target)
            if ident.kind is Kind.COUNTER:
                if metric in ("prompt_tokens", "generation_tokens"):
                    h.tokens += cell.value
                elif metric == "request_success":
                    h.requests += cell.value
                    if dict(ident.key.labels).get("finished_reason") in ("error", "abort"):
                        h.errors += cell.value
            elif ident.kind is Kind.HISTOGRAM and cell.buckets is not None:
                if metric in ("prompt_length", "generation_length"):
                    add_counts(lengths[name][metric], ident.bounds, cell.buckets)
                else:
                    add_counts(h.hist, (metric, ident.bounds), cell.buckets)
            elif cell.n:
                if metric == BUSY:
                    h.replica_seconds += cell.observed_seconds
                elif metric == "requests_running":
                    h.running_max = max(h.running_max, cell.gmax)
                elif metric == "requests_waiting":
                    h.waiting_max = max(h.waiting_max, cell.gmax)
                elif metric == "kv_cache_usage":
                    h.kv_max = max(h.kv_max, cell.gmax)

    def report(
        self, config: CostConfig, rules: SloRules | None, kv_limit: float = 0.95, queue_limit: float = 10.0
    ) -> list[Capacity]:
        hours, lengths, types = self.hours, self.lengths, self.types
        out = []
        for name, d in self.inventory.deployments.items():
            out.append(
                _deployment_capacity(
                    d,
                    hours.get(name, {}),
                    lengths.get(name, {}),
                    _objectives(rules, types.get(name, ())),
                    rules.min_events if rules else 1,
                    config,
                    kv_limit,
                    queue_limit,
                )
            )
        return out


def _deployment_capacity(
    d: Deployment,
    hours: dict[int, _Hour],
    lengths: dict[str, dict[tuple[float, ...], list[float]]],
    objectives: list[Objective],
    min_events: int,
    config: CostConfig,
    kv_limit: float,
    queue_limit: float,
) -> Capacity:
    def replicas(h: _Hour) -> float:
        return h.replica_seconds / HOUR_SECONDS if h.replica_seconds > 0 else float(len(h.targets))

    seen = [replicas(h) for h in hours.values() if replicas(h) > 0]
    replicas_seen = statistics.fmean(seen) if seen else 0.0
    peak_running = max((h.running_max for h in hours.values()), default=None)
    context: dict[float, float | None] = {}
    for q in (0.95, 0.99):
        prompt = _quantile_upper(lengths.get("prompt_length", {}), q)
        output = _quantile_upper(lengths.get("generation_length", {}), q)
        context[q] = None if prompt is None else prompt + (output or 0.0)
        if context[q] is not None and d.config.max_model_len:
            context[q] = min(context[q] or 0.0, float(d.config.max_model_len))
    fits: dict[float, MemoryFit | None] = {0.95: None, 0.99: None}
    advice: list[str] = []
    if d.arch is not None and peak_running is not None:
        for q in (0.95, 0.99):
            ctx = context[q]
            if ctx is not None:
                fits[q] = memory_fit(
                    d.arch,
                    d.gpu.memory_gib * GIB,
                    d.config.gpu_memory_utilization,
                    d.config.tp,
                    max(1.0, peak_running),
                    ctx,
                    config.activation_headroom,
                    d.bytes_per_parameter,
                )
        worst = fits[0.99] or fits[0.95]
        if worst is not None:
            advice = remedies(worst, d.arch, d.config.tp)
    # throughput per replica in the hours the SLOs held
    judged = held = 0
    best_tokens: float | None = None
    best_requests: float | None = None
    for h in hours.values():
        verdict = _held(h, objectives, min_events)
        if verdict is None:
            continue
        judged += 1
        n = replicas(h)
        if verdict and n > 0:
            held += 1
            tps, rps = h.tokens / HOUR_SECONDS / n, h.requests / HOUR_SECONDS / n
            best_tokens = tps if best_tokens is None else max(best_tokens, tps)
            best_requests = rps if best_requests is None else max(best_requests, rps)
    # demand per hour of week (Monday 00:00 UTC = 0; the epoch was a Thursday)
    by_how: dict[int, float] = defaultdict(float)
    for start, h in hours.items():
        how = ((start // HOUR_SECONDS) + 72) % 168
        by_how[how] = max(by_how[how], h.tokens / HOUR_SECONDS)
    peak_how = max(by_how, key=lambda k: by_how[k]) if by_how else None
    peak_demand = by_how[peak_how] if peak_how is not None else None
    needed = None
    if peak_demand is not None and best_tokens:
        needed = max(1, math.ceil(peak_demand / (best_tokens * (1 - config.capacity_headroom))))
    # weekly peaks and their trend
    weekly: dict[str, dict[int, float]] = defaultdict(dict)
    for start, h in hours.items():
        week = start - (start + 3 * 86400) % WEEK_SECONDS  # weeks start on Monday 00:00 UTC
        for key, value in (
            ("kv_cache_usage", h.kv_max),
            ("requests_waiting", h.waiting_max),
            ("tokens_per_second", h.tokens / HOUR_SECONDS),
            ("gpu_memory_used_ratio", h.gpu_memory_max),
        ):
            if value is not None:
                weekly[key][week] = max(weekly[key].get(week, 0.0), value)
    limits = {
        "kv_cache_usage": kv_limit,
        "requests_waiting": queue_limit,
        "gpu_memory_used_ratio": min(0.99, max(kv_limit, d.config.gpu_memory_utilization + 0.05)),
    }
    if best_tokens:
        limits["tokens_per_second"] = best_tokens * (d.config.replicas or replicas_seen or 1.0)
    forecasts = {}
    for key, limit in limits.items():
        trend = fit_trend(sorted(weekly.get(key, {}).items()), limit)
        if trend is not None:
            forecasts[key] = trend
    return Capacity(
        deployment=d.name,
        gpu=d.config.gpu,
        replicas_seen=replicas_seen,
        peak_concurrency=peak_running,
        context_p95=context.get(0.95),
        context_p99=context.get(0.99),
        kv_usage_peak=max((h.kv_max for h in hours.values()), default=None),
        gpu_memory_peak=max((h.gpu_memory_max for h in hours.values() if h.gpu_memory_max is not None), default=None),
        memory_p95=fits[0.95],
        memory_p99=fits[0.99],
        advice=advice,
        slo_hours=judged,
        slo_hours_held=held,
        peak_tokens_per_second_at_slo=best_tokens,
        peak_requests_per_second_at_slo=best_requests,
        peak_demand_tokens_per_second=peak_demand,
        peak_demand_hour_of_week=peak_how,
        replicas_needed=needed,
        forecasts=forecasts,
    )
