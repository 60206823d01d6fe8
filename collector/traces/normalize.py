"""Spans of every known shape -> one RequestRecord per LLM request.

Sources: vLLM's own `llm_request` span (`gen_ai.latency.*`, `gen_ai.usage.prompt_tokens`), OTel GenAI
spans with old and new attribute names, LiteLLM (`litellm_request`, `metadata.user_api_key_*`) and
Envoy AI Gateway (GenAI or OpenInference `llm.*`). Every latency keeps where it was measured:
the same attribute name means different clocks in different tools.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collector.traces.otlp import AttrValue, SpanRecord

ENGINE, GATEWAY, CLIENT = "engine", "gateway", "client"
GENAI_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion", "messages", "responses"})
MAX_ATTRIBUTE_CHARS = 65536
# Limits of the values llmslo stores, matched by the schema on both databases
# (collector/store/tables.py): a longer one rejects its span, never the batch.
MAX_MODEL_CHARS = 512
MAX_TENANT_CHARS = 256
MAX_BUSINESS_TYPE_CHARS = 128
MAX_TRACK_CHARS = 64
MAX_TOKENS = 100_000_000  # per request; a count above it is not a request llmslo can believe
MAX_LATENCY_SECONDS = 7 * 86400.0
MAX_FUTURE_SECONDS = 3600.0  # a span ending further ahead of llmslo's clock is rejected

# The attributes read, newest name first. Nothing else of a span is ever converted (see USED_ATTRIBUTES).
INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
CACHED_TOKENS = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "llm.token_count.prompt_details.cache_read",
)
E2E = ("gen_ai.latency.e2e",)
TTFT = (
    "gen_ai.latency.time_to_first_token",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.server.time_to_first_token",
)
QUEUE = ("gen_ai.latency.time_in_queue",)
FIRST_TOKEN_EVENTS = frozenset({"gen_ai.first_token", "first_token", "gen_ai.content.first_chunk"})
ERROR_TYPE = ("error.type",)
FINISH = ("gen_ai.response.finish_reasons", "gen_ai.response.finish_reason")
MODEL = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "model")
TENANT = ("llmslo.tenant", "metadata.user_api_key_team_id", "metadata.user_api_key_alias", "tenant.id")
BUSINESS_TYPE = ("llmslo.business_type",)
MEASURED_AT = "llmslo.measured_at"
# A candidate's response that was logged but not shown (shadow traffic): `llmslo.shadow=true` on
# the span. Stored with measured_at "shadow": out of the SLOs and the requests summary, in the
# canary comparison (`shadow=true` selects it).
SHADOW_ATTRIBUTE = "llmslo.shadow"
SHADOW = "shadow"
# The deployment track a request went to (`canary`, `stable`, a version: any short value), for
# the canary comparison's `track=` selector: this span attribute (configurable, traces.track_attribute),
# else the source target's `track` label, "" when none says; a matching classification rule's
# `track` overrides both, as its business type and tenant do.
TRACK_ATTRIBUTE = "llmslo.track"
# Resource attributes that name the server a span came from (the fleet map places it by them):
# `llmslo.target` (set on vLLM with OTEL_RESOURCE_ATTRIBUTES=llmslo.target=NAME), the standard
# service.instance.id, or service.name (OTEL_SERVICE_NAME) matched against a target's `service_name`.
SOURCE_ATTRIBUTES = ("llmslo.target", "service.instance.id", "service.name")
OPERATION = "gen_ai.operation.name"
GATEWAY_MARKERS = ("llm.model_name", "gen_ai.original.model")
USED_ATTRIBUTES = frozenset(
    {
        *INPUT_TOKENS,
        *OUTPUT_TOKENS,
        *CACHED_TOKENS,
        *E2E,
        *TTFT,
        *QUEUE,
        *ERROR_TYPE,
        *FINISH,
        *MODEL,
        *TENANT,
        *BUSINESS_TYPE,
        *GATEWAY_MARKERS,
        MEASURED_AT,
        SHADOW_ATTRIBUTE,
        OPERATION,
        *SOURCE_ATTRIBUTES,
    }
)


def wanted_attributes(rules: Sequence[Rule] = (), track_attribute: str = TRACK_ATTRIBUTE) -> frozenset[str]:
    """What spans_of must convert: the attributes read here, the track attribute and those the
    classification rules test."""
    return USED_ATTRIBUTES | {track_attribute} | {r.attribute for r in rules}


@dataclass(slots=True)
class RequestRecord:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    start_unix: float
    end_unix: float
    measured_at: str  # engine | gateway | client | shadow
    model: str
    business_type: str
    tenant: str
    input_tokens: int
    cached_input_tokens: int | None  # None: the source does not report it (vLLM's own spans)
    output_tokens: int
    ttft_seconds: float | None
    tpot_seconds: float | None
    e2e_seconds: float
    queue_seconds: float | None
    finish_reason: str
    error_type: str
    track: str = ""  # the deployment track (canary, stable, ...); "" when nothing names one

    @property
    def is_error(self) -> bool:
        return bool(self.error_type)


@dataclass(frozen=True, slots=True)
class Rule:
    """One classification rule: if the attribute matches, set business type, tenant and/or track."""

    attribute: str
    pattern: str
    business_type: str | None = None
    tenant: str | None = None
    track: str | None = None

    def matches(self, attrs: dict[str, AttrValue], model: str) -> bool:
        value = model if self.attribute == "model" else attrs.get(self.attribute)
        if value is None:
            return False
        return re.fullmatch(self.pattern, _checked(self.attribute, str(value))) is not None


class Rejected(Exception):
    """A span that claims to be an LLM request but cannot be used (the reason is counted)."""


def _checked(key: str, value: str) -> str:
    """A value llmslo uses (label, classification input): Rejected when over MAX_ATTRIBUTE_CHARS."""
    if len(value) > MAX_ATTRIBUTE_CHARS:
        raise Rejected(f"attribute {key} is {len(value)} characters long (limit {MAX_ATTRIBUTE_CHARS})")
    return value


def _num(attrs: dict[str, AttrValue], keys: tuple[str, ...], limit: float) -> float | None:
    """The first numeric value among keys; Rejected when it is not finite or outside [0, limit]
    (a NaN token count or a negative TTFT rejects its span, never the batch)."""
    for key in keys:
        v = attrs.get(key)
        kind = type(v)  # exact types: a bool is not a number here
        if kind is int or kind is float:
            x = float(v)  # type: ignore[arg-type]
        elif kind is str:
            try:
                x = float(v)  # type: ignore[arg-type]
            except ValueError:
                continue
        else:
            continue
        if not 0.0 <= x <= limit:  # also false for NaN
            raise Rejected(f"attribute {key} is {v!r}: expected a number from 0 to {limit:g}")
        return x
    return None


def _str(attrs: dict[str, AttrValue], keys: tuple[str, ...], limit: int = MAX_ATTRIBUTE_CHARS) -> str | None:
    """The first non-empty string (or first string of a list) among keys; Rejected when it is over
    `limit` characters or holds a NUL byte: such a model, tenant or finish reason is not a label
    anyone can use, and PostgreSQL refuses NUL in text."""
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, str) and v:
            if len(v) > limit:
                raise Rejected(f"attribute {key} is {len(v)} characters long (limit {limit})")
            if "\x00" in v:
                raise Rejected(f"attribute {key} contains a NUL character")
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate from a JSON "\udcff" escape
                    raise Rejected(f"attribute {key} is not valid Unicode (a lone surrogate)") from None
            return v
    return None


def is_llm_span(span: SpanRecord) -> bool:
    a = span.attributes
    return (
        span.name in ("llm_request", "litellm_request")
        or "gen_ai.latency.e2e" in a
        or (isinstance(op := a.get(OPERATION), str) and op in GENAI_OPERATIONS)
        or "llm.token_count.prompt" in a
        or "gen_ai.usage.input_tokens" in a
        or "gen_ai.usage.prompt_tokens" in a
    )


@dataclass(frozen=True, slots=True)
class Source:
    """The configured target a span's resource names (collector/fleetmap.py): what the span
    itself does not say (vLLM 0.32's llm_request carries no model) comes from there."""

    target: str
    model: str | None
    business_type_of: Callable[[str], str | None]  # model -> business type, the fleet map's answer
    track: str | None = None  # the target's track label (`track: canary` in its labels)


def normalize(
    span: SpanRecord,
    rules: Sequence[Rule] = (),
    default_business_type: str = "unassigned",
    source: Source | None = None,
    now_unix: float | None = None,
    merge_resource: bool = True,
    track_attribute: str = TRACK_ATTRIBUTE,
) -> RequestRecord:
    """Raises Rejected with the reason for an unusable span.

    Business type: the span's `llmslo.business_type`, else its source target's (the fleet map),
    else `default_business_type`; classification rules that match override it. Track: the span's
    `track_attribute`, else its source target's track label; matching rules override it too."""
    # resource attributes count as the span's own (a tenant set on the resource); the caller may
    # skip the merge for a resource holding only what attribution reads (service.name)
    a = {**span.resource, **span.attributes} if span.resource and merge_resource else span.attributes
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start <= 0 or end <= 0:
        raise Rejected("missing start or end timestamp")
    if end < start:
        raise Rejected("span ends before it starts")
    if now_unix is not None and end / 1e9 > now_unix + MAX_FUTURE_SECONDS:
        raise Rejected(f"span ends more than {MAX_FUTURE_SECONDS:g} s after the collector's clock")
    vllm = span.name == "llm_request" or "gen_ai.latency.e2e" in a
    if vllm:
        measured_at = ENGINE
    elif span.name == "litellm_request" or GATEWAY_MARKERS[0] in a or GATEWAY_MARKERS[1] in a:
        measured_at = GATEWAY
    else:
        measured_at = CLIENT
    claimed = a.get(MEASURED_AT)
    if claimed in (ENGINE, GATEWAY, CLIENT):
        measured_at = str(claimed)
    if a.get(SHADOW_ATTRIBUTE) in (True, "true", "True", "1", 1):
        measured_at = SHADOW
    e2e = _num(a, E2E, MAX_LATENCY_SECONDS)
    if e2e is None:
        e2e = (end - start) / 1e9
    ttft = _num(a, TTFT, MAX_LATENCY_SECONDS)
    if ttft is None and span.events:  # a first-token span event
        first = next((t for name, t in span.events if name in FIRST_TOKEN_EVENTS), None)
        if first is not None and first >= start:
            ttft = (first - start) / 1e9
    out = int(_num(a, OUTPUT_TOKENS, MAX_TOKENS) or 0)
    input_tokens = int(_num(a, INPUT_TOKENS, MAX_TOKENS) or 0)
    cached = _num(a, CACHED_TOKENS, MAX_TOKENS)
    if cached is not None and cached > input_tokens:
        raise Rejected(f"{int(cached)} cached input tokens exceed the {input_tokens} input tokens")
    tpot = (e2e - ttft) / (out - 1) if ttft is not None and out > 1 and e2e >= ttft else None
    error_type = _str(a, ERROR_TYPE) or ("error" if span.status_error else "")
    finish = _str(a, FINISH) or ("error" if error_type else "unknown")
    model = _str(a, MODEL, MAX_MODEL_CHARS) or (source.model if source is not None else None) or "unknown"
    tenant = _str(a, TENANT, MAX_TENANT_CHARS) or "unknown"
    business = _str(a, BUSINESS_TYPE, MAX_BUSINESS_TYPE_CHARS)
    business = business or (source.business_type_of(model) if source is not None else None)
    business = business or default_business_type
    track = _str(a, (track_attribute,), MAX_TRACK_CHARS) or (source.track if source is not None else None) or ""
    for rule in rules:
        if rule.matches(a, model):
            business = rule.business_type or business
            tenant = rule.tenant or tenant
            track = rule.track or track
    if len(business) > MAX_BUSINESS_TYPE_CHARS or len(tenant) > MAX_TENANT_CHARS or len(track) > MAX_TRACK_CHARS:
        raise Rejected("a classified business type, tenant or track is longer than the schema holds")
    return RequestRecord(
        span.trace_id,
        span.span_id,
        start / 1e9,
        end / 1e9,
        measured_at,
        model,
        business,
        tenant,
        input_tokens,
        None if cached is None else int(cached),
        out,
        ttft,
        tpot,
        e2e,
        _num(a, QUEUE, MAX_LATENCY_SECONDS),
        finish,
        error_type,
        track,
    )
