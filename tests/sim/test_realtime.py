"""Real-time mode: replicas as real HTTP servers, an OpenAI client, OTLP spans, the demo."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.demo import run_demo
from collector.sim.scenario import load_scenario, parse_scenario
from collector.sim.server import Simulation
from collector.sim.spans import SpanEmitter
from collector.sources.dcgm import read_dcgm
from collector.sources.vllm import SeriesKey, read_scrape
from tests.receivers import PostRecorder

HEALTHY = Path(__file__).resolve().parents[2] / "collector" / "data" / "scenario-healthy.yaml"


class OtlpReceiver(PostRecorder):
    """A minimal OTLP/HTTP trace receiver: decodes ExportTraceServiceRequest protobuf bodies."""

    @property
    def endpoint(self) -> str:
        return f"{self.base}/v1/traces"

    @property
    def spans(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for post in self.posts:
            req = ExportTraceServiceRequest()
            req.ParseFromString(post.body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(
                            {
                                "name": span.name,
                                "attrs": {a.key: a.value for a in span.attributes},
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                            }
                        )
        return out


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def test_replicas_serve_metrics_and_an_openai_api_with_simulated_timing(receiver: OtlpReceiver) -> None:
    async def run() -> None:
        emitter = SpanEmitter(receiver.endpoint)
        sim = Simulation(load_scenario("healthy"), builtin_workload=False, emitter=emitter)
        await sim.start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                models = (await client.get(sim.url("chat-0", "/v1/models"))).json()
                model = models["data"][0]["id"]
                assert model == "meta-llama/Llama-3.1-8B-Instruct"
                t0 = time.monotonic()
                resp = await client.post(
                    sim.url("chat-0", "/v1/chat/completions"),
                    json={
                        "model": model,
                        "messages": [{"role": "user", "content": "hello " * 50}],
                        "max_tokens": 30,
                        "ignore_eos": True,
                    },
                )
                elapsed = time.monotonic() - t0
                body = resp.json()
                assert resp.status_code == 200 and body["usage"]["completion_tokens"] == 30
                # 29 decode steps of >= 15 ms each on the chat deployment
                assert elapsed >= 29 * 0.015 * 0.9
                chunks, first = [], None
                t0 = time.monotonic()
                async with client.stream(
                    "POST",
                    sim.url("chat-0", "/v1/completions"),
                    json={"prompt": "stream this", "max_tokens": 12, "stream": True, "ignore_eos": True},
                ) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            first = first or time.monotonic() - t0
                            chunks.append(json.loads(line[6:]))
                assert len(chunks) == 12 and chunks[-1]["choices"][0]["finish_reason"] == "length"
                bad = await client.post(sim.url("chat-0", "/v1/completions"), json={"prompt": "x", "max_tokens": 99999})
                assert bad.status_code == 400
                text = (await client.get(sim.url("chat-0"))).text
                gpu = read_dcgm((await client.get(sim.url("chat-0", "/dcgm/metrics"))).text)
            # the DCGM exporter beside the replica: vLLM's reservation of its 24 GB GPU, idle now
            assert gpu.gauges[SeriesKey("gpu0", "gpu_memory_used_ratio")] > 0.9
            assert gpu.gauges[SeriesKey("gpu0", "gpu_engine_active")] == 0.0
            snap = read_scrape(text)
            success = sum(v for k, v in snap.counters.items() if k.metric == "request_success")
            assert success == 2  # the two requests this test sent; the 400 never reached the engine
        finally:
            await sim.stop()
            emitter.shutdown()

    asyncio.run(run())
    names = sorted(s["name"] for s in receiver.spans)
    assert names == ["chat meta-llama/Llama-3.1-8B-Instruct", "chat meta-llama/Llama-3.1-8B-Instruct"]
    attrs = receiver.spans[0]["attrs"]
    assert attrs["gen_ai.usage.input_tokens"].int_value > 0  # type: ignore[index, union-attr]
    assert attrs["gen_ai.response.time_to_first_chunk"].double_value > 0  # type: ignore[index, union-attr]
    assert attrs["llmslo.business_type"].string_value == "chat"  # type: ignore[index, union-attr]


def test_a_down_replica_refuses_connections_and_comes_back() -> None:
    text = HEALTHY.read_text() + "incidents:\n  - {kind: replica_down, start: 4s, duration: 2s, target: code-0}\n"
    scenario = parse_scenario(text)

    async def run() -> list[str]:
        sim = Simulation(scenario, builtin_workload=False)
        await sim.start()
        seen = []
        try:
            url = sim.url("code-0")
            async with httpx.AsyncClient(timeout=2) as client:
                for _ in range(90):
                    try:
                        seen.append(str((await client.get(url)).status_code))
                    except httpx.TransportError:  # refused, or reset while the server stops
                        seen.append("refused")
                    await asyncio.sleep(0.1)
        finally:
            await sim.stop()
        return seen

    seen = asyncio.run(run())
    assert seen[0] == "200" and "refused" in seen and seen[-1] == "200"


def test_demo_runs_the_simulator_and_the_collector_together(tmp_path: Path) -> None:
    scenario = load_scenario("healthy")
    result = asyncio.run(run_demo(scenario, port=0, data_dir=str(tmp_path), duration=14, live=False))
    report = result.report
    assert report is not None
    ttft = next(s for s in result.slos if s.objective.slo == "chat-ttft")  # the shipped rules are evaluated
    # on the demo's compressed clock: the 5m..3d burn windows last 5 s..72 min
    assert min(ttft.windows) == 5.0 and max(ttft.windows) == 72 * 60
    assert ttft.windows[60.0].events.total > 0  # the 1h window, a minute long here
    types = {b.business_type: b.stats for b in report.business_types}
    assert set(types) == {"chat", "customer_service", "code_completion", "batch"}
    assert types["chat"].requests and types["chat"].latencies["ttft"].count > 0
