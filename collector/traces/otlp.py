"""OTLP/HTTP trace payloads: decoding at the edge (protobuf or JSON, gzip or deflate) into
plain span records; the protobuf types never travel further in."""

from __future__ import annotations

import base64
import gzip
import io
import json
import zlib
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

try:
    from collector.traces import _otlpscan
except ImportError:  # installed without a C compiler: spans_of below does the same work, slower
    _otlpscan = None  # type: ignore[assignment]
SCANNER_BUILT = _otlpscan is not None

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
AttrValue = str | int | float | bool | list[Any] | None


class OtlpError(Exception):
    """The request cannot be processed at all: `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


@dataclass(slots=True)
class SpanRecord:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    name: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    attributes: dict[str, AttrValue]  # only the keys asked for (see spans_of)
    resource: dict[str, AttrValue]
    events: tuple[tuple[str, int], ...]  # (name, time_unix_nano)
    status_error: bool


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    try:
        if encoding == "gzip":
            data = gzip.GzipFile(fileobj=io.BytesIO(body)).read(limit + 1)
        elif encoding == "deflate":
            d = zlib.decompressobj()
            data = d.decompress(body, limit + 1)
        elif encoding == "identity":
            data = body
        else:
            raise OtlpError(415, f"unsupported Content-Encoding {encoding!r} (gzip, deflate or none)")
    except (OSError, EOFError, zlib.error) as exc:
        raise OtlpError(400, f"body is not valid {encoding}: {exc}") from None
    if len(data) > limit:
        raise OtlpError(413, f"decompressed body exceeds the limit of {limit} bytes")
    return data


def decode(body: bytes, content_type: str | None, wanted: frozenset[str] | None = None) -> list[SpanRecord]:
    """The spans of an export request, with the attributes named in `wanted` (all when None).

    protobuf's own decoder judges the body (an OtlpError for anything it refuses); the spans are
    then read by the C scanner when it is built (collector/traces/_otlpscan.c), by spans_of below
    otherwise or when the scanner declines an unusual encoding. Both give the same records."""
    req = parse_request(body, content_type)
    if _otlpscan is not None:
        raw = body if _media(content_type) == PROTOBUF else req.SerializeToString()
        try:
            spans = _otlpscan.scan(raw, wanted, SpanRecord)
        except ValueError:  # an encoding protobuf accepts and the scanner does not know (groups)
            spans = NotImplemented
        if spans is not NotImplemented:
            return spans
    return spans_of(req, wanted)


def is_json(content_type: str | None) -> bool:
    return _media(content_type) == JSON


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def parse_request(body: bytes, content_type: str | None) -> ExportTraceServiceRequest:
    media = _media(content_type)
    req = ExportTraceServiceRequest()
    if media == PROTOBUF:
        try:
            req.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(400, f"undecodable protobuf ExportTraceServiceRequest: {exc}") from None
        return req
    if media == JSON:
        try:
            data = json.loads(body)
            json_format.ParseDict(_hex_ids_to_base64(data), req, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError) as exc:
            raise OtlpError(400, f"invalid OTLP JSON: {exc}") from None
        except RecursionError:
            raise OtlpError(400, "invalid OTLP JSON: nested too deeply") from None
        return req
    raise OtlpError(415, f"unsupported Content-Type {content_type!r}: want {PROTOBUF} or {JSON}")


def _hex_ids_to_base64(data: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if k in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id") and isinstance(
                v, str
            ):
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise ValueError(f"{k} {v!r} is not hex") from None
            else:
                out[k] = _hex_ids_to_base64(v)
        return out
    if isinstance(data, list):
        return [_hex_ids_to_base64(x) for x in data]
    return data


def _value(v: AnyValue) -> AttrValue:
    kind = v.WhichOneof("value")
    # string_value_strindex indexes a dictionary only profiles carry: in a span it names nothing
    if kind is None or kind in ("bytes_value", "string_value_strindex"):
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}  # type: ignore[return-value]
    return getattr(v, kind)  # type: ignore[no-any-return]


def _attributes(kvs: Any, wanted: Container[str] | None) -> dict[str, AttrValue]:
    if wanted is None:
        return {kv.key: _value(kv.value) for kv in kvs}
    # the hot path: most attributes (prompts, request parameters) are never read, so their values
    # are never turned into Python objects, whatever their size
    return {kv.key: _value(kv.value) for kv in kvs if kv.key in wanted}


def spans_of(req: ExportTraceServiceRequest, wanted: Container[str] | None = None) -> list[SpanRecord]:
    """Every span of the request, with the attributes named in `wanted` (all when None)."""
    out: list[SpanRecord] = []
    append = out.append
    for rs in req.resource_spans:
        resource = _attributes(rs.resource.attributes, wanted)
        for ss in rs.scope_spans:
            for s in ss.spans:
                append(
                    SpanRecord(
                        s.trace_id,
                        s.span_id,
                        s.name,
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                        _attributes(s.attributes, wanted),
                        resource,
                        tuple((e.name, e.time_unix_nano) for e in s.events) if s.events else (),
                        s.status.code == 2,
                    )
                )
    return out


def response(rejected: int, message: str, as_json: bool) -> tuple[bytes, str]:
    """ExportTraceServiceResponse, with partial_success when spans were rejected."""
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    if as_json:
        return json_format.MessageToJson(resp).encode(), JSON
    return resp.SerializeToString(), PROTOBUF
