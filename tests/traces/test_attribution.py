"""vLLM's own spans carry no model and no business type: they are attributed to the configured
target their resource names, and fields they do not carry are "not reported", never 0."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from collector.api.app import create_app
from collector.config import Settings
from collector.runtime import Runtime
from tests.targets import Behaviour, target_server
from tests.vllm_fixtures import FAMILIES, render, workload

MODEL = "acme/house-model-13b"  # served by the target; no rule lists it


class Capture(SpanExporter):
    """The SDK's own finished spans, encoded by the SDK's OTLP encoder (the exporter's payload)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[call-overload]
        return SpanExportResult.SUCCESS


def vllm_spans(resource: dict[str, str], n: int) -> bytes:
    """What vLLM 0.32 exports: `llm_request` with engine latencies and token counts, no model,
    no finish reason, no cached tokens."""
    capture = Capture()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(capture))
    tracer = provider.get_tracer("vllm.llm_engine")
    start = time.time_ns() - 5_000_000_000
    for i in range(n):
        span = tracer.start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=start + i,
            attributes={
                "gen_ai.request.id": f"cmpl-{i}",
                "gen_ai.usage.prompt_tokens": 100,
                "gen_ai.usage.completion_tokens": 11,
                "gen_ai.latency.time_to_first_token": 0.2,
                "gen_ai.latency.e2e": 1.2,
            },
        )
        span.end(end_time=start + i + 1_200_000_000)
    provider.shutdown()
    return encode_spans(capture.spans).SerializeToString()


def test_vllm_spans_are_attributed_to_the_target_their_resource_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = render(FAMILIES["0.33"], {(MODEL, "0"): workload(1)}).encode()
    with target_server({"/metrics": Behaviour(lambda: body)}) as srv:
        settings = Settings.model_validate(
            {
                "data_dir": str(tmp_path),
                "targets": [
                    {
                        "name": "vllm-0",
                        "url": srv.url("/metrics"),
                        "business_type": "chat",
                        "service_name": "vllm-chat",
                    },
                    {"name": "vllm-1", "url": srv.url("/metrics"), "business_type": "customer_service"},
                ],
            }
        )
        rt = Runtime(settings)
        app = create_app(settings, rt, schedule=False)

        async def run() -> dict[str, dict[str, object]]:
            async with app.router.lifespan_context(app):
                await rt.scrape_all_once()  # the targets' models come from their scrapes
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://llmslo") as client:
                    headers = {"Content-Type": "application/x-protobuf"}
                    batches = (
                        vllm_spans({"service.name": "vllm-chat"}, 4),  # by the target's service_name
                        vllm_spans({"service.name": "unknown_service:python", "llmslo.target": "vllm-1"}, 3),
                        vllm_spans({"service.name": "unknown_service:python"}, 2),  # names no target
                    )
                    for payload in batches:
                        resp = await client.post("/v1/traces", content=payload, headers=headers)
                        assert resp.status_code == 200, resp.text
                    out = {}
                    for bt in ("chat", "customer_service", "unassigned"):
                        r = await client.get("/api/v1/requests/summary", params={"business_type": bt})
                        out[bt] = r.json()
                    r = await client.get("/api/v1/requests/summary", params={"model": MODEL})
                    out["by_model"] = r.json()
                    return out

        out = asyncio.run(run())
    assert out["chat"]["requests"] == 4 and out["customer_service"]["requests"] == 3
    assert out["unassigned"]["requests"] == 2
    warned = [r.message for r in caplog.records if "belong to no business type" in r.message]
    assert len(warned) == 1 and "unknown_service:python" in warned[0]  # once, naming the source
    assert out["by_model"]["requests"] == 7  # both targets serve MODEL; the unattributed spans have none
    summary = out["chat"]
    assert summary["input_tokens"] == 400
    # vLLM's spans carry no cached-token count: the ratio is not reported, never 0
    assert summary["cache_hit_ratio"] is None and summary["cache_reported_share"] == 0.0
    reported = summary["fields_reported"]["engine"]
    assert reported["ttft"] == 1.0 and reported["cached_input_tokens"] == 0.0 and reported["finish_reason"] == 0.0
    # the model comes from the target (the one model its scrapes show)
    engine = summary["engine"]
    assert isinstance(engine, list) and [e["model"] for e in engine] == [MODEL]
