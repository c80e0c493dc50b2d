"""OpenTelemetry tracing shared by the three processes: setup, W3C ``traceparent``, flush.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, :func:`setup`
installs the SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` and the OTLP/HTTP protobuf
exporter (``opentelemetry-exporter-otlp-proto-http``; it reads the rest of the ``OTEL_EXPORTER_OTLP_*``
and ``OTEL_BSP_*`` variables itself, e.g. ``OTEL_BSP_SCHEDULE_DELAY`` in milliseconds). The SDK and
the exporter come with the ``otel`` extra; without it :func:`setup` and :func:`require_sdk` raise
:class:`~luftpause.extras.MissingExtra`, and only the API (core) is installed. Unset (or
``OTEL_SDK_DISABLED=true``, or ``OTEL_TRACES_EXPORTER=none``) nothing is installed: :func:`tracer`
is the API's no-op tracer, the SDK is never imported, and hot paths test the one module attribute
``tracing.active`` before doing any tracing work at all. Only OTLP/HTTP with protobuf is exported:
``OTEL_EXPORTER_OTLP_PROTOCOL`` (or ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``) ``grpc`` or
``http/json`` is refused with a warning and nothing is exported (point the endpoint at the
receiver's OTLP/HTTP port, 4318, instead); ``OTEL_TRACES_EXPORTER`` other than ``otlp`` or
``none`` is warned about and OTLP is used.

Service names (``service.name``, unless ``OTEL_SERVICE_NAME`` says otherwise):
``luftpause-scheduler``, ``luftpause-dataplane``, ``luftpause-runtime``.

Spans follow the OpenTelemetry semantic conventions for generative AI, v1.41.0 of
semantic-conventions (status: Development): ``docs/gen-ai/gen-ai-spans.md`` (inference span
``chat {gen_ai.request.model}``, kind CLIENT, with ``gen_ai.operation.name``,
``gen_ai.provider.name`` (:data:`PROVIDER`), ``gen_ai.request.model``, and, when the engine
reported them, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens`` and
``gen_ai.response.finish_reasons``: :func:`usage_attributes`, shared by the runtime and the
dataplane) and
``docs/gen-ai/gen-ai-agent-spans.md`` (``invoke_agent {gen_ai.agent.name}`` and
``execute_tool {gen_ai.tool.name}``, kind INTERNAL, with ``gen_ai.agent.id``, ``gen_ai.agent.name``,
``gen_ai.conversation.id``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``:
``extension``: the runtime executes every tool itself, agent-side).
luftpause's own facts are ``luftpause.*`` attributes (``luftpause.replica``, ``luftpause.held_ms``,
``luftpause.run_id``, ``luftpause.turn_id`` ...).

Propagation is W3C Trace Context (``traceparent`` with its ``tracestate``,
https://www.w3.org/TR/trace-context/) through
the SDK's ``TraceContextTextMapPropagator``: runtime -> dataplane (HTTP header) -> scheduler (the
``traceparent`` field of ``AdmitRequest`` / ``LeasedTurn``) and -> engine (HTTP header), and runtime
-> HTTP tool servers (HTTP header).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from luftpause.extras import MissingExtra

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("luftpause.tracing")

SCHEDULER_SERVICE = "luftpause-scheduler"
DATAPLANE_SERVICE = "luftpause-dataplane"
RUNTIME_SERVICE = "luftpause-runtime"

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""Either one set (non-empty) turns exporting on."""

SEMCONV_VERSION = "1.41.0"
"""The semantic-conventions release whose GenAI spans these follow (the tracer's schema)."""

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
"""The first one set wins (the signal-specific one), as in the OpenTelemetry specification."""

PROVIDER = "luftpause"
"""``gen_ai.provider.name`` of luftpause's inference spans: the turns go through luftpause (the
conventions' well-known values name hosted providers; a proxy in front of self-hosted engines is
none of them, so its own name, as the conventions allow for others)."""

active = False
"""True while a ``TracerProvider`` of the SDK is installed: the one check on hot paths."""

_provider: TracerProvider | None = None
_tracer: Tracer = trace.NoOpTracer()
_propagator = TraceContextTextMapPropagator()


def configured() -> bool:
    """True when the environment asks for spans to be exported (an OTLP endpoint is set and the
    SDK is not disabled by ``OTEL_SDK_DISABLED=true``)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(os.environ.get(name) for name in ENDPOINT_ENVS)


_WHAT_NEEDS_THE_SDK = "exporting spans (OTEL_EXPORTER_OTLP_ENDPOINT is set)"


def require_sdk() -> None:
    """Raise :class:`~luftpause.extras.MissingExtra` (extra ``otel``) when :func:`configured` but
    the SDK or the OTLP/HTTP exporter is not installed; else nothing.

    :func:`setup` raises the same, but runs in the granian worker of the dataplane and the runtime;
    the CLI calls this first, in the main process, so a missing extra ends the command (exit 2)
    before anything is served.
    """
    if not configured():
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise MissingExtra("otel", _WHAT_NEEDS_THE_SDK, exc) from None


def setup(service: str) -> bool:
    """Install OTLP/HTTP export for this process as ``service`` when :func:`configured`.

    Returns True when spans are exported from now on, False when nothing was installed (the
    environment does not ask, or a provider is installed already). Call it once, in the process
    (or granian worker) that makes the spans, before any span is started. Raises
    :class:`~luftpause.extras.MissingExtra` when the ``otel`` extra is not installed.
    """
    if active or not configured():
        return False
    protocol = next((os.environ[n].strip() for n in PROTOCOL_ENVS if os.environ.get(n, "").strip()), "")
    if protocol and protocol != "http/protobuf":
        log.warning(
            "%s=%s is not supported: luftpause exports OTLP over HTTP with protobuf only; "
            "set http/protobuf and the receiver's OTLP/HTTP endpoint (port 4318). No spans are exported",
            next(n for n in PROTOCOL_ENVS if os.environ.get(n, "").strip()),
            protocol,
        )
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter not in ("", "otlp"):
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported; exporting over OTLP/HTTP", exporter)
    # Imported only here: with tracing off the SDK and the exporter are never loaded (nor needed).
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise MissingExtra("otel", _WHAT_NEEDS_THE_SDK, exc) from None

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)
    trace.set_tracer_provider(provider)  # for any library instrumentation in the process
    log.info("exporting OpenTelemetry spans as %s over OTLP/HTTP", service)
    return True


def install(provider: TracerProvider) -> None:
    """Make ``provider`` the source of luftpause's spans (what :func:`setup` does; tests install
    one with an in-memory exporter). Replaces any provider installed before, without shutting it down."""
    global _provider, _tracer, active
    _provider = provider
    _tracer = provider.get_tracer(
        "luftpause", schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
    )
    active = True


def shutdown() -> None:
    """Export what is buffered and stop exporting (at process shutdown); a no-op when inactive.

    Bounded by the exporter's own timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s by default).
    """
    global _provider, _tracer, active
    provider, _provider = _provider, None
    active = False
    _tracer = trace.NoOpTracer()
    if provider is not None:
        provider.shutdown()


def tracer() -> Tracer:
    """luftpause's tracer: the installed provider's, or the API's no-op tracer."""
    return _tracer


def parent(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The context a W3C ``traceparent`` (with its ``tracestate``, kept for the children) names,
    to start a child span in; None when absent.

    A malformed value gives an empty context (the span starts a new trace), per the W3C spec.
    """
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    return _propagator.extract(carrier)


def headers_of(span: Span) -> dict[str, str]:
    """The W3C headers (``traceparent``, and ``tracestate`` when there is one) naming ``span`` as
    the parent of what is sent with them; empty for a span that is not recording a valid trace."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def traceparent_of(span: Span) -> str | None:
    """The W3C ``traceparent`` value naming ``span`` as parent; None for an invalid span."""
    return headers_of(span).get(TRACEPARENT)


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C ``traceparent`` as 32 lower-case hex digits; "" when the value is
    absent or invalid (parsed by the propagator: version ``ff``, an all-zero id ... are invalid)."""
    context = parent(traceparent)
    if context is None:
        return ""
    span_context = trace.get_current_span(context).get_span_context()
    return f"{span_context.trace_id:032x}" if span_context.is_valid else ""


def usage_attributes(
    prompt_tokens: object, completion_tokens: object, finish_reasons: list[str] | tuple[str, ...]
) -> dict[str, int | list[str]]:
    """The GenAI usage attributes of an inference span, each only when the engine reported it:
    ``gen_ai.usage.input_tokens`` / ``output_tokens`` (tokens, from an OpenAI ``usage``'s
    ``prompt_tokens`` / ``completion_tokens``; anything not an int is left out, never 0) and
    ``gen_ai.response.finish_reasons`` (when non-empty)."""
    attributes: dict[str, int | list[str]] = {}
    if type(prompt_tokens) is int:
        attributes["gen_ai.usage.input_tokens"] = prompt_tokens
    if type(completion_tokens) is int:
        attributes["gen_ai.usage.output_tokens"] = completion_tokens
    if finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(finish_reasons)
    return attributes
