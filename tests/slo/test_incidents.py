"""Incident tickets and pages of llmslo's own evaluator: target down, no healthy target, restart,
prefix-cache collapse; each fires, and none fires in healthy, idle or low-traffic periods."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.rollup import Cell, Row, SeriesCell, SeriesIdent
from collector.slo.incidents import TargetHealth, cache_alerts, target_alerts
from collector.slo.spec import SloRules, load_rules
from collector.sources.vllm import Kind, SeriesKey

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def rules() -> SloRules:
    return load_rules(ROOT / "rules").rules


def health(name: str, up: bool | None, down_since: float | None = None, restart: float | None = None) -> TargetHealth:
    return TargetHealth(name, frozenset({"chat"}), up, down_since, restart)


def names(wanted: dict[str, tuple[dict[str, str], dict[str, str]]]) -> list[tuple[str, str, str]]:
    return sorted(
        (labels["alertname"], labels["severity"], labels.get("target") or labels.get("business_type", ""))
        for labels, _ in wanted.values()
    )


def test_a_target_down_for_a_minute_is_a_ticket_and_a_business_type_with_none_up_pages(rules: SloRules) -> None:
    assert names(target_alerts(rules, [health("a", False, NOW - 30), health("b", True)], NOW)) == []
    assert names(target_alerts(rules, [health("a", False, NOW - 61), health("b", True)], NOW)) == [
        ("LLMSLOTargetDown", "ticket", "a")
    ]
    both = target_alerts(rules, [health("a", False, NOW - 90), health("b", False, NOW - 65)], NOW)
    assert names(both) == [
        ("LLMSLONoHealthyTarget", "page", "chat"),
        ("LLMSLOTargetDown", "ticket", "a"),
        ("LLMSLOTargetDown", "ticket", "b"),
    ]
    # not yet scraped (up None) is not down; a never-configured business type does not page
    assert names(target_alerts(rules, [health("a", None)], NOW)) == []


def test_a_restart_is_a_ticket_until_the_restart_window_has_passed(rules: SloRules) -> None:
    window = rules.thresholds.restart_window_seconds
    assert names(target_alerts(rules, [health("a", True, restart=NOW - 20)], NOW)) == [
        ("LLMSLOTargetRestarted", "ticket", "a")
    ]
    assert names(target_alerts(rules, [health("a", True, restart=NOW - window - 1)], NOW)) == []


def cache_rows(per_minute: list[tuple[float, float]], model: str = "m", target: str = "t") -> list[Row]:
    """(queries, hits) per minute, the last entry in the minute holding NOW."""
    last = int(NOW // 60) * 60
    rows = []
    for i, (queries, hits) in enumerate(reversed(per_minute)):
        start = last - 60 * i
        for metric, value in (("prefix_cache_queries", queries), ("prefix_cache_hits", hits)):
            ident = SeriesIdent(SeriesKey(model, metric), Kind.COUNTER)
            cell = Cell(Kind.COUNTER, value=value, observed_seconds=60)
            rows.append(Row(start, 60, SeriesCell(target, ident, "tokens", cell)))
    return rows


def chat(_target: str, _model: str) -> str:
    return "chat"


def test_a_prefix_cache_collapse_is_a_ticket(rules: SloRules) -> None:
    healthy = [(10_000.0, 5_000.0)] * 60
    collapsed = [(10_000.0, 0.0)] * 5
    fired = cache_alerts(rules, cache_rows(healthy + collapsed), NOW, chat)
    assert names(fired) == [("LLMSLOPrefixCacheCollapse", "ticket", "chat")]
    [(_, annotations)] = fired.values()
    assert "0.00" in annotations["description"] and "0.50" in annotations["description"]


@pytest.mark.parametrize(
    "what,minutes",
    [
        ("steady", [(10_000.0, 5_000.0)] * 65),
        ("idle", [(10_000.0, 5_000.0)] * 60 + [(0.0, 0.0)] * 5),
        ("low traffic", [(100.0, 50.0)] * 60 + [(100.0, 0.0)] * 5),
        ("never cached much", [(10_000.0, 300.0)] * 60 + [(10_000.0, 0.0)] * 5),
        ("a mild dip", [(10_000.0, 5_000.0)] * 60 + [(10_000.0, 3_000.0)] * 5),
    ],
)
def test_no_cache_ticket_in_healthy_idle_or_low_traffic_periods(
    rules: SloRules, what: str, minutes: list[tuple[float, float]]
) -> None:
    assert cache_alerts(rules, cache_rows(minutes), NOW, chat) == {}, what


def test_cache_collapse_is_judged_per_business_type(rules: SloRules) -> None:
    rows = cache_rows([(10_000.0, 5_000.0)] * 65, model="healthy") + cache_rows(
        [(10_000.0, 5_000.0)] * 60 + [(10_000.0, 0.0)] * 5, model="collapsed"
    )
    fired = cache_alerts(rules, rows, NOW, lambda _t, model: "chat" if model == "healthy" else "batch")
    assert names(fired) == [("LLMSLOPrefixCacheCollapse", "ticket", "batch")]
