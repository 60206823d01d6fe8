"""Cost attribution against hand-computed values: allocation, busy/idle split, work calibrated on
prefill and decode time, the multiplier fallback, idle sharing, and tenants from spans."""

from __future__ import annotations

import pytest

from collector.config import CostConfig, DeploymentConfig, Settings, TargetConfig
from collector.cost.allocation import CostInputs, CostReport, Line, Work, attribute, tenant_lines
from collector.cost.inventory import Inventory
from collector.traces.rollup import RequestCell, RequestKey


def inventory(**deployment: object) -> Inventory:
    settings = Settings(
        targets=[TargetConfig(name=n, url=f"http://127.0.0.1:1/{n}") for n in ("a", "b", "c")],
        deployments=[DeploymentConfig.model_validate({"name": "d", "targets": ["a", "b"], "gpu": "L4", **deployment})],
    )
    return Inventory.from_settings(settings)


def place(target: str, model: str) -> str:
    return {"m1": "chat", "m2": "batch"}.get(model, "chat")


def work(**kw: float) -> Work:
    return Work(**kw)  # type: ignore[arg-type]


def test_hand_computed_allocation_busy_share_and_work_split() -> None:
    inputs = CostInputs()
    # a: 1000 uncached + 1000 cached prompt tokens, 500 output; 2 s prefill, 10 s decode; busy 3/4 of 3600 s
    inputs.work[("a", "m1")] = work(
        requests=10,
        prompt_tokens=2000,
        cached_tokens=1000,
        output_tokens=500,
        prefill_seconds=2.0,
        decode_seconds=10.0,
        busy_sum=3,
        busy_n=4,
        observed_seconds=3600,
    )
    # b: 3000 uncached prompt tokens, 1500 output; busy 1/4 of 3600 s
    inputs.work[("b", "m2")] = work(
        requests=30,
        prompt_tokens=3000,
        output_tokens=1500,
        prefill_seconds=6.0,
        decode_seconds=30.0,
        busy_sum=1,
        busy_n=4,
        observed_seconds=3600,
    )
    inputs.work[("c", "m1")] = work(requests=5, prompt_tokens=100, output_tokens=10)  # in no deployment
    report = attribute(inputs, inventory(replicas=2, gpu_hour_usd=3.0, fixed_monthly_usd=730.0), CostConfig(),
                       0, 3600, place)  # fmt: skip
    [d] = report.deployments
    assert d.allocated_usd == pytest.approx(2 * 3.0 + 1.0)  # 2 replicas x $3 + $1/h fixed
    assert d.busy_share == pytest.approx(0.5) and d.busy_usd == pytest.approx(3.5)
    # a = 8 s / 4000 uncached tokens, c = 40 s / 2000 output tokens
    assert d.prefill_seconds_per_token == pytest.approx(0.002) and d.decode_seconds_per_token == pytest.approx(0.02)
    w_a, w_b = 0.002 * 1000 + 0.02 * 500, 0.002 * 3000 + 0.02 * 1500  # 12 and 36 work-seconds
    a = report.groups[("d", "a", "m1", "chat")]
    b = report.groups[("d", "b", "m2", "batch")]
    assert a.busy_usd == pytest.approx(3.5 * w_a / (w_a + w_b)) and b.busy_usd == pytest.approx(3.5 * w_b / (w_a + w_b))
    assert a.idle_usd == pytest.approx(3.5 * w_a / (w_a + w_b))  # idle shared by the same weights
    assert a.input_usd == pytest.approx(7.0 * 2 / 48) and a.output_usd == pytest.approx(7.0 * 10 / 48)
    assert a.cache_savings_usd == pytest.approx(3.5 / 48 * 0.002 * 1000)  # hits' prefill, at the busy price
    assert report.unpriced_targets == ["c"]
    assert report.groups[(None, "c", "m1", "chat")].total_usd == 0.0
    assert sum(line.total_usd for line in report.groups.values()) == pytest.approx(d.allocated_usd)
    chat = report.by("business_type")["chat"].as_dict()
    assert chat["utilization"] == pytest.approx(0.5)
    assert chat["usd_per_million_output_tokens"] == pytest.approx(a.output_usd / 510 * 1e6)


def test_no_work_is_all_idle_and_share_idle_off_keeps_it() -> None:
    quiet = CostInputs()
    quiet.work[("a", "m1")] = work(busy_sum=0, busy_n=4, observed_seconds=3600)
    report = attribute(quiet, inventory(gpu_hour_usd=2.0), CostConfig(), 0, 3600, place)
    [d] = report.deployments
    assert d.allocated_usd == pytest.approx(2.0) and d.idle_usd == d.unshared_idle_usd == pytest.approx(2.0)
    inputs = CostInputs()
    inputs.work[("a", "m1")] = work(requests=1, prompt_tokens=100, output_tokens=100, busy_sum=1, busy_n=2,
                                    observed_seconds=1800)  # fmt: skip
    report = attribute(inputs, inventory(gpu_hour_usd=2.0), CostConfig(share_idle=False), 0, 3600, place)
    [d] = report.deployments
    assert d.replica_hours == pytest.approx(0.5)  # counted: the time it was scraped
    assert not d.calibrated  # no prefill/decode histograms: the multiplier weights the tokens
    line = report.groups[("d", "a", "m1", "chat")]
    assert line.idle_usd == 0 and d.unshared_idle_usd == pytest.approx(0.5)
    assert line.output_usd / line.input_usd == pytest.approx(2.5)


def test_tenants_split_a_models_cost_and_never_exceed_it() -> None:
    report = CostReport(0, 3600, [], {("d", "a", "m1", "chat"): Line(10, 1000, 0, 500, 6.0, 2.0, 2.0, 6.0)}, [])

    def key(tenant: str, model: str = "m1") -> RequestKey:
        return RequestKey(0, "chat", model, tenant, "gateway")

    def cell(n: int, inp: int, out: int) -> RequestCell:
        return RequestCell(total=n, input_tokens=inp, output_tokens=out)

    exact = tenant_lines(report, [(key("x"), cell(4, 400, 100)), (key("y"), cell(6, 600, 400))], 0.0)
    assert exact["x"].total_usd == pytest.approx(2.0 * 0.4 + 6.0 * 0.2)
    assert sum(t.total_usd for t in exact.values()) == pytest.approx(8.0)
    assert exact["x"].busy_usd == pytest.approx(exact["x"].total_usd * 0.75)
    # spans claiming twice the engine's tokens: scaled, same split, same total
    double = tenant_lines(report, [(key("x"), cell(4, 800, 200)), (key("y"), cell(6, 1200, 800))], 0.0)
    assert sum(t.total_usd for t in double.values()) == pytest.approx(8.0)
    assert double["x"].total_usd == pytest.approx(exact["x"].total_usd)
    # a model no engine reported: its requests are counted, not priced
    other = tenant_lines(report, [(key("z", "m9"), cell(3, 10, 10))], 0.0)
    assert other["z"].requests == 3 and other["z"].total_usd == 0
