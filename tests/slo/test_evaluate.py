"""SLO evaluation on hand-made rollup rows, with hand-computed expectations."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from collector.rollup import Cell, Row, SeriesCell, SeriesIdent
from collector.slo.evaluate import Events, PeriodCounter, burn, evaluate, events_for, period_events
from collector.slo.spec import load_rules
from collector.sources.vllm import Kind, SeriesKey

BOUNDS = (0.5, 1.0, 2.5)
NOW = 1_800_000_000.0  # a minute boundary + 0
END = int(NOW // 60) * 60 + 60

RULES = """\
version: v1
min_events: 30
business_types:
  chat:
    models: ["chat-model"]
    objectives:
      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}
      - {name: slow, sli: latency, metric: ttft, threshold: 2s, objective: 0.95}
      - {name: errors, sli: error_ratio, objective: 0.99}
      - {name: goodput, sli: goodput, objective: 0.9}
  batch:
    models: ["batch-model"]
    objectives:
      - {name: throughput, sli: throughput, min_tokens_per_second: 10, slice: 5m, objective: 0.9}
"""


@pytest.fixture
def rules(tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    return load_rules(p).rules


def load_rules_text(text: str):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "r.yaml"
        p.write_text(text)
        return load_rules(p).rules


def ttft_row(minute_start: int, fast: float, mid: float, slow: float, model: str = "chat-model") -> Row:
    """fast <= 0.5 s, mid in (1.0, 2.5], slow > 2.5 s (per-bucket counts, made cumulative)."""
    cumulative = [fast, fast, fast + mid, fast + mid + slow]
    ident = SeriesIdent(SeriesKey(model, "ttft"), Kind.HISTOGRAM, BOUNDS)
    return Row(
        minute_start,
        60,
        SeriesCell("t", ident, "", Cell(Kind.HISTOGRAM, value=cumulative[-1], buckets=cumulative, observed_seconds=60)),
    )


def success_row(minute_start: int, reason: str, n: float, model: str = "chat-model") -> Row:
    ident = SeriesIdent(SeriesKey(model, "request_success", (("finished_reason", reason),)), Kind.COUNTER)
    return Row(minute_start, 60, SeriesCell("t", ident, "", Cell(Kind.COUNTER, value=n, observed_seconds=60)))


def tokens_row(minute_start: int, n: float, model: str = "batch-model") -> Row:
    ident = SeriesIdent(SeriesKey(model, "generation_tokens"), Kind.COUNTER)
    return Row(minute_start, 60, SeriesCell("t", ident, "", Cell(Kind.COUNTER, value=n, observed_seconds=60)))


def status(statuses, slo: str):  # type: ignore[no-untyped-def]
    return next(s for s in statuses if s.objective.slo == slo)


def test_latency_events_at_a_bucket_bound_are_exact(rules) -> None:  # type: ignore[no-untyped-def]
    o = next(o for o in rules.objectives if o.slo == "chat-ttft")
    ev = events_for(o, [ttft_row(END - 60, 90, 8, 2)], END - 60, END)
    assert (ev.good, ev.total, ev.exact) == (90, 100, True)
    assert burn(ev, o) == pytest.approx(0.10 / 0.05)


def test_latency_events_off_a_bound_are_interpolated_and_flagged(rules) -> None:  # type: ignore[no-untyped-def]
    o = next(o for o in rules.objectives if o.slo == "chat-slow")
    ev = events_for(o, [ttft_row(END - 60, 90, 9, 1)], END - 60, END)
    assert not ev.exact
    assert ev.good == pytest.approx(90 + 9 * (1.0 / 1.5))


def test_error_budget_burn_and_pairs(rules) -> None:  # type: ignore[no-untyped-def]
    rows = []
    for i in range(60 * 6):  # six hours, 100 requests a minute, 0.5 % errors ...
        start = END - 60 * (i + 1)
        rows += [success_row(start, "stop", 99.5), success_row(start, "error", 0.5)]
    for i in range(10):  # ... except the last ten minutes: 20 % errors
        start = END - 60 * (i + 1)
        rows[2 * i] = success_row(start, "stop", 80)
        rows[2 * i + 1] = success_row(start, "error", 20)
    statuses = evaluate(rules, rows, NOW)
    st = status(statuses, "chat-errors")
    five = st.windows[300.0].events
    assert (five.good, five.total) == (400, 500)
    assert st.burn_rate(300.0) == pytest.approx(0.2 / 0.01)
    hour = st.windows[3600.0].events
    assert hour.bad == pytest.approx(10 * 20 + 50 * 0.5)
    assert st.burn_rate(3600.0) == pytest.approx((225 / 6000) / 0.01)  # 3.75x: below 14.4
    firing = {(p.pair.severity, p.pair.long_seconds) for p in st.pairs if p.firing}
    # 1h: 3.75 < 14.4; 6h: (200 + 350 * 0.5) / 36000 / 0.01 = 1.04 < 6; 1d and 3d hold 6 h of data: 1.04 > 1
    assert firing == {("ticket", 259200.0)}
    period_bad = 10 * 20 + 350 * 0.5
    assert st.budget_remaining == pytest.approx(1 - (period_bad / 36000) / 0.01)


def test_low_traffic_never_fires_and_idle_is_no_data(rules) -> None:  # type: ignore[no-untyped-def]
    rows = [success_row(END - 60 * (i + 1), "error", 0.1) for i in range(120)]  # 12 events in 2 h, all bad
    st = status(evaluate(rules, rows, NOW), "chat-errors")
    assert st.burn_rate(3600.0) == pytest.approx(100.0)
    assert not any(p.firing for p in st.pairs)
    assert all("low traffic" in p.reason for p in st.pairs)
    idle = status(evaluate(rules, [], NOW), "chat-errors")
    assert idle.budget_remaining is None and idle.windows[3600.0].sli is None
    assert all(p.reason == "no data" and not p.firing for p in idle.pairs)


def test_objectives_needing_traces_report_no_data(rules) -> None:  # type: ignore[no-untyped-def]
    st = status(evaluate(rules, [ttft_row(END - 60, 1, 1, 1)], NOW), "chat-goodput")
    assert st.no_data_reason.startswith("needs trace ingestion") and st.budget_remaining is None


def test_throughput_time_slices(rules) -> None:  # type: ignore[no-untyped-def]
    rows = []
    start = int(NOW) - 3600  # slices are aligned to the epoch: 12 slices of 5 minutes from here
    for minute in range(60):
        t = start + 60 * minute
        slice_index = minute // 5
        if slice_index in (2, 3):
            continue  # no batch traffic: no data, not bad
        rate = 5 if slice_index == 7 else 20  # slice 7 is too slow
        rows += [tokens_row(t, rate * 60), success_row(t, "stop", 1, model="batch-model")]
    st = status(evaluate(rules, rows, NOW), "batch-throughput")
    hour = st.windows[3600.0].events
    # the 1h window is [NOW - 3540, NOW + 60): slice 0 starts before it, so slices 1-11 are in it;
    # 2 and 3 had no traffic (no data), 7 was too slow: 8 good of 9
    assert (hour.good, hour.total) == (8, 9)


def test_rows_of_other_models_are_ignored(rules) -> None:  # type: ignore[no-untyped-def]
    st = status(evaluate(rules, [ttft_row(END - 60, 1, 99, 0, model="other-model")], NOW), "chat-ttft")
    assert st.windows[300.0].events.total == 0


def test_events_add() -> None:
    assert Events(1, 2).plus(Events(3, 4, exact=False)) == Events(4, 6, exact=False)


def test_goodput_and_trace_latency_come_from_request_rollups(rules) -> None:  # type: ignore[no-untyped-def]
    from collector.traces.normalize import RequestRecord
    from collector.traces.rollup import LatencyTarget, aggregate

    def rec(i: int, ttft: float, error: str = "") -> RequestRecord:
        return RequestRecord(
            i.to_bytes(16, "big"),
            i.to_bytes(8, "big"),
            END - 90,
            END - 70,
            "gateway",
            "chat-model",
            "chat",
            "t",
            10,
            0,
            20,
            ttft,
            0.02,
            1.0,
            None,
            "stop",
            error,
        )

    records = (
        [rec(i, 0.5) for i in range(90)]
        + [rec(100 + i, 1.5) for i in range(8)]
        + [rec(200, 0.2, "timeout"), rec(201, 0.2, "timeout")]
    )
    targets = {"chat": [LatencyTarget("chat-ttft", "ttft", 1.0)]}
    cells = list(aggregate(records, targets).items())
    statuses = evaluate(rules, [], NOW, cells)
    goodput = status(statuses, "chat-goodput")
    five = goodput.windows[300.0].events
    assert (five.good, five.total) == (90, 100)  # 8 too slow, 2 failed: not good at once
    assert goodput.no_data_reason == "" and goodput.exact
    assert goodput.burn_rate(300.0) == pytest.approx(0.10 / 0.10)
    assert status(evaluate(rules, [], NOW), "chat-goodput").no_data_reason.startswith("needs trace ingestion")


def test_a_period_counted_piece_by_piece_equals_one_read(rules) -> None:  # type: ignore[no-untyped-def]
    """The weekly report counts each day an hour of rows at a time (`PeriodCounter`): any cut of
    the rows gives the events of reading them at once, and those of the burn-rate windows' path
    (`events_for`) over the same span, throughput slices (judged only once complete) included."""
    start = int(NOW) - int(NOW) % 3600 - 3 * 3600  # three hours of minutes
    end = start + 3 * 3600
    rows: list[Row] = []
    for minute in range(180):
        t = start + 60 * minute
        rows.append(ttft_row(t, 10 + minute % 7, 3 + minute % 5, minute % 3))
        rows.append(success_row(t, "stop", 20 + minute % 4))
        rows.append(success_row(t, "error" if minute % 2 else "abort", minute % 3))
        if (minute // 5) % 6 != 2:  # every sixth 5-minute slice has no batch traffic
            rows.append(tokens_row(t, (5 if (minute // 5) % 4 == 0 else 20) * 60))
            rows.append(success_row(t, "stop", 1, model="batch-model"))
        rows.append(ttft_row(t, 100, 0, 0, model="no-rule-lists-me"))
    rows.append(Row(end - 1800, 3600, rows[0].cell))  # an hour cell reaching past the period: left out
    with_cost = load_rules_text(
        RULES + "      - {name: cost, sli: cost_ceiling, max_usd_per_million_tokens: 0.5, objective: 0.9, slice: 1h}\n"
    )

    def cost_of(inputs, lo, hi):  # type: ignore[no-untyped-def]
        """0.40 USD per million tokens, or 0.60 for slices whose hour starts odd (bad)."""
        tokens = sum(w.output_tokens for w in inputs.work.values())
        return {"batch": (tokens * (0.6 if (lo // 3600) % 2 else 0.4) / 1e6, tokens)}

    whole = period_events(with_cost, rows, [], start, end, cost_of=cost_of)
    assert {o.slo: e.total for o, e in whole}["batch-throughput"] == 30  # 36 slices, 6 without traffic
    cost = {o.slo: e for o, e in whole}["batch-cost"]
    assert cost.total == 3 and cost.good in (1, 2)  # three hour slices, alternately over the ceiling
    for step in (60, 420, 3600):  # pieces of a minute, 7 minutes (cutting slices), an hour
        counter = PeriodCounter(with_cost, start, end, cost_of=cost_of)
        for lo in range(start - 3600, end + 3600, step):
            counter.add([r for r in rows if lo <= r.start_unix < lo + step])
        pieces = counter.events()
        assert [o.slo for o, _ in pieces] == [o.slo for o, _ in whole]
        for (o, a), (_, b) in zip(pieces, whole, strict=True):
            assert (a.good, a.total, a.exact) == pytest.approx((b.good, b.total, b.exact), rel=1e-12), (step, o.slo)
    by_slo = dict((o.slo, e) for o, e in whole)
    inside = [r for r in rows if start <= r.start_unix and r.start_unix + r.period_seconds <= end]
    for o in rules.objectives:
        if o.sli in ("latency", "error_ratio", "throughput"):
            mine = [
                r
                for r in inside
                if r.cell.ident.key.model == ("batch-model" if o.business_type == "batch" else "chat-model")
            ]
            assert events_for(o, mine, start, end + 60) == pytest.approx(by_slo[o.slo]), o.slo
    errors = by_slo["chat-errors"]
    assert errors.total == sum(20 + m % 4 + m % 3 for m in range(180))
    assert errors.bad == sum(m % 3 for m in range(180))
