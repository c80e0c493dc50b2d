"""The dataplane's span per proxied turn (only while :data:`luftpause.tracing.active`).

One span from the turn's parsed request to the end of its relay, kind SERVER, child of the
client's ``traceparent``: ``chat {model}`` for ``POST /v1/chat/completions`` (GenAI semantic
conventions v1.41.0, inference: ``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``
(Required), ``gen_ai.request.model``, and when the engine reported them
``gen_ai.usage.input_tokens`` / ``output_tokens`` and ``gen_ai.response.finish_reasons``, through
:func:`luftpause.tracing.usage_attributes` as the runtime's ``chat`` span) and
``decide {model}`` for a single-pass turn (``POST /v1/decide``). luftpause's facts ride as
``luftpause.turn_id``, ``luftpause.run_id``, ``luftpause.service_class``, ``luftpause.caller``,
``luftpause.replica``. The span is the parent of what the turn sends on: the scheduler's ``admit``
span (``AdmitRequest.traceparent``) and the engine request (its ``traceparent`` header).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, StatusCode

from luftpause import tracing
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from luftpause.dataplane.relay import Turn


def start(turn: Turn) -> Span:
    """Start ``turn``'s span (a child of its client's ``traceparent``, if it sent one, keeping its
    ``tracestate`` for what the turn sends on)."""
    operation = "decide" if turn.single_pass else "chat"
    attributes: dict[str, str | bool] = {
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
