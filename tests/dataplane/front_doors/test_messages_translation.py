"""Anthropic Messages <-> Chat Completions translation (``luftpause.dataplane.apis``): request table
tests, and answers read back by the official ``anthropic`` SDK's own stream accumulation."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import orjson
import pytest
from api_helpers import (
    DONE,
    USAGE,
    anthropic_client,
    chunk,
    sse_events,
    stream_of,
    tool_delta,
    translate,
    translate_every_split,
)

from luftpause.dataplane.apis.errors import TranslationError, engine_refusal_body, error_body
from luftpause.dataplane.apis.messages_request import messages_to_chat, tool_result_ids
from luftpause.dataplane.apis.messages_stream import (
    MessagesStream,
    StreamIncomplete,
    TranslationBroken,
    completion_to_message,
)
from luftpause.dataplane.apis.models import ANTHROPIC_VERSION_HEADER, model_body, models_body, wants_anthropic

BASE = {"model": "m", "max_tokens": 64}


def chat(**fields: Any) -> dict[str, Any]:
    return messages_to_chat({**BASE, **fields}).body


# --- requests ------------------------------------------------------------------------------------


def test_minimal_request_keeps_model_and_max_tokens_and_is_not_streamed() -> None:
    turn = messages_to_chat({**BASE, "messages": [{"role": "user", "content": "hi"}]})
    assert turn.body == {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    assert (turn.model, turn.stream, turn.thinking, turn.stop_sequences) == ("m", False, False, ())


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("Be brief.", "Be brief."),
        (
            [
                {"type": "text", "text": "A"},
                {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}},
            ],
            "A\nB",
        ),
        # Claude Code's first block: per-session billing metadata, dropped so the prefix is shared
        (
            [
                {
                    "type": "text",
                    "text": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;",
                },
                {"type": "text", "text": "You are a Claude agent."},
            ],
            "You are a Claude agent.",
        ),
    ],
)
def test_system_prompt_becomes_the_first_system_message(system: Any, expected: str) -> None:
    body = chat(system=system, messages=[{"role": "user", "content": "hi"}])
    assert body["messages"][0] == {"role": "system", "content": expected}


def test_a_system_message_inside_messages_stays_in_place() -> None:
    body = chat(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "system", "content": "Available agent types: ..."},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
        ]
    )
    assert [m["role"] for m in body["messages"]] == ["user", "system", "user"]
    assert body["messages"][1]["content"] == "Available agent types: ..."


def test_text_blocks_join_and_images_become_image_url_parts() -> None:
    body = chat(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        ]
    )
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
        {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
    ]
    assert body["messages"][1] == {"role": "user", "content": "one\ntwo"}


def test_tool_use_and_tool_result_round_trip_with_the_ids_unchanged() -> None:
    body = chat(
        messages=[
            {"role": "user", "content": "count"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "toolu_01", "name": "count", "input": {"limit": 3}},
                    {"type": "tool_use", "id": "toolu_02", "name": "pid", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "3"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_02",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "no pid"},
                            {"type": "image", "source": {"type": "url", "url": "https://example.org/p.png"}},
                        ],
                    },
                    {"type": "text", "text": "and then?"},
                ],
            },
        ]
    )
    assistant, first, second, images, after = body["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": "Calling.",
        "reasoning_content": "hmm",
        "tool_calls": [
            {"id": "toolu_01", "type": "function", "function": {"name": "count", "arguments": '{"limit":3}'}},
            {"id": "toolu_02", "type": "function", "function": {"name": "pid", "arguments": "{}"}},
        ],
    }
    assert first == {"role": "tool", "tool_call_id": "toolu_01", "content": "3"}
    assert second == {"role": "tool", "tool_call_id": "toolu_02", "content": "Error: no pid"}
    assert images["role"] == "user"
    assert images["content"][1] == {"type": "image_url", "image_url": {"url": "https://example.org/p.png"}}
    assert after == {"role": "user", "content": "and then?"}


def test_an_assistant_turn_of_only_thinking_is_kept_as_an_empty_turn_with_its_reasoning() -> None:
    body = chat(
        messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]
    )
    assert body["messages"] == [{"role": "assistant", "content": "", "reasoning_content": "x"}]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        ({"type": "tool", "name": "count"}, {"type": "function", "function": {"name": "count"}}, None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any, parallel: bool | None) -> None:
    tools = [{"name": "count", "input_schema": {"type": "object"}}]
    body = chat(messages=[], tool_choice=choice, tools=tools)
    assert body["tool_choice"] == expected
    assert body.get("parallel_tool_calls") == parallel
    without = chat(messages=[], tool_choice=choice)  # vLLM refuses a tool choice without tools
    assert "tool_choice" not in without and "parallel_tool_calls" not in without


def test_tools_sampling_stops_metadata_and_stream() -> None:
    schema = {"type": "object", "properties": {"limit": {"type": "integer"}}}
    turn = messages_to_chat(
        {
            **BASE,
            "messages": [],
            "tools": [
                {
                    "name": "count",
                    "description": "Count.",
                    "input_schema": schema,
                    "cache_control": {"type": "x"},
                }
            ],
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "metadata": {"user_id": '{"session_id":"s1"}'},
            "stream": True,
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
        }
    )
    assert turn.body == {
        "model": "m",
        "max_tokens": 64,
        "messages": [],
        "tools": [
            {"type": "function", "function": {"name": "count", "description": "Count.", "parameters": schema}}
        ],
        "stop": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "user": '{"session_id":"s1"}',
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "chat_template_kwargs": {"enable_thinking": True},
    }
    assert turn.stream and turn.thinking and turn.stop_sequences == ("END",)


def test_output_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = chat(messages=[], output_config={"format": {"type": "json_schema", "schema": schema}})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"mcp_servers": [{"url": "http://x"}]}, "mcp_servers"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": ""}, "model"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"thinking": {"type": "maybe"}}, "thinking.type"),
        ({"output_config": {"format": {"type": "regex"}}}, "output_config.format.type"),
        ({"metadata": {"user_id": "u", "tenant": "t"}}, "metadata.tenant"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as refused:
        messages_to_chat({**BASE, "messages": [], **fields})
    assert refused.value.param == param
    assert refused.value.status == 400
    body = orjson.loads(error_body("messages", 400, str(refused.value), refused.value.param))
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert param in body["error"]["message"]


def test_tool_result_ids_are_the_latest_round() -> None:
    payload = {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_old", "name": "a", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_old", "content": "x"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_a", "name": "a", "input": {}},
                    {"type": "tool_use", "id": "toolu_b", "name": "a", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "x"},
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"},
                ],
            },
        ]
    }
    assert tool_result_ids(payload) == ["toolu_b", "toolu_a"]
    assert tool_result_ids({"messages": [{"role": "user", "content": "hi"}]}) == []
    assert tool_result_ids({"messages": "nonsense"}) == []


# --- answers, streamed ---------------------------------------------------------------------------


def messages_stream(**kwargs: Any) -> MessagesStream:
    return MessagesStream("m", "msg_1", **kwargs)


def final_message(body: bytes) -> anthropic.types.Message:
    client = anthropic_client(body)
    with client.messages.stream(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        return stream.get_final_message()


def test_a_text_answer_reads_back_with_usage_and_end_turn() -> None:
    engine = stream_of(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo ✓"}),
        chunk({}, "stop"),
        chunk(usage=USAGE),
        DONE,
    )
    body = translate_every_split(messages_stream, engine)
    names = [name for name, _ in sse_events(body)]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = final_message(body)
    assert message.id == "msg_1"
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "Hello ✓")]
    assert message.stop_reason == "end_turn"
    # Anthropic counts cache reads apart: 21 prompt tokens of which 16 were cached
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 9)
    assert message.usage.cache_read_input_tokens == 16


def test_text_then_parallel_tool_calls_are_separate_blocks_with_the_engines_ids() -> None:
    engine = stream_of(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me look."}),
        tool_delta(0, "call_a", "lookup", ""),
        tool_delta(0, arguments='{"query": "ma'),
        tool_delta(0, arguments='ars"}'),
        tool_delta(1, "call_b", "count", '{"limit": 2}'),
        chunk({}, "tool_calls"),
        chunk(usage=USAGE),
        DONE,
    )
    translator = messages_stream()
    body = translate(lambda: translator, [engine])
    assert translator.tool_call_ids == ["call_a", "call_b"]
    assert body == translate_every_split(messages_stream, engine)
    message = final_message(body)
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    first, second = message.content[1], message.content[2]
    assert isinstance(first, anthropic.types.ToolUseBlock) and isinstance(
        second, anthropic.types.ToolUseBlock
    )
    assert (first.id, first.name, first.input) == ("call_a", "lookup", {"query": "maars"})
    assert (second.id, second.name, second.input) == ("call_b", "count", {"limit": 2})
    assert message.stop_reason == "tool_use"


def test_a_tool_call_named_after_its_first_fragment_and_one_without_id() -> None:
    engine = stream_of(
        tool_delta(0, arguments='{"a"'),
        tool_delta(0, name="late"),
        tool_delta(0, arguments=": 1}"),
        chunk({}, "stop"),  # some engines say stop after tool calls: still tool_use
        DONE,
    )
    translator = messages_stream()
    message = final_message(translate(lambda: translator, [engine]))
    block = message.content[0]
    assert isinstance(block, anthropic.types.ToolUseBlock)
    assert (block.id, block.name, block.input) == ("toolu_msg_1_0", "late", {"a": 1})
    assert translator.tool_call_ids == ["toolu_msg_1_0"]
    assert message.stop_reason == "tool_use"


def test_reasoning_the_engine_streams_is_a_thinking_block_whatever_the_request_said() -> None:
    engine = stream_of(
        chunk({"reasoning_content": "Think "}),
        chunk({"reasoning_content": "twice."}),
        chunk({"content": "Done."}),
        chunk({}, "stop"),
        DONE,
    )
    message = final_message(translate_every_split(messages_stream, engine))
    kinds = [(b.type, getattr(b, "thinking", getattr(b, "text", None))) for b in message.content]
    assert kinds == [("thinking", "Think twice."), ("text", "Done.")]


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),  # vLLM names the matched stop string
        ("stop", {"matched_stop": "END"}, "stop_sequence", "END"),  # SGLang
        ("stop", {"stop_reason": "OTHER"}, "end_turn", None),  # not one of the request's stop sequences
        ("length", {}, "max_tokens", None),
        ("content_filter", {}, "refusal", None),
    ],
)
def test_stop_reasons(finish: str, extra: dict[str, Any], reason: str, sequence: str | None) -> None:
    engine = stream_of(chunk({"content": "x"}), chunk({}, finish, **extra), DONE)
    message = final_message(translate(lambda: messages_stream(stop_sequences=("END",)), [engine]))
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def test_an_engine_error_event_becomes_an_anthropic_error_event_and_ends_the_answer() -> None:
    engine = stream_of(
        chunk({"content": "par"}),
        b'data: {"error": {"object": "error", "message": "out of KV cache", "code": 500}}\n\n',
        chunk({"content": "never sent"}),
        DONE,
    )
    translator = messages_stream()
    body = translate(lambda: translator, [engine])
    assert [name for name, _ in sse_events(body)][-2:] == ["content_block_stop", "error"]
    assert b"never sent" not in body
    assert translator.scanner.error == "out of KV cache"  # the relay reports the turn failed
    with pytest.raises(anthropic.APIStatusError, match="out of KV cache"):
        final_message(body)


def test_a_stream_that_ends_unfinished_is_refused_at_finish() -> None:
    translator = messages_stream()
    translator.feed(stream_of(chunk({"content": "cut"})))
    with pytest.raises(StreamIncomplete):
        translator.finish()


def test_done_without_a_finish_reason_is_a_finished_answer() -> None:
    message = final_message(translate(messages_stream, [stream_of(chunk({"content": "ok"}), DONE)]))
    assert message.stop_reason == "end_turn"


def test_an_event_too_large_to_translate_breaks_the_stream_instead_of_losing_it() -> None:
    translator = messages_stream()
    huge = b"data: " + b"x" * (translator.scanner.max_event_bytes + 1) + b"\n\n"
    with pytest.raises(TranslationBroken):
        translator.feed(huge)


def test_start_sends_message_start_once() -> None:
    translator = messages_stream()
    opened = translator.start()
    assert [name for name, _ in sse_events(opened)] == ["message_start", "ping"]
    assert translator.start() == b""
    assert not translator.feed(chunk({"content": "x"})).startswith(b"event: message_start")


# --- answers, whole ------------------------------------------------------------------------------


def test_a_whole_completion_becomes_a_message_the_sdk_reads() -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Counting.",
                    "reasoning_content": "plan",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "count", "arguments": '{"n": 1}'},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "bad", "arguments": "not json"},
                        },
                    ],
                },
            }
        ],
        "usage": USAGE,
    }
    doc = completion_to_message(completion, "m", "msg_9")
    client = anthropic_client(orjson.dumps(doc), "application/json")
    message = client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[2].input == {"n": 1}  # type: ignore[union-attr]
    assert message.content[3].input == {"_raw_arguments": "not json"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 9)


def test_a_whole_completion_stopped_by_length() -> None:
    doc = completion_to_message(
        {"choices": [{"index": 0, "finish_reason": "length", "message": {"content": "abc"}}]}, "m", "msg_2"
    )
    assert doc["stop_reason"] == "max_tokens"
    assert doc["content"] == [{"type": "text", "text": "abc"}]
    assert doc["usage"] == {"input_tokens": 0, "output_tokens": 0}


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (599, "api_error"),
    ],
)
def test_error_shapes_by_status(status: int, kind: str) -> None:
    assert orjson.loads(error_body("messages", status, "why")) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_an_engines_refusal_is_reshaped_keeping_its_message() -> None:
    body = json.dumps({"error": {"message": "queue full", "type": "server_error", "code": 429}}).encode()
    assert orjson.loads(engine_refusal_body("messages", 429, body)) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "queue full"},
    }
    assert orjson.loads(engine_refusal_body("messages", 503, b"<html>down</html>"))["error"]["message"] == (
        "<html>down</html>"
    )
    assert (
        orjson.loads(engine_refusal_body("messages", 500, b""))["error"]["message"] == "engine answered 500"
    )


# --- GET /v1/models ------------------------------------------------------------------------------


def test_the_anthropic_sdk_lists_and_retrieves_models_in_its_shape() -> None:
    seen: list[Any] = []
    client = anthropic_client(models_body(["a", "b"], anthropic=True), "application/json", seen)
    assert [(m.id, m.type, m.display_name) for m in client.models.list()] == [
        ("a", "model", "a"),
        ("b", "model", "b"),
    ]
    assert len(seen) == 1  # one page: has_more is false
    assert wants_anthropic(seen[0].headers.get(ANTHROPIC_VERSION_HEADER))
    body = model_body(["a", "b"], "b", anthropic=True)
    assert body is not None
    model = anthropic_client(body, "application/json").models.retrieve("b")
    assert (model.id, model.created_at.year) == ("b", 1970)
    assert model_body(["a"], "zzz", anthropic=True) is None
