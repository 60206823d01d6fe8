"""Trace ingestion throughput: HTTP POSTs of 1,000-span protobuf batches into durable rollups
(`llmslo serve` in its own process, SQLite on disk), side by side with the decode-only ceiling
(ExportTraceServiceRequest.ParseFromString of the same batches) in the same run.

Run: .venv/bin/python -m pytest tests/benchmarks/test_trace_benchmark.py -s
(LLMSLO_BENCH_SECONDS sets how long the sustained run lasts; default 60.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collector.sim.scenario import load_scenario
from collector.sim.spans import span_attributes
from tests.integration.test_serve import free_port, wait_for

pytestmark = pytest.mark.benchmark
ROOT = Path(__file__).resolve().parents[2]


def template_batch(n: int = 1000) -> ExportTraceServiceRequest:
    """1,000 realistic gateway spans made through the SDK, from simulated requests."""
    fleet = load_scenario("healthy").fleet()
    done = []
    fleet.on_finish.append(done.append)
    while len(done) < n:
        fleet.advance(fleet.now + 60)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    base = time.time_ns() - 600_000_000_000
    for r in done[:n]:
        span = tracer.start_span(
            f"chat {r.model}", start_time=base + int(r.arrival * 1e9), attributes=span_attributes(r)
        )
        span.end(end_time=base + int(r.finished * 1e9))
    return encode_spans(memory.get_finished_spans())


def batches(template: ExportTraceServiceRequest, count: int) -> list[bytes]:
    out = []
    for b in range(count):
        req = ExportTraceServiceRequest()
        req.CopyFrom(template)
        for i, span in enumerate(req.resource_spans[0].scope_spans[0].spans):
            span.span_id = (b * 100_000 + i + 1).to_bytes(8, "big")  # unique: no deduplication shortcut
        out.append(req.SerializeToString())
    return out


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_trace_ingestion_throughput(tmp_path: Path) -> None:
    seconds = float(os.environ.get("LLMSLO_BENCH_SECONDS", "60"))
    template = template_batch()
    spans_per_batch = len(template.resource_spans[0].scope_spans[0].spans)
    decode_set = batches(template, 50)
    t0 = time.perf_counter()
    for body in decode_set:
        ExportTraceServiceRequest().ParseFromString(body)
    decode_rate = len(decode_set) * spans_per_batch / (time.perf_counter() - t0)

    port = free_port()
    cfg = tmp_path / "llmslo.yaml"
    cfg.write_text(f"data_dir: {tmp_path / 'data'}\nrules: {ROOT / 'rules'}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "serve", "--config", str(cfg), "--port", str(port)],
        stdout=(tmp_path / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{base}/readyz").status_code == 200)
        sent = 0
        rss = []
        pool = batches(template, 40)
        with httpx.Client(timeout=60) as client:
            start = time.perf_counter()
            b = 0
            while time.perf_counter() - start < seconds and b < 100_000:  # bounded in time and count
                if b and b % len(pool) == 0:
                    pool = [_rekey(x, b) for x in pool]
                r = client.post(
                    f"{base}/v1/traces", content=pool[b % len(pool)], headers={"Content-Type": "application/x-protobuf"}
                )
                assert r.status_code == 200, r.text
                sent += spans_per_batch
                b += 1
                if b % 20 == 0:
                    rss.append(rss_kib(proc.pid))
            elapsed = time.perf_counter() - start
        stored = httpx.get(f"{base}/api/v1/requests/summary", params={"window": "1h"}).json()["requests"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    rate = sent / elapsed
    print()
    print(f"batches of {spans_per_batch} spans; {sent:,} spans in {elapsed:.0f} s; stored {stored:,}")
    print(f"{'what':60} {'spans/s':>12} {'vs ceiling':>11}")
    print(f"{'decode only: ParseFromString (ceiling)':60} {decode_rate:12,.0f} {1.0:10.2f}x")
    print(
        f"{'llmslo end to end: HTTP POST -> durable rollups (1 process)':60} {rate:12,.0f} {rate / decode_rate:10.2f}x"
    )
    if rss:
        print(
            f"server RSS: first {rss[0] / 1024:.0f} MiB, last {rss[-1] / 1024:.0f} MiB, max {max(rss) / 1024:.0f} MiB"
        )
    assert stored > 0


def _rekey(body: bytes, offset: int) -> bytes:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    for span in req.resource_spans[0].scope_spans[0].spans:
        span.span_id = (int.from_bytes(span.span_id, "big") + offset * 1_000_000).to_bytes(8, "big")
    return req.SerializeToString()
