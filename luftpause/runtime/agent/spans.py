"""The runtime's spans: ``invoke_agent`` per run, ``turn`` per model turn, ``execute_tool`` per tool
call, and ``await`` / ``read`` per MCP call that waits on or reads runs.

Only while :data:`luftpause.observe.tracing.active`; otherwise every helper here returns at its first line.
Names and attributes follow the GenAI semantic conventions v1.41.0 (see :mod:`luftpause.observe.tracing`):

* ``invoke_agent {agent}`` (INTERNAL): one per drive of a run. A run re-opened by ``send`` gets
  another, parented to the ``send`` request as a spawned run is to its ``spawn`` (:func:`reopened`;
  a send made by another run: that run's ``execute_tool`` span, current where the drive starts), and
  linked to the run's previous ``invoke_agent`` span (a span link, ``luftpause.link``
  ``previous_drive``: the earlier drive is usually another trace). ``{agent}`` is the run's pod name,
  else ``sub-agent``. ``gen_ai.agent.id`` and
  ``gen_ai.conversation.id`` are the run's handle, ``gen_ai.request.model`` its model; at its end
  ``luftpause.state``, the run's token counts and, for a failed run, status ERROR with its error.
  Its parent: the parent run's ``invoke_agent`` span while that is open; else the trace context of
  the MCP request that spawned the run (its ``_meta.traceparent``, through the SDK's own
  ``tools/call spawn`` span, else its HTTP ``traceparent`` header); else a new trace.
* ``turn {model}`` (CLIENT), child of ``invoke_agent``: one per model turn, retries included (a 429
  waited out is inside it). It is *not* typed as an inference: the inference is the dataplane's
  ``chat {model}`` span, its child, which carries the GenAI attributes and the usage the engine
  reported. LLM-observability backends type a span as an LLM call by ``gen_ai.operation.name``
  ``chat`` or by ``gen_ai.request.model`` (Arize Phoenix does both), so a second span with them
  counted every turn twice; this one has only luftpause's attributes: ``luftpause.run_id``,
  ``luftpause.model``, ``luftpause.max_tokens`` (when set) and, from the reply,
  ``luftpause.finish_reasons``, ``luftpause.prompt_tokens`` and ``luftpause.completion_tokens``
  (when reported). Its ``traceparent`` and ``tracestate`` go to the dataplane.
* ``execute_tool {tool}`` (INTERNAL), child of ``invoke_agent``: one per tool call, with
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` and ``gen_ai.tool.type`` ``extension`` (the
  conventions' "tool executed on the agent-side to directly call external APIs": the runtime, not a
  client, runs every tool, MCP or built-in); a failed call sets status ERROR (``error.type``
  ``tool_error``). An upstream MCP call made inside it: the ``mcp`` SDK starts its own client span
  ``MCP send tools/call`` (a child of ``execute_tool``, once :func:`luftpause.observe.tracing.setup` made
  the SDK's provider the global one) and writes *that* span into ``_meta.traceparent``, replacing
  the one :func:`current_meta` passed; over HTTP the same value becomes the ``traceparent`` header
  (:mod:`luftpause.runtime.agent.upstream`). So the tool server's span is a grandchild of
  ``execute_tool``, in the run's trace. With only an in-process provider (tests, :func:`luftpause.
  tracing.install`) the SDK's span is a no-op and the tool server sees ``execute_tool`` itself.
* ``await`` and ``read`` (INTERNAL): one per MCP ``await`` or ``read`` call, in the trace of its
  request (found as a spawn's, :func:`_request_context`), with ``luftpause.run_ids``; a span link
  to each run it touches (``luftpause.link`` ``awaits`` or ``reads``, ``luftpause.run_id``), to that
  run's ``invoke_agent`` span: the open one while the run is driven, else its last ended one (see
  :data:`PREVIOUS_KEPT`), else the trace context its first drive will start in. A run the runtime
  has no span of (finished before a restart, or past :data:`PREVIOUS_KEPT`) gets no link, as the
  journal keeps no trace context. So a wait and the runs it waited on, usually separate traces,
  are one click apart in a trace viewer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, cast

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, StatusCode

from luftpause.observe import tracing

if TYPE_CHECKING:
    from mcp_types import RequestParamsMeta
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext

    from luftpause.runtime.runs.record import Run

PROVIDER = tracing.PROVIDER
"""``gen_ai.provider.name`` of the ``invoke_agent`` spans: the turns go to luftpause's dataplane."""

_parents: dict[str, Context] = {}
"""Run handle -> the trace context its next ``invoke_agent`` starts in (from its spawn)."""
_open: dict[str, Span] = {}
"""Run handle -> its ``invoke_agent`` span while the run is driven (children start under it)."""
_previous: OrderedDict[str, SpanContext] = OrderedDict()
"""Run handle -> its last ``invoke_agent`` span's context, which a re-opened drive links to; the
:data:`PREVIOUS_KEPT` most recently ended only (a run re-opened after more have ended, or after a
restart, gets no link)."""
PREVIOUS_KEPT = 10_000
"""Ended drives whose span a re-opened run can still link to (about 100 bytes each)."""


def _meta_traceparent(ctx: Any) -> str | None:
    """``params._meta.traceparent`` of the MCP request behind ``ctx`` (an SDK ``Context``), if any."""
    try:
        meta = ctx.request_context.meta
    except (AttributeError, ValueError):
        return None
    if isinstance(meta, Mapping):
        value = meta.get(tracing.TRACEPARENT)
    else:
        value = getattr(meta, tracing.TRACEPARENT, None)
        if value is None:
            value = (getattr(meta, "model_extra", None) or {}).get(tracing.TRACEPARENT)
    return value if isinstance(value, str) else None


def spawned(run: Run, ctx: Any | None) -> None:
    """Remember where ``run``'s ``invoke_agent`` span belongs; call it when the run is started.

    ``ctx`` is the MCP request's SDK ``Context`` (None for a run spawned by another run).
    """
    if not tracing.active:
        return
    if run.parent is not None and run.parent in _open:
        _parents[run.handle] = trace.set_span_in_context(_open[run.parent])
        return
    if ctx is None:
        return
    context = _request_context(ctx)
    if context is not None:
        _parents[run.handle] = context


def reopened(handle: str, ctx: Any) -> None:
    """The run ``handle`` was re-opened by the MCP ``send`` request behind ``ctx`` (an SDK
    ``Context``): its next ``invoke_agent`` span is a child of that request's trace context, as a
    spawned run's is of its ``spawn`` (:func:`spawned`). Call it before the drive's task first runs."""
    if not tracing.active:
        return
    context = _request_context(ctx)
    if context is not None:
        _parents[handle] = context


def _request_context(ctx: Any) -> Context | None:
    """The trace context an MCP request (``ctx``, an SDK ``Context``) names: its ``_meta.traceparent``
    through the SDK's own server span of it, else its HTTP ``traceparent`` (with ``tracestate``)
    header, else the current span; None when there is none."""
    meta_traceparent = _meta_traceparent(ctx)
    current = trace.get_current_span()
    if meta_traceparent and current.get_span_context().is_valid:
        # The SDK's server span of this tools/call, itself the child of _meta.traceparent.
        return trace.set_span_in_context(current)
    try:
        headers = ctx.headers
    except (AttributeError, ValueError):
        headers = None
    header = headers.get(tracing.TRACEPARENT) if headers is not None else None
    if meta_traceparent:
        return tracing.parent(meta_traceparent)
    if header:
        assert headers is not None
        return tracing.parent(header, headers.get(tracing.TRACESTATE))
    if current.get_span_context().is_valid:
        return trace.set_span_in_context(current)
    return None


@contextmanager
def invoke_agent(run: Run) -> Iterator[None]:
    """``run``'s ``invoke_agent`` span around one drive of it, current inside (so its turns and
    tool calls are its children); records the run's outcome as it ends."""
    if not tracing.active:
        yield
        return
    agent = run.name or "sub-agent"
    attributes: dict[str, str | bool] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.agent.id": run.handle,
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": run.handle,
        "gen_ai.request.model": run.spec.model,
        "luftpause.caller": run.caller,
        "luftpause.service_class": run.spec.service_class,
    }
    if run.parent is not None:
        attributes["luftpause.parent_run"] = run.parent
    if run.resumed:
        attributes["luftpause.resumed"] = True
    parent = _parents.pop(run.handle, None)
    if parent is None and run.parent is not None and run.parent in _open:
        parent = trace.set_span_in_context(_open[run.parent])
    previous = _previous.pop(run.handle, None)
    links = [Link(previous, {"luftpause.link": "previous_drive"})] if previous is not None else None
    span = tracing.tracer().start_span(
        f"invoke_agent {agent}", context=parent, kind=SpanKind.INTERNAL, attributes=attributes, links=links
    )
    _open[run.handle] = span
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=True, set_status_on_exception=False):
            yield
    finally:
        if _open.get(run.handle) is span:
            del _open[run.handle]
        span.set_attribute("luftpause.state", run.state)
        span.set_attribute("luftpause.turns", run.costs.turns)
        span.set_attribute("luftpause.tool_calls", run.costs.tool_calls)
        span.set_attribute("gen_ai.usage.input_tokens", run.costs.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", run.costs.completion_tokens)
        if run.state == "failed":
            span.set_status(StatusCode.ERROR, run.error or "failed")
        span.end()
        _previous[run.handle] = span.get_span_context()
        while len(_previous) > PREVIOUS_KEPT:
            _previous.popitem(last=False)


@contextmanager
def turn(run: Run) -> Iterator[Span | None]:
    """A ``turn`` span around one model turn of ``run`` (current inside: the dataplane request
    carries it, :func:`traceparent_headers`); None when tracing is off. Record the reply with
    :func:`turn_reply`."""
    if not tracing.active:
        yield None
        return
    attributes: dict[str, str | int] = {"luftpause.run_id": run.handle, "luftpause.model": run.spec.model}
    if run.spec.max_tokens > 0:
        attributes["luftpause.max_tokens"] = run.spec.max_tokens
    with tracing.tracer().start_as_current_span(
        f"turn {run.spec.model}", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def turn_reply(span: Span | None, reply: dict[str, Any]) -> None:
    """Record an OpenAI ``chat.completion`` reply's finish reasons and token counts (each only when
    reported) on ``span``, as ``luftpause.*`` attributes."""
    if span is None:
        return
    usage = reply.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    reasons = [
        str(choice["finish_reason"])
        for choice in reply.get("choices") or ()
        if isinstance(choice, dict) and choice.get("finish_reason")
    ]
    if reasons:
        span.set_attribute("luftpause.finish_reasons", reasons)
    for key, attribute in (
        ("prompt_tokens", "luftpause.prompt_tokens"),
        ("completion_tokens", "luftpause.completion_tokens"),
    ):
        if type(usage.get(key)) is int:
            span.set_attribute(attribute, usage[key])


def traceparent_headers() -> dict[str, str]:
    """The W3C headers naming the current span (the run's ``turn`` span) as parent; empty when
    tracing is off."""
    if not tracing.active:
        return {}
    return tracing.headers_of(trace.get_current_span())


@contextmanager
def execute_tool(call: Any) -> Iterator[Span | None]:
    """An ``execute_tool`` span around one tool call (``call``: the model's OpenAI tool call);
    current inside, so an upstream MCP call made in it carries it. Record the outcome with
    :func:`tool_outcome`."""
    if not tracing.active:
        yield None
        return
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    tool = name if isinstance(name, str) and name else "unknown"
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "extension",
    }
    call_id = call.get("id") if isinstance(call, dict) else None
    if isinstance(call_id, str) and call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    with tracing.tracer().start_as_current_span(
        f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


def tool_outcome(span: Span | None, failed: bool, text: str) -> None:
    """A failed tool call (``text`` begins ``Error``) sets ``span``'s status to ERROR."""
    if span is not None and failed:
        span.set_attribute("error.type", "tool_error")
        span.set_status(StatusCode.ERROR, text[:200])


def current_meta() -> RequestParamsMeta | None:
    """``_meta`` for an MCP request made in the current span: its ``traceparent`` (and
    ``tracestate``); None when tracing is off or no span is current."""
    if not tracing.active:
        return None
    headers = tracing.headers_of(trace.get_current_span())
    return cast("RequestParamsMeta", dict(headers)) if headers else None


def _run_context(handle: str) -> SpanContext | None:
    """The span context a link to run ``handle`` points at: its open ``invoke_agent`` span, else
    its last ended one, else the span its next drive starts under; None when none is known."""
    span = _open.get(handle)
    if span is not None:
        return span.get_span_context()
    previous = _previous.get(handle)
    if previous is not None:
        return previous
    pending = _parents.get(handle)
    if pending is not None:
        context = trace.get_current_span(pending).get_span_context()
        return context if context.is_valid else None
    return None


@contextmanager
def touching(operation: Literal["await", "read"], handles: Sequence[str], ctx: Any) -> Iterator[None]:
    """An ``await`` or ``read`` span around one MCP call (``ctx``: its SDK ``Context``) that touches
    the runs ``handles``, linked to each of them (module docstring)."""
    if not tracing.active:
        yield
        return
    kind = "awaits" if operation == "await" else "reads"
    links = []
    for handle in dict.fromkeys(handles):
        context = _run_context(handle)
        if context is not None:
            links.append(Link(context, {"luftpause.link": kind, "luftpause.run_id": handle}))
    span = tracing.tracer().start_span(
        operation,
        context=_request_context(ctx),
        kind=SpanKind.INTERNAL,
        attributes={"luftpause.run_ids": list(dict.fromkeys(handles))},
        links=links,
    )
    with trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
        yield
