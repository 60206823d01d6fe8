"""Assemble a report from the collector's own answers.

Every headline figure is what the API returns for the same period (`/api/v1/serving`, `cost`,
`capacity`, `slos/attainment`, `requests/summary`), and the report keeps their API form (`*_out`)
under `api`, so a reader can check any number with one query. It computes them in one pass over
the period's stored rows (`_side`: a day at a time, a few minutes or an hour per read) with the same
accumulators those endpoints use (`merge_into`, `CostInputs`, `PeriodCounter`, `CapacityCounter`),
so that a week of a large fleet is read once, not once per section, and memory holds one read's
rows (tests/report checks the figures against the API). A business type with no traffic in a
period says so (`has_data: false`) instead of showing zeros.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.analytics.running import add as add_cells
from collector.analytics.serving import UNASSIGNED, LatencyStats, ServingReport, build_report
from collector.api.schemas import (
    SloAttainmentResponse,
    attainment_out,
    capacity_out,
    cost_out,
    engine_breakdown,
    report_out,
    summary_out,
)
from collector.config import format_duration
from collector.cost.allocation import CostInputs
from collector.cost.capacity import CapacityCounter
from collector.drift.stats import decumulate, psi
from collector.report.period import WEEK_RE, Period
from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS, Row, SeriesCell, SeriesIdent, add_counts
from collector.slo.evaluate import Events, PeriodCounter
from collector.slo.spec import Objective
from collector.sources.vllm import Kind
from collector.store.repository import merge_into
from collector.traces.rollup import RequestCell, RequestKey
from collector.traces.summary import summarize

if TYPE_CHECKING:
    from collector.runtime import Runtime

LATENCIES = ("ttft", "tpot", "e2e")
QUANTS = {0.5: "p50", 0.95: "p95", 0.99: "p99"}
HOURLY_METRICS = (
    "ttft",
    "tpot",
    "e2e",
    "request_success",
    "prompt_length",
    "generation_length",
    "requests_running",
)
HOURLY_SET = frozenset(HOURLY_METRICS)
DRIFT_ALERT = "LLMSLOWorkloadDrift"
CAPACITY_LOOKBACK = 28 * 86400  # capacity and its forecasts read the four weeks to the period's end


@dataclass
class _Side:
    """What one period (this week or the one before) yields, before it is laid out."""

    period: Period
    serving: ServingReport
    summary: Any  # RequestSummaryResponse
    slos: Any  # SloAttainmentResponse
    days: list[dict[str, Any]]
    hourly: dict[str, list[dict[str, Any]]]
    lengths: dict[str, dict[str, dict[tuple[float, ...], list[float]]]]  # bt -> metric -> layout -> counts
    cost: dict[str, Any] | None  # group_by -> CostResponse (None: no inventory)
    gateway_by_type: dict[str, float]  # spans per business type


def build(rt: Runtime, period: Period, top_tenants: int = 10) -> dict[str, Any]:
    """The report for `period` with the period before it as the comparison (blocking)."""
    started = time.perf_counter()
    # capacity reads the four weeks to the period's end: a period inside them feeds it its rows
    capacity = rt.capacity_counter() if period.seconds <= CAPACITY_LOOKBACK else None
    this = _side(rt, period, detail=True, capacity=capacity)
    before = _side(rt, period.previous(), detail=False)
    report: dict[str, Any] = {
        "id": report_id(period),
        "title": f"LLM serving report, {period.label}",
        "generated_unix": time.time(),
        "period": _period_out(period),
        "previous": _period_out(before.period),
    }
    report["slos"] = _slos(this, before)
    report["business_types"] = _business_types(this, before, _thresholds(rt))
    report["incidents"] = _incidents(rt, this.period, before.period)
    report["traffic"] = _traffic(this, before, top_tenants)
    report["cost"] = _cost(this, before, top_tenants)
    report["drift"] = _drift(this, before, report["incidents"]["episodes"])
    report["capacity"] = _capacity(rt, period, capacity)
    report["data_quality"] = _data_quality(rt, this)
    report["headline"] = _headline(report)
    report["api"] = {
        "serving": report_out(format_duration(period.seconds), this.serving).model_dump(mode="json"),
        "requests_summary": this.summary.model_dump(mode="json"),
        "slos": this.slos.model_dump(mode="json"),
        "cost": this.cost,
    }
    report["build_seconds"] = round(time.perf_counter() - started, 3)
    return report


def report_id(period: Period) -> str:
    """An ISO week's label (2026-W48), else the period's bounds in unix seconds."""
    return period.label if WEEK_RE.match(period.label) else f"{period.start}-{period.end}"


def _period_out(p: Period) -> dict[str, Any]:
    return {"start_unix": p.start, "end_unix": p.end, "label": p.label, "timezone": p.timezone}


# --- reading one period ---------------------------------------------------------------------------


def _side(rt: Runtime, period: Period, detail: bool, capacity: CapacityCounter | None = None) -> _Side:
    """Everything the report shows of one period, from one pass over its stored rows, a day at a
    time and within a day a piece per read (`Runtime.read_spans`: a few minutes of the fleet's
    minute cells, an hour of compacted ones): each piece's rows go to the SLO counter of their
    day (with the gateway's request cells of each hour: `Runtime.piece_requests`), the day's
    cost inputs (the period's add up the days'), the day's hour cells and length histograms, and
    the period's merged series (the serving figures), in that order (the merge adds into the
    cells it is given). The period's request summary reads the request cells an hour at a time
    too. Memory: a piece's rows plus what those keep, not the period's rows (a day of 1,000
    targets' minutes is tens of millions of cells); time: one read of the period instead of one
    per section."""
    lo, hi = period.start, period.end
    days = period.days()
    rules = rt.rules
    first = rt.first_stored_unix()
    merged: dict[tuple[str, SeriesIdent], SeriesCell] = {}
    week_cost = CostInputs()
    day_rows: list[dict[str, Any]] = []
    hourly: dict[str, list[dict[str, Any]]] = defaultdict(list)
    lengths: dict[str, dict[str, dict[tuple[float, ...], list[float]]]] = defaultdict(lambda: defaultdict(dict))
    daily_cost: list[dict[str, Any]] = []
    slo_days: list[list[tuple[Objective, Events]]] = []
    for name, dlo, dhi in days:
        counter = PeriodCounter(rules, dlo, dhi, rt.business_type_of, rt.cost_of) if rules is not None else None
        day_cost = CostInputs()
        hours: dict[int, dict[tuple[str, SeriesIdent], SeriesCell]] = defaultdict(dict)
        for start, end in rt.read_spans(dlo, dhi, first):
            rows = rt.read_rows(start, end)
            if counter is not None:
                counter.add(rows, rt.piece_requests(start, end, dlo, dhi))
            priced = [r for r in rows if r.period_seconds == MINUTE_SECONDS or r.start_unix + r.period_seconds <= dhi]
            day_cost.add_rows(priced)
            _add_hours(rt, rows, dlo, dhi, hours, lengths)
            if capacity is not None:
                capacity.add(rows)
            merge_into(merged, rows, hi)
        week_cost.plus(day_cost)
        slo_day = counter.events() if counter is not None else []
        slo_days.append(slo_day)
        day_report = _merged_report(rt, hours, dlo, dhi)
        day_rows.append(
            {
                "day": name,
                "start_unix": dlo,
                "end_unix": dhi,
                "business_types": {b.business_type: _brief(b.stats) for b in day_report.business_types},
                "slo_events": {o.slo: {"good": e.good, "total": e.total} for o, e in slo_day},
            }
        )
        if detail:
            for hour_start, cells in sorted(hours.items()):
                hr = build_report(
                    list(cells.values()), HOUR_SECONDS, hour_start, hour_start + HOUR_SECONDS, rt.business_type_of
                )
                for b in hr.business_types:
                    hourly[b.business_type].append({"start_unix": hour_start, **_brief(b.stats)})
            if rt.inventory:
                day = rt.cost_from(day_cost, dlo, dhi)
                lines = rt.cost_lines(day, "business_type")
                tokens = sum(line.prompt_tokens + line.output_tokens for line in lines.values())
                daily_cost.append(
                    {
                        "day": name,
                        "allocated_usd": day.allocated_usd,
                        "by_business_type": {k: v.total_usd for k, v in sorted(lines.items())},
                        "tokens": tokens,
                        "usd_per_million_tokens": day.allocated_usd / tokens * 1e6 if tokens > 0 else None,
                    }
                )
    serving = build_report(list(merged.values()), max(60, hi - lo), lo, hi, rt.business_type_of)
    del merged
    # the gateway's request cells of the period, an hour at a time (a large gateway's week is
    # millions of cells): the requests per business type, and the summary of the period
    gateway_by_type: dict[str, float] = defaultdict(float)

    def gateway_cells() -> Iterator[tuple[RequestKey, RequestCell]]:
        for key, cell in rt.request_cells(lo, hi):
            gateway_by_type[key.business_type] += cell.total
            yield key, cell

    summary = summary_out(
        format_duration(max(60, hi - lo)), lo, hi, summarize(gateway_cells()), engine_breakdown(serving)
    )
    objectives = [o for bt in rules.business_types for o in bt.objectives] if rules is not None else []
    totals = [Events(0.0, 0.0) for _ in objectives]
    for slo_day in slo_days:
        totals = [t.plus(e) for t, (_, e) in zip(totals, slo_day, strict=True)]
    slos = SloAttainmentResponse(
        start_unix=lo, end_unix=hi, slos=[attainment_out(o, e) for o, e in zip(objectives, totals, strict=True)]
    )
    cost = None
    if rt.inventory:
        report = rt.cost_from(week_cost, lo, hi)
        cost = {
            group: cost_out(report, group, rt.cost_lines(report, group)).model_dump(mode="json")
            for group in ("business_type", "deployment", "model", "tenant")
        }
        if detail:
            cost["daily"] = daily_cost  # type: ignore[assignment]
    return _Side(period, serving, summary, slos, day_rows, dict(hourly), lengths, cost, dict(gateway_by_type))


def _add_hours(
    rt: Runtime,
    rows: list[Row],
    lo: int,
    hi: int,
    hours: dict[int, dict[tuple[str, SeriesIdent], SeriesCell]],
    lengths: dict[str, dict[str, dict[tuple[float, ...], list[float]]]],
) -> None:
    """A day's rows merged per hour (minute cells into their hour; compacted hours as they are;
    the series of HOURLY_METRICS), and the length histograms added into `lengths` per business
    type."""
    for row in rows:
        sc = row.cell
        metric = sc.ident.key.metric
        if metric not in HOURLY_SET or row.start_unix + row.period_seconds > hi:
            continue  # an hour cell reaching past the day (a zone with a half-hour offset)
        add_cells(hours[row.start_unix - (row.start_unix - lo) % HOUR_SECONDS], (sc,))
        if metric in ("prompt_length", "generation_length") and sc.ident.kind is Kind.HISTOGRAM and sc.cell.buckets:
            add_counts(lengths[rt.business_type_of(sc.target, sc.ident.key.model) or UNASSIGNED][metric],
                       sc.ident.bounds, sc.cell.buckets)  # fmt: skip


def _merged_report(
    rt: Runtime, hours: dict[int, dict[tuple[str, SeriesIdent], SeriesCell]], lo: int, hi: int
) -> ServingReport:
    merged: dict[tuple[str, SeriesIdent], SeriesCell] = {}
    for cells in hours.values():
        add_cells(merged, cells.values())
    return build_report(list(merged.values()), hi - lo, lo, hi, rt.business_type_of)


def _quantiles(lat: LatencyStats | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {name: None for name in QUANTS.values()}
    if lat is None or lat.count <= 0:
        return out
    for q in lat.quantiles:
        if q.quantile in QUANTS:
            out[QUANTS[q.quantile]] = q.value
    return out


def _brief(stats: Any) -> dict[str, Any]:
    """Requests and the latency quantiles of one group over one slice of time."""
    return {
        "requests": stats.requests or 0.0,
        "error_ratio": stats.error_ratio,
        **{m: _quantiles(stats.latencies.get(m)) for m in LATENCIES},
        "peak_running": stats.requests_running.max if stats.requests_running is not None else None,
    }


# --- sections -------------------------------------------------------------------------------------


def _slos(this: _Side, before: _Side) -> list[dict[str, Any]]:
    previous = {s.slo: s for s in before.slos.slos}
    out = []
    for s in this.slos.slos:
        p = previous.get(s.slo)
        days = []
        for d in this.days:
            e = d["slo_events"].get(s.slo, {"good": 0.0, "total": 0.0})
            bad = e["total"] - e["good"]
            allowed = (1 - s.objective) * s.total  # the week's budget, in events
            days.append(
                {
                    "day": d["day"],
                    "good": e["good"],
                    "total": e["total"],
                    "bad": bad,
                    "budget_share": bad / allowed if allowed > 0 else None,  # of the week's budget
                }
            )
        burned = [d for d in days if d["budget_share"]]
        worst = max(burned, key=lambda d: d["budget_share"]) if burned else None
        out.append(
            {
                **s.model_dump(mode="json"),
                "status": "no data" if s.attainment is None else ("met" if s.met else "missed"),
                "previous_attainment": p.attainment if p is not None else None,
                "previous_budget_consumed": p.budget_consumed if p is not None else None,
                "days": days,
                "worst_day": worst["day"] if worst else None,
            }
        )
    return out


def _thresholds(rt: Runtime) -> dict[str, dict[str, float]]:
    """Each business type's latency thresholds from its SLOs (the tightest per metric)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for bt in rt.rules.business_types if rt.rules is not None else []:
        for o in bt.objectives:
            if o.sli == "latency" and o.metric in LATENCIES and o.threshold_seconds is not None:
                have = out[bt.name].get(o.metric)
                out[bt.name][o.metric] = o.threshold_seconds if have is None else min(have, o.threshold_seconds)
    return out


def _business_types(this: _Side, before: _Side, thresholds: dict[str, dict[str, float]]) -> dict[str, Any]:
    prev = {b.business_type: b.stats for b in before.serving.business_types}
    names = sorted({b.business_type for b in this.serving.business_types} | set(prev) | _configured(this))
    now = {b.business_type: b.stats for b in this.serving.business_types}
    out: dict[str, Any] = {}
    for name in names:
        cur, old = now.get(name), prev.get(name)
        out[name] = {
            "has_data": bool(cur and cur.requests),
            "previous_has_data": bool(old and old.requests),
            "requests": cur.requests if cur else None,
            "previous_requests": old.requests if old else None,
            "prompt_tokens": cur.prompt_tokens if cur else None,
            "generation_tokens": cur.generation_tokens if cur else None,
            "error_ratio": cur.error_ratio if cur else None,
            "previous_error_ratio": old.error_ratio if old else None,
            "prefix_cache_hit_ratio": cur.prefix_cache_hit_ratio if cur else None,
            "latency": {m: _quantiles(cur.latencies.get(m)) if cur else _quantiles(None) for m in LATENCIES},
            "previous_latency": {m: _quantiles(old.latencies.get(m)) if old else _quantiles(None) for m in LATENCIES},
            "days": [{"day": d["day"], **d["business_types"].get(name, {"requests": 0.0})} for d in this.days],
            "hourly": this.hourly.get(name, []),
            "thresholds": thresholds.get(name, {}),
        }
    return out


def _configured(side: _Side) -> set[str]:
    return {s.business_type for s in side.slos.slos}


def _incidents(rt: Runtime, this: Period, before: Period) -> dict[str, Any]:
    episodes = rt.alerts.episodes(this.start, this.end) if rt.rules is not None else []
    earlier = rt.alerts.episodes(before.start, before.end) if rt.rules is not None else []
    rows: list[dict[str, Any]] = []
    for e in episodes:
        end = e.ends_unix
        rows.append(
            {
                "alertname": e.alertname,
                "business_type": e.business_type,
                "severity": e.severity,
                "summary": e.summary,
                "labels": e.labels,
                "starts_unix": e.starts_unix,
                "ends_unix": end,
                "duration_seconds": (end - e.starts_unix) if end is not None else None,
                "ongoing": end is None,
            }
        )
    durations = [float(e.ends_unix - e.starts_unix) for e in episodes if e.ends_unix is not None]
    by_severity: dict[str, int] = defaultdict(int)
    for e in episodes:
        by_severity[e.severity or "none"] += 1
    return {
        "episodes": rows,
        "count": len(rows),
        "previous_count": len(earlier),
        "by_severity": dict(by_severity),
        "mean_time_to_resolve_seconds": sum(durations) / len(durations) if durations else None,
        "longest_seconds": max(durations) if durations else None,
    }


def _traffic(this: _Side, before: _Side, top: int) -> dict[str, Any]:
    by_model: dict[str, float] = defaultdict(float)
    for g in this.serving.groups:
        by_model[g.model] += g.stats.requests or 0.0
    summary = this.summary
    tenants = sorted(summary.tenants.items(), key=lambda kv: -kv[1])
    return {
        "engine_requests": sum(b.stats.requests or 0.0 for b in this.serving.business_types),
        "previous_engine_requests": sum(b.stats.requests or 0.0 for b in before.serving.business_types),
        "prompt_tokens": sum(b.stats.prompt_tokens or 0.0 for b in this.serving.business_types),
        "generation_tokens": sum(b.stats.generation_tokens or 0.0 for b in this.serving.business_types),
        "by_model": dict(sorted(by_model.items(), key=lambda kv: -kv[1])),
        "gateway_requests": summary.requests,
        "previous_gateway_requests": before.summary.requests,
        "gateway_input_tokens": summary.input_tokens,
        "gateway_output_tokens": summary.output_tokens,
        "tenants": len(tenants),
        "top_tenants": dict(tenants[:top]),
    }


def _cost(this: _Side, before: _Side, top: int) -> dict[str, Any]:
    if this.cost is None:
        return {"available": False, "why": "no deployments: configure `deployments:` with GPU prices"}
    by_type = this.cost["business_type"]
    prev = before.cost["business_type"] if before.cost else None
    totals = _totals(by_type)
    prev_totals = _totals(prev) if prev else None
    tenants = this.cost["tenant"]["groups"][:top]
    return {
        "available": True,
        "allocated_usd": by_type["allocated_usd"],
        "previous_allocated_usd": prev["allocated_usd"] if prev else None,
        **totals,
        "previous": prev_totals,
        "by_business_type": by_type["groups"],
        "by_model": this.cost["model"]["groups"],
        "by_deployment": by_type["deployments"],
        "top_tenants": tenants,
        "daily": this.cost.get("daily", []),
        "unpriced_targets": by_type["unpriced_targets"],
    }


def _totals(resp: dict[str, Any]) -> dict[str, Any]:
    deps = resp["deployments"]
    busy = sum(d["busy_usd"] for d in deps)
    idle = sum(d["idle_usd"] for d in deps)
    lines = [d["totals"] for d in deps]
    requests = sum(x["requests"] for x in lines)
    tokens = sum(x["prompt_tokens"] + x["output_tokens"] for x in lines)
    api = [x["api_usd"] for x in lines if x["api_usd"] is not None]
    allocated = resp["allocated_usd"]
    return {
        "busy_usd": busy,
        "idle_usd": idle,
        "requests": requests,
        "tokens": tokens,
        "usd_per_1k_requests": allocated / requests * 1000 if requests > 0 else None,
        "usd_per_million_tokens": allocated / tokens * 1e6 if tokens > 0 else None,
        "cache_savings_usd": sum(x["cache_savings_usd"] for x in lines),
        "api_usd": sum(api) if api else None,
    }


def _drift(this: _Side, before: _Side, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The week's drift alerts, and each business type's length distributions against the week
    before (PSI on the shared bucket layout: vLLM's token buckets are fixed per release)."""
    shifts = []
    for bt, metrics in sorted(this.lengths.items()):
        for metric, layouts in sorted(metrics.items()):
            bounds, counts = max(layouts.items(), key=lambda kv: kv[1][-1])
            old = before.lengths.get(bt, {}).get(metric, {}).get(bounds)
            cur = decumulate(counts)
            entry: dict[str, Any] = {
                "business_type": bt,
                "signal": metric,
                "bounds": list(bounds),
                "counts": cur,
                "previous_counts": decumulate(old) if old else None,
                "psi": None,
            }
            if old and old[-1] > 0 and counts[-1] > 0:
                entry["psi"] = psi(decumulate(old), cur)
            shifts.append(entry)
    return {"alerts": [e for e in episodes if e["alertname"] == DRIFT_ALERT], "length_shifts": shifts}


def _capacity(rt: Runtime, period: Period, counter: CapacityCounter | None) -> dict[str, Any]:
    """Capacity over the four weeks to the period's end. `counter`: the period's rows are in it
    already (its pass fed them) and only the weeks before it are read here; None: all are."""
    if not rt.inventory:
        return {"available": False, "why": "no deployments: configure `deployments:` to size them"}
    start = period.end - CAPACITY_LOOKBACK
    found = rt.capacity(start, period.end) if counter is None else rt.capacity(start, period.start, counter)
    resp = capacity_out(start, period.end, found).model_dump(mode="json")
    return {"available": True, **resp}


def _data_quality(rt: Runtime, this: _Side) -> dict[str, Any]:
    p = this.period
    names = sorted(set(rt.targets) | set(rt.store.target_names()))
    intervals = {name: rt.settings.target_interval(t) for name, t in rt.targets.items()}
    covered = rt.store.coverage(p.start, p.end, intervals)
    targets: list[dict[str, Any]] = []
    for name in names:
        seconds = covered.get(name, 0.0)
        targets.append(
            {
                "target": name,
                "configured": name in rt.targets,
                "coverage": min(1.0, seconds / p.seconds),
                "missing_seconds": max(0.0, p.seconds - seconds),
            }
        )
    unassigned = next((b.stats for b in this.serving.business_types if b.business_type == UNASSIGNED), None)
    return {
        "targets": targets,
        "targets_with_gaps": sum(1 for t in targets if t["coverage"] < 0.99),
        "unassigned_models": [f"{t}/{m}" for t, m in rt.fleet.unassigned()],
        "unassigned_engine_requests": unassigned.requests if unassigned else 0.0,
        "unassigned_gateway_requests": this.gateway_by_type.get(UNASSIGNED, 0.0),
    }


def _headline(report: dict[str, Any]) -> list[dict[str, Any]]:
    def line(name: str, value: Any, previous: Any, unit: str) -> dict[str, Any]:
        return {"name": name, "value": value, "previous": previous, "unit": unit}

    judged = [s for s in report["slos"] if s["status"] != "no data"]
    traffic, cost, incidents = report["traffic"], report["cost"], report["incidents"]
    lines = [
        line("Requests (engines)", traffic["engine_requests"], traffic["previous_engine_requests"], "count"),
        line("SLOs met", sum(1 for s in judged if s["status"] == "met"), None, f"of {len(judged)}"),
        line("Incidents", incidents["count"], incidents["previous_count"], "count"),
    ]
    if cost["available"]:
        prev = cost["previous"] or {}
        idle = cost["idle_usd"] / cost["allocated_usd"] if cost["allocated_usd"] else None
        lines += [
            line("Cost", cost["allocated_usd"], cost["previous_allocated_usd"], "usd"),
            line("Cost per 1k requests", cost["usd_per_1k_requests"], prev.get("usd_per_1k_requests"), "usd"),
            line("Cost per 1M tokens", cost["usd_per_million_tokens"], prev.get("usd_per_million_tokens"), "usd"),
            line("Idle share of cost", idle, None, "ratio"),
        ]
    return lines
