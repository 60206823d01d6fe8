"""The weekly report on two simulated weeks (ISO 2026-W47 quiet, 2026-W48 with an error burst, a
replica down for three hours and a prompt-length shift), fed through the collector's own
ingestion, evaluated by its SLO evaluator, compacted as `serve` would have by Monday 08:00, and
checked: against the simulator's ground truth, against the API over real HTTP, in headless
Chromium, as Markdown, and delivered to a real SMTP server and a webhook."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import os
import re
import shutil
import subprocess
import threading
import time
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from collector.api.app import create_app
from collector.config import DeploymentConfig, ReportConfig, ScrapeConfig, Settings, SmtpConfig
from collector.report.period import parse_week
from collector.report.service import ReportService
from collector.runtime import Runtime
from collector.scheduler import build_scheduler
from collector.sim.fastclock import run_into_store, store_spans, targets_for
from collector.sim.scenario import load_scenario
from collector.store.repository import Store
from tests.embedded import free_port, serving
from tests.reads import record_reads

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
DAY = 86400
STEP = 300.0  # the simulated fleet is scraped every 5 minutes
BURST = (7 * DAY + 120 * 60, 7 * DAY + 150 * 60)  # chat errors at 50 %, W48 Monday 02:00-02:30
DOWN = (9 * DAY, 9 * DAY + 3 * 3600)  # chat-1 down, W48 Wednesday 00:00-03:00


def settings_for(targets: list[Any], **report: Any) -> Settings:
    deployments = [
        DeploymentConfig(name="chat", targets=["chat-0", "chat-1"], gpu="L4", gpu_hour_usd=0.80, replicas=2),
        DeploymentConfig(name="support", targets=["support-0"], gpu="L4", gpu_hour_usd=0.70),
        DeploymentConfig(name="code", targets=["code-0"], gpu="L4", gpu_hour_usd=0.70),
    ]
    return Settings(
        targets=targets,
        deployments=deployments,
        rules=str(ROOT / "rules"),
        scrape=ScrapeConfig(interval=STEP),
        report=ReportConfig(**report),
    )


def simulate_weeks(database_url: str) -> tuple[Runtime, Any, int, Any, Any]:
    """The two weeks through the collector's ingestion, the SLO evaluator while the burst burns
    (it fires) and after (it resolves; the episodes feed the incidents section), compacted as
    `serve` leaves them by Monday 08:00, and W48's report built and stored:
    (runtime, simulator run, start, period, report)."""
    scenario = load_scenario(str(HERE / "scenario-two-weeks.yaml"))
    t0 = int(scenario.start_unix)
    settings = settings_for(targets_for(scenario))
    store = Store(database_url)
    run = run_into_store(scenario, store, 14 * DAY, STEP, settings=settings)
    store_spans(run, store, t0)
    rt = Runtime(settings, store)
    rt.evaluate_slos(t0 + BURST[1] + 120)
    rt.evaluate_slos(t0 + BURST[1] + 120 + 6000)
    rt.compact(t0 + 14 * DAY + 8 * 3600)  # hours before Saturday 08:00
    period = parse_week("2026-W48", "UTC", t0 + 14 * DAY + 8 * 3600)
    return rt, run, t0, period, ReportService(rt).generate(period)


@pytest.fixture(scope="module")
def weeks(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    rt, run, t0, period, built = simulate_weeks(f"sqlite:///{tmp_path_factory.mktemp('report') / 'llmslo.db'}")
    yield rt, run, t0, period, built
    rt.store.close()


def finished_between(run: Any, t0: int, lo: float, hi: float, business_type: str | None = None) -> list[Any]:
    return [
        r for r in run.requests if r.done and lo < t0 + r.finished <= hi and business_type in (None, r.business_type)
    ]


def test_figures_of_the_simulated_week(weeks) -> None:  # type: ignore[no-untyped-def]
    _rt, run, t0, period, built = weeks
    data = built.data
    assert data["id"] == "2026-W48" and data["previous"]["label"] == "2026-W47"
    # engine traffic: the requests that finished in the week (each 5-minute scrape's delta lands in
    # the minute the scrape ran, so the week counts from the scrape at its start: shifted by a step)
    for bt in ("chat", "customer_service", "code_completion"):
        truth = len(finished_between(run, t0, period.start - STEP, period.end - STEP, bt))
        assert data["business_types"][bt]["requests"] == pytest.approx(truth, rel=1e-9), bt
        assert data["business_types"][bt]["has_data"]
    # a business type with SLOs and no traffic says so instead of showing zeros
    assert data["business_types"]["batch"]["has_data"] is False
    batch = [s for s in data["slos"] if s["business_type"] == "batch"]
    assert batch and all(s["status"] == "no data" and s["attainment"] is None for s in batch)
    assert "no traffic this week" in built.markdown
    # the error burst: chat's error SLO used budget on Monday and on no other day
    errors = next(s for s in data["slos"] if s["slo"] == "chat-errors")
    failed = [
        r
        for r in finished_between(run, t0, period.start - STEP, period.end - STEP, "chat")
        if r.reason in ("error", "abort")
    ]
    assert errors["total"] - errors["good"] == pytest.approx(len(failed))
    assert errors["budget_consumed"] > 0 and errors["worst_day"] == "2026-11-23"
    assert [d["day"] for d in errors["days"] if d["bad"] > 0] == ["2026-11-23"]
    assert sum(d["bad"] for d in errors["days"]) == pytest.approx(errors["total"] - errors["good"])
    quiet = next(s for s in data["slos"] if s["slo"] == "chat-errors")["previous_attainment"]
    assert quiet == 1.0  # W47 had no errors
    # incidents: the episode the evaluator recorded, with its duration
    burns = [e for e in data["incidents"]["episodes"] if e["alertname"] == "LLMSLOChatErrorsBudgetBurn"]
    assert burns, data["incidents"]
    assert [e["starts_unix"] for e in burns] == [t0 + BURST[1] + 120]  # the pass that saw the burst
    assert all(e["duration_seconds"] == pytest.approx(6000) for e in burns)  # the two evaluations apart
    assert data["incidents"]["previous_count"] == 0
    # tenants and gateway spans
    spans = [r for r in run.requests if r.done and period.start <= t0 + r.arrival < period.end]
    assert data["traffic"]["gateway_requests"] == pytest.approx(len(spans), abs=len(spans) * 0.002)
    assert set(data["traffic"]["top_tenants"]) == {r.tenant for r in spans}
    # cost: chat is billed for its two configured replicas for the whole week
    chat = next(d for d in data["cost"]["by_deployment"] if d["name"] == "chat")
    assert chat["allocated_usd"] == pytest.approx(2 * 0.80 * 168)
    assert {g["key"] for g in data["cost"]["top_tenants"]} <= {r.tenant for r in spans}
    assert sum(g["cost_usd"] for g in data["cost"]["by_business_type"]) <= data["cost"]["allocated_usd"] + 1e-6
    assert len(data["cost"]["daily"]) == 7
    # data quality: chat-1's three hours down, nothing else missing
    quality = {t["target"]: t for t in data["data_quality"]["targets"]}
    assert quality["chat-1"]["missing_seconds"] == pytest.approx(3 * 3600)
    assert all(t["missing_seconds"] == 0 for name, t in quality.items() if name != "chat-1")
    # drift: chat's prompts grew for two days of the week; code completion's did not change
    shifts = {(s["business_type"], s["signal"]): s["psi"] for s in data["drift"]["length_shifts"]}
    assert shifts[("chat", "prompt_length")] > 0.1
    assert shifts[("code_completion", "prompt_length")] < 0.02
    assert data["capacity"]["available"] and {d["deployment"] for d in data["capacity"]["deployments"]} == {
        "chat",
        "support",
        "code",
    }
    assert set(built.charts) >= {"latency_ttft", "budget", "cost_by_type", "cost_per_token", "concurrency", "lengths"}
    assert all(png.startswith(b"\x89PNG") and len(png) > 5000 for png in built.charts.values())


def test_every_figure_equals_what_the_api_answers(weeks) -> None:  # type: ignore[no-untyped-def]
    rt, _run, _t0, period, built = weeks
    data = built.data
    span = {"start": period.start, "end": period.end}
    port = free_port()
    with serving(create_app(rt.settings, rt, schedule=False), port):
        base = f"http://127.0.0.1:{port}"
        get = lambda path, **params: httpx.get(base + path, params=params, timeout=60)  # noqa: E731
        cost = get("/api/v1/cost", group_by="business_type", **span).json()
        assert cost["allocated_usd"] == pytest.approx(data["cost"]["allocated_usd"], rel=1e-12)
        assert {g["key"]: g["cost_usd"] for g in cost["groups"]} == pytest.approx(
            {g["key"]: g["cost_usd"] for g in data["cost"]["by_business_type"]}, rel=1e-12
        )
        tenants = get("/api/v1/cost", group_by="tenant", **span).json()["groups"]
        assert [g["key"] for g in tenants[:10]] == [g["key"] for g in data["cost"]["top_tenants"]]
        serving_api = get("/api/v1/serving", **span).json()
        for b in serving_api["business_types"]:
            assert b["stats"]["requests"] == pytest.approx(data["business_types"][b["business_type"]]["requests"])
        # the report reads the week once for every section: its serving view is the API's
        assert rounded(data["api"]["serving"]["business_types"]) == rounded(serving_api["business_types"])
        assert rounded(data["api"]["serving"]["groups"]) == rounded(serving_api["groups"])
        slos = {s["slo"]: s for s in get("/api/v1/slos/attainment", **span).json()["slos"]}
        for s in data["slos"]:
            assert slos[s["slo"]]["good"] == pytest.approx(s["good"], rel=1e-9)
            assert slos[s["slo"]]["total"] == pytest.approx(s["total"], rel=1e-9)
            assert slos[s["slo"]]["attainment"] == (None if s["attainment"] is None else pytest.approx(s["attainment"]))
        summary = get("/api/v1/requests/summary", **span).json()
        assert summary["requests"] == data["traffic"]["gateway_requests"]
        capacity = get("/api/v1/capacity", start=period.end - 28 * DAY, end=period.end).json()
        assert [d["replicas_needed"] for d in capacity["deployments"]] == [
            d["replicas_needed"] for d in data["capacity"]["deployments"]
        ]
        assert rounded(capacity["deployments"]) == rounded(data["capacity"]["deployments"])
        # stored and served
        listed = get("/api/v1/reports").json()["reports"]
        assert [r["id"] for r in listed] == ["2026-W48"] and listed[0]["deliveries"] == {}
        page = get("/reports/2026-W48")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text == built.html
        assert get("/reports/2026-W48.md").text == built.markdown
        assert get("/api/v1/reports/2026-W48").json()["slos"] == json.loads(json.dumps(data["slos"]))
        missing = get("/reports/2031-W01")
        assert missing.status_code == 404 and "GET /api/v1/reports" in missing.text
        # built on request: the week before, then listed newest first
        made = httpx.post(f"{base}/api/v1/reports", params={"week": "2026-W47"}, timeout=120)
        assert made.status_code == 200, made.text
        assert made.json()["id"] == "2026-W47"
        assert [r["id"] for r in get("/api/v1/reports").json()["reports"]] == ["2026-W48", "2026-W47"]
        bad = httpx.post(f"{base}/api/v1/reports", params={"week": "2025-W53"}, timeout=30)
        assert bad.status_code == 404 and "no ISO week 53" in bad.text


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (scripts/test.sh installs Debian's package as root)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return found


def test_the_html_renders_in_headless_chromium(weeks, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _rt, _run, _t0, _period, built = weeks
    browser = chromium()
    page = tmp_path / "report.html"
    page.write_text(built.html)
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
    ]
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [*flags, "--window-size=900,4000", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000
    # the same page with a probe appended: after load it lists every image's rendered size
    probe = tmp_path / "probe.html"
    probe.write_text(
        built.html.replace(
            "</body>",
            "<script>window.addEventListener('load',()=>{const p=document.createElement('pre');p.id='probe';"
            "p.textContent=JSON.stringify([...document.images].map(i=>[i.complete,i.naturalWidth,i.naturalHeight,"
            "i.getBoundingClientRect().width,i.getBoundingClientRect().height]));document.body.appendChild(p);});"
            "</script></body>",
        )
    )
    dom = subprocess.run(
        [*flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    text = dom.stdout.decode()
    assert '<pre id="probe">' in text, dom.stderr.decode()[-2000:]
    sizes = json.loads(text.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0])
    assert len(sizes) == len(built.charts)
    for complete, natural_w, natural_h, shown_w, shown_h in sizes:
        assert complete and natural_w > 0 and natural_h > 0 and shown_w > 0 and shown_h > 0
    assert "<script" not in built.html  # readable in a mail client: nothing needs JavaScript


def test_markdown_has_every_section_and_no_invented_numbers(weeks) -> None:  # type: ignore[no-untyped-def]
    _rt, _run, _t0, _period, built = weeks
    md = built.markdown
    for title in ("At a glance", "SLOs (calendar week)", "Latency", "Incidents", "Traffic", "Cost by business type",
                  "Top tenants by cost", "Workload drift", "Capacity", "Data quality"):  # fmt: skip
        assert f"## {title}" in md, title
    assert not re.search(r"\b(nan|inf)\b", md, re.IGNORECASE)
    assert "| batch-errors | error_ratio | 99.00 % | no data |" in md
    assert "LLMSLOChatErrorsBudgetBurn" in md
    tables = [line for line in md.splitlines() if line.startswith("|")]
    widths = {line.count("|") - line.count("\\|") for line in tables}
    assert widths  # every row of a table has its header's cell count
    for block in md.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len({r.count("|") - r.count("\\|") for r in rows}) <= 1, block


class _Webhook(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []
    fail_first = 1

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        code = 503 if len(type(self).bodies) <= type(self).fail_first else 200
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_delivery_by_webhook_and_smtp_with_retries(weeks) -> None:  # type: ignore[no-untyped-def]
    from aiosmtpd.controller import Controller

    rt, _run, _t0, period, _built = weeks

    class Inbox:
        messages: ClassVar[list[bytes]] = []

        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            self.messages.append(envelope.original_content)
            return "250 OK"

    inbox = Inbox()
    smtp_port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        settings = settings_for(
            rt.settings.targets,
            webhook_url=f"http://127.0.0.1:{hook.server_port}/hook",
            smtp=SmtpConfig(
                host="127.0.0.1",
                port=smtp_port,
                security="none",
                sender="llmslo@example.test",
                to=["platform@example.test", "finance@example.test"],
            ),
            public_url="https://llmslo.example.test",
            attempts=3,
            backoff=0.05,
        )
        other = Runtime(settings, rt.store)
        service = ReportService(other)
        built = service.generate(period)

        async def go() -> dict[str, bool]:
            try:
                return await service.deliver(built)
            finally:
                await other.client.aclose()

        assert asyncio.run(go()) == {"webhook": True, "email": True}
        state = next(r for r in service.list() if r["id"] == built.id)["deliveries"]
        assert state["webhook"]["status"] == "delivered" and state["webhook"]["attempts"] == 2
        assert state["email"]["status"] == "delivered" and state["email"]["attempts"] == 1
        body = _Webhook.bodies[-1]
        assert body["url"] == "https://llmslo.example.test/reports/2026-W48"
        assert body["id"] == "2026-W48" and "1 incident(s)" in body["text"]
        # the mail: Markdown as text, HTML with every chart as an inline part it references
        assert len(inbox.messages) == 1
        msg = email.message_from_bytes(inbox.messages[0], _class=EmailMessage, policy=email.policy.default)
        assert msg["Subject"] == built.data["title"] and "finance@example.test" in msg["To"]
        plain = msg.get_body(("plain",))
        html = msg.get_body(("html",))
        assert plain is not None and "## SLOs (calendar week)" in plain.get_content()
        assert html is not None
        page = html.get_content()
        images = [p for p in msg.walk() if p.get_content_type() == "image/png"]
        assert len(images) == len(built.charts)
        for part in images:
            assert f"cid:{part['Content-ID'].strip('<>')}" in page
            assert part.get_payload(decode=True).startswith(b"\x89PNG")
        # a channel that cannot be reached fails on its own, after its attempts; the other delivers
        broken = settings_for(
            rt.settings.targets,
            webhook_url=f"http://127.0.0.1:{hook.server_port}/hook",
            smtp=SmtpConfig(host="127.0.0.1", port=free_port(), security="none", sender="a@b.c", to=["d@e.f"]),
            attempts=2,
            backoff=0.05,
        )
        third = Runtime(broken, rt.store)
        service = ReportService(third)

        async def again() -> dict[str, bool]:
            try:
                return await service.deliver(service.generate(period))
            finally:
                await third.client.aclose()

        assert asyncio.run(again()) == {"webhook": True, "email": False}
        state = next(r for r in service.list() if r["id"] == built.id)["deliveries"]
        assert state["email"]["status"] == "failed" and state["email"]["attempts"] == 2
        assert (
            "Connection refused" in state["email"]["last_error"] or "ConnectionRefused" in state["email"]["last_error"]
        )
    finally:
        controller.stop()
        hook.shutdown()


def test_the_schedule_is_monday_morning_in_the_configured_zone(weeks) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    rt, *_ = weeks
    settings = settings_for(rt.settings.targets, timezone="Europe/Berlin")
    scheduler = build_scheduler(Runtime(settings, rt.store))
    trigger = scheduler.get_job("report").trigger
    after = datetime(2026, 12, 1, tzinfo=UTC)
    nxt = trigger.get_next_fire_time(None, after)
    assert nxt.astimezone(UTC) == datetime(2026, 12, 7, 7, 0, tzinfo=UTC)  # 08:00 in Berlin (CET)
    off = settings_for(rt.settings.targets, enabled=False)
    assert build_scheduler(Runtime(off, rt.store)).get_job("report") is None


def test_a_report_missed_while_down_is_owed_once_the_collector_is_back(weeks) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    rt, *_ = weeks
    service = ReportService(rt)  # W48 is stored (the fixture built it); W49 is not
    at = lambda *a: datetime(*a, tzinfo=UTC).timestamp()  # noqa: E731
    assert service.due(at(2026, 11, 30, 9, 0)) is None  # W48's report exists
    assert service.due(at(2026, 12, 7, 7, 59)) is None  # W49's is not due before Monday 08:00
    owed = service.due(at(2026, 12, 7, 8, 30))
    assert owed is not None and owed.label == "2026-W49"
    assert service.due(at(2026, 12, 9, 12, 0)).label == "2026-W49"  # still owed on Wednesday


def test_the_same_report_on_postgresql(pg_server: str, tmp_path: Path) -> None:
    """Two simulated days stored in SQLite and in PostgreSQL (the same seed): every figure of
    the report agrees (the alert history, coverage and period queries run on both)."""
    from collector.report.period import between
    from collector.report.service import render
    from tests.conftest import _reset_pg

    _reset_pg(pg_server)
    scenario = load_scenario(str(HERE / "scenario-two-weeks.yaml"))
    t0 = int(scenario.start_unix)
    out = []
    for url in (f"sqlite:///{tmp_path / 'llmslo.db'}", pg_server):
        settings = settings_for(targets_for(scenario))
        store = Store(url)
        run = run_into_store(
            load_scenario(str(HERE / "scenario-two-weeks.yaml")), store, 2 * DAY, STEP, settings=settings
        )
        store_spans(run, store, t0)
        rt = Runtime(settings, store)
        out.append(render(rt, between(t0 + DAY, t0 + 2 * DAY, "UTC")).data)
        store.close()
    lite, pg = out
    assert lite["traffic"]["engine_requests"] > 0
    for key in ("slos", "traffic", "incidents", "data_quality", "drift"):
        assert rounded(pg[key]) == rounded(lite[key]), key
    assert pg["cost"]["allocated_usd"] == pytest.approx(lite["cost"]["allocated_usd"])
    assert [g["key"] for g in pg["cost"]["top_tenants"]] == [g["key"] for g in lite["cost"]["top_tenants"]]
    for bt, data in lite["business_types"].items():
        assert pg["business_types"][bt]["requests"] == data["requests"]
        assert pg["business_types"][bt]["latency"] == data["latency"]


def rounded(value: Any) -> Any:
    """Floats to 9 significant digits, recursively (row order may differ between databases)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def test_the_report_reads_an_hour_at_a_time_and_adds_up_to_one_read(weeks, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At fleet scale a day of minutes is tens of millions of cells: the report's readers take an
    hour of rows per query and add them up. What they answer equals one read of the whole span:
    the SLO attainment per day (also cut at half hours, as a +05:30 zone's days are), the week's
    serving figures, the cost of the week and of a day, capacity."""
    from collector.analytics.serving import build_report
    from collector.cost.allocation import CostInputs, attribute
    from collector.slo.evaluate import period_events
    from collector.store.repository import merge_window
    from collector.traces.store import read_requests

    rt, _run, _t0, period, _built = weeks
    lo, hi = period.start, period.end
    whole = {
        "slos": [
            period_events(
                rt.rules,
                rt.store.read_rows(a, b, metrics=rt.slo_metrics),
                read_requests(rt.store, a, b),
                a,
                b,
                rt.business_type_of,
                rt.cost_of,
            )
            for a, b in ((lo, lo + DAY), (lo + DAY + 1800, lo + 2 * DAY + 1800))
        ],
        "serving": build_report(merge_window(rt.read_rows(lo, hi), hi), hi - lo, lo, hi, rt.business_type_of),
        "cost": attribute(
            CostInputs().add_rows(
                r for r in rt.read_rows(lo, hi) if r.period_seconds == 60 or r.start_unix + r.period_seconds <= hi
            ),
            rt.inventory,
            rt.settings.cost,
            lo,
            hi,
            rt.business_type_of,
        ),
    }
    spans = record_reads(monkeypatch, rt.store)
    _, by_day = rt.slo_attainment(lo, lo + 2 * DAY, [lo + DAY])
    _, half = rt.slo_attainment(lo + DAY + 1800, lo + 2 * DAY + 1800, [])
    serving = rt.report_between(lo, hi)
    cost = rt.cost_report(lo, hi)
    capacity = rt.capacity(lo, hi)
    assert spans and max(spans) <= 3600
    assert len(spans) >= 4 * 48 + 2 * 168  # every hour of each read (the half-hour day: 25 pieces)

    for got, want in ((by_day[0], whole["slos"][0]), (half[0], whole["slos"][1])):
        assert [e.total for e in got] == pytest.approx([e.total for _, e in want], rel=1e-12)
        assert [e.good for e in got] == pytest.approx([e.good for _, e in want], rel=1e-12)
    assert sum(e.total for e in by_day[0]) > 0
    for a, b in zip(serving.business_types, whole["serving"].business_types, strict=True):
        assert a.business_type == b.business_type
        assert a.stats.requests == pytest.approx(b.stats.requests, rel=1e-12)
        assert a.stats.latencies.keys() == b.stats.latencies.keys() and a.stats.latencies
        for name, lat in a.stats.latencies.items():
            assert lat.count == pytest.approx(b.stats.latencies[name].count, rel=1e-12)
            assert [q.value for q in lat.quantiles] == pytest.approx(
                [q.value for q in b.stats.latencies[name].quantiles], rel=1e-9
            )
    assert cost.allocated_usd == pytest.approx(whole["cost"].allocated_usd, rel=1e-12)
    assert {k: v.output_tokens for k, v in cost.by("target").items()} == pytest.approx(
        {k: v.output_tokens for k, v in whole["cost"].by("target").items()}, rel=1e-12
    )
    assert capacity and all(c.deployment for c in capacity)


def test_request_cells_of_hours_compacted_inside_the_few_minute_pieces_are_read_once(  # type: ignore[no-untyped-def]
    weeks, monkeypatch
) -> None:
    """The readers of long periods read a few minutes of engine rows at a time from an hour
    before the minute retention on, and compaction may have turned that hour's request minutes
    into an hour cell since, which lies wholly inside no few-minute piece. The gateway's request
    cells come an hour at a time with the hour's first piece (`Runtime.piece_requests`): over
    a day cut that way they are every cell of one read of the day, each once, and the report's
    request summary of its week (read an hour at a time) is that of one read of the week."""
    from sqlalchemy import text

    import collector.runtime as runtime_module
    from collector.report.build import _side
    from collector.traces.store import read_requests
    from collector.traces.summary import summarize

    rt, _run, _t0, period, _built = weeks
    with rt.store.engine.connect() as conn:
        first_minute = conn.execute(
            text("SELECT min(start_unix) FROM llmslo_request_rollups WHERE period_seconds = 60")
        ).scalar()
    assert first_minute is not None and first_minute % 3600 == 0  # the compaction's cutoff: hours before it
    # few-minute pieces from half an hour before the cutoff: the last compacted hour is cut
    fine_from = first_minute - 1800
    retention = rt.settings.retention.model_copy(update={"minute_rollups": time.time() - 3600 - fine_from})
    monkeypatch.setattr(rt, "settings", rt.settings.model_copy(update={"retention": retention}))
    monkeypatch.setattr(runtime_module, "read_step", lambda series: 300)
    day_lo = first_minute - first_minute % DAY
    day_hi = day_lo + DAY
    spans = list(rt.read_spans(day_lo, day_hi, rt.first_stored_unix()))
    cut = [(a, b) for a, b in spans if first_minute - 3600 <= a < first_minute]
    assert len(cut) == 12 and all(b - a == 300 for a, b in cut)  # the compacted hour, in 5-minute pieces
    assert read_requests(rt.store, first_minute - 3600, first_minute, period=3600)  # the compacted hour
    assert not read_requests(rt.store, first_minute - 3600, first_minute - 3600 + 300)  # which no piece holds

    def keyed(cells: Any) -> list[tuple[Any, str]]:
        return sorted((k, json.dumps(c.to_json(), sort_keys=True)) for k, c in cells)

    pieces = [cell for a, b in spans for cell in rt.piece_requests(a, b, day_lo, day_hi)]
    assert keyed(pieces) == keyed(read_requests(rt.store, day_lo, day_hi))

    side = _side(rt, period, detail=False)
    whole = summarize(read_requests(rt.store, period.start, period.end))
    assert side.summary.requests == whole.requests > 0
    assert side.summary.tenants == whole.tenants
    by_type: dict[str, float] = {}
    for k, c in read_requests(rt.store, period.start, period.end):
        by_type[k.business_type] = by_type.get(k.business_type, 0.0) + c.total
    assert side.gateway_by_type == by_type
    # the cost per tenant reads them the same way (`Runtime.request_cells`)
    from collector.cost.allocation import tenant_lines

    cost = rt.cost_report(period.start, period.end)
    streamed = rt.cost_lines(cost, "tenant")
    weight = rt.settings.cost.cached_token_weight
    at_once = tenant_lines(cost, read_requests(rt.store, period.start, period.end), weight)
    assert streamed.keys() == at_once.keys() and len(streamed) > 1
    for tenant, line in streamed.items():
        assert line.requests == at_once[tenant].requests > 0
        assert line.total_usd == pytest.approx(at_once[tenant].total_usd, rel=1e-12) and line.total_usd > 0
