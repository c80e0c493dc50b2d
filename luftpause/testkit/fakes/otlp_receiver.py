"""A small OTLP trace receiver for tests, over HTTP and gRPC:
``python -m luftpause.testkit.fakes.otlp_receiver --port N [--grpc-port M]``.

OTLP/HTTP on ``--port``: takes ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` in binary
protobuf (``Content-Type: application/x-protobuf``, optionally ``Content-Encoding: gzip``), as the
OTLP/HTTP specification (https://opentelemetry.io/docs/specs/otlp/#otlphttp) defines it, decoded
with the generated classes of ``opentelemetry-proto``; answers ``ExportTraceServiceResponse``
(empty: all accepted). JSON-encoded OTLP is refused with 415.

OTLP/gRPC on ``--grpc-port`` (https://opentelemetry.io/docs/specs/otlp/#otlpgrpc): the
``opentelemetry.proto.collector.trace.v1.TraceService/Export`` unary call, served by ``grpcio``
with ``opentelemetry-proto``'s generated service stubs (plaintext; gzip as the client asks),
answered ``ExportTraceServiceResponse`` (empty: all accepted). Its spans go to the same list.

``GET /spans`` (on the HTTP port) returns every span received so far, by either protocol, as a
JSON array of::

    {"service": str, "name": str, "trace_id": 32 hex, "span_id": 16 hex, "parent_span_id": 16 hex | "",
     "trace_state": str, "kind": int (OTLP SpanKind), "status": int (OTLP StatusCode),
     "status_message": str, "start_time_unix_nano": int, "end_time_unix_nano": int (nanoseconds
     since the Unix epoch), "attributes": {key: value},
     "events": [{"name": str, "time_unix_nano": int, "attributes": {key: value}}],
     "links": [{"trace_id": 32 hex, "span_id": 16 hex, "trace_state": str, "attributes": {key: value}}],
     "protocol": "http" | "grpc"}

A body that is not in its stated encoding (aiohttp's server decodes gzip and deflate), or not an
``ExportTraceServiceRequest``, is refused with 400 (the OTLP/HTTP specification's answer to a
request it cannot decode), never a 500.
``GET /health`` answers 200 once serving. The receiver is an in-memory list; it keeps everything
until it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PROTOBUF = "application/x-protobuf"
SPANS: web.AppKey[list[dict[str, Any]]] = web.AppKey("spans", list)
"""The receiver app's spans received so far (``app[SPANS]``), as ``GET /spans`` answers them."""


def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as plain JSON-able Python (arrays as lists, kvlists as dicts)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind is not None else None


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP ``KeyValue`` attributes as a plain dict (values through :func:`any_value`)."""
    return {kv.key: any_value(kv.value) for kv in pairs}


def decode_spans(request: ExportTraceServiceRequest, protocol: str = "http") -> list[dict[str, Any]]:
    """The spans of one export request, flattened with their resource's ``service.name`` and the
    ``protocol`` (``http`` or ``grpc``) they came by."""
    spans: list[dict[str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "service": service,
                        "name": span.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "trace_state": span.trace_state,
                        "kind": span.kind,
                        "status": span.status.code,
                        "status_message": span.status.message,
                        "start_time_unix_nano": span.start_time_unix_nano,
                        "end_time_unix_nano": span.end_time_unix_nano,
                        "attributes": attributes_of(span.attributes),
                        "events": [
                            {
                                "name": event.name,
                                "time_unix_nano": event.time_unix_nano,
                                "attributes": attributes_of(event.attributes),
                            }
                            for event in span.events
                        ],
                        "links": [
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "trace_state": link.trace_state,
                                "attributes": attributes_of(link.attributes),
                            }
                            for link in span.links
                        ],
                        "protocol": protocol,
                    }
                )
    return spans


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest export request taken, by either protocol."""


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """OTLP/gRPC's ``TraceService``: each ``Export`` adds its spans to ``received``."""

    def __init__(self, received: list[dict[str, Any]]) -> None:
        self.received = received

    async def Export(
        self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ExportTraceServiceResponse:
        self.received.extend(decode_spans(request, "grpc"))
        return ExportTraceServiceResponse()


async def start_grpc_receiver(received: list[dict[str, Any]], host: str, port: int) -> grpc.aio.Server:
    """Serve OTLP/gRPC on ``host:port`` (plaintext) into ``received``, on the running loop; the
    started server (``await server.stop(None)`` ends it). Raises ``OSError`` when the port is taken."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # a second receiver on a taken port must fail, not share it
        ]
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(received), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    await server.start()
    return server


def receiver_app(received: list[dict[str, Any]] | None = None) -> web.Application:
    """The receiver as an aiohttp app; its spans are ``app[SPANS]`` (``received``, or a new list:
    pass the gRPC receiver's to serve both protocols' spans at ``GET /spans``)."""
    app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
    received = [] if received is None else received
    app[SPANS] = received

    async def traces(request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"only {PROTOBUF} is taken here")
        try:
            # aiohttp's server decodes Content-Encoding (gzip, deflate) itself while reading.
            body = await request.read()
        except RequestPayloadError as exc:  # a body not in its stated encoding: the client's fault
            return web.Response(status=400, text=f"the body cannot be decoded: {exc}")
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(body)
        except Exception as exc:  # protobuf's DecodeError: a malformed body is the client's fault
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        received.extend(decode_spans(export))
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type=PROTOBUF)

    async def spans(request: web.Request) -> web.Response:
        return web.json_response(received)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/spans", spans)
    app.router.add_get("/health", health)
    return app


async def serve(host: str, port: int, grpc_port: int | None) -> None:
    """Serve OTLP/HTTP (and ``GET /spans``) on ``port`` and, with ``grpc_port``, OTLP/gRPC, into one
    list, until SIGTERM or SIGINT."""
    received: list[dict[str, Any]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    grpc_server = await start_grpc_receiver(received, host, grpc_port) if grpc_port is not None else None
    runner = web.AppRunner(receiver_app(received), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await stop.wait()
    finally:
        await runner.cleanup()
        if grpc_server is not None:
            await grpc_server.stop(None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(
            "OTLP trace receiver for tests: takes POST /v1/traces (binary protobuf, gzip or not) and, "
            "with --grpc-port, OTLP/gRPC's TraceService/Export, and answers GET /spans with every "
            "span received, as JSON"
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on (required)")
    parser.add_argument(
        "--grpc-port", type=int, default=None, help="TCP port for OTLP/gRPC (none: HTTP only)"
    )
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.grpc_port))


if __name__ == "__main__":
    main()
