"""One turn through the dataplane: forward it to its replica, relay the answer, report it.

The thin loop around :mod:`luftpause.dataplane.relay.machine`: it sends the turn, moves the
engine's reads into the turn's :class:`~luftpause.dataplane.relay.machine.AnswerStream` and the
bytes it gives out to the client, and hands every fact it gives to one report function (the run
table, the metrics, the spans, the scheduler). What the answer is (whole, cut short, failed,
translated) the machine decides. The engine's response reaches the client unchanged (unless the
turn has a :class:`~luftpause.dataplane.turn.Translation` and its replica does not serve the turn's
API natively, :class:`~luftpause.dataplane.turn.Native`): a stream is relayed as each read returns,
everything one read brought in one send (no buffering beyond that, no re-framing, no re-encoding).
What the client sees in each failure case is the table in docs/architecture.md "Failure contract".

Crossings into granian are what a turn costs most (bench/README.md, "End to end"), so a stream that
the engine sent whole in one read (a short answer) goes out as one send that also ends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from luftpause.config import FailoverConfig, ReplicaConfig
from luftpause.dataplane.asgi import Exchange, Headers, StreamBroken
from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.observe.metrics import DataplaneMetrics
from luftpause.dataplane.relay import turn_spans
from luftpause.dataplane.relay.machine import (
    AnswerStream,
    Fact,
    Failed,
    Finished,
    FirstToken,
    Outcome,
    decoder_for,
    refusal_body,
    whole_answer,
)
from luftpause.dataplane.relay.upstream import EngineError, EngineExchange, EnginePool, Upstream
from luftpause.dataplane.runs import InFlight, RunTable
from luftpause.dataplane.turn import RUN_ID_HEADER, Admitted, Relayed, Turn, new_id, with_priority
from luftpause.observe import tracing
from luftpause.tool_calls import ToolCallTable
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["HOP_BY_HOP", "RUN_ID_HEADER", "FailOver", "Relay", "Turn", "new_id", "relayable_headers"]

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("luftpause.dataplane")

MAX_WHOLE_ANSWER_BYTES = 256 * 1024 * 1024
"""A whole (non-streamed) answer or refusal is read into memory up to this; past it, 502."""

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
"""Hop-by-hop headers (RFC 9110 §7.6.1, plus the non-standard ``proxy-connection``): never relayed
in either direction, nor any header that ``Connection`` names."""

# Besides the hop-by-hop ones: what granian recomputes and what describes the engine rather than
# the answer. content-encoding is dropped only with a body the relay decoded (see decoder_for).
_NOT_RELAYED = HOP_BY_HOP | {b"proxy-authenticate", b"content-length", b"date", b"server"}
_DECODED = frozenset({b"content-encoding"})
# Set by the relay on every stream, so the engine's own values must not duplicate them.
_STREAM_HEADERS = frozenset({b"cache-control", b"x-accel-buffering"})
_STREAM_HEAD: Headers = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_RUN_ID = RUN_ID_HEADER.encode()
_EVENT_STREAM = b"text/event-stream"


def relayable_headers(headers: Headers, drop: frozenset[bytes] = frozenset()) -> Headers:
    """The end-to-end headers of an engine's response (lower-case names), in order.

    Drops the hop-by-hop headers, every header a ``Connection`` header names (RFC 9110 §7.6.1),
    the headers in ``_NOT_RELAYED`` and those in ``drop`` (lower-case names).
    """
    named = {
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return [
        (name, value)
        for name, value in headers
        if name not in _NOT_RELAYED and name not in drop and (not named or name not in named)
    ]


def _header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _fixed_headers(replica: ReplicaConfig) -> list[tuple[str, str]]:
    """What every request to ``replica`` carries: its API key (never the client's), and asks for
    the body as it is (``identity``). :class:`EngineError` for a key with a line break in it."""
    headers = [("content-type", "application/json"), ("accept-encoding", "identity")]
    key = replica.api_key()
    if key:
        if "\r" in key or "\n" in key:
            raise EngineError(f"the API key in ${replica.api_key_env} has a line break")
        headers.append(("authorization", f"Bearer {key}"))
    return headers


class FailOver(EngineUnreachable):
    """Raised by :meth:`Relay.forward` instead of answering: the turn's replica failed before its
    answer began, nothing was sent to the client, the turn was reported failed, and it may go to
    another replica (``Admitted.failovers_left`` > 0; docs/failover.md). ``unreachable``: the engine
    never had it (not a refusal it answered). Left unhandled it is the 502 it would have been."""

    def __init__(self, message: str, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class _Send:
    """One send of an admitted turn: the loop's own bookkeeping while it lasts, never shared (the
    turn's first two stages stay as they were made); made into a
    :class:`~luftpause.dataplane.turn.Relayed` when it is over. ``translation``: the turn's, or
    ``None`` once its replica serves its API natively (``native``)."""

    __slots__ = (
        "admitted",
        "engine_span",
        "first_token_at",
        "native",
        "outcome",
        "replica",
        "span",
        "translation",
        "turn",
    )

    def __init__(self, admitted: Admitted, span: Span | None) -> None:
        self.admitted = admitted
        self.turn = admitted.turn
        self.replica = admitted.replica.name
        self.span = span
        self.engine_span: Span | None = None
        self.first_token_at: float | None = None
        self.native = False
        self.translation = admitted.turn.translation
        self.outcome: Outcome | None = None


class Relay:
    """Forwards admitted turns to replicas (one :class:`~luftpause.dataplane.relay.upstream.EnginePool`
    each) and reports them.

    Every turn given to :meth:`forward` is reported ended exactly once (finished or failed; a turn
    given up before it reached an engine is the placement's to report). The tool-call ids a
    finished turn emitted (streamed or not) are remembered in ``tool_calls`` under its run.

    Events reported per turn: none at the start (the placement answer is the start, see the proto)
    and none at the first token (its time rides on the end event as ``first_token_ago_s``, for a
    streamed answer only), so a turn that ends costs one event.
    """

    def __init__(
        self,
        upstream: Upstream,
        link: SchedulerLink,
        runs: RunTable,
        metrics: DataplaneMetrics,
        tool_calls: ToolCallTable,
        failover: FailoverConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failover = failover or FailoverConfig()
        """When a turn whose replica failed before answering goes to another (:class:`FailOver`)."""
        self.upstream = upstream
        self.link = link
        self.runs = runs
        self.metrics = metrics
        self.tool_calls = tool_calls
        # Single-pass turns sent to an engine and not ended: they never enter the run table.
        self.single_pass_in_flight: set[str] = set()
        self._clock = clock
        """Seconds, monotonic: the same clock as the run table's other writers (the intake's)."""

    def in_flight(self) -> int:
        """Turns sent to an engine that have not ended yet (generative and single-pass)."""
        return len(self.runs.inflight) + len(self.single_pass_in_flight)

    def _end(self, send: _Send, tool_calls: bool, tool_call_ids: tuple[str, ...] = ()) -> bool:
        """Mark the turn ended (paused on the tool calls ``tool_call_ids``, when ``tool_calls``);
        False if it had already ended, so it is reported once."""
        turn = send.turn
        if turn.single_pass:
            if turn.turn_id not in self.single_pass_in_flight:
                return False
            self.single_pass_in_flight.discard(turn.turn_id)
            return True
        return self.runs.ended(turn.turn_id, tool_calls, self._clock(), tool_call_ids)

    def _ended_event(self, send: _Send, kind: int, **fields: Any) -> None:
        """FINISHED or FAILED, carrying how long ago the first token came when one did."""
        turn = send.turn
        if send.first_token_at is not None:
            fields["first_token_ago_s"] = max(self._clock() - send.first_token_at, 0.0)
        if send.span is not None:
            turn_spans.ended(send.span, kind, fields)
        if send.engine_span is not None:
            turn_spans.ended(send.engine_span, kind, fields)
            send.engine_span.end()
            send.engine_span = None
        if turn.traceparent:
            fields["trace_id"] = tracing.trace_id_of(turn.traceparent)
        event = pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, kind=kind, **fields)  # type: ignore[arg-type]
        self.link.report(event, send.replica)

    def _failed(self, send: _Send, error: str, unreachable: bool = False) -> None:
        """The turn ended without a completion: free its slot, leave the run idle (once per turn).
        ``unreachable``: its engine was never reached, so the scheduler takes the replica out of
        rotation at once (``TurnEvent.unreachable``)."""
        if self._end(send, False):
            send.outcome = Failed(error)
            if unreachable:
                self._ended_event(send, pb.TurnEvent.FAILED, error=error[:500], unreachable=True)
            else:
                self._ended_event(send, pb.TurnEvent.FAILED, error=error[:500])
            self.metrics.turn_ended("failed", send.turn.service_class, send.replica)

    def _first_token(self, send: _Send) -> None:
        # Not reported now: the scheduler only records it, so it rides on the end event.
        now = send.first_token_at = self._clock()
        self.metrics.first_token(send.turn.service_class, now - send.turn.arrived, send.replica)

    def _finished(self, send: _Send, facts: Finished) -> None:
        """Report the turn finished (once), with the facts of its answer."""
        turn = send.turn
        ids = facts.tool_call_ids if turn.run_id else ()
        if not self._end(send, facts.tool_calls, ids):
            return
        send.outcome = facts
        now = self._clock()
        prompt, completion = facts.prompt_tokens, facts.completion_tokens
        self.metrics.answers.finished(
            turn.model, send.replica, turn.service_class, turn.caller, turn.arrived,
            send.first_token_at, now, prompt, completion, facts.cached_tokens,
        )  # fmt: skip
        if send.span is not None:
            spans = (send.span, send.engine_span)
            turn_spans.answered(spans, facts.cached_tokens, facts.response_id, facts.response_model)
        # A count the engine did not report (-1) is left out: 0 on the wire (proto3's default),
        # absent on the turn's span (never recorded as 0 tokens).
        usage: dict[str, Any] = {
            k: v for k, v in (("prompt_tokens", prompt), ("completion_tokens", completion)) if v >= 0
        }
        if ids:
            # The run's next turn may come back without its header but with these ids, to this
            # worker or another: the scheduler is told them too (TurnEvent.tool_call_ids).
            self.tool_calls.remember(turn.run_id, ids, now)
            usage["tool_call_ids"] = ids
        finish_reason, tool_calls = facts.finish_reason, facts.tool_calls
        self._ended_event(
            send, pb.TurnEvent.FINISHED, finish_reason=finish_reason, tool_calls=tool_calls, **usage
        )
        self.metrics.turn_ended("finished", turn.service_class, send.replica)

    def pool_of(self, replica: ReplicaConfig) -> EnginePool:
        """``replica``'s connection pool, for a request that is not a turn (count_tokens)."""
        return self._pool(replica)

    def _pool(self, replica: ReplicaConfig) -> EnginePool:
        # As many idle connections as turns the replica runs at once: more are never busy at once.
        return self.upstream.pool(
            replica.name, replica.url, lambda: _fixed_headers(replica), replica.max_inflight
        )

    async def forward(self, admitted: Admitted, exchange: Exchange, span: Span | None = None) -> Relayed:
        """Send the admitted turn to its replica and relay the answer to the client of
        ``exchange``; what the relay saw (:class:`~luftpause.dataplane.turn.Relayed`) once the
        answer was relayed whole or ended failed but cleanly (an engine's refusal, an error event).
        ``span``: the turn's own span while tracing is active (the engine request's hangs below it).

        The turn's ``body`` goes to ``turn.path`` unchanged, except that a chat turn to a replica
        with ``priority`` set carries its class as the engine's ``priority`` field
        (:func:`~luftpause.dataplane.turn.with_priority`) unless the client set one. Raises
        :class:`EngineUnreachable` (nothing sent to the client yet) when the engine cannot be
        connected to or breaks off before its answer has begun (:class:`FailOver` when the turn
        may go to another replica), and :class:`~luftpause.dataplane.asgi.StreamBroken`
        when the engine fails after the answer began (the client's connection is then aborted,
        never ended cleanly). Cancellation (the client left) closes the engine request at once.
        """
        turn, replica = admitted.turn, admitted.replica
        send = _Send(admitted, span)
        if turn.single_pass:
            self.single_pass_in_flight.add(turn.turn_id)
        else:
            self.runs.placed(
                InFlight(
                    turn.turn_id, turn.run_id, replica.name, turn.model, turn.service_class, turn.caller
                ),
                self._clock(),
            )
        # No STARTED: the scheduler took its placement answer as the start.
        traceparent, tracestate = turn.traceparent, turn.tracestate
        if span is not None:
            span.set_attribute("luftpause.replica", replica.name)
            # The engine request's own span (a client span under the turn's): its context is
            # what the engine is sent, so the engine's spans hang below it.
            send.engine_span = turn_spans.engine_start(turn, replica.name, replica.url, span)
            sent_on = tracing.headers_of(send.engine_span)
            traceparent = sent_on.get(tracing.TRACEPARENT, traceparent)
            tracestate = sent_on.get(tracing.TRACESTATE, tracestate)
        extra = b""
        if traceparent:
            extra = b"traceparent: %s\r\n" % traceparent.encode()
            if tracestate:  # W3C Trace Context: tracestate travels only with its traceparent
                extra += b"tracestate: %s\r\n" % tracestate.encode()
        path, body = turn.path, turn.body
        native = turn.native
        if native is not None and native.api in replica.apis:
            # The replica speaks the client's API: its bytes go there, its answer comes back, as is.
            send.native, send.translation = True, None
            path, body = native.path, native.body
        elif replica.priority is not None and not turn.single_pass and not turn.client_priority:
            # Local to this send: turn.body stays the client's bytes.
            body = with_priority(body, replica.priority, turn.service_class)
        upstream: EngineExchange | None = None
        try:
            try:
                if native is not None and not send.native and send.translation is None:
                    # Planned native only (front_doors), yet the scheduler's replica lacks the API:
                    # its configuration and this dataplane's disagree.
                    raise EngineError(
                        f"it does not serve the {native.api} API, and the turn was not translated"
                    )
                upstream = await self._pool(replica).send(path, extra, body)
                status = upstream.status
                headers = upstream.headers
                content_type = _header(headers, b"content-type") or b""
                streamed = status == 200 and content_type.partition(b";")[0].strip().lower() == _EVENT_STREAM
                decoder = decoder_for(_header(headers, b"content-encoding"))
                drop = _STREAM_HEADERS if streamed else frozenset()
                out = relayable_headers(headers, drop | _DECODED if decoder else drop)
                if not turn.single_pass:  # a single-pass turn belongs to no run
                    out.append((_RUN_ID, turn.run_id.encode()))
                if status != 200:
                    await self._relay_refusal(send, upstream, out, exchange, decoder)
                elif streamed:
                    await self._relay_stream(send, upstream, out, exchange, decoder)
                else:
                    await self._relay_whole(send, upstream, out, exchange, decoder)
            except (EngineError, zlib.error) as exc:
                # Errors after a stream began are handled in _relay_stream, so nothing was answered
                # yet: the client gets a 502 naming the replica, unless the engine never had the
                # turn and it may go to another replica (docs/failover.md).
                message = f"engine {replica.name}: {str(exc) or type(exc).__name__}"
                undelivered = isinstance(exc, EngineError) and exc.undelivered
                self._failed(send, message, unreachable=undelivered)
                if undelivered and admitted.failovers_left > 0 and self.failover.undelivered:
                    raise FailOver(message, unreachable=True) from None
                raise EngineUnreachable(message) from None
        except asyncio.CancelledError:
            self._failed(send, "client disconnected")
            raise
        finally:
            if upstream is not None:
                if upstream.complete or upstream.answered:
                    upstream.release()  # back to the pool once its body has ended (a short grace)
                else:
                    upstream.abort()  # given up mid-answer: the engine sees its request closed
            self._failed(send, "the relay ended without an outcome")  # a no-op once the turn ended
            if send.engine_span is not None:  # a turn reported ended already: never left open
                send.engine_span.end()
                send.engine_span = None
        assert send.outcome is not None
        return Relayed(replica.name, send.native, send.first_token_at, send.outcome)

    async def _relay_refusal(
        self, send: _Send, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        # 429 / 5xx: status, body and Retry-After reach the client unchanged (or, for a status
        # [dataplane.failover] retry_statuses names, the turn goes to another replica instead).
        raw = await upstream.read_all(MAX_WHOLE_ANSWER_BYTES)
        body = refusal_body(raw, upstream.status, decoder, send.translation)
        self._failed(send, f"engine answered {upstream.status}")
        if upstream.status in self.failover.retry_statuses and send.admitted.failovers_left > 0:
            raise FailOver(f"engine {send.replica} answered {upstream.status}", unreachable=False)
        await exchange.respond(upstream.status, headers, body)
        self.metrics.relayed(len(body))

    async def _relay_stream(
        self, send: _Send, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        """Relay an SSE stream as it comes, through the turn's :class:`AnswerStream` (its rules
        say when the answer is whole, cut short or failed): this loop only moves the engine's
        reads in, the machine's bytes out, and reports its facts.

        The client's response ends with the answer's last event, even when the engine's body has
        not ended yet (its connection waits for that end on its own, see
        :meth:`~luftpause.dataplane.relay.upstream.EngineExchange.release`). A client that leaves before
        the outcome fails the turn and the engine's request is closed at once."""
        turn = send.turn
        native = turn.native.scanner if send.native and turn.native is not None else None
        translation = send.translation.stream() if send.translation is not None else None
        machine = AnswerStream(turn.choices, decoder, translation, native)
        report = self._reporter(send)
        headers.extend(_STREAM_HEAD)
        await exchange.start(200, headers)
        send_body = exchange.send
        relayed = 0  # summed here, added to the counter once per turn
        try:
            while True:
                try:
                    data = upstream.take()
                    if not data and not upstream.complete:
                        data = await upstream.read()
                    machine.receive(data, upstream.complete)
                    if machine.finishing and not upstream.complete:
                        # One turn of the loop lets the body's end be read, so the last events
                        # and the end go out in one send (a send costs ~0.04 ms of CPU, a turn of
                        # the loop a few us).
                        await asyncio.sleep(0)
                        if upstream.error is None:
                            machine.receive(upstream.take(), upstream.complete)
                except EngineError as exc:
                    machine.engine_failed(str(exc))
                if machine.answered:
                    upstream.answered = True  # its body's end may still be on its way
                # Facts before the bytes: the outcome is reported before the last send, so the
                # client leaving once it has read the last event changes nothing.
                for fact in machine.facts():
                    report(fact)
                out = machine.data_to_send()
                outcome = machine.outcome
                if outcome is None or (isinstance(outcome, Failed) and outcome.broken):
                    if out:
                        # Waits while the client is not reading (granian's send is bounded), and
                        # the engine connection stops reading meanwhile: memory stays bounded.
                        await send_body({"type": "http.response.body", "body": out, "more_body": True})
                        relayed += len(out)
                    if outcome is None:
                        continue
                    # The client has had 200 and the chunks so far; its connection is aborted (no
                    # final chunk, no [DONE]), so it sees the stream broken rather than ended.
                    raise StreamBroken(outcome.error)
                # The last of the answer and its end in one send.
                await send_body({"type": "http.response.body", "body": out, "more_body": False})
                relayed += len(out)
                break
        except asyncio.CancelledError:
            machine.client_left()
            for fact in machine.facts():
                report(fact)
            raise
        finally:
            self.metrics.relayed(relayed)
            scanner = machine.scanner
            if scanner.oversized_events:
                log.warning(
                    "turn %s: %d SSE events over %d bytes were relayed unread",
                    turn.turn_id,
                    scanner.oversized_events,
                    scanner.max_event_bytes,
                )

    def _reporter(self, send: _Send) -> Callable[[Fact], None]:
        """The one report function of a send: each fact the machine gives, as it came."""

        def report(fact: Fact) -> None:
            if isinstance(fact, FirstToken):
                self._first_token(send)
            elif isinstance(fact, Finished):
                self._finished(send, fact)
            else:
                self._failed(send, fact.error)

        return report

    async def _relay_whole(
        self, send: _Send, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        raw = await upstream.read_all(MAX_WHOLE_ANSWER_BYTES)  # a read error here becomes a 502
        turn = send.turn
        native = turn.native.whole if send.native and turn.native is not None else None
        answer = whole_answer(raw, decoder, send.translation, native, turn.single_pass)
        if answer.timed:
            self.metrics.first_token(turn.service_class, self._clock() - turn.arrived, send.replica)
        # Reported before the answer goes out: the client, once it has it, may close before the
        # send returns, and the turn finished all the same.
        self._finished(send, answer.outcome)
        await exchange.respond(200, headers, answer.body)
        self.metrics.relayed(len(answer.body))
