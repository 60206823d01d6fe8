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

import json
import os
import re
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from collector.config import Settings, load_settings
from collector.runtime import Runtime
from collector.sim.fastclock import SpanWriter, run_into_store, targets_for
from collector.sim.scenario import load_scenario
from collector.store.repository import Store
from tests.benchmarks.test_fleet_benchmark import ROOT, TYPES, free_port, process, rss_mib, wait_http
from tests.benchmarks.test_slo_benchmark import fill

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


REPORT_PEAK = """\
import resource, sys
from collector.cli import main
code = main(sys.argv[1:])
print(f"PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
sys.exit(code)
"""


def offline(args: list[str], cwd: Path, log: Path, limit_gib: float) -> tuple[float, float | None]:
    """One `llmslo` command in its own process (the code under `cwd`): (seconds, peak RSS in
    MiB, None when it failed: over `limit_gib` of address space, or any error; see `log`)."""

    def cap() -> None:
        limit = int(limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    started = time.perf_counter()
    with open(log, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-c", REPORT_PEAK, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=out,
            preexec_fn=cap, timeout=float(os.environ.get("LLMSLO_REPORT_TIMEOUT", "3600")), check=False,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    found = re.search(r"PEAK_RSS_KIB (\d+)", log.read_text(errors="replace"))
    return seconds, int(found.group(1)) / 1024 if done.returncode == 0 and found else None


def test_report_on_a_day_of_fleet_minutes(tmp_path: Path) -> None:
    """The weekly report at fleet scale: last week's Sunday holds a minute of every series of
    N targets (LLMSLO_REPORT_FLEET_TARGETS, 1,000: 24 series each, 34.6 million rows), as a
    collector that scraped them leaves it. `llmslo report --week last` in its own process, next
    to `llmslo cost` for the same week (a plain read of it, the baseline), each process' peak
    RSS (each command is stopped after LLMSLO_REPORT_TIMEOUT seconds, 3600 by default).
    LLMSLO_REPORT_BEFORE=<commit> also runs both with that commit's code (a git worktree),
    to compare a change's memory. Run (outside the default suite):
      LLMSLO_REPORT_FLEET_TARGETS=1000 .venv/bin/python -m pytest \\
        tests/benchmarks/test_report_benchmark.py -k day_of_fleet -s"""
    n = int(os.environ.get("LLMSLO_REPORT_FLEET_TARGETS", "1000"))
    limit_gib = float(os.environ.get("LLMSLO_REPORT_MEMORY_LIMIT_GIB", "16"))
    before = os.environ.get("LLMSLO_REPORT_BEFORE")
    monday = datetime.now(UTC).date() - timedelta(days=datetime.now(UTC).weekday())
    end = int(datetime(monday.year, monday.month, monday.day, tzinfo=UTC).timestamp())  # last week's end
    names = [f"t{i}" for i in range(n)]
    config = {
        "data_dir": str(tmp_path),
        "rules": str(ROOT / "rules"),
        "report": {"enabled": False},
        "targets": [  # nothing answers on port 9: only the stored day is read
            {"name": name, "url": f"http://127.0.0.1:9/{name}", "business_type": TYPES[i % len(TYPES)]}
            for i, name in enumerate(names)
        ],
        "deployments": [
            {"name": bt, "targets": names[i :: len(TYPES)], "gpu": "L4", "gpu_hour_usd": 0.8}
            for i, bt in enumerate(TYPES)
        ],
    }
    path = tmp_path / "llmslo.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    rt = Runtime(load_settings(path))
    stored = fill(rt, 1, end, None)
    rt.store.close()
    day = datetime.fromtimestamp(end - DAY, UTC)
    print(f"\nREPORT at fleet scale: {n} targets, {stored:,} minute rows of {day:%A %Y-%m-%d} written in "
          f"{time.perf_counter() - started:.0f} s; address space capped at {limit_gib:g} GiB")  # fmt: skip
    week = ["--start", str(end - 7 * DAY), "--end", str(end)]
    trees = [("this tree", ROOT)]
    if before:
        tree = tmp_path / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), before], cwd=ROOT, check=True)
        trees.append((f"before ({before[:10]})", tree))
    try:
        results = []
        for label, tree in trees:
            logs = tmp_path / f"tree-{len(results)}"
            logs.mkdir()
            cost = offline(["cost", "--config", str(path), *week, "--json"], tree, logs / "cost.log", limit_gib)
            out = tmp_path / "report.json"
            report = offline(
                ["report", "--config", str(path), "--week", "last", "--format", "json", "--out", str(out)],
                tree,
                logs / "report.log",
                limit_gib,
            )
            results.append((label, cost, report))
            if label == "this tree":
                assert report[1] is not None, (logs / "report.log").read_text()[-3000:]
                data = json.loads(out.read_text())
                assert data["traffic"]["engine_requests"] > 0 and data["cost"]["allocated_usd"] > 0
    finally:
        if before:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)

    def mib(value: float | None) -> str:
        return f"{value:,.0f} MiB" if value is not None else f"failed (> {limit_gib:g} GiB?)"

    print(f"{'':44}{'time':>10}{'peak RSS':>14}{'time vs cost':>14}")
    for label, (cost_s, cost_rss), (report_s, report_rss) in results:
        print(f"{label + ': llmslo cost for the week (baseline)':44}{cost_s:>9.1f}s{mib(cost_rss):>14}{1.0:>14.2f}")
        print(f"{label + ': llmslo report --week last':44}{report_s:>9.1f}s{mib(report_rss):>14}"
              f"{report_s / cost_s:>14.2f}")  # fmt: skip
