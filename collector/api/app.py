"""The FastAPI application: /metrics, the JSON API under /api/v1, health and readiness."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hmac
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector import __version__, gcpolicy
from collector.api.deps import RuntimeDep
from collector.api.embedded import EmbeddedServer
from collector.api.metrics import DerivedText, TargetRenderer, build_registry
from collector.api.readahead import ReadAhead
from collector.api.schemas import (
    CapacityResponse,
    CompareResponse,
    CostResponse,
    DriftResponse,
    ReportEntry,
    ReportsResponse,
    RequestSummaryResponse,
    ServingResponse,
    SloAttainmentResponse,
    SlosResponse,
    TargetsResponse,
    alert_out,
    attainment_out,
    capacity_out,
    compare_out,
    cost_out,
    drift_out,
    engine_breakdown,
    report_out,
    serving_json,
    slo_out,
    summary_out,
    target_out,
)
from collector.config import Settings, format_duration, parse_duration
from collector.drift.compare import Selector, SelectorError, tolerances
from collector.report.period import PeriodError, between, parse_week
from collector.report.service import ReportService
from collector.runtime import Runtime, window_bounds
from collector.scheduler import build_scheduler
from collector.traces.grpc_server import start_grpc
from collector.traces.store import read_requests
from collector.traces.summary import summarize


async def _start_otlp_port(rt: Runtime, settings: Settings) -> tuple[EmbeddedServer, asyncio.Task[None]] | None:
    """OTLP/HTTP on its conventional port too (4318), when `traces.otlp_http_port` is set."""
    port = settings.traces.otlp_http_port
    if port is None:
        return None
    otlp_app = FastAPI(title="llmslo OTLP", docs_url=None, redoc_url=None, openapi_url=None)

    @otlp_app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        return await rt.traces.handle(request)

    server = EmbeddedServer(
        uvicorn.Config(
            otlp_app, host=settings.server.host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the port could not be bound: fail loudly at start-up
            raise RuntimeError(f"OTLP port {port} did not start")
        await asyncio.sleep(0.02)
    return server, task


SELECTOR_PATTERN = r"^((target|model|deployment|track|tenant|business_type|label\.[^=\s]+)=.*\S.*|shadow=(true|false))$"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v1/traces"})
# A window is whole minutes (merges of minute rollups): the schema says so, so
# FastAPI answers anything else with its standard 422 before a handler runs.
WindowQuery = Annotated[
    str,
    Query(
        description="window length in whole minutes, hours, days or weeks: 1m, 5m, 1h, 7d, 4w",
        pattern=r"^[1-9][0-9]{0,5}[mhdw]$",
    ),
]


_binary = {"schema": {"type": "string", "format": "binary"}}
OTLP_REQUEST_BODY = {
    "required": True,
    "description": "An OTLP ExportTraceServiceRequest (gzip or deflate with Content-Encoding)",
    "content": {"application/x-protobuf": _binary, "application/json": _binary},
}
OTLP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "committed; partial_success names rejected spans",
        "content": {"application/x-protobuf": _binary, "application/json": {"schema": {"type": "object"}}},
    },
    **{
        code: {"description": why, "content": {"text/plain": {"schema": {"type": "string"}}}}
        for code, why in (
            (400, "undecodable or too deeply nested body"),
            (401, "missing or invalid ingest key"),
            (408, "body not received within traces.body_read_timeout"),
            (413, "body over traces.max_body_bytes"),
            (415, "unsupported Content-Type or Content-Encoding"),
            (503, "ingest queue full or store unavailable; Retry-After says when to retry"),
        )
    },
}


StartQuery = Annotated[
    int | None, Query(ge=0, le=2**40, description="unix seconds: with end, the period [start, end); alone, to now")
]
EndQuery = Annotated[
    int | None, Query(ge=0, le=2**40, description="unix seconds, exclusive; alone, the window before it")
]


MAX_REPORT_DAYS = 400
NOT_STORED: dict[int | str, dict[str, Any]] = {404: {"description": "no stored report with this id"}}
# a report's period is rendered in calendar dates: within the year 3000
ReportStart = Annotated[int | None, Query(ge=0, le=32_503_680_000, description="unix seconds: with end, [start, end)")]
ReportEnd = Annotated[int | None, Query(ge=0, le=32_503_680_000, description="unix seconds, exclusive")]


def period(now: float, window: str, start: int | None, end: int | None) -> tuple[int, int] | None:
    """[start, end) of a query: both given, exactly that (empty when end <= start); start alone,
    to now; end alone, the window before it; neither: None (the window ending now)."""
    if start is None and end is None:
        return None
    if end is None:
        assert start is not None
        end = max(start, window_bounds(now, 60)[1])
    elif start is None:
        start = max(0, end - int(window_seconds(window)))
    return start, max(start, end)


def _stored(body: str | None, media_type: str) -> Response:
    if body is None:
        raise HTTPException(404, "no stored report with this id (GET /api/v1/reports lists them)")
    return Response(body, media_type=f"{media_type}; charset=utf-8")


def window_seconds(window: str) -> float:
    """A `window` query parameter in seconds; WindowQuery's pattern has already refused anything
    that is not whole minutes, hours, days or weeks (with FastAPI's standard 422)."""
    return parse_duration(window)


def create_app(settings: Settings, runtime: Runtime | None = None, schedule: bool = True) -> FastAPI:
    """Build the app. With `schedule`, the lifespan starts scraping, deriving and compaction."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or Runtime(settings)
        await rt.start()
        with gcpolicy.serving(settings.server.switch_interval):  # collector/gcpolicy.py
            app.state.runtime = rt
            app.state.registry = build_registry(rt, derived=False)
            app.state.derived_text = DerivedText(rt)  # rendered once per derive pass
            rt.after_pass.append(app.state.derived_text.prepare)
            rt.after_pass.append(app.state.encode_read_views)
            scheduler = build_scheduler(rt) if schedule else None
            if scheduler is not None:
                scheduler.start()
                rt.loops.start()
            otlp = await _start_otlp_port(rt, settings)
            grpc_port = settings.traces.otlp_grpc_port
            grpc = await start_grpc(rt.traces, settings.server.host, grpc_port) if grpc_port is not None else None
            try:
                yield
            finally:
                rt.stop_reading()  # a long history read (a first start's fill) stops at its next piece
                if grpc is not None:
                    await grpc.stop(grace=5)
                if otlp is not None:
                    otlp[0].should_exit = True
                    await otlp[1]
                if scheduler is not None:
                    rt.loops.stop()
                    scheduler.pause()  # no new runs; running ones finish (shutdown would cancel them)
                    await rt.drain()
                    scheduler.shutdown(wait=False)
                rt.after_pass.remove(app.state.derived_text.prepare)
                rt.after_pass.remove(app.state.encode_read_views)
                await rt.close()

    app = FastAPI(
        title="llmslo",
        version=__version__,
        description="SLO, latency, cache, drift and cost monitor for self-hosted LLM serving.",
        lifespan=lifespan,
    )
    token = settings.server.api_token
    if token is not None:
        expected = f"Bearer {token}".encode()

        @app.middleware("http")
        async def require_token(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            """The read API, /metrics and the docs need the token; health checks and OTLP ingest
            (which has its own keys) do not."""
            path = request.url.path
            if path in OPEN_PATHS:
                return await call_next(request)
            supplied = (request.headers.get("authorization") or "").encode()
            if not hmac.compare_digest(supplied, expected):
                return Response("missing or invalid API token", status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await call_next(request)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    async def readyz(rt: RuntimeDep, response: Response) -> dict[str, str]:
        try:
            await asyncio.to_thread(rt.store.ping)
        except Exception as exc:
            response.status_code = 503
            return {"status": "unavailable", "reason": f"database: {type(exc).__name__}"}
        if not rt.started:
            response.status_code = 503
            return {"status": "starting"}
        return {"status": "ready"}

    target_health = TargetRenderer()  # keeps each target's lines while their values hold

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics(request: Request) -> Response:
        # The derived series are rendered once per derive pass, at its end once /metrics is read;
        # with them ready the rest takes a few ms at a thousand targets and is rendered here (a
        # hop to a worker thread waited for the interpreter beside the derive pass and the
        # scrapes); otherwise the whole render (~100 ms of CPU at that size) runs in a thread.
        rt: Runtime = request.app.state.runtime
        derived: DerivedText = request.app.state.derived_text

        def render() -> bytes:
            live: bytes = generate_latest(request.app.state.registry)
            return live + derived.render() + target_health.render(rt).encode()

        body = render() if derived.ready() else await asyncio.to_thread(render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/targets", response_model=TargetsResponse, tags=["serving"])
    async def list_targets(rt: RuntimeDep) -> TargetsResponse:
        out = []
        for name, scraper in sorted(rt.scrapers.items()):
            cfg = rt.targets[name]
            out.append(
                target_out(scraper.status, cfg.business_type, cfg.labels, scraper.interval, scraper.timeout, rt.fleet)
            )
        return TargetsResponse(targets=out)

    # (window, business type) -> (the derive pass it was encoded from, the JSON body, gzipped)
    published: dict[tuple[float, str | None], tuple[float, bytes, bytes]] = {}
    # when each (window, business type) is read (monotonic): which views a pass encodes as it ends
    read_ahead: ReadAhead[tuple[float, str | None]] = ReadAhead(settings.derive_interval)
    encode_lock = threading.Lock()  # encodes run in the derive pass's thread and in worker threads

    def encode_published(
        seconds: float, business_type: str | None, when: str = "on_request"
    ) -> tuple[bytes, bytes] | None:
        """Encode a published window's report as of the last derive pass (blocking). None when
        the window is not published or the snapshot is stale. One encode at a time: one that
        waited for another of the same pass returns its body instead of encoding it again."""
        rt: Runtime = app.state.runtime
        key = (seconds, business_type)
        with encode_lock:
            snap = rt.snapshot
            report = snap.reports.get(seconds)
            if report is None or rt.now() - snap.computed_unix > 2 * rt.settings.derive_interval + 5:
                return None
            held = published.get(key)
            if held is not None and held[0] == snap.computed_unix:
                return held[1], held[2]
            started = time.perf_counter()  # the groups' derivation (when first read) included
            if business_type is not None:  # a business type's groups and its own merged stats
                report = dataclasses.replace(
                    report,
                    groups=tuple(g for g in report.groups if g.business_type == business_type),
                    business_types=tuple(b for b in report.business_types if b.business_type == business_type),
                )
            body = serving_json(format_duration(seconds), report)
            # gzipped once too (level 1: ~10x smaller for this JSON): a 9 MB body written to the
            # socket in many pieces waits for the interpreter between them while scrapes hold it
            zipped = gzip.compress(body, compresslevel=1, mtime=0)
            if len(published) > 64:
                published.clear()
            published[key] = (snap.computed_unix, body, zipped)
            spent = rt.view_encodes[when]
            spent[0] += 1
            spent[1] += time.perf_counter() - started
            return body, zipped

    def encode_read_views() -> None:
        """At the end of a derive pass (its thread): encode the fleet views their readers will
        ask for next, so that they get a recent body at once (collector/api/readahead.py): a view
        read since the last pass or within READ_AHEAD_SECONDS, kept at most two passes old; a
        view polled less often than every two passes, once per poll, just before its read."""
        rt: Runtime = app.state.runtime

        def age(key: tuple[float, str | None]) -> float | None:
            held = published.get(key)
            return None if held is None else rt.snapshot.computed_unix - held[0]

        for key in read_ahead.due(time.monotonic(), age):
            encode_published(*key, when="ahead")

    app.state.encode_read_views = encode_read_views

    def published_json(seconds: float, business_type: str | None) -> tuple[bytes, bytes] | None:
        """A published window's report, serialised once per read and ahead of it: a request gets
        the body the last pass encoded (at most three passes old: see `encode_read_views`), and
        only one that finds none that recent waits for the encode (in a worker thread)."""
        rt: Runtime = app.state.runtime
        key = (seconds, business_type)
        read_ahead.read(key, time.monotonic())
        held = published.get(key)
        if held is not None and rt.now() - held[0] <= 3 * rt.settings.derive_interval + 5:
            return held[1], held[2]
        return None

    @app.get("/api/v1/serving", response_model=ServingResponse, tags=["serving"])
    async def serving(
        rt: RuntimeDep,
        request: Request,
        window: WindowQuery = "5m",
        target: str | None = None,
        model: str | None = None,
        business_type: str | None = None,
        start: StartQuery = None,
        end: EndQuery = None,
    ) -> ServingResponse:
        seconds = window_seconds(window)
        fixed = period(rt.now(), window, start, end)
        if fixed is not None:  # a past period: merged from the stored rollups, exactly
            report = await asyncio.to_thread(rt.report_between, fixed[0], fixed[1], target, model, business_type)
            return report_out(format_duration(max(60, fixed[1] - fixed[0])), report)
        if target is None and model is None:
            cached = published_json(seconds, business_type)
            if cached is None:
                cached = await asyncio.to_thread(encode_published, seconds, business_type)
            if cached is not None:
                body, zipped = cached
                headers = {"Vary": "Accept-Encoding"}
                if "gzip" in request.headers.get("accept-encoding", ""):
                    body, headers = zipped, {**headers, "Content-Encoding": "gzip"}
                return Response(body, media_type="application/json", headers=headers)  # type: ignore[return-value]
        report = await asyncio.to_thread(rt.report, seconds, rt.now(), target, model, business_type)
        return report_out(format_duration(seconds), report)

    @app.post(
        "/v1/traces",
        tags=["traces"],
        response_class=Response,
        responses=OTLP_RESPONSES,
        openapi_extra={"requestBody": OTLP_REQUEST_BODY},
    )
    async def otlp_traces(rt: RuntimeDep, request: Request) -> Response:
        """OTLP/HTTP trace export (protobuf or JSON, gzip or deflate)."""
        return await rt.traces.handle(request)

    @app.get("/api/v1/requests/summary", response_model=RequestSummaryResponse, tags=["traces"])
    async def requests_summary(
        rt: RuntimeDep,
        window: WindowQuery = "5m",
        business_type: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        measured_at: str | None = None,
        start: StartQuery = None,
        end: EndQuery = None,
    ) -> RequestSummaryResponse:
        seconds = window_seconds(window)
        now = rt.now()
        fixed = period(now, window, start, end)
        lo, hi = fixed if fixed is not None else window_bounds(now, seconds)
        rows = await asyncio.to_thread(read_requests, rt.store, lo, hi)
        summary = summarize(rows, business_type, tenant, model, measured_at)
        if fixed is not None:
            report = await asyncio.to_thread(rt.report_between, lo, hi, None, model, business_type)
            seconds = max(60, hi - lo)
        else:
            report = await asyncio.to_thread(rt.report, seconds, now, None, model, business_type)
        return summary_out(format_duration(seconds), lo, hi, summary, engine_breakdown(report))

    @app.get("/api/v1/cost", response_model=CostResponse, tags=["cost"])
    async def cost(
        rt: RuntimeDep,
        window: WindowQuery = "1d",
        start: StartQuery = None,
        end: EndQuery = None,
        group_by: Literal["deployment", "business_type", "model", "target", "tenant"] = "business_type",
    ) -> CostResponse:
        """Cost per group over a window, reconciled to the configured GPU prices (the inventory's
        `deployments:`): allocation basis (busy + idle share) and usage basis (busy only). The
        period is [start, end) when both are given (empty when end <= start); start alone runs to
        now, end alone takes the window before it; neither: the window ending now."""
        start, end = period(rt.now(), window, start, end) or window_bounds(rt.now(), window_seconds(window))
        report = await asyncio.to_thread(rt.cost_report, start, end)
        lines = await asyncio.to_thread(rt.cost_lines, report, group_by)
        return cost_out(report, group_by, lines)

    @app.get("/api/v1/capacity", response_model=CapacityResponse, tags=["cost"])
    async def capacity(
        rt: RuntimeDep, window: WindowQuery = "4w", start: StartQuery = None, end: EndQuery = None
    ) -> CapacityResponse:
        """Per deployment: memory fit at the measured peak concurrency and context, throughput
        per replica while the SLOs held, replicas the weekly peak needs, saturation forecasts."""
        start, end = period(rt.now(), window, start, end) or window_bounds(rt.now(), window_seconds(window))
        report = await asyncio.to_thread(rt.capacity, start, end)
        return capacity_out(start, end, report)

    @app.get("/api/v1/drift", response_model=DriftResponse, tags=["drift"])
    async def drift(
        rt: RuntimeDep,
        business_type: str | None = None,
        signal: str | None = None,
        tenant: str | None = None,
        drifted: bool | None = None,
    ) -> DriftResponse:
        """The last drift pass: each signal of each business type (and busy tenant) against its
        reference, with the statistics, the threshold in force and a one-line explanation."""
        cfg = rt.settings.drift
        monitor = rt.drift
        ref = monitor.reference if monitor is not None else None
        latest = monitor.latest if monitor is not None else []
        return DriftResponse(
            evaluated_unix=monitor.evaluated_unix if monitor is not None else None,
            window=format_duration(cfg.window),
            reference=cfg.reference,
            reference_start_unix=ref.start if ref is not None else None,
            reference_end_unix=ref.end if ref is not None else None,
            findings=[
                drift_out(f)
                for f in latest
                if business_type in (None, f.business_type)
                and signal in (None, f.signal)
                and tenant in (None, f.tenant)
                and drifted in (None, f.drifted)
            ],
        )

    @app.get("/api/v1/compare", response_model=CompareResponse, tags=["drift"])
    async def compare(
        rt: RuntimeDep,
        baseline: Annotated[
            str,
            Query(
                description="target=A,B | model=NAME | deployment=NAME | track=NAME (the spans' track, the "
                "targets' track label) | label.KEY=VALUE; from spans also tenant=T | business_type=B | shadow=true",
                pattern=SELECTOR_PATTERN,
            ),
        ],
        candidate: Annotated[str, Query(description="the same forms as baseline", pattern=SELECTOR_PATTERN)],
        window: WindowQuery = "30m",
        start: StartQuery = None,
        end: EndQuery = None,
        source: Literal["auto", "engines", "spans"] = "auto",
        tolerance_p95: Annotated[
            float | None, Query(ge=0, le=100, description="p95 may be this much slower (0.1 = 10 %; default: config)")
        ] = None,
        tolerance_p50: Annotated[float | None, Query(ge=0, le=100, description="p50 likewise")] = None,
        tolerance_errors: Annotated[
            float | None, Query(ge=0, le=1, description="error ratio may rise by this much (0.005 = 0.5 points)")
        ] = None,
        min_requests: Annotated[
            int | None, Query(ge=1, le=10**9, description="requests each side needs for a verdict other than hold")
        ] = None,
    ) -> CompareResponse:
        """Candidate against baseline over the window: each metric's change with its 95 % interval,
        a verdict per metric and overall (promote, hold, rollback) against the `compare:`
        tolerances, or those given here."""
        try:
            base, cand = Selector.parse(baseline), Selector.parse(candidate)
        except SelectorError as exc:
            raise HTTPException(422, str(exc)) from None
        lo, hi = period(rt.now(), window, start, end) or window_bounds(rt.now(), window_seconds(window))
        tol = tolerances(rt.settings.compare, tolerance_p95, tolerance_p50, tolerance_errors, min_requests)
        try:
            result = await asyncio.to_thread(rt.compare, base, cand, lo, hi, source, tol)
        except SelectorError as exc:  # valid selectors that cannot be compared with each other
            return CompareResponse(
                baseline=baseline, candidate=candidate, window=format_duration(max(60, hi - lo)),
                baseline_requests=0, candidate_requests=0, verdict="hold", reason=f"hold: {exc}",
                source="none", metrics=[],
            )  # fmt: skip
        return compare_out(result)

    @app.get("/api/v1/slos/attainment", response_model=SloAttainmentResponse, tags=["slo"])
    async def slo_attainment(
        rt: RuntimeDep, window: WindowQuery = "1w", start: StartQuery = None, end: EndQuery = None
    ) -> SloAttainmentResponse:
        """Each objective over a closed period (default: the week to the end of the last whole
        minute): good and total events, attainment, the share of its error budget used. A period
        without events says null (no data), never 100 %."""
        lo, hi = period(rt.now(), window, start, end) or window_bounds(rt.now(), window_seconds(window))
        objectives, _ = await asyncio.to_thread(rt.slo_attainment, lo, hi)
        return SloAttainmentResponse(start_unix=lo, end_unix=hi, slos=[attainment_out(o, e) for o, e in objectives])

    @app.get("/api/v1/reports", response_model=ReportsResponse, tags=["reports"])
    async def list_reports(rt: RuntimeDep) -> ReportsResponse:
        """Stored reports, newest first, with each delivery channel's state."""
        rows = await asyncio.to_thread(ReportService(rt).list)
        return ReportsResponse(reports=[ReportEntry(**r) for r in rows])

    @app.post(
        "/api/v1/reports",
        response_model=ReportEntry,
        tags=["reports"],
        responses={404: {"description": "the year has no such ISO week (53)"}},
    )
    async def create_report(
        rt: RuntimeDep,
        week: Annotated[str, Query(pattern=r"^(last|this|\d{4}-W(0[1-9]|[1-4]\d|5[0-3]))$")] = "last",
        start: ReportStart = None,
        end: ReportEnd = None,
        deliver: bool = False,
    ) -> ReportEntry:
        """Build and store the report for a week (or [start, end): start alone runs to now, end
        alone takes the week before it; cut to the stored data and to 400 days); with `deliver`,
        send it by the configured channels in the background (their state shows in GET
        /api/v1/reports)."""
        tz = rt.settings.report.timezone
        fixed = period(rt.now(), "1w", start, end)
        try:
            if fixed is not None:
                # from the first stored data at most, and at most MAX_REPORT_DAYS (a report walks its days)
                first = await asyncio.to_thread(rt.first_stored_unix)
                hi = max(fixed[1], fixed[0] + 60)  # an empty period: one minute
                lo = max(fixed[0], min(first if first is not None else hi - 60, hi - 60), hi - MAX_REPORT_DAYS * 86400)
                chosen = between(lo, hi, tz)
            else:
                chosen = parse_week(week, tz, rt.now())
        except PeriodError as exc:  # a year without a week 53
            raise HTTPException(404, str(exc)) from None
        service = ReportService(rt)
        built = await asyncio.to_thread(service.generate, chosen)
        if deliver:
            rt.background(service.deliver(built))
        entry = next(r for r in await asyncio.to_thread(service.list) if r["id"] == built.id)
        return ReportEntry(**entry)

    @app.get("/api/v1/reports/{report_id}", tags=["reports"], responses=NOT_STORED)
    async def report_json(rt: RuntimeDep, report_id: str) -> Response:
        """The report's data as JSON (every figure of the HTML and Markdown forms)."""
        return _stored(await asyncio.to_thread(ReportService(rt).get, report_id, "data"), "application/json")

    @app.get("/reports/{report_id}.md", tags=["reports"], response_class=Response, responses=NOT_STORED)
    async def report_markdown(rt: RuntimeDep, report_id: str) -> Response:
        return _stored(await asyncio.to_thread(ReportService(rt).get, report_id, "markdown"), "text/markdown")

    @app.get("/reports/{report_id}", tags=["reports"], response_class=Response, responses=NOT_STORED)
    async def report_html(rt: RuntimeDep, report_id: str) -> Response:
        """The report page: charts inline, no JavaScript, printable."""
        return _stored(await asyncio.to_thread(ReportService(rt).get, report_id, "html"), "text/html")

    @app.get("/api/v1/slos", response_model=SlosResponse, tags=["slo"])
    async def slos(rt: RuntimeDep, business_type: str | None = None) -> SlosResponse:
        statuses = [s for s in rt.slo_statuses if business_type in (None, s.objective.business_type)]
        alerts = [
            a
            for a in rt.alerts.instances.values()
            if a.state != "resolved" and business_type in (None, a.labels.get("business_type"))
        ]
        evaluated = statuses[0].now_unix if statuses else None
        return SlosResponse(
            evaluated_unix=evaluated,
            slos=[slo_out(s) for s in statuses],
            alerts=[alert_out(a) for a in alerts],
        )

    return app
