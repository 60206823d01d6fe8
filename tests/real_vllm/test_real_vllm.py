"""llmslo against a real vLLM server: every number checked against vLLM's own counters.

vLLM's /metrics is read a second time, independently, with prometheus_client's parser; llmslo
must report exactly the same request counts, token totals and prefix-cache ratio, and every
percentile it reports must lie in the bucket that vLLM's own histogram gives for that rank.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.analytics.serving import ServingStats
from collector.config import Settings
from collector.runtime import Runtime
from tests.real_vllm.conftest import SERVED_MODEL, VllmServer

pytestmark = pytest.mark.real_vllm

SHARED_PREFIX = " ".join(["the system prompt says answer the customer question with care"] * 40)
HISTOGRAMS = {  # llmslo logical name -> vLLM family
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}


def raw(server: VllmServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """vLLM's own exposition, parsed by prometheus_client, summed over `engine`."""
    text = httpx.get(server.metrics_url, timeout=10).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name")))
            out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def diff(after: dict, before: dict) -> dict:  # type: ignore[type-arg]
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def wait_idle(server: VllmServer, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = raw(server)
        if r.get(("vllm:num_requests_running", ()), 0) == 0 and r.get(("vllm:num_requests_waiting", ()), 0) == 0:
            time.sleep(0.5)  # counters are updated right after the last output
            return
        time.sleep(0.3)
    raise AssertionError("vLLM did not go idle")


def run_workload(server: VllmServer, rounds: int = 1, disconnect: bool = True) -> dict[str, int]:
    """Chat and completions, streaming and not, a shared long prefix, a stop string, an aborted
    request and a request vLLM rejects with 400. Returns what the client saw."""
    seen = {"ok": 0, "rejected": 0, "aborted": 0}
    with httpx.Client(base_url=server.base, timeout=120) as client:
        for r in range(rounds):
            for i in range(6):
                resp = client.post(
                    "/v1/completions",
                    json={
                        "model": SERVED_MODEL,
                        "prompt": f"{SHARED_PREFIX} question {r}-{i}",
                        "max_tokens": 6,
                        "temperature": 0,
                    },
                )
                assert resp.status_code == 200, resp.text
                seen["ok"] += 1
            resp = client.post(
                "/v1/chat/completions",
                json={
                    "model": SERVED_MODEL,
                    "messages": [{"role": "user", "content": "hello there model"}],
                    "max_tokens": 8,
                    "ignore_eos": True,
                },
            )
            assert resp.status_code == 200, resp.text
            seen["ok"] += 1
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": SERVED_MODEL,
                    "messages": [{"role": "user", "content": "stream please"}],
                    "max_tokens": 12,
                    "stream": True,
                    "ignore_eos": True,
                },
            ) as stream:
                chunks = [line for line in stream.iter_lines() if line.startswith("data:")]
                assert chunks[-1] == "data: [DONE]"
            seen["ok"] += 1
            resp = client.post(
                "/v1/completions",
                json={
                    "model": SERVED_MODEL,
                    "prompt": "count one two three",
                    "max_tokens": 20,
                    "stop": ["the"],
                    "stream": False,
                },
            )
            assert resp.status_code == 200, resp.text
            seen["ok"] += 1
            # a client that goes away mid-stream: vLLM aborts the request
            if disconnect:
                with client.stream(
                    "POST",
                    "/v1/completions",
                    json={
                        "model": SERVED_MODEL,
                        "prompt": "a long answer",
                        "max_tokens": 400,
                        "stream": True,
                        "ignore_eos": True,
                    },
                ) as stream:
                    for line in stream.iter_lines():
                        if line.startswith("data:"):
                            break
                seen["aborted"] += 1
            resp = client.post(
                "/v1/completions", json={"model": SERVED_MODEL, "prompt": "too long", "max_tokens": 5000}
            )
            assert resp.status_code == 400, resp.text
            seen["rejected"] += 1
    return seen


def bucket_for_rank(q: float, before: dict, after: dict, family: str) -> tuple[float, float] | None:  # type: ignore[type-arg]
    """The (lower, upper] bucket of vLLM's own histogram delta that holds rank q * count."""
    buckets = sorted(
        (float(dict(labels)["le"]), after[(name, labels)] - before.get((name, labels), 0.0))
        for (name, labels) in after
        if name == f"{family}_bucket"
    )
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower = 0.0
    for le, cum in buckets:
        if cum >= rank and cum > 0:
            return lower, le
        lower = le
    return lower, math.inf


def llmslo_totals(rt: Runtime) -> ServingStats:
    report = rt.report(3600.0, time.time())
    assert len(report.groups) == 1 and report.groups[0].model == SERVED_MODEL
    return report.groups[0].stats


class Collector:
    """llmslo's runtime with one target, driven step by step on one event loop."""

    def __init__(self, tmp_path: Path, server: VllmServer, startup_lookback: float = 0.001) -> None:
        """`startup_lookback`: by default the first scrape is a baseline however recently the
        module's server started, so these tests compare deltas between two scrapes."""
        target = {"name": "vllm", "url": server.metrics_url, "timeout": 10, "business_type": "chat"}
        settings = Settings.model_validate(
            {"data_dir": str(tmp_path), "targets": [target], "scrape": {"startup_lookback": startup_lookback}}
        )
        self.loop = asyncio.new_event_loop()
        self.rt = Runtime(settings)
        self.loop.run_until_complete(self.rt.start())

    def scrape(self, expect_up: bool = True) -> None:
        self.loop.run_until_complete(self.rt.scrape_all_once())
        status = self.rt.scrapers["vllm"].status
        assert status.up is expect_up, status.last_error

    def close(self) -> None:
        self.loop.run_until_complete(self.rt.close())
        self.loop.close()


def test_llmslo_agrees_with_vllms_own_counters_and_histograms(vllm_server: VllmServer, tmp_path: Path) -> None:
    col = Collector(tmp_path, vllm_server)
    wait_idle(vllm_server)
    col.scrape()
    before = raw(vllm_server)
    seen = run_workload(vllm_server, rounds=2)
    wait_idle(vllm_server)
    after = raw(vllm_server)
    col.scrape()
    delta = diff(after, before)
    stats = llmslo_totals(col.rt)

    finished = {
        dict(labels)["finished_reason"]: v
        for (name, labels), v in delta.items()
        if name == "vllm:request_success_total"
    }
    assert stats.finished == finished
    # A client that disconnects mid-stream is counted by vLLM 0.32 either as a finished request
    # (it generated to the end anyway) or not at all (operator trap T4), never reliably as
    # finished_reason="abort"; llmslo must agree with whatever vLLM counted.
    assert stats.requests == sum(finished.values())
    assert seen["ok"] <= stats.requests <= seen["ok"] + seen["aborted"]
    assert stats.prompt_tokens == delta[("vllm:prompt_tokens_total", ())]
    assert stats.generation_tokens == delta[("vllm:generation_tokens_total", ())]
    queries, hits = (
        delta[("vllm:prefix_cache_queries_total", ())],
        delta[("vllm:prefix_cache_hits_total", ())],
    )
    assert hits > 0, "the shared prefix produced no prefix-cache hits"
    assert stats.prefix_cache_queries == queries and stats.prefix_cache_hits == hits
    assert stats.prefix_cache_hit_ratio == pytest.approx(hits / queries, rel=0, abs=0)
    assert stats.prefix_cache_unit == "tokens"

    for metric, family in HISTOGRAMS.items():
        lat = stats.latencies[metric]
        assert not lat.estimated
        assert lat.count == delta[(f"{family}_count", ())]
        for q in lat.quantiles:
            expected = bucket_for_rank(q.quantile, before, after, family)
            assert expected is not None
            if math.isinf(expected[1]):
                assert q.above_top_bound
            else:
                assert (q.lower_bound, q.upper_bound) == expected, (metric, q)
                assert expected[0] <= q.value <= expected[1]
    col.close()


def test_a_vllm_restart_mid_test_loses_no_request_and_gives_no_negative_delta(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    col = Collector(tmp_path, vllm_server)
    rt = col.rt
    wait_idle(vllm_server)
    col.scrape()
    before_a = raw(vllm_server)
    run_workload(vllm_server)
    wait_idle(vllm_server)
    after_a = raw(vllm_server)
    col.scrape()

    vllm_server.stop()
    col.scrape(expect_up=False)  # down: a connect error, nothing stored
    vllm_server.start()
    run_workload(vllm_server)
    wait_idle(vllm_server)
    after_b = raw(vllm_server)  # the new process counted from zero
    col.scrape()

    a, b = diff(after_a, before_a), after_b
    stats = llmslo_totals(rt)
    want_requests = sum(v for (n, _), v in {**a}.items() if n == "vllm:request_success_total") + sum(
        v for (n, _), v in b.items() if n == "vllm:request_success_total"
    )
    assert stats.requests == want_requests
    assert stats.prompt_tokens == a[("vllm:prompt_tokens_total", ())] + b[("vllm:prompt_tokens_total", ())]
    assert stats.generation_tokens == (
        a[("vllm:generation_tokens_total", ())] + b[("vllm:generation_tokens_total", ())]
    )
    assert rt.scrapers["vllm"].status.counter_resets_total > 0
    assert rt.scrapers["vllm"].status.restarts_total == 1  # one restart, however many series reset
    cells = rt.store.read_window(0, int(time.time()) + 120)
    assert all(sc.cell.value >= 0 and all(x >= 0 for x in sc.cell.buckets or []) for sc in cells)
    col.close()


def test_vllms_own_spans_agree_with_its_histograms(vllm_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    """vLLM exports one `llm_request` span per finished request to llmslo over OTLP/HTTP; the
    ingested records must agree with the engine's own counters and histograms."""
    from collector.api.app import create_app
    from tests.embedded import serving
    from tests.real_vllm.conftest import free_port

    port = free_port()
    settings = Settings.model_validate({"data_dir": str(tmp_path / "llmslo")})
    vllm = VllmServer(
        vllm_python, tiny_model, log_path=tmp_path / "vllm.log", otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces"
    )
    with serving(create_app(settings, schedule=False), port):
        vllm.start()
        try:
            wait_idle(vllm)
            before = raw(vllm)
            # no client disconnect here: vLLM may count such a request finished yet export no span for it
            run_workload(vllm, disconnect=False)
            wait_idle(vllm)
            after = raw(vllm)
            delta = diff(after, before)
            finished = sum(v for (name, _), v in delta.items() if name == "vllm:request_success_total")

            def summary() -> dict[str, object]:
                r = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/requests/summary", params={"window": "1h", "measured_at": "engine"}
                )
                data: dict[str, object] = r.json()
                return data

            deadline = time.monotonic() + 30  # vLLM's BatchSpanProcessor exports every few seconds
            s = summary()
            while time.monotonic() < deadline and s["requests"] != finished:
                time.sleep(1)
                s = summary()
        finally:
            vllm.stop()
    assert s["requests"] == finished == delta[("vllm:time_to_first_token_seconds_count", ())]
    assert s["input_tokens"] == delta[("vllm:request_prompt_tokens_sum", ())]
    assert s["output_tokens"] == delta[("vllm:request_generation_tokens_sum", ())]
    # vLLM 0.32's span TTFT (gen_ai.latency.time_to_first_token) is measured on the engine's clock,
    # after tokenization; its histogram's TTFT starts at frontend arrival. The same name, two clocks:
    # the span values must never exceed the histogram's bucket for the same rank.
    ttft = s["latencies"]["ttft"]["quantiles_seconds"]  # type: ignore[index]
    assert s["latencies"]["ttft"]["count"] == finished  # type: ignore[index]
    for q in (0.5, 0.95):
        _lower, upper = bucket_for_rank(q, before, after, "vllm:time_to_first_token_seconds") or (0, 0)
        assert 0 < ttft[f"{q:g}"] <= upper * 1.01, (q, ttft, upper)
