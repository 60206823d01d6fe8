"""Correct on a real fleet: one business-type mapping, servers that start before or after llmslo,
restarts mid-window. Real loopback HTTP targets, the real store, the shipped default rules."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import pytest

from collector import conventions as conv
from collector.api.app import create_app
from collector.config import Settings
from collector.rollup import MINUTE_SECONDS
from collector.runtime import Runtime
from collector.sources.scrape import ScrapeError
from tests.targets import Behaviour, target_server
from tests.vllm_fixtures import FAMILIES, render, workload

ROOT = Path(__file__).resolve().parents[2]
UNLISTED = "acme/house-model-13b"  # a model name no rule lists


def body(scale: int, process_start: float | None, model: str = UNLISTED) -> bytes:
    """A vLLM 0.33 body; workload(scale) has 5,000 x scale prompt tokens and 20 x scale requests."""
    text = render(FAMILIES["0.33"], {(model, "0"): workload(scale)}, created=process_start or 1.0)
    if process_start is None:  # multiprocess mode: neither _created nor process series
        return ("\n".join(line for line in text.splitlines() if "_created" not in line) + "\n").encode()
    text += f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {process_start!r}\n"
    return text.encode()


def settings(tmp_path: Path, targets: list[dict[str, object]], **extra: object) -> Settings:
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "rules": str(ROOT / "rules"),
            "targets": targets,
            "scrape": {"interval": 1.0, "timeout": 1.0},
            **extra,
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_model_no_rule_lists_is_evaluated_under_its_targets_business_type(tmp_path: Path) -> None:
    started = time.time() - 3600  # long-running servers: their first scrape is a baseline
    scale = {"n": 1}
    routes = {
        "/chat": Behaviour(lambda: body(scale["n"], started)),
        "/stray": Behaviour(lambda: body(scale["n"], started, model="nobody/knows-me")),
        "/conflict": Behaviour(lambda: body(scale["n"], started, model="meta-llama/Llama-3.1-8B-Instruct")),
    }
    with target_server(routes) as srv:
        s = settings(
            tmp_path,
            [
                {"name": "chat-0", "url": srv.url("/chat"), "business_type": "chat"},
                {"name": "stray-0", "url": srv.url("/stray")},
                # the rules put this model under chat; the target says customer service
                {"name": "cs-0", "url": srv.url("/conflict"), "business_type": "customer_service"},
            ],
        )
        rt = Runtime(s)

        async def run() -> None:
            await rt.start()
            await rt.scrape_all_once()
            scale["n"] = 4
            await rt.scrape_all_once()

        asyncio.run(run())
        now = time.time()
        statuses = {st.objective.slo: st for st in rt.evaluate_slos(now)}
        ttft = statuses["chat-ttft"].windows[300.0].events
        # chat-0's 60 requests (3 x 20) and cs-0's are not mixed: cs-0 belongs to customer service
        assert ttft.total == pytest.approx(60.0)
        assert statuses["customer-service-ttft"].windows[300.0].events.total == pytest.approx(60.0)
        assert statuses["chat-errors"].windows[300.0].events.total == pytest.approx(60.0)
        report = rt.report(300.0, now)
        assert {(g.target, g.business_type) for g in report.groups} == {
            ("chat-0", "chat"),
            ("stray-0", "unassigned"),
            ("cs-0", "customer_service"),
        }
        assert rt.fleet.unassigned() == [("stray-0", "nobody/knows-me")]
        [(target, model, placement)] = rt.fleet.conflicts()
        assert model == "meta-llama/Llama-3.1-8B-Instruct"
        assert (target, placement.by_target, placement.by_rules) == ("cs-0", "customer_service", "chat")
        asyncio.run(rt.close())


def test_unassigned_series_and_conflicts_are_on_the_api_and_metrics(tmp_path: Path) -> None:
    started = time.time() - 3600
    routes = {
        "/stray": Behaviour(lambda: body(1, started, model="nobody/knows-me")),
        "/conflict": Behaviour(lambda: body(1, started, model="meta-llama/Llama-3.1-8B-Instruct")),
    }
    with target_server(routes) as srv:
        s = settings(
            tmp_path,
            [
                {"name": "stray-0", "url": srv.url("/stray")},
                {"name": "cs-0", "url": srv.url("/conflict"), "business_type": "customer_service"},
            ],
        )
        rt = Runtime(s)
        app = create_app(s, rt, schedule=False)

        async def run() -> tuple[dict[str, object], str]:
            async with app.router.lifespan_context(app):
                await rt.scrape_all_once()
                rt.refresh_snapshot(time.time())
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://llmslo") as client:
                    targets = (await client.get("/api/v1/targets")).json()
                    metrics = (await client.get("/metrics")).text
            return {t["name"]: t for t in targets["targets"]}, metrics

        targets, metrics = asyncio.run(run())
    assert targets["stray-0"]["unassigned_models"] == ["nobody/knows-me"]  # type: ignore[index]
    assert targets["cs-0"]["business_type_conflicts"] == [  # type: ignore[index]
        "meta-llama/Llama-3.1-8B-Instruct: target says 'customer_service', rules say 'chat'"
    ]
    assert f'{conv.UNASSIGNED_MODELS}{{model="nobody/knows-me",target="stray-0"}} 1.0' in metrics
    assert f'{conv.BUSINESS_TYPE_CONFLICTS}{{model="meta-llama/Llama-3.1-8B-Instruct",target="cs-0"}} 1.0' in metrics


def test_a_server_that_comes_up_after_llmslo_is_counted_from_its_start(tmp_path: Path) -> None:
    """Started while the server is still starting: never-up targets are retried every interval
    (no backoff), and the first successful scrape counts everything since the process started."""
    port = free_port()
    s = settings(tmp_path, [{"name": "late", "url": f"http://127.0.0.1:{port}/metrics", "business_type": "chat"}])
    rt = Runtime(s)
    scraper = rt.scrapers["late"]

    async def failing() -> None:
        await rt.start()
        for _ in range(6):
            assert not await scraper.scrape_once()
            # retried on the next tick, never pushed back exponentially
            assert scraper.status.next_allowed_unix <= time.time()

    asyncio.run(failing())
    assert scraper.status.errors_total[conv.REASON_CONNECT] == 6
    process_start = time.time() - 20  # it came up 20 s ago and served traffic since
    with target_server({"/metrics": Behaviour(lambda: body(2, process_start))}) as srv:
        scraper.target = scraper.target.model_copy(update={"url": srv.url("/metrics")})
        assert asyncio.run(scraper.scrape_once())
    stats = rt.report(300.0, time.time()).business_types[0].stats
    # exactly the server's own counters: 2 x 5,000 prompt tokens, 2 x 20 requests
    assert stats.prompt_tokens == 10000.0
    assert stats.requests == 40.0
    assert stats.prompt_tokens_per_second == pytest.approx(10000.0 / 20, rel=0.1)
    assert scraper.status.restarts_total == 0  # a first start is not a restart
    asyncio.run(rt.close())


def test_a_target_up_before_but_long_running_is_a_baseline_and_multiprocess_mode_too(tmp_path: Path) -> None:
    s = settings(tmp_path, [{"name": "t", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"}])
    rt = Runtime(s)
    now = 1_800_000_000.0
    rt.scrapers["t"].ingest(body(3, now - 86400), None, now)
    rt.scrapers["t"].ingest(body(3, None), None, now + 1)  # no start time known at all
    assert rt.report(300.0, now + 1).business_types[0].stats.prompt_tokens == 0.0


def test_rates_after_a_restart_cover_only_the_time_since_the_new_process_started(tmp_path: Path) -> None:
    """Steady 5,000 prompt tokens per 15 s; the server is down from 60 s to 110 s, the new process
    starts at 105 s and is scraped at 120 s: its rate is the true rate, and one restart counts."""
    s = settings(tmp_path, [{"name": "t", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"}])
    rt = Runtime(s)
    scraper = rt.scrapers["t"]
    t0 = 1_800_000_000.0 - 1_800_000_000.0 % MINUTE_SECONDS
    first_start = t0 - 3600
    for i, t in enumerate(range(0, 61, 15)):
        assert scraper.ingest(body(10 + i, first_start), None, t0 + t)
    for t in (75, 90, 105):
        assert not scraper.ingest(None, None, t0 + t, ScrapeError(conv.REASON_CONNECT, "connection refused"))
    assert scraper.ingest(body(1, t0 + 105), None, t0 + 120)
    stats = rt.report(60.0, t0 + 125).business_types[0].stats
    assert stats.prompt_tokens == 5000.0
    assert stats.prompt_tokens_per_second == pytest.approx(5000.0 / 15, rel=0.1)
    assert scraper.status.restarts_total == 1
    assert scraper.status.last_restart_unix == t0 + 105
    assert scraper.status.counter_resets_total > 1  # every series reset; still one restart
    assert scraper.ingest(body(2, t0 + 105), None, t0 + 135)
    assert scraper.status.restarts_total == 1


def test_the_evaluator_tickets_a_restart_and_a_target_down_and_pages_when_none_is_up(tmp_path: Path) -> None:
    s = settings(
        tmp_path,
        [
            {"name": "a", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
            {"name": "b", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
        ],
    )
    rt = Runtime(s)
    t0 = 1_800_000_000.0
    for name in ("a", "b"):
        assert rt.scrapers[name].ingest(body(5, t0 - 3600), None, t0)

    def active(now: float) -> list[tuple[str, str, str]]:
        """The incident alerts (the fixture workload's aborts also burn the chat error budget)."""
        rt.evaluate_slos(now)
        return sorted(
            (i.labels["alertname"], i.labels["severity"], i.labels.get("target", i.labels.get("business_type", "")))
            for i in rt.alerts.active()
            if not i.labels["alertname"].endswith("BudgetBurn")
        )

    assert active(t0 + 1) == []  # healthy: nothing
    down = ScrapeError(conv.REASON_CONNECT, "connection refused")
    assert not rt.scrapers["a"].ingest(None, None, t0 + 15, down)
    assert active(t0 + 30) == []  # down for 15 s: not yet
    assert not rt.scrapers["a"].ingest(None, None, t0 + 80, down)
    assert active(t0 + 80) == [("LLMSLOTargetDown", "ticket", "a")]
    assert not rt.scrapers["b"].ingest(None, None, t0 + 80, down)
    assert not rt.scrapers["b"].ingest(None, None, t0 + 150, down)
    assert active(t0 + 150) == [
        ("LLMSLONoHealthyTarget", "page", "chat"),
        ("LLMSLOTargetDown", "ticket", "a"),
        ("LLMSLOTargetDown", "ticket", "b"),
    ]
    # a comes back as a new process: the page and its down ticket resolve, a restart ticket opens
    assert rt.scrapers["a"].ingest(body(1, t0 + 140), None, t0 + 160)
    assert active(t0 + 160) == [("LLMSLOTargetDown", "ticket", "b"), ("LLMSLOTargetRestarted", "ticket", "a")]
    assert rt.scrapers["b"].ingest(body(6, t0 - 3600), None, t0 + 170)
    assert active(t0 + 170 + rt.rules.thresholds.restart_window_seconds) == []  # type: ignore[union-attr]


def cache_body(queries: float, hits: float, requests: float) -> bytes:
    return (
        "# TYPE vllm:prefix_cache_queries counter\n"
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {requests}\n'
    ).encode()


def test_short_windows_slide_over_the_last_scrapes_and_are_never_empty_between_minutes(tmp_path: Path) -> None:
    """1 s scrapes; 100 queried tokens/s, half of them hits until 115 s, none after (a collapse)."""
    s = settings(tmp_path, [{"name": "t", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"}])
    rt = Runtime(s)
    scraper = rt.scrapers["t"]
    t0 = 1_800_000_000.0 - 1_800_000_000.0 % MINUTE_SECONDS  # a minute boundary
    queries = hits = requests = 0.0

    def one_minute(now: float) -> tuple[float | None, float | None, float | None]:
        st = rt.report(60.0, now).business_types[0].stats
        return st.prefix_cache_hit_ratio, st.requests_per_second, st.observed_seconds

    for second in range(10, 200):
        queries += 100
        hits += 50 if second <= 115 else 0
        requests += 2
        assert scraper.ingest(cache_body(queries, hits, requests), None, t0 + second)
        if second == 150:
            # the last 60 s: 25 s at 0.5 and 35 s at 0 (the minute rollup [120, 180) would say 0)
            ratio, rps, observed = one_minute(t0 + second)
            assert ratio == pytest.approx(25 * 50 / (60 * 100), abs=0.01)
            assert rps == pytest.approx(2.0) and observed == pytest.approx(60.0)
        if second == 181:  # one second into a new minute: still the last 60 s, never empty
            ratio, rps, observed = one_minute(t0 + second)
            assert ratio == 0.0
            assert rps == pytest.approx(2.0) and observed == pytest.approx(60.0)
    # windows over the horizon come from the minute rollups
    five = rt.report(300.0, t0 + 199).business_types[0].stats
    assert five.prefix_cache_queries == pytest.approx(queries - 100)  # the first scrape is a baseline
    # memory stays bounded by the horizon
    assert len(scraper.recent) <= s.sliding_horizon + 3  # 1 s scrapes: the horizon, one interval more, one before


def test_every_served_percentile_carries_its_bucket_bounds(tmp_path: Path) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from collector.api.metrics import build_registry

    s = settings(tmp_path, [{"name": "t", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"}])
    rt = Runtime(s)
    now = time.time()
    assert rt.scrapers["t"].ingest(body(1, now - 3600), None, now - 10)
    assert rt.scrapers["t"].ingest(body(3, now - 3600), None, now)
    rt.refresh_snapshot(now)
    text = generate_latest(build_registry(rt)).decode()
    samples = {
        (s.name, s.labels.get("quantile"), s.labels.get("window")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("target") == "t"
    }
    for q in ("0.5", "0.95", "0.99"):
        value = samples[("llmslo_serving_ttft_seconds", q, "1m")]
        lower = samples[("llmslo_serving_ttft_bucket_lower_seconds", q, "1m")]
        upper = samples[("llmslo_serving_ttft_bucket_upper_seconds", q, "1m")]
        assert lower <= value <= upper and lower < upper
