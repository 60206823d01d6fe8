"""Grafana dashboards from the same model: the serving dashboard every alert's `dashboard_url`
points at (uid `llmslo-serving`), with the Prometheus datasource and business type as variables."""

from __future__ import annotations

import json
from typing import Any

from collector import conventions as conv
from collector.generate.promql import GENERATED_HEADER
from collector.slo.spec import SloRules

UID = "llmslo-serving"
DS = {"type": "prometheus", "uid": "${datasource}"}
BT = 'business_type=~"$business_type"'


def _panel(
    pid: int,
    title: str,
    exprs: list[tuple[str, str]],
    unit: str,
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    kind: str = "timeseries",
    description: str = "",
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(65 + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }


def serving_dashboard(rules: SloRules) -> dict[str, Any]:
    b = conv.SCOPE_BUSINESS
    win = 'window="5m"'
    q95 = f'{{{BT},{win},quantile="0.95"}}'
    panels = [
        _panel(
            1,
            "SLO burn rate (1 = spending exactly the budget)",
            [
                (f'{conv.SLO_BURN_RATE}{{{BT},window="1h"}}', "{{slo}} 1h"),
                (f'{conv.SLO_BURN_RATE}{{{BT},window="5m"}}', "{{slo}} 5m"),
            ],
            "none",
            0,
            0,
            description="Pages at 14.4x over 1h and 5m, or 6x over 6h and 30m.",
        ),
        _panel(
            2,
            "Error budget left this period",
            [(f"{conv.SLO_BUDGET_REMAINING}{{{BT}}}", "{{slo}}")],
            "percentunit",
            12,
            0,
            kind="stat",
        ),
        _panel(
            3,
            "TTFT p95 (engine histogram, interpolated in its bucket)",
            [
                (f"{b}{conv.LATENCY_SUFFIX['ttft']}{q95}", "{{business_type}} p95 (interpolated)"),
                (
                    f"{b}{conv.bound_name(conv.LATENCY_SUFFIX['ttft'], conv.BOUND_LOWER)}{q95}",
                    "{{business_type}} bucket from",
                ),
                (
                    f"{b}{conv.bound_name(conv.LATENCY_SUFFIX['ttft'], conv.BOUND_UPPER)}{q95}",
                    "{{business_type}} bucket to",
                ),
            ],
            "s",
            0,
            8,
        ),
        _panel(
            4,
            "TPOT p95 (engine histogram, interpolated in its bucket)",
            [
                (f"{b}{conv.LATENCY_SUFFIX['tpot']}{q95}", "{{business_type}} p95 (estimated={{estimated}})"),
                (
                    f"{b}{conv.bound_name(conv.LATENCY_SUFFIX['tpot'], conv.BOUND_LOWER)}{q95}",
                    "{{business_type}} bucket from",
                ),
                (
                    f"{b}{conv.bound_name(conv.LATENCY_SUFFIX['tpot'], conv.BOUND_UPPER)}{q95}",
                    "{{business_type}} bucket to",
                ),
            ],
            "s",
            12,
            8,
        ),
        _panel(
            5,
            "Requests per second",
            [(f"{b}{conv.REQUESTS_PER_SECOND}{{{BT},{win}}}", "{{business_type}}")],
            "reqps",
            0,
            16,
        ),
        _panel(
            6,
            "Error ratio (abort or error)",
            [(f"{b}{conv.ERROR_RATIO}{{{BT},{win}}}", "{{business_type}}")],
            "percentunit",
            12,
            16,
        ),
        _panel(
            7,
            "Queue depth (waiting requests)",
            [
                (f"{b}{conv.REQUESTS_WAITING}{{{BT},{win}}}", "{{business_type}} waiting"),
                (f"{b}{conv.REQUESTS_RUNNING}{{{BT},{win}}}", "{{business_type}} running"),
            ],
            "short",
            0,
            24,
            description="Saturation shows here before the KV cache fills.",
        ),
        _panel(
            8,
            "Prefix-cache hit ratio and KV-cache usage",
            [
                (f"{b}{conv.PREFIX_CACHE_HIT_RATIO}{{{BT},{win}}}", "{{business_type}} hits"),
                (f"{b}{conv.KV_CACHE_USAGE_RATIO}{{{BT},{win}}}", "{{business_type}} KV"),
            ],
            "percentunit",
            12,
            24,
        ),
        _panel(
            9,
            "Prompt and output length p95 (drift)",
            [
                (f"{b}{conv.LENGTH_SUFFIX['prompt_length']}{q95}", "{{business_type}} prompt"),
                (f"{b}{conv.LENGTH_SUFFIX['generation_length']}{q95}", "{{business_type}} output"),
            ],
            "short",
            0,
            32,
        ),
        _panel(10, "Scrape targets up", [(f"{conv.TARGET_UP}", "{{target}}")], "short", 12, 32),
        _panel(
            11,
            "Goodput from traces (every latency objective met at once)",
            [(f'{conv.REQUESTS_GOODPUT}{{{BT},window="5m"}}', "{{business_type}} {{tenant}}")],
            "percentunit",
            0,
            40,
        ),
        _panel(
            12,
            "Active burn-rate alerts",
            [(f"{conv.SLO_ALERT_FIRING}{{{BT}}} == 1", "{{slo}} {{severity}} {{long_window}}/{{short_window}}")],
            "short",
            12,
            40,
        ),
        _panel(
            13,
            "Requests per tenant (traces)",
            [(f'{conv.REQUESTS_SEEN}{{{BT},window="5m"}} / 300', "{{business_type}} {{tenant}}")],
            "reqps",
            0,
            48,
            description='The top traces.top_tenants by volume; the rest as tenant="other".',
        ),
        _panel(
            14,
            "TTFT p95 per tenant (traces, as measured where the span was made)",
            [(f'{conv.REQUESTS_TTFT}{{{BT},window="5m",quantile="0.95"}}', "{{business_type}} {{tenant}}")],
            "s",
            12,
            48,
            description="Which tenants a latency problem hurts; compare with the engine's TTFT above.",
        ),
    ]
    business = [bt.name for bt in rules.business_types]
    return {
        "uid": UID,
        "title": "llmslo / serving",
        "description": GENERATED_HEADER.strip("# \n"),
        "tags": ["llmslo", "vllm", "slo"],
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "business_type",
                    "type": "custom",
                    "label": "Business type",
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "query": ",".join(business),
                    "current": {"text": "All", "value": "$__all"},
                    "options": [{"text": n, "value": n, "selected": False} for n in business],
                },
            ]
        },
        "panels": panels,
    }


def dashboard_files(rules: SloRules) -> dict[str, str]:
    """Relative path under dashboards/ -> JSON text."""
    return {"llmslo-serving.json": json.dumps(serving_dashboard(rules), indent=2, sort_keys=False) + "\n"}
