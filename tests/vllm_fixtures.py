"""Exposition writers for each vLLM version family, from the names in reference/vllm-metrics.md.

Written independently of collector/ (tests must not check the collector against itself): each
family lists its exposed names, labels and default bucket bounds as that vLLM release emitted
them, and `render()` prints prometheus_client-style text for a given set of observations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TTFT_OLD = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
TTFT_NEW = [*TTFT_OLD, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LAT_OLD = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
TOKEN_LAT_NEW = [*TOKEN_LAT_OLD, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ_LAT_OLD = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
REQ_LAT_NEW = [*REQ_LAT_OLD, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKENS_1_2_5 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]


@dataclass(frozen=True)
class Family:
    """How one vLLM version family exposes the metrics llmslo reads."""

    version: str
    engine_label: bool
    created: bool
    reasons: tuple[str, ...]
    kv_names: tuple[str, ...]
    prefix_names: tuple[str, ...]  # "prefix_cache" and/or "gpu_prefix_cache" counter stems
    prefix_unit: str
    itl_names: tuple[str, ...]
    tpot: bool
    v0_hit_rate_gauge: bool
    ttft_bounds: list[float]
    token_lat_bounds: list[float]
    req_lat_bounds: list[float]


FAMILIES = {
    "0.6": Family(
        "0.6",
        False,
        False,
        ("stop", "length", "abort"),
        ("gpu_cache_usage_perc",),
        (),
        "",
        ("time_per_output_token_seconds",),
        False,
        True,
        TTFT_OLD,
        TOKEN_LAT_OLD,
        REQ_LAT_OLD,
    ),
    "0.8": Family(
        "0.8",
        True,
        True,
        ("stop", "length", "abort"),
        ("gpu_cache_usage_perc",),
        ("gpu_prefix_cache",),
        "blocks",
        ("time_per_output_token_seconds",),
        False,
        False,
        TTFT_NEW,
        TOKEN_LAT_NEW,
        REQ_LAT_NEW,
    ),
    "0.10": Family(
        "0.10",
        True,
        True,
        ("stop", "length", "abort"),
        ("gpu_cache_usage_perc", "kv_cache_usage_perc"),
        ("gpu_prefix_cache", "prefix_cache"),
        "tokens",
        ("time_per_output_token_seconds", "inter_token_latency_seconds"),
        False,
        False,
        TTFT_NEW,
        TOKEN_LAT_NEW,
        REQ_LAT_NEW,
    ),
    "0.11": Family(
        "0.11",
        True,
        True,
        ("stop", "length", "abort"),
        ("kv_cache_usage_perc",),
        ("prefix_cache",),
        "tokens",
        ("time_per_output_token_seconds", "inter_token_latency_seconds"),
        True,
        False,
        TTFT_NEW,
        TOKEN_LAT_NEW,
        REQ_LAT_NEW,
    ),
    "0.33": Family(
        "0.33",
        True,
        True,
        ("stop", "length", "abort", "error", "repetition"),
        ("kv_cache_usage_perc",),
        ("prefix_cache",),
        "tokens",
        ("inter_token_latency_seconds",),
        True,
        False,
        TTFT_NEW,
        TOKEN_LAT_NEW,
        REQ_LAT_NEW,
    ),
}


@dataclass
class Observations:
    """What happened on one engine of one model, cumulatively."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    output_lengths: list[int] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    preemptions: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0


def _num(x: float) -> str:
    return repr(float(x))


def _labels(model: str, engine: str | None, fam: Family, extra: dict[str, str] | None = None) -> str:
    pairs = dict(extra or {})
    if fam.engine_label and engine is not None:
        pairs["engine"] = engine
    pairs["model_name"] = model
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}"


def render(fam: Family, series: dict[tuple[str, str], Observations], created: float = 1.7e9) -> str:
    """Exposition text for {(model, engine): observations}."""
    out: list[str] = []

    def counter(name: str, help_: str, values: list[tuple[str, float]]) -> None:
        out.append(f"# HELP vllm:{name}_total {help_}")
        out.append(f"# TYPE vllm:{name}_total counter")
        out.extend(f"vllm:{name}_total{lbl} {_num(v)}" for lbl, v in values)
        if fam.created:
            out.append(f"# HELP vllm:{name}_created {help_}")
            out.append(f"# TYPE vllm:{name}_created gauge")
            out.extend(f"vllm:{name}_created{lbl} {_num(created)}" for lbl, _ in values)

    def gauge(name: str, help_: str, values: list[tuple[str, float]]) -> None:
        out.append(f"# HELP vllm:{name} {help_}")
        out.append(f"# TYPE vllm:{name} gauge")
        out.extend(f"vllm:{name}{lbl} {_num(v)}" for lbl, v in values)

    def histogram(name: str, help_: str, bounds: list[float], attr: str) -> None:
        out.append(f"# HELP vllm:{name} {help_}")
        out.append(f"# TYPE vllm:{name} histogram")
        for (model, engine), obs in series.items():
            values = getattr(obs, attr)
            for b in bounds:
                le = _labels(model, engine, fam, {"le": _num(b)})
                out.append(f"vllm:{name}_bucket{le} {_num(sum(1 for v in values if v <= b))}")
            out.append(f"vllm:{name}_bucket{_labels(model, engine, fam, {'le': '+Inf'})} {_num(len(values))}")
            out.append(f"vllm:{name}_count{_labels(model, engine, fam)} {_num(len(values))}")
            out.append(f"vllm:{name}_sum{_labels(model, engine, fam)} {_num(sum(values))}")
        if fam.created:
            out.append(f"# HELP vllm:{name}_created {help_}")
            out.append(f"# TYPE vllm:{name}_created gauge")
            for model, engine in series:
                out.append(f"vllm:{name}_created{_labels(model, engine, fam)} {_num(created)}")

    def each(fn: str) -> list[tuple[str, float]]:
        return [(_labels(m, e, fam), float(getattr(o, fn))) for (m, e), o in series.items()]

    gauge("num_requests_running", "Number of requests in model execution batches.", each("running"))
    gauge("num_requests_waiting", "Number of requests waiting to be processed.", each("waiting"))
    for kv in fam.kv_names:
        gauge(kv, "KV-cache usage. 1 means 100 percent usage.", each("kv_usage"))
    if fam.v0_hit_rate_gauge:
        rates = [
            (_labels(m, e, fam), o.prefix_hits / o.prefix_queries if o.prefix_queries else 0.0)
            for (m, e), o in series.items()
        ]
        gauge("gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", rates)
    for stem in fam.prefix_names:
        unit = "blocks" if fam.prefix_unit == "blocks" else "tokens"
        counter(
            f"{stem}_queries",
            f"Prefix cache queries, in terms of number of queried {unit}.",
            each("prefix_queries"),
        )
        counter(f"{stem}_hits", f"Prefix cache hits, in terms of number of cached {unit}.", each("prefix_hits"))
    counter("num_preemptions", "Cumulative number of preemption from the engine.", each("preemptions"))
    counter(
        "prompt_tokens",
        "Number of prefill tokens processed.",
        [(_labels(m, e, fam), float(sum(o.prompt_lengths))) for (m, e), o in series.items()],
    )
    counter(
        "generation_tokens",
        "Number of generation tokens processed.",
        [(_labels(m, e, fam), float(sum(o.output_lengths))) for (m, e), o in series.items()],
    )
    success = []
    for (m, e), o in series.items():
        for reason in fam.reasons:
            success.append((_labels(m, e, fam, {"finished_reason": reason}), float(o.finished.get(reason, 0))))
    counter("request_success", "Count of successfully processed requests.", success)
    histogram("request_prompt_tokens", "Number of prefill tokens processed.", TOKENS_1_2_5, "prompt_lengths")
    histogram("request_generation_tokens", "Number of generation tokens processed.", TOKENS_1_2_5, "output_lengths")
    histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", fam.ttft_bounds, "ttft")
    for itl in fam.itl_names:
        histogram(itl, "Histogram of inter-token latency in seconds.", fam.token_lat_bounds, "itl")
    if fam.tpot:
        histogram(
            "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            fam.token_lat_bounds,
            "tpot",
        )
    histogram(
        "e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        fam.req_lat_bounds,
        "e2e",
    )
    histogram(
        "request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        fam.req_lat_bounds,
        "queue",
    )
    histogram(
        "request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        fam.req_lat_bounds,
        "prefill",
    )
    histogram(
        "request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        fam.req_lat_bounds,
        "decode",
    )
    return "\n".join(out) + "\n"


def workload(scale: int = 1) -> Observations:
    """A small, hand-checkable workload: 20 requests x scale."""
    ttft = [0.03] * 10 + [0.3] * 6 + [0.9] * 2 + [1.8, 3.0]
    return Observations(
        ttft=ttft * scale,
        itl=[0.02] * 150 * scale + [0.06] * 30 * scale,
        tpot=[0.02] * 16 * scale + [0.06] * 4 * scale,
        e2e=[0.4] * 10 * scale + [1.2] * 8 * scale + [3.0, 7.0] * scale,
        queue=[0.01] * 18 * scale + [0.4, 2.2] * scale,
        prefill=[0.02] * 20 * scale,
        decode=[0.2] * 10 * scale + [0.9] * 10 * scale,
        prompt_lengths=[100] * 10 * scale + [400] * 10 * scale,
        output_lengths=[10] * 20 * scale,
        finished={"stop": 15 * scale, "length": 3 * scale, "abort": 2 * scale},
        prefix_queries=5000.0 * scale,
        prefix_hits=2000.0 * scale,
        preemptions=1 * scale,
        running=3.0,
        waiting=2.0,
        kv_usage=0.42,
    )
