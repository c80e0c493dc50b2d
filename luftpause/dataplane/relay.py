"""One turn through the dataplane: forward it to its replica, relay the answer, report it.

The engine's response reaches the client unchanged (unless the turn has a
:class:`~luftpause.dataplane.turn.Translation` and its replica does not serve the turn's API
natively, :class:`~luftpause.dataplane.turn.Native`): a stream is relayed as each read returns,
everything one read brought in one send (no buffering beyond that, no re-framing, no re-encoding),
while :class:`~luftpause.dataplane.sse.SSEScanner` reads the engine's bytes on the side for
first-token time, usage, finish reason and tool calls. What the client sees in each failure case is
the table in docs/architecture.md "Failure contract".

Crossings into granian are what a turn costs most (bench/README.md, "End to end"), so a stream that
the engine sent whole in one read (a short answer) goes out as one send that also ends it.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

import orjson

from luftpause.config import FailoverConfig, ReplicaConfig
from luftpause.dataplane import turn_spans
from luftpause.dataplane.admission import SchedulerLink
from luftpause.dataplane.asgi import Exchange, Headers, StreamBroken
from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.metrics import DataplaneMetrics
from luftpause.dataplane.runs import InFlight, RunTable
from luftpause.dataplane.sse import SSEScanner
from luftpause.dataplane.tool_calls import ToolCallTable, completion_tool_call_ids
from luftpause.dataplane.turn import RUN_ID_HEADER, StreamTranslation, Turn, new_id, with_priority
from luftpause.dataplane.upstream import EngineError, EngineExchange, EnginePool, Upstream
from luftpause.observe import tracing
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["HOP_BY_HOP", "RUN_ID_HEADER", "FailOver", "Relay", "Turn", "new_id", "relayable_headers"]

log = logging.getLogger("luftpause.dataplane")

MAX_WHOLE_ANSWER_BYTES = 256 * 1024 * 1024
"""A whole (non-streamed) answer or refusal is read into memory up to this; past it, 502."""

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
"""Hop-by-hop headers (RFC 9110 §7.6.1, plus the non-standard ``proxy-connection``): never relayed
in either direction, nor any header that ``Connection`` names."""

# Besides the hop-by-hop ones: what granian recomputes and what describes the engine rather than
# the answer. content-encoding is dropped only with a body the relay decoded (see _decoder).
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


def _decoder(encoding: bytes | None) -> Any:
    """A streaming decoder (``decompress(bytes) -> bytes``) for a ``Content-Encoding`` the relay
    decodes, ``None`` for none (absent or ``identity``), ``False`` for one it passes through.

    Decoded: ``gzip`` / ``x-gzip`` and ``deflate`` (zlib, which always exists; zlib or gzip
    framing). Anything else (``br``, ``zstd``, ``compress``, ``x-foo``, a list of codings) passes
    to the client untouched *with* its header, never half of each. The engine was asked for
    ``identity``, so either is an engine ignoring ``Accept-Encoding``.
    """
    if encoding is None:
        return None
    coding = encoding.strip().lower()
    if coding in (b"", b"identity"):
        return None
    if coding in (b"gzip", b"x-gzip", b"deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: gzip or zlib header, detected
    return False


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
    another replica (``turn.failovers_left`` > 0; docs/failover.md). ``unreachable``: the engine
    never had it (not a refusal it answered). Left unhandled it is the 502 it would have been."""

    def __init__(self, message: str, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class Relay:
    """Forwards admitted turns to replicas (one :class:`~luftpause.dataplane.upstream.EnginePool`
    each) and reports them.

    Every turn given to :meth:`forward` is reported ended exactly once (finished or failed); a turn
    given up before it reached an engine is reported with :meth:`abandoned`. The tool-call ids a
    finished turn emitted (streamed or not) are remembered in ``tool_calls`` under its run.

    Events reported per turn: none at the start (the placement answer is the start, see the proto)
    and none at the first token (its time rides on the end event as ``first_token_ago_s``, for a
    streamed answer only), so a turn that ends costs one event. Build it inside the running loop.
    """

    def __init__(
        self,
        upstream: Upstream,
        link: SchedulerLink,
        runs: RunTable,
        metrics: DataplaneMetrics,
        tool_calls: ToolCallTable,
        failover: FailoverConfig | None = None,
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
        self._loop = asyncio.get_running_loop()  # once: each call costs a getpid() in CPython 3.11

    def in_flight(self) -> int:
        """Turns sent to an engine that have not ended yet (generative and single-pass)."""
        return len(self.runs.inflight) + len(self.single_pass_in_flight)

    def _end(self, turn: Turn, tool_calls: bool, tool_call_ids: tuple[str, ...] = ()) -> bool:
        """Mark ``turn`` ended (paused on the tool calls ``tool_call_ids``, when ``tool_calls``);
        False if it had already ended, so it is reported once."""
        if turn.single_pass:
            if turn.turn_id not in self.single_pass_in_flight:
                return False
            self.single_pass_in_flight.discard(turn.turn_id)
            return True
        return self.runs.ended(turn.turn_id, tool_calls, self._loop.time(), tool_call_ids)

    def _event(self, turn: Turn, kind: int, **fields: Any) -> None:
        if turn.traceparent:
            fields["trace_id"] = tracing.trace_id_of(turn.traceparent)
        event = pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, kind=kind, **fields)  # type: ignore[arg-type]
        self.link.report(event, turn.replica)

    def _ended_event(self, turn: Turn, kind: int, **fields: Any) -> None:
        """FINISHED or FAILED, carrying how long ago the first token came when one did."""
        if turn.first_token_at is not None:
            fields["first_token_ago_s"] = max(self._loop.time() - turn.first_token_at, 0.0)
        if turn.span is not None:
            turn_spans.ended(turn.span, kind, fields)
        if turn.engine_span is not None:
            turn_spans.ended(turn.engine_span, kind, fields)
            turn.engine_span.end()
            turn.engine_span = None
        self._event(turn, kind, **fields)

    def failed(self, turn: Turn, error: str, unreachable: bool = False) -> None:
        """The turn ended without a completion: free its slot, leave the run idle (once per turn).
        ``unreachable``: its engine was never reached, so the scheduler takes the replica out of
        rotation at once (``TurnEvent.unreachable``)."""
        if self._end(turn, False):
            if unreachable:
                self._ended_event(turn, pb.TurnEvent.FAILED, error=error[:500], unreachable=True)
            else:
                self._ended_event(turn, pb.TurnEvent.FAILED, error=error[:500])
            self.metrics.turn_ended("failed", turn.service_class, turn.replica)

    def abandoned(self, turn: Turn) -> None:
        """The turn was given up before any engine saw it: the scheduler undoes what it did with it."""
        if turn.span is not None:
            turn.span.set_attribute("luftpause.abandoned", True)
        self._event(turn, pb.TurnEvent.ABANDONED)

    def _first_token(self, turn: Turn) -> None:
        # Not reported now: the scheduler only records it, so it rides on the end event.
        now = turn.first_token_at = self._loop.time()
        self.metrics.first_token(turn.service_class, now - turn.arrived, turn.replica)

    def _finished(
        self,
        turn: Turn,
        finish_reason: str,
        tool_calls: bool,
        prompt: int,
        completion: int,
        tool_call_ids: list[str] | None = None,
        answer: Answer = (-1, None, None),
    ) -> None:
        """Report ``turn`` finished (once), with its facts; ``answer``: the prompt tokens the
        engine's prefix cache served (``-1``: not reported), its completion id and the model that
        answered (``None``: not said)."""
        ids = tuple(tool_call_ids) if tool_call_ids and turn.run_id else ()
        if not self._end(turn, tool_calls, ids):
            return
        now = self._loop.time()
        cached, response_id, response_model = answer
        self.metrics.answers.finished(
            turn.model, turn.replica, turn.service_class, turn.caller, turn.arrived,
            turn.first_token_at, now, prompt, completion, cached,
        )  # fmt: skip
        if turn.span is not None:
            turn_spans.answered(turn, cached, response_id, response_model)
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
        self._ended_event(
            turn, pb.TurnEvent.FINISHED, finish_reason=finish_reason, tool_calls=tool_calls, **usage
        )
        self.metrics.turn_ended("finished", turn.service_class, turn.replica)

    def pool_of(self, replica: ReplicaConfig) -> EnginePool:
        """``replica``'s connection pool, for a request that is not a turn (count_tokens)."""
        return self._pool(replica)

    def _pool(self, replica: ReplicaConfig) -> EnginePool:
        # As many idle connections as turns the replica runs at once: more are never busy at once.
        return self.upstream.pool(
            replica.name, replica.url, lambda: _fixed_headers(replica), replica.max_inflight
        )

    async def forward(self, turn: Turn, replica: ReplicaConfig, exchange: Exchange) -> None:
        """Send ``turn`` to ``replica`` and relay the answer to the client of ``exchange``.

        The turn's ``body`` goes to ``turn.path`` unchanged, except that a chat turn to a replica
        with ``priority`` set carries its class as the engine's ``priority`` field
        (:func:`~luftpause.dataplane.turn.with_priority`) unless the client set one. Raises
        :class:`EngineUnreachable` (nothing sent to the client yet) when the engine cannot be
        connected to or breaks off before its answer has begun, and
        :class:`~luftpause.dataplane.asgi.StreamBroken` when the engine fails after the answer
        began (the client's connection is then aborted, never ended cleanly). Cancellation (the
        client left) closes the engine request at once.
        """
        turn.replica = replica.name
        if turn.single_pass:
            self.single_pass_in_flight.add(turn.turn_id)
        else:
            self.runs.placed(
                InFlight(
                    turn.turn_id, turn.run_id, replica.name, turn.model, turn.service_class, turn.caller
                ),
                self._loop.time(),
            )
        # No STARTED: the scheduler took its placement answer as the start.
        traceparent, tracestate = turn.traceparent, turn.tracestate
        if turn.span is not None:
            turn.span.set_attribute("luftpause.replica", replica.name)
            # The engine request's own span (a client span under the turn's): its context is
            # what the engine is sent, so the engine's spans hang below it.
            turn.engine_span = turn_spans.engine_start(turn, replica.url)
            sent_on = tracing.headers_of(turn.engine_span)
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
            turn.native_served, turn.translation = True, None
            path, body = native.path, native.body
        elif replica.priority is not None and not turn.single_pass and not turn.client_priority:
            # Local to this send: turn.body stays the client's bytes.
            body = with_priority(body, replica.priority, turn.service_class)
        upstream: EngineExchange | None = None
        try:
            try:
                if native is not None and not turn.native_served and turn.translation is None:
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
                decoder = _decoder(_header(headers, b"content-encoding"))
                drop = _STREAM_HEADERS if streamed else frozenset()
                out = relayable_headers(headers, drop | _DECODED if decoder else drop)
                if not turn.single_pass:  # a single-pass turn belongs to no run
                    out.append((_RUN_ID, turn.run_id.encode()))
                if status != 200:
                    await self._relay_refusal(turn, upstream, out, exchange, decoder)
                elif streamed:
                    await self._relay_stream(turn, upstream, out, exchange, decoder)
                else:
                    await self._relay_whole(turn, upstream, out, exchange, decoder)
            except (EngineError, zlib.error) as exc:
                # Errors after a stream began are handled in _relay_stream, so nothing was answered
                # yet: the client gets a 502 naming the replica, unless the engine never had the
                # turn and it may go to another replica (docs/failover.md).
                message = f"engine {replica.name}: {str(exc) or type(exc).__name__}"
                undelivered = isinstance(exc, EngineError) and exc.undelivered
                self.failed(turn, message, unreachable=undelivered)
                if undelivered and turn.failovers_left > 0 and self.failover.undelivered:
                    raise FailOver(message, unreachable=True) from None
                raise EngineUnreachable(message) from None
        except asyncio.CancelledError:
            self.failed(turn, "client disconnected")
            raise
        finally:
            if upstream is not None:
                if upstream.complete or upstream.answered:
                    upstream.release()  # back to the pool once its body has ended (a short grace)
                else:
                    upstream.abort()  # given up mid-answer: the engine sees its request closed
            self.failed(turn, "the relay ended without an outcome")  # a no-op once the turn ended
            if turn.engine_span is not None:  # a turn reported ended already: never left open
                turn.engine_span.end()
                turn.engine_span = None

    async def _relay_refusal(
        self, turn: Turn, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        # 429 / 5xx: status, body and Retry-After reach the client unchanged (or, for a status
        # [dataplane.failover] retry_statuses names, the turn goes to another replica instead).
        body = await upstream.read_all(MAX_WHOLE_ANSWER_BYTES)
        if decoder:
            body = decoder.decompress(body) + decoder.flush()
        self.failed(turn, f"engine answered {upstream.status}")
        if upstream.status in self.failover.retry_statuses and turn.failovers_left > 0:
            raise FailOver(f"engine {turn.replica} answered {upstream.status}", unreachable=False)
        if turn.translation is not None:
            body = turn.translation.refusal(upstream.status, body)
        await exchange.respond(upstream.status, headers, body)
        self.metrics.relayed(len(body))

    async def _relay_stream(
        self, turn: Turn, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        """Relay an SSE stream as it comes. With an encoding the relay does not decode
        (``decoder is False``) the bytes pass untouched and the side parser cannot read them: the
        turn is then reported finished when the engine's body ends cleanly (no first token, usage
        or finish reason known) and failed when it breaks. A turn with a translation gets its
        stream translated (:class:`~luftpause.dataplane.turn.StreamTranslation`), whose scanner
        then gives the facts.

        A readable answer is whole at its last event (``[DONE]``, or the native API's own): the
        turn is reported then and the client's response ends with that event, even when the
        engine's body has not ended yet (its connection waits for that end on its own, see
        :meth:`~luftpause.dataplane.upstream.EngineExchange.release`); a client that leaves before
        that event fails the turn and the engine's request is closed at once, even after a finish
        reason (with n > 1 choices the first to finish is not the last). An engine that ends its
        body cleanly without that event has answered whole only if every choice the turn asked
        for (``turn.choices``) said its finish reason (``scanner.choices_finished``); else the answer
        was cut short and the client's stream is broken, as when the engine fails mid-stream."""
        translation = turn.translation.stream() if turn.translation is not None else None
        if translation is not None and decoder is False:
            raise EngineError("its stream is in an encoding the relay cannot read to translate")
        if translation is not None:
            scanner = translation.scanner
        elif turn.native_served and turn.native is not None:
            scanner = turn.native.scanner()  # the API's own events, relayed unchanged
        else:
            scanner = SSEScanner(choices=turn.choices)
        scan = scanner.feed if decoder is not False and translation is None else None

        def take_in(data: bytes) -> bytes:
            """Read the facts of ``data`` (the engine's bytes) and return what the client gets."""
            if translation is None:
                if scan is not None and data and scan(data):
                    self._first_token(turn)
                return data
            seen = scanner.first_token_seen
            out = translation.feed(data)
            if not seen and scanner.first_token_seen:
                self._first_token(turn)
            return out

        headers.extend(_STREAM_HEAD)
        await exchange.start(200, headers)
        send = exchange.send
        relayed = 0  # summed here, added to the counter once per turn
        readable = decoder is not False
        try:
            while True:
                try:
                    data = upstream.take()
                    if not data and not upstream.complete:
                        data = await upstream.read()
                    ended = upstream.complete
                    if decoder:
                        data = decoder.decompress(data)
                        if ended:
                            data += decoder.flush()
                    out = take_in(data)
                    if not ended and decoder is None and (scanner.done or scanner.choices_finished):
                        # The answer is over but its HTTP body has not ended yet (an engine writes
                        # the end after its last event): one turn of the loop lets the end be read,
                        # so the last events and the end go out in one send (a send costs ~0.04 ms
                        # of CPU, a turn of the loop a few us). Never before the answer is over:
                        # events go out as they come, the first token first of all.
                        await asyncio.sleep(0)
                        if upstream.error is None and (more := upstream.take()):
                            out += take_in(more)
                        ended = upstream.complete
                    if readable and scanner.done:
                        # The answer's last event came: the connection may be kept (its body's end
                        # may still be on its way). Not at a finish reason: with n > 1 choices the
                        # first to finish is not the last, and a client leaving then must stop the
                        # engine at once.
                        upstream.answered = True
                    if ended and readable and not (scanner.done or scanner.choices_finished or scanner.error):
                        # The engine ended its body before the answer was complete (with n > 1
                        # choices: before every choice said its finish reason): to the client that
                        # is a broken stream too, so its connection is aborted, not ended.
                        if out:
                            await send({"type": "http.response.body", "body": out, "more_body": True})
                            relayed += len(out)
                        raise StreamBroken("engine closed the stream before it finished")
                    # The answer's last event came ([DONE], or the native API's own last event): the
                    # client's response ends with it, whether the engine's body has ended yet or not
                    # (its end may come later; the client, done at that event, may already be gone).
                    over = ended or (readable and scanner.done)
                    if over and translation is not None:
                        out += translation.finish()
                except (EngineError, zlib.error) as exc:
                    # The client has had 200 and the chunks so far; its connection is aborted (no
                    # final chunk, no [DONE]), so it sees the stream broken rather than ended.
                    message = f"engine failed mid-stream: {exc}"
                    self.failed(turn, message)
                    raise StreamBroken(message) from None
                except StreamBroken as exc:
                    self.failed(turn, str(exc))
                    raise
                except Exception as exc:
                    if translation is None:
                        raise
                    # The translation gave up (an event it could not translate faithfully): the
                    # client's stream is aborted like a broken one.
                    message = f"the answer could not be translated: {type(exc).__name__}: {exc}"
                    self.failed(turn, message)
                    raise StreamBroken(message) from None
                if not over:
                    if out:
                        # Waits while the client is not reading (granian's send is bounded), and the
                        # engine connection stops reading meanwhile: memory stays bounded.
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                        relayed += len(out)
                    continue
                # Reported before the last send: the answer is whole, so the client leaving now (it
                # may close once it has read the last event) changes nothing.
                self._stream_ended(turn, scanner, translation, readable)
                # The last of the answer and its end in one send.
                await send({"type": "http.response.body", "body": out, "more_body": False})
                relayed += len(out)
                break
        except asyncio.CancelledError:
            # The client left. Once the answer's last event had come ([DONE], or the native API's
            # own), the turn finished all the same (reported before the last send, so this is for a
            # client gone while that send waited); before it, the turn failed (a finish reason is
            # not enough: with n > 1 choices the first to finish is not the last).
            if readable and scanner.done:
                self._stream_ended(turn, scanner, translation, readable)
            raise
        finally:
            self.metrics.relayed(relayed)
            if scanner.oversized_events:
                log.warning(
                    "turn %s: %d SSE events over %d bytes were relayed unread",
                    turn.turn_id,
                    scanner.oversized_events,
                    scanner.max_event_bytes,
                )

    def _stream_ended(
        self, turn: Turn, scanner: SSEScanner, translation: StreamTranslation | None, readable: bool
    ) -> None:
        """Report a stream whose answer is whole (or, unread, whose body ended cleanly)."""
        if not readable:
            self._finished(turn, "", False, -1, -1)  # unread: only that it ended cleanly is known
        elif scanner.error is not None:
            # vLLM and SGLang report a failure inside the stream as an error event, then [DONE]:
            # the stream is the engine's whole answer, ended as the engine ended it.
            self.failed(turn, f"engine error mid-stream: {scanner.error}")
        else:
            ids = scanner.tool_call_ids
            if translation is not None:  # the ids the client was sent, too (it echoes those)
                ids = list(dict.fromkeys([*ids, *translation.tool_call_ids]))
            self._finished(
                turn,
                scanner.finish_reason or "",
                scanner.saw_tool_calls,
                scanner.prompt_tokens,
                scanner.completion_tokens,
                ids,
                (scanner.cached_tokens, scanner.response_id, scanner.response_model),
            )

    async def _relay_whole(
        self, turn: Turn, upstream: EngineExchange, headers: Headers, exchange: Exchange, decoder: Any
    ) -> None:
        body = await upstream.read_all(MAX_WHOLE_ANSWER_BYTES)  # a read error here becomes a 502
        if decoder:
            body = decoder.decompress(body) + decoder.flush()
        answer: Answer = (-1, None, None)
        if decoder is False:
            # Encoded in a way the relay does not decode: passed with its header, facts unknown.
            finish_reason, tool_calls, prompt, completion = "", False, -1, -1
            ids: list[str] = []
        elif turn.single_pass:
            # A classification has no tokens to stream: no first token, only its usage.
            finish_reason, tool_calls, prompt, completion = "", False, *_usage(body)
            ids = []
        else:
            # A whole answer has no first token of its own: the dataplane's time-to-first-token
            # histogram counts its whole time, as before, but the scheduler is told of none, since
            # it learns a run's cold prefill rate from a first token (policies/idle_affinity.py)
            # and a whole answer's time holds its whole decode too.
            self.metrics.first_token(turn.service_class, self._loop.time() - turn.arrived, turn.replica)
            if turn.native_served and turn.native is not None:
                finish_reason, tool_calls, prompt, completion, ids = turn.native.whole(body)
            else:
                doc = _json_object(body)
                finish_reason, tool_calls, prompt, completion, ids = _completion_facts_of(doc)
                answer = _answer_of(doc)
        if turn.translation is not None:
            body = turn.translation.whole(body)
        # Reported before the answer goes out: the client, once it has it, may close before the
        # send returns, and the turn finished all the same.
        self._finished(turn, finish_reason, tool_calls, prompt, completion, ids, answer)
        await exchange.respond(200, headers, body)
        self.metrics.relayed(len(body))


Answer = tuple[int, str | None, str | None]
"""``(cached prompt tokens, completion id, model that answered)`` of an answer: ``-1`` and
``None`` for what it does not say (``usage.prompt_tokens_details.cached_tokens``, ``id``, ``model``)."""


def _json_object(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object; ``{}`` when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _answer_of(doc: dict[str, Any]) -> Answer:
    """The :data:`Answer` of a whole ``chat.completion`` (OpenAI Chat Completions)."""
    usage = doc.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    response_id, model = doc.get("id"), doc.get("model")
    return (
        cached if type(cached) is int and cached >= 0 else -1,
        response_id if isinstance(response_id, str) and response_id else None,
        model if isinstance(model, str) and model else None,
    )


def _completion_facts(body: bytes) -> tuple[str, bool, int, int, list[str]]:
    """Finish reason, tool calls emitted, prompt and completion tokens, and the tool-call ids of a
    ``chat.completion``.

    Shape: OpenAI Chat Completions, non-streamed response object. Unknown shapes give blanks.
    """
    return _completion_facts_of(_json_object(body))


def _completion_facts_of(doc: dict[str, Any]) -> tuple[str, bool, int, int, list[str]]:
    """:func:`_completion_facts` of the parsed answer (``{}``: blanks)."""
    if not doc:
        return "", False, -1, -1, []
    finish_reason, tool_calls = "", False
    for choice in doc.get("choices") or ():
        if isinstance(choice, dict):
            finish_reason = choice.get("finish_reason") or finish_reason
            message = choice.get("message")
            if isinstance(message, dict) and message.get("tool_calls"):
                tool_calls = True
    if tool_calls:
        finish_reason = "tool_calls"
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        str(finish_reason),
        tool_calls,
        prompt if type(prompt) is int else -1,
        completion if type(completion) is int else -1,
        completion_tool_call_ids(doc) if tool_calls else [],
    )


def _usage(body: bytes) -> tuple[int, int]:
    """Prompt and completion tokens from a JSON response's top-level ``usage`` (vLLM's classify
    response has one), ``-1`` for what is missing."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return -1, -1
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return -1, -1
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if type(prompt) is int else -1, completion if type(completion) is int else -1)
