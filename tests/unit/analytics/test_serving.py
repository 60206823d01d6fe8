from __future__ import annotations

import pytest

from collector.analytics.serving import UNASSIGNED, build_report, derive
from collector.rollup import Cell, DeltaTracker, SeriesCell
from collector.sources.vllm import read_scrape
from tests.vllm_fixtures import FAMILIES, Observations, render, workload


def window_cells(
    version: str,
    before: Observations,
    after: Observations,
    seconds: float = 60.0,
    target: str = "t1",
    model: str = "m",
) -> list[SeriesCell]:
    """Two scrapes `seconds` apart -> the cells the window holds."""
    tracker = DeltaTracker()
    first = read_scrape(render(FAMILIES[version], {(model, "0"): before}))
    tracker.commit(tracker.observe(first, 1000.0), 1000.0)
    deltas = tracker.observe(read_scrape(render(FAMILIES[version], {(model, "0"): after})), 1000.0 + seconds)
    return [SeriesCell(target, ident, "tokens", cell) for ident, cell in deltas.cells.items()]


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_derived_metrics_match_hand_computed_values(version: str) -> None:
    # one workload (20 requests) happens between the scrapes, 40 s apart
    stats = derive(window_cells(version, workload(1), workload(2), seconds=40.0), 300.0)
    assert stats.requests == 20.0
    assert stats.requests_per_second == pytest.approx(0.5)
    assert stats.finished == {
        "stop": 15.0,
        "length": 3.0,
        "abort": 2.0,
        **({"error": 0.0, "repetition": 0.0} if version == "0.33" else {}),
    }
    assert stats.error_ratio == pytest.approx(0.1)
    assert (stats.prompt_tokens, stats.generation_tokens) == (5000.0, 200.0)
    assert stats.prompt_tokens_per_second == pytest.approx(5000 / 40)
    assert stats.generation_tokens_per_second == pytest.approx(200 / 40)
    assert stats.preemptions_per_second == pytest.approx(1 / 40)
    assert stats.prefix_cache_hit_ratio == pytest.approx(0.4)
    assert stats.observed_seconds == 40.0
    ttft = {q.quantile: q for q in stats.latencies["ttft"].quantiles}
    assert ttft[0.5].value == pytest.approx(0.04) and (ttft[0.5].lower_bound, ttft[0.5].upper_bound) == (
        0.02,
        0.04,
    )
    assert ttft[0.9].value == pytest.approx(1.0)
    assert ttft[0.95].value == pytest.approx(2.5) and (ttft[0.95].lower_bound, ttft[0.95].upper_bound) == (
        1.0,
        2.5,
    )
    assert ttft[0.99].value == pytest.approx(4.5)
    assert stats.latencies["ttft"].mean_seconds == pytest.approx(sum(workload().ttft) / 20)
    assert stats.kv_cache_usage is not None and stats.kv_cache_usage.last == 0.42
    assert stats.requests_waiting is not None and stats.requests_waiting.last == 2.0


@pytest.mark.parametrize("version", ["0.6", "0.8", "0.10"])
def test_tpot_before_0_11_is_estimated_and_marked(version: str) -> None:
    stats = derive(window_cells(version, workload(1), workload(2)), 300.0)
    tpot = stats.latencies["tpot"]
    assert tpot.estimated and tpot.source == "itl"
    p50 = next(q for q in tpot.quantiles if q.quantile == 0.5)
    assert p50.value == pytest.approx(0.01 + 0.015 * 90 / 150)  # ITL: 150 x 0.02, 30 x 0.06
    # mean decode time per token after the first: (10 x 0.2 + 10 x 0.9) / (200 - 20)
    assert stats.tpot_mean_estimate_seconds == pytest.approx(11 / 180)


@pytest.mark.parametrize("version", ["0.11", "0.33"])
def test_tpot_from_0_11_is_the_per_request_histogram(version: str) -> None:
    stats = derive(window_cells(version, workload(1), workload(2)), 300.0)
    tpot = stats.latencies["tpot"]
    assert not tpot.estimated and tpot.source == "tpot"
    p95 = next(q for q in tpot.quantiles if q.quantile == 0.95)
    assert p95.value == pytest.approx(0.05 + 0.025 * 3 / 4)  # 16 x 0.02, 4 x 0.06; rank 19
    assert stats.tpot_mean_estimate_seconds is None


def test_v0_prefix_hit_rate_gauge_is_used_when_there_are_no_counters() -> None:
    stats = derive(window_cells("0.6", workload(1), workload(2)), 300.0)
    assert stats.prefix_cache_hit_ratio == pytest.approx(0.4)
    assert stats.prefix_cache_unit == "v0_gauge"


def test_hit_ratio_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    a1, a2 = workload(1), workload(1)
    a2.prefix_queries, a2.prefix_hits = a1.prefix_queries + 1000, a1.prefix_hits + 900  # 90 % on t1
    b1, b2 = workload(1), workload(1)
    b2.prefix_queries, b2.prefix_hits = b1.prefix_queries + 9000, b1.prefix_hits + 900  # 10 % on t2
    cells = window_cells("0.33", a1, a2, target="t1") + window_cells("0.33", b1, b2, target="t2")
    assert derive(cells, 300.0).prefix_cache_hit_ratio == pytest.approx(1800 / 10000)


def test_rates_add_across_targets_each_over_its_own_observed_time() -> None:
    cells = window_cells("0.33", workload(1), workload(2), seconds=20, target="t1") + window_cells(
        "0.33", workload(1), workload(3), seconds=80, target="t2"
    )
    assert derive(cells, 300.0).requests_per_second == pytest.approx(20 / 20 + 40 / 80)


def test_no_data_is_none_not_zero() -> None:
    stats = derive([], 300.0)
    assert stats.requests is None and stats.requests_per_second is None and stats.error_ratio is None
    assert stats.prefix_cache_hit_ratio is None and stats.latencies == {} and stats.kv_cache_usage is None


def test_mixed_bucket_layouts_are_never_merged() -> None:
    cells = window_cells("0.6", workload(1), workload(2), target="old") + window_cells(
        "0.33", workload(1), workload(4), target="new"
    )
    ttft = derive(cells, 300.0).latencies["ttft"]
    assert ttft.mixed_bucket_layouts
    assert ttft.count == 60.0  # the larger layout (new: 3 x 20) is used alone


def test_report_groups_by_target_model_and_business_type() -> None:
    cells = (
        window_cells("0.33", workload(1), workload(2), target="t1", model="chat-m")
        + window_cells("0.33", workload(1), workload(2), target="t2", model="chat-m")
        + window_cells("0.33", workload(1), workload(2), target="t2", model="code-m")
        + window_cells("0.33", workload(1), workload(2), target="t3", model="x")
    )
    mapping = {("t1", "chat-m"): "chat", ("t2", "chat-m"): "chat", ("t2", "code-m"): "code_completion"}
    report = build_report(cells, 300.0, 0, 300, lambda t, m: mapping.get((t, m)))
    assert [(g.target, g.model, g.business_type) for g in report.groups] == [
        ("t1", "chat-m", "chat"),
        ("t2", "chat-m", "chat"),
        ("t2", "code-m", "code_completion"),
        ("t3", "x", UNASSIGNED),
    ]
    by_type = {b.business_type: b.stats for b in report.business_types}
    assert by_type["chat"].requests == 40.0
    assert by_type["code_completion"].requests == 20.0
    only_chat = build_report(cells, 300.0, 0, 300, lambda t, m: mapping.get((t, m)), business_type="chat")
    assert {g.business_type for g in only_chat.groups} == {"chat"}


def test_gauges_add_counts_across_series() -> None:
    from collector.rollup import SeriesIdent
    from collector.sources.vllm import Kind, SeriesKey

    def g(target: str, v: float) -> SeriesCell:
        return SeriesCell(
            target,
            SeriesIdent(SeriesKey("m", "requests_waiting"), Kind.GAUGE),
            "",
            Cell(Kind.GAUGE, sum=v, gmin=v, gmax=v, glast=v, n=1),
        )

    stats = derive([g("a", 3), g("b", 4)], 60.0)
    assert stats.requests_waiting is not None and stats.requests_waiting.last == 7.0
