"""The cost model on hours of simulated traffic fed through the collector's own ingestion and
store: the totals reconcile to the configured spend to the cent, the groups' costs add up to
their deployment's, the busy share is the share of scrapes that saw requests running, and the
prefill/decode calibration recovers the simulator's own speeds."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.analytics.serving import build_report
from collector.api.metrics import build_registry
from collector.config import CostConfig, DeploymentConfig, Settings
from collector.cost.allocation import COST_METRICS, CostInputs, attribute
from collector.runtime import Runtime
from collector.sim.fastclock import run_into_store, targets_for
from collector.sim.scenario import load_scenario
from collector.sources.vllm import BUSY
from collector.store.repository import Store

ROOT = Path(__file__).resolve().parents[2]
HOURS = 2
INTERVAL = 15.0
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
ACTIVE = re.compile(r"^DCGM_FI_PROF_GR_ENGINE_ACTIVE\{[^}]*\} (\S+)$", re.M)
PRICES = {"chat": 2.50, "support": 1.10, "code": 1.10, "batch": 4.00}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    scenario = load_scenario("healthy")
    targets = targets_for(scenario, dcgm=True)  # each replica with a DCGM exporter beside it
    models = tmp_path_factory.mktemp("models")
    for d in scenario.deployments:  # each deployment's model as a Hugging Face config.json
        m = d.model
        (models / d.name).mkdir()
        (models / d.name / "config.json").write_text(
            json.dumps(
                {"num_hidden_layers": m.layers, "num_attention_heads": m.kv_heads * 4,
                 "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "hidden_size": 4096,
                 "torch_dtype": "bfloat16"}
            )
        )  # fmt: skip
    deployments = [
        DeploymentConfig(
            name=d.name,
            targets=[t.name for t in targets if t.name.startswith(d.name + "-")],  # servers and exporters
            gpu="H100" if d.name == "batch" else "L4",
            # chat and batch billed for configured replicas, the others for the replicas scraped
            replicas=d.replicas if d.name in ("chat", "batch") else None,
            gpu_hour_usd=PRICES[d.name],
            fixed_monthly_usd=730.0 if d.name == "chat" else 0.0,  # $1/h
            model_config_path=str(models / d.name),
            parameters=d.model.params_billion * 1e9,
            max_model_len=d.max_model_len,
        )
        for d in scenario.deployments
    ]
    settings = Settings(targets=targets, deployments=deployments, rules=str(ROOT / "rules"))
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('cost') / 'cost.db'}")
    busy: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # target -> [busy scrapes, scrapes]
    peak_running: dict[str, float] = defaultdict(float)  # deployment -> max running on one replica
    active: dict[str, list[float]] = defaultdict(list)  # deployment -> DCGM engine-active samples

    def on_scrape(t: float, replica: str, body: str | None) -> None:
        if body is not None and t < HOURS * 3600 and replica.endswith("-dcgm"):
            active[replica.split("-")[0]] += [float(v) for v in ACTIVE.findall(body)]
        elif body is not None and t < HOURS * 3600:  # the scrape at the end is in the next minute
            running = sum(float(v) for v in RUNNING.findall(body))
            busy[replica][0] += running > 0
            busy[replica][1] += 1
            deployment = replica.rsplit("-", 1)[0]
            peak_running[deployment] = max(peak_running[deployment], running)

    run = run_into_store(scenario, store, HOURS * 3600, INTERVAL, settings=settings, on_scrape=on_scrape)
    rt = Runtime(settings, store)
    t0 = int(scenario.start_unix)
    rt.sim_truth = (run, peak_running, active)  # type: ignore[attr-defined]
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
        assert d.busy_source == "engine"  # the engines' own state first; DCGM only without it
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


def test_capacity_from_the_measured_load(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, scenario, t0, _busy = fleet
    run, peak_running, _active = rt.sim_truth
    report = {c.deployment: c for c in rt.capacity(t0, t0 + HOURS * 3600)}
    assert set(report) == {d.name for d in scenario.deployments}
    for spec in scenario.deployments:
        c = report[spec.name]
        assert c.peak_concurrency == peak_running[spec.name]  # the highest running count scraped
        # the context quantile is read as the bucket's upper bound: never below the exact one
        done = [r for r in run.requests if r.replica.startswith(spec.name + "-") and r.output_tokens > 0]
        prompts = sorted(r.prompt_tokens for r in done)
        exact_p95 = prompts[int(0.95 * len(prompts)) - 1]
        assert c.context_p95 is not None and exact_p95 <= c.context_p95 <= spec.max_model_len
        assert c.context_p99 is not None and c.context_p99 >= c.context_p95
        fit = c.memory_p95
        assert fit is not None and fit.weights_bytes == pytest.approx(spec.model.params_billion * 1e9 * 2)
        kv_token = 2 * spec.model.layers * spec.model.kv_heads * spec.model.head_dim * 2
        assert fit.kv_bytes == pytest.approx(kv_token * c.context_p95 * c.peak_concurrency)
        assert (fit.fits is False) == bool(c.advice)
        # throughput while the SLOs held, and the replicas the peak hour needs at that rate
        assert c.slo_hours >= 1 and c.slo_hours_held >= 1
        assert c.peak_tokens_per_second_at_slo and c.peak_tokens_per_second_at_slo > 0
        assert c.replicas_needed is not None and c.replicas_needed >= 1
        assert c.forecasts == {}  # one week of data: no trend yet
    # chat: 8B in bf16 (14.9 GiB) + KV of 8 x 2,500 tokens (2.4 GiB), x 1.2 = 20.8 GiB <= 24 x 0.92
    assert report["chat"].memory_p95 is not None and report["chat"].memory_p95.fits is True
    # support: 7.2B + KV of 11 x 5,500 tokens, x 1.2 = 25 GiB: the worst case does not fit, and
    # the first remedy caps concurrency at what does
    support = report["support"]
    assert support.memory_p95 is not None and support.memory_p95.fits is False
    assert support.advice[0].startswith(f"cap concurrency at {support.memory_p99.max_concurrency} ")


def test_dcgm_exporters_give_the_busy_share_when_the_engines_do_not(fleet) -> None:  # type: ignore[no-untyped-def]
    rt, _scenario, t0, _busy = fleet
    _run, _peak, active = rt.sim_truth
    end = t0 + HOURS * 3600
    rows = [r for r in rt.store.read_rows(t0, end, metrics=COST_METRICS) if r.cell.ident.key.metric != BUSY]
    report = attribute(CostInputs().add_rows(rows), rt.inventory, rt.settings.cost, t0, end, rt.business_type_of)
    for d in report.deployments:
        samples = active[d.name]
        assert d.busy_source == "dcgm"
        assert d.busy_share == pytest.approx(sum(samples) / len(samples), abs=1e-9)
    # GPUs are not serving groups and not cost groups
    assert not any(key[1].endswith("-dcgm") for key in report.groups)
    cells = rt.store.read_window(t0, end)
    serving = build_report(cells, HOURS * 3600, t0, end, rt.business_type_of)
    assert not any(g.target.endswith("-dcgm") for g in serving.groups)
    # capacity reads the framebuffer: vLLM's reservation (0.9 of 24 GiB) + the 500 MiB CUDA context
    cap = {c.deployment: c for c in rt.capacity(t0, end)}
    assert cap["chat"].gpu_memory_peak == pytest.approx((24 * 1024 * 0.9 + 500) / (24 * 1024), abs=1e-4)


def test_past_periods_are_answered_from_the_rollups(fleet) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    import httpx

    from collector.api.app import create_app

    rt, _scenario, t0, _busy = fleet
    run, _peak, _active = rt.sim_truth
    app = create_app(rt.settings, rt, schedule=False)

    async def get(path: str, **params: object) -> dict:  # type: ignore[type-arg]
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://llmslo") as client,
        ):
            resp = await client.get(path, params=params)
            assert resp.status_code == 200, resp.text
            return resp.json()  # type: ignore[no-any-return]

    hour = {"start": t0 + 3600, "end": t0 + 7200}
    serving = asyncio.run(get("/api/v1/serving", business_type="chat", **hour))
    assert (serving["start_unix"], serving["end_unix"]) == (t0 + 3600, t0 + 7200)
    [chat] = serving["business_types"]
    # vLLM counts a request when it finishes; scrapes every 15 s put the boundary's few elsewhere
    truth = len([r for r in run.requests_between(3600, 7200, "chat") if not r.error_type])
    assert chat["stats"]["requests"] == pytest.approx(truth, rel=0.02)
    summary = asyncio.run(get("/api/v1/requests/summary", business_type="chat", **hour))
    assert summary["requests"] == 0  # no gateway spans in this run
    assert summary["start_unix"] == t0 + 3600
    engine = [(e["target"], e["model"]) for e in summary["engine"]]  # one entry per server of the model
    assert engine == [("chat-0", "meta-llama/Llama-3.1-8B-Instruct"), ("chat-1", "meta-llama/Llama-3.1-8B-Instruct")]
    assert summary["engine"][0]["p95_seconds"]["ttft"] > 0
    # the same hour through every API that takes a period
    cost = asyncio.run(get("/api/v1/cost", group_by="business_type", **hour))
    assert cost["start_unix"] == t0 + 3600 and cost["allocated_usd"] > 0
    capacity = asyncio.run(get("/api/v1/capacity", **hour))
    assert capacity["end_unix"] == t0 + 7200
