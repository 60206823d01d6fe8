"""One gateway span per simulated request, exported over OTLP/HTTP by the opentelemetry-sdk.

Attributes follow the OTel GenAI conventions (inference span: `{operation} {model}`, kind
CLIENT) plus llmslo's business type and tenant, so that the trace ingestion path is driven by
exactly what a real gateway exporter sends.
"""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from collector.sim.model import Request

BUSINESS_TYPE_ATTRIBUTE = "llmslo.business_type"
TENANT_ATTRIBUTE = "llmslo.tenant"


def span_attributes(req: Request) -> dict[str, str | int | float | bool | list[str]]:
    operation = "chat" if req.business_type != "code_completion" else "text_completion"
    attrs: dict[str, str | int | float | bool | list[str]] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": req.model or "unknown",
        "gen_ai.response.model": req.model or "unknown",
        "gen_ai.request.max_tokens": req.max_tokens,
        "gen_ai.request.stream": req.stream,
        "gen_ai.usage.input_tokens": req.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": req.cached_tokens,
        "gen_ai.usage.output_tokens": 0 if req.error_type else req.output_tokens,
        "gen_ai.response.finish_reasons": [req.reason or "error"],
        BUSINESS_TYPE_ATTRIBUTE: req.business_type,
        TENANT_ATTRIBUTE: req.tenant,
        "server.address": req.replica or "unrouted",
    }
    if not req.error_type:
        attrs["gen_ai.response.time_to_first_chunk"] = req.ttft
    else:
        attrs["error.type"] = req.error_type
    return attrs


class SpanEmitter:
    """Turns finished requests into spans with the simulated start and end times."""

    def __init__(
        self,
        endpoint: str | None = None,
        headers: dict[str, str] | None = None,
        exporter: SpanExporter | None = None,
        start_unix: float = 0.0,
    ) -> None:
        resource = Resource.create({"service.name": "llmslo-simulated-gateway"})
        self.provider = TracerProvider(resource=resource)
        # a collector under load may take seconds per 1,000-span batch: give up late, not drop spans
        exporter = exporter or OTLPSpanExporter(endpoint=endpoint, headers=headers or {}, timeout=30)
        self.processor = BatchSpanProcessor(
            exporter, max_queue_size=65536, max_export_batch_size=1000, schedule_delay_millis=1000
        )
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("llmslo.sim")
        self.start_unix = start_unix

    def emit(self, req: Request) -> None:
        start_ns = int((self.start_unix + req.arrival) * 1e9)
        end_ns = int((self.start_unix + req.finished) * 1e9)
        attrs = span_attributes(req)
        span = self.tracer.start_span(
            f"{attrs['gen_ai.operation.name']} {req.model or 'unknown'}",
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes=attrs,
        )
        if req.error_type:
            span.set_status(Status(StatusCode.ERROR, req.error_type))
        span.end(end_time=max(end_ns, start_ns))

    def flush(self) -> None:
        self.processor.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()
