"""The simulator's /metrics against vLLM's own test lists and count invariants."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.sim.exposition import render
from collector.sim.scenario import load_scenario
from collector.sources.vllm import SeriesKey, read_scrape
from collector.sources.vllm_buckets import request_token_buckets

# reference vllm-metrics.md §2.6 (a): tests/entrypoints/instrumentator/test_metrics.py @20ef9d82
EXPECTED_METRICS_V1 = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total",
    "vllm:cache_config_info",
    "vllm:request_success_total",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_sum",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_generation_tokens_count",
    "vllm:request_params_n_sum",
    "vllm:request_params_n_bucket",
    "vllm:request_params_n_count",
    "vllm:request_params_max_tokens_sum",
    "vllm:request_params_max_tokens_bucket",
    "vllm:request_params_max_tokens_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_inference_time_seconds_sum",
    "vllm:request_inference_time_seconds_bucket",
    "vllm:request_inference_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_decode_time_seconds_bucket",
    "vllm:request_decode_time_seconds_count",
]
# §2.6 (b): the 0.11->0.12 list, with the deprecated names a 0.10 server still shows
EXPECTED_0_10_EXTRA = [
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits",
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_count",
]


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    f = load_scenario("healthy").fleet()
    done = []
    f.on_finish.append(done.append)
    f.advance(600.0)
    f.finished_requests = done  # type: ignore[attr-defined]
    return f


def test_current_naming_passes_vllms_metric_name_list(fleet) -> None:  # type: ignore[no-untyped-def]
    rep = fleet.replicas["chat-0"]
    text = render("current", rep.deployment.model.name, rep.metrics)
    missing = [name for name in EXPECTED_METRICS_V1 if name not in text]
    assert missing == []
    families = {f.name for f in text_string_to_metric_families(text)}
    assert "vllm:prefix_cache_queries" in families and "vllm:iteration_tokens_total" in families


def test_0_10_naming_adds_the_deprecated_names(fleet) -> None:  # type: ignore[no-untyped-def]
    rep = fleet.replicas["chat-0"]
    text = render("0.10", rep.deployment.model.name, rep.metrics)
    assert [n for n in EXPECTED_METRICS_V1 + EXPECTED_0_10_EXTRA if n not in text] == []
    assert "DEPRECATED: Use vllm:kv_cache_usage_perc instead." in text


def test_0_6_naming_is_v0(fleet) -> None:  # type: ignore[no-untyped-def]
    rep = fleet.replicas["chat-0"]
    text = render("0.6", rep.deployment.model.name, rep.metrics)
    assert 'engine="' not in text and "_created" not in text
    assert "vllm:gpu_prefix_cache_hit_rate" in text and "vllm:kv_cache_usage_perc" not in text
    ttft = read_scrape(text).histograms[SeriesKey(rep.deployment.model.name, "ttft")]
    assert ttft.bounds[-1] == 10.0


@pytest.mark.parametrize("replica", ["chat-0", "chat-1", "code-0", "batch-0"])
def test_count_invariants_hold(fleet, replica: str) -> None:  # type: ignore[no-untyped-def]
    rep = fleet.replicas[replica]
    text = render("current", rep.deployment.model.name, rep.metrics)
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, s.labels.get("finished_reason"))
            samples[key] = samples.get(key, 0.0) + s.value
    mine = [r for r in fleet.finished_requests if r.replica == replica and not r.error_type]
    n = len(mine)
    assert n > 0
    assert samples[("vllm:time_to_first_token_seconds_count", None)] == n
    assert samples[("vllm:e2e_request_latency_seconds_count", None)] == n
    assert samples[("vllm:inter_token_latency_seconds_count", None)] == sum(r.output_tokens - 1 for r in mine)
    assert samples[("vllm:request_prompt_tokens_sum", None)] == sum(r.prompt_tokens for r in mine)
    assert samples[("vllm:request_generation_tokens_sum", None)] == sum(r.output_tokens for r in mine)
    assert samples[("vllm:generation_tokens_total", None)] == sum(r.output_tokens for r in mine)
    finished = sum(v for (name, reason), v in samples.items() if name == "vllm:request_success_total")
    assert finished == n
    assert samples[("vllm:iteration_tokens_total_count", None)] == sum(r.output_tokens for r in mine)
    # prompt tokens are counted at prefill: requests still running are in the counter already
    assert samples[("vllm:prompt_tokens_total", None)] >= samples[("vllm:request_prompt_tokens_sum", None)]
    assert samples[("vllm:prefix_cache_hits_total", None)] <= samples[("vllm:prefix_cache_queries_total", None)]


def test_simulated_latencies_are_consistent(fleet) -> None:  # type: ignore[no-untyped-def]
    for r in fleet.finished_requests:
        assert r.arrival <= r.admitted <= r.first_token <= r.finished
        assert r.cached_tokens <= r.prompt_tokens


def test_same_seed_same_fleet() -> None:
    a, b = load_scenario("healthy").fleet(), load_scenario("healthy").fleet()
    a.advance(300.0)
    b.advance(300.0)
    for name in a.replicas:
        ra, rb = a.replicas[name], b.replicas[name]
        assert render("current", "m", ra.metrics) == render("current", "m", rb.metrics)


def test_kv_capacity_follows_the_seed_formula() -> None:
    sc = load_scenario("healthy")
    chat = next(d for d in sc.deployments if d.name == "chat")
    assert chat.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 131,072 bytes: 128 KiB per token
    assert chat.kv_capacity_tokens == int((24e9 * 0.9 - 8e9 * 2) // 131072)


def test_request_token_buckets() -> None:
    assert request_token_buckets(1024) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert request_token_buckets(40960)[-2:] == (10000, 20000)
