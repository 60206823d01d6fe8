"""The saturation forecast: a least-squares line through weekly peaks and the date it crosses
its limit, on synthetic trends with known slopes."""

from __future__ import annotations

import random

import pytest

from collector.cost.capacity import WEEK_SECONDS, fit_trend

MONDAY = 1_767_571_200  # 2026-01-05 00:00 UTC


def test_a_noisy_linear_trend_recovers_its_slope_within_5_percent_and_its_crossing() -> None:
    rng = random.Random(3)
    slope, start = 0.04, 0.40  # KV-cache peak grows 4 points a week
    weeks = [(MONDAY + i * WEEK_SECONDS, start + slope * i + rng.gauss(0, 0.004)) for i in range(12)]
    trend = fit_trend(weeks, limit=0.95)
    assert trend is not None and trend.points == 12
    assert trend.slope_per_week == pytest.approx(slope, rel=0.05)
    truth = MONDAY + (0.95 - start) / slope * WEEK_SECONDS
    assert trend.crosses_unix == pytest.approx(truth, abs=WEEK_SECONDS / 2)
    low, high = trend.crosses_range_unix
    assert low is not None and high is not None and low < trend.crosses_unix < high
    assert low <= truth <= high


def test_flat_falling_and_short_series() -> None:
    flat = fit_trend([(MONDAY + i * WEEK_SECONDS, 0.5) for i in range(5)], 0.95)
    assert flat is not None and flat.slope_per_week == 0 and flat.crosses_unix is None
    falling = fit_trend([(MONDAY + i * WEEK_SECONDS, 0.9 - 0.1 * i) for i in range(4)], 0.95)
    assert falling is not None and falling.crosses_unix is None
    assert fit_trend([(MONDAY, 0.5)], 0.95) is None  # one week says nothing about a trend
    two = fit_trend([(MONDAY, 0.5), (MONDAY + WEEK_SECONDS, 0.6)], 1.0)
    assert two is not None and two.slope_stderr is None and two.crosses_unix == pytest.approx(MONDAY + 5 * WEEK_SECONDS)


def test_capacity_report_forecasts_from_hourly_rows_grouped_into_monday_weeks() -> None:
    from collector.config import CostConfig, DeploymentConfig, Settings, TargetConfig
    from collector.cost.capacity import capacity_report
    from collector.cost.inventory import Inventory
    from collector.rollup import Cell, Row, SeriesCell, SeriesIdent
    from collector.sources.vllm import Kind, SeriesKey

    settings = Settings(
        targets=[TargetConfig(name="a", url="http://127.0.0.1:1/metrics")],
        deployments=[DeploymentConfig(name="pool", targets=["a"], gpu="L4", gpu_hour_usd=1.0)],
    )
    rows = []
    kv = SeriesIdent(SeriesKey("m", "kv_cache_usage"), Kind.GAUGE)
    for week in range(6):
        for hour in range(0, 7 * 24, 6):
            start = MONDAY + week * WEEK_SECONDS + hour * 3600
            # the weekly peak (Friday 12:00) grows 5 points a week; the rest of the week is low
            value = 0.5 + 0.05 * week if hour == 4 * 24 + 12 else 0.2
            cell = Cell(Kind.GAUGE, sum=value, gmin=value, gmax=value, glast=value, n=1, observed_seconds=3600)
            rows.append(Row(start, 3600, SeriesCell("a", kv, "", cell)))
    [cap] = capacity_report(rows, Inventory.from_settings(settings), CostConfig(), None, lambda t, m: None)
    trend = cap.forecasts["kv_cache_usage"]
    assert trend.points == 6 and trend.first_week_unix == MONDAY
    assert trend.slope_per_week == pytest.approx(0.05)
    assert trend.crosses_unix == pytest.approx(MONDAY + 9 * WEEK_SECONDS)  # 0.5 + 0.05 x 9 = 0.95
    assert cap.kv_usage_peak == pytest.approx(0.75)
