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
    usage_inline: dict[str, Any] | None = None,
    **choice: Any,
) -> bytes:
    """One ``data:`` event of a ``chat.completion.chunk`` (``usage`` alone: the usage-only chunk;
    ``usage_inline``: the usage a chunk carries beside its choice, as with vLLM's and SGLang's
    ``stream_options.continuous_usage_stats``)."""
    doc: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if usage is not None:
        doc["choices"] = []
        doc["usage"] = usage
    else:
        doc["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish, **choice}]
        if usage_inline is not None:
            doc["usage"] = usage_inline
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


def check_messages_order(body: bytes) -> None:
    """Assert a translated Messages stream is in an order Anthropic's API itself sends: one
    ``message_start`` first; blocks numbered from 0 as they start, one open at a time; each delta
    of the open block's kind (a ``tool_use`` block's ``partial_json`` together a JSON object, or
    empty); no delta after a stop; ``message_delta`` after every block closed, ``message_stop``
    last (or an ``error`` ending the stream)."""
    events = sse_events(body)
    assert events and events[0][0] == "message_start", "message_start first"
    open_block: dict[str, Any] | None = None
    opened = 0
    kinds = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
    arguments: list[str] = []
    ended = False
    for name, data in events[1:]:
        assert not ended, f"{name} after message_stop"
        assert name == data["type"]
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_block is None, "a block started while another was open"
            assert data["index"] == opened, "blocks numbered in order"
            open_block, arguments = data["content_block"], []
            opened += 1
        elif name == "content_block_delta":
            assert open_block is not None and data["index"] == opened - 1, "a delta for a block not open"
            assert data["delta"]["type"] == kinds[open_block["type"]]
            if open_block["type"] == "tool_use":
                arguments.append(data["delta"]["partial_json"])
        elif name == "content_block_stop":
            assert open_block is not None and data["index"] == opened - 1, "a stop for a block not open"
            if open_block["type"] == "tool_use" and "".join(arguments):
                assert isinstance(json.loads("".join(arguments)), dict), "a tool_use closed before whole"
            open_block = None
        elif name == "message_delta":
            assert open_block is None, "message_delta while a block was open"
        elif name in ("message_stop", "error"):
            ended = True
        else:
            raise AssertionError(f"unknown event {name}")
    assert ended, "the stream ends with message_stop or error"


def check_responses_order(body: bytes) -> None:
    """Assert a translated Responses stream is in an order OpenAI's API itself sends:
    ``sequence_number`` from 0 by 1; ``response.created`` then ``response.in_progress``; items
    added with ``output_index`` in order, one open at a time; deltas only for the open item; each
    ``.done`` carrying exactly what its deltas said (a call's arguments whole JSON, when given);
    ``output_item.done`` last for an item; the final response's output equal to the items done."""
    events = sse_events(body)
    assert [e[1]["sequence_number"] for e in events] == list(range(len(events)))
    assert [e[0] for e in events[:2]] == ["response.created", "response.in_progress"]
    items: list[dict[str, Any]] = []
    open_index: int | None = None
    said: list[str] = []
    for name, data in events[2:-1]:
        assert name == data["type"]
        if name == "response.output_item.added":
            assert open_index is None, "an item added while another was open"
            assert data["output_index"] == len(items)
            open_index, said = data["output_index"], []
            items.append(data["item"])
            continue
        assert open_index is not None and data["output_index"] == open_index, f"{name} for an item not open"
        if name.endswith(".delta"):
            said.append(data["delta"])
        elif name in ("response.output_text.done", "response.reasoning_text.done"):
            assert data["text"] == "".join(said)
        elif name == "response.function_call_arguments.done":
            assert data["arguments"] == "".join(said)
            if data["arguments"]:
                assert isinstance(json.loads(data["arguments"]), dict), "a call done before whole"
        elif name == "response.output_item.done":
            items[open_index] = data["item"]
            open_index = None
        else:
            assert name in ("response.content_part.added", "response.content_part.done"), name
    last, final = events[-1]
    assert last in ("response.completed", "response.incomplete", "response.failed")
    if last != "response.failed":  # a failed response may leave an item unfinished
        assert open_index is None, "the response ended with an item open"
        assert final["response"]["output"] == items
