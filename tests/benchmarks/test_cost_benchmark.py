"""Cost attribution over an hour holding 1 million requests (LLMSLO_COST_SPANS), as a user asks
for it: `llmslo serve` over a database with an hour of a simulated fleet's engine rollups and the
gateway spans of 1M requests (200 tenants, each in one business type, spans in time order as a
gateway sends them), timed over HTTP next to the plain aggregation it
builds on (`/api/v1/requests/summary` for the same hour), with the server's RSS before and after.

    GET /api/v1/cost?start=..&end=..&group_by=tenant     engine rollups + request rollups, priced
    GET /api/v1/cost?...&group_by=business_type          engine rollups only
    GET /api/v1/requests/summary?window=...              request rollups, aggregated (baseline)

Run: .venv/bin/python -m pytest tests/benchmarks/test_cost_benchmark.py -s
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from collector.sim.fastclock import run_into_store, targets_for
from collector.sim.scenario import load_scenario
from collector.store.repository import Store
from collector.traces.normalize import RequestRecord
from collector.traces.store import ingest
from tests.benchmarks.test_fleet_benchmark import ROOT, free_port, process, rss_mib, wait_http

pytestmark = pytest.mark.benchmark


def timed(url: str, params: dict[str, object], runs: int = 3) -> tuple[float, httpx.Response]:
    times = []
    resp = None
    for _ in range(runs):
        started = time.perf_counter()
        resp = httpx.get(url, params=params, timeout=600)
        times.append(time.perf_counter() - started)
        assert resp.status_code == 200, resp.text
    assert resp is not None
    return statistics.median(times), resp


def test_cost_attribution_for_a_million_requests_an_hour(tmp_path: Path) -> None:
    n_spans = int(os.environ.get("LLMSLO_COST_SPANS", "1000000"))
    scenario = load_scenario("healthy")
    scenario.start_unix = float(int(time.time()) // 60 * 60 - 3660)  # the last whole hour
    db = f"sqlite:///{tmp_path / 'cost.db'}"
    store = Store(db)
    started = time.perf_counter()
    run_into_store(scenario, store, 3600, 15.0)
    t0 = int(scenario.start_unix)
    models = {d.business_types[0]: d.model.name for d in scenario.deployments}
    rng = random.Random(5)
    types = list(models)
    tenants = [(f"tenant-{i:03d}", types[i % len(types)]) for i in range(200)]
    batch: list[RequestRecord] = []
    for i in range(n_spans):
        t = t0 + i * 3599 / n_spans
        tenant, bt = rng.choice(tenants)
        inp = rng.randint(50, 3000)
        batch.append(
            RequestRecord(
                i.to_bytes(16, "big"), (i + 1).to_bytes(8, "big"), t - 1.5, t, "gateway", models[bt], bt,
                tenant, inp, inp // 3, rng.randint(10, 600), 0.2, 0.02, 1.5, 0.01, "stop", "",
            )
        )  # fmt: skip
        if len(batch) == 10_000:
            ingest(store, batch, {})
            batch = []
    ingest(store, batch, {})
    store.close()
    prepared = time.perf_counter() - started

    port = free_port()
    config = {
        "database_url": db,
        "server": {"host": "127.0.0.1", "port": port},
        "targets": [  # nothing answers on port 9: only the stored data is read
            {"name": t.name, "url": f"http://127.0.0.1:9/{t.name}", "business_type": t.business_type}
            for t in targets_for(scenario)
        ],
        "deployments": [
            {"name": d.name, "targets": [f"{d.name}-{i}" for i in range(d.replicas)], "gpu": "L4",
             "replicas": d.replicas, "gpu_hour_usd": 0.8}
            for d in scenario.deployments
        ],
    }  # fmt: skip
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    cmd = [str(Path(sys.executable).parent / "llmslo"), "serve", "--config", str(tmp_path / "llmslo.yaml")]
    base = f"http://127.0.0.1:{port}"
    with process(cmd, ROOT, tmp_path / "serve.log") as proc:
        wait_http(f"{base}/readyz", 60)
        rss_before = rss_mib(proc.pid)
        hour = {"start": t0, "end": t0 + 3600}
        # the baseline: the plain aggregation of the same request rollups (the hour is inside the
        # last two hours)
        baseline, summary = timed(f"{base}/api/v1/requests/summary", {"window": "2h"})
        engine_time, by_type = timed(f"{base}/api/v1/cost", {**hour, "group_by": "business_type"})
        tenant_time, by_tenant = timed(f"{base}/api/v1/cost", {**hour, "group_by": "tenant"})
        rss_after = rss_mib(proc.pid)
    tenants_out = by_tenant.json()["groups"]
    requests = sum(g["requests"] for g in tenants_out)
    assert requests == n_spans and len(tenants_out) == len(tenants)
    assert summary.json()["requests"] == n_spans
    total = sum(g["cost_usd"] for g in tenants_out)
    engine_total = by_type.json()["attributed_usd"]
    print()
    print(f"prepared 1 h of engine rollups + {n_spans:,} spans in {prepared:.0f} s")
    print(f"{'':44}{'time':>10}{'ratio':>8}")
    print(f"{'requests summary, same hour (baseline)':44}{baseline * 1000:>8.0f}ms{1.0:>8.2f}")
    print(f"{'cost by business type (engine rollups)':44}{engine_time * 1000:>8.0f}ms{engine_time / baseline:>8.2f}")
    print(f"{'cost by tenant (engine + request rollups)':44}{tenant_time * 1000:>8.0f}ms{tenant_time / baseline:>8.2f}")
    print(f"server RSS {rss_before:.0f} -> {rss_after:.0f} MiB; tenants priced ${total:,.2f} of ${engine_total:,.2f}")
