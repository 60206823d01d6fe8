"""`llmslo simulate --fast` into a database, then `llmslo cost` and `llmslo capacity` on it with
an inventory, as a user runs them: the totals reconcile to the configured spend to the cent, the
requests' costs add up to the busy cost, and the tables print.

Six simulated hours by default; the simulated week of the cost issue is the same test with
LLMSLO_COST_SIM=7d LLMSLO_COST_SIM_INTERVAL=1m (about 4 minutes here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.config import parse_duration
from collector.sim.scenario import load_scenario

LLMSLO = [sys.executable, "-m", "collector.cli"]
DURATION = os.environ.get("LLMSLO_COST_SIM", "6h")
INTERVAL = os.environ.get("LLMSLO_COST_SIM_INTERVAL", "15s")
HOURS = parse_duration(DURATION) / 3600
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMSLO, *args], capture_output=True, text=True, timeout=1800, cwd=ROOT)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    tmp = tmp_path_factory.mktemp("cli")
    db = f"sqlite:///{tmp / 'sim.db'}"
    done = run("simulate", "--fast", DURATION, "--scrape-interval", INTERVAL, "--database", db)
    assert done.returncode == 0, done.stderr
    scenario = load_scenario("healthy")
    config = tmp / "llmslo.yaml"
    targets = "\n".join(
        f"  - {{name: {d.name}-{i}, url: 'http://127.0.0.1:1/{d.name}-{i}', business_type: {d.business_types[0]}}}"
        for d in scenario.deployments
        for i in range(d.replicas)
    )
    config.write_text(f"""\
database_url: "{db}"
rules: {ROOT / "rules"}
targets:
{targets}
deployments:
  - {{name: chat, targets: [chat-0, chat-1], gpu: L4, replicas: 2, gpu_hour_usd: 0.80,
      api_prices: {{input: 0.15, output: 0.60}}}}
  - {{name: support, targets: [support-0], gpu: L4, gpu_hour_usd: 0.80, fixed_monthly_usd: 73}}
  - {{name: code, targets: [code-0], gpu: L4, gpu_hour_usd: 0.80}}
  - {{name: batch, targets: [batch-0], gpu: H100, replicas: 1, node_hour_usd: 98.32, gpus_per_node: 8}}
""")
    return config, int(scenario.start_unix)


def test_cost_reconciles_over_the_simulated_run(simulated: tuple[Path, int]) -> None:
    config, t0 = simulated
    window = ["--start", str(t0), "--end", str(int(t0 + HOURS * 3600))]
    done = run("cost", "--config", str(config), *window, "--group-by", "deployment", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    by_name = {d["name"]: d for d in out["deployments"]}
    # configured replicas: the bill, to the cent
    assert round(by_name["chat"]["allocated_usd"], 2) == round(0.80 * 2 * HOURS, 2)
    assert round(by_name["batch"]["allocated_usd"], 2) == round(98.32 / 8 * HOURS, 2)
    # counted: the hours support-0 was scraped, plus $73/month = $0.10/h of fixed cost
    support = by_name["support"]
    assert support["allocated_usd"] == pytest.approx(0.80 * support["replica_hours"] + 0.10 * HOURS)
    assert out["attributed_usd"] + sum(d["unshared_idle_usd"] for d in out["deployments"]) == pytest.approx(
        out["allocated_usd"], abs=0.005
    )
    for d in out["deployments"]:  # the groups' busy cost is the deployment's busy cost
        assert d["totals"]["busy_usd"] == pytest.approx(d["busy_usd"], abs=1e-9)
    chat = by_name["chat"]
    assert chat["api_usd"] > 0 and chat["break_even_requests_per_day"] > 0
    tables = run("cost", "--config", str(config), *window)
    assert tables.returncode == 0, tables.stderr
    assert "break-even req/day" in tables.stdout and "customer_service" in tables.stdout


def test_capacity_command(simulated: tuple[Path, int]) -> None:
    config, t0 = simulated
    done = run("capacity", "--config", str(config), "--start", str(t0), "--end", str(int(t0 + HOURS * 3600)), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {c["deployment"] for c in out["deployments"]} == {"chat", "support", "code", "batch"}
    assert all(c["peak_tokens_per_second_at_slo"] for c in out["deployments"])
    table = run("capacity", "--config", str(config), "--start", str(t0), "--end", str(int(t0 + HOURS * 3600)))
    assert table.returncode == 0 and "replicas needed" in table.stdout


def test_cost_without_an_inventory_or_with_a_bad_window_says_why(simulated: tuple[Path, int], tmp_path: Path) -> None:
    config, _ = simulated
    bare = tmp_path / "bare.yaml"
    bare.write_text("targets: []\n")
    done = run("cost", "--config", str(bare))
    assert done.returncode == 2 and "no `deployments:`" in done.stderr
    done = run("cost", "--config", str(config), "--start", "2026-01-05T10:00:00+00:00")
    assert done.returncode == 2 and "both --start and --end" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  - {name: x, targets: [nope], gpu: Z100, gpu_hour_usd: 1}\n")
    done = run("cost", "--config", str(bad))
    assert done.returncode == 2
    assert "bad.yaml:2: deployments[0].gpu: unknown GPU type 'Z100'" in done.stderr
    assert "deployments[0].targets: no target named 'nope'" in done.stderr
