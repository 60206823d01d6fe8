"""JSON API response models (pydantic), converted from the internal dataclasses at the edge.

JSON has no infinity: an upper bucket bound of +Inf is sent as null with `above_top_bound`.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from pydantic import BaseModel

from collector import conventions as conv
from collector.analytics.percentiles import QuantileEstimate
from collector.analytics.serving import (
    GaugeStats,
    GroupStats,
    LatencyStats,
    ServingReport,
    ServingStats,
)
from collector.config import format_duration
from collector.cost.allocation import CostReport
from collector.cost.allocation import Line as CostLineData
from collector.cost.capacity import Capacity
from collector.cost.formulas import GIB, MemoryFit
from collector.drift.compare import Comparison
from collector.drift.engine import Finding
from collector.fleetmap import FleetMap
from collector.slo.alerts import AlertInstance
from collector.slo.evaluate import Events, SloStatus, WindowSli, burn
from collector.slo.spec import Objective
from collector.sources.scrape import TargetStatus
from collector.traces.summary import RequestSummary


class Quantile(BaseModel):
    """A quantile interpolated inside a histogram bucket: only the bounds are measured."""

    quantile: float
    value_seconds: float
    lower_bound_seconds: float
    upper_bound_seconds: float | None  # null = +Inf
    above_top_bound: bool  # the true quantile is at least value_seconds (the top finite bound)
    below_first_bound: bool  # the true quantile is at most value_seconds (the first bound)
    estimated: bool = True  # interpolated inside [lower, upper], not measured
    text: str  # "<= 0.3", ">= 60", "2.2 (1-2.5)"


class Latency(BaseModel):
    count: float
    mean_seconds: float | None
    quantiles: list[Quantile]
    estimated: bool
    source: str
    mixed_bucket_layouts: bool


class Gauge(BaseModel):
    last: float
    min: float
    max: float
    mean: float


class Serving(BaseModel):
    window_seconds: float
    observed_seconds: float
    requests: float | None
    requests_per_second: float | None
    finished: dict[str, float]
    error_ratio: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    prompt_tokens_per_second: float | None
    generation_tokens_per_second: float | None
    preemptions_per_second: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    prefix_cache_hit_ratio: float | None
    prefix_cache_unit: str
    kv_cache_usage_ratio: Gauge | None
    requests_running: Gauge | None
    requests_waiting: Gauge | None
    latencies: dict[str, Latency]
    lengths_tokens: dict[str, Latency]
    tpot_mean_estimate_seconds: float | None


class ServingGroup(BaseModel):
    target: str
    model: str
    business_type: str
    stats: Serving


class BusinessGroup(BaseModel):
    business_type: str
    stats: Serving


class ServingResponse(BaseModel):
    window: str
    window_seconds: float
    start_unix: int
    end_unix: int
    groups: list[ServingGroup]
    business_types: list[BusinessGroup]


class Target(BaseModel):
    name: str
    url: str
    business_type: str | None
    labels: dict[str, str]
    interval_seconds: float
    timeout_seconds: float
    up: bool | None
    last_scrape_unix: float | None
    last_success_unix: float | None
    last_duration_seconds: float
    last_error: str | None
    last_error_reason: str | None
    samples: int
    body_bytes: int
    scrapes_total: int
    errors_total: dict[str, int]
    counter_resets_total: int
    restarts_total: int
    last_restart_unix: float | None
    process_start_unix: float | None
    consecutive_failures: int
    next_scrape_not_before_unix: float | None
    models: list[str]
    unassigned_models: list[str]
    business_type_conflicts: list[str]


class TargetsResponse(BaseModel):
    targets: list[Target]


def quantile_out(q: QuantileEstimate) -> Quantile:
    return Quantile.model_validate(_quantile_dict(q))


def serving_out(s: ServingStats) -> Serving:
    return Serving.model_validate(_serving_dict(s))


def report_out(window: str, r: ServingReport) -> ServingResponse:
    return ServingResponse(
        window=window,
        window_seconds=r.window_seconds,
        start_unix=r.start_unix,
        end_unix=r.end_unix,
        groups=[
            ServingGroup(target=g.target, model=g.model, business_type=g.business_type, stats=serving_out(g.stats))
            for g in r.groups
        ],
        business_types=[
            BusinessGroup(business_type=b.business_type, stats=serving_out(b.stats)) for b in r.business_types
        ],
    )


def _quantile_dict(q: QuantileEstimate) -> dict[str, Any]:
    return {
        "quantile": q.quantile,
        "value_seconds": q.value,
        "lower_bound_seconds": q.lower_bound,
        "upper_bound_seconds": None if q.upper_bound == math.inf else q.upper_bound,
        "above_top_bound": q.above_top_bound,
        "below_first_bound": q.below_first_bound,
        "estimated": True,
        "text": q.text,
    }


def _latency_dict(lat: LatencyStats) -> dict[str, Any]:
    return {
        "count": lat.count,
        "mean_seconds": lat.mean_seconds,
        "quantiles": [_quantile_dict(q) for q in lat.quantiles],
        "estimated": lat.estimated,
        "source": lat.source,
        "mixed_bucket_layouts": lat.mixed_bucket_layouts,
    }


def _gauge_dict(g: GaugeStats | None) -> dict[str, Any] | None:
    return None if g is None else {"last": g.last, "min": g.min, "max": g.max, "mean": g.mean}


def _serving_dict(s: ServingStats) -> dict[str, Any]:
    """`s` as the plain JSON values of `Serving`, in its order: what `serving_json` writes and
    `serving_out` validates (one mapping for both)."""
    return {
        "window_seconds": s.window_seconds,
        "observed_seconds": s.observed_seconds,
        "requests": s.requests,
        "requests_per_second": s.requests_per_second,
        "finished": s.finished,
        "error_ratio": s.error_ratio,
        "prompt_tokens": s.prompt_tokens,
        "generation_tokens": s.generation_tokens,
        "prompt_tokens_per_second": s.prompt_tokens_per_second,
        "generation_tokens_per_second": s.generation_tokens_per_second,
        "preemptions_per_second": s.preemptions_per_second,
        "prefix_cache_queries": s.prefix_cache_queries,
        "prefix_cache_hits": s.prefix_cache_hits,
        "prefix_cache_hit_ratio": s.prefix_cache_hit_ratio,
        "prefix_cache_unit": s.prefix_cache_unit,
        "kv_cache_usage_ratio": _gauge_dict(s.kv_cache_usage),
        "requests_running": _gauge_dict(s.requests_running),
        "requests_waiting": _gauge_dict(s.requests_waiting),
        "latencies": {k: _latency_dict(v) for k, v in s.latencies.items()},
        "lengths_tokens": {k: _latency_dict(v) for k, v in s.lengths.items()},
        "tpot_mean_estimate_seconds": s.tpot_mean_estimate_seconds,
    }


def _dumps(value: object) -> bytes:
    """JSON as pydantic writes it (UTF-8, NaN and infinities as null), by orjson: at a thousand
    targets the standard encoder took 0.3-0.4 s of the fleet view's ~1 s encode, orjson 0.04 s."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def _group_json(g: GroupStats) -> bytes:
    return _dumps({"target": g.target, "model": g.model, "business_type": g.business_type,
                   "stats": _serving_dict(g.stats)})  # fmt: skip


def serving_json(window: str, r: ServingReport) -> bytes:
    """The JSON of `report_out(window, r)` written without a pydantic model per group (at a
    thousand targets building the models cost more than the JSON itself), one group at a time
    (a single call over the whole 9 MB body would hold the interpreter while a /metrics request
    waits). The same values as pydantic writes: tests/unit/test_report_json.py."""
    head = _dumps({"window": window, "window_seconds": r.window_seconds, "start_unix": r.start_unix,
                   "end_unix": r.end_unix})  # fmt: skip
    groups = b",".join(map(_group_json, r.groups))
    types = b",".join(
        _dumps({"business_type": t.business_type, "stats": _serving_dict(t.stats)}) for t in r.business_types
    )
    return b"".join((head[:-1], b',"groups":[', groups, b'],"business_types":[', types, b"]}"))


def target_out(
    st: TargetStatus,
    business_type: str | None,
    labels: dict[str, str],
    interval: float,
    timeout: float,
    fleet: FleetMap,
) -> Target:
    conflicts = [
        f"{model}: target says {p.by_target!r}, rules say {p.by_rules!r}" for _, model, p in fleet.conflicts(st.name)
    ]
    return Target(
        name=st.name,
        url=st.url,
        business_type=business_type,
        labels=labels,
        interval_seconds=interval,
        timeout_seconds=timeout,
        up=st.up,
        last_scrape_unix=st.last_scrape_unix,
        last_success_unix=st.last_success_unix,
        last_duration_seconds=st.last_duration_seconds,
        last_error=st.last_error,
        last_error_reason=st.last_error_reason,
        samples=st.samples,
        body_bytes=st.body_bytes,
        scrapes_total=st.scrapes_total,
        errors_total=dict(st.errors_total),
        counter_resets_total=st.counter_resets_total,
        restarts_total=st.restarts_total,
        last_restart_unix=st.last_restart_unix,
        process_start_unix=st.process_start_unix,
        consecutive_failures=st.consecutive_failures,
        next_scrape_not_before_unix=st.next_allowed_unix or None,
        models=list(st.models),
        unassigned_models=[model for _, model in fleet.unassigned(st.name)],
        business_type_conflicts=conflicts,
    )


class SloWindow(BaseModel):
    window: str
    good: float
    total: float
    sli: float | None
    burn_rate: float | None


class SloPair(BaseModel):
    severity: str
    long_window: str
    short_window: str
    factor: float
    long_burn_rate: float | None
    short_burn_rate: float | None
    firing: bool
    reason: str


class Slo(BaseModel):
    slo: str
    business_type: str
    sli: str
    objective: float
    metric: str | None
    threshold_seconds: float | None
    source: str
    status: str  # ok | burning | no_data
    no_data_reason: str
    exact: bool
    error_budget_remaining: float | None
    period: SloWindow
    windows: list[SloWindow]
    pairs: list[SloPair]


class SloAttainment(BaseModel):
    """One objective over a closed period: its events, the share good, the budget it used."""

    slo: str
    business_type: str
    sli: str
    objective: float
    good: float
    total: float
    attainment: float | None  # good / total; null: no events in the period (no data, not 100 %)
    budget_consumed: float | None  # bad / total over the error budget: 1.0 = all of it
    met: bool | None
    exact: bool


class SloAttainmentResponse(BaseModel):
    start_unix: int
    end_unix: int
    slos: list[SloAttainment]


class ReportEntry(BaseModel):
    id: str
    title: str
    start_unix: int
    end_unix: int
    created_unix: float
    deliveries: dict[str, dict[str, Any]]  # per channel: status, attempts, last_error, delivered_unix
    url: str  # the HTML page (/reports/<id>; + .md for Markdown; /api/v1/reports/<id> for JSON)


class ReportsResponse(BaseModel):
    reports: list[ReportEntry]


def attainment_out(o: Objective, e: Events) -> SloAttainment:
    share = e.good / e.total if e.total > 0 else None
    return SloAttainment(
        slo=o.slo,
        business_type=o.business_type,
        sli=o.sli,
        objective=o.objective,
        good=e.good,
        total=e.total,
        attainment=share,
        budget_consumed=(e.bad / e.total) / o.error_budget if e.total > 0 else None,
        met=None if share is None else share >= o.objective,
        exact=e.exact,
    )


class Alert(BaseModel):
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    starts_at_unix: float | None
    ends_at_unix: float | None
    delivered_state: str | None
    delivery_attempts: int


class SlosResponse(BaseModel):
    evaluated_unix: float | None
    slos: list[Slo]
    alerts: list[Alert]


def slo_window_out(label: str, w: WindowSli, o: Objective) -> SloWindow:
    return SloWindow(window=label, good=w.events.good, total=w.events.total, sli=w.sli, burn_rate=burn(w.events, o))


def slo_out(st: SloStatus) -> Slo:
    o = st.objective
    firing = any(p.firing for p in st.pairs)
    no_data = st.period.events.total <= 0
    return Slo(
        slo=o.slo,
        business_type=o.business_type,
        sli=o.sli,
        objective=o.objective,
        metric=o.metric,
        threshold_seconds=o.threshold_seconds,
        source=o.source,
        status="burning" if firing else ("no_data" if no_data else "ok"),
        no_data_reason=st.no_data_reason or ("no events in the period" if no_data else ""),
        exact=st.exact,
        error_budget_remaining=st.budget_remaining,
        period=slo_window_out(format_duration(st.period.seconds), st.period, o),
        windows=[slo_window_out(format_duration(s), w, o) for s, w in sorted(st.windows.items())],
        pairs=[
            SloPair(
                severity=p.pair.severity,
                long_window=format_duration(p.pair.long_seconds),
                short_window=format_duration(p.pair.short_seconds),
                factor=p.pair.factor,
                long_burn_rate=p.long_burn,
                short_burn_rate=p.short_burn,
                firing=p.firing,
                reason=p.reason,
            )
            for p in st.pairs
        ],
    )


def alert_out(a: AlertInstance) -> Alert:
    return Alert(
        labels=a.labels,
        annotations=a.annotations,
        state=a.state,
        starts_at_unix=a.starts_at_unix,
        ends_at_unix=a.ends_at_unix,
        delivered_state=a.delivered_state,
        delivery_attempts=a.attempts,
    )


class RequestLatency(BaseModel):
    count: int
    mean_seconds: float | None
    quantiles_seconds: dict[str, float]


class EngineBreakdown(BaseModel):
    """The engine's view of the same model and window (from the scraped vLLM histograms), per
    server: one entry per (target, model)."""

    target: str
    model: str
    p50_seconds: dict[str, float]  # interpolated: see `quantiles` for the bucket bounds
    p95_seconds: dict[str, float]
    quantiles: dict[str, list[Quantile]]  # per metric: p50 and p95 with their bucket bounds


class RequestSummaryResponse(BaseModel):
    window: str
    start_unix: int
    end_unix: int
    requests: int
    errors: int
    error_ratio: float | None
    error_types: dict[str, int]
    finish_reasons: dict[str, int]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cache_hit_ratio: float | None  # null: no source of these requests reports cached tokens
    cache_reported_share: float | None  # share of input tokens whose source reports cached tokens
    goodput_ratio: float | None
    good_ratio: dict[str, float]
    latencies: dict[str, RequestLatency]
    measured_at: list[str]
    tenants: dict[str, int]
    fields_reported: dict[str, dict[str, float]]  # per clock: share of requests reporting each field
    engine: list[EngineBreakdown]


def summary_out(
    window: str, start: int, end: int, s: RequestSummary, engine: list[EngineBreakdown]
) -> RequestSummaryResponse:
    return RequestSummaryResponse(
        window=window,
        start_unix=start,
        end_unix=end,
        requests=s.requests,
        errors=s.errors,
        error_ratio=s.error_ratio,
        error_types=s.error_types,
        finish_reasons=s.finish_reasons,
        input_tokens=s.input_tokens,
        cached_input_tokens=s.cached_input_tokens,
        output_tokens=s.output_tokens,
        cache_hit_ratio=s.cache_hit_ratio,
        cache_reported_share=s.cache_reported_share,
        goodput_ratio=s.goodput_ratio,
        good_ratio=s.good_ratio,
        latencies={
            k: RequestLatency(
                count=v.count,
                mean_seconds=v.mean_seconds,
                quantiles_seconds={conv.quantile_label(q): x for q, x in v.quantiles.items()},
            )
            for k, v in s.latencies.items()
        },
        measured_at=list(s.measured_at),
        tenants=s.tenants,
        fields_reported=s.fields_reported,
        engine=engine,
    )


def engine_breakdown(report: ServingReport) -> list[EngineBreakdown]:
    out = []
    for g in report.groups:
        p50: dict[str, float] = {}
        p95: dict[str, float] = {}
        bounded: dict[str, list[Quantile]] = {}
        for metric in ("ttft", "queue", "prefill", "decode", "tpot", "e2e"):
            lat = g.stats.latencies.get(metric)
            if lat is None:
                continue
            for q in lat.quantiles:
                if q.quantile == 0.5:
                    p50[metric] = q.value
                elif q.quantile == 0.95:
                    p95[metric] = q.value
                else:
                    continue
                bounded.setdefault(metric, []).append(quantile_out(q))
        out.append(EngineBreakdown(target=g.target, model=g.model, p50_seconds=p50, p95_seconds=p95, quantiles=bounded))
    return out


# --- cost -----------------------------------------------------------------------------------------


class CostLine(BaseModel):
    """Cost and work of one group. `cost_usd` = busy (usage basis) + its idle share; the
    allocation basis divides it by the tokens, the usage basis only the busy part; utilization
    is their ratio. Ratios are null where there is nothing to divide by."""

    key: str
    requests: float
    prompt_tokens: float
    cached_prompt_tokens: float
    output_tokens: float
    cost_usd: float
    busy_usd: float
    idle_usd: float
    usd_per_request: float | None
    usd_per_1k_requests: float | None
    usd_per_million_input_tokens: float | None
    usd_per_million_output_tokens: float | None
    usage_usd_per_million_tokens: float | None
    allocation_usd_per_million_tokens: float | None
    utilization: float | None
    cache_savings_usd: float
    api_usd: float | None  # the same tokens at the deployment's configured API list prices


class DeploymentCostOut(BaseModel):
    name: str
    gpu: str
    allocated_usd: float  # price x GPU-hours + fixed costs: what the bill says
    gpu_hours: float
    replica_hours: float
    busy_share: float | None  # share of scraped time with requests running; null: not sampled
    busy_source: str  # engine (vLLM requests running), dcgm (GPU engine activity), none
    busy_usd: float
    idle_usd: float
    unshared_idle_usd: float  # idle charged to no group
    prefill_seconds_per_token: float | None  # the calibration (null: output_token_multiplier used)
    decode_seconds_per_token: float | None
    api_usd: float | None
    break_even_requests_per_day: float | None  # above this a day, self-hosting beats the API
    totals: CostLine


class CostResponse(BaseModel):
    start_unix: int
    end_unix: int
    group_by: str
    allocated_usd: float
    attributed_usd: float  # groups' cost (busy + shared idle); + unshared idle = allocated
    deployments: list[DeploymentCostOut]
    groups: list[CostLine]
    unpriced_targets: list[str]  # scraped, but in no deployment: work shown, no cost


def cost_line_out(key: str, line: CostLineData) -> CostLine:
    return CostLine(key=key, **line.as_dict())


def cost_out(report: CostReport, group_by: str, lines: dict[str, CostLineData]) -> CostResponse:
    deployments = []
    days = (report.end_unix - report.start_unix) / 86400.0
    for d in report.deployments:
        api = d.line.api_usd
        per_request = api / d.line.requests if api is not None and d.line.requests > 0 else None
        break_even = None
        if per_request and days > 0:
            break_even = d.allocated_usd / days / per_request
        deployments.append(
            DeploymentCostOut(
                name=d.name,
                gpu=d.gpu,
                allocated_usd=d.allocated_usd,
                gpu_hours=d.gpu_hours,
                replica_hours=d.replica_hours,
                busy_share=d.busy_share,
                busy_source=d.busy_source,
                busy_usd=d.busy_usd,
                idle_usd=d.idle_usd,
                unshared_idle_usd=d.unshared_idle_usd,
                prefill_seconds_per_token=d.prefill_seconds_per_token,
                decode_seconds_per_token=d.decode_seconds_per_token,
                api_usd=api,
                break_even_requests_per_day=break_even,
                totals=cost_line_out(d.name, d.line),
            )
        )
    return CostResponse(
        start_unix=report.start_unix,
        end_unix=report.end_unix,
        group_by=group_by,
        allocated_usd=report.allocated_usd,
        attributed_usd=sum(line.total_usd for line in report.groups.values()),
        deployments=deployments,
        groups=[cost_line_out(k, v) for k, v in sorted(lines.items(), key=lambda kv: -kv[1].total_usd)],
        unpriced_targets=report.unpriced_targets,
    )


# --- capacity -------------------------------------------------------------------------------------


class MemoryFitOut(BaseModel):
    """One replica's memory on one GPU at the measured peak concurrency and a context quantile."""

    context_tokens: float
    concurrency: float
    gpu_memory_gib: float
    usable_gib: float  # x gpu_memory_utilization
    weights_gib: float | None  # per GPU (tensor parallel splits them)
    kv_gib: float
    headroom: float
    needed_gib: float | None  # (weights + KV) x headroom
    fits: bool | None  # null: the weights are unknown (no checkpoint index, no `parameters`)
    max_concurrency: int | None  # sequences of this context that fit


class TrendOut(BaseModel):
    points: int  # weekly peaks
    slope_per_week: float
    latest: float
    limit: float
    slope_stderr: float | None
    crosses_unix: float | None  # null: flat or falling
    crosses_earliest_unix: float | None  # slope + 1.96 stderr
    crosses_latest_unix: float | None  # slope - 1.96 stderr (null: it may never cross)


class CapacityOut(BaseModel):
    deployment: str
    gpu: str
    replicas_seen: float
    peak_concurrency: float | None
    context_p95_tokens: float | None
    context_p99_tokens: float | None
    kv_usage_peak: float | None
    gpu_memory_peak: float | None  # DCGM framebuffer used ratio; null: no exporter scraped
    memory_p95: MemoryFitOut | None
    memory_p99: MemoryFitOut | None
    advice: list[str]
    slo_hours: int
    slo_hours_held: int
    peak_tokens_per_second_at_slo: float | None  # per replica
    peak_requests_per_second_at_slo: float | None
    peak_demand_tokens_per_second: float | None
    peak_demand_hour_of_week: int | None  # 0 = Monday 00:00 UTC
    replicas_needed: int | None
    forecasts: dict[str, TrendOut]


class CapacityResponse(BaseModel):
    start_unix: int
    end_unix: int
    deployments: list[CapacityOut]


def memory_fit_out(fit: MemoryFit | None) -> MemoryFitOut | None:
    if fit is None:
        return None

    def gib(x: float | None) -> float | None:
        return None if x is None else x / GIB

    return MemoryFitOut(
        context_tokens=fit.context_tokens,
        concurrency=fit.concurrency,
        gpu_memory_gib=fit.gpu_memory_bytes / GIB,
        usable_gib=fit.usable_bytes / GIB,
        weights_gib=gib(fit.weights_bytes),
        kv_gib=fit.kv_bytes / GIB,
        headroom=fit.headroom,
        needed_gib=gib(fit.needed_bytes),
        fits=fit.fits,
        max_concurrency=fit.max_concurrency,
    )


def capacity_out(start: int, end: int, report: list[Capacity]) -> CapacityResponse:
    return CapacityResponse(
        start_unix=start,
        end_unix=end,
        deployments=[
            CapacityOut(
                deployment=c.deployment,
                gpu=c.gpu,
                replicas_seen=c.replicas_seen,
                peak_concurrency=c.peak_concurrency,
                context_p95_tokens=c.context_p95,
                context_p99_tokens=c.context_p99,
                kv_usage_peak=c.kv_usage_peak,
                gpu_memory_peak=c.gpu_memory_peak,
                memory_p95=memory_fit_out(c.memory_p95),
                memory_p99=memory_fit_out(c.memory_p99),
                advice=c.advice,
                slo_hours=c.slo_hours,
                slo_hours_held=c.slo_hours_held,
                peak_tokens_per_second_at_slo=c.peak_tokens_per_second_at_slo,
                peak_requests_per_second_at_slo=c.peak_requests_per_second_at_slo,
                peak_demand_tokens_per_second=c.peak_demand_tokens_per_second,
                peak_demand_hour_of_week=c.peak_demand_hour_of_week,
                replicas_needed=c.replicas_needed,
                forecasts={
                    k: TrendOut(
                        points=t.points,
                        slope_per_week=t.slope_per_week,
                        latest=t.latest,
                        limit=t.limit,
                        slope_stderr=t.slope_stderr,
                        crosses_unix=t.crosses_unix,
                        crosses_earliest_unix=t.crosses_range_unix[0],
                        crosses_latest_unix=t.crosses_range_unix[1],
                    )
                    for k, t in c.forecasts.items()
                },
            )
            for c in report
        ],
    )


# --- drift ----------------------------------------------------------------------------------------


class DriftFindingOut(BaseModel):
    business_type: str
    tenant: str | None  # null: all traffic of the business type (engine metrics)
    signal: str
    drifted: bool
    summary: str  # what moved, by how much, since when
    psi: float
    js_distance: float
    ks: float | None  # histograms only (binned: a lower bound of the exact KS)
    wasserstein_normed: float | None  # on log values, over the reference's standard deviation
    threshold_psi: float
    threshold_calibrated: bool  # mean + 3 sigma over the reference's chunks, else the default 0.25
    reference_chunks: int
    events: float  # requests in the current window
    reference_events: float
    started_unix: int | None


class DriftResponse(BaseModel):
    evaluated_unix: float | None  # null: no drift pass yet
    window: str
    reference: str  # trailing | hour_of_week
    reference_start_unix: int | None
    reference_end_unix: int | None
    findings: list[DriftFindingOut]


def drift_out(f: Finding) -> DriftFindingOut:
    return DriftFindingOut(
        business_type=f.business_type,
        tenant=f.tenant or None,
        signal=f.signal,
        drifted=f.drifted,
        summary=f.summary,
        psi=f.distances.psi,
        js_distance=f.distances.js,
        ks=f.distances.ks,
        wasserstein_normed=f.distances.wasserstein,
        threshold_psi=f.threshold.psi,
        threshold_calibrated=f.threshold.calibrated,
        reference_chunks=f.threshold.chunks,
        events=f.events,
        reference_events=f.reference_events,
        started_unix=f.started_unix,
    )


# --- compare --------------------------------------------------------------------------------------


class CompareMetric(BaseModel):
    name: str  # ttft_p95, error_ratio, prompt_length_psi, ...
    baseline: float | None
    candidate: float | None
    change: float | None  # relative for latencies and throughput, absolute for ratios
    ci_low: float | None  # 95 % bootstrap interval of `change`
    ci_high: float | None
    tolerance: float | None  # null: reported, does not gate
    verdict: str  # pass | hold | rollback | info
    p_value: float | None  # Mann-Whitney U on the bucketed latencies
    # the change each side's quantile bucket allows (latencies from histograms; null when exact
    # or open-ended): interpolation guesses within a bucket, this is how far the guess may be off
    bucket_low: float | None = None
    bucket_high: float | None = None
    text: str


class CompareResponse(BaseModel):
    baseline: str
    candidate: str
    window: str
    baseline_requests: float
    candidate_requests: float
    verdict: str  # promote | hold | rollback
    reason: str
    source: str  # engines (vLLM's histograms) | spans (gateway span rollups)
    metrics: list[CompareMetric]


def compare_out(c: Comparison) -> CompareResponse:
    return CompareResponse(
        baseline=c.baseline,
        candidate=c.candidate,
        window=format_duration(c.window_seconds),
        baseline_requests=c.baseline_requests,
        candidate_requests=c.candidate_requests,
        verdict=c.verdict,
        reason=c.reason,
        source=c.source,
        metrics=[
            CompareMetric(
                name=m.name,
                baseline=m.baseline,
                candidate=m.candidate,
                change=m.change,
                ci_low=m.ci[0] if m.ci else None,
                ci_high=m.ci[1] if m.ci else None,
                tolerance=m.tolerance,
                verdict=m.verdict,
                p_value=m.p_value,
                bucket_low=m.bucket_range[0] if m.bucket_range else None,
                bucket_high=m.bucket_range[1] if m.bucket_range else None,
                text=m.text,
            )
            for m in c.metrics
        ],
    )
