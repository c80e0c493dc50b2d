"""The facts of natively served Messages and Responses answers (``luftpause.dataplane.apis.facts``):
what the relay reports to the scheduler when it passes such an answer through unchanged.

The yardstick is the chat scanner: a Chat Completions stream translated to either API must give
the same facts read natively as the chat scanner read from the original. Hand-written streams in
each API's own formatting (the capture server's, spaced JSON as some servers write it) and every
cut of a stream check the rest. Every case runs on both twins (``py`` and the compiled ``c``), and
random streams must give both the same facts."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from api_helpers import DONE, USAGE, chunk, stream_of, tool_delta, translate
from harness_capture import CaptureServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luftpause.dataplane.apis import _facts_py
from luftpause.dataplane.apis import facts as selected
from luftpause.dataplane.apis.facts import message_facts, response_facts
from luftpause.dataplane.apis.messages_stream import MessagesStream, completion_to_message
from luftpause.dataplane.apis.responses_stream import ResponsesStream, completion_to_response
from luftpause.dataplane.sse import NO_EXTENSIONS, SSEScanner

Facts = tuple[bool, str | None, bool, list[str], int, int, bool, str | None, bool]


@dataclass(frozen=True)
class Twin:
    """One twin's two scanner classes."""

    messages: Any
    responses: Any


TWINS = {"py": Twin(_facts_py.MessagesScanner, _facts_py.ResponsesScanner)}
if not NO_EXTENSIONS:
    # An ImportError here is a failure, not a skip: a normal install must have built the twin.
    _compiled: Any = importlib.import_module("luftpause.dataplane.apis._facts_c")
    TWINS["c"] = Twin(_compiled.MessagesScanner, _compiled.ResponsesScanner)


@pytest.fixture(params=["py", "c"])
def twin(request: pytest.FixtureRequest) -> Twin:
    if request.param not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    return TWINS[request.param]


def test_the_compiled_twins_are_the_ones_selected() -> None:
    if NO_EXTENSIONS:
        assert selected.MessagesScanner is _facts_py.MessagesScanner
        return
    assert selected.USING_EXTENSION
    assert (selected.MessagesScanner, selected.ResponsesScanner) == (
        TWINS["c"].messages,
        TWINS["c"].responses,
    )


CHAT_STREAMS = {
    "text": stream_of(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "hi"}),
        chunk({}, "stop"),
        chunk(usage=USAGE),
        DONE,
    ),
    "tools": stream_of(
        chunk({"content": "x"}),
        tool_delta(0, "call_a", "f", '{"a":'),
        tool_delta(0, arguments="1}"),
        tool_delta(1, "call_b", "g", "{}"),
        chunk({}, "tool_calls"),
        chunk(usage=USAGE),
        DONE,
    ),
    "tool-first": stream_of(tool_delta(0, "call_z", "f", "{}"), chunk({}, "stop"), chunk(usage=USAGE), DONE),
    "length": stream_of(chunk({"content": "abc"}), chunk({}, "length"), chunk(usage=USAGE), DONE),
    "reasoning": stream_of(
        chunk({"reasoning_content": "hm"}), chunk({"content": "ok"}), chunk({}, "stop"), DONE
    ),
}


def facts(scanner: Any) -> Facts:
    return (
        scanner.first_token_seen,
        scanner.finish_reason,
        scanner.saw_tool_calls,
        list(scanner.tool_call_ids),
        scanner.prompt_tokens,
        scanner.completion_tokens,
        scanner.done,
        scanner.error,
        scanner.choices_finished,  # an answer of these APIs is one choice: set with its end
    )


def as_answered(chat_facts: Facts) -> Facts:
    """Both APIs require token counts: an engine that reported no usage is answered with 0."""
    first, finish, tools, ids, prompt, completion, done, error, finished = chat_facts
    return first, finish, tools, ids, max(prompt, 0), max(completion, 0), done, error, finished


def scan(scanner: Any, body: bytes, pieces: int | None = None) -> Any:
    if pieces is None:
        scanner.feed(body)
    else:
        for i in range(0, len(body), pieces):
            scanner.feed(body[i : i + pieces])
    return scanner


@pytest.mark.parametrize("name", sorted(CHAT_STREAMS))
def test_a_translated_messages_stream_says_what_the_chat_stream_said(twin: Twin, name: str) -> None:
    chat = CHAT_STREAMS[name]
    expected = as_answered(facts(scan(SSEScanner(), chat)))
    native = translate(lambda: MessagesStream("m", "msg_1"), [chat])
    assert facts(scan(twin.messages(), native)) == expected
    assert facts(scan(twin.messages(), native, pieces=1)) == expected


@pytest.mark.parametrize("name", sorted(CHAT_STREAMS))
def test_a_translated_responses_stream_says_what_the_chat_stream_said(twin: Twin, name: str) -> None:
    chat = CHAT_STREAMS[name]
    expected = as_answered(facts(scan(SSEScanner(), chat)))
    native = translate(lambda: ResponsesStream("resp_1", "m", 1), [chat])
    assert facts(scan(twin.responses(), native)) == expected
    assert facts(scan(twin.responses(), native, pieces=1)) == expected


def test_every_cut_of_a_native_stream_gives_the_same_facts(twin: Twin) -> None:
    native = translate(lambda: MessagesStream("m", "msg_1"), [CHAT_STREAMS["tools"]])
    whole = facts(scan(twin.messages(), native))
    for i in range(1, len(native)):
        scanner = twin.messages()
        first = scanner.feed(native[:i])
        second = scanner.feed(native[i:])
        assert facts(scanner) == whole, i
        assert first + second == 1  # the first token is reported in exactly one read


def sse(events: list[tuple[str, Any]], spaced: bool) -> bytes:
    dump = json.dumps if spaced else (lambda d: json.dumps(d, separators=(",", ":")))
    return b"".join(f"event: {name}\r\ndata: {dump(data)}\r\n\r\n".encode() for name, data in events)


@pytest.mark.parametrize("spaced", [True, False])
def test_an_anthropic_style_stream_with_cache_counts_and_a_tool(twin: Twin, spaced: bool) -> None:
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "content": [],
                    "usage": {
                        "input_tokens": 5,
                        "cache_read_input_tokens": 90,
                        "cache_creation_input_tokens": 5,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}},
        ),
    ]
    scanner = scan(twin.messages(), sse(events, spaced))
    assert not scanner.first_token_seen  # an empty text delta is no token
    assert scanner.prompt_tokens == 100 and scanner.completion_tokens == 1
    more = [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_01A", "name": "f", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{}"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 12},
            },
        ),
    ]
    assert scanner.feed(sse(more, spaced)) is True
    assert (scanner.tool_call_ids, scanner.finish_reason, scanner.stop_reason) == (
        ["toolu_01A"],
        "tool_calls",
        "tool_use",
    )
    assert (scanner.prompt_tokens, scanner.completion_tokens, scanner.done) == (100, 12, False)
    scanner.feed(sse([("message_stop", {"type": "message_stop"})], spaced))
    assert scanner.done


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("something_new", "something_new"),
    ],
)
def test_messages_stop_reasons_in_chat_terms(twin: Twin, reason: str, finish: str) -> None:
    scanner = scan(
        twin.messages(),
        sse(
            [("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {}})],
            True,
        ),
    )
    assert (scanner.finish_reason, scanner.stop_reason) == (finish, reason)


def test_error_events_of_both_apis(twin: Twin) -> None:
    anthropic_error = sse(
        [("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})], False
    )
    assert scan(twin.messages(), anthropic_error).error == "Overloaded"
    failed = sse(
        [
            (
                "response.failed",
                {
                    "type": "response.failed",
                    "sequence_number": 3,
                    "response": {
                        "id": "r",
                        "status": "failed",
                        "error": {"code": "server_error", "message": "boom"},
                    },
                },
            )
        ],
        False,
    )
    scanner = scan(twin.responses(), failed)
    assert (scanner.error, scanner.done) == ("boom", False)
    plain = sse([("error", {"type": "error", "code": "rate_limit_exceeded", "message": "slow down"})], False)
    assert scan(twin.responses(), plain).error == "slow down"
    assert scan(twin.responses(), sse([("error", {"type": "error"})], False)).error == "engine error"


def test_nonsense_is_read_past(twin: Twin) -> None:
    scanner = twin.messages(keep_events=True)
    scanner.feed(b'data: not json\n\ndata: [1, 2]\n\n: comment\n\ndata: {"type": 5}\n\n')
    assert scanner.event_count == 3 and len(scanner.events) == 3
    assert facts(scanner) == (False, None, False, [], -1, -1, False, None, False)


@pytest.mark.parametrize("tool", [None, "f"])
def test_the_capture_servers_hand_written_streams(twin: Twin, tool: str | None) -> None:
    """The capture server's replies, written from the API references (not by the translators)."""
    server = CaptureServer(tool=tool, tool_input={"a": 1}).start()
    try:
        import urllib.request

        def post(path: str, body: dict[str, Any]) -> bytes:
            request = urllib.request.Request(
                server.url + path,
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                data: bytes = answer.read()
                return data

        tools = [{"name": "f", "input_schema": {"type": "object"}}]
        messages = post(
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 5,
                "stream": True,
                "tools": tools,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        responses = post(
            "/v1/responses",
            {"model": "m", "stream": True, "input": "x", "tools": [{"type": "function", "name": "f"}]},
        )
    finally:
        server.stop()
    m, r = scan(twin.messages(), messages), scan(twin.responses(), responses)
    for scanner in (m, r):
        assert scanner.first_token_seen and scanner.done and scanner.error is None
        assert scanner.finish_reason == ("tool_calls" if tool else "stop")
        assert scanner.completion_tokens == 5 and scanner.prompt_tokens == 12
    assert m.tool_call_ids == (["toolu_capture0001"] if tool else [])
    assert r.tool_call_ids == (["call_capture0003"] if tool else [])


def test_whole_answers() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "content": "x",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            }
        ],
        "usage": USAGE,
    }
    message = orjson.dumps(completion_to_message(completion, "m", "msg_1"))
    assert message_facts(message) == ("tool_calls", True, 21, 9, ["call_1"])
    response = orjson.dumps(completion_to_response(completion, "resp_1", "m", 1))
    assert response_facts(response) == ("tool_calls", True, 21, 9, ["call_1"])
    text = {"choices": [{"index": 0, "finish_reason": "length", "message": {"content": "x"}}]}
    assert message_facts(orjson.dumps(completion_to_message(text, "m", "msg_1"))) == (
        "length",
        False,
        0,
        0,
        [],
    )
    assert response_facts(orjson.dumps(completion_to_response(text, "resp_1", "m", 1))) == (
        "length",
        False,
        0,
        0,
        [],
    )
    assert message_facts(b"nope") == ("", False, -1, -1, [])
    assert response_facts(b"[]") == ("", False, -1, -1, [])


def test_a_stream_cut_after_a_tool_call_began_says_no_finish_reason(twin: Twin) -> None:
    """The relay takes a finish reason as the answer's end: a tool call that merely began (its
    block started, its item added) must not set one, or a stream cut there ends cleanly."""
    messages = sse(
        [
            ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_cut", "name": "f", "input": {}},
                },
            ),
        ],
        False,
    )
    scanner = scan(twin.messages(), messages)
    assert (scanner.saw_tool_calls, scanner.tool_call_ids, scanner.finish_reason) == (
        True,
        ["toolu_cut"],
        None,
    )
    responses = sse(
        [
            (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {"type": "function_call", "id": "fc_1", "call_id": "call_cut", "name": "f"},
                },
            )
        ],
        False,
    )
    scanner = scan(twin.responses(), responses)
    assert (scanner.saw_tool_calls, scanner.tool_call_ids, scanner.finish_reason) == (
        True,
        ["call_cut"],
        None,
    )


# --- both twins on random streams ------------------------------------------------------------------

_TYPES = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "response.created",
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.output_item.added",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
]
_KEYS = [
    "type",
    "delta",
    "text",
    "thinking",
    "content_block",
    "id",
    "call_id",
    "item",
    "message",
    "usage",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "stop_reason",
    "response",
    "status",
    "output",
    "error",
    "incomplete_details",
    "reason",
]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=50),
    st.sampled_from(
        ["", "x", "tool_use", "function_call", "text_delta", "input_json_delta", "end_turn", "content_filter"]
    ),
    st.sampled_from(_TYPES),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    body = draw(st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=4))
    kind = draw(st.one_of(st.sampled_from(_TYPES), _VALUES))
    spaced = draw(st.booleans())
    doc = {"type": kind, **{k: v for k, v in body.items() if k != "type"}}
    return json.dumps(doc, separators=None if spaced else (",", ":")).encode()


def _native_facts(scanner: Any) -> tuple[Any, ...]:
    return (*facts(scanner), scanner.stop_reason, scanner.event_count, scanner.oversized_events)


@pytest.mark.skipif(NO_EXTENSIONS, reason="LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(_payloads(), max_size=8), data=st.data())
def test_both_twins_agree_on_random_streams(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    for kind in ("messages", "responses"):
        read = []
        for name in ("py", "c"):
            scanner = getattr(TWINS[name], kind)(max_event_bytes=400)
            firsts = [scanner.feed(piece) for piece in pieces]
            read.append((_native_facts(scanner), firsts.count(True)))
        assert read[0] == read[1], kind
