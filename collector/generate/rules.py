"""Prometheus recording and alerting rules from the SLO model (valid for Prometheus, the
Thanos/Mimir rulers and vmalert: plain rule groups, no vendor extensions).

Burn-rate alerts have no `for:` (an incident shorter than the `for` would never page; the short
window already debounces), need `min_events` in the long window, and never fire on no data.
"""

from __future__ import annotations

from typing import Any

from collector.generate.promql import Sli, error_ratio_record, events_record, num, sli_for, window
from collector.slo.evaluate import windows_needed
from collector.slo.spec import BusinessType, Objective, SloRules

Rule = dict[str, Any]


def recording_groups(rules: SloRules) -> list[dict[str, Any]]:
    groups = []
    for bt in rules.business_types:
        for o in bt.objectives:
            sli = sli_for(bt, o)
            if sli is None:
                continue
            labels = {"slo": o.slo, "business_type": o.business_type}
            out: list[Rule] = []
            for w in windows_needed(rules):
                win = _w(w)
                out.append(
                    {
                        "record": error_ratio_record(w),
                        "expr": sli.error_ratio(win),
                        "labels": labels,
                    }
                )
                out.append(
                    {
                        "record": events_record(w),
                        "expr": f"sum(increase({sli.total_series}[{win}]))",
                        "labels": labels,
                    }
                )
            groups.append(
                {
                    "name": f"llmslo-sli-{o.slo}",
                    "interval": _w(rules.evaluation_interval_seconds),
                    "rules": out,
                }
            )
    return groups


def burn_rate_alerts(rules: SloRules) -> list[Rule]:
    out: list[Rule] = []
    for bt in rules.business_types:
        for o in bt.objectives:
            if sli_for(bt, o) is None:
                continue
            for pair in rules.pairs:
                limit = num(pair.factor * o.error_budget)
                sel = f'{{slo="{o.slo}"}}'
                expr = (
                    f"{error_ratio_record(pair.long_seconds)}{sel} > {limit}"
                    f" and {error_ratio_record(pair.short_seconds)}{sel} > {limit}"
                    f" and {events_record(pair.long_seconds)}{sel} >= {rules.min_events}"
                )
                long_w, short_w = _w(pair.long_seconds), _w(pair.short_seconds)
                note = (
                    " Tickets on long windows stay open after recovery until the long window clears."
                    if pair.severity == "ticket"
                    else ""
                )
                out.append(
                    {
                        "alert": o.alert_name,
                        "expr": expr,
                        "labels": {
                            "severity": pair.severity,
                            "business_type": o.business_type,
                            "model": bt.model_regex,
                            "slo": o.slo,
                            "long_window": long_w,
                            "short_window": short_w,
                        },
                        "annotations": {
                            "summary": f"{o.business_type} {o.name} SLO is burning its error budget "
                            f"{num(pair.factor)}x too fast",
                            "description": (
                                f"{o.description or o.slo} (objective {num(o.objective * 100)} %). "
                                f"The error ratio is above {num(pair.factor)}x the budget of "
                                f"{num(o.error_budget * 100)} % over both {long_w} and {short_w}.{note}"
                            ),
                            "runbook_url": rules.runbook(o.alert_name.lower()),
                            "dashboard_url": rules.dashboard(o.business_type),
                        },
                    }
                )
    return out


def threshold_alerts(rules: SloRules) -> list[Rule]:
    """The seeds' plain alerts, per business type (model_name matcher from the rules)."""
    t = rules.thresholds
    out: list[Rule] = []
    for bt in rules.business_types:
        m = f'model_name=~"{bt.model_regex}"'
        base = {"business_type": bt.name}

        def add(
            name: str,
            expr: str,
            for_seconds: float,
            severity: str,
            summary: str,
            description: str,
            bt: BusinessType = bt,
            base: dict[str, str] = base,
        ) -> None:
            rule: Rule = {"alert": name, "expr": expr}
            if for_seconds:
                rule["for"] = _w(for_seconds)
            rule["labels"] = {"severity": severity, **base}
            rule["annotations"] = {
                "summary": summary,
                "description": description,
                "runbook_url": rules.runbook(name.lower()),
                "dashboard_url": rules.dashboard(bt.name),
            }
            out.append(rule)

        if t.ttft_p95_seconds is not None:
            add(
                "LLMSLOTTFTP95High",
                "histogram_quantile(0.95, sum by (le) "
                f"(rate(vllm:time_to_first_token_seconds_bucket{{{m}}}[5m]))) > {num(t.ttft_p95_seconds)}",
                300,
                "ticket",
                f"{bt.name}: p95 TTFT above {num(t.ttft_p95_seconds)} s",
                "p95 time to first token over 5m, interpolated inside a vLLM bucket: the true p95 may be "
                "anywhere in that bucket (see the runbook).",
            )
        if t.queue_waiting is not None:
            add(
                "LLMSLOQueueBackingUp",
                f"sum(vllm:num_requests_waiting{{{m}}}) > {num(t.queue_waiting)}",
                t.queue_for_seconds,
                "ticket",
                f"{bt.name}: requests are queueing",
                f"more than {num(t.queue_waiting)} requests waiting for {_w(t.queue_for_seconds)}: the "
                "servers are saturated (often by max_num_seqs before the KV cache fills).",
            )
        if t.kv_cache_usage is not None:
            add(
                "LLMSLOKVCacheNearlyFull",
                f"max(vllm:kv_cache_usage_perc{{{m}}}) > {num(t.kv_cache_usage)}"
                f" and on () sum(rate(vllm:generation_tokens_total{{{m}}}[5m])) > 0",
                t.kv_cache_for_seconds,
                "ticket",
                f"{bt.name}: KV cache nearly full",
                f"KV-cache usage above {num(t.kv_cache_usage * 100)} % while tokens are being generated (a "
                "gauge stuck high with no traffic is stale and does not fire).",
            )
        if t.error_ratio is not None:
            add(
                "LLMSLOErrorRateHigh",
                f'sum(rate(vllm:request_success_total{{{m},finished_reason=~"abort|error"}}[5m]))'
                f" / sum(rate(vllm:request_success_total{{{m}}}[5m])) > {num(t.error_ratio)}",
                300,
                "ticket",
                f"{bt.name}: error rate above {num(t.error_ratio * 100)} %",
                f"more than {num(t.error_ratio * 100)} % of finished requests ended in abort or error over 5m.",
            )
        add(
            "LLMSLONoEngineMetrics",
            f"absent(vllm:num_requests_running{{{m}}})",
            600,
            "ticket",
            f"{bt.name}: no vLLM series for this business type",
            "No vLLM series matches the business type's models: every SLO of it reports no data.",
        )
    out.append(
        {
            "alert": "LLMSLOTargetDown",
            "expr": f'up{{job="{rules.vllm_job}"}} == 0',
            "for": _w(rules.thresholds.target_down_for_seconds),
            "labels": {"severity": "page", "business_type": "all"},
            "annotations": {
                "summary": "a vLLM server does not answer its /metrics scrape",
                "description": "{{ $labels.instance }} has been down for "
                f"{_w(rules.thresholds.target_down_for_seconds)}. Clients of a dead server get "
                "connection errors that vLLM's own error counters never see.",
                "runbook_url": rules.runbook("llmslotargetdown"),
                "dashboard_url": rules.dashboard("all"),
            },
        }
    )
    return out


def rule_files(rules: SloRules) -> dict[str, dict[str, Any]]:
    """File name -> rule file content."""
    return {
        "llmslo-recording.rules.yml": {"groups": recording_groups(rules)},
        "llmslo-alerts.rules.yml": {
            "groups": [
                {
                    "name": "llmslo-slo-burn-rate",
                    "interval": _w(rules.evaluation_interval_seconds),
                    "rules": burn_rate_alerts(rules),
                },
                {
                    "name": "llmslo-thresholds",
                    "interval": _w(rules.evaluation_interval_seconds),
                    "rules": threshold_alerts(rules),
                },
            ]
        },
    }


def _w(seconds: float) -> str:
    return window(seconds)


def objectives_with_sli(rules: SloRules) -> list[tuple[BusinessType, Objective, Sli]]:
    out = []
    for bt in rules.business_types:
        for o in bt.objectives:
            sli = sli_for(bt, o)
            if sli is not None:
                out.append((bt, o, sli))
    return out
