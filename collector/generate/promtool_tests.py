"""promtool unit tests for every generated alert: it fires; it does not fire yet; low traffic
does not page; healthy traffic does not page. Expected alerts are computed from the same
burn-rate model the rules encode, at an evaluation time chosen with a clear margin on every
pair's threshold, so a test failing means the rules and the model disagree."""

from __future__ import annotations

import math
import re
from typing import Any

from collector import conventions as conv
from collector.generate import drift
from collector.generate.promql import Sli, error_ratio_record, num, window
from collector.generate.rules import (
    burn_rate_alerts,
    objectives_with_sli,
    recording_groups,
    threshold_alerts,
    ttft_alert_bound,
)
from collector.slo.spec import BusinessType, Objective, SloRules
from collector.slo.windows import BurnPair
from collector.sources.vllm_buckets import LATENCY_HISTOGRAMS

RATE = 1000  # requests per minute in the tests
UNLISTED_MODEL = "acme/house-model"  # a model no rule lists: placed by the business_type label only
MARGIN = 0.15  # every pair's error ratio stays this far (relative) from its threshold


def example_model(bt: BusinessType) -> str | None:
    """A model name the business type's patterns match (for input series)."""
    for pattern in bt.model_patterns:
        for candidate in (pattern, re.sub(r"\.\*|\.\+", "x", pattern).replace("\\", "")):
            if re.fullmatch(pattern, candidate):
                return candidate
    return None


def _series(
    bt: BusinessType,
    o: Objective,
    sli: Sli,
    labels: str,
    healthy_minutes: int,
    bad_minutes: int,
    rate: float,
    bad_fraction: float,
) -> list[dict[str, str]]:
    """Input series (vLLM's carry `labels`): `healthy_minutes` at `bad_fraction`, then
    `bad_minutes` where every event is bad."""
    good = rate * (1 - bad_fraction)
    bad = rate - good
    good_values = f"0+{num(good)}x{healthy_minutes}" + (
        f" {num(good * healthy_minutes)}+0x{bad_minutes - 1}" if bad_minutes else ""
    )
    if sli.kind == "errors":
        bad_values = f"0+{num(bad)}x{healthy_minutes}" + (
            f" {num(bad * healthy_minutes + rate)}+{num(rate)}x{bad_minutes - 1}" if bad_minutes else ""
        )
        base = f'vllm:request_success_total{{{labels},finished_reason="%s"}}'
        return [
            {"series": base % "stop", "values": good_values},
            {"series": base % "error", "values": bad_values},
        ]
    total_values = f"0+{num(rate)}x{healthy_minutes + bad_minutes}"
    if sli.kind == "histogram":
        assert o.metric is not None and o.threshold_seconds is not None
        family = LATENCY_HISTOGRAMS[o.metric][0]
        le = repr(float(o.threshold_seconds))
        return [
            {"series": f"{family}_count{{{labels}}}", "values": total_values},
            {"series": f'{family}_bucket{{{labels},le="{le}"}}', "values": good_values},
        ]
    slo = f'slo="{o.slo}",business_type="{bt.name}"'
    return [
        {"series": f"{conv.SLO_EVENTS}{{{slo}}}", "values": total_values},
        {"series": f"{conv.SLO_GOOD_EVENTS}{{{slo}}}", "values": good_values},
    ]


def _ratio(minutes_bad: float, window_minutes: float, history_minutes: float, baseline: float) -> float:
    """Error ratio over a window `minutes_bad` into an outage. A window longer than the data
    holds the ratio of the data it has: rate() extrapolates bad and total events alike."""
    span = min(window_minutes, history_minutes + minutes_bad)
    bad = min(minutes_bad, span)
    return (bad + (span - bad) * baseline) / span


def _firing_pairs(
    pairs: tuple[BurnPair, ...], o: Objective, m: int, history: int, baseline: float
) -> list[BurnPair] | None:
    """Pairs firing `m` minutes into a total outage after `history` healthy minutes, or None when
    a pair is within the margin of its threshold at `m` (then another `m` is chosen)."""
    out = []
    for p in pairs:
        limit = p.factor * o.error_budget
        long_r = _ratio(m, p.long_seconds / 60, history, baseline)
        short_r = _ratio(m, p.short_seconds / 60, history, baseline)
        for r in (long_r, short_r):
            if abs(r - limit) < MARGIN * limit:
                return None
        if long_r > limit and short_r > limit:
            out.append(p)
    return out


def _alert(rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "exp_labels": {**rule["labels"], "alertname": rule["alert"]},
        "exp_annotations": rule["annotations"],
    }


def _firing_alerts(rules: list[dict[str, Any]], pairs: list[BurnPair]) -> list[dict[str, Any]]:
    """The expected alerts of `rules` (one objective's) when `pairs` fire."""
    return [
        _alert(a)
        for a in rules
        if any(
            a["labels"]["long_window"] == window(p.long_seconds)
            and a["labels"]["short_window"] == window(p.short_seconds)
            and a["labels"]["severity"] == p.severity
            for p in pairs
        )
    ]


def _quiet_history(
    pairs: tuple[BurnPair, ...], o: Objective, minutes_bad: int, least: int, step: int, baseline: float
) -> int | None:
    """The least healthy history (a multiple of `step`, at least `least` minutes, at most a week)
    after which `minutes_bad` minutes of outage fire no pair and none is within the margin of
    its threshold: long windows see only the history they have, so a short one can burn."""
    history = math.ceil(least / step) * step
    while history <= 7 * 1440:
        if _firing_pairs(pairs, o, minutes_bad, history, baseline) == []:
            return history
        history += step
    return None


def burn_rate_tests(
    rules: SloRules, step_minutes: int, quiet_step_minutes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Four tests per burn-rate alert: it fires (checked at every step of the outage) and it
    does not fire yet a few minutes into one, at eval times that are multiples of `step_minutes`;
    low traffic and healthy traffic never page, on multiples of `quiet_step_minutes`. Burn-rate
    alerts have no `for:`, so an outcome does not depend on the steps before it, and promtool's
    work grows with the number of steps: the two lists go to two files."""
    alerts = burn_rate_alerts(rules)
    tests: list[dict[str, Any]] = []
    quiet_tests: list[dict[str, Any]] = []
    for bt, o, sli in objectives_with_sli(rules):
        model = example_model(bt)
        if model is None:
            continue
        by_model = f'model_name="{model}"'
        # the firing case is placed by the business_type target label alone (a model no rule lists)
        by_label = f'business_type="{bt.name}",model_name="{UNLISTED_MODEL}"'
        mine = [a for a in alerts if a["labels"]["slo"] == o.slo]
        baseline = o.error_budget / 10
        page = min((p for p in rules.pairs if p.severity == "page"), key=lambda p: p.long_seconds)
        if page.factor * o.error_budget >= 1:
            continue  # a 100 % error rate cannot burn this budget that fast: nothing to test
        # a full page long window and then some; longer windows see the history they have
        longest_page = int(max(p.long_seconds for p in rules.pairs if p.severity == "page") / 60)
        history = math.ceil((longest_page + 60) / step_minutes) * step_minutes
        m, firing = step_minutes, None
        while m < 24 * 60:
            firing = _firing_pairs(rules.pairs, o, m, history, baseline)
            if firing is not None and page in firing:
                break
            m += step_minutes
        if firing is None:
            continue

        # and at every step of the outage before it, which pairs fire then (a step within the
        # margin of a threshold is not checked): promtool evaluates those steps anyway
        checks = [
            {"eval_time": f"{history + t}m", "alertname": o.alert_name, "exp_alerts": _firing_alerts(mine, pairs)}
            for t in range(0, m + 1, step_minutes)
            if (pairs := _firing_pairs(rules.pairs, o, t, history, baseline)) is not None
        ]
        tests.append(
            {
                "name": f"{o.slo}: fires {m}m into an outage after {history // 60}h of healthy traffic",
                "interval": "1m",
                "input_series": _series(bt, o, sli, by_label, history, m + 5, RATE, baseline),
                "promql_expr_test": [
                    {
                        "expr": f'round({error_ratio_record(page.short_seconds)}{{slo="{o.slo}"}}, 0.001)',
                        "eval_time": f"{history + m}m",
                        "exp_samples": [{"labels": f'{{business_type="{o.business_type}",slo="{o.slo}"}}', "value": 1}],
                    }
                ],
                "alert_rule_test": checks,
            }
        )
        # does not fire yet: the short window is hot, the long one is not (yet)
        limit = page.factor * o.error_budget
        hot = math.ceil(limit * page.short_seconds / 60 * (1 + MARGIN))
        cool = math.floor(limit * page.long_seconds / 60 * (1 - MARGIN))
        quick = max(step_minutes, math.ceil(hot / step_minutes) * step_minutes)
        if quick > cool:
            quick = step_minutes
        least = int(page.long_seconds / 60) + 10
        short_history = _quiet_history(rules.pairs, o, quick, least, step_minutes, baseline) or least
        tests.append(
            {
                "name": f"{o.slo}: does not fire yet {quick}m into an outage",
                "interval": "1m",
                "input_series": _series(bt, o, sli, by_model, short_history, quick + 1, RATE, baseline),
                "alert_rule_test": [
                    {"eval_time": f"{short_history + quick}m", "alertname": o.alert_name, "exp_alerts": []}
                ],
            }
        )
        # the same healthy history on the coarser step (two hours of outage end on a step too)
        quiet = math.ceil(short_history / quiet_step_minutes) * quiet_step_minutes
        bad = math.ceil(120 / quiet_step_minutes) * quiet_step_minutes
        quiet_tests.append(
            {
                "name": f"{o.slo}: low traffic (below min_events) never pages, even all bad",
                "interval": "1m",
                "input_series": _series(
                    bt, o, sli, by_model, quiet, bad, rules.min_events / 3 / (quiet + bad), baseline
                ),
                "alert_rule_test": [{"eval_time": f"{quiet + bad}m", "alertname": o.alert_name, "exp_alerts": []}],
            }
        )
        quiet_tests.append(
            {
                "name": f"{o.slo}: healthy traffic never pages",
                "interval": "1m",
                "input_series": _series(bt, o, sli, by_model, quiet, 0, RATE, baseline),
                "alert_rule_test": [{"eval_time": f"{quiet}m", "alertname": o.alert_name, "exp_alerts": []}],
            }
        )
    return tests, quiet_tests


def threshold_tests(rules: SloRules) -> list[dict[str, Any]]:
    """Fires and does-not-fire for the threshold alerts and incident tickets of one business type,
    with series placed by the `business_type` target label and by the model-regex fallback."""
    alerts = {(a["alert"], a["labels"].get("business_type", "")): a for a in threshold_alerts(rules)}
    bt = next((b for b in rules.business_types if example_model(b)), None)
    tests: list[dict[str, Any]] = []
    if bt is None:
        return tests
    model = example_model(bt)
    other = next((b for b in rules.business_types if b.name != bt.name), None)
    t = rules.thresholds
    job = rules.vllm_job
    instance = "127.0.0.1:8000"

    def case(
        name: str,
        series: list[dict[str, str]],
        alert: str,
        fires: bool,
        at: str,
        key: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        rule = alerts[(alert, bt.name if key is None else key)]
        got = {**rule["labels"], **(labels or {})}
        bt_or_all = got.get("business_type") or "$__all"  # `or` in the template: the label, else All

        def expand(v: str) -> str:
            v = v.replace("{{ $labels.instance }}", instance)
            return v.replace('{{ or $labels.business_type "$__all" }}', bt_or_all)

        annotations = {k: expand(v) for k, v in rule["annotations"].items()}
        exp = (
            [{"exp_labels": {**rule["labels"], **(labels or {}), "alertname": alert}, "exp_annotations": annotations}]
            if fires
            else []
        )
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}],
            }
        )

    m = f'model_name="{model}"'
    labelled = f'business_type="{bt.name}",model_name="{UNLISTED_MODEL}"'
    if t.queue_waiting is not None:
        waiting = int(t.queue_waiting)
        at = f"{int(t.queue_for_seconds / 60) + 5}m"
        for value, fires in ((waiting * 2, True), (max(0, waiting - 1), False)):
            case(
                f"queue of {value} waiting {'fires' if fires else 'does not fire'} (model regex)",
                [{"series": f"vllm:num_requests_waiting{{{m}}}", "values": f"{value}x30"}],
                "LLMSLOQueueBackingUp",
                fires,
                at,
            )
        case(
            "a queue on a model no rule lists, labelled with the business type, fires",
            [{"series": f"vllm:num_requests_waiting{{{labelled}}}", "values": f"{waiting * 2}x30"}],
            "LLMSLOQueueBackingUp",
            True,
            at,
        )
        if other is not None:
            case(
                f"a series labelled {other.name} alerts for {other.name} only, whatever its model name",
                [
                    {
                        "series": f'vllm:num_requests_waiting{{business_type="{other.name}",{m}}}',
                        "values": f"{waiting * 2}x30",
                    }
                ],
                "LLMSLOQueueBackingUp",
                True,
                at,
                key=other.name,
            )
    if t.kv_cache_usage is not None:
        high = num(min(1.0, t.kv_cache_usage + 0.02))
        for tokens, fires in (("0+100x30", True), ("500x30", False)):
            what = "traffic fires" if fires else "no traffic is stale, does not fire"
            case(
                f"KV cache at {high} with {what}",
                [
                    {"series": f"vllm:kv_cache_usage_perc{{{m}}}", "values": f"{high}x30"},
                    {"series": f"vllm:generation_tokens_total{{{m}}}", "values": tokens},
                ],
                "LLMSLOKVCacheNearlyFull",
                fires,
                f"{int(t.kv_cache_for_seconds / 60) + 10}m",
            )
    if t.error_ratio is not None:
        bad_per_min = num(100 * t.error_ratio * 3)
        for bad, fires in ((bad_per_min, True), ("0", False)):
            case(
                f"error ratio {'above' if fires else 'at zero'}",
                [
                    {
                        "series": f'vllm:request_success_total{{{labelled},finished_reason="stop"}}',
                        "values": "0+100x30",
                    },
                    {
                        "series": f'vllm:request_success_total{{{labelled},finished_reason="error"}}',
                        "values": f"0+{bad}x30",
                    },
                ],
                "LLMSLOErrorRateHigh",
                fires,
                "20m",
            )
    if t.ttft_p95_seconds is not None:
        family = "vllm:time_to_first_token_seconds"
        bound = ttft_alert_bound(t.ttft_p95_seconds)
        for slow_per_min, fires in ((10, True), (2, False)):
            case(
                f"{slow_per_min} % of requests over the {num(bound)} s bound {'fires' if fires else 'does not fire'}",
                [
                    {"series": f'{family}_bucket{{{m},le="{bound!r}"}}', "values": f"0+{100 - slow_per_min}x30"},
                    {"series": f'{family}_bucket{{{m},le="+Inf"}}', "values": "0+100x30"},
                    {"series": f"{family}_count{{{m}}}", "values": "0+100x30"},
                ],
                "LLMSLOTTFTP95High",
                fires,
                "20m",
            )
    if t.prefix_cache_drop is not None:
        ref = int(t.prefix_cache_reference_seconds / 60)
        w = int(t.prefix_cache_window_seconds / 60)
        hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
        at = f"{ref + w + w}m"  # one window into the collapse, after a full reference window

        def cache(rate: int, ratio_after: float) -> list[dict[str, str]]:
            half = rate // 2
            after = int(rate * ratio_after)
            return [
                {"series": f"{queries}{{{m}}}", "values": f"0+{rate}x{ref + 3 * w}"},
                {"series": f"{hits}{{{m}}}", "values": f"0+{half}x{ref + w} {half * (ref + w)}+{after}x{2 * w}"},
            ]

        case("prefix-cache hit ratio from 0.5 to 0 fires", cache(10_000, 0.0), "LLMSLOPrefixCacheCollapse", True, at)
        case(
            "a steady prefix-cache hit ratio does not fire", cache(10_000, 0.5), "LLMSLOPrefixCacheCollapse", False, at
        )
        case(
            "a prefix-cache collapse in low traffic does not fire",
            cache(int(t.prefix_cache_min_queries / w / 2), 0.0),
            "LLMSLOPrefixCacheCollapse",
            False,
            at,
        )
        case(
            "an idle server (no cache queries) does not fire",
            [{"series": f"{queries}{{{m}}}", "values": "500x90"}, {"series": f"{hits}{{{m}}}", "values": "200x90"}],
            "LLMSLOPrefixCacheCollapse",
            False,
            at,
        )

    def absent(name: str, series: list[dict[str, str]], missing: list[str]) -> None:
        exp = [
            {
                "exp_labels": {**alerts[("LLMSLONoEngineMetrics", b)]["labels"], "alertname": "LLMSLONoEngineMetrics"},
                "exp_annotations": alerts[("LLMSLONoEngineMetrics", b)]["annotations"],
            }
            for b in missing
        ]
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "15m", "alertname": "LLMSLONoEngineMetrics", "exp_alerts": exp}],
            }
        )

    names = [b.name for b in rules.business_types]
    absent(
        "no vLLM series at all: every business type's absent alert fires",
        [{"series": 'up{job="other"}', "values": "1x30"}],
        names,
    )
    absent(
        f"vLLM series of {bt.name} present: only the others fire",
        [{"series": f"vllm:num_requests_running{{{m}}}", "values": "1x30"}],
        [n for n in names if n != bt.name],
    )
    absent(
        f"vLLM series labelled {bt.name}, of a model no rule lists: only the others fire",
        [{"series": f"vllm:num_requests_running{{{labelled}}}", "values": "1x30"}],
        [n for n in names if n != bt.name],
    )
    down_for = max(1, int(t.target_down_for_seconds / 60))
    target = {"job": job, "instance": instance}
    up = f'up{{job="{job}",instance="{instance}",business_type="{bt.name}"}}'
    up2 = f'up{{job="{job}",instance="127.0.0.1:8001",business_type="{bt.name}"}}'
    case(
        "a scrape target down fires a ticket",
        [{"series": up, "values": f"1x5 0x{down_for + 10}"}],
        "LLMSLOTargetDown",
        True,
        f"{5 + down_for + 3}m",
        key="",
        labels={**target, "business_type": bt.name},
    )
    case(
        "a scrape target up does not fire", [{"series": up, "values": "1x30"}], "LLMSLOTargetDown", False, "20m", key=""
    )
    case(
        f"every {bt.name} target down pages",
        [{"series": up, "values": f"1x5 0x{down_for + 10}"}, {"series": up2, "values": f"1x5 0x{down_for + 10}"}],
        "LLMSLONoHealthyTarget",
        True,
        f"{5 + down_for + 3}m",
    )
    case(
        f"one of two {bt.name} targets down does not page",
        [{"series": up, "values": f"1x5 0x{down_for + 10}"}, {"series": up2, "values": "1x30"}],
        "LLMSLONoHealthyTarget",
        False,
        f"{5 + down_for + 3}m",
    )
    restart = int(t.restart_window_seconds / 60)
    start = f'process_start_time_seconds{{job="{job}",instance="{instance}",business_type="{bt.name}"}}'
    restarted_labels = {**target, "business_type": bt.name}
    case(
        "a new process start time fires a restart ticket",
        [{"series": start, "values": f"1000x10 1700x{restart + 20}"}],
        "LLMSLOTargetRestarted",
        True,
        "12m",
        key="",
        labels=restarted_labels,
    )
    case(
        f"the restart ticket resolves {restart}m after the restart",
        [{"series": start, "values": f"1000x10 1700x{restart + 20}"}],
        "LLMSLOTargetRestarted",
        False,
        f"{10 + restart + 2}m",
        key="",
    )
    case(
        "a steady process start time does not fire",
        [{"series": start, "values": "1000x40"}],
        "LLMSLOTargetRestarted",
        False,
        "30m",
        key="",
    )
    prompt = f'vllm:prompt_tokens_total{{job="{job}",instance="{instance}",business_type="{bt.name}",{m}}}'
    case(
        "a counter reset (multiprocess vLLM: no process series) fires a restart ticket",
        [{"series": prompt, "values": f"0+100x10 50+100x{restart + 20}"}],
        "LLMSLOTargetRestarted",
        True,
        "12m",
        key="",
        labels=restarted_labels,
    )
    # llmslo's own /metrics: two targets scraped 4 times a minute each; from minute 10 on, slots
    # skipped at 1 in 9 (fires), or at 1 in 201 (under the 1 %: a slow target now and then)
    own = f'job="{rules.llmslo_job}",instance="{instance}"'
    scraped = [{"series": f'llmslo_scrapes_total{{{own},target="t{i}"}}', "values": "0+4x60"} for i in range(2)]
    for per_minute, fires in (("1", True), ("0.04", False)):
        case(
            f"llmslo skipping {per_minute} of ~8 scrape slots a minute {'fires' if fires else 'does not fire'}",
            [*scraped, {"series": f"llmslo_scrape_slots_skipped_total{{{own}}}", "values": f"0x10 0+{per_minute}x50"}],
            "LLMSLOCollectorSkippingScrapes",
            fires,
            "35m",
            key="",
            labels={"instance": instance},
        )
    case(
        "llmslo skipping no slot does not fire",
        [*scraped, {"series": f"llmslo_scrape_slots_skipped_total{{{own}}}", "values": "0x60"}],
        "LLMSLOCollectorSkippingScrapes",
        False,
        "35m",
        key="",
    )
    return tests


def drift_tests(rules: SloRules) -> list[dict[str, Any]]:
    """A prompt-length shift fires; an unchanged workload and a shift in low traffic do not."""
    bt = next((b for b in rules.business_types if example_model(b)), None)
    if bt is None:
        return []
    m = f'model_name="{example_model(bt)}"'
    family = drift.SIGNALS["prompt_length"]
    # healthy history: the 1h reference (offset by the 5m window) and then some; promtool
    # evaluates every rule at every step from minute 0, so a day of it cost a minute per run
    day = 120
    before = {100.0: 0.2, 200.0: 0.8}  # cumulative shares per bound; 1 from 500 on
    after = {100.0: 0.0, 200.0: 0.1, 500.0: 0.3}  # 1 from 1000 on

    def series(per_minute: float, shifted: bool) -> list[dict[str, str]]:
        out = []
        for bound in [*drift.BOUNDS, None]:
            key = bound if bound is not None else float("inf")
            a = per_minute * (before.get(key, 0.0) if key < 500 else 1.0)
            b = per_minute * (after.get(key, 0.0) if key < 1000 else 1.0) if shifted else a
            le = "+Inf" if bound is None else repr(bound)
            values = f"0+{num(a)}x{day} {num(a * day + b)}+{num(b)}x30"
            out.append({"series": f'{family}_bucket{{{m},le="{le}"}}', "values": values})
        out.append({"series": f"{family}_count{{{m}}}", "values": f"0+{num(per_minute)}x{day + 31}"})
        return out

    rule = next(a for a in drift.alerts(rules) if a["labels"] == {**a["labels"], "business_type": bt.name,
                                                                    "signal": "prompt_length"})  # fmt: skip
    tests = []
    for name, per_minute, shifted, fires in (
        ("a prompt-length shift fires the drift ticket", 30.0, True, True),
        ("an unchanged workload does not fire", 30.0, False, False),
        ("a shift in low traffic (under 100 requests in the window) does not fire", 3.0, True, False),
    ):
        exp: list[dict[str, Any]] = []
        if fires:
            labels = {**rule["labels"], "alertname": "LLMSLOWorkloadDrift"}
            exp = [{"exp_labels": labels, "exp_annotations": rule["annotations"]}]
        tests.append(
            {
                "name": name,
                "interval": "1m",
                "input_series": series(per_minute, shifted),
                "alert_rule_test": [
                    {"eval_time": f"{day + 10}m", "alertname": "LLMSLOWorkloadDrift", "exp_alerts": exp}
                ],
            }
        )
    return tests


def test_files(rules: SloRules, rule_files: list[str]) -> dict[str, dict[str, Any]]:
    # promtool evaluates every rule at every step from minute 0: 5-minute steps where a test
    # checks a short window, 15-minute ones for the long quiet runs that must never page
    step, quiet_step = 5, 15
    burn, quiet = burn_rate_tests(rules, step, quiet_step)
    files = [f"../{f}" for f in rule_files if f != "llmslo-drift.rules.yml"]
    # recorded SLIs first, then the alerts that read them, at every evaluation step
    order = [g["name"] for g in recording_groups(rules)] + ["llmslo-slo-burn-rate", "llmslo-thresholds"]
    return {
        "tests/llmslo-burn-rate.test.yml": {
            "rule_files": files,
            "evaluation_interval": f"{step}m",
            "group_eval_order": order,
            "tests": burn,
        },
        "tests/llmslo-burn-rate-quiet.test.yml": {
            "rule_files": files,
            "evaluation_interval": f"{quiet_step}m",
            "group_eval_order": order,
            "tests": quiet,
        },
        "tests/llmslo-thresholds.test.yml": {
            "rule_files": files,
            "evaluation_interval": "1m",
            "group_eval_order": order,
            "tests": threshold_tests(rules),
        },
        "tests/llmslo-drift.test.yml": {
            "rule_files": ["../llmslo-drift.rules.yml"],
            # every 5 minutes: the ~280 drift rules at every minute of the hour-long reference
            # would take promtool minutes (the 5-minute window still sees the shift whole)
            "evaluation_interval": "5m",
            "group_eval_order": [g["name"] for g in drift.recording(rules)] + ["llmslo-drift"],
            "tests": drift_tests(rules),
        },
    }
