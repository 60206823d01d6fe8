"""Canary comparison on gateway spans, and shadow traffic: spans exported by the
opentelemetry-sdk over OTLP/HTTP to a running llmslo, the candidate's marked `llmslo.shadow`
(its responses were logged, not shown). Shadow spans stay out of the SLOs and the requests
summary and are what `shadow=true` compares; the verdict's intervals come from bootstrapping the
span sketches (1 % accurate), checked against the exact percentiles of the same samples."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from collector.api.app import create_app
from collector.config import Settings
from collector.drift.compare import Selector, align_sketches, collect_spans, compare_sides
from collector.runtime import Runtime
from collector.traces.normalize import RequestRecord
from collector.traces.rollup import RequestCell, RequestKey
from collector.traces.store import compact_requests, read_requests
from tests.embedded import free_port, serving

ROOT = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def cell_of(ttfts: list[float], errors: int = 0) -> RequestCell:
    cell = RequestCell()
    records = [
        RequestRecord(i.to_bytes(16, "big"), i.to_bytes(8, "big"), 0.0, 1.0, "gateway", MODEL, "chat", "t", 100, 0,
                      50, t, 0.02, t + 1.0, None, "error" if i < errors else "stop", "boom" if i < errors else "")
        for i, t in enumerate(ttfts)
    ]  # fmt: skip
    cell.add_all(records, [])
    return cell


def test_span_sketches_give_the_exact_percentiles_and_a_verdict() -> None:
    rng = np.random.default_rng(3)
    base = list(rng.lognormal(np.log(0.2), 0.5, 4000))
    slow = [x * 1.5 for x in rng.lognormal(np.log(0.2), 0.5, 800)]
    same = list(rng.lognormal(np.log(0.2), 0.5, 800))
    key = RequestKey(0, "chat", MODEL, "t", "gateway")
    shadow = RequestKey(0, "chat", MODEL + "-v2", "t", "shadow")
    for candidate, expect in ((slow, "rollback"), (same, "promote")):
        rows = [(key, cell_of(base)), (shadow, cell_of(candidate))]
        a = collect_spans(rows, Selector.parse(f"model={MODEL}").matches_span)
        b = collect_spans(rows, Selector.parse("shadow=true").matches_span)
        assert (a.requests, b.requests) == (len(base), len(candidate))
        align_sketches(a, b)
        result = compare_sides(a, b, ("base", "cand"), 1800, source="spans")
        p95 = next(m for m in result.metrics if m.name == "ttft_p95")
        assert p95.baseline == pytest.approx(np.percentile(base, 95), rel=0.03)
        assert p95.candidate == pytest.approx(np.percentile(candidate, 95), rel=0.03)
        assert result.verdict == expect, result.reason
        if expect == "rollback":
            lo, hi = p95.ci
            assert lo > 0.10 and lo < 0.5 < hi  # the true change is +50 %
    # a shadow span is chosen only by shadow=true, never by its model
    rows = [(shadow, cell_of(same))]
    assert collect_spans(rows, Selector.parse(f"model={MODEL}-v2").matches_span).requests == 0


def test_shadow_spans_over_otlp_compare_but_count_in_no_slo(tmp_path: Path) -> None:
    port = free_port()
    rules = tmp_path / "rules.yaml"  # chat's TTFT as the gateway measured it, and goodput
    rules.write_text(
        "version: v1\nbusiness_types:\n  chat:\n    objectives:\n"
        "      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95, source: traces}\n"
        "      - {name: good, sli: goodput, objective: 0.9}\n"
    )
    settings = Settings(data_dir=str(tmp_path), rules=str(rules), server={"host": "127.0.0.1", "port": port})
    rt = Runtime(settings)
    provider = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=30))
    )
    tracer = provider.get_tracer("test")
    rng = random.Random(5)
    now = time.time_ns()
    with serving(create_app(settings, rt, schedule=False), port):
        for i in range(600):
            shadow = i % 3 == 0  # every third request also went to the candidate, in shadow
            ttft = rng.lognormvariate(-1.6, 0.4) * (2.0 if shadow else 1.0)
            start = now - (610 - i) * 1_000_000_000  # every span ends before now
            attrs = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": MODEL + ("-v2" if shadow else ""),
                "gen_ai.usage.input_tokens": 300,
                "gen_ai.usage.output_tokens": 80,
                "gen_ai.response.time_to_first_chunk": ttft,
                "gen_ai.response.finish_reasons": ["stop"],
                "llmslo.business_type": "chat",
                "llmslo.tenant": "acme",
            }
            if shadow:
                attrs["llmslo.shadow"] = True
            span = tracer.start_span(f"chat {MODEL}", kind=SpanKind.CLIENT, start_time=start, attributes=attrs)
            span.end(end_time=start + int((ttft + 2.0) * 1e9))
        provider.force_flush()
        provider.shutdown()
        base = f"http://127.0.0.1:{port}"
        summary = httpx.get(f"{base}/api/v1/requests/summary", params={"window": "1h"}).json()
        assert summary["requests"] == 400  # the shown requests only
        shadows = httpx.get(f"{base}/api/v1/requests/summary", params={"window": "1h", "measured_at": "shadow"}).json()
        assert shadows["requests"] == 200
        verdict = httpx.get(
            f"{base}/api/v1/compare",
            params={"baseline": f"model={MODEL}", "candidate": "shadow=true", "window": "1h", "source": "spans"},
        ).json()
        assert verdict["source"] == "spans"
        assert (verdict["baseline_requests"], verdict["candidate_requests"]) == (400, 200)
        assert verdict["verdict"] == "rollback" and "TTFT p95" in verdict["reason"], verdict["reason"]
        # the tolerances: given per request (a generous one lets the same candidate through; a
        # larger sample than either side has holds it), else the configuration's
        params = {"baseline": f"model={MODEL}", "candidate": "shadow=true", "window": "1h", "source": "spans"}
        lenient = httpx.get(f"{base}/api/v1/compare", params={**params, "tolerance_p95": 50, "tolerance_p50": 50})
        assert lenient.json()["verdict"] == "promote", lenient.json()["reason"]
        assert {m["tolerance"] for m in lenient.json()["metrics"] if m["name"].startswith("ttft")} == {50.0}
        held = httpx.get(f"{base}/api/v1/compare", params={**params, "min_requests": 1000}).json()
        assert held["verdict"] == "hold" and "need 1000 each" in held["reason"], held["reason"]
        assert httpx.get(f"{base}/api/v1/compare", params={**params, "tolerance_errors": 2}).status_code == 422
        # the SLOs count the 400 shown requests: over a closed period, and live in the ledger
        end = int(time.time()) // 60 * 60 + 60
        judged = rt.slo_attainment(end - 3600, end)[0]
        assert sorted(o.slo for o, _ in judged) == ["chat-good", "chat-ttft"]
        assert all(events.total == 400 for _, events in judged)
        live = {s.objective.slo: s.period.events.total for s in rt.evaluate_slos(time.time())}
        assert live == {"chat-ttft": 400, "chat-good": 400}
        # a period from 1970 reads only the days that hold data (spans alone here): the same
        # events, answered at once rather than after 20,000 days of queries
        asked = time.monotonic()
        since_epoch = httpx.get(f"{base}/api/v1/slos/attainment", params={"start": 0}, timeout=30)
        assert since_epoch.status_code == 200 and time.monotonic() - asked < 5
        assert since_epoch.json()["start_unix"] == 0
        assert {s["slo"]: s["total"] for s in since_epoch.json()["slos"]} == {"chat-ttft": 400, "chat-good": 400}
        # selectors of two sources cannot be compared: a held verdict that says why
        mixed = httpx.get(
            f"{base}/api/v1/compare", params={"baseline": "tenant=acme", "candidate": "target=x", "source": "spans"}
        ).json()
        assert mixed["verdict"] == "hold" and "source=spans" in mixed["reason"] and mixed["source"] == "none"
        bad = httpx.get(f"{base}/api/v1/compare", params={"baseline": "shadow=maybe", "candidate": "target=x"})
        assert bad.status_code == 422


def test_canary_by_track_from_a_span_attribute_a_target_label_and_a_rule(tmp_path: Path) -> None:
    """One model on both sides, so only the track tells canary from stable. The track comes from
    the attribute the configuration names, from the label of the target the span came from, or
    from a classification rule; a value too long to store rejects its span alone; tracks past
    the per-minute limit are folded into `other` and counted; compaction into hours keeps them."""
    port = free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: v1\nbusiness_types:\n  chat:\n    objectives:\n"
        "      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95, source: traces}\n"
    )
    settings = Settings(
        data_dir=str(tmp_path),
        rules=str(rules),
        server={"host": "127.0.0.1", "port": port},
        targets=[
            {"name": "vllm-canary", "url": "http://127.0.0.1:9/metrics", "labels": {"track": "canary"},
             "business_type": "chat"},
        ],
        traces={
            "track_attribute": "deployment.track",
            "max_tracks_per_minute": 20,
            "classification": [{"attribute": "gateway.route", "pattern": "canary-.*", "track": "canary"}],
        },
    )  # fmt: skip
    rt = Runtime(settings)
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    providers = {}
    for name, resource in (("gateway", {"service.name": "gateway"}), ("engine", {"llmslo.target": "vllm-canary"})):
        providers[name] = TracerProvider(resource=Resource.create(resource))
        providers[name].add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=30)))
    rng = random.Random(11)
    now = time.time_ns()
    old_minute = (now // 60_000_000_000 - 120) * 60_000_000_000  # two hours ago, outside the compared hour

    def send(provider: str, start: int, slow: bool, extra: dict[str, object]) -> None:
        ttft = rng.lognormvariate(-1.6, 0.4) * (1.8 if slow else 1.0)
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": MODEL,
            "gen_ai.usage.input_tokens": 300,
            "gen_ai.usage.output_tokens": 80,
            "gen_ai.response.time_to_first_chunk": ttft,
            "gen_ai.response.finish_reasons": ["stop"],
            "llmslo.business_type": "chat",
            **extra,
        }
        span = providers[provider].get_tracer("test").start_span("chat", kind=SpanKind.CLIENT, start_time=start,
                                                                 attributes=attrs)  # fmt: skip
        span.end(end_time=start + int((ttft + 2.0) * 1e9))

    with serving(create_app(settings, rt, schedule=False), port):
        for i in range(500):
            start = now - (610 - i) * 1_000_000_000  # every span ends before now
            if i % 5 == 0:  # 100: the canary named by the attribute
                send("gateway", start, True, {"deployment.track": "canary"})
            elif i % 5 == 1 and i < 300:  # 60: from the canary server, whose spans name no track
                send("engine", start, True, {})
            elif i % 5 == 1:  # 40: a gateway route a rule puts on the canary
                send("gateway", start, True, {"gateway.route": "canary-eu"})
            else:  # 300: stable
                send("gateway", start, False, {"deployment.track": "stable"})
        send("gateway", now - 30_000_000_000, False, {"deployment.track": "x" * 65})  # too long to store
        for v in range(25):  # 25 tracks in one minute: 20 kept, 5 folded
            send("gateway", old_minute + v * 1_000_000_000, False, {"deployment.track": f"v{v}"})
        for provider in providers.values():
            provider.force_flush()
            provider.shutdown()
        base = f"http://127.0.0.1:{port}"
        params = {"baseline": "track=stable", "candidate": "track=canary", "window": "1h"}
        verdict = httpx.get(f"{base}/api/v1/compare", params=params).json()
        assert verdict["source"] == "spans"  # auto: both sides have spans
        assert (verdict["baseline_requests"], verdict["candidate_requests"]) == (300, 200)
        assert verdict["verdict"] == "rollback" and "TTFT p95" in verdict["reason"], verdict["reason"]
        assert (
            httpx.get(f"{base}/api/v1/compare", params={**params, "candidate": "track=nosuch"}).json()["verdict"]
            == "hold"
        )
        metrics = httpx.get(f"{base}/metrics").text
        assert 'llmslo_trace_values_folded_total{field="track"} 5.0' in metrics
        assert 'llmslo_trace_spans_total{result="rejected"} 1.0' in metrics
        # every shown request counts in the SLO, whatever its track
        end = int(time.time()) // 60 * 60 + 60
        [(_, events)] = rt.slo_attainment(end - 3600, end)[0]
        assert events.total == 500
    rows = read_requests(rt.store, 0, end)
    tracks = {key.track for key, _ in rows}
    assert {"stable", "canary", "other"} <= tracks and len(tracks - {"stable", "canary", "other"}) == 20
    # a span with no track attribute from a server with no track label has none (""): a stable
    # selector does not claim it
    assert sum(c.total for k, c in rows if k.track == "canary") == 200
    totals = {t: sum(c.total for k, c in rows if k.track == t) for t in tracks}
    compact_requests(rt.store, end + 49 * 3600, 48 * 3600, 90 * 86400)
    hours = read_requests(rt.store, 0, end + 3600, period=3600)
    assert {t: sum(c.total for k, c in hours if k.track == t) for t in tracks} == totals
    rt.store.close()


def test_track_selector_on_engines_reads_the_configured_label() -> None:
    sel = Selector.parse("track=canary")
    assert sel.on_spans and sel.on_engines
    assert sel.matches("a", "m", {"track": "canary"}, None)
    assert not sel.matches("a", "m", {"track": "stable"}, None)
    assert sel.matches("a", "m", {"rollout": "canary"}, None, track_label="rollout")
    assert sel.matches_span(RequestKey(0, "chat", MODEL, "t", "gateway", "canary"))
    assert not sel.matches_span(RequestKey(0, "chat", MODEL, "t", "shadow", "canary"))  # shadow: only shadow=true
