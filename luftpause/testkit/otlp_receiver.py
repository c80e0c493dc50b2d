"""A small OTLP/HTTP trace receiver for tests: ``python -m luftpause.testkit.otlp_receiver --port N``.

Takes ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` in binary protobuf
(``Content-Type: application/x-protobuf``, optionally ``Content-Encoding: gzip``), as the OTLP/HTTP
specification (https://opentelemetry.io/docs/specs/otlp/#otlphttp) defines it, decoded with the
generated classes of ``opentelemetry-proto``; answers ``ExportTraceServiceResponse`` (empty: all
accepted). JSON-encoded OTLP is refused with 415. ``GET /spans`` returns every span received so
far as a JSON array of::

    {"service": str, "name": str, "trace_id": 32 hex, "span_id": 16 hex, "parent_span_id": 16 hex | "",
     "kind": int (OTLP SpanKind), "status": int (OTLP StatusCode), "attributes": {key: value}}

``GET /health`` answers 200 once serving. The receiver is an in-memory list; it keeps everything
until it stops.
"""

from __future__ import annotations

import argparse
import gzip
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PROTOBUF = "application/x-protobuf"


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


def decode_spans(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The spans of one export request, flattened with their resource's ``service.name``."""
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
                        "kind": span.kind,
                        "status": span.status.code,
                        "attributes": {kv.key: any_value(kv.value) for kv in span.attributes},
                    }
                )
    return spans


def receiver_app() -> web.Application:
    """The receiver as an aiohttp app; its spans are ``app["spans"]``."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    received: list[dict[str, Any]] = []
    app["spans"] = received

    async def traces(request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"only {PROTOBUF} is taken here")
        body = await request.read()
        if request.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
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


def main() -> None:
    parser = argparse.ArgumentParser(description="OTLP/HTTP trace receiver for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(receiver_app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
