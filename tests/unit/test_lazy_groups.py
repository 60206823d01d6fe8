"""What a derive pass publishes: the per-(target, model) groups, derived in the pass while
/metrics shows them (a fleet within `server.metrics_target_limit` pairs), else for their first
reader, with the same figures as a report derived at once; and /metrics' derived series, rendered
once per pass, at its end once /metrics is read."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.analytics.serving import LazyGroups
from collector.api.app import create_app
from collector.api.metrics import build_registry
from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render
from tests.embedded import free_port, serving
from tests.rounding import rounded


def fleet(tmp_path: Path, limit: int) -> tuple[Runtime, float]:
    """Three chat targets with different traffic, scraped every 15 s for the last two minutes
    (on the real clock: the fleet view answers from a derive pass only while it is recent)."""
    t0 = int(time.time()) - 125
    targets = [{"name": f"chat-{i}", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"} for i in range(3)]
    port = free_port()
    settings = Settings.model_validate(
        {"data_dir": str(tmp_path), "targets": targets, "server": {"port": port, "metrics_target_limit": limit}}
    )
    rt = Runtime(settings)
    asyncio.run(rt.start())
    rng = random.Random(3)
    servers = [EngineMetrics(max_model_len=4096, created_unix=t0 - 3600) for _ in targets]
    now = float(t0)
    for step in range(8):
        now = t0 + 15.0 * step
        for i, m in enumerate(servers):
            for _ in range(5 + 10 * i):
                m.prompt_tokens += 300
                m.generation_tokens += rng.randint(10, 200)
                m.finished["stop"] = m.finished.get("stop", 0) + 1
                m.hist["time_to_first_token_seconds"].observe(rng.lognormvariate(-1.5 + i, 0.5))
            assert rt.scrapers[f"chat-{i}"].ingest(render("current", "m", m).encode(), None, now + i)
    return rt, now + 5


def test_a_large_fleets_groups_wait_for_a_reader_and_equal_those_derived_at_once(tmp_path: Path) -> None:
    rt, now = fleet(tmp_path, limit=2)  # 3 pairs > 2: /metrics leaves them out
    snap = rt.refresh_snapshot(now)
    for seconds, report in snap.reports.items():
        assert isinstance(report.groups, LazyGroups) and "not derived yet" in repr(report.groups)
        assert len(report.groups) == 3  # known without deriving them
        at_once = rt.report(seconds, now)
        # the business types: in the pass, their histograms from sums kept as scrapes commit
        # (added in another order than a merge of the series: equal to float rounding)
        assert rounded(report.business_types, 9) == rounded(at_once.business_types, 9)
        assert tuple(report.groups) == tuple(at_once.groups) and "derived" in repr(report.groups)
        ttft = [g.stats.latencies["ttft"].quantiles[-1].value for g in report.groups]
        assert ttft == sorted(ttft) and ttft[0] < ttft[-1]  # three different targets, not one copied
    # the fleet view derives them for its reader (over HTTP, as a dashboard asks)
    snap = rt.refresh_snapshot(now)
    port = rt.settings.server.port
    assert "not derived yet" in repr(snap.reports[60.0].groups)
    with serving(create_app(rt.settings, rt, schedule=False), port):
        body = httpx.get(f"http://127.0.0.1:{port}/api/v1/serving", params={"window": "1m"}, timeout=30).json()
    assert sorted(g["target"] for g in body["groups"]) == ["chat-0", "chat-1", "chat-2"]
    assert "not derived yet" not in repr(snap.reports[60.0].groups)  # the published pass's own groups
    rt.store.close()


def test_a_fleet_that_metrics_shows_has_its_groups_derived_in_the_pass(tmp_path: Path) -> None:
    rt, now = fleet(tmp_path, limit=100)
    snap = rt.refresh_snapshot(now)
    for report in snap.reports.values():
        assert isinstance(report.groups, LazyGroups) and "not derived yet" not in repr(report.groups)
    rt.store.close()


def test_metrics_over_http_carry_each_passs_derived_series_as_a_full_render_does(tmp_path: Path) -> None:
    rt, now = fleet(tmp_path, limit=100)
    port = rt.settings.server.port

    def derived(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)  # one valid exposition: no family twice
            for s in f.samples
            if s.name.startswith(("llmslo_serving_", "llmslo_business_"))
        }

    app = create_app(rt.settings, rt, schedule=False)
    with serving(app, port):
        rt.refresh_snapshot(now)
        assert not app.state.derived_text.ready()  # nobody reads /metrics yet: the pass did not render it
        first = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text.count("llmslo_business_") == first.count(
            "llmslo_business_"
        )
        full = generate_latest(build_registry(rt)).decode()
        assert derived(first) == derived(full) and len(derived(first)) > 100
        # another pass over more traffic on chat-0: the next render shows it
        more = EngineMetrics(max_model_len=4096, created_unix=now - 30)  # a restarted chat-0
        for _ in range(50):
            more.finished["stop"] = more.finished.get("stop", 0) + 1
        assert rt.scrapers["chat-0"].ingest(render("current", "m", more).encode(), None, now + 10)
        rt.refresh_snapshot(now + 12)
        # /metrics is read: the pass rendered its text as it ended, a request only sends it
        assert app.state.derived_text.ready()
        second = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    assert derived(second) == derived(generate_latest(build_registry(rt)).decode()) != derived(first)
    rt.store.close()


def test_a_read_fleet_view_is_encoded_once_per_read_by_the_pass_after_it(tmp_path: Path) -> None:
    """Once /api/v1/serving has been read, the derive pass after each read encodes that view as it
    ends, so the reader after it gets that pass's figures at once; a pass with no read since the
    one before leaves the body as it is, and one whose body is two passes old encodes it again
    while the view is still being read."""
    rt, now = fleet(tmp_path, limit=1)  # more pairs than /metrics shows: the groups wait for a reader
    port = rt.settings.server.port
    step = rt.settings.derive_interval

    def chat0_requests() -> float:
        body = httpx.get(f"http://127.0.0.1:{port}/api/v1/serving", params={"window": "5m"}, timeout=30).json()
        return float(next(g["stats"]["requests"] for g in body["groups"] if g["target"] == "chat-0"))

    def restart_chat0(requests: int, at: float) -> None:  # a restarted chat-0 that served `requests`
        more = EngineMetrics(max_model_len=4096, created_unix=at - 5)
        more.finished["stop"] = requests
        assert rt.scrapers["chat-0"].ingest(render("current", "m", more).encode(), None, at)

    with serving(create_app(rt.settings, rt, schedule=False), port):
        rt.refresh_snapshot(now - 3)
        before = chat0_requests()  # the first read: encoded while it waits
        assert before > 0
        restart_chat0(50, now - 2)
        rt.refresh_snapshot(now - 1)  # read since the pass before: encoded as it ends
        assert chat0_requests() == before + 50
        rt.refresh_snapshot(now)  # read since: encoded
        restart_chat0(20, now + 0.5)
        rt.refresh_snapshot(now + 1)  # no read since the pass before: the body stays
        assert chat0_requests() == before + 50  # one pass old
        rt.refresh_snapshot(now + 2)  # read since: encoded
        assert chat0_requests() == before + 70
        rt.refresh_snapshot(now + 3)  # read since: encoded
        restart_chat0(5, now + 4)
        rt.refresh_snapshot(now + 3 + 2 * step - 5)  # not read since, but its body is two passes old
        assert chat0_requests() == before + 75
    rt.store.close()


def test_a_failing_pass_end_step_is_logged_and_the_others_still_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt, now = fleet(tmp_path, limit=100)
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("encoder broke")

    rt.after_pass.extend([broken, lambda: ran.append("next")])
    snapshot = rt.refresh_snapshot(now)
    assert rt.snapshot is snapshot and snapshot.reports  # published all the same
    assert ran == ["next"]
    assert "encoder broke" in caplog.text
    rt.store.close()
