"""Trace ingestion throughput: HTTP POSTs of 1,000-span protobuf batches into durable rollups
(`llmslo serve` in its own process, SQLite on disk), side by side with the decode-only ceiling
(ExportTraceServiceRequest.ParseFromString of the same batches) in the same run.

Run: .venv/bin/python -m pytest tests/benchmarks/test_trace_benchmark.py -s
(LLMSLO_BENCH_SECONDS sets how long the sustained run lasts, default 60; LLMSLO_BENCH_CONCURRENCY the
number of concurrent senders, default 4; LLMSLO_BENCH_DATABASE_URL another database than SQLite.)
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from collector.sim.scenario import load_scenario
from collector.sim.spans import span_attributes
from collector.traces import otlp
from collector.traces.normalize import wanted_attributes
from tests.integration.test_serve import free_port, wait_for

pytestmark = pytest.mark.benchmark
PROTOBUF = "application/x-protobuf"
ROOT = Path(__file__).resolve().parents[2]
BATCH_NS = 20_000_000


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


def make_batch(template: ExportTraceServiceRequest, b: int, t0_ns: int) -> bytes:
    """Batch number b: the template's spans with unique ids, ending in the 20 ms after t0 + b x 20 ms
    (time moves on as it does for a gateway sending 50,000 spans/s), durations kept."""
    req = ExportTraceServiceRequest()
    req.CopyFrom(template)
    spans = req.resource_spans[0].scope_spans[0].spans
    step = BATCH_NS // len(spans)
    for i, span in enumerate(spans):
        duration = span.end_time_unix_nano - span.start_time_unix_nano
        span.span_id = (b * 100_000 + i + 1).to_bytes(8, "big")  # unique: no deduplication shortcut
        span.end_time_unix_nano = t0_ns + b * BATCH_NS + i * step
        span.start_time_unix_nano = span.end_time_unix_nano - duration
    return req.SerializeToString()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_trace_ingestion_throughput(tmp_path: Path) -> None:
    seconds = float(os.environ.get("LLMSLO_BENCH_SECONDS", "60"))
    concurrency = int(os.environ.get("LLMSLO_BENCH_CONCURRENCY", "4"))
    template = template_batch()
    spans_per_batch = len(template.resource_spans[0].scope_spans[0].spans)
    t0_ns = time.time_ns() - 30 * 60 * 1_000_000_000
    decode_set = [make_batch(template, b, t0_ns) for b in range(50)]

    def rate_of(work: Callable[[bytes], object]) -> float:
        t = time.perf_counter()
        for body in decode_set:
            work(body)
        return len(decode_set) * spans_per_batch / (time.perf_counter() - t)

    wanted = wanted_attributes()
    decode_rate = rate_of(lambda body: ExportTraceServiceRequest().ParseFromString(body))
    in_process = [
        ("in-process: parse + span records, C scanner", rate_of(lambda body: otlp.decode(body, PROTOBUF, wanted)))
        if otlp._otlpscan is not None
        else ("in-process: C scanner not built", 0.0),
        (
            "in-process: parse + span records, pure Python",
            rate_of(lambda body: otlp.spans_of(ExportTraceServiceRequest.FromString(body), wanted)),
        ),
    ]

    port = free_port()
    cfg = tmp_path / "llmslo.yaml"
    database = os.environ.get("LLMSLO_BENCH_DATABASE_URL")  # e.g. a PostgreSQL URL; SQLite by default
    cfg.write_text(
        f"data_dir: {tmp_path / 'data'}\nrules: {ROOT / 'rules'}\n"
        + (f"database_url: {database}\n" if database else "")
    )
    proc = subprocess.Popen(
        [
            *os.environ.get("LLMSLO_BENCH_PREFIX", "").split(),
            sys.executable,
            "-m",
            "collector.cli",
            "serve",
            "--config",
            str(cfg),
            "--port",
            str(port),
        ],
        stdout=(tmp_path / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1/traces"
    batch_numbers = itertools.count(50)  # shared by the senders; next() is atomic under the GIL
    failures: list[str] = []
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200)
        for body in decode_set[:5]:  # warm up: first connections, compiled statements
            assert httpx.post(url, content=body, headers={"Content-Type": PROTOBUF}).status_code == 200

        progress = [0]  # spans acknowledged, by all senders

        def sender(deadline: float) -> int:
            sent = 0
            with httpx.Client(timeout=60) as client:
                while time.perf_counter() < deadline and not failures:
                    b = next(batch_numbers)
                    if b >= 100_000:  # bounded in count as well as time
                        break
                    r = client.post(url, content=make_batch(template, b, t0_ns), headers={"Content-Type": PROTOBUF})
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text}")
                        break
                    sent += spans_per_batch
                    with lock:
                        progress[0] += spans_per_batch
            return sent

        lock = threading.Lock()
        rss_before = rss_kib(proc.pid)
        cpu_start = cpu_seconds(proc.pid)
        start = time.perf_counter()
        samples = []  # (seconds, spans acknowledged, server CPU seconds, server RSS KiB), every second
        with ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(sender, start + seconds) for _ in range(concurrency)]
            while not all(f.done() for f in futures):
                time.sleep(1)
                samples.append((time.perf_counter() - start, progress[0], cpu_seconds(proc.pid), rss_kib(proc.pid)))
            sent = sum(f.result() for f in futures)
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(proc.pid) - cpu_start
        summary = httpx.get(f"http://127.0.0.1:{port}/api/v1/requests/summary", params={"window": "1h"}).json()
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert not failures, failures[:3]
    rate, per_core = sent / elapsed, sent / cpu
    print()
    print(f"{concurrency} senders, batches of {spans_per_batch} spans; {sent:,} spans in {elapsed:.0f} s")
    print(f"{'what':58} {'spans/s':>12} {'vs ceiling':>11}")
    print(f"{'decode only: ParseFromString (ceiling)':58} {decode_rate:12,.0f} {1.0:10.2f}x")
    print(f"{'llmslo: HTTP POST -> durable rollups, wall clock':58} {rate:12,.0f} {rate / decode_rate:10.2f}x")
    per_core_label = "llmslo: the same per CPU-second of the server (per core)"
    print(f"{per_core_label:58} {per_core:12,.0f} {per_core / decode_rate:10.2f}x")
    for label, value in in_process:
        print(f"{label:58} {value:12,.0f} {value / decode_rate:10.2f}x")
    store = {
        (x.labels["thread"], x.labels.get("le")): x.value
        for family in text_string_to_metric_families(metrics)
        for x in family.samples
        if x.name in ("llmslo_trace_batch_store_seconds_bucket", "llmslo_trace_batch_store_seconds_count")
    }
    for thread in ("event_loop", "worker"):
        n = store.get((thread, None), 0)
        if n:
            print(
                f"batches stored on the {thread} thread: {n:,.0f}; "
                f"under 25 ms: {store[(thread, '0.025')] / n:.1%}, under 100 ms: {store[(thread, '0.1')] / n:.1%}"
            )
    print(
        f"server CPU: {cpu:.1f} s in {elapsed:.1f} s ({cpu / elapsed:.2f} cores); "
        f"RSS before: {rss_before / 1024:.0f} MiB"
    )
    print(f"{'part of the run':>18} {'spans/s':>10} {'per core':>10} {'RSS MiB':>8} {'max RSS':>8}")
    fifth = max(1, len(samples) // 5)
    previous = (0.0, 0, cpu_start, rss_before)
    for i in range(0, len(samples) - fifth + 1, fifth):
        part = samples[i : i + fifth]
        end = part[-1]
        spans, wall, used = end[1] - previous[1], end[0] - previous[0], end[2] - previous[2]
        print(
            f"{previous[0]:7.0f} s - {end[0]:4.0f} s {spans / wall:10,.0f} {spans / max(used, 1e-9):10,.0f} "
            f"{end[3] / 1024:8.0f} {max(x[3] for x in part) / 1024:8.0f}"
        )
        previous = end
    assert summary["requests"] == sent + 5 * spans_per_batch  # every span stored once
