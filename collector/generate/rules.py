"""Prometheus recording and alerting rules from the SLO model (valid for Prometheus, the
Thanos/Mimir rulers and vmalert: plain rule groups, no vendor extensions).

Burn-rate alerts have no `for:` (an incident shorter than the `for` would never page; the short
window already debounces), need `min_events` in the long window, and never fire on no data.
"""

from __future__ import annotations

from typing import Any

from collector.generate import drift
from collector.generate.promql import (
    Sli,
    engine,
    error_ratio_record,
    events_record,
    le_matcher,
    num,
    skipped_slots_share,
    sli_for,
    window,
)
from collector.slo.evaluate import windows_needed
from collector.slo.spec import BusinessType, Objective, SloRules
from collector.sources.vllm_buckets import LATENCY_HISTOGRAMS

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
                        "expr": sli.events(win),
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
                            **({"model": bt.model_regex} if bt.model_patterns else {}),
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


def ttft_alert_bound(threshold_seconds: float) -> float:
    """The vLLM TTFT bucket bound at or above a threshold: what a share-above alert can measure."""
    bounds = LATENCY_HISTOGRAMS["ttft"][1]
    return min((b for b in bounds if b >= threshold_seconds - 1e-9), default=bounds[-1])


# both spellings: transitional versions (0.9-0.11) expose both, doubling hits and queries alike
PREFIX_HITS = "~vllm:(gpu_)?prefix_cache_hits_total"
PREFIX_QUERIES = "~vllm:(gpu_)?prefix_cache_queries_total"


def threshold_alerts(rules: SloRules) -> list[Rule]:
    """The seeds' plain alerts and the incident tickets, per business type (selected like the
    SLIs: `business_type` target label, else the rules' model regexes)."""
    t = rules.thresholds
    out: list[Rule] = []

    def add(
        bt_name: str,
        name: str,
        expr: str,
        for_seconds: float,
        severity: str,
        summary: str,
        description: str,
    ) -> None:
        rule: Rule = {"alert": name, "expr": expr}
        if for_seconds:
            rule["for"] = _w(for_seconds)
        rule["labels"] = {"severity": severity, "business_type": bt_name}
        rule["annotations"] = {
            "summary": summary,
            "description": description,
            "runbook_url": rules.runbook(name.lower()),
            "dashboard_url": rules.dashboard(bt_name),
        }
        out.append(rule)

    for bt in rules.business_types:

        def sel(
            series: str, matchers: str = "", fn: str = "", w: str = "5m", offset: str = "", bt: BusinessType = bt
        ) -> str:
            return engine(bt, series, matchers, fn, w, offset)

        if t.ttft_p95_seconds is not None:
            # Not histogram_quantile > threshold: inside a bucket that only interpolates (a 2 s
            # threshold sits in vLLM's (1, 2.5] bucket). The share of requests above the nearest
            # bound at or over the threshold is measured exactly.
            bound = ttft_alert_bound(t.ttft_p95_seconds)
            family = "vllm:time_to_first_token_seconds"
            le = f'le=~"{le_matcher(bound)}"'
            add(
                bt.name,
                "LLMSLOTTFTP95High",
                f"1 - sum({sel(family + '_bucket', le, 'rate')}) / sum({sel(family + '_count', fn='rate')}) > 0.05",
                300,
                "ticket",
                f"{bt.name}: more than 5 % of requests wait over {num(bound)} s for their first token",
                f"The p95 TTFT threshold is {num(t.ttft_p95_seconds)} s; vLLM's nearest TTFT bucket bound at "
                f"or above it is {num(bound)} s, so this alert measures the share of requests above "
                f"{num(bound)} s over 5m (exact), not an interpolated p95.",
            )
        if t.queue_waiting is not None:
            add(
                bt.name,
                "LLMSLOQueueBackingUp",
                f"sum({sel('vllm:num_requests_waiting')}) > {num(t.queue_waiting)}",
                t.queue_for_seconds,
                "ticket",
                f"{bt.name}: requests are queueing",
                f"more than {num(t.queue_waiting)} requests waiting for {_w(t.queue_for_seconds)}: the "
                "servers are saturated (often by max_num_seqs before the KV cache fills).",
            )
        if t.kv_cache_usage is not None:
            add(
                bt.name,
                "LLMSLOKVCacheNearlyFull",
                f"max({sel('vllm:kv_cache_usage_perc')}) > {num(t.kv_cache_usage)}"
                f" and on () sum({sel('vllm:generation_tokens_total', fn='rate')}) > 0",
                t.kv_cache_for_seconds,
                "ticket",
                f"{bt.name}: KV cache nearly full",
                f"KV-cache usage above {num(t.kv_cache_usage * 100)} % while tokens are being generated (a "
                "gauge stuck high with no traffic is stale and does not fire).",
            )
        if t.error_ratio is not None:
            errors = 'finished_reason=~"abort|error"'
            add(
                bt.name,
                "LLMSLOErrorRateHigh",
                f"sum({sel('vllm:request_success_total', errors, 'rate')})"
                f" / sum({sel('vllm:request_success_total', fn='rate')}) > {num(t.error_ratio)}",
                300,
                "ticket",
                f"{bt.name}: error rate above {num(t.error_ratio * 100)} %",
                f"more than {num(t.error_ratio * 100)} % of finished requests ended in abort or error over 5m.",
            )
        if t.prefix_cache_drop is not None:
            w, ref = _w(t.prefix_cache_window_seconds), _w(t.prefix_cache_reference_seconds)
            hits, queries = sel(PREFIX_HITS, fn="increase", w=w), sel(PREFIX_QUERIES, fn="increase", w=w)
            ref_hits = sel(PREFIX_HITS, fn="increase", w=ref, offset=w)
            ref_queries = sel(PREFIX_QUERIES, fn="increase", w=ref, offset=w)
            now_ratio = f"(sum({hits}) / sum({queries}))"
            ref_ratio = f"(sum({ref_hits}) / sum({ref_queries}))"
            add(
                bt.name,
                "LLMSLOPrefixCacheCollapse",
                f"{now_ratio} < {num(t.prefix_cache_drop)} * {ref_ratio}"
                f" and on () {ref_ratio} > {num(t.prefix_cache_min_ratio)}"
                f" and on () sum({queries}) >= {num(t.prefix_cache_min_queries)}",
                0,
                "ticket",
                f"{bt.name}: prefix-cache hit ratio collapsed",
                f"The prefix-cache hit ratio over {w} is below {num(t.prefix_cache_drop * 100)} % of its own "
                f"level over the {ref} before: prompts stopped sharing prefixes (a changed system prompt, "
                "a new client) or the cache is being evicted (KV pressure). Expect TTFT and prefill cost up.",
            )
        add(
            bt.name,
            "LLMSLONoEngineMetrics",
            f"absent({sel('vllm:num_requests_running')})",
            600,
            "ticket",
            f"{bt.name}: no vLLM series for this business type",
            "No vLLM series carries this business type (business_type target label) or matches its "
            "models: every SLO of it reports no data.",
        )
        up = f'up{{job="{rules.vllm_job}",business_type="{bt.name}"}}'
        add(
            bt.name,
            "LLMSLONoHealthyTarget",
            f"sum({up}) == 0",
            t.target_down_for_seconds,
            "page",
            f"{bt.name}: no vLLM server of this business type answers",
            f"Every {bt.name} server has failed its /metrics scrape for {_w(t.target_down_for_seconds)}: "
            "clients get connection errors that no vLLM counter sees.",
        )
    window = _w(t.restart_window_seconds)
    job = f'job="{rules.vllm_job}"'
    down: Rule = {
        "alert": "LLMSLOTargetDown",
        "expr": f"up{{{job}}} == 0",
        "for": _w(t.target_down_for_seconds),
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "a vLLM server does not answer its /metrics scrape",
            "description": "{{ $labels.instance }} has been down for "
            f"{_w(t.target_down_for_seconds)}. Clients of a dead server get connection errors that "
            "vLLM's own error counters never see (LLMSLONoHealthyTarget pages when a business type has "
            "no server left).",
            "runbook_url": rules.runbook("llmslotargetdown"),
            "dashboard_url": rules.dashboard(PER_TARGET_BUSINESS_TYPE, "{{ $labels.instance }}"),
        },
    }
    restarted: Rule = {
        "alert": "LLMSLOTargetRestarted",
        # process_start_time_seconds changes on a restart; multiprocess vLLM has no process
        # series, so a reset of its prompt-token counter shows it there
        "expr": f"max by (job, instance, business_type) (changes(process_start_time_seconds{{{job}}}[{window}]) > 0"
        f" or resets(vllm:prompt_tokens_total{{{job}}}[{window}]) > 0)",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "a vLLM server restarted",
            "description": "{{ $labels.instance }} restarted within the last "
            f"{window}: requests in flight failed, and its caches start cold. Resolves {window} after "
            "the restart; several in a row mean a crash loop.",
            "runbook_url": rules.runbook("llmslotargetrestarted"),
            "dashboard_url": rules.dashboard(PER_TARGET_BUSINESS_TYPE, "{{ $labels.instance }}"),
        },
    }
    out.extend([down, restarted, skipping_scrapes(rules)])
    return out


# the share of llmslo's scrape slots skipped over SKIPPED_WINDOW above which it tickets
SKIPPED_RATIO = 0.01
SKIPPED_WINDOW = 600.0


def skipping_scrapes(rules: SloRules) -> Rule:
    """The collector's own health, from its /metrics as Prometheus scrapes it: the share of its
    scrape slots it skipped (a target's scrape overran its interval, or the process cannot keep
    up with its targets: README, "Scaling"), as Prometheus' own scrape and rule-group overrun
    counters are watched."""
    w = _w(SKIPPED_WINDOW)
    share = skipped_slots_share("increase", w, f'job="{rules.llmslo_job}"')
    return {
        "alert": "LLMSLOCollectorSkippingScrapes",
        "expr": f"{share} > {num(SKIPPED_RATIO)}",
        "for": w,
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "llmslo is skipping scrape slots",
            "description": "The llmslo collector at {{ $labels.instance }} skipped more than "
            f"{num(SKIPPED_RATIO * 100)} % of its scrape slots over {w}, for {w}: its figures and SLOs "
            "miss those scrapes. Either some targets answer slower than their interval (see "
            "llmslo_scrape_duration_seconds per target) or the process cannot keep up with its "
            "targets (llmslo_job_last_duration_seconds near its interval): shard the targets over "
            "several collectors (README, Scaling).",
            "runbook_url": rules.runbook("llmslocollectorskippingscrapes"),
            "dashboard_url": rules.dashboard("$__all"),
        },
    }


# the alerts on one server carry its business_type target label (when the user set it) and instance
PER_TARGET_BUSINESS_TYPE = '{{ or $labels.business_type "$__all" }}'


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
        # its own file: ~70 recording rules per business type (load it or leave it out)
        "llmslo-drift.rules.yml": {
            "groups": [
                *drift.recording(rules),
                {"name": "llmslo-drift", "interval": "1m", "rules": drift.alerts(rules)},
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
