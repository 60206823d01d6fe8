"""Hours of simulated traffic in seconds, through the collector's own ingestion: the collector's
numbers against the simulator's exact per-request truth, and each incident against its metric."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from collector.analytics.serving import ServingStats, build_report
from collector.sim.fastclock import FastRun, run_into_store
from collector.sim.scenario import load_scenario
from collector.store.repository import Store

INTERVAL = 15.0


@pytest.fixture(scope="module")
def incident_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[FastRun, Store, float]:
    scenario = load_scenario("incidents")
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('fast') / 'fast.db'}")
    run = run_into_store(scenario, store, duration_seconds=160 * 60, scrape_interval=INTERVAL)
    return run, store, scenario.start_unix


def stats(
    run_store: tuple[FastRun, Store, float],
    start: float,
    end: float,
    target: str | None = None,
    deployment: str | None = None,
) -> ServingStats:
    """Collector stats over [start, end) seconds of the scenario, for one replica or deployment."""
    _run, store, t0 = run_store
    cells = [
        c
        for c in store.read_window(int(t0 + start), int(t0 + end), target=target)
        if deployment is None or c.target.startswith(deployment + "-")
    ]
    report = build_report(cells, end - start, int(t0 + start), int(t0 + end), lambda t, m: "all")
    assert report.business_types, f"no data in [{start}, {end})"
    return report.business_types[0].stats


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.mark.parametrize("deployment", ["chat", "code", "batch"])
def test_collector_p95_ttft_is_in_the_bucket_of_the_simulators_exact_p95(incident_run, deployment: str) -> None:  # type: ignore[no-untyped-def]
    run = incident_run[0]
    start, end = 60.0, 600.0  # before the first incident; scrapes at 60..585 cover (45, 585]
    s = stats(incident_run, start, end, deployment=deployment)
    truth = [
        r.ttft
        for r in run.requests
        if 45.0 < r.finished <= 585.0 and not r.error_type and r.replica.startswith(deployment + "-")
    ]
    assert s.latencies["ttft"].count == len(truth)
    p95 = next(q for q in s.latencies["ttft"].quantiles if q.quantile == 0.95)
    exact = exact_quantile(truth, 0.95)
    assert p95.lower_bound < exact <= p95.upper_bound, (exact, p95)


def test_request_and_token_totals_match_the_simulator_exactly(incident_run) -> None:  # type: ignore[no-untyped-def]
    run = incident_run[0]
    s = stats(incident_run, 60.0, 600.0)
    done = [r for r in run.requests if 45.0 < r.finished <= 585.0 and not r.error_type]
    assert s.requests == len(done)
    assert s.generation_tokens == sum(r.output_tokens for r in done)


def mean_len(s: ServingStats, metric: str) -> float:
    lat = s.lengths[metric] if metric.endswith("_length") else s.latencies[metric]
    assert lat.mean_seconds is not None
    return lat.mean_seconds


def p95(s: ServingStats, metric: str) -> float:
    return next(q.value for q in s.latencies[metric].quantiles if q.quantile == 0.95)


def test_latency_regression_raises_tpot_and_nothing_about_the_workload(incident_run) -> None:  # type: ignore[no-untyped-def]
    before, during = (
        stats(incident_run, 0, 600, deployment="chat"),
        stats(incident_run, 660, 1200, deployment="chat"),
    )
    assert mean_len(during, "tpot") > 2.5 * mean_len(before, "tpot")  # factor 3 on chat
    assert mean_len(during, "prefill") > 2 * mean_len(before, "prefill")
    assert during.prompt_tokens_per_second == pytest.approx(before.prompt_tokens_per_second, rel=0.3)
    code_before, code_during = (
        stats(incident_run, 0, 600, deployment="code"),
        stats(incident_run, 660, 1200, deployment="code"),
    )
    assert mean_len(code_during, "tpot") == pytest.approx(mean_len(code_before, "tpot"), rel=0.1)


def test_overload_multiplies_the_request_rate_and_builds_a_queue(incident_run) -> None:  # type: ignore[no-untyped-def]
    before, during = stats(incident_run, 1200, 1800), stats(incident_run, 1860, 2400)
    assert during.requests_per_second is not None and before.requests_per_second is not None
    assert during.requests_per_second > 3 * before.requests_per_second
    chat_during = stats(incident_run, 1860, 2400, deployment="chat")
    assert chat_during.requests_waiting is not None and chat_during.requests_waiting.max > 0
    assert p95(chat_during, "queue") > p95(stats(incident_run, 1200, 1800, deployment="chat"), "queue")


def test_prefix_cache_collapse_lowers_hits_raises_ttft_and_keeps_output_lengths(incident_run) -> None:  # type: ignore[no-untyped-def]
    before, during = (
        stats(incident_run, 2700, 3000, deployment="chat"),  # after the overload backlog drained
        stats(incident_run, 3060, 3600, deployment="chat"),
    )
    assert before.prefix_cache_hit_ratio is not None and before.prefix_cache_hit_ratio > 0.3
    assert during.prefix_cache_hit_ratio == 0.0
    assert mean_len(during, "ttft") > mean_len(before, "ttft")
    assert mean_len(during, "generation_length") == pytest.approx(mean_len(before, "generation_length"), rel=0.15)


def test_prompt_drift_lengthens_prompts_only(incident_run) -> None:  # type: ignore[no-untyped-def]
    before, during = (
        stats(incident_run, 3600, 4200, deployment="chat"),
        stats(incident_run, 4260, 4800, deployment="chat"),
    )
    # factor 3 on the user part of the prompt; the shared system prompt is unchanged
    assert mean_len(during, "prompt_length") > 1.3 * mean_len(before, "prompt_length")
    assert mean_len(during, "generation_length") == pytest.approx(mean_len(before, "generation_length"), rel=0.15)
    assert during.requests_per_second == pytest.approx(before.requests_per_second, rel=0.3)


def test_error_burst_raises_the_error_ratio(incident_run) -> None:  # type: ignore[no-untyped-def]
    before, during = (
        stats(incident_run, 4800, 5400, deployment="chat"),
        stats(incident_run, 5460, 6000, deployment="chat"),
    )
    assert before.error_ratio == 0.0
    assert during.error_ratio == pytest.approx(0.3, abs=0.06)
    assert mean_len(during, "tpot") == pytest.approx(mean_len(before, "tpot"), rel=0.15)


def test_server_restart_resets_counters_without_negative_deltas(incident_run) -> None:  # type: ignore[no-untyped-def]
    run, store, t0 = incident_run
    assert run.scrapers["chat-0"].status.counter_resets_total > 0
    assert run.scrapers["chat-1"].status.counter_resets_total == 0
    cells = store.read_window(int(t0), int(t0 + 160 * 60))
    assert all(c.cell.value >= 0 and all(b >= 0 for b in c.cell.buckets or []) for c in cells)
    around = stats(incident_run, 6540, 6720, target="chat-0")
    assert around.requests is not None and around.requests > 0


def test_replica_down_is_a_refused_scrape_and_its_traffic_moves(incident_run) -> None:  # type: ignore[no-untyped-def]
    run = incident_run[0]
    assert run.scrapers["chat-1"].status.errors_total["connect"] >= 10 * 60 / INTERVAL - 1
    before, during = (
        stats(incident_run, 6600, 7200, target="chat-0"),
        stats(incident_run, 7260, 7800, target="chat-0"),
    )
    assert during.requests_per_second is not None and before.requests_per_second is not None
    assert during.requests_per_second > 1.5 * before.requests_per_second


def test_slow_and_malformed_metrics_mark_targets_down_with_reasons(incident_run) -> None:  # type: ignore[no-untyped-def]
    run = incident_run[0]
    assert run.scrapers["code-0"].status.errors_total["timeout"] == 5 * 60 / INTERVAL
    assert run.scrapers["batch-0"].status.errors_total["parse"] == 5 * 60 / INTERVAL
    assert run.scrapers["batch-0"].status.up  # recovered after the incident


@pytest.mark.parametrize("version", ["0.10", "0.6"])
def test_older_naming_families_give_the_same_totals(tmp_path: Path, version: str) -> None:
    scenario = load_scenario("healthy")
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    run = run_into_store(scenario, store, duration_seconds=600, version=version)
    t0 = scenario.start_unix
    report = build_report(store.read_window(int(t0), int(t0 + 660)), 660, 0, 0, lambda t, m: "all")
    s = report.business_types[0].stats
    # vLLM V1 (0.10) exposes _created samples, so counting starts at the servers' start; V0 (0.6)
    # disabled them and has no process series in the simulator: its first scrape is a baseline
    counted_from = 0.0 if version == "0.10" else INTERVAL
    done = [r for r in run.requests if counted_from < r.finished <= 600 and not r.error_type]
    assert s.requests == len(done)
    assert s.latencies["tpot"].estimated is True
    store.close()
