"""OTLP/gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`, conventionally on 4317),
over the same ingest core as OTLP/HTTP. Needs the `grpc` extra (grpcio).

The request arrives as raw bytes (no deserializer is registered), so the C scanner reads it
exactly as it reads an HTTP body. Outcomes map to the status codes of the OTLP specification:
UNAUTHENTICATED without a valid ingest key, INVALID_ARGUMENT for an undecodable body, UNAVAILABLE
(retryable) when the ingest queue is full or the store fails, RESOURCE_EXHAUSTED over the size
limit (gRPC itself enforces `traces.max_body_bytes` on receive).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collector.traces import otlp

if TYPE_CHECKING:
    from collector.traces.service import TraceIngest

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcUnavailable(RuntimeError):
    """grpcio is not installed but an OTLP/gRPC port is configured."""


def _grpc() -> tuple[Any, Any]:
    try:
        import grpc  # type: ignore[import-untyped]
        from grpc import aio
    except ImportError:
        raise GrpcUnavailable(
            "traces.otlp_grpc_port is set but grpcio is not installed: pip install 'llmslo[grpc]'"
        ) from None
    return grpc, aio


async def start_grpc(ingest: TraceIngest, host: str, port: int) -> Any:
    """Start the OTLP/gRPC server on host:port; returns the grpc.aio server (stop it with .stop())."""
    grpc, aio = _grpc()
    codes = {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        401: grpc.StatusCode.UNAUTHENTICATED,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        415: grpc.StatusCode.INVALID_ARGUMENT,
        503: grpc.StatusCode.UNAVAILABLE,
    }
    key_header = ingest.cfg.key_header.lower()  # gRPC metadata keys are lower case

    async def export(request: bytes, context: Any) -> bytes:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        outcome = ingest.admit("grpc", metadata.get(key_header))
        if outcome is None:
            with ingest.slot():
                outcome = await ingest.export("grpc", request, otlp.PROTOBUF, None)
        if outcome.status == 200:
            return otlp.response(outcome.rejected, outcome.message, as_json=False)[0]
        await context.abort(codes.get(outcome.status, grpc.StatusCode.INTERNAL), outcome.message)
        raise AssertionError("abort() raises")  # pragma: no cover

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {"Export": grpc.unary_unary_rpc_method_handler(export)},  # no (de)serializers: raw bytes both ways
    )
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", ingest.cfg.max_body_bytes),
            ("grpc.max_concurrent_streams", 64),
        ]
    )
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"OTLP/gRPC port {host}:{port} could not be bound")
    await server.start()
    return server
