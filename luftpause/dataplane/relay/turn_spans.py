"""The dataplane's span per proxied turn (only while :data:`luftpause.observe.tracing.active`).

One span from the turn's parsed request to the end of its relay, kind SERVER, child of the
client's ``traceparent``: ``chat {model}`` for ``POST /v1/chat/completions`` (GenAI semantic
conventions v1.41.0, inference: ``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``
(Required), ``gen_ai.request.model``, and when the engine reported them
``gen_ai.usage.input_tokens`` / ``output_tokens`` and ``gen_ai.response.finish_reasons``, through
:func:`luftpause.observe.tracing.usage_attributes` as the runtime's ``chat`` span) and
``decide {model}`` for a single-pass turn (``POST /v1/decide``). luftpause's facts ride as
``luftpause.turn_id``, ``luftpause.run_id``, ``luftpause.service_class``, ``luftpause.caller``,
``luftpause.replica``. The span is the parent of what the turn sends on: the scheduler's ``admit``
span (``AdmitRequest.traceparent``) and the engine request's span.

The engine request's span (:func:`engine_start`): kind CLIENT, ``chat {model}``, a child of the
turn's span, from the request sent to the turn's end; its context is the ``traceparent`` the engine
is sent, so an engine that traces hangs its spans below it. It carries what the engine was asked
and answered: ``gen_ai.request.*`` (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``frequency_penalty``, ``presence_penalty``, ``seed``, ``stop_sequences``, ``choice.count``, from
the body sent), ``server.address`` / ``server.port`` (the replica's), ``gen_ai.response.id``,
``gen_ai.response.model``, ``gen_ai.usage.*`` (with ``gen_ai.usage.cache_read.input_tokens`` when
the engine reported cached prompt tokens) and ``gen_ai.response.finish_reasons``; the turn's span
gets the same request and response attributes, with its own ``server.address`` (the dataplane's).
Both are GenAI ``chat`` spans: count inference calls by the CLIENT spans (one per engine request),
turns by the SERVER spans.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from luftpause.observe import tracing
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from luftpause.dataplane.turn import Turn


_REQUEST_NUMBERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",  # OpenAI's newer name
    "max_output_tokens": "gen_ai.request.max_tokens",  # OpenAI Responses
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
"""A request body's member -> its GenAI attribute (semantic conventions v1.41.0, inference)."""


def request_attributes(body: bytes) -> dict[str, Any]:
    """The ``gen_ai.request.*`` attributes of a request ``body`` (Chat Completions, Messages or
    Responses JSON): each parameter it sets, ``stop`` / ``stop_sequences`` as
    ``gen_ai.request.stop_sequences``, an ``n`` other than 1 as ``gen_ai.request.choice.count``;
    ``{}`` for a body that is not a JSON object. Read only while tracing is active."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    attributes: dict[str, Any] = {}
    for member, attribute in _REQUEST_NUMBERS.items():
        value = doc.get(member)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[attribute] = value
    stop = doc.get("stop", doc.get("stop_sequences"))
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop and all(isinstance(item, str) for item in stop):
        attributes["gen_ai.request.stop_sequences"] = stop
    n = doc.get("n")
    if type(n) is int and n != 1:
        attributes["gen_ai.request.choice.count"] = n
    return attributes


def engine_start(turn: Turn, replica: str, url: str, parent: Span | None) -> Span:
    """Start the span of ``turn``'s request to the engine at ``url`` (the base URL of its replica,
    named ``replica``): kind CLIENT, a child of the turn's span ``parent``, with the request's
    attributes (module docstring)."""
    parts = urlsplit(url)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "decide" if turn.single_pass else "chat",
        "gen_ai.provider.name": tracing.PROVIDER,
        "gen_ai.request.model": turn.model,
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
        "luftpause.turn_id": turn.turn_id,
        "luftpause.replica": replica,
        **request_attributes(turn.body),
    }
    context = trace.set_span_in_context(parent) if parent is not None else None
    operation = attributes["gen_ai.operation.name"]
    return tracing.tracer().start_span(
        f"{operation} {turn.model}", context=context, kind=SpanKind.CLIENT, attributes=attributes
    )


def answered(
    spans: Iterable[Span | None], cached: int, response_id: str | None, response_model: str | None
) -> None:
    """What the engine's answer said of itself, on the turn's span and its engine request's (``spans``):
    ``gen_ai.response.id``, ``gen_ai.response.model``, ``gen_ai.usage.cache_read.input_tokens``
    (each only when the answer said it)."""
    attributes: dict[str, Any] = {}
    if response_id is not None:
        attributes["gen_ai.response.id"] = response_id
    if response_model is not None:
        attributes["gen_ai.response.model"] = response_model
    if cached >= 0:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    for span in spans:
        if span is not None:
            span.set_attributes(attributes)


def start(turn: Turn, server: tuple[str, int] | None = None) -> Span:
    """Start ``turn``'s span (a child of its client's ``traceparent``, if it sent one, keeping its
    ``tracestate`` for what the turn sends on); ``server``: the dataplane's own address and port
    (``server.address``, ``server.port``)."""
    operation = "decide" if turn.single_pass else "chat"
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": tracing.PROVIDER,
        "gen_ai.request.model": turn.model,
        "luftpause.turn_id": turn.turn_id,
        "luftpause.service_class": "batch" if turn.service_class == pb.BATCH else "interactive",
        "luftpause.caller": turn.caller,
    }
    if turn.single_pass:
        attributes["luftpause.single_pass"] = True
    else:
        attributes["luftpause.run_id"] = turn.run_id
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    attributes.update(request_attributes(turn.body))
    return tracing.tracer().start_span(
        f"{operation} {turn.model}",
        context=tracing.parent(turn.traceparent, turn.tracestate),
        kind=SpanKind.SERVER,
        attributes=attributes,
    )


def ended(span: Span, kind: int, fields: dict[str, Any]) -> None:
    """Record a turn's end (``TurnEvent`` FINISHED or FAILED with its ``fields``) on its span."""
    if kind == pb.TurnEvent.FINISHED:
        reason = fields.get("finish_reason")
        reasons = [str(reason)] if reason else []
        # Usage only when the engine reported it: a missing count is left out, never recorded as 0.
        span.set_attributes(
            tracing.usage_attributes(fields.get("prompt_tokens"), fields.get("completion_tokens"), reasons)
        )
    else:
        error = str(fields.get("error", ""))
        span.set_attribute("error.type", "turn_failed")
        span.set_status(StatusCode.ERROR, error)


def refused(span: Span, status: int, message: str) -> None:
    """The turn was answered with an error of ours (``status``: the HTTP status sent)."""
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("error.type", str(status))
    span.set_status(StatusCode.ERROR, message)
