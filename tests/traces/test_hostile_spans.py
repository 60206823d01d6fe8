"""Hostile and broken spans: one bad value rejects its span through partial_success, never the
batch (OTLP clients do not retry a 500); values the database cannot hold never reach it. On
SQLite and on PostgreSQL, through the real app."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from collector.api.app import create_app
from collector.config import Settings
from collector.runtime import Runtime

NOW_NS = time.time_ns() - 2_000_000_000
GOOD = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "m",
    "gen_ai.usage.input_tokens": 10,
    "gen_ai.usage.output_tokens": 5,
    "llmslo.business_type": "chat",
}


def batch(bad: dict[str, object], good: int = 99, end_ns: int | None = None) -> bytes:
    """`good` well-formed spans and one carrying the `bad` attributes (over the good ones)."""
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add()
    for i in range(good + 1):
        s = spans.spans.add()
        s.trace_id = (i + 1).to_bytes(16, "big")
        s.span_id = (i + 1).to_bytes(8, "big")
        s.name = "chat m"
        s.start_time_unix_nano = NOW_NS
        s.end_time_unix_nano = NOW_NS + 500_000_000 if i or end_ns is None else end_ns
        for key, value in {**GOOD, **(bad if i == 0 else {})}.items():
            kv = s.attributes.add()
            kv.key = key
            if isinstance(value, bool):
                kv.value.bool_value = value
            elif isinstance(value, int):
                kv.value.int_value = value
            elif isinstance(value, float):
                kv.value.double_value = value
            else:
                kv.value.string_value = str(value)
    return req.SerializeToString()


@pytest.fixture
def app_client(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings.model_validate({"data_dir": str(tmp_path), "database_url": db_url})
    rt = Runtime(settings)
    app = create_app(settings, rt, schedule=False)

    def call(*requests: tuple[str, str, bytes, str]) -> list[httpx.Response]:
        async def run() -> list[httpx.Response]:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://llmslo") as client:
                    out = []
                    for method, path, body, ctype in requests:
                        out.append(await client.request(method, path, content=body, headers={"Content-Type": ctype}))
                    return out

        return asyncio.run(run())

    return call


PROTO = "application/x-protobuf"
SUMMARY = ("GET", "/api/v1/requests/summary?window=1h", b"", "")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"gen_ai.usage.input_tokens": float("nan")}, "expected a number"),
        ({"gen_ai.usage.output_tokens": float("inf")}, "expected a number"),
        ({"gen_ai.usage.input_tokens": "nan"}, "expected a number"),
        ({"gen_ai.usage.input_tokens": -5}, "expected a number"),
        ({"gen_ai.usage.output_tokens": 1e300}, "expected a number"),
        ({"gen_ai.response.time_to_first_chunk": -0.5}, "expected a number"),
        ({"gen_ai.usage.cache_read.input_tokens": 50}, "exceed the 10 input tokens"),
        ({"llmslo.tenant": "t" * 257}, "limit 256"),
        ({"gen_ai.request.model": "m" * 513}, "limit 512"),
        ({"llmslo.business_type": "b" * 129}, "limit 128"),
        ({"llmslo.tenant": "a\x00b"}, "NUL"),
    ],
)
def test_one_bad_value_rejects_its_span_and_the_other_99_are_stored(
    app_client, bad: dict[str, object], reason: str
) -> None:  # type: ignore[no-untyped-def]
    resp, summary = app_client(("POST", "/v1/traces", batch(bad), PROTO), SUMMARY)
    assert resp.status_code == 200, resp.text
    partial = ExportTraceServiceResponse()
    partial.ParseFromString(resp.content)
    assert partial.partial_success.rejected_spans == 1
    assert reason in partial.partial_success.error_message
    assert summary.json()["requests"] == 99


def test_a_span_far_in_the_future_is_rejected(app_client) -> None:  # type: ignore[no-untyped-def]
    year_2262 = 9_200_000_000 * 10**9
    resp, summary = app_client(("POST", "/v1/traces", batch({}, end_ns=year_2262), PROTO), SUMMARY)
    partial = ExportTraceServiceResponse()
    partial.ParseFromString(resp.content)
    assert resp.status_code == 200 and partial.partial_success.rejected_spans == 1
    assert "after the collector's clock" in partial.partial_success.error_message
    assert summary.json()["requests"] == 99


def test_deeply_nested_json_is_a_400_not_a_500(app_client) -> None:  # type: ignore[no-untyped-def]
    nested = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp, summary = app_client(("POST", "/v1/traces", nested, "application/json"), SUMMARY)
    assert resp.status_code == 400 and "nested too deeply" in resp.text
    assert summary.json()["requests"] == 0
