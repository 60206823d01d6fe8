"""Trace ingestion: auth, back-pressure, decode, normalise, store; and the OTLP/HTTP endpoint
`POST /v1/traces` on top (OTLP/gRPC is in grpc_server.py, over the same TraceIngest).

Status codes follow the OTLP specification: 200 (with partial_success when spans were rejected),
400 undecodable, 401 bad or missing ingest key, 413 too large, 415 unsupported type or encoding,
503 with Retry-After when the ingest queue is full or the store is unavailable. A 200 means the
batch is committed (deduplicated by trace id, span id and end time).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request, Response
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from collector.conventions import TRACE_STORE_BUCKETS
from collector.histogram import Histogram
from collector.traces import otlp
from collector.traces.cardinality import UNASSIGNED, CardinalityGuard
from collector.traces.normalize import (
    SOURCE_ATTRIBUTES,
    Rejected,
    Rule,
    Source,
    is_llm_span,
    normalize,
    wanted_attributes,
)
from collector.traces.rollup import LatencyTarget
from collector.traces.store import ingest, ingest_now

if TYPE_CHECKING:
    from collector.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one export request, whatever the transport: `status` as in HTTP (gRPC maps
    it to its own codes), `rejected` spans named in `message` when the status is 200."""

    status: int
    message: str = ""
    rejected: int = 0
    retry_after: int | None = None


class TraceIngest:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        cfg = runtime.settings.traces
        self.cfg = cfg
        self.rules = [Rule(r.attribute, r.pattern, r.business_type, r.tenant, r.track) for r in cfg.classification]
        known = {*runtime.settings.business_types, cfg.default_business_type}
        known |= {r.business_type for r in cfg.classification if r.business_type}
        if runtime.rules is not None:
            known |= {bt.name for bt in runtime.rules.business_types}
        self.guard = CardinalityGuard(
            known, cfg.max_tenants_per_minute, cfg.max_models_per_minute, cfg.max_tracks_per_minute
        )
        self.warned_sources: set[str] = set()
        self.warned_faults: set[str] = set()  # exception types of spans the normaliser did not foresee
        # resource keys read only for attribution: a resource with nothing else needs no merge
        self.source_only = frozenset(SOURCE_ATTRIBUTES) - {r.attribute for r in self.rules} - {cfg.track_attribute}
        self.wanted = wanted_attributes(self.rules, cfg.track_attribute)
        if not otlp.SCANNER_BUILT:
            log.warning("C span scanner not built (no compiler at install): traces are decoded in Python, slower")
        self.in_flight = 0
        self.spans = Counter[str]()  # accepted | duplicate | rejected | ignored
        self.requests = Counter[tuple[str, int]]()  # by transport (http, grpc) and status as in HTTP
        # how long storing a batch took, on the event loop's thread (which it blocks) or a worker's
        self.store_seconds = {thread: Histogram(TRACE_STORE_BUCKETS) for thread in ("event_loop", "worker")}

    def targets_of(self) -> dict[str, list[LatencyTarget]]:
        rules = self.runtime.rules
        out: dict[str, list[LatencyTarget]] = {}
        if rules is None:
            return out
        for o in rules.objectives:
            if o.sli == "latency" and o.metric in ("ttft", "tpot", "e2e", "queue") and o.threshold_seconds:
                out.setdefault(o.business_type, []).append(LatencyTarget(o.slo, o.metric, o.threshold_seconds))
        return out

    def authorized(self, supplied: str | None) -> bool:
        """`supplied`: the value of the configured key header (HTTP header or gRPC metadata)."""
        if not self.cfg.ingest_keys:
            return True
        raw = supplied or ""
        if self.cfg.key_header.lower() == "authorization":
            scheme, _, raw = raw.partition(" ")
            if scheme.lower() != "bearer":
                return False
        return any(hmac.compare_digest(raw.encode(), k.encode()) for k in self.cfg.ingest_keys)

    def admit(self, transport: str, key: str | None) -> Outcome | None:
        """The refusals that come before reading a body: None when the request may go on."""
        if not self.authorized(key):
            return self.count(transport, Outcome(401, "missing or invalid ingest key"))  # the key is never logged
        if self.in_flight >= self.cfg.max_concurrent_batches:
            return self.count(transport, Outcome(503, "ingest queue full, retry later", retry_after=1))
        return None

    def count(self, transport: str, outcome: Outcome) -> Outcome:
        self.requests[(transport, outcome.status)] += 1
        return outcome

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Held by an admitted request from reading its body until it is stored."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def export(self, transport: str, body: bytes, content_type: str | None, encoding: str | None) -> Outcome:
        """Decode, normalise and durably store one export request (admitted, holding a slot). A
        fault of llmslo's own is answered 500 and counted like any other outcome, never raised."""
        try:
            outcome = await self._export(body, content_type, encoding)
        except Exception:
            log.exception("OTLP export failed inside llmslo (a bug: please report it); answered 500")
            outcome = Outcome(500, "internal error in llmslo; nothing of this request was stored")
        return self.count(transport, outcome)

    async def _export(self, body: bytes, content_type: str | None, encoding: str | None) -> Outcome:
        try:
            data = otlp.decompress(body, encoding, self.cfg.max_body_bytes)
            spans = otlp.decode(data, content_type, self.wanted)
        except otlp.OtlpError as exc:
            return Outcome(exc.status, exc.message)
        records, reasons = [], Counter[str]()
        now = time.time()
        fleet = self.runtime.fleet
        scrapers = self.runtime.scrapers

        def models_seen(target: str) -> tuple[str, ...]:
            return scrapers[target].status.models if target in scrapers else ()

        # spans of one ResourceSpans share one resource dict: place it once
        last_resource: object = None
        source: Source | None = None
        merge = True
        for span in spans:
            if not is_llm_span(span):
                self.spans["ignored"] += 1
                continue
            try:
                resource = span.resource
                if resource is not last_resource:
                    last_resource = resource
                    source = fleet.source_of(resource, models_seen, self.cfg.track_label) if resource else None
                    merge = bool(resource) and not resource.keys() <= self.source_only
                record = normalize(
                    span, self.rules, self.cfg.default_business_type, source, now, merge, self.cfg.track_attribute
                )
                records.append(record)
                if record.business_type == UNASSIGNED:
                    self._warn_unassigned(span)
            except Rejected as exc:
                reasons[str(exc)] += 1
            except Exception as exc:  # a span llmslo's normaliser did not foresee: reject it alone
                reasons[f"not understood by llmslo ({type(exc).__name__})"] += 1
                if type(exc).__name__ not in self.warned_faults:
                    self.warned_faults.add(type(exc).__name__)
                    log.exception("a span could not be normalised; it is rejected, the rest of its batch kept")
        self.guard.apply(records)
        try:
            targets = self.targets_of()
            started = time.perf_counter()
            ledger = self.runtime.ledger
            sink = ledger.add_live_requests if ledger is not None else None
            new = ingest_now(self.runtime.store, records, targets, sink)  # None: a writer is busy, don't wait here
            if new is not None:
                self.store_seconds["event_loop"].observe(time.perf_counter() - started)
            else:
                started = time.perf_counter()
                new = await asyncio.to_thread(ingest, self.runtime.store, records, targets, sink)
                self.store_seconds["worker"].observe(time.perf_counter() - started)
        except Exception as exc:
            if not _refused_by_data(exc):
                log.warning("trace batch not stored (%s): the client will retry", type(exc).__name__)
                return Outcome(503, "store unavailable, retry later", retry_after=2)
            # the database refused something in the batch: store span by span, reject the rest
            new = 0
            kept = []
            for record in records:
                try:
                    new += await asyncio.to_thread(ingest, self.runtime.store, [record], targets, sink)
                    kept.append(record)
                except Exception as one:
                    if not _refused_by_data(one):
                        log.warning("trace batch partly stored (%s): the client will retry", type(one).__name__)
                        return Outcome(503, "store unavailable, retry later", retry_after=2)
                    cause = one.orig if isinstance(one, DBAPIError) else one
                    reasons[f"refused by the database ({type(cause).__name__})"] += 1
            records = kept
        rejected = sum(reasons.values())
        self.spans["accepted"] += new
        self.spans["duplicate"] += len(records) - new
        self.spans["rejected"] += rejected
        message = "; ".join(f"{n} span(s): {why}" for why, n in reasons.most_common(5))
        return Outcome(200, message, rejected)

    def _warn_unassigned(self, span: otlp.SpanRecord) -> None:
        """A warning once per source (service.name) whose spans belong to no business type."""
        service = str(span.resource.get("service.name", "")) if span.resource else ""
        if service not in self.warned_sources and len(self.warned_sources) < 1000:
            self.warned_sources.add(service)
            log.warning(
                "spans from service.name %r belong to no business type (counted as %r): set "
                "llmslo.business_type, a traces.classification rule, or a target's service_name",
                service,
                UNASSIGNED,
            )

    async def handle(self, request: Request) -> Response:
        """OTLP/HTTP: `POST /v1/traces`."""
        as_json = otlp.is_json(request.headers.get("content-type"))
        outcome = None
        if not self.authorized(request.headers.get(self.cfg.key_header)):
            outcome = self.count("http", Outcome(401, "missing or invalid ingest key"))  # the key is never logged
        else:
            # The body is read before an ingest slot is taken, within `body_read_timeout`: slow
            # uploads (or a Content-Length longer than the body) cannot hold the slots.
            try:
                async with asyncio.timeout(self.cfg.body_read_timeout):
                    body = await self._read_body(request)
            except TimeoutError:
                body = Outcome(408, f"request body not received within {self.cfg.body_read_timeout:g} s")
            if isinstance(body, Outcome):
                outcome = self.count("http", body)
            else:
                outcome = self.admit("http", request.headers.get(self.cfg.key_header))
                if outcome is None:
                    with self.slot():
                        ctype, encoding = request.headers.get("content-type"), request.headers.get("content-encoding")
                        outcome = await self.export("http", body, ctype, encoding)
        if outcome.status == 200:
            payload, media = otlp.response(outcome.rejected, outcome.message, as_json)
            return Response(payload, status_code=200, media_type=media)
        headers = {"Retry-After": str(outcome.retry_after)} if outcome.retry_after else None
        return Response(outcome.message.encode(), status_code=outcome.status, media_type="text/plain", headers=headers)

    async def _read_body(self, request: Request) -> bytes | Outcome:
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return Outcome(413, f"body of {declared} bytes exceeds the limit of {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return Outcome(413, f"body exceeds the limit of {limit} bytes")
        return bytes(body)


def _refused_by_data(exc: Exception) -> bool:
    """The database (or its driver) refused a value, as opposed to being unreachable: retrying the
    same batch would fail forever, so its spans are tried one by one. A data or constraint error,
    or a value the driver cannot encode; anything else (connection lost, locked, a timeout) is
    temporary: 503, the client retries."""
    if isinstance(exc, DBAPIError):
        return isinstance(exc, DataError | IntegrityError) and not exc.connection_invalidated
    return isinstance(exc, ValueError | TypeError | OverflowError)
