"""Spans of every known shape -> one RequestRecord per LLM request.

Sources: vLLM's own `llm_request` span (`gen_ai.latency.*`, `gen_ai.usage.prompt_tokens`), OTel GenAI
spans with old and new attribute names, LiteLLM (`litellm_request`, `metadata.user_api_key_*`) and
Envoy AI Gateway (GenAI or OpenInference `llm.*`). Every latency keeps where it was measured:
the same attribute name means different clocks in different tools.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from collector.traces.otlp import AttrValue, SpanRecord

ENGINE, GATEWAY, CLIENT = "engine", "gateway", "client"
GENAI_OPERATIONS = {"chat", "text_completion", "generate_content", "completion", "messages", "responses"}
MAX_ATTRIBUTE_CHARS = 65536


@dataclass(frozen=True, slots=True)
class RequestRecord:
    trace_id: str
    span_id: str
    start_unix: float
    end_unix: float
    measured_at: str  # engine | gateway | client
    model: str
    business_type: str
    tenant: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    ttft_seconds: float | None
    tpot_seconds: float | None
    e2e_seconds: float
    queue_seconds: float | None
    finish_reason: str
    error_type: str

    @property
    def is_error(self) -> bool:
        return bool(self.error_type)


@dataclass(frozen=True, slots=True)
class Rule:
    """One classification rule: if the attribute matches, set business type and/or tenant."""

    attribute: str
    pattern: str
    business_type: str | None = None
    tenant: str | None = None

    def matches(self, attrs: dict[str, AttrValue]) -> bool:
        value = attrs.get(self.attribute)
        return value is not None and re.fullmatch(self.pattern, str(value)) is not None


class Rejected(Exception):
    """A span that claims to be an LLM request but cannot be used (the reason is counted)."""


def _num(attrs: dict[str, AttrValue], *keys: str) -> float | None:
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                continue
    return None


def _str(attrs: dict[str, AttrValue], *keys: str) -> str | None:
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, list) and v and isinstance(v[0], str):
            return v[0]
    return None


def is_llm_span(span: SpanRecord) -> bool:
    a = span.attributes
    return (
        span.name in ("llm_request", "litellm_request")
        or "gen_ai.latency.e2e" in a
        or a.get("gen_ai.operation.name") in GENAI_OPERATIONS
        or "llm.token_count.prompt" in a
        or "gen_ai.usage.input_tokens" in a
        or "gen_ai.usage.prompt_tokens" in a
    )


def normalize(span: SpanRecord, rules: Sequence[Rule] = (), default_business_type: str = "unassigned") -> RequestRecord:
    """Raises Rejected with the reason for an unusable span."""
    a = {**span.resource, **span.attributes}
    for key, value in span.attributes.items():
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_CHARS:
            raise Rejected(f"attribute {key} is {len(value)} characters long (limit {MAX_ATTRIBUTE_CHARS})")
    if span.start_time_unix_nano <= 0 or span.end_time_unix_nano <= 0:
        raise Rejected("missing start or end timestamp")
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise Rejected("span ends before it starts")
    duration = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    vllm = span.name == "llm_request" or "gen_ai.latency.e2e" in a
    measured_at = (
        ENGINE
        if vllm
        else (
            GATEWAY
            if span.name == "litellm_request" or "llm.model_name" in a or "gen_ai.original.model" in a
            else CLIENT
        )
    )
    if str(a.get("llmslo.measured_at", "")) in (ENGINE, GATEWAY, CLIENT):
        measured_at = str(a["llmslo.measured_at"])
    input_tokens = _num(a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
    output_tokens = _num(
        a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"
    )
    cached = (
        _num(
            a,
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.cache_read_input_tokens",
            "llm.token_count.prompt_details.cache_read",
        )
        or 0.0
    )
    e2e = _num(a, "gen_ai.latency.e2e") or duration
    ttft = _num(
        a,
        "gen_ai.latency.time_to_first_token",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.server.time_to_first_token",
    )
    if ttft is None:  # a first-token span event
        first = next(
            (
                t
                for name, t in span.events
                if name in ("gen_ai.first_token", "first_token", "gen_ai.content.first_chunk")
            ),
            None,
        )
        if first is not None and first >= span.start_time_unix_nano:
            ttft = (first - span.start_time_unix_nano) / 1e9
    out = int(output_tokens or 0)
    tpot = (e2e - ttft) / (out - 1) if ttft is not None and out > 1 and e2e >= ttft else None
    error_type = _str(a, "error.type") or ("error" if span.status_error else "")
    finish = _str(a, "gen_ai.response.finish_reasons", "gen_ai.response.finish_reason") or (
        "error" if error_type else "unknown"
    )
    model = _str(a, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "model") or "unknown"
    tenant = (
        _str(a, "llmslo.tenant", "metadata.user_api_key_team_id", "metadata.user_api_key_alias", "tenant.id")
        or "unknown"
    )
    business = _str(a, "llmslo.business_type") or default_business_type
    for rule in rules:
        if rule.matches({**a, "model": model}):
            business = rule.business_type or business
            tenant = rule.tenant or tenant
    return RequestRecord(
        trace_id=span.trace_id,
        span_id=span.span_id,
        start_unix=span.start_time_unix_nano / 1e9,
        end_unix=span.end_time_unix_nano / 1e9,
        measured_at=measured_at,
        model=model,
        business_type=business,
        tenant=tenant,
        input_tokens=int(input_tokens or 0),
        cached_input_tokens=int(cached),
        output_tokens=out,
        ttft_seconds=ttft,
        tpot_seconds=tpot,
        e2e_seconds=e2e,
        queue_seconds=_num(a, "gen_ai.latency.time_in_queue"),
        finish_reason=finish,
        error_type=error_type,
    )
