"""Weekly report benchmark: the report for a week of N targets and R requests a day, built by
`llmslo serve` over HTTP (POST /api/v1/reports, as the scheduled job does it), next to plain
reads of the same week in the same run (the serving view and the cost of the week), with the
server's RSS.

The week is simulated through the collector's own ingestion (engine scrapes every 5 minutes,
one gateway span per request) and compacted as `serve` leaves it by Monday 08:00 (minutes for the
last 48 hours, hours before). Run (outside the default suite):
  LLMSLO_REPORT_TARGETS=50 LLMSLO_REPORT_REQUESTS_PER_DAY=1000000 \\
    .venv/bin/python -m pytest tests/benchmarks/test_report_benchmark.py -s
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.fastclock import SpanWriter, run_into_store, targets_for
from collector.sim.scenario import load_scenario
from collector.store.repository import Store
from tests.benchmarks.test_fleet_benchmark import ROOT, free_port, process, rss_mib, wait_http

pytestmark = pytest.mark.benchmark
DAY = 86400
STEP = 300.0


def timed(method: str, url: str, params: dict[str, object]) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    resp = httpx.request(method, url, params=params, timeout=1800)
    assert resp.status_code == 200, resp.text[:500]
    return time.perf_counter() - started, resp


def test_report_for_a_week_of_a_large_fleet(tmp_path: Path) -> None:
    n_targets = int(os.environ.get("LLMSLO_REPORT_TARGETS", "50"))
    per_day = float(os.environ.get("LLMSLO_REPORT_REQUESTS_PER_DAY", "1000000"))
    healthy = yaml.safe_load((ROOT / "collector" / "data" / "scenario-healthy.yaml").read_text())
    # the last complete ISO week (UTC), so that `week=last` and the stored data agree
    today = datetime.now(UTC).date()
    monday = today - timedelta(days=today.weekday() + 7)
    healthy["start"] = f"{monday.isoformat()}T00:00:00Z"
    healthy["workload"]["requests_per_second"] = per_day / DAY
    deployments = healthy["deployments"]
    shares = [0.5, 0.2, 0.25, 0.05]  # replicas in proportion to each deployment's traffic
    for d, share in zip(deployments, shares, strict=True):
        d["replicas"] = max(1, round(n_targets * share))
    deployments[0]["replicas"] += n_targets - sum(d["replicas"] for d in deployments)
    scenario_path = tmp_path / "scenario.yaml"
    scenario_path.write_text(yaml.safe_dump(healthy))
    scenario = load_scenario(str(scenario_path))
    targets = targets_for(scenario)
    assert len(targets) == n_targets
    db = f"sqlite:///{tmp_path / 'week.db'}"
    store = Store(db)
    started = time.perf_counter()
    writer = SpanWriter(store, scenario.start_unix)
    run = run_into_store(scenario, store, 7 * DAY, STEP, settings=Settings(targets=targets), on_finish=writer)
    spans = writer.flush()
    end = int(scenario.start_unix) + 7 * DAY
    Runtime(Settings(targets=targets), store).compact(end + 8 * 3600)
    store.close()
    prepared = time.perf_counter() - started
    scrapes = sum(s.status.scrapes_total for s in run.scrapers.values())

    port = free_port()
    config = {
        "database_url": db,
        "rules": str(ROOT / "rules"),
        "server": {"host": "127.0.0.1", "port": port},
        "scrape": {"interval": "5m"},
        "report": {"enabled": False},  # built on request below, as the job would
        "targets": [  # nothing answers on port 9: only the stored week is read
            {"name": t.name, "url": f"http://127.0.0.1:9/{t.name}", "business_type": t.business_type}
            for t in targets
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
    week = {"start": end - 7 * DAY, "end": end}
    with process(cmd, ROOT, tmp_path / "serve.log") as proc:
        wait_http(f"{base}/readyz", 120)
        rss_before = rss_mib(proc.pid)
        serving_time, _ = timed("GET", f"{base}/api/v1/serving", week)
        cost_time, cost = timed("GET", f"{base}/api/v1/cost", {**week, "group_by": "tenant"})
        report_time, made = timed("POST", f"{base}/api/v1/reports", {"week": "last"})
        rss_after = rss_mib(proc.pid)
        page_time, page = timed("GET", f"{base}/reports/{made.json()['id']}", {})
        data = httpx.get(f"{base}/api/v1/reports/{made.json()['id']}", timeout=60).json()
    assert data["traffic"]["gateway_requests"] > 0.9 * per_day * 7 - 1
    assert data["cost"]["allocated_usd"] == pytest.approx(cost.json()["allocated_usd"])
    print()
    print(
        f"prepared a week of {n_targets} targets ({scrapes:,} scrapes every 5 min) and {spans:,} gateway spans "
        f"in {prepared:.0f} s"
    )
    print(f"{'':48}{'time':>10}{'ratio':>8}")
    print(f"{'GET /api/v1/serving for the week (baseline)':48}{serving_time:>9.1f}s{1.0:>8.2f}")
    print(f"{'GET /api/v1/cost?group_by=tenant for the week':48}{cost_time:>9.1f}s{cost_time / serving_time:>8.2f}")
    print(f"{'POST /api/v1/reports (build, render, store)':48}{report_time:>9.1f}s{report_time / serving_time:>8.2f}")
    print(f"{'GET /reports/<id> (stored HTML)':48}{page_time:>9.2f}s{page_time / serving_time:>8.3f}")
    print(
        f"report built in {data['build_seconds']:.1f} s inside the server; HTML {len(page.content) / 1e6:.1f} MB; "
        f"server RSS {rss_before:.0f} -> {rss_after:.0f} MiB"
    )
