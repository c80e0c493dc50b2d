"""OpenTelemetry tracing shared by the three processes: setup, W3C ``traceparent``, flush.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, :func:`setup`
installs the SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` and an OTLP exporter chosen by
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL`` (the signal-specific one
wins, as the OpenTelemetry specification says; :func:`protocol`):

* ``http/protobuf`` (the default): OTLP/HTTP, ``opentelemetry-exporter-otlp-proto-http``
  (the endpoint is the receiver's HTTP base, e.g. ``http://collector:4318``; ``/v1/traces`` is
  added to the general endpoint, not to the traces one);
* ``grpc``: OTLP/gRPC, ``opentelemetry-exporter-otlp-proto-grpc`` (the endpoint is
  ``host:port`` of the receiver's gRPC port, 4317, with ``http://`` for plaintext or ``https://``
  for TLS; ``OTEL_EXPORTER_OTLP_INSECURE``, ``..._CERTIFICATE`` apply).

Either exporter reads the rest of the standard variables itself (``OTEL_EXPORTER_OTLP_HEADERS``,
``..._TIMEOUT``, ``..._COMPRESSION`` and their ``_TRACES_`` forms), and the processor
``OTEL_BSP_*`` (e.g. ``OTEL_BSP_SCHEDULE_DELAY`` in milliseconds). Any other protocol
(``http/json``, which the Python SDK does not export, or a typo) is refused with
:class:`UnsupportedProtocol` naming the variable, its value and the two accepted ones: the CLI
checks it in the main process (:func:`require_sdk`) and ends the command with that line and exit 2
before anything is served. The SDK and both exporters come with the ``otel`` extra; without it
:func:`setup` and :func:`require_sdk` raise :class:`~luftpause.extras.MissingExtra`, and only the
API (core) is installed. Unset (or ``OTEL_SDK_DISABLED=true``, or ``OTEL_TRACES_EXPORTER=none``)
nothing is installed and no protocol is checked: :func:`tracer` is the API's no-op tracer, the
SDK is never imported, and hot paths test the one module attribute ``tracing.active`` before doing
any tracing work at all. ``OTEL_TRACES_EXPORTER`` other than ``otlp`` or ``none`` is warned about
and OTLP is used.

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
    from opentelemetry.sdk.trace.export import SpanExporter
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


PROTOCOLS = ("http/protobuf", "grpc")
"""The OTLP protocols exported; the first is the default."""


class UnsupportedProtocol(ValueError):
    """The environment names an OTLP protocol luftpause does not export: ``str()`` is one line with
    the variable, its value and the protocols that are taken."""

    def __init__(self, variable: str, value: str) -> None:
        super().__init__(
            f"{variable}={value} is not supported: luftpause exports OTLP traces over "
            f"{' or '.join(PROTOCOLS)} (unset, {PROTOCOLS[0]})"
        )
        self.variable = variable
        self.value = value


def protocol() -> str:
    """The OTLP protocol spans are exported with: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``, else ``http/protobuf``. Raises :class:`UnsupportedProtocol`
    for a value not in :data:`PROTOCOLS` (compared after stripping blanks, case-sensitively as the
    specification spells the values)."""
    for variable in PROTOCOL_ENVS:
        value = os.environ.get(variable, "").strip()
        if value:
            if value not in PROTOCOLS:
                raise UnsupportedProtocol(variable, value)
            return value
    return PROTOCOLS[0]


_WHAT_NEEDS_THE_SDK = "exporting spans (OTEL_EXPORTER_OTLP_ENDPOINT is set)"


def _exporter_class(chosen: str) -> type[SpanExporter]:
    """The SDK's OTLP span exporter for protocol ``chosen``; :class:`MissingExtra` when the SDK or
    that exporter is not installed."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401

        if chosen == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
    except ImportError as exc:
        raise MissingExtra("otel", _WHAT_NEEDS_THE_SDK, exc) from None
    return OTLPSpanExporter


def require_sdk() -> None:
    """When :func:`configured`: raise :class:`UnsupportedProtocol` for a protocol not exported, and
    :class:`~luftpause.extras.MissingExtra` (extra ``otel``) when the SDK or the protocol's OTLP
    exporter is not installed; else nothing.

    :func:`setup` raises the same, but runs in the granian worker of the dataplane and the runtime;
    the CLI calls this first, in the main process, so a missing extra or a bad protocol ends the
    command (exit 2) before anything is served.
    """
    if not configured():
        return
    _exporter_class(protocol())


def setup(service: str) -> bool:
    """Install OTLP export (:func:`protocol`'s) for this process as ``service`` when
    :func:`configured`.

    Returns True when spans are exported from now on, False when nothing was installed (the
    environment does not ask, or a provider is installed already). Call it once, in the process
    (or granian worker) that makes the spans, before any span is started. Raises
    :class:`UnsupportedProtocol` for an OTLP protocol not exported and
    :class:`~luftpause.extras.MissingExtra` when the ``otel`` extra is not installed.
    """
    if active or not configured():
        return False
    chosen = protocol()
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter not in ("", "otlp"):
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported; exporting over OTLP (%s)", exporter, chosen)
    # Imported only here: with tracing off the SDK and the exporters are never loaded (nor needed).
    exporter_class = _exporter_class(chosen)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter_class()))
    install(provider)
    trace.set_tracer_provider(provider)  # for any library instrumentation in the process
    log.info("exporting OpenTelemetry spans as %s over OTLP (%s)", service, chosen)
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
