"""Incident alerts of llmslo's own evaluator, beside the burn-rate ones: a target down (ticket),
a business type with no healthy target (page), a server restart (ticket) and a prefix-cache
collapse (ticket). The same conditions as the generated Prometheus rules (collector/generate/
rules.py), evaluated on the scrapers' state and the rollups the SLO evaluation already read.

Pure functions of their inputs and an explicit `now`; each returns the alert instances that
should be active, as (fingerprint, labels, annotations), for `AlertBook.apply`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from collector.drift.engine import Finding
from collector.rollup import MINUTE_SECONDS, Row, period_start
from collector.slo.spec import SloRules
from collector.sources.vllm import Kind

CACHE_COLLAPSE = "LLMSLOPrefixCacheCollapse"

Wanted = dict[str, tuple[dict[str, str], dict[str, str]]]


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """What the incident alerts need to know about one scrape target."""

    name: str
    business_types: frozenset[str]
    up: bool | None  # None before its first scrape
    down_since_unix: float | None
    last_restart_unix: float | None


def _instance(rules: SloRules, alertname: str, labels: dict[str, str], annotations: dict[str, str]) -> Wanted:
    labels = {"alertname": alertname, "source": "llmslo", **labels}
    annotations = {
        **annotations,
        "runbook_url": rules.runbook(alertname.lower()),
        "dashboard_url": rules.dashboard(labels.get("business_type", "all")),
    }
    return {json.dumps(sorted(labels.items())): (labels, annotations)}


def target_alerts(rules: SloRules, targets: Iterable[TargetHealth], now: float) -> Wanted:
    t = rules.thresholds
    out: Wanted = {}
    members: dict[str, list[TargetHealth]] = defaultdict(list)
    for target in targets:
        for business_type in target.business_types:
            members[business_type].append(target)
        down_for = now - target.down_since_unix if target.down_since_unix is not None else 0.0
        if target.up is False and down_for >= t.target_down_for_seconds:
            out |= _instance(
                rules,
                "LLMSLOTargetDown",
                {"severity": "ticket", "target": target.name},
                {
                    "summary": f"vLLM target {target.name} does not answer its /metrics scrape",
                    "description": f"{target.name} has been down for {down_for:.0f} s. Clients of a dead "
                    "server get connection errors that vLLM's own error counters never see.",
                },
            )
        if target.last_restart_unix is not None and 0 <= now - target.last_restart_unix < t.restart_window_seconds:
            out |= _instance(
                rules,
                "LLMSLOTargetRestarted",
                {"severity": "ticket", "target": target.name},
                {
                    "summary": f"vLLM target {target.name} restarted",
                    "description": f"{target.name}'s server process started {now - target.last_restart_unix:.0f} s "
                    "ago after a restart: requests in flight failed and its caches start cold. Resolves "
                    f"{t.restart_window_seconds:.0f} s after the restart.",
                },
            )
    for bt in rules.business_types:
        mine = members.get(bt.name, [])
        if not mine or any(m.up is not False for m in mine):
            continue
        since = max(m.down_since_unix or now for m in mine)
        if now - since >= t.target_down_for_seconds:
            out |= _instance(
                rules,
                "LLMSLONoHealthyTarget",
                {"severity": "page", "business_type": bt.name},
                {
                    "summary": f"{bt.name}: no vLLM server of this business type answers",
                    "description": f"All {len(mine)} {bt.name} target(s) have failed their scrapes for "
                    f"{now - since:.0f} s: {', '.join(sorted(m.name for m in mine))}.",
                },
            )
    return out


def _hits_and_queries(rows: Iterable[Row], start: int, end: int) -> tuple[float, float]:
    hits = queries = 0.0
    for r in rows:
        if not (start <= r.start_unix and r.start_unix + r.period_seconds <= end):
            continue
        if r.cell.ident.kind is not Kind.COUNTER:
            continue
        metric = r.cell.ident.key.metric
        if metric == "prefix_cache_hits":
            hits += r.cell.cell.value
        elif metric == "prefix_cache_queries":
            queries += r.cell.cell.value
    return hits, queries


def cache_alerts(
    rules: SloRules, rows: Sequence[Row], now: float, business_type_of: Callable[[str, str], str | None]
) -> Wanted:
    """Prefix-cache collapse from stored rows (the full re-read); see `cache_alerts_from`."""
    t = rules.thresholds
    if t.prefix_cache_drop is None:
        return {}
    end = period_start(now) + MINUTE_SECONDS
    reference_start = end - int(t.prefix_cache_window_seconds) - int(t.prefix_cache_reference_seconds)
    by_type: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        bt = business_type_of(r.cell.target, r.cell.ident.key.model)
        if bt is not None and r.start_unix >= reference_start:
            by_type[bt].append(r)
    return cache_alerts_from(
        rules, now, list(by_type), lambda bt, start, stop: _hits_and_queries(by_type[bt], start, stop)
    )


def cache_alerts_from(
    rules: SloRules, now: float, business_types: Iterable[str], sums: Callable[[str, int, int], tuple[float, float]]
) -> Wanted:
    """Prefix-cache hit ratio over the last window below `prefix_cache_drop` x its own level over
    the reference window before it, with enough queries, and a reference level worth keeping.
    `sums(business_type, start, end)` gives (hits, queried tokens) over [start, end)."""
    t = rules.thresholds
    if t.prefix_cache_drop is None:
        return {}
    end = period_start(now) + MINUTE_SECONDS
    window_start = end - int(t.prefix_cache_window_seconds)
    reference_start = window_start - int(t.prefix_cache_reference_seconds)
    out: Wanted = {}
    for bt in business_types:
        hits, queries = sums(bt, window_start, end)
        ref_hits, ref_queries = sums(bt, reference_start, window_start)
        if queries < t.prefix_cache_min_queries or ref_queries <= 0:
            continue
        ratio, reference = hits / queries, ref_hits / ref_queries
        if reference > t.prefix_cache_min_ratio and ratio < t.prefix_cache_drop * reference:
            out |= _instance(
                rules,
                CACHE_COLLAPSE,
                {"severity": "ticket", "business_type": bt},
                {
                    "summary": f"{bt}: prefix-cache hit ratio collapsed",
                    "description": f"The prefix-cache hit ratio is {ratio:.2f} over the last "
                    f"{t.prefix_cache_window_seconds:.0f} s against {reference:.2f} over the "
                    f"{t.prefix_cache_reference_seconds:.0f} s before ({queries:.0f} queried tokens): prompts "
                    "stopped sharing prefixes or the cache is being evicted. Expect TTFT and prefill cost up.",
                },
            )
    return out


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """A deployment's memory pressure now: GPU framebuffer from DCGM when its exporters answer,
    else vLLM's KV-cache usage (the seeds' "memory usage > 95 %")."""

    deployment: str
    source: str  # "dcgm" or "kv_cache"
    value: float  # the highest GPU's or engine's ratio
    threshold: float
    where: str  # the GPU or target holding the highest value


def memory_alerts(
    rules: SloRules, readings: Iterable[MemoryReading], high_since: dict[str, float], now: float
) -> Wanted:
    """A ticket per deployment whose reading stayed above its threshold for `kv_cache_for`.
    `high_since` (deployment -> when it went above) is kept by the caller between passes."""
    t = rules.thresholds
    out: Wanted = {}
    seen = set()
    for r in readings:
        seen.add(r.deployment)
        if r.value <= r.threshold:
            high_since.pop(r.deployment, None)
            continue
        since = high_since.setdefault(r.deployment, now)
        if now - since < t.kv_cache_for_seconds:
            continue
        what = (
            "GPU memory (DCGM framebuffer) is"
            if r.source == "dcgm"
            else "the KV cache (no DCGM exporter for this deployment) is"
        )
        out |= _instance(
            rules,
            "LLMSLOMemoryNearlyFull",
            {"severity": "ticket", "deployment": r.deployment, "source": r.source},
            {
                "summary": f"{r.deployment}: memory nearly full",
                "description": f"On {r.where}, {what} {r.value:.1%} used, above {r.threshold:.0%} for "
                f"{now - since:.0f} s. "
                + (
                    "vLLM reserves gpu_memory_utilization of the GPU at start-up, so the threshold sits above "
                    "that reservation: something else is taking memory (another process, a second engine, "
                    "fragmentation), and the next allocation may fail."
                    if r.source == "dcgm"
                    else "Requests will be preempted (recomputed) or queue until sequences finish."
                ),
            },
        )
    for gone in set(high_since) - seen:
        del high_since[gone]
    return out


def drift_alerts(rules: SloRules, findings: Iterable[Finding], severity: str) -> Wanted:
    """A ticket (drift.severity) per business type (or tenant) and signal that drifted beyond
    its threshold in the last drift pass; resolved when the current window is back inside it."""
    if severity == "none":
        return {}
    out: Wanted = {}
    for f in findings:
        if not f.drifted:
            continue
        labels = {"severity": severity, "business_type": f.business_type, "signal": f.signal}
        if f.tenant:
            labels["tenant"] = f.tenant
        out |= _instance(
            rules,
            "LLMSLOWorkloadDrift",
            labels,
            {"summary": f"{f.business_type}: {f.signal.replace('_', ' ')} drifted", "description": f.summary},
        )
    return out
