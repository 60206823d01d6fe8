"""Hostile and broken spans: one bad value rejects its span through partial_success, never the
batch (OTLP clients do not retry a 500); values the database cannot hold never reach it. On
SQLite and on PostgreSQL, through the real app."""

from __future__ import annotations

import asyncio
import json
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


def test_invalid_unicode_is_refused_with_the_body_and_never_reaches_the_database(app_client) -> None:  # type: ignore[no-untyped-def]
    # protobuf: the UTF-8 bytes of a lone surrogate (invalid UTF-8) as one span's tenant
    proto = batch({"llmslo.tenant": "ZZZZ"}).replace(b"ZZZZ", b"\xed\xb3\xbfZ")
    # JSON: a "\udcff" escape is valid JSON but not valid Unicode
    spans = [
        {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "chat m",
         "startTimeUnixNano": str(NOW_NS), "endTimeUnixNano": str(NOW_NS + 500_000_000),
         "attributes": [{"key": "llmslo.tenant", "value": {"stringValue": "SURROGATE" if i == 0 else "acme"}},
                        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}}]}
        for i in range(100)
    ]  # fmt: skip
    text = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).replace("SURROGATE", "t\\udcff")
    p, j, summary = app_client(
        ("POST", "/v1/traces", proto, PROTO), ("POST", "/v1/traces", text.encode(), "application/json"), SUMMARY
    )
    assert p.status_code == 400 and "bad UTF-8" in p.text
    assert j.status_code == 400 and "surrogate" in j.text.lower()
    assert summary.json()["requests"] == 0  # (and a 400 is not retried: the client hears why)


def test_a_value_the_database_refuses_rejects_that_span_alone(app_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a refusal llmslo's validation did not foresee (here: the driver raising for one tenant)
    import collector.traces.service as service

    real = service.ingest

    def refusing(store, records, targets, sink=None):  # type: ignore[no-untyped-def]
        if any(r.tenant == "poison" for r in records):
            raise ValueError("the driver cannot encode this value")
        return real(store, records, targets, sink)

    monkeypatch.setattr(service, "ingest_now", lambda *a, **k: None)  # the worker-thread path
    monkeypatch.setattr(service, "ingest", refusing)
    resp, summary = app_client(("POST", "/v1/traces", batch({"llmslo.tenant": "poison"}), PROTO), SUMMARY)
    assert resp.status_code == 200, resp.text
    partial = ExportTraceServiceResponse()
    partial.ParseFromString(resp.content)
    assert partial.partial_success.rejected_spans == 1
    assert "refused by the database (ValueError)" in partial.partial_success.error_message
    assert summary.json()["requests"] == 99


def test_a_fault_inside_llmslo_is_a_counted_500(app_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from collector.traces.cardinality import CardinalityGuard

    def broken(self, records):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug")

    monkeypatch.setattr(CardinalityGuard, "apply", broken)
    resp, metrics = app_client(("POST", "/v1/traces", batch({}), PROTO), ("GET", "/metrics", b"", ""))
    assert resp.status_code == 500 and "nothing of this request was stored" in resp.text
    assert 'llmslo_trace_export_requests_total{status="500",transport="http"} 1.0' in metrics.text


def test_the_normaliser_refuses_a_lone_surrogate_whatever_decoded_it() -> None:
    from collector.traces.normalize import Rejected, _str

    assert _str({"llmslo.tenant": "café"}, ("llmslo.tenant",)) == "café"
    with pytest.raises(Rejected, match="lone surrogate"):
        _str({"llmslo.tenant": "t\udcff"}, ("llmslo.tenant",))
