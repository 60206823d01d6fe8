"""The cost model on hours of simulated traffic fed through the collector's own ingestion and
store: the totals reconcile to the configured spend to the cent, the groups' costs add up to
their deployment's, the busy share is the share of scrapes that saw requests running, and the
prefill/decode calibration recovers the simulator's own speeds."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.api.metrics import build_registry
from collector.config import CostConfig, DeploymentConfig, Settings
from collector.runtime import Runtime
from collector.sim.fastclock import run_into_store, targets_for
from collector.sim.scenario import load_scenario
from collector.store.repository import Store

HOURS = 2
INTERVAL = 15.0
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
PRICES = {"chat": 2.50, "support": 1.10, "code": 1.10, "batch": 4.00}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    scenario = load_scenario("healthy")
    targets = targets_for(scenario)
    deployments = [
        DeploymentConfig(
            name=d.name,
            targets=[t.name for t in targets if t.name.startswith(d.name + "-")],
            gpu="H100" if d.name == "batch" else "L4",
            # chat and batch billed for configured replicas, the others for the replicas scraped
            replicas=d.replicas if d.name in ("chat", "batch") else None,
            gpu_hour_usd=PRICES[d.name],
            fixed_monthly_usd=730.0 if d.name == "chat" else 0.0,  # $1/h
        )
        for d in scenario.deployments
    ]
    settings = Settings(targets=targets, deployments=deployments)
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('cost') / 'cost.db'}")
    busy: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # target -> [busy scrapes, scrapes]

    def on_scrape(t: float, replica: str, body: str | None) -> None:
        if body is not None and t < HOURS * 3600:  # the scrape at the end is in the next minute
            running = sum(float(v) for v in RUNNING.findall(body))
            busy[replica][0] += running > 0
            busy[replica][1] += 1

    run_into_store(scenario, store, HOURS * 3600, INTERVAL, settings=settings, on_scrape=on_scrape)
    rt = Runtime(settings, store)
    t0 = int(scenario.start_unix)
    yield rt, scenario, t0, busy
    store.close()


def test_totals_reconcile_to_the_configured_spend_to_the_cent(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, scenario, t0, _busy = fleet
    report = rt.cost_report(t0, t0 + HOURS * 3600)
    by_name = {d.name: d for d in report.deployments}
    replicas = {d.name: d.replicas for d in scenario.deployments}
    # configured replicas: price x GPUs x replicas x hours (+ fixed), exactly
    assert round(by_name["chat"].allocated_usd, 2) == round(2.50 * replicas["chat"] * HOURS + 1.0 * HOURS, 2)
    assert round(by_name["batch"].allocated_usd, 2) == round(4.00 * HOURS, 2)
    # counted replicas: the time each replica was scraped (the first scrape covers none of it)
    assert by_name["code"].replica_hours == pytest.approx(HOURS - INTERVAL / 3600, abs=1e-9)
    # groups (busy + shared idle) + idle nobody was charged = allocated, per deployment and in total
    for d in report.deployments:
        groups = sum(line.total_usd for key, line in report.groups.items() if key[0] == d.name)
        assert groups + d.unshared_idle_usd == pytest.approx(d.allocated_usd, abs=1e-9)
        busy = sum(line.busy_usd for key, line in report.groups.items() if key[0] == d.name)
        assert busy == pytest.approx(d.busy_usd, abs=1e-9)  # per-request costs sum to the busy cost
    assert sum(line.total_usd for line in report.groups.values()) == pytest.approx(report.allocated_usd, abs=1e-6)
    # the same window cut in two reports adds up (everything the formula reads is a sum)
    first = rt.cost_report(t0, t0 + 3600)
    second = rt.cost_report(t0 + 3600, t0 + 7200)
    assert first.allocated_usd + second.allocated_usd == pytest.approx(report.allocated_usd, abs=1e-9)


def test_busy_share_is_the_share_of_scrapes_with_requests_running(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, _scenario, t0, busy = fleet
    report = rt.cost_report(t0, t0 + HOURS * 3600)
    for d in report.deployments:
        counts = [busy[t] for t in busy if t.startswith(d.name + "-")]
        truth = sum(b for b, _ in counts) / sum(n for _, n in counts)
        assert d.busy_share == pytest.approx(truth, abs=1e-9), d.name
        assert d.busy_usd == pytest.approx(d.allocated_usd * truth)
        assert d.idle_usd == pytest.approx(d.allocated_usd * (1 - truth))
    shares = {d.name: d.busy_share for d in report.deployments}
    assert min(shares.values()) > 0 and max(shares.values()) <= 1


def test_calibration_recovers_the_simulators_prefill_and_decode_speeds(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, scenario, t0, _busy = fleet
    report = rt.cost_report(t0, t0 + HOURS * 3600)
    for d in report.deployments:
        spec = next(s for s in scenario.deployments if s.name == d.name)
        assert d.calibrated
        # prefill: uncached tokens / prefill speed (plus the wait for a decode step)
        assert d.prefill_seconds_per_token == pytest.approx(1 / spec.prefill_tokens_per_second, rel=0.35), d.name
        # decode: the per-token step time, slowed by the running batch (slope x batch); vLLM's
        # decode time covers every output token but the first (which prefill produced)
        assert 0.9 * spec.decode_seconds_per_token <= d.decode_seconds_per_token <= 2 * spec.decode_seconds_per_token
        line = d.line
        assert line.input_usd + line.output_usd == pytest.approx(line.total_usd)
        assert line.cache_savings_usd > 0  # the scenario's shared system prompts hit the prefix cache


def test_grouping_and_the_api_shape(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, _scenario, t0, _busy = fleet
    report = rt.cost_report(t0, t0 + HOURS * 3600)
    by_type = report.by("business_type")
    assert set(by_type) == {"chat", "customer_service", "code_completion", "batch"}
    chat = by_type["chat"].as_dict()
    assert chat["requests"] and chat["usd_per_request"] == pytest.approx(chat["cost_usd"] / chat["requests"])
    assert chat["utilization"] == pytest.approx(report.by("deployment")["chat"].busy_usd / chat["cost_usd"])
    costs = report.business_type_costs()
    assert sum(usd for usd, _ in costs.values()) == pytest.approx(report.allocated_usd)


def test_share_idle_off_leaves_idle_with_the_deployment(tmp_path: Path, fleet) -> None:  # type: ignore[no-untyped-def]
    rt, _scenario, t0, _busy = fleet
    settings = rt.settings.model_copy(update={"cost": CostConfig(share_idle=False)})
    alone = Runtime(settings, rt.store)
    report = alone.cost_report(t0, t0 + HOURS * 3600)
    for d in report.deployments:
        assert d.unshared_idle_usd == pytest.approx(d.idle_usd)
        assert sum(line.idle_usd for key, line in report.groups.items() if key[0] == d.name) == 0


def test_metrics_dollar_counters_advance_minute_by_minute_and_match_the_report(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, _scenario, t0, _busy = fleet
    rt.cost_meter = type(rt.cost_meter)()
    start = t0 + 600
    rt.advance_cost_meter(start + rt.running.grace)  # counting starts at the first whole minute seen
    for now in range(start + 60, start + 3600, 97):  # irregular passes, as the scheduler's can be
        rt.advance_cost_meter(now + rt.running.grace)
    until = rt.cost_meter.until
    assert until is not None and until > start + 3000
    report = rt.cost_report(start, until)
    text = generate_latest(build_registry(rt)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    allocated = {s.labels["deployment"]: s.value for s in fams["llmslo_cost_allocated_usd"].samples}
    for d in report.deployments:
        assert allocated[d.name] == pytest.approx(d.allocated_usd, rel=1e-9)
    attributed = sum(s.value for s in fams["llmslo_cost_attributed_usd"].samples)
    assert attributed == pytest.approx(sum(line.total_usd for line in report.groups.values()), rel=1e-9)
