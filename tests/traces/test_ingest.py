"""OTLP ingestion against `llmslo serve` (a subprocess on loopback): payloads from the real
opentelemetry-sdk exporter, vLLM's span shape, OTLP JSON, malformed bodies, retries, kill -9."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from collector.sim.model import Request
from collector.sim.spans import SpanEmitter
from tests.integration.test_serve import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
KEY = "s3cret-ingest-key"


class Server:
    def __init__(self, tmp: Path, keys: bool = False) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "llmslo.yaml"
        self.config.write_text(
            f"data_dir: {tmp / 'data'}\nrules: {ROOT / 'rules'}\n"
            + (f"traces: {{ingest_keys: [{KEY}]}}\n" if keys else "")
        )
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = {**os.environ, "LLMSLO_SERVER__PORT": str(self.port)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector.cli", "serve", "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            wait_for(lambda: httpx.get(f"{self.base}/readyz").status_code == 200)
        except AssertionError:
            if self.proc.poll() is None:  # not ready in time: stopped, not left running after the test
                self.proc.kill()
                out, _ = self.proc.communicate(timeout=5)
                raise AssertionError(f"llmslo serve was not ready in time:\n{out[-3000:]}") from None
            out, _ = self.proc.communicate(timeout=5)
            raise AssertionError(f"llmslo serve exited with {self.proc.returncode}:\n{out[-3000:]}") from None

    def stop(self, sig: int = signal.SIGINT) -> str:
        assert self.proc is not None
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=20)
        return out

    def summary(self, **params: str) -> dict[str, object]:
        r = httpx.get(f"{self.base}/api/v1/requests/summary", params={"window": "1h", **params})
        assert r.status_code == 200, r.text
        data: dict[str, object] = r.json()
        return data


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    s.start()
    yield s
    if s.proc and s.proc.poll() is None:
        s.stop()


def sim_requests(n: int, seed: int = 3) -> list[Request]:
    rng = random.Random(seed)
    now = time.time() - 30
    out = []
    for i in range(n):
        ttft = rng.lognormvariate(math.log(0.4), 0.6)
        tokens = rng.randint(2, 300)
        tpot = rng.uniform(0.01, 0.08)
        r = Request(
            id=i,
            business_type=rng.choice(["chat", "code_completion"]),
            tenant=rng.choice(["acme", "globex"]),
            arrival=now + i * 0.01,
            prompt_tokens=rng.randint(10, 2000),
            system_tokens=0,
            system_prompt=0,
            output_tokens=tokens,
            max_tokens=512,
            stream=True,
        )
        r.model = "meta-llama/Llama-3.1-8B-Instruct" if r.business_type == "chat" else "Qwen/Qwen2.5-Coder-7B-Instruct"
        r.replica, r.cached_tokens, r.reason = "gw", rng.randint(0, r.prompt_tokens), "stop"
        r.admitted = r.arrival
        r.first_token = r.arrival + ttft
        r.finished = r.first_token + (tokens - 1) * tpot
        if i % 20 == 0:
            r.error_type, r.reason = "connection_refused", "error"
        out.append(r)
    return out


def export(server: Server, requests: list[Request]) -> None:
    emitter = SpanEmitter(f"{server.base}/v1/traces")
    for r in requests:
        emitter.emit(r)
    emitter.shutdown()


def test_sdk_exported_gateway_spans_give_exact_counts_and_percentiles(server: Server) -> None:
    reqs = sim_requests(2000)
    export(server, reqs)
    deadline = time.monotonic() + 20  # an export the SDK had to retry may land a little later
    s = server.summary()
    while s["requests"] != 2000 and time.monotonic() < deadline:
        time.sleep(0.5)
        s = server.summary()
    assert s["requests"] == 2000, {k: s[k] for k in ("requests", "errors", "measured_at", "tenants")}
    assert s["errors"] == sum(1 for r in reqs if r.error_type)
    assert s["input_tokens"] == sum(r.prompt_tokens for r in reqs)
    assert s["output_tokens"] == sum(0 if r.error_type else r.output_tokens for r in reqs)
    assert s["cached_input_tokens"] == sum(r.cached_tokens for r in reqs)
    ok = [r for r in reqs if not r.error_type]
    for q in (0.5, 0.95, 0.99):
        exact = float(np.quantile([r.ttft for r in ok], q, method="lower"))
        got = s["latencies"]["ttft"]["quantiles_seconds"][f"{q:g}"]  # type: ignore[index]
        assert abs(got - exact) / exact <= 0.01, (q, got, exact)
    chat = server.summary(business_type="chat")
    n_chat = sum(1 for r in reqs if r.business_type == "chat")
    assert chat["requests"] == n_chat
    # joint goodput: TTFT <= 1 s and TPOT <= 66 ms for the same request (chat's latency objectives)
    good = sum(
        1
        for r in reqs
        if r.business_type == "chat"
        and not r.error_type
        and r.ttft <= 1.0
        and (r.output_tokens < 2 or (r.e2e - r.ttft) / (r.output_tokens - 1) <= 0.066)
    )
    assert chat["goodput_ratio"] == pytest.approx(good / n_chat)
    assert set(server.summary(tenant="acme")["tenants"]) == {"acme"}  # type: ignore[arg-type]


def test_vllm_llm_request_spans_are_engine_measured(server: Server) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.base}/v1/traces")))
    tracer = provider.get_tracer("vllm.llm_engine")
    start = time.time_ns() - 5_000_000_000
    for i in range(10):
        span = tracer.start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=start,
            attributes={
                "gen_ai.request.id": f"cmpl-{i}",
                "gen_ai.usage.prompt_tokens": 100,
                "gen_ai.usage.completion_tokens": 21,
                "gen_ai.latency.time_to_first_token": 0.2,
                "gen_ai.latency.e2e": 1.2,
                "gen_ai.latency.time_in_queue": 0.05,
                "gen_ai.latency.time_in_model_prefill": 0.15,
            },
        )
        span.end(end_time=start + 1_200_000_000)
    provider.shutdown()
    s = server.summary(measured_at="engine")
    assert s["requests"] == 10 and s["input_tokens"] == 1000 and s["output_tokens"] == 210
    tpot = s["latencies"]["tpot"]["quantiles_seconds"]["0.5"]  # type: ignore[index]
    assert tpot == pytest.approx((1.2 - 0.2) / 20, rel=0.01)
    assert s["latencies"]["queue"]["count"] == 10  # type: ignore[index]


def otlp_json(trace_id: str, span_id: str, start_ns: int, end_ns: int, **attrs: object) -> bytes:
    def value(v: object) -> dict[str, object]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": str(v)}

    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": "chat m",
        "kind": 3,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()],
    }
    return json.dumps(
        {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}
    ).encode()


def post(server: Server, body: bytes, ctype: str = "application/json", **headers: str) -> httpx.Response:
    return httpx.post(f"{server.base}/v1/traces", content=body, headers={"Content-Type": ctype, **headers})


def good_json(i: int = 1) -> bytes:
    now = time.time_ns() - 2_000_000_000
    return otlp_json(
        f"{i:032x}",
        f"{i:016x}",
        now,
        now + 500_000_000,
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m",
            "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 5,
        },
    )


def test_otlp_json_gzip_and_deflate_bodies_are_accepted_and_retries_count_once(server: Server) -> None:
    first = good_json(1)
    assert post(server, first).status_code == 200
    assert post(server, gzip.compress(good_json(2)), **{"Content-Encoding": "gzip"}).status_code == 200
    assert post(server, zlib.compress(good_json(3)), **{"Content-Encoding": "deflate"}).status_code == 200
    assert server.summary()["requests"] == 3
    retry = post(server, first)  # the same spans again: a retried batch
    assert retry.status_code == 200 and json.loads(retry.text) == {}
    assert server.summary()["requests"] == 3


@pytest.mark.parametrize(
    ("body", "ctype", "status", "fragment"),
    [
        (lambda: good_json(9)[:-7], "application/json", 400, "invalid OTLP JSON"),
        (lambda: b"\x0a\xff\xff\xff", "application/x-protobuf", 400, "undecodable protobuf"),
        (lambda: good_json(9), "text/plain", 415, "unsupported Content-Type"),
        (
            lambda: b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            "application/json",
            400,
            "is not hex",
        ),
    ],
)
def test_undecodable_bodies_get_their_status_and_change_nothing(
    server: Server,
    body,
    ctype: str,
    status: int,  # type: ignore[no-untyped-def]
    fragment: str,
) -> None:
    assert post(server, good_json(1)).status_code == 200
    before = counts(server.summary())
    r = post(server, body(), ctype)
    assert r.status_code == status and fragment in r.text
    assert counts(server.summary()) == before


def counts(summary: dict[str, object]) -> dict[str, object]:
    """A summary without its period, which moves on when a minute turns between two reads."""
    return {k: v for k, v in summary.items() if k not in ("start_unix", "end_unix")}


def test_bad_spans_are_rejected_with_partial_success(server: Server) -> None:
    now = time.time_ns() - 2_000_000_000
    cases = [
        otlp_json(
            "a" * 32, "1" * 16, now, now + 10, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m" * 70_000}
        ),
        otlp_json("b" * 32, "2" * 16, 0, 0, **{"gen_ai.operation.name": "chat"}),
        otlp_json("c" * 32, "3" * 16, now, now - 1_000, **{"gen_ai.operation.name": "chat"}),
    ]
    reasons = []
    for body in cases:
        r = post(server, body)
        assert r.status_code == 200
        partial = json.loads(r.text)["partialSuccess"]
        assert partial["rejectedSpans"] == "1"
        reasons.append(partial["errorMessage"])
    assert "characters long" in reasons[0] and "missing start or end" in reasons[1] and "ends before" in reasons[2]
    assert server.summary()["requests"] == 0
    # a huge attribute llmslo does not read (captured prompt content) costs nothing and rejects nothing
    big = {"gen_ai.operation.name": "chat", "gen_ai.prompt": "x" * 70_000}
    prompt = otlp_json("d" * 32, "4" * 16, now, now + 10, **big)
    r = post(server, prompt)
    assert r.status_code == 200 and "partialSuccess" not in json.loads(r.text)
    assert server.summary()["requests"] == 1
    proto = ExportTraceServiceRequest()
    rs = proto.resource_spans.add().scope_spans.add().spans.add()
    rs.trace_id, rs.span_id, rs.name = b"\x01" * 16, b"\x02" * 8, "chat m"
    r = post(server, proto.SerializeToString(), "application/x-protobuf")
    resp = ExportTraceServiceResponse()
    resp.ParseFromString(r.content)
    assert r.status_code == 200 and resp.partial_success.rejected_spans == 0  # not an LLM span: ignored


def test_a_2xx_survives_kill_9(tmp_path: Path) -> None:
    s = Server(tmp_path)
    s.start()
    try:
        batch = good_json(42)
        assert post(s, batch).status_code == 200
        s.stop(signal.SIGKILL)  # right after the answer: nothing may be lost
        s.start()
        assert s.summary()["requests"] == 1
        assert post(s, batch).status_code == 200  # a retry after the crash still counts once
        assert s.summary()["requests"] == 1
    finally:
        if s.proc and s.proc.poll() is None:
            s.stop()


def test_ingest_keys(tmp_path: Path) -> None:
    s = Server(tmp_path, keys=True)
    s.start()
    try:
        assert post(s, good_json(1)).status_code == 401
        assert post(s, good_json(1), Authorization="Bearer wrong").status_code == 401
        assert post(s, good_json(1), Authorization=f"Bearer {KEY}").status_code == 200
        metrics = httpx.get(f"{s.base}/metrics").text
        assert KEY not in metrics
    finally:
        out = s.stop()
    assert KEY not in out  # never logged


def test_a_full_ingest_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    import asyncio

    from collector.api.app import create_app
    from collector.api.metrics import build_registry
    from collector.config import Settings
    from collector.runtime import Runtime

    settings = Settings.model_validate({"data_dir": str(tmp_path), "traces": {"max_concurrent_batches": 2}})

    async def run() -> tuple[httpx.Response, httpx.Response]:
        runtime = Runtime(settings)
        app = create_app(settings, runtime, schedule=False)
        app.state.runtime, app.state.registry = runtime, build_registry(runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://llmslo") as client:
            runtime.traces.in_flight = 2  # two batches are being ingested
            busy = await client.post("/v1/traces", content=good_json(5), headers={"Content-Type": "application/json"})
            runtime.traces.in_flight = 0
            ok = await client.post("/v1/traces", content=good_json(5), headers={"Content-Type": "application/json"})
        await runtime.close()
        return busy, ok

    busy, ok = asyncio.run(run())
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert ok.status_code == 200


def test_the_conventional_otlp_port_when_configured(tmp_path: Path) -> None:
    s = Server(tmp_path)
    otlp_port = free_port()
    s.config.write_text(s.config.read_text() + f"traces: {{otlp_http_port: {otlp_port}}}\n")
    s.start()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{otlp_port}/v1/traces",
            content=good_json(77),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200
        assert s.summary()["requests"] == 1
    finally:
        out = s.stop()
    assert "Traceback" not in out
