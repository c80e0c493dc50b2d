"""One turn through the dataplane: admit, forward, relay, report.

The engine's response reaches the client unchanged: a stream is relayed event by event as each read
returns (no buffering, no re-framing, no re-encoding), while :class:`~luftpause.dataplane.sse.SSEScanner`
reads the same bytes on the side for first-token time, usage, finish reason and tool calls. What the
client sees in each failure case is the table in DESIGN.md ("Failure contract").
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from granian._granian import RSGIProtocolClosed, RSGIProtocolError

from luftpause.config import ReplicaConfig
from luftpause.dataplane.admission import SchedulerLink
from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.runs import InFlight, RunTable
from luftpause.dataplane.sse import SSEScanner
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from granian._granian import RSGIHTTPProtocol as HTTPProtocol

log = logging.getLogger("luftpause.dataplane")

RUN_ID_HEADER = "x-luftpause-run-id"
_INLINE_BODY_BYTES = 1024 * 1024

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the server recomputes are never relayed.
_NOT_RELAYED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",  # aiohttp decodes the body, so its encoding header must go with it
        "date",
        "server",
    }
)


@dataclass(slots=True)
class Turn:
    """One chat completion request as admitted: ids, class and caller, the raw body."""

    turn_id: str
    run_id: str
    model: str
    service_class: int
    caller: str
    body: bytes
    traceparent: str | None

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex


class Relay:
    """Forwards admitted turns to replicas over one shared aiohttp session and reports them.

    Every turn given to :meth:`forward` is reported ended exactly once (finished or failed); a turn
    given up before it reached an engine is reported with :meth:`abandoned`.
    """

    def __init__(self, session: aiohttp.ClientSession, link: SchedulerLink, runs: RunTable) -> None:
        self.session = session
        self.link = link
        self.runs = runs

    def _event(self, turn: Turn, kind: int, **fields: Any) -> None:
        event = pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, kind=kind, **fields)  # type: ignore[arg-type]
        self.link.report(event)

    def failed(self, turn: Turn, error: str) -> None:
        """The turn ended without a completion: free its slot, leave the run idle (once per turn)."""
        if self.runs.ended(turn.turn_id, False, asyncio.get_running_loop().time()):
            self._event(turn, pb.TurnEvent.FAILED, error=error[:500])

    def abandoned(self, turn: Turn) -> None:
        """The turn was given up before any engine saw it: the scheduler undoes what it did with it."""
        self._event(turn, pb.TurnEvent.ABANDONED)

    def _finished(
        self, turn: Turn, finish_reason: str, tool_calls: bool, prompt: int, completion: int
    ) -> None:
        if not self.runs.ended(turn.turn_id, tool_calls, asyncio.get_running_loop().time()):
            return
        self._event(
            turn,
            pb.TurnEvent.FINISHED,
            finish_reason=finish_reason,
            tool_calls=tool_calls,
            prompt_tokens=max(prompt, 0),
            completion_tokens=max(completion, 0),
        )

    async def forward(self, turn: Turn, replica: ReplicaConfig, proto: HTTPProtocol) -> None:
        """Send ``turn`` to ``replica`` and relay the answer to ``proto``.

        Raises :class:`EngineUnreachable` (nothing sent to the client yet) when the engine cannot be
        connected to or breaks off before its answer has begun. Cancellation (the client left)
        closes the engine request at once.
        """
        self.runs.placed(
            InFlight(turn.turn_id, turn.run_id, replica.name, turn.model, turn.service_class, turn.caller),
            asyncio.get_running_loop().time(),
        )
        self._event(turn, pb.TurnEvent.STARTED)
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        key = replica.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        if turn.traceparent:
            headers["traceparent"] = turn.traceparent
        # aiohttp writes a bytes body in one call; past 1 MiB a file-like payload is streamed.
        data: bytes | io.BytesIO = (
            turn.body if len(turn.body) <= _INLINE_BODY_BYTES else io.BytesIO(turn.body)
        )
        try:
            async with self.session.post(
                f"{replica.url}/v1/chat/completions", data=data, headers=headers
            ) as upstream:
                out_headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in _NOT_RELAYED]
                out_headers.append((RUN_ID_HEADER, turn.run_id))
                if upstream.status != 200:
                    await self._relay_refusal(turn, upstream, out_headers, proto)
                elif upstream.content_type == "text/event-stream":
                    await self._relay_stream(turn, upstream, out_headers, proto)
                else:
                    await self._relay_whole(turn, upstream, out_headers, proto)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
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
        proto: HTTPProtocol,
    ) -> None:
        # 429 / 5xx: status, body and Retry-After reach the client unchanged.
        body = await upstream.read()
        self.failed(turn, f"engine answered {upstream.status}")
        proto.response_bytes(upstream.status, headers, body)

    async def _relay_stream(
        self,
        turn: Turn,
        upstream: aiohttp.ClientResponse,
        headers: list[tuple[str, str]],
        proto: HTTPProtocol,
    ) -> None:
        headers.append(("cache-control", "no-cache"))
        headers.append(("x-accel-buffering", "no"))
        transport = proto.response_stream(200, headers)
        scanner = SSEScanner()
        try:
            async for chunk in upstream.content.iter_any():
                await transport.send_bytes(chunk)
                if scanner.feed(chunk):
                    self._event(turn, pb.TurnEvent.FIRST_TOKEN)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The client has had 200 and the chunks so far; the stream ends without [DONE].
            self.failed(turn, f"engine failed mid-stream: {exc!r}")
            return
        except (RSGIProtocolClosed, RSGIProtocolError) as exc:  # the client's side went away
            self.failed(turn, f"client stream closed: {exc!r}")
            return
        finally:
            # granian ends a streamed response when its transport object is freed, and a caught
            # exception's traceback keeps this frame alive: without this the client would hang.
            del transport
            if scanner.oversized_events:
                log.warning(
                    "turn %s: %d SSE events over %d bytes were relayed unread",
                    turn.turn_id,
                    scanner.oversized_events,
                    scanner.max_event_bytes,
                )
        if scanner.error is not None:
            # vLLM and SGLang report a failure inside the stream as an error event, then [DONE].
            self.failed(turn, f"engine error mid-stream: {scanner.error}")
            return
        if not scanner.done and scanner.finish_reason is None:
            self.failed(turn, "engine closed the stream before it finished")
            return
        self._finished(
            turn,
            scanner.finish_reason or "",
            scanner.saw_tool_calls,
            scanner.prompt_tokens,
            scanner.completion_tokens,
        )

    async def _relay_whole(
        self,
        turn: Turn,
        upstream: aiohttp.ClientResponse,
        headers: list[tuple[str, str]],
        proto: HTTPProtocol,
    ) -> None:
        body = await upstream.read()  # a read error here becomes forward()'s 502
        self._event(turn, pb.TurnEvent.FIRST_TOKEN)
        finish_reason, tool_calls, prompt, completion = _completion_facts(body)
        proto.response_bytes(200, headers, body)
        self._finished(turn, finish_reason, tool_calls, prompt, completion)


def _completion_facts(body: bytes) -> tuple[str, bool, int, int]:
    """Finish reason, tool calls emitted, prompt and completion tokens of a ``chat.completion``.

    Shape: OpenAI Chat Completions, non-streamed response object. Unknown shapes give blanks.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", False, -1, -1
    if not isinstance(doc, dict):
        return "", False, -1, -1
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
    )
