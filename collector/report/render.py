"""The report as HTML (mail-client safe: inline styles, tables, images, no JavaScript; prints on
A4), as Markdown (the same tables, charts linked), and the number formats both share."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from typing import Any

from collector.report.charts import CHARTS, timestamp

# --- formats --------------------------------------------------------------------------------------


def count(x: float | None) -> str:
    if x is None:
        return "no data"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def usd(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


def pct(x: float | None, digits: int = 1) -> str:
    return "no data" if x is None else f"{x * 100:.{digits}f} %"


def attainment(x: float | None) -> str:
    """SLO attainment with the digits that matter (99.95 %, not 100.0 %)."""
    if x is None:
        return "no data"
    if x >= 0.999:
        return f"{x * 100:.3f} %"
    return f"{x * 100:.2f} %"


def seconds(x: float | None) -> str:
    if x is None:
        return "no data"
    if x < 1:
        return f"{x * 1000:.0f} ms"
    return f"{x:.2f} s"


def duration(x: float | None) -> str:
    if x is None:
        return "ongoing"
    if x < 3600:
        return f"{x / 60:.0f} min"
    return f"{x / 3600:.1f} h"


def change(value: float | None, previous: float | None) -> str:
    """'+12 %' against the previous period; '' when either side is missing or zero."""
    if value is None or previous is None or previous == 0 or not math.isfinite(previous):
        return ""
    delta = (value - previous) / abs(previous)
    return f"{delta * 100:+.0f} %"


def headline_value(line: dict[str, Any]) -> str:
    unit, v = line["unit"], line["value"]
    if unit == "usd":
        return usd(v)
    if unit == "ratio":
        return pct(v)
    if unit.startswith("of "):
        return f"{v} {unit}"
    return count(v)


# --- shared layout --------------------------------------------------------------------------------


def _sections(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, note) of every table, in reading order: the one layout both formats
    render, so the HTML and the Markdown never disagree."""
    out: list[tuple[str, list[str], list[list[str]], str]] = []
    prev_label = report["previous"]["label"]
    out.append(
        (
            "At a glance",
            ["", "this week", prev_label, "change"],
            [
                [
                    h["name"],
                    headline_value(h),
                    headline_value({**h, "value": h["previous"]}) if h["previous"] is not None else "",
                    change(h["value"], h["previous"]),
                ]
                for h in report["headline"]
            ],
            "",
        )
    )
    slo_rows = []
    for s in report["slos"]:
        slo_rows.append(
            [
                s["slo"],
                s["sli"],
                attainment(s["objective"]),
                attainment(s["attainment"]),
                attainment(s["previous_attainment"]),
                pct(s["budget_consumed"], 0) if s["budget_consumed"] is not None else "no data",
                s["status"],
                s["worst_day"] or "",
            ]
        )
    out.append(
        (
            "SLOs (calendar week)",
            ["SLO", "SLI", "objective", "attained", prev_label, "budget used", "status", "worst day"],
            slo_rows,
            "Budget used: bad events over the budget the objective allows for the week's events (100 % = all of it).",
        )
    )
    lat_rows = []
    for bt, d in sorted(report["business_types"].items()):
        if not d["has_data"]:
            lat_rows.append([bt, "no traffic this week", "", "", "", "", "", ""])
            continue
        for metric in ("ttft", "tpot", "e2e"):
            q, p = d["latency"][metric], d["previous_latency"][metric]
            lat_rows.append(
                [
                    bt,
                    metric.upper(),
                    seconds(q["p50"]),
                    seconds(q["p95"]),
                    seconds(q["p99"]),
                    seconds(p["p95"]) if d["previous_has_data"] else "no data",
                    change(q["p95"], p["p95"]),
                    seconds(d["thresholds"].get(metric)) if metric in d["thresholds"] else "",
                ]
            )
    out.append(
        (
            "Latency (engine histograms, whole week)",
            ["business type", "metric", "p50", "p95", "p99", f"p95 {prev_label}", "change", "SLO threshold"],
            lat_rows,
            "Quantiles are interpolated inside vLLM's histogram buckets (the API gives each with its bucket).",
        )
    )
    day_rows = []
    for bt, d in sorted(report["business_types"].items()):
        for day in d["days"]:
            if not day.get("requests"):
                continue
            day_rows.append(
                [
                    bt,
                    day["day"],
                    count(day["requests"]),
                    pct(day.get("error_ratio"), 2),
                    seconds(day["ttft"]["p95"]),
                    seconds(day["tpot"]["p95"]),
                    seconds(day["e2e"]["p95"]),
                ]
            )
    out.append(
        ("By day", ["business type", "day", "requests", "errors", "TTFT p95", "TPOT p95", "e2e p95"], day_rows, "")
    )
    inc = report["incidents"]
    tz = report["period"]["timezone"]
    out.append(
        (
            "Incidents",
            ["alert", "business type", "severity", "started", "lasted", "summary"],
            [
                [
                    e["alertname"],
                    e["business_type"],
                    e["severity"],
                    timestamp(e["starts_unix"], tz),
                    duration(e["duration_seconds"]),
                    e["summary"],
                ]
                for e in inc["episodes"]
            ],
            f"{inc['count']} this week ({inc['previous_count']} the week before); mean time to resolve "
            f"{duration(inc['mean_time_to_resolve_seconds']) if inc['mean_time_to_resolve_seconds'] else 'n/a'}.",
        )
    )
    t = report["traffic"]
    out.append(
        (
            "Traffic",
            ["", "this week", prev_label, "change"],
            [
                [
                    "requests (engines)",
                    count(t["engine_requests"]),
                    count(t["previous_engine_requests"]),
                    change(t["engine_requests"], t["previous_engine_requests"]),
                ],
                [
                    "requests (gateway spans)",
                    count(t["gateway_requests"]),
                    count(t["previous_gateway_requests"]),
                    change(t["gateway_requests"], t["previous_gateway_requests"]),
                ],
                ["prompt tokens", count(t["prompt_tokens"]), "", ""],
                ["generation tokens", count(t["generation_tokens"]), "", ""],
                *[[f"model {m}", count(n), "", ""] for m, n in t["by_model"].items()],
            ],
            f"{t['tenants']} tenants sent gateway spans.",
        )
    )
    cost = report["cost"]
    if cost["available"]:
        out.append(
            (
                "Cost by business type",
                ["business type", *COST_COLUMNS],
                [_cost_row(g) for g in cost["by_business_type"]],
                f"Allocated {usd(cost['allocated_usd'])} (busy {usd(cost['busy_usd'])}, idle {usd(cost['idle_usd'])}); "
                f"{usd(cost['usd_per_million_tokens'])} per 1M tokens; cache saved {usd(cost['cache_savings_usd'])}.",
            )
        )
        out.append(
            (
                "Top tenants by cost",
                ["tenant", *COST_COLUMNS],
                [_cost_row(g) for g in cost["top_tenants"]],
                "Tenants are priced from their gateway spans at each model's measured per-token cost.",
            )
        )
        out.append(
            (
                "Cost by model",
                ["model", *COST_COLUMNS],
                [_cost_row(g) for g in cost["by_model"]],
                "",
            )
        )
    else:
        out.append(("Cost", [], [], cost["why"]))
    drift = report["drift"]
    out.append(
        (
            "Workload drift",
            ["business type", "signal", "PSI against last week", "requests"],
            [
                [
                    s["business_type"],
                    s["signal"].replace("_", " "),
                    "no data" if s["psi"] is None else f"{s['psi']:.3f}",
                    count(sum(s["counts"])),
                ]
                for s in drift["length_shifts"]
            ],
            f"{len(drift['alerts'])} drift alert(s) fired this week. "
            "PSI above 0.25 is a large shift, 0.1 to 0.25 a moderate one.",
        )
    )
    cap = report["capacity"]
    if cap["available"]:
        rows = []
        for d in cap["deployments"]:
            rows.append(
                [
                    d["deployment"],
                    d["gpu"],
                    f"{d['replicas_seen']:.1f}",
                    "no data" if d["peak_concurrency"] is None else f"{d['peak_concurrency']:.0f}",
                    pct(d["kv_usage_peak"], 0),
                    "" if d["replicas_needed"] is None else str(d["replicas_needed"]),
                    _crossing(d, tz, report["period"]["end_unix"]),
                    "; ".join(d["advice"]),
                ]
            )
        out.append(
            (
                "Capacity (four weeks to the end of this week)",
                ["deployment", "GPU", "replicas", "peak running", "KV peak", "replicas needed", "saturates", "advice"],
                rows,
                "Replicas needed: for the peak hour of week at the throughput per replica "
                "measured while the SLOs held.",
            )
        )
    else:
        out.append(("Capacity", [], [], cap["why"]))
    dq = report["data_quality"]
    out.append(
        (
            "Data quality",
            ["target", "coverage", "missing"],
            [
                [t["target"], pct(t["coverage"]), duration(t["missing_seconds"])]
                for t in dq["targets"]
                if t["coverage"] < 0.99
            ],
            f"{dq['targets_with_gaps']} of {len(dq['targets'])} targets have gaps; "
            f"unassigned traffic: {count(dq['unassigned_engine_requests'])} engine requests, "
            f"{count(dq['unassigned_gateway_requests'])} gateway requests"
            + (f"; unassigned models: {', '.join(dq['unassigned_models'])}" if dq["unassigned_models"] else "."),
        )
    )
    return out


COST_COLUMNS = ("cost", "busy", "idle share", "$/1k requests", "$/1M in", "$/1M out", "cache savings", "managed API")


def _cost_row(g: dict[str, Any]) -> list[str]:
    idle = g["idle_usd"] / g["cost_usd"] if g["cost_usd"] else None
    return [
        g["key"],
        usd(g["cost_usd"]),
        usd(g["busy_usd"]),
        pct(idle, 0),
        usd(g["usd_per_1k_requests"]),
        usd(g["usd_per_million_input_tokens"]),
        usd(g["usd_per_million_output_tokens"]),
        usd(g["cache_savings_usd"]),
        usd(g["api_usd"]),
    ]


def _crossing(d: dict[str, Any], tz: str, now: float) -> str:
    """The soonest forecast crossing of a limit, or 'at its limit' when the trend says it is past."""
    soonest = None
    for name, t in d["forecasts"].items():
        if t["crosses_unix"] is not None and (soonest is None or t["crosses_unix"] < soonest[1]):
            soonest = (name, t["crosses_unix"])
    if soonest is None:
        return "not forecast"
    name = soonest[0].replace("_", " ")
    if soonest[1] <= now:
        return f"{name}: at its limit already"
    return f"{name} by {timestamp(soonest[1], tz)[4:14]}"


# --- HTML -----------------------------------------------------------------------------------------

STYLE_TABLE = "border-collapse:collapse;font-size:13px;margin:6px 0 4px 0"
STYLE_CELL = "border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top"
STYLE_HEAD = STYLE_CELL + ";background:#f3f4f6"
CHART_AFTER = {
    "At a glance": ["budget"],
    "Latency (engine histograms, whole week)": ["latency_ttft", "latency_tpot"],
    "Cost by business type": ["cost_by_type", "cost_per_token"],
    "Capacity (four weeks to the end of this week)": ["concurrency"],
    "Capacity": ["concurrency"],
    "Workload drift": ["lengths"],
}


def to_html(report: dict[str, Any], charts: dict[str, bytes], src: Callable[[str], str] | None = None) -> str:
    """The report page. `src(name)` gives an image's address (default: a data: URI, for the
    browser; the mail passes `cid:` references to its inline parts)."""

    def data_uri(name: str) -> str:
        return "data:image/png;base64," + base64.b64encode(charts[name]).decode()

    image = src or data_uri
    e = html.escape
    p = report["period"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(report['title'])}</title>",
        "<style>@media print{img{max-width:100%;page-break-inside:avoid}table{page-break-inside:avoid}}</style>",
        "</head>",
        '<body style="font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;'
        'color:#111;max-width:860px;margin:16px">',
        f'<h1 style="font-size:20px;margin:0 0 4px 0">{e(report["title"])}</h1>',
        f'<p style="color:#555;margin:0 0 12px 0">{e(timestamp(p["start_unix"], p["timezone"]))} to '
        f"{e(timestamp(p['end_unix'], p['timezone']))} ({e(p['timezone'])}), "
        f"compared with {e(report['previous']['label'])}.</p>",
    ]
    for title, header, rows, note in _sections(report):
        parts.append(f'<h2 style="font-size:16px;margin:18px 0 4px 0">{e(title)}</h2>')
        if header and rows:
            parts.append(f'<table style="{STYLE_TABLE}"><tr>')
            parts += [f'<th style="{STYLE_HEAD}">{e(h)}</th>' for h in header]
            parts.append("</tr>")
            for row in rows:
                parts.append("<tr>" + "".join(f'<td style="{STYLE_CELL}">{e(c)}</td>' for c in row) + "</tr>")
            parts.append("</table>")
        elif header:
            parts.append('<p style="color:#555;font-size:13px">None this week.</p>')
        if note:
            parts.append(f'<p style="color:#555;font-size:12px;margin:2px 0">{e(note)}</p>')
        for name in CHART_AFTER.get(title, []):
            if name in charts:
                alt = CHARTS[name][0]
                parts.append(
                    f'<img src="{image(name)}" alt="{e(alt)}" width="800" '
                    f'style="display:block;max-width:100%;height:auto;margin:8px 0">'
                )
    parts.append(
        f'<p style="color:#888;font-size:11px;margin-top:24px">Generated by llmslo in {report["build_seconds"]:.1f} s. '
        "Every figure is what llmslo's API answers for the same period (start/end query parameters).</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


# --- Markdown -------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: dict[str, Any], link: str | None = None) -> str:
    p = report["period"]
    lines = [
        f"# {report['title']}",
        "",
        f"{timestamp(p['start_unix'], p['timezone'])} to {timestamp(p['end_unix'], p['timezone'])} "
        f"({p['timezone']}), compared with {report['previous']['label']}.",
    ]
    if link:
        lines += ["", f"Charts: {link}"]
    for title, header, rows, note in _sections(report):
        lines += ["", f"## {title}", ""]
        if header and rows:
            lines.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
        elif header:
            lines.append("None this week.")
        if note:
            lines += ["", note]
    return "\n".join(lines) + "\n"
