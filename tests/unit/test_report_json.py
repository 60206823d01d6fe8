"""The fleet view's JSON, written without a pydantic model per group (`serving_json`), holds the
same values as the pydantic response (`report_out`) and validates against its schema: for
every vLLM naming family, a model name no ASCII encoder keeps, series with no traffic, and a
figure JSON cannot carry (NaN, infinity: null, as pydantic writes it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from pathlib import Path

import pytest

from collector.analytics.serving import ServingReport
from collector.api.schemas import ServingResponse, report_out, serving_json
from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.exposition import VERSIONS, EngineMetrics, render


def mixed_fleet(tmp_path: Path) -> tuple[Runtime, float]:
    """One target per vLLM naming family and business type, one idle, one serving a model whose
    name is not ASCII, one outside every rule (unassigned), scraped every 15 s for two minutes."""
    t0 = int(time.time()) - 125
    names = [f"{v}-{i}" for i, v in enumerate(VERSIONS)] + ["idle", "unicode", "unlisted"]
    types = ["chat", "customer_service", "code_completion", "batch", "chat", None]
    targets = [
        {"name": n, "url": "http://127.0.0.1:9/metrics", **({"business_type": bt} if bt else {})}
        for n, bt in zip(names, types, strict=True)
    ]
    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path), "targets": targets}))
    asyncio.run(rt.start())
    rng = random.Random(11)
    servers = {n: EngineMetrics(max_model_len=4096, created_unix=t0 - 3600) for n in names}
    now = float(t0)
    for step in range(8):
        now = t0 + 15.0 * step
        for i, name in enumerate(names):
            m = servers[name]
            if name != "idle":
                for _ in range(3 + 7 * i):
                    m.prompt_tokens += rng.randint(20, 4000)
                    m.generation_tokens += rng.randint(1, 900)
                    reason = rng.choice(["stop", "stop", "length", "abort"])
                    m.finished[reason] = m.finished.get(reason, 0) + 1
                    m.hist["time_to_first_token_seconds"].observe(rng.lognormvariate(-1.0 + i / 3, 1.2))
                    m.hist["e2e_request_latency_seconds"].observe(rng.lognormvariate(1.0, 1.0))
            version = VERSIONS[i % len(VERSIONS)] if i < len(VERSIONS) else "current"
            model = "模型-Qwen/Qwen3-8B-ü" if name == "unicode" else f"model-{i % 2}"
            assert rt.scrapers[name].ingest(render(version, model, m).encode(), None, now + i)
    return rt, now + 5


def assert_same(report: ServingReport) -> None:
    ours = serving_json("5m", report)
    theirs = report_out("5m", report).model_dump_json().encode()
    assert json.loads(ours) == json.loads(theirs)
    ServingResponse.model_validate_json(ours)  # and the schema /docs publishes


def test_the_fleet_views_json_holds_the_pydantic_responses_values(tmp_path: Path) -> None:
    rt, now = mixed_fleet(tmp_path)
    snap = rt.refresh_snapshot(now)
    for report in snap.reports.values():
        assert len(report.groups) >= 6 and report.business_types
        assert_same(report)
        body = json.loads(serving_json("5m", report))
        assert any(g["model"] == "模型-Qwen/Qwen3-8B-ü" for g in body["groups"])
        assert "unassigned" in {b["business_type"] for b in body["business_types"]}
    rt.store.close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_figure_json_cannot_carry_is_null_as_pydantic_writes_it(tmp_path: Path, bad: float) -> None:
    rt, now = mixed_fleet(tmp_path)
    report = rt.refresh_snapshot(now).reports[300.0]
    group = report.groups[0]
    spoiled = dataclasses.replace(group, stats=dataclasses.replace(group.stats, error_ratio=bad, requests=bad))
    report = dataclasses.replace(report, groups=(spoiled, *report.groups[1:]))
    assert_same(report)
    first = json.loads(serving_json("5m", report))["groups"][0]["stats"]
    assert first["error_ratio"] is None and first["requests"] is None
    rt.store.close()
