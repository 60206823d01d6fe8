"""Unbounded tenants and business types in spans stay bounded in memory, rollups and /metrics:
nothing is lost (every request is counted), the excess is folded and counted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.api.app import create_app
from collector.config import Settings
from collector.runtime import Runtime


def spans(n: int, offset: int, attrs_of) -> bytes:  # type: ignore[no-untyped-def]
    now = time.time_ns() - 2_000_000_000
    req = ExportTraceServiceRequest()
    out = req.resource_spans.add().scope_spans.add()
    for i in range(offset, offset + n):
        s = out.spans.add()
        s.trace_id, s.span_id, s.name = (i + 1).to_bytes(16, "big"), (i + 1).to_bytes(8, "big"), "chat m"
        s.start_time_unix_nano, s.end_time_unix_nano = now, now + 100_000_000
        for k, v in {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", **attrs_of(i)}.items():
            kv = s.attributes.add()
            kv.key, kv.value.string_value = k, v
    return req.SerializeToString()


def test_tenants_and_business_types_are_bounded_and_every_request_counted(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {"data_dir": str(tmp_path), "traces": {"max_tenants_per_minute": 50, "top_tenants": 5}}
    )
    rt = Runtime(settings)
    app = create_app(settings, rt, schedule=False)

    def attrs(i: int) -> dict[str, str]:
        # 2,000 tenants of chat; 500 requests of 500 made-up business types
        if i < 2000:
            return {"llmslo.business_type": "chat", "llmslo.tenant": f"tenant-{i}"}
        return {"llmslo.business_type": f"made-up-{i}", "llmslo.tenant": "x"}

    async def run() -> tuple[dict[str, object], float, str]:
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://l") as c:
            for offset in range(0, 2500, 500):
                r = await c.post(
                    "/v1/traces", content=spans(500, offset, attrs), headers={"Content-Type": "application/x-protobuf"}
                )
                assert r.status_code == 200, r.text
            started = time.perf_counter()
            summary = (await c.get("/api/v1/requests/summary", params={"window": "5m"})).json()
            elapsed = time.perf_counter() - started
            rt.refresh_snapshot(time.time())
            metrics = (await c.get("/metrics")).text
        return summary, elapsed, metrics

    summary, elapsed, metrics = asyncio.run(run())
    assert summary["requests"] == 2500  # nothing lost
    tenants = summary["tenants"]
    assert isinstance(tenants, dict) and len(tenants) <= 51 + 1 and tenants["other"] >= 1950
    assert rt.traces.guard.folded["business_type"] == 500 and rt.traces.guard.folded["tenant"] >= 1950
    assert elapsed < 1.0
    business_lines = {
        line.split("business_type=")[1].split('"')[1] for line in metrics.splitlines() if "business_type=" in line
    }
    assert not any(b.startswith("made-up") for b in business_lines)
    assert 'llmslo_trace_values_folded_total{field="business_type"} 500.0' in metrics
