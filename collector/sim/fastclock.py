"""Fast-clock mode: hours of simulated traffic in seconds, scraped on a virtual clock and fed
through the collector's own ingestion (TargetScraper.ingest -> rollups in the store)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from collector import conventions as conv
from collector.config import Settings, TargetConfig
from collector.sim.dcgm import render_dcgm
from collector.sim.exposition import render
from collector.sim.model import Fleet, Request
from collector.sim.scenario import Scenario
from collector.sources.scrape import ScrapeError, TargetScraper
from collector.store.repository import Store
from collector.traces.normalize import RequestRecord
from collector.traces.rollup import LatencyTarget
from collector.traces.store import ingest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DCGM_SUFFIX = "-dcgm"
MALFORMED = 'vllm:num_requests_running{model_name="broken" 1\n'


@dataclass
class FastRun:
    """What a fast run produced: every finished request (with exact timings) and the scrapers."""

    fleet: Fleet
    requests: list[Request] = field(default_factory=list)
    scrapers: dict[str, TargetScraper] = field(default_factory=dict)

    def requests_between(self, start: float, end: float, business_type: str | None = None) -> list[Request]:
        """Requests that finished in [start, end) seconds since the scenario start."""
        return [
            r
            for r in self.requests
            if start <= r.finished < end and (business_type is None or r.business_type == business_type)
        ]


def scrape_body(
    fleet: Fleet, replica: str, t: float, version: str, timeout: float
) -> tuple[str | None, ScrapeError | None]:
    """What a scrape of `replica` at `t` returns: a body, or the error the scraper would see."""
    if replica.endswith(DCGM_SUFFIX):  # the DCGM exporter beside a replica: up while its node is
        return render_dcgm(fleet, fleet.replicas[replica.removesuffix(DCGM_SUFFIX)], t), None
    rep = fleet.replicas[replica]
    if not fleet.replica_available(rep, t):
        return None, ScrapeError(conv.REASON_CONNECT, "ConnectError: connection refused (replica down)")
    fault = fleet.metrics_fault(replica, t)
    if fault is not None and fault.kind == "slow_metrics" and fault.delay_seconds >= timeout:
        return None, ScrapeError(conv.REASON_TIMEOUT, f"no complete answer within {timeout:g}s")
    if fault is not None and fault.kind == "malformed_metrics":
        return MALFORMED, None
    body = render(
        version,
        rep.deployment.model.name,
        rep.metrics,
        rep.deployment.block_size,
        rep.kv_capacity // rep.deployment.block_size,
    )
    return body, None


def targets_for(
    scenario: Scenario,
    url_of: Callable[[str], str] = lambda r: f"http://sim.invalid/{r}/metrics",
    dcgm: bool = False,
) -> list[TargetConfig]:
    """One collector target per replica, mapped to the replica's business types (and, with
    `dcgm`, one DCGM exporter target per replica, named `<replica>-dcgm`). Where a canary
    (a deployment with a `traffic_share`) serves a business type, its replicas are labelled
    `track: canary` and the other replicas of that business type `track: stable`, as a user
    would label them to compare the two (`llmslo compare --baseline track=stable ...`)."""
    canaried = {bt for dep in scenario.deployments if dep.traffic_share is not None for bt in dep.business_types}
    out = []
    for dep in scenario.deployments:
        track = "canary" if dep.traffic_share is not None else "stable"
        labels = {"track": track} if canaried & set(dep.business_types) else {}
        for i in range(dep.replicas):
            name = f"{dep.name}-{i}"
            out.append(
                TargetConfig(
                    name=name,
                    url=url_of(name),
                    business_type=dep.business_types[0],
                    default_model=dep.model.name,
                    labels=labels,
                )
            )
            if dcgm:
                out.append(TargetConfig(name=name + DCGM_SUFFIX, url=url_of(name + DCGM_SUFFIX), kind="dcgm"))
    return out


def run_into_store(
    scenario: Scenario,
    store: Store,
    duration_seconds: float,
    scrape_interval: float = 15.0,
    version: str | None = None,
    settings: Settings | None = None,
    on_scrape: Callable[[float, str, str | None], None] | None = None,
    on_finish: Callable[[Request], None] | None = None,
) -> FastRun:
    """Simulate `duration_seconds` on a virtual clock, scraping every replica every interval and
    committing each scrape through the collector's ingestion with the virtual time as `now`.
    `on_scrape(t, replica, body)` sees every body (None when the scrape failed); with
    `on_finish`, each finished request goes there instead of into `run.requests` (long runs)."""
    fleet = scenario.fleet()
    version = version or scenario.spec.vllm_version
    settings = settings or Settings(targets=targets_for(scenario))
    run = FastRun(fleet)
    fleet.on_finish.append(on_finish or run.requests.append)
    for target in settings.targets:
        run.scrapers[target.name] = TargetScraper(target, settings, store)  # bodies are handed over
    t = 0.0
    while t < duration_seconds:
        t = min(duration_seconds, t + scrape_interval)
        fleet.advance(t)
        for name, scraper in run.scrapers.items():
            body, error = scrape_body(fleet, name, t, version, settings.target_timeout(scraper.target))
            if on_scrape is not None:
                on_scrape(t, name, body)
            scraper.ingest(body, CONTENT_TYPE, fleet.start_unix + t, error)
    return run


class SpanWriter:
    """Stores one gateway span per finished simulated request, as the trace ingestion would have
    (the attributes `collector/sim/spans.py` exports, already normalised), in batches."""

    def __init__(
        self, store: Store, start_unix: float, targets_of: dict[str, list[LatencyTarget]] | None = None
    ) -> None:
        self.store, self.start_unix, self.targets_of = store, start_unix, targets_of or {}
        self.pending: list[RequestRecord] = []
        self.stored = 0

    def __call__(self, req: Request) -> None:
        if not req.done:
            return
        ttft = None if req.error_type or math.isnan(req.first_token) else req.ttft
        self.pending.append(
            RequestRecord(
                req.id.to_bytes(16, "big"),
                (req.id + 1).to_bytes(8, "big"),
                self.start_unix + req.arrival,
                self.start_unix + req.finished,
                "gateway",
                req.model or "unknown",
                req.business_type,
                req.tenant,
                req.prompt_tokens,
                req.cached_tokens,
                0 if req.error_type else req.output_tokens,
                ttft,
                None if req.error_type else req.tpot,
                req.finished - req.arrival,
                None,
                req.reason or "error",
                req.error_type,
            )
        )
        if len(self.pending) >= 10_000:
            self.flush()

    def flush(self) -> int:
        if self.pending:
            self.stored += ingest(self.store, self.pending, self.targets_of)
            self.pending = []
        return self.stored


def store_spans(
    run: FastRun, store: Store, start_unix: float, targets_of: dict[str, list[LatencyTarget]] | None = None
) -> int:
    """Store a span for each of a finished run's requests; returns how many were stored."""
    writer = SpanWriter(store, start_unix, targets_of)
    for req in run.requests:
        writer(req)
    return writer.flush()
