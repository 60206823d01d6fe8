"""vLLM's /metrics as the simulator serves it: names, types, labels, HELP texts and default
bucket bounds of real vLLM releases (reference vllm-metrics.md §2-3), for three naming
families: current (0.33), 0.10 (both old and new names) and 0.6 (V0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.histogram import Histogram
from collector.sources import vllm_buckets as buckets

VERSIONS = ("current", "0.10", "0.6")


@dataclass(slots=True)
class EngineMetrics:
    """Cumulative state of one vLLM server for one model (what a restart resets)."""

    max_model_len: int
    created_unix: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    hist: dict[str, Histogram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tokens = buckets.request_token_buckets(self.max_model_len)
        for name, bounds in (
            ("time_to_first_token_seconds", buckets.TTFT),
            ("inter_token_latency_seconds", buckets.INTER_TOKEN_LATENCY),
            ("request_time_per_output_token_seconds", buckets.INTER_TOKEN_LATENCY),
            ("e2e_request_latency_seconds", buckets.REQUEST_LATENCY),
            ("request_queue_time_seconds", buckets.REQUEST_LATENCY),
            ("request_inference_time_seconds", buckets.REQUEST_LATENCY),
            ("request_prefill_time_seconds", buckets.REQUEST_LATENCY),
            ("request_decode_time_seconds", buckets.REQUEST_LATENCY),
            ("request_prompt_tokens", tokens),
            ("request_generation_tokens", tokens),
            ("request_max_num_generation_tokens", tokens),
            ("request_params_max_tokens", tokens),
            ("request_params_n", buckets.PARAMS_N),
            ("iteration_tokens_total", buckets.ITERATION_TOKENS),
        ):
            self.hist[name] = Histogram(tuple(float(b) for b in bounds))
        # V0 kept its own (shorter) layouts; simulate them separately so counts stay exact.
        for name, bounds in (
            ("v0:time_to_first_token_seconds", buckets.V0_TTFT),
            ("v0:itl", buckets.V0_INTER_TOKEN_LATENCY),
            ("v0:e2e", buckets.V0_REQUEST_LATENCY),
            ("v0:queue", buckets.V0_REQUEST_LATENCY),
            ("v0:prefill", buckets.V0_REQUEST_LATENCY),
            ("v0:decode", buckets.V0_REQUEST_LATENCY),
            ("v0:inference", buckets.V0_REQUEST_LATENCY),
        ):
            self.hist[name] = Histogram(bounds)

    def record_finished(
        self,
        *,
        reason: str,
        prompt_tokens: int,
        output_tokens: int,
        max_tokens: int,
        computed_prompt_tokens: int,
        ttft: float,
        queue: float,
        prefill: float,
        decode: float,
        e2e: float,
    ) -> None:
        """One finished request, as vLLM's PrometheusStatLogger records it (the prompt-token
        counter is advanced at prefill, by the engine model)."""
        h = self.hist
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.generation_tokens += output_tokens
        tpot = decode / (output_tokens - 1) if output_tokens > 1 else 0.0
        inference = prefill + decode
        for key, v0, value in (
            ("time_to_first_token_seconds", "v0:time_to_first_token_seconds", ttft),
            ("e2e_request_latency_seconds", "v0:e2e", e2e),
            ("request_queue_time_seconds", "v0:queue", queue),
            ("request_prefill_time_seconds", "v0:prefill", prefill),
            ("request_decode_time_seconds", "v0:decode", decode),
            ("request_inference_time_seconds", "v0:inference", inference),
        ):
            h[key].observe(value)
            h[v0].observe(value)
        h["request_time_per_output_token_seconds"].observe(tpot)
        h["inter_token_latency_seconds"].observe(tpot, output_tokens - 1)
        h["v0:itl"].observe(tpot, output_tokens - 1)
        h["request_prompt_tokens"].observe(prompt_tokens)
        h["request_generation_tokens"].observe(output_tokens)
        h["request_max_num_generation_tokens"].observe(max_tokens)
        h["request_params_max_tokens"].observe(max_tokens)
        h["request_params_n"].observe(1)
        # one prefill step (computed prompt tokens + the first output token), then one token a step
        h["iteration_tokens_total"].observe(computed_prompt_tokens + 1)
        h["iteration_tokens_total"].observe(1, output_tokens - 1)


HELP = {
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "gpu_cache_usage_perc_deprecated": "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
    "vllm:kv_cache_usage_perc instead.",
    "gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "gpu_prefix_cache_queries": "GPU prefix cache queries, in terms of number of queried tokens.",
    "gpu_prefix_cache_hits": "GPU prefix cache hits, in terms of number of cached tokens.",
    "gpu_prefix_cache_hit_rate": "GPU prefix cache block hit rate.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "generation_tokens": "Number of generation tokens processed.",
    "request_success": "Count of successfully processed requests.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "time_per_output_token_seconds_deprecated": "Histogram of time per output token in seconds.DEPRECATED: "
    "Use vllm:inter_token_latency_seconds instead.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
}

FINISH_REASONS = {
    "current": ("stop", "length", "abort", "error", "repetition"),
    "0.10": ("stop", "length", "abort"),
    "0.6": ("stop", "length", "abort"),
}


def _num(v: float) -> str:
    return repr(float(v))


def render(version: str, model: str, m: EngineMetrics, block_size: int = 16, num_gpu_blocks: int = 0) -> str:
    """The /metrics text of one server for one model, as vLLM `version` would write it."""
    if version not in VERSIONS:
        raise ValueError(f"unknown vLLM naming family {version!r} (known: {', '.join(VERSIONS)})")
    v0 = version == "0.6"
    created = not v0
    labels = f'model_name="{model}"' if v0 else f'engine="0",model_name="{model}"'
    out: list[str] = []

    def head(name: str, kind: str, help_key: str) -> None:
        out.append(f"# HELP vllm:{name} {HELP[help_key]}")
        out.append(f"# TYPE vllm:{name} {kind}")

    def created_gauge(name: str, help_key: str) -> None:
        if created:
            out.append(f"# HELP vllm:{name}_created {HELP[help_key]}")
            out.append(f"# TYPE vllm:{name}_created gauge")
            out.append(f"vllm:{name}_created{{{labels}}} {_num(m.created_unix)}")

    def gauge(name: str, value: float, help_key: str | None = None) -> None:
        head(name, "gauge", help_key or name)
        out.append(f"vllm:{name}{{{labels}}} {_num(value)}")

    def counter(name: str, value: float, help_key: str | None = None) -> None:
        head(f"{name}_total", "counter", help_key or name)
        out.append(f"vllm:{name}_total{{{labels}}} {_num(value)}")
        created_gauge(name, help_key or name)

    def histogram(name: str, key: str, help_key: str | None = None) -> None:
        h = m.hist[key]
        head(name, "histogram", help_key or name)
        out.append(f"vllm:{name}_sum{{{labels}}} {_num(h.total)}")
        cumulative = 0
        for bound, n in zip(h.bounds, h.counts, strict=False):
            cumulative += n
            out.append(f'vllm:{name}_bucket{{{labels},le="{_num(bound)}"}} {_num(cumulative)}')
        out.append(f'vllm:{name}_bucket{{{labels},le="+Inf"}} {_num(h.count)}')
        out.append(f"vllm:{name}_count{{{labels}}} {_num(h.count)}")
        created_gauge(name, help_key or name)

    gauge("num_requests_running", m.running)
    gauge("num_requests_waiting", m.waiting)
    if version == "current":
        gauge("kv_cache_usage_perc", m.kv_usage)
    elif version == "0.10":
        gauge("gpu_cache_usage_perc", m.kv_usage, "gpu_cache_usage_perc_deprecated")
        gauge("kv_cache_usage_perc", m.kv_usage)
    else:
        gauge("gpu_cache_usage_perc", m.kv_usage)
        rate = m.prefix_hits / m.prefix_queries if m.prefix_queries else 0.0
        gauge("gpu_prefix_cache_hit_rate", rate)
    if version == "0.10":
        counter("gpu_prefix_cache_queries", m.prefix_queries)
        counter("gpu_prefix_cache_hits", m.prefix_hits)
    if not v0:
        counter("prefix_cache_queries", m.prefix_queries)
        counter("prefix_cache_hits", m.prefix_hits)
    counter("num_preemptions", m.preemptions)
    counter("prompt_tokens", m.prompt_tokens)
    counter("generation_tokens", m.generation_tokens)
    head("request_success_total", "counter", "request_success")
    finished = dict(m.finished)
    if "error" not in FINISH_REASONS[version]:  # before 0.16 vLLM had no "error" reason: failures were aborts
        finished["abort"] = finished.get("abort", 0) + finished.pop("error", 0)
    for reason in FINISH_REASONS[version]:
        lbl = (
            f'{labels},finished_reason="{reason}"'
            if v0
            else f'engine="0",finished_reason="{reason}",model_name="{model}"'
        )
        out.append(f"vllm:request_success_total{{{lbl}}} {_num(finished.get(reason, 0))}")
    if created:
        out.append(f"# HELP vllm:request_success_created {HELP['request_success']}")
        out.append("# TYPE vllm:request_success_created gauge")
        for reason in FINISH_REASONS[version]:
            out.append(
                f'vllm:request_success_created{{engine="0",finished_reason="{reason}",model_name="{model}"}} '
                f"{_num(m.created_unix)}"
            )
    for name in (
        "request_prompt_tokens",
        "request_generation_tokens",
        "iteration_tokens_total",
        "request_max_num_generation_tokens",
        "request_params_n",
        "request_params_max_tokens",
    ):
        histogram(name, name)
    if v0:
        histogram("time_to_first_token_seconds", "v0:time_to_first_token_seconds")
        histogram("time_per_output_token_seconds", "v0:itl")
        for name, key in (
            ("e2e_request_latency_seconds", "v0:e2e"),
            ("request_queue_time_seconds", "v0:queue"),
            ("request_inference_time_seconds", "v0:inference"),
            ("request_prefill_time_seconds", "v0:prefill"),
            ("request_decode_time_seconds", "v0:decode"),
        ):
            histogram(name, key)
    else:
        histogram("time_to_first_token_seconds", "time_to_first_token_seconds")
        if version == "0.10":
            histogram(
                "time_per_output_token_seconds",
                "inter_token_latency_seconds",
                "time_per_output_token_seconds_deprecated",
            )
        histogram("inter_token_latency_seconds", "inter_token_latency_seconds")
        if version == "current":
            histogram("request_time_per_output_token_seconds", "request_time_per_output_token_seconds")
        for name in (
            "e2e_request_latency_seconds",
            "request_queue_time_seconds",
            "request_inference_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
        ):
            histogram(name, name)
    head("cache_config_info", "gauge", "cache_config_info")
    info = (
        f'block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'gpu_memory_utilization="0.9",num_gpu_blocks="{num_gpu_blocks}"'
    )
    engine_label = "" if v0 else ',engine="0"'
    out.append(f"vllm:cache_config_info{{{info}{engine_label}}} 1.0")
    return "\n".join(out) + "\n"
