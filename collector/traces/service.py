"""The OTLP/HTTP `POST /v1/traces` endpoint: auth, back-pressure, decode, normalise, store.

Status codes follow the OTLP specification: 200 (with partial_success when spans were rejected),
400 undecodable, 401 bad or missing ingest key, 413 too large, 415 unsupported type or encoding,
503 with Retry-After when the ingest queue is full or the store is unavailable. A 200 means the
batch is committed (deduplicated by trace and span id).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import Counter
from typing import TYPE_CHECKING

from fastapi import Request, Response

from collector.traces import otlp
from collector.traces.normalize import Rejected, Rule, is_llm_span, normalize, wanted_attributes
from collector.traces.rollup import LatencyTarget
from collector.traces.store import ingest

if TYPE_CHECKING:
    from collector.runtime import Runtime

log = logging.getLogger(__name__)


class TraceIngest:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        cfg = runtime.settings.traces
        self.cfg = cfg
        self.rules = [Rule(r.attribute, r.pattern, r.business_type, r.tenant) for r in cfg.classification]
        self.wanted = wanted_attributes(self.rules)
        self.in_flight = 0
        self.spans = Counter[str]()  # accepted | duplicate | rejected | ignored
        self.requests = Counter[str]()  # by HTTP status

    def targets_of(self) -> dict[str, list[LatencyTarget]]:
        rules = self.runtime.rules
        out: dict[str, list[LatencyTarget]] = {}
        if rules is None:
            return out
        for o in rules.objectives:
            if o.sli == "latency" and o.metric in ("ttft", "tpot", "e2e", "queue") and o.threshold_seconds:
                out.setdefault(o.business_type, []).append(LatencyTarget(o.slo, o.metric, o.threshold_seconds))
        return out

    def _authorized(self, request: Request) -> bool:
        if not self.cfg.ingest_keys:
            return True
        raw = request.headers.get(self.cfg.key_header) or ""
        if self.cfg.key_header.lower() == "authorization":
            scheme, _, raw = raw.partition(" ")
            if scheme.lower() != "bearer":
                return False
        return any(hmac.compare_digest(raw.encode(), k.encode()) for k in self.cfg.ingest_keys)

    def _answer(self, status: int, message: str, as_json: bool, retry_after: int | None = None) -> Response:
        self.requests[str(status)] += 1
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        if status == 200:
            body, media = otlp.response(0, "", as_json)
            return Response(body, status_code=200, media_type=media)
        return Response(message.encode(), status_code=status, media_type="text/plain", headers=headers)

    async def handle(self, request: Request) -> Response:
        as_json = (request.headers.get("content-type") or "").startswith(otlp.JSON)
        if not self._authorized(request):
            return self._answer(401, "missing or invalid ingest key", as_json)  # the key is never logged
        if self.in_flight >= self.cfg.max_concurrent_batches:
            return self._answer(503, "ingest queue full, retry later", as_json, retry_after=1)
        self.in_flight += 1
        try:
            return await self._handle(request, as_json)
        finally:
            self.in_flight -= 1

    async def _handle(self, request: Request, as_json: bool) -> Response:
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return self._answer(413, f"body of {declared} bytes exceeds the limit of {limit} bytes", as_json)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return self._answer(413, f"body exceeds the limit of {limit} bytes", as_json)
        try:
            data = otlp.decompress(bytes(body), request.headers.get("content-encoding"), limit)
            spans = otlp.decode(data, request.headers.get("content-type"), self.wanted)
        except otlp.OtlpError as exc:
            return self._answer(exc.status, exc.message, as_json)
        records, reasons = [], Counter[str]()
        for span in spans:
            if not is_llm_span(span):
                self.spans["ignored"] += 1
                continue
            try:
                records.append(normalize(span, self.rules, self.cfg.default_business_type))
            except Rejected as exc:
                reasons[str(exc)] += 1
        try:
            new = await asyncio.to_thread(ingest, self.runtime.store, records, self.targets_of())
        except Exception as exc:
            log.warning("trace batch not stored (%s): the client will retry", type(exc).__name__)
            return self._answer(503, "store unavailable, retry later", as_json, retry_after=2)
        rejected = sum(reasons.values())
        self.spans["accepted"] += new
        self.spans["duplicate"] += len(records) - new
        self.spans["rejected"] += rejected
        self.requests["200"] += 1
        message = "; ".join(f"{n} span(s): {why}" for why, n in reasons.most_common(5))
        payload, media = otlp.response(rejected, message, as_json)
        return Response(payload, status_code=200, media_type=media)
