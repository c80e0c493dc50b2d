"""OpenAI Responses <-> Chat Completions translation (``luftpause.dataplane.apis``): request table
tests, and answers read back by the official ``openai`` SDK's typed stream events."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from api_helpers import (
    DONE,
    USAGE,
    chunk,
    openai_client,
    sse_events,
    stream_of,
    tool_delta,
    translate,
    translate_every_split,
)

from luftpause.dataplane.apis.errors import TranslationError, engine_refusal_body, error_body
from luftpause.dataplane.apis.models import ANTHROPIC_VERSION_HEADER, model_body, models_body, wants_anthropic
from luftpause.dataplane.apis.responses_request import call_output_ids, responses_to_chat
from luftpause.dataplane.apis.responses_stream import (
    ResponsesStream,
    StreamIncomplete,
    completion_to_response,
)

NAMESPACE_TOOL = {
    "type": "namespace",
    "name": "mcp__fake",
    "description": "Tools of the fake MCP server.",
    "tools": [
        {"type": "function", "name": "count_items", "parameters": {"type": "object"}, "strict": False},
        {"type": "function", "name": "pid", "description": "Its pid."},
    ],
}


def chat(**fields: Any) -> dict[str, Any]:
    return responses_to_chat({"model": "m", "input": [], **fields}).body


# --- requests ------------------------------------------------------------------------------------


def test_a_string_input_and_instructions() -> None:
    turn = responses_to_chat({"model": "m", "input": "hi", "instructions": "Be brief.", "store": False})
    assert turn.body == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }
    assert (turn.model, turn.stream, turn.tool_names) == ("m", False, {})
    assert turn.echo == {"instructions": "Be brief."}


def test_message_items_of_every_role_and_part() -> None:
    body = chat(
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            },
            {"role": "user", "content": "plain"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "low"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
        ]
    )
    assert body["messages"] == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "plain"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "ok"},
    ]


def test_function_calls_and_outputs_with_namespaces() -> None:
    turn = responses_to_chat(
        {
            "model": "m",
            "tools": [
                NAMESPACE_TOOL,
                {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            ],
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "count"}]},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "count_items",
                    "namespace": "mcp__fake",
                    "arguments": '{"limit": 3}',
                    "status": "completed",
                },
                {"type": "function_call", "call_id": "call_2", "name": "exec_command", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "id": "fco_1",
                    "call_id": "call_1",
                    "output": [
                        {"type": "input_text", "text": "Wall time: 0.1 s"},
                        {"type": "input_text", "text": "3"},
                    ],
                },
                {"type": "function_call_output", "call_id": "call_2", "output": "done"},
            ],
        }
    )
    assert [t["function"]["name"] for t in turn.body["tools"]] == [
        "mcp__fake__count_items",
        "mcp__fake__pid",
        "exec_command",
    ]
    assert turn.body["tools"][0]["function"] == {
        "name": "mcp__fake__count_items",
        "parameters": {"type": "object"},
        "strict": False,
    }
    assert turn.body["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert turn.tool_names == {
        "mcp__fake__count_items": ("mcp__fake", "count_items"),
        "mcp__fake__pid": ("mcp__fake", "pid"),
    }
    assert turn.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "mcp__fake__count_items", "arguments": '{"limit": 3}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Wall time: 0.1 s\n3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "done"},
    ]


def test_assistant_text_and_the_calls_after_it_are_one_chat_message() -> None:
    body = chat(
        input=[
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me check."}],
            },
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]
    )
    assert body["messages"] == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]


def test_parameters_and_ignored_bookkeeping() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    turn = responses_to_chat(
        {
            "model": "m",
            "input": "x",
            "stream": True,
            "max_output_tokens": 100,
            "temperature": 0.2,
            "top_p": 0.5,
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "name": "pid", "namespace": "mcp__fake"},
            "tools": [NAMESPACE_TOOL],
            "text": {
                "format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True},
                "verbosity": "low",
            },
            "reasoning": {"effort": "low", "summary": "auto"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k",
            "client_metadata": {"session_id": "s"},
            "safety_identifier": "u1",
        }
    )
    body = turn.body
    assert body["stream"] is True and body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["parallel_tool_calls"]) == (
        100,
        0.2,
        0.5,
        False,
    )
    assert body["tool_choice"] == {"type": "function", "function": {"name": "mcp__fake__pid"}}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert body["reasoning_effort"] == "low"
    assert body["user"] == "u1"
    for key in ("store", "include", "prompt_cache_key", "client_metadata", "text", "reasoning", "input"):
        assert key not in body
    assert turn.echo["max_output_tokens"] == 100 and turn.echo["tools"] == [NAMESPACE_TOOL]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "a"}]}, "tools[1]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": 5}, "input"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(TranslationError) as refused:
        responses_to_chat({"model": "m", "input": [], **fields})
    assert refused.value.param == param
    body = orjson.loads(error_body("responses", 400, str(refused.value), refused.value.param))
    assert body == {
        "error": {
            "message": str(refused.value),
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


def test_no_tool_choice_without_tools() -> None:
    body = chat(tools=[], tool_choice="auto", parallel_tool_calls=True)
    assert "tools" not in body and "tool_choice" not in body and "parallel_tool_calls" not in body


def test_previous_response_id_says_why() -> None:
    with pytest.raises(TranslationError, match="stores no responses"):
        responses_to_chat({"model": "m", "input": "x", "previous_response_id": "resp_1"})


def test_call_output_ids_are_the_latest_round() -> None:
    payload = {
        "input": [
            {"type": "function_call", "call_id": "old"},
            {"type": "function_call_output", "call_id": "old"},
            {"type": "message", "role": "assistant", "content": "x"},
            {"type": "reasoning", "summary": []},
            {"type": "function_call", "call_id": "a"},
            {"type": "function_call", "call_id": "b"},
            {"type": "function_call_output", "call_id": "a"},
            {"type": "function_call_output", "call_id": "b"},
        ]
    }
    assert call_output_ids(payload) == ["b", "a"]
    assert call_output_ids({"input": "text"}) == []


# --- answers, streamed ---------------------------------------------------------------------------

TOOL_NAMES = {"mcp__fake__count_items": ("mcp__fake", "count_items")}


def responses_stream() -> ResponsesStream:
    return ResponsesStream("resp_1", "m", 1700000000, {"instructions": "Be brief."}, TOOL_NAMES)


def final_response(body: bytes) -> tuple[list[str], Any]:
    client = openai_client(body)
    with client.responses.stream(model="m", input="hi") as stream:
        kinds: list[str] = [event.type for event in stream]
        return kinds, stream.get_final_response()


def test_a_text_answer_reads_back_as_a_completed_response() -> None:
    engine = stream_of(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo ✓"}),
        chunk({}, "stop"),
        chunk(usage=USAGE),
        DONE,
    )
    body = translate_every_split(responses_stream, engine)
    events = sse_events(body)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    kinds, response = final_response(body)
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert (response.id, response.status, response.output_text) == ("resp_1", "completed", "Hello ✓")
    assert response.instructions == "Be brief."
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        21,
        9,
        30,
    )
    assert response.usage.input_tokens_details.cached_tokens == 16


def test_reasoning_text_and_parallel_calls_are_items_in_order() -> None:
    engine = stream_of(
        chunk({"reasoning_content": "Plan."}),
        chunk({"content": "Calling."}),
        tool_delta(0, "call_a", "mcp__fake__count_items", '{"lim'),
        tool_delta(0, arguments='it": 3}'),
        tool_delta(1, "call_b", "exec_command", '{"cmd": "ls"}'),
        chunk({}, "tool_calls"),
        chunk(usage=USAGE),
        DONE,
    )
    translator = responses_stream()
    body = translate(lambda: translator, [engine])
    assert body == translate_every_split(responses_stream, engine)
    assert translator.tool_call_ids == ["call_a", "call_b"]
    kinds, response = final_response(body)
    assert "response.reasoning_text.delta" in kinds
    assert [item.type for item in response.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    first, second = response.output[2], response.output[3]
    assert isinstance(first, openai.types.responses.ResponseFunctionToolCall)
    assert isinstance(second, openai.types.responses.ResponseFunctionToolCall)
    assert (first.call_id, first.namespace, first.name, first.arguments) == (
        "call_a",
        "mcp__fake",
        "count_items",
        '{"limit": 3}',
    )
    assert (second.call_id, second.namespace, second.name, second.arguments) == (
        "call_b",
        None,
        "exec_command",
        '{"cmd": "ls"}',
    )
    assert response.status == "completed"
    reasoning = response.output[0]
    assert isinstance(reasoning, openai.types.responses.ResponseReasoningItem)
    assert reasoning.content is not None and reasoning.content[0].text == "Plan."


def test_a_call_without_an_id_gets_one_and_a_late_name_waits() -> None:
    engine = stream_of(tool_delta(0, arguments="{}"), tool_delta(0, name="f"), chunk({}, "tool_calls"), DONE)
    translator = responses_stream()
    _, response = final_response(translate(lambda: translator, [engine]))
    item = response.output[0]
    assert isinstance(item, openai.types.responses.ResponseFunctionToolCall)
    assert (item.call_id, item.name, item.arguments) == ("call_1_0", "f", "{}")
    assert translator.tool_call_ids == ["call_1_0"]


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_cut_answer_is_an_incomplete_response(finish: str, reason: str) -> None:
    engine = stream_of(chunk({"content": "abc"}), chunk({}, finish), DONE)
    client = openai_client(translate(responses_stream, [engine]))
    with client.responses.stream(model="m", input="hi") as stream:
        events = list(stream)  # the SDK's final response is for response.completed only
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseIncompleteEvent)
    response = last.response
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == reason
    assert response.output_text == "abc"
    assert getattr(response.output[0], "status", None) == "incomplete"


def test_an_engine_error_event_becomes_response_failed() -> None:
    engine = stream_of(
        chunk({"content": "par"}),
        b'data: {"error": {"message": "engine died", "code": 500}}\n\n',
        chunk({"content": "never"}),
        DONE,
    )
    translator = responses_stream()
    body = translate(lambda: translator, [engine])
    name, data = sse_events(body)[-1]
    assert name == "response.failed"
    assert data["response"]["error"] == {"code": "server_error", "message": "engine died"}
    assert b"never" not in body
    assert translator.scanner.error == "engine died"
    client = openai_client(body)
    with client.responses.stream(model="m", input="hi") as stream:
        kinds = [event.type for event in stream]
    assert kinds[-1] == "response.failed"


def test_a_stream_that_ends_unfinished_is_refused_at_finish() -> None:
    translator = responses_stream()
    translator.feed(chunk({"content": "cut"}))
    with pytest.raises(StreamIncomplete):
        translator.finish()


# --- answers, whole ------------------------------------------------------------------------------


def test_a_whole_completion_becomes_a_response_the_sdk_reads() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "ok",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "mcp__fake__count_items", "arguments": '{"limit": 1}'},
                        }
                    ],
                },
            }
        ],
        "usage": USAGE,
    }
    doc = completion_to_response(completion, "resp_7", "m", 1, {"store": False}, TOOL_NAMES)
    client = openai_client(orjson.dumps(doc), "application/json")
    response = client.responses.create(model="m", input="hi")
    assert response.id == "resp_7" and response.output_text == "ok"
    call = response.output[1]
    assert isinstance(call, openai.types.responses.ResponseFunctionToolCall)
    assert (call.call_id, call.namespace, call.name) == ("call_1", "mcp__fake", "count_items")
    assert response.usage is not None and response.usage.total_tokens == 30


def test_errors_in_openais_shape() -> None:
    assert orjson.loads(error_body("responses", 404, "no Generative replica serves model 'x'")) == {
        "error": {
            "message": "no Generative replica serves model 'x'",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert orjson.loads(error_body("responses", 502, "engine a: refused"))["error"]["type"] == "server_error"
    assert (
        orjson.loads(engine_refusal_body("responses", 429, b'{"error": "busy"}'))["error"]["message"]
        == "busy"
    )


def test_the_openai_sdk_lists_models_in_its_shape() -> None:
    seen: list[Any] = []
    client = openai_client(models_body(["a", "b"], anthropic=False), "application/json", seen)
    assert [(m.id, m.object, m.owned_by) for m in client.models.list()] == [
        ("a", "model", "luftpause"),
        ("b", "model", "luftpause"),
    ]
    assert not wants_anthropic(seen[0].headers.get(ANTHROPIC_VERSION_HEADER))
    body = model_body(["a"], "a", anthropic=False)
    assert body is not None and openai_client(body, "application/json").models.retrieve("a").id == "a"
