"""OTLP/gRPC against `llmslo serve` (a subprocess on loopback): spans exported by the real
opentelemetry-sdk gRPC exporter, ingest keys as gRPC metadata, and the status codes of the OTLP
specification for bad bodies and refused requests."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from collector.sim.spans import SpanEmitter
from tests.integration.test_serve import free_port
from tests.traces.test_ingest import KEY, Server, sim_requests

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def grpc_server(tmp_path: Path, keys: bool = False) -> tuple[Server, int]:
    s = Server(tmp_path, keys=keys)
    port = free_port()
    traces = f"{{otlp_grpc_port: {port}" + (f", ingest_keys: [{KEY}]}}" if keys else "}")
    text = s.config.read_text()
    if keys:  # Server(keys=True) already wrote a traces: line
        text = "\n".join(line for line in text.splitlines() if not line.startswith("traces:")) + "\n"
    s.config.write_text(text + f"traces: {traces}\n")
    s.start()
    return s, port


def call(port: int, body: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[grpc.StatusCode, bytes]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(EXPORT)  # raw bytes both ways
        try:
            reply, rpc = export.with_call(body, metadata=metadata, timeout=10)
            return rpc.code(), reply
        except grpc.RpcError as exc:
            return exc.code(), exc.details().encode()


def test_sdk_grpc_exporter_spans_are_counted_once(tmp_path: Path) -> None:
    s, port = grpc_server(tmp_path)
    try:
        requests = sim_requests(300)
        emitter = SpanEmitter(exporter=OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=30))
        for r in requests:
            emitter.emit(r)
        emitter.shutdown()
        summary = s.summary()
        assert summary["requests"] == 300
        assert summary["errors"] == sum(1 for r in requests if r.error_type)
        chat = s.summary(business_type="chat")
        assert chat["requests"] == sum(1 for r in requests if r.business_type == "chat")
        # a retried request (the same bytes again) counts once; an empty one is fine
        batch = ExportTraceServiceRequest()
        span = batch.resource_spans.add().scope_spans.add().spans.add()
        now = time.time_ns() - 1_000_000_000
        span.trace_id, span.span_id, span.name = b"\x07" * 16, b"\x08" * 8, "chat m"
        span.start_time_unix_nano, span.end_time_unix_nano = now - 500_000_000, now
        span.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
        for _ in range(2):
            code, reply = call(port, batch.SerializeToString())
            assert code == grpc.StatusCode.OK
            assert ExportTraceServiceResponse.FromString(reply).partial_success.rejected_spans == 0
        assert call(port, b"")[0] == grpc.StatusCode.OK
        assert s.summary()["requests"] == 301
        metrics = httpx.get(f"{s.base}/metrics").text
        assert 'llmslo_trace_export_requests_total{status="200",transport="grpc"}' in metrics
        # every stored batch is timed; with nothing else writing, on the event loop's own thread
        samples = {
            (x.name, x.labels.get("thread"), x.labels.get("le")): x.value
            for family in text_string_to_metric_families(metrics)
            for x in family.samples
            if x.name.startswith("llmslo_trace_batch_store_seconds")
        }
        stored = samples[("llmslo_trace_batch_store_seconds_count", "event_loop", None)]
        assert stored >= 2 and samples[("llmslo_trace_batch_store_seconds_bucket", "event_loop", "+Inf")] == stored
        assert 0 < samples[("llmslo_trace_batch_store_seconds_sum", "event_loop", None)] < stored * 2.5
    finally:
        out = s.stop()
    assert "Traceback" not in out


def test_grpc_status_codes_follow_the_otlp_specification(tmp_path: Path) -> None:
    s, port = grpc_server(tmp_path, keys=True)
    auth = (("authorization", f"Bearer {KEY}"),)
    try:
        code, details = call(port, b"\x0a\x05abc", auth)  # truncated protobuf
        assert code == grpc.StatusCode.INVALID_ARGUMENT and b"undecodable" in details
        assert call(port, b"")[0] == grpc.StatusCode.UNAUTHENTICATED
        assert call(port, b"", (("authorization", "Bearer wrong"),))[0] == grpc.StatusCode.UNAUTHENTICATED
        # a span that ends before it starts: accepted request, the span rejected with a reason
        bad = ExportTraceServiceRequest()
        span = bad.resource_spans.add().scope_spans.add().spans.add()
        span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "chat m"
        span.start_time_unix_nano, span.end_time_unix_nano = 2_000, 1_000
        span.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
        code, reply = call(port, bad.SerializeToString(), auth)
        partial = ExportTraceServiceResponse.FromString(reply).partial_success
        assert code == grpc.StatusCode.OK and partial.rejected_spans == 1 and "ends before" in partial.error_message
        # over traces.max_body_bytes: gRPC refuses it before llmslo reads it
        code, _ = call(port, b"\x00" * (16 * 1024 * 1024 + 1), auth)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # the SDK exporter with the key as a header
        exporter = OTLPSpanExporter(
            endpoint=f"127.0.0.1:{port}", insecure=True, headers={"authorization": f"Bearer {KEY}"}
        )
        emitter = SpanEmitter(exporter=exporter)
        for r in sim_requests(20):
            emitter.emit(r)
        emitter.shutdown()
        assert s.summary()["requests"] == 20
        # without the key the exporter fails at once (UNAUTHENTICATED is not retryable) and nothing is stored
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        provider.get_tracer("t").start_span("chat m", attributes={"gen_ai.operation.name": "chat"}).end()
        unauthorized = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=5)
        assert unauthorized.export(memory.get_finished_spans()) == SpanExportResult.FAILURE
        assert s.summary()["requests"] == 20
    finally:
        out = s.stop()
    assert KEY not in out and "Traceback" not in out


def test_a_grpc_port_without_grpcio_is_a_configuration_error(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    from collector.cli import main

    config = tmp_path / "llmslo.yaml"
    config.write_text(f"data_dir: {tmp_path}\ntraces: {{otlp_grpc_port: 4317}}\n")
    assert main(["check-config", "--config", str(config)]) == 0
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    assert main(["check-config", "--config", str(config)]) == 2
    assert "traces.otlp_grpc_port" in capsys.readouterr().err
    assert main(["serve", "--config", str(config)]) == 2  # refused before anything starts
    assert "pip install 'llmslo[grpc]'" in capsys.readouterr().err
