"""One turn through the dataplane: admit, forward, relay, report.

The engine's response reaches the client unchanged: a stream is relayed event by event as each read
returns (no buffering, no re-framing, no re-encoding), while :class:`~luftpause.dataplane.sse.SSEScanner`
reads the same bytes on the side for first-token time, usage, finish reason and tool calls. What the
client sees in each failure case is the table in docs/architecture.md "Failure contract".
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import secrets
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from luftpause import tracing
from luftpause.config import EnginePriority, ReplicaConfig
from luftpause.dataplane import turn_spans
from luftpause.dataplane.admission import SchedulerLink
from luftpause.dataplane.asgi import Exchange, StreamBroken
from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.metrics import DataplaneMetrics
from luftpause.dataplane.runs import InFlight, RunTable
from luftpause.dataplane.sse import SSEScanner
from luftpause.dataplane.tool_calls import ToolCallTable, completion_tool_call_ids
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("luftpause.dataplane")

RUN_ID_HEADER = "x-luftpause-run-id"
_INLINE_BODY_BYTES = 1024 * 1024

CHAT_PATH = "/v1/chat/completions"
CLASSIFY_PATH = "/classify"
"""Where a single-pass turn goes on its replica: vLLM's classification route."""

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
"""Hop-by-hop headers (RFC 9110 §7.6.1, plus the non-standard ``proxy-connection``): never relayed
in either direction, nor any header that ``Connection`` names."""

# Besides the hop-by-hop ones: what granian recomputes and what describes the engine rather than
# the answer. content-encoding is dropped only with a body the relay decoded (see _decoder).
_NOT_RELAYED = HOP_BY_HOP | {
    "proxy-authenticate",
    "content-length",
    "date",
    "server",
}
_DECODED = frozenset({"content-encoding"})
# Set by the relay on every stream, so the engine's own values must not duplicate them.
_STREAM_HEADERS = frozenset({"cache-control", "x-accel-buffering"})


def relayable_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """The end-to-end headers of an engine's response, as ``(name, value)`` pairs in order.

    Drops the hop-by-hop headers, every header a ``Connection`` header names (RFC 9110 §7.6.1),
    the headers in ``_NOT_RELAYED`` and those in ``drop`` (lower-case names).
    """
    named = {
        token.strip().lower() for value in headers.getall("connection", ()) for token in value.split(",")
    }
    return [
        (name, value)
        for name, value in headers.items()
        if (low := name.lower()) not in _NOT_RELAYED and low not in named and low not in drop
    ]


def _decoder(encoding: str | None) -> Any:
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
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: gzip or zlib header, detected
    return False


PRIORITY_VALUES: dict[str, dict[int, int]] = {
    "lower_first": {pb.INTERACTIVE: 0, pb.BATCH: 1},
    "higher_first": {pb.INTERACTIVE: 1, pb.BATCH: 0},
}
"""The ``priority`` a turn carries to a replica with ``[[replicas]] priority`` set, by that order
and the turn's service class: the interactive class gets the value the engine serves first.

Why these values: vLLM (lower first) gives a request without the field priority 0, so an untagged
request from another client ranks with interactive turns, ahead of batch ones, never behind them
(0 is also the one value vLLM takes without its priority policy, so a replica set up wrongly still
serves interactive turns). SGLang gives an untagged request the value it serves last, whichever
order it uses, so no choice of ours can move it ahead; 0 and 1 differ by less than its
``--priority-scheduling-preemption-threshold`` (default 10), so an interactive turn reorders the
waiting queue but never preempts a running batch turn (whose decode would be thrown away)."""

# The same, as the bytes spliced in: the opening brace and the member that follows it.
_PRIORITY_HEADS: dict[str, dict[int, bytes]] = {
    order: {cls: b'{"priority":%d,' % value for cls, value in values.items()}
    for order, values in PRIORITY_VALUES.items()
}


def with_priority(body: bytes, order: EnginePriority, service_class: int) -> bytes:
    """``body`` with ``"priority":N,`` spliced in right after its opening brace, ``N`` from
    :data:`PRIORITY_VALUES` for ``order`` and ``service_class`` (a ``ServiceClass``).

    ``body`` must be what the front door took: a JSON object (``_json_with_model`` in ``app.py``:
    only JSON whitespace may precede its brace, and orjson refuses a byte order mark) with at least
    one member (``model``), so the comma is followed by one, and without a ``priority`` member of
    its own (a client's explicit choice is sent as it came; the caller checks). Nothing else is
    parsed or re-encoded: the client's bytes follow unchanged, copied once.
    """
    start = body.index(b"{")
    return b"".join((body[:start], _PRIORITY_HEADS[order][service_class], memoryview(body)[start + 1 :]))


_ID_PREFIX = secrets.token_hex(8)
"""64 random bits per process: ids made here never meet another process's (dataplanes, restarts)."""
_ID_COUNTER = itertools.count()


def new_id() -> str:
    """A fresh id, unique across processes: this process's random prefix and a counter (hex).

    Cheaper than ``uuid4()``, which reads the kernel's random source on every call.
    """
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"


@dataclass(slots=True)
class Turn:
    """One request as admitted: ids, class and caller, the raw body.

    ``run_id`` is ``""`` for a single-pass turn (``POST /v1/decide``), which belongs to no run.
    ``arrived`` is the ``loop.time()`` (seconds) at which the request's body had been read;
    ``first_token_at`` the ``loop.time()`` of its first token, once it came. ``traceparent`` is
    what goes on with the turn (to the scheduler and the engine): the dataplane's own span of it
    (``span``) while tracing is active, else the client's header as it came; ``tracestate`` (W3C
    Trace Context: forwarded with its ``traceparent``) goes on to the engine with it, unchanged.
    """

    turn_id: str
    run_id: str
    model: str
    service_class: int
    caller: str
    body: bytes
    traceparent: str | None
    tracestate: str | None = None
    single_pass: bool = False
    arrived: float = 0.0
    first_token_at: float | None = None
    span: Span | None = None
    new_run: bool = False
    """The run was made up for this turn (no header, no known tool call): forgotten again if the
    turn never reaches a replica."""
    client_priority: bool = False
    """The client's body has a top-level ``priority`` of its own: sent as it came, never tagged."""

    @staticmethod
    def new_id() -> str:
        """A fresh turn id (:func:`new_id`)."""
        return new_id()


class Relay:
    """Forwards admitted turns to replicas over one shared aiohttp session and reports them.

    Every turn given to :meth:`forward` is reported ended exactly once (finished or failed); a turn
    given up before it reached an engine is reported with :meth:`abandoned`. The tool-call ids a
    finished turn emitted (streamed or not) are remembered in ``tool_calls`` under its run.

    Events reported per turn: none at the start (the placement answer is the start, see the proto)
    and none at the first token (its time rides on the end event as ``first_token_ago_s``), so a
    turn that ends costs one event. Build it inside the running loop.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        link: SchedulerLink,
        runs: RunTable,
        metrics: DataplaneMetrics,
        tool_calls: ToolCallTable,
    ) -> None:
        self.session = session
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

    def _end(self, turn: Turn, tool_calls: bool) -> bool:
        """Mark ``turn`` ended; False if it had already ended, so it is reported once."""
        if turn.single_pass:
            if turn.turn_id not in self.single_pass_in_flight:
                return False
            self.single_pass_in_flight.discard(turn.turn_id)
            return True
        return self.runs.ended(turn.turn_id, tool_calls, self._loop.time())

    def _event(self, turn: Turn, kind: int, **fields: Any) -> None:
        if turn.traceparent:
            fields["trace_id"] = tracing.trace_id_of(turn.traceparent)
        event = pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, kind=kind, **fields)  # type: ignore[arg-type]
        self.link.report(event)

    def _ended_event(self, turn: Turn, kind: int, **fields: Any) -> None:
        """FINISHED or FAILED, carrying how long ago the first token came when one did."""
        if turn.first_token_at is not None:
            fields["first_token_ago_s"] = max(self._loop.time() - turn.first_token_at, 0.0)
        if turn.span is not None:
            turn_spans.ended(turn.span, kind, fields)
        self._event(turn, kind, **fields)

    def failed(self, turn: Turn, error: str) -> None:
        """The turn ended without a completion: free its slot, leave the run idle (once per turn)."""
        if self._end(turn, False):
            self._ended_event(turn, pb.TurnEvent.FAILED, error=error[:500])
            self.metrics.turn_ended("failed", turn.service_class)

    def abandoned(self, turn: Turn) -> None:
        """The turn was given up before any engine saw it: the scheduler undoes what it did with it."""
        if turn.span is not None:
            turn.span.set_attribute("luftpause.abandoned", True)
        self._event(turn, pb.TurnEvent.ABANDONED)

    def _first_token(self, turn: Turn) -> None:
        # Not reported now: the scheduler only records it, so it rides on the end event.
        now = turn.first_token_at = self._loop.time()
        self.metrics.first_token(turn.service_class, now - turn.arrived)

    def _finished(
        self,
        turn: Turn,
        finish_reason: str,
        tool_calls: bool,
        prompt: int,
        completion: int,
        tool_call_ids: list[str] | None = None,
    ) -> None:
        if not self._end(turn, tool_calls):
            return
        if tool_call_ids and turn.run_id:
            # The run's next turn may come back without its header but with these ids.
            self.tool_calls.remember(turn.run_id, tool_call_ids, self._loop.time())
        # A count the engine did not report (-1) is left out: 0 on the wire (proto3's default),
        # absent on the turn's span (never recorded as 0 tokens).
        usage = {k: v for k, v in (("prompt_tokens", prompt), ("completion_tokens", completion)) if v >= 0}
        self._ended_event(
            turn, pb.TurnEvent.FINISHED, finish_reason=finish_reason, tool_calls=tool_calls, **usage
        )
        self.metrics.turn_ended("finished", turn.service_class)

    async def forward(self, turn: Turn, replica: ReplicaConfig, exchange: Exchange) -> None:
        """Send ``turn`` to ``replica`` and relay the answer to the client of ``exchange``.

        A chat turn goes to ``/v1/chat/completions``, a single-pass turn to ``/classify`` (vLLM's
        classification route), its body unchanged either way, except that a chat turn to a
        replica with ``priority`` set carries its class as the engine's ``priority`` field
        (:func:`with_priority`) unless the client set one. Raises :class:`EngineUnreachable`
        (nothing sent to the client yet) when the engine cannot be connected to or breaks off
        before its answer has begun, and :class:`~luftpause.dataplane.asgi.StreamBroken` when the engine
        fails after the answer began (the client's connection is then aborted, never ended cleanly).
        Cancellation (the client left) closes the engine request at once.
        """
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
        if turn.span is not None:
            turn.span.set_attribute("luftpause.replica", replica.name)
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        key = replica.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        if turn.traceparent:
            headers["traceparent"] = turn.traceparent
            if turn.tracestate:  # W3C Trace Context: tracestate travels only with its traceparent
                headers["tracestate"] = turn.tracestate
        body = turn.body
        if replica.priority is not None and not turn.single_pass and not turn.client_priority:
            # Local to this send: turn.body stays the client's bytes.
            body = with_priority(body, replica.priority, turn.service_class)
        # aiohttp writes a bytes body in one call; past 1 MiB a file-like payload is streamed.
        data: bytes | io.BytesIO = body if len(body) <= _INLINE_BODY_BYTES else io.BytesIO(body)
        try:
            path = CLASSIFY_PATH if turn.single_pass else CHAT_PATH
            # Never decoded by aiohttp (which would fail on br/zstd without their libraries and drop
            # nothing it cannot decode): the relay decodes what it can itself (_decoder).
            async with self.session.post(
                f"{replica.url}{path}", data=data, headers=headers, auto_decompress=False
            ) as upstream:
                streamed = upstream.status == 200 and upstream.content_type == "text/event-stream"
                decoder = _decoder(upstream.headers.get("content-encoding"))
                drop = _STREAM_HEADERS if streamed else frozenset()
                out_headers = relayable_headers(upstream.headers, drop | _DECODED if decoder else drop)
                if not turn.single_pass:  # a single-pass turn belongs to no run
                    out_headers.append((RUN_ID_HEADER, turn.run_id))
                if upstream.status != 200:
                    await self._relay_refusal(turn, upstream, out_headers, exchange, decoder)
                elif streamed:
                    await self._relay_stream(turn, upstream, out_headers, exchange, decoder)
                else:
                    await self._relay_whole(turn, upstream, out_headers, exchange, decoder)
        except (aiohttp.ClientError, TimeoutError, OSError, zlib.error) as exc:
            # Errors after a stream began are handled in _relay_stream, so nothing was answered
            # yet: the client gets a 502 naming the replica.
            message = f"engine {replica.name}: {str(exc) or type(exc).__name__}"
            self.failed(turn, message)
            raise EngineUnreachable(message) from None
        except asyncio.CancelledError:
            self.failed(turn, "client disconnected")
            raise
        finally:
            self.failed(turn, "the relay ended without an outcome")  # a no-op once the turn ended

    async def _relay_refusal(
        self,
        turn: Turn,
        upstream: aiohttp.ClientResponse,
        headers: list[tuple[str, str]],
        exchange: Exchange,
        decoder: Any,
    ) -> None:
        # 429 / 5xx: status, body and Retry-After reach the client unchanged.
        body = await upstream.read()
        if decoder:
            body = decoder.decompress(body) + decoder.flush()
        self.failed(turn, f"engine answered {upstream.status}")
        await exchange.respond(upstream.status, headers, body)
        self.metrics.relayed(len(body))

    async def _relay_stream(
        self,
        turn: Turn,
        upstream: aiohttp.ClientResponse,
        headers: list[tuple[str, str]],
        exchange: Exchange,
        decoder: Any,
    ) -> None:
        """Relay an SSE stream event by event. With an encoding the relay does not decode
        (``decoder is False``) the bytes pass untouched and the side parser cannot read them: the
        turn is then reported finished when the engine's body ends cleanly (no first token, usage
        or finish reason known) and failed when it breaks."""
        headers.append(("cache-control", "no-cache"))
        headers.append(("x-accel-buffering", "no"))
        await exchange.start(200, headers)
        send = exchange.send
        scanner = SSEScanner()
        relayed = 0  # summed here, added to the counter once per turn
        try:
            if decoder is None:
                async for chunk in upstream.content.iter_any():
                    # Waits while the client is not reading (granian's ASGI send is bounded), and
                    # aiohttp stops reading the engine while this waits: memory stays bounded.
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    relayed += len(chunk)
                    if scanner.feed(chunk):
                        self._first_token(turn)
            elif decoder is False:
                async for chunk in upstream.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    relayed += len(chunk)
            else:
                async for chunk in upstream.content.iter_any():
                    chunk = decoder.decompress(chunk)
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        relayed += len(chunk)
                        if scanner.feed(chunk):
                            self._first_token(turn)
                if tail := decoder.flush():
                    await send({"type": "http.response.body", "body": tail, "more_body": True})
                    relayed += len(tail)
                    if scanner.feed(tail):
                        self._first_token(turn)
        except (aiohttp.ClientError, TimeoutError, OSError, zlib.error) as exc:
            # The client has had 200 and the chunks so far; its connection is aborted (no final
            # chunk, no [DONE]), so it sees the stream broken rather than ended.
            message = f"engine failed mid-stream: {exc!r}"
            self.failed(turn, message)
            raise StreamBroken(message) from None
        finally:
            self.metrics.relayed(relayed)
            if scanner.oversized_events:
                log.warning(
                    "turn %s: %d SSE events over %d bytes were relayed unread",
                    turn.turn_id,
                    scanner.oversized_events,
                    scanner.max_event_bytes,
                )
        if decoder is False:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self._finished(turn, "", False, -1, -1)  # unread: only that it ended cleanly is known
            return
        if scanner.error is not None:
            # vLLM and SGLang report a failure inside the stream as an error event, then [DONE]:
            # the stream is the engine's whole answer, ended as the engine ended it.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.failed(turn, f"engine error mid-stream: {scanner.error}")
            return
        if not scanner.done and scanner.finish_reason is None:
            # The engine ended its body before the answer was complete: to the client that is a
            # broken stream too, so its connection is aborted rather than ended.
            message = "engine closed the stream before it finished"
            self.failed(turn, message)
            raise StreamBroken(message)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._finished(
            turn,
            scanner.finish_reason or "",
            scanner.saw_tool_calls,
            scanner.prompt_tokens,
            scanner.completion_tokens,
            scanner.tool_call_ids,
        )

    async def _relay_whole(
        self,
        turn: Turn,
        upstream: aiohttp.ClientResponse,
        headers: list[tuple[str, str]],
        exchange: Exchange,
        decoder: Any,
    ) -> None:
        body = await upstream.read()  # a read error here becomes forward()'s 502
        if decoder:
            body = decoder.decompress(body) + decoder.flush()
        if decoder is False:
            # Encoded in a way the relay does not decode: passed with its header, facts unknown.
            finish_reason, tool_calls, prompt, completion = "", False, -1, -1
            ids: list[str] = []
        elif turn.single_pass:
            # A classification has no tokens to stream: no first token, only its usage.
            finish_reason, tool_calls, prompt, completion = "", False, *_usage(body)
            ids = []
        else:
            self._first_token(turn)
            finish_reason, tool_calls, prompt, completion, ids = _completion_facts(body)
        await exchange.respond(200, headers, body)
        self.metrics.relayed(len(body))
        self._finished(turn, finish_reason, tool_calls, prompt, completion, ids)


def _completion_facts(body: bytes) -> tuple[str, bool, int, int, list[str]]:
    """Finish reason, tool calls emitted, prompt and completion tokens, and the tool-call ids of a
    ``chat.completion``.

    Shape: OpenAI Chat Completions, non-streamed response object. Unknown shapes give blanks.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", False, -1, -1, []
    if not isinstance(doc, dict):
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
