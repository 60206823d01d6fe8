"""Per-request analytics over a window: merged request cells -> counts, percentiles, goodput."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from collector.traces.normalize import SHADOW
from collector.traces.rollup import LATENCIES, RequestCell, RequestKey

QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    count: int
    mean_seconds: float | None
    quantiles: dict[float, float]


@dataclass(frozen=True, slots=True)
class RequestSummary:
    requests: int
    errors: int
    error_ratio: float | None
    error_types: dict[str, int]
    finish_reasons: dict[str, int]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cache_hit_ratio: float | None  # cached input / input of the requests reporting it; None: not reported
    cache_reported_share: float | None  # share of input tokens whose source reports cached tokens
    goodput_ratio: float | None  # requests meeting every latency objective of their type at once
    good_ratio: dict[str, float]  # per SLO
    latencies: dict[str, LatencySummary]
    measured_at: tuple[str, ...]
    tenants: dict[str, int]
    # per clock (engine, gateway, client): the share of its requests that report each optional
    # field; a source that never reports one (vLLM's spans: cached tokens, finish reason) says 0
    fields_reported: dict[str, dict[str, float]]


def summarize(
    rows: Iterable[tuple[RequestKey, RequestCell]],
    business_type: str | None = None,
    tenant: str | None = None,
    model: str | None = None,
    measured_at: str | None = None,
) -> RequestSummary:
    merged = RequestCell()
    by_clock: dict[str, RequestCell] = {}
    clocks: set[str] = set()
    tenants: dict[str, int] = {}
    for key, cell in rows:
        if (
            business_type not in (None, key.business_type)
            or tenant not in (None, key.tenant)
            or model not in (None, key.model)
            or measured_at not in (None, key.measured_at)
            or (measured_at is None and key.measured_at == SHADOW)  # shadow traffic only when asked for
        ):
            continue
        merged.merge(cell)
        by_clock.setdefault(key.measured_at, RequestCell()).merge(cell)
        clocks.add(key.measured_at)
        tenants[key.tenant] = tenants.get(key.tenant, 0) + cell.total
    latencies = {}
    for name in LATENCIES:
        sk = merged.sketches.get(name)
        if sk is not None and sk.count:
            latencies[name] = LatencySummary(
                sk.count, sk.total / sk.count, {q: v for q in QUANTILES if (v := sk.quantile(q)) is not None}
            )
    n = merged.total
    return RequestSummary(
        requests=n,
        errors=merged.errors,
        error_ratio=merged.errors / n if n else None,
        error_types=merged.error_types,
        finish_reasons=merged.finish,
        input_tokens=merged.input_tokens,
        cached_input_tokens=merged.cached_input_tokens,
        output_tokens=merged.output_tokens,
        cache_hit_ratio=merged.cached_input_tokens / merged.cache_reported_input_tokens
        if merged.cache_reported_input_tokens
        else None,
        cache_reported_share=merged.cache_reported_input_tokens / merged.input_tokens if merged.input_tokens else None,
        goodput_ratio=merged.jointly_good / n if n and merged.good else None,
        good_ratio={slo: g / n for slo, g in merged.good.items()} if n else {},
        latencies=latencies,
        measured_at=tuple(sorted(clocks)),
        tenants=tenants,
        fields_reported={clock: _fields_reported(cell) for clock, cell in sorted(by_clock.items())},
    )


def _fields_reported(cell: RequestCell) -> dict[str, float]:
    """Share of requests (of input tokens, for cached tokens) whose span carried each field."""
    n = cell.total
    if not n:
        return {}

    def sketched(name: str) -> float:
        sk = cell.sketches.get(name)
        return sk.count / n if sk is not None else 0.0

    return {
        "ttft": sketched("ttft"),
        "tpot": sketched("tpot"),
        "queue": sketched("queue"),
        "finish_reason": 1.0 - cell.finish.get("unknown", 0) / n,
        "cached_input_tokens": cell.cache_reported_input_tokens / cell.input_tokens if cell.input_tokens else 0.0,
    }
