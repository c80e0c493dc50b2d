"""Helpers for the Messages / Responses translation tests: Chat Completions streams as engines send
them, the official SDKs reading translated bytes, and feeding a stream cut at every byte."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import anthropic
import httpx2
import openai


class Translator(Protocol):
    def feed(self, chunk: bytes | bytearray) -> bytes: ...

    def finish(self) -> bytes: ...


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    **choice: Any,
) -> bytes:
    """One ``data:`` event of a ``chat.completion.chunk`` (``usage`` alone: the usage-only chunk)."""
    doc: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if usage is not None:
        doc["choices"] = []
        doc["usage"] = usage
    else:
        doc["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish, **choice}]
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def tool_delta(
    index: int, call_id: str | None = None, name: str | None = None, arguments: str | None = None
) -> bytes:
    call: dict[str, Any] = {"index": index}
    if call_id is not None:
        call["id"] = call_id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    call["function"] = function
    return chunk({"tool_calls": [call]})


USAGE = {
    "prompt_tokens": 21,
    "completion_tokens": 9,
    "total_tokens": 30,
    "prompt_tokens_details": {"cached_tokens": 16},
}
DONE = b"data: [DONE]\n\n"


def stream_of(*events: bytes) -> bytes:
    return b"".join(events)


def translate(make: Callable[[], Translator], pieces: Iterable[bytes]) -> bytes:
    translator = make()
    return b"".join(translator.feed(p) for p in pieces) + translator.finish()


def translate_every_split(make: Callable[[], Translator], stream: bytes) -> bytes:
    """The translation of ``stream`` fed whole; asserts it is the same byte for byte when the stream
    is cut in two at every position, and when fed one byte at a time."""
    whole = translate(make, [stream])
    for i in range(1, len(stream)):
        assert translate(make, [stream[:i], stream[i:]]) == whole, f"cut at byte {i}"
    assert translate(make, [stream[i : i + 1] for i in range(len(stream))]) == whole, "byte by byte"
    return whole


def _transport(body: bytes, content_type: str, seen: list[httpx2.Request] | None) -> httpx2.MockTransport:
    def answer(request: httpx2.Request) -> httpx2.Response:
        if seen is not None:
            seen.append(request)
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return httpx2.MockTransport(answer)


def anthropic_client(
    body: bytes, content_type: str = "text/event-stream", seen: list[httpx2.Request] | None = None
) -> anthropic.Anthropic:
    """An ``anthropic`` client whose every request is answered 200 with ``body``."""
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://luftpause.test",
        max_retries=0,
        http_client=httpx2.Client(transport=_transport(body, content_type, seen)),
    )


def openai_client(
    body: bytes, content_type: str = "text/event-stream", seen: list[httpx2.Request] | None = None
) -> openai.OpenAI:
    """An ``openai`` client whose every request is answered 200 with ``body``."""
    return openai.OpenAI(
        api_key="k",
        base_url="http://luftpause.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=_transport(body, content_type, seen)),
    )


def sse_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of each event of a translated stream (written LF-only, one data line)."""
    out = []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out
