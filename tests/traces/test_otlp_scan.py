"""The C scanner (collector/traces/_otlpscan.c) against the pure-Python path (protobuf's own decoder):
the same span records for SDK-made payloads, for every attribute value type, for unusual but valid
encodings, and for thousands of mutated bodies; never a crash on garbage."""

from __future__ import annotations

import contextlib
import os
import random

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from collector.traces import otlp
from collector.traces.normalize import wanted_attributes

scanner = otlp._otlpscan
if scanner is None:
    if os.environ.get("CI") == "true":
        pytest.fail("the C scanner collector.traces._otlpscan is not built (pip install -e . needs gcc)")
    pytest.skip("the C scanner is not built: the pure-Python path is in use", allow_module_level=True)

WANTED = wanted_attributes()


def both(body: bytes, wanted: frozenset[str] | None) -> tuple[object, list[otlp.SpanRecord]]:
    req = ExportTraceServiceRequest.FromString(body)
    return scanner.scan(body, wanted, otlp.SpanRecord), otlp.spans_of(req, wanted)


def sdk_body() -> bytes:
    """Spans made through the SDK: every attribute type it can carry, events, error status, two resources."""
    finished = []
    for service in ("gateway-a", "gateway-b"):
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": service, "tenant.id": "t-" + service}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("scan-test")
        for i in range(25):
            span = tracer.start_span(
                f"chat model-{i % 3}",
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": f"model-{i % 3}",
                    "gen_ai.usage.input_tokens": 100 + i,
                    "gen_ai.usage.output_tokens": -i if i % 7 == 0 else i * 1000,
                    "gen_ai.response.time_to_first_chunk": 0.01 * i,
                    "gen_ai.request.stream": i % 2 == 0,
                    "gen_ai.response.finish_reasons": ["stop", "length"],
                    "llm.token_count.prompt": [1, 2, 3],
                    "gen_ai.latency.e2e": [0.5, 1.5],
                    "llmslo.tenant": "ténant-ü-日本",
                    "gen_ai.prompt": "x" * (i * 50),
                    "flags": [True, False],
                },
            )
            if i % 4 == 0:
                span.add_event("gen_ai.first_token")
            if i % 5 == 0:
                span.set_status(Status(StatusCode.ERROR, "boom"))
            span.end()
        finished.extend(memory.get_finished_spans())
    return encode_spans(finished).SerializeToString()


def kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def handmade_body() -> bytes:
    """Values the SDK never writes: kvlists, nested arrays, bytes, an empty AnyValue, int64 extremes."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", AnyValue(string_value="svc")))
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "chat m"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2**64 - 1
    nested = AnyValue()
    nested.array_value.values.add().array_value.values.add(int_value=-(2**63))
    nested.array_value.values.add().kvlist_value.values.append(kv("inner", AnyValue(double_value=-0.0)))
    kvlist = AnyValue()
    kvlist.kvlist_value.values.append(kv("a", AnyValue(int_value=2**63 - 1)))
    kvlist.kvlist_value.values.append(kv("a", AnyValue(string_value="last wins")))
    span.attributes.extend(
        [
            kv("nested", nested),
            kv("kv", kvlist),
            kv("raw", AnyValue(bytes_value=b"\x00\xff")),
            kv("empty", AnyValue()),
            KeyValue(key="no value at all"),
            kv("", AnyValue(string_value="empty key")),
            kv("dup", AnyValue(int_value=1)),
            kv("dup", AnyValue(bool_value=True)),
        ]
    )
    span.events.add(name="", time_unix_nano=0)
    span.events.add(name="gen_ai.first_token", time_unix_nano=5)
    span.status.code = 2
    rs.scope_spans.add()  # an empty scope
    req.resource_spans.add()  # an empty resource
    return req.SerializeToString()


MANY = WANTED | {f"rule.attribute.{i}" for i in range(200)}  # more than the scanner's key table holds


@pytest.mark.parametrize("wanted", [WANTED, MANY, frozenset(), None], ids=["wanted", "many", "none", "all"])
@pytest.mark.parametrize("make", [sdk_body, handmade_body])
def test_scanner_equals_protobuf_decoder(make, wanted) -> None:  # type: ignore[no-untyped-def]
    scanned, reference = both(make(), wanted)
    assert scanned == reference
    assert len(reference) >= 1


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field, encoded by hand."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_valid_encodings_in_unusual_order_or_parts() -> None:
    span = ExportTraceServiceRequest()
    s = span.resource_spans.add().scope_spans.add().spans.add()
    s.trace_id, s.span_id, s.name, s.start_time_unix_nano, s.end_time_unix_nano = b"t" * 16, b"s" * 8, "x", 1, 2
    s.attributes.append(kv("gen_ai.operation.name", AnyValue(string_value="chat")))
    scope = span.resource_spans[0].scope_spans[0].SerializeToString()
    resource = field(1, kv("tenant.id", AnyValue(string_value="r")).SerializeToString())
    # the resource after the spans, and a second resource part (its attributes add up)
    late = field(1, field(2, scope) + field(1, resource) + field(1, field(1, kv("x", AnyValue()).SerializeToString())))
    scanned, reference = both(late, None)
    assert scanned == reference and reference[0].resource == {"tenant.id": "r", "x": None}
    # a status in two parts: its fields merge
    status = s.SerializeToString() + field(15, b"\x18\x02") + field(15, b"\x12\x01m")
    body = field(1, field(2, field(2, status)))
    scanned, reference = both(body, None)
    assert scanned == reference and reference[0].status_error


def test_encodings_that_need_merging_fall_back_to_the_protobuf_decoder() -> None:
    # one KeyValue with two values: protobuf merges the two AnyValue messages
    pair = field(1, b"k") + field(2, b"\x0a\x01a") + field(2, b"\x18\x07")
    body = field(1, field(2, field(2, field(9, pair))))
    scanned, reference = both(body, None)
    assert scanned is NotImplemented and reference[0].attributes == {"k": 7}
    assert otlp.decode(body, otlp.PROTOBUF) == reference
    # an array in two parts: protobuf concatenates
    array = field(5, field(1, b"\x18\x01")) + field(5, field(1, b"\x18\x02"))
    body = field(1, field(2, field(2, field(9, field(1, b"a") + field(2, array)))))
    scanned, reference = both(body, None)
    assert scanned is NotImplemented and reference[0].attributes == {"a": [1, 2]}
    # an unknown group field: protobuf skips it, the scanner declines and decode falls back
    group = encode_varint(100 << 3 | 3) + encode_varint(100 << 3 | 4)
    body = field(1, field(2, field(2, field(5, b"n") + group)))
    assert otlp.decode(body, otlp.PROTOBUF) == otlp.spans_of(ExportTraceServiceRequest.FromString(body), None)


def test_mutated_bodies_never_crash_and_never_disagree() -> None:
    rng = random.Random(20261130)
    seeds = [sdk_body(), handmade_body()]
    accepted = agreed = 0
    for i in range(3000):
        body = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            pos = rng.randrange(len(body))
            if roll < 0.5:
                body[pos] = rng.randrange(256)
            elif roll < 0.75:
                del body[pos : pos + rng.randint(1, 8)]
            else:
                body[pos:pos] = rng.randbytes(rng.randint(1, 8))
        body = bytes(body[: rng.randint(0, len(body))] if i % 5 == 0 else body)
        wanted = WANTED if i % 2 else None
        try:
            scanned = scanner.scan(body, wanted, otlp.SpanRecord)
        except (ValueError, UnicodeDecodeError):
            scanned = None  # the scanner refused garbage: fine, as long as nothing crashed
        try:
            reference = otlp.spans_of(ExportTraceServiceRequest.FromString(body), wanted)
        except Exception:
            continue  # protobuf refuses it: the endpoint answers 400 before the scanner runs
        accepted += 1
        if scanned is not None and scanned is not NotImplemented:
            assert scanned == reference, f"mutation {i}"
            agreed += 1
        assert otlp.decode(body, otlp.PROTOBUF, wanted) == reference, f"mutation {i}"
    assert accepted > 100 and agreed > 50, (accepted, agreed)


def test_garbage_and_wrong_arguments_are_errors_not_crashes() -> None:
    rng = random.Random(7)
    for n in range(2000):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            scanner.scan(rng.randbytes(n % 200), None, otlp.SpanRecord)
    with pytest.raises(TypeError):
        scanner.scan(b"", ["not", "a", "set"], otlp.SpanRecord)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scanner.scan(b"")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="str keys"):
        scanner.scan(b"", {1, 2}, otlp.SpanRecord)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beyond the end"):
        scanner.scan(b"\x0a\x05abc", None, otlp.SpanRecord)
    with pytest.raises(ValueError, match="truncated varint"):
        scanner.scan(b"\x0a\x85", None, otlp.SpanRecord)


def test_a_string_index_value_replaces_what_came_before_and_names_nothing() -> None:
    # found by the 100,000-example fuzz run: an AnyValue holding int_value 0 and then field 8
    # (string_value_strindex, an index into a dictionary only profiles carry); protobuf keeps the
    # last oneof member, and in a span it names nothing
    s = ExportTraceServiceRequest().resource_spans.add().scope_spans.add().spans.add()
    s.trace_id, s.span_id, s.name, s.start_time_unix_nano, s.end_time_unix_nano = b"t" * 16, b"s" * 8, "x", 1, 2
    value = b"\x18\x00" + encode_varint(8 << 3) + encode_varint(1)  # int_value 0, then strindex 1
    body = field(1, field(2, field(2, s.SerializeToString() + field(9, field(1, b"k") + field(2, value)))))
    scanned, reference = both(body, None)
    assert scanned == reference and reference[0].attributes == {"k": None}
