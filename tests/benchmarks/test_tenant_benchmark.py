"""Tenant cardinality: the request summary a user asks for while 100,000 distinct tenants (one
request each, LLMSLO_TENANTS) arrive over OTLP/HTTP within five minutes, next to the same
summary over a normal fleet's 100 tenants measured first in the same run; the server's RSS.

`traces.max_tenants_per_minute` (1,000) bounds what is stored per minute and business type (the
rest counted under tenant "other"), so the summary reads at most that many cells a minute.

Run: .venv/bin/python -m pytest tests/benchmarks/test_tenant_benchmark.py -s
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.sim.spans import TENANT_ATTRIBUTE
from tests.benchmarks.test_fleet_benchmark import ROOT, free_port, process, rss_mib, wait_http
from tests.benchmarks.test_trace_benchmark import template_batch

pytestmark = pytest.mark.benchmark


def batches(template: ExportTraceServiceRequest, tenants: list[str], first_id: int) -> list[bytes]:
    """One span per tenant, in batches of the template's size, ending within the last 4 minutes."""
    out = []
    spans_per = len(template.resource_spans[0].scope_spans[0].spans)
    now_ns = time.time_ns()
    for b in range(0, len(tenants), spans_per):
        req = ExportTraceServiceRequest()
        req.CopyFrom(template)
        for i, span in enumerate(req.resource_spans[0].scope_spans[0].spans):
            n = b + i
            tenant = tenants[n % len(tenants)]
            duration = span.end_time_unix_nano - span.start_time_unix_nano
            span.span_id = (first_id + n).to_bytes(8, "big")
            span.end_time_unix_nano = now_ns - 240_000_000_000 + (n * 2_000_000) % 200_000_000_000
            span.start_time_unix_nano = span.end_time_unix_nano - duration
            for kv in span.attributes:
                if kv.key == TENANT_ATTRIBUTE:
                    kv.value.string_value = tenant
        out.append(req.SerializeToString())
    return out


def timed(url: str, params: dict[str, str]) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        resp = httpx.get(url, params=params, timeout=120)
        times.append(time.perf_counter() - started)
        assert resp.status_code == 200, resp.text
    return statistics.median(times)


def test_summary_under_a_hundred_thousand_tenants(tmp_path: Path) -> None:
    n = int(os.environ.get("LLMSLO_TENANTS", "100000"))
    port = free_port()
    config = {"data_dir": str(tmp_path), "server": {"host": "127.0.0.1", "port": port}}
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    cmd = [str(Path(sys.executable).parent / "llmslo"), "serve", "--config", str(tmp_path / "llmslo.yaml")]
    base = f"http://127.0.0.1:{port}"
    template = template_batch(1000)
    headers = {"Content-Type": "application/x-protobuf"}
    with process(cmd, ROOT, tmp_path / "serve.log") as proc, httpx.Client(timeout=120) as client:
        wait_http(f"{base}/readyz", 60)
        rows = []
        for label, tenants, first in (
            ("100 tenants (baseline)", [f"t{i}" for i in range(100)], 1),
            (f"+ {n:,} distinct tenants", [f"tenant-{i:06d}" for i in range(n)], 10_000_000),
        ):
            sent = time.perf_counter()
            for body in batches(template, tenants, first):
                assert client.post(f"{base}/v1/traces", content=body, headers=headers).status_code == 200
            sent = time.perf_counter() - sent
            summary = timed(f"{base}/api/v1/requests/summary", {"window": "5m"})
            one = timed(f"{base}/api/v1/requests/summary", {"window": "5m", "tenant": tenants[-1]})
            metrics = httpx.get(f"{base}/metrics", timeout=60).text
            rows.append((label, sent, summary, one, rss_mib(proc.pid), metrics.count("\n")))
    print(f"\n{'':28}{'ingest':>9}{'summary 5m':>12}{'one tenant':>12}{'RSS':>9}{'/metrics lines':>16}")
    for label, sent, summary, one, rss, lines in rows:
        print(f"{label:28}{sent:>8.1f}s{summary * 1000:>10.0f}ms{one * 1000:>10.0f}ms{rss:>7.0f}MiB{lines:>16,}")
    ratio = rows[1][2] / rows[0][2]
    print(f"summary time with {n:,} tenants / with 100: {ratio:.1f}x")
    assert rows[1][2] < 1.0  # the bound: under a second
