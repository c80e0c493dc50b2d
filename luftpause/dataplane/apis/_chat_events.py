"""Reading a Chat Completions stream for the answer translators: SSE framing by the dataplane's own
scanner, and what one ``chat.completion.chunk`` says.

The translators feed the engine's bytes to an :class:`~luftpause.dataplane.sse.SSEScanner` made
with ``keep_events=True`` (the compiled twin when built), take the events it dispatched, and empty
its ``events`` list, so nothing is held beyond the one incomplete event the scanner holds itself.
The same scanner reports the turn's facts (first token, usage, finish reason, error) to the relay,
as for a chat turn relayed unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from luftpause.dataplane.sse import SSEScanner

__all__ = [
    "ChatChunk",
    "ChatEvents",
    "StreamIncomplete",
    "TranslationBroken",
    "read_chunk",
    "usage_of",
]

_DONE = b"[DONE]"


class TranslationBroken(Exception):
    """The engine's stream cannot be translated faithfully (an event over the scanner's bound was
    dropped, so its content would be lost): the relay must abort the client's connection."""


class StreamIncomplete(Exception):
    """:meth:`finish` was called on a stream that neither finished nor reported an error: the
    engine ended its body early, so the client's connection must be aborted, not ended cleanly."""


@dataclass(slots=True)
class ChatChunk:
    """What one chunk said, for choice 0 (the translators never ask for ``n`` > 1).

    ``tool_calls``: each ``(index, id, name, arguments)`` with ``None`` for what the delta lacks."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[tuple[int, str | None, str | None, str | None]] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None


class ChatEvents:
    """SSE framing over :class:`SSEScanner`: :meth:`feed` returns the payloads completed by a read."""

    __slots__ = ("scanner",)

    def __init__(self) -> None:
        self.scanner = SSEScanner(keep_events=True)

    def feed(self, chunk: bytes | bytearray) -> list[bytes]:
        """The data of each event completed by ``chunk`` (``[DONE]`` left out), in order.

        Raises :class:`TranslationBroken` when the scanner dropped an event for its size."""
        scanner = self.scanner
        dropped = scanner.oversized_events
        scanner.feed(chunk)
        if scanner.oversized_events != dropped:
            raise TranslationBroken(
                f"an engine event over {scanner.max_event_bytes} bytes cannot be translated"
            )
        events = scanner.events
        if not events:
            return []
        taken = [data for data in events if data != _DONE]
        del events[:]
        return taken


def read_chunk(data: bytes) -> ChatChunk | None:
    """Parse one payload; ``None`` when it is not a JSON object (ignored, as the scanner does)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    chunk = ChatChunk()
    error = doc.get("error")
    if error is not None or doc.get("object") == "error":
        message = error.get("message") if isinstance(error, dict) else error
        if not isinstance(message, str) or not message:
            message = doc.get("message") if isinstance(doc.get("message"), str) else "engine error"
        chunk.error = str(message)[:500] or "engine error"
        return chunk
    usage = doc.get("usage")
    if isinstance(usage, dict):
        chunk.usage = usage
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return chunk
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str):
                chunk.content = text
            for key in ("reasoning_content", "reasoning"):
                text = delta.get(key)
                if isinstance(text, str) and text:
                    chunk.reasoning = text
                    break
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for position, call in enumerate(calls):
                    if not isinstance(call, dict):
                        continue
                    index = call.get("index", position)
                    function = call.get("function")
                    function = function if isinstance(function, dict) else {}
                    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
                    chunk.tool_calls.append(
                        (
                            index if type(index) is int else position,
                            call_id if isinstance(call_id, str) and call_id else None,
                            name if isinstance(name, str) and name else None,
                            arguments if isinstance(arguments, str) else None,
                        )
                    )
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            chunk.finish_reason = reason
        # vLLM names the stop string that ended the turn in ``stop_reason``, SGLang in ``matched_stop``
        for key in ("stop_reason", "matched_stop"):
            matched = choice.get(key)
            if isinstance(matched, str) and matched:
                chunk.matched_stop = matched
    return chunk


def usage_of(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    """``(prompt, completion, cached prompt)`` tokens of a Chat Completions ``usage``; 0 if unknown."""
    if not usage:
        return 0, 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = prompt if type(prompt) is int and prompt >= 0 else 0
    cached = cached if type(cached) is int and 0 <= cached <= prompt else 0
    return prompt, completion if type(completion) is int and completion >= 0 else 0, cached
