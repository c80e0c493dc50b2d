"""Every tool call of a parallel batch reaches a Messages or Responses client whole, whatever the
engine's stream looks like; stop reasons match the content; the prompt's tokens come before the
first content. Each case is an engine stream that other gateways' translations got wrong, read back
by the official SDKs and checked for an event order the APIs themselves keep
(``api_helpers.check_*_order``)."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import pytest
from api_helpers import (
    DONE,
    USAGE,
    check_messages_order,
    check_responses_order,
    chunk,
    openai_client,
    sse_events,
    stream_of,
    tool_delta,
    translate,
    translate_every_split,
)
from test_messages_translation import final_message
from test_responses_translation import final_response

from luftpause.dataplane.apis.messages_stream import MessagesStream, TranslationBroken, completion_to_message
from luftpause.dataplane.apis.responses_stream import ResponsesStream, completion_to_response


def messages() -> MessagesStream:
    return MessagesStream("m", "msg_1")


def responses() -> ResponsesStream:
    return ResponsesStream("resp_1", "m", 1700000000)


def calls_of_message(body: bytes) -> list[tuple[str, str, Any]]:
    message = final_message(body)
    return [(b.id, b.name, b.input) for b in message.content if isinstance(b, anthropic.types.ToolUseBlock)]


def calls_of_response(body: bytes) -> list[tuple[str, str, Any]]:
    _, response = final_response(body)
    return [
        (item.call_id, item.name, json.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]


def both(engine: bytes) -> tuple[bytes, bytes]:
    """The stream translated for each API (the same at every cut), each in a valid order."""
    answer = translate_every_split(messages, engine)
    check_messages_order(answer)
    response = translate_every_split(responses, engine)
    check_responses_order(response)
    return answer, response


ONE_INDEX_DISTINCT_IDS = stream_of(
    chunk({"role": "assistant", "content": ""}),
    tool_delta(0, "call_a", "read", ""),
    tool_delta(0, arguments='{"path": "a.txt"}'),
    tool_delta(0, "call_b", "read", ""),
    tool_delta(0, arguments='{"path": "b.txt"}'),
    chunk({}, "tool_calls"),
    chunk(usage=USAGE),
    DONE,
)
"""Two parallel calls under one index, told apart by their ids (as some engines and chat templates
stream them); every fragment after a call's first carries no id."""

INTERLEAVED = stream_of(
    tool_delta(0, "call_a", "read", '{"pa'),
    tool_delta(1, "call_b", "grep", '{"pattern": "x"'),
    tool_delta(0, arguments='th": "a.txt"}'),
    tool_delta(1, arguments=', "limit": 2}'),
    chunk({}, "tool_calls"),
    DONE,
)
"""Fragments of two calls interleaved: call 0's arguments, then call 1's, then call 0's again."""

EXPECTED = [("call_a", "read", {"path": "a.txt"}), ("call_b", "read", {"path": "b.txt"})]


def test_parallel_calls_under_one_index_are_two_calls_with_their_own_ids() -> None:
    answer, response = both(ONE_INDEX_DISTINCT_IDS)
    assert calls_of_message(answer) == EXPECTED
    assert calls_of_response(response) == EXPECTED


def test_interleaved_fragments_give_each_call_whole_and_no_delta_after_a_stop() -> None:
    answer, response = both(INTERLEAVED)
    expected = [("call_a", "read", {"path": "a.txt"}), ("call_b", "grep", {"pattern": "x", "limit": 2})]
    assert calls_of_message(answer) == expected
    assert calls_of_response(response) == expected
    # every .done of the Responses stream carries the whole arguments (Codex acts on it)
    done = [d["arguments"] for n, d in sse_events(response) if n == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [c[2] for c in expected]


def test_ids_repeated_on_every_fragment_of_one_index_interleaved() -> None:
    engine = stream_of(
        tool_delta(0, "call_a", "read", '{"path":'),
        tool_delta(0, "call_b", "read", '{"path":'),
        tool_delta(0, "call_a", None, ' "a.txt"}'),
        tool_delta(0, "call_b", None, ' "b.txt"}'),
        chunk({}, "tool_calls"),
        DONE,
    )
    answer, response = both(engine)
    assert calls_of_message(answer) == EXPECTED
    assert calls_of_response(response) == EXPECTED


def test_an_id_reused_at_another_index_gets_a_fresh_one() -> None:
    engine = stream_of(
        tool_delta(0, "call_0", "read", '{"path": "a.txt"}'),
        tool_delta(1, "call_0", "read", '{"path": "b.txt"}'),
        chunk({}, "tool_calls"),
        DONE,
    )
    translator = messages()
    answer = translate(lambda: translator, [engine])
    check_messages_order(answer)
    assert translator.tool_call_ids == ["call_0", "toolu_msg_1_1"]
    assert [c[2] for c in calls_of_message(answer)] == [{"path": "a.txt"}, {"path": "b.txt"}]


def test_text_while_a_call_is_unfinished_waits_for_it() -> None:
    engine = stream_of(
        tool_delta(0, "call_a", "read", '{"path": '),
        chunk({"content": "Reading."}),
        tool_delta(0, arguments='"a.txt"}'),
        chunk({}, "tool_calls"),
        DONE,
    )
    answer, _response = both(engine)
    message = final_message(answer)
    assert [b.type for b in message.content] == ["tool_use", "text"]
    assert message.content[1].text == "Reading."  # type: ignore[union-attr]


def test_more_arguments_after_a_complete_object_break_the_stream() -> None:
    engine = stream_of(
        tool_delta(0, "call_a", "read", '{"path": "a.txt"}'),
        tool_delta(1, "call_b", "read", '{"path": "b.txt"}'),
        tool_delta(0, arguments='{"again": 1}'),
    )
    for make in (messages, responses):
        translator = make()
        with pytest.raises(TranslationBroken):
            translator.feed(engine)


@pytest.mark.parametrize("whitespace", [" ", "\n"])
def test_whitespace_after_a_complete_object_is_nothing(whitespace: str) -> None:
    engine = stream_of(
        tool_delta(0, "call_a", "read", '{"path": "a.txt"}'),
        tool_delta(1, "call_b", "read", '{"path": "b.txt"}'),
        tool_delta(0, arguments=whitespace),
        chunk({}, "tool_calls"),
        DONE,
    )
    answer, _response = both(engine)
    assert calls_of_message(answer) == EXPECTED


# --- stop reasons ----------------------------------------------------------------------------------

CLAIMED_CALLS = stream_of(chunk({"content": "No tool needed."}), chunk({}, "tool_calls"), DONE)


def test_an_engine_claiming_tool_calls_without_one_is_end_turn_streamed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        answer = translate(messages, [CLAIMED_CALLS])
    check_messages_order(answer)
    assert final_message(answer).stop_reason == "end_turn"
    assert "tool_calls but sent no tool call" in caplog.text
    response = translate(responses, [CLAIMED_CALLS])
    check_responses_order(response)
    assert final_response(response)[1].status == "completed"


def test_an_engine_claiming_tool_calls_without_one_is_end_turn_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completion = {
        "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "No."}}
        ],
        "usage": USAGE,
    }
    with caplog.at_level(logging.WARNING):
        message = completion_to_message(completion, "m", "msg_2")
    assert message["stop_reason"] == "end_turn"
    assert "message msg_2: the engine finished with tool_calls but sent no tool call" in caplog.text
    with caplog.at_level(logging.WARNING):
        response = completion_to_response(completion, "resp_2", "m", 1)
    assert response["status"] == "completed" and [i["type"] for i in response["output"]] == ["message"]
    assert "response resp_2: the engine finished with tool_calls but sent no tool call" in caplog.text


def test_a_call_delivered_after_a_stop_finish_is_tool_use() -> None:
    engine = stream_of(tool_delta(0, "call_a", "read", '{"path": "a.txt"}'), chunk({}, "stop"), DONE)
    assert final_message(translate(messages, [engine])).stop_reason == "tool_use"


# --- input tokens before the first content ---------------------------------------------------------

CONTINUOUS = {"prompt_tokens": 1234, "completion_tokens": 0, "total_tokens": 1234}


def test_message_start_carries_the_prompts_tokens_from_the_engines_first_chunk() -> None:
    engine = stream_of(
        chunk({"role": "assistant", "content": ""}, usage_inline=CONTINUOUS),
        chunk({"content": "Hi"}, usage_inline={**CONTINUOUS, "completion_tokens": 1, "total_tokens": 1235}),
        chunk({}, "stop", usage_inline={**CONTINUOUS, "completion_tokens": 2, "total_tokens": 1236}),
        DONE,
    )
    answer = translate_every_split(messages, engine)
    check_messages_order(answer)
    start = sse_events(answer)[0][1]
    assert start["message"]["usage"] == {"input_tokens": 1234, "output_tokens": 0}
    message = final_message(answer)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (1234, 2)


def test_response_created_carries_the_prompts_tokens() -> None:
    engine = stream_of(
        chunk({"role": "assistant", "content": ""}, usage_inline=CONTINUOUS),
        chunk({"content": "Hi"}, "stop", usage_inline={**CONTINUOUS, "completion_tokens": 1}),
        DONE,
    )
    response = translate_every_split(responses, engine)
    check_responses_order(response)
    created = sse_events(response)[0][1]["response"]
    assert created["usage"]["input_tokens"] == 1234 and created["usage"]["output_tokens"] == 0
    client = openai_client(response)
    with client.responses.stream(model="m", input="hi") as stream:
        first = next(iter(stream))
        assert first.type == "response.created" and first.response.usage is not None
        assert first.response.usage.input_tokens == 1234
        for _ in stream:
            pass


def test_an_engine_error_never_closes_a_call_whose_arguments_are_partial() -> None:
    engine = stream_of(
        tool_delta(0, "call_a", "read", '{"path": "a'),
        b'data: {"error": {"object": "error", "message": "out of KV cache", "code": 500}}\n\n',
    )
    answer = translate(messages, [engine])
    check_messages_order(answer)
    assert [name for name, _ in sse_events(answer)][-1] == "error"
    assert "content_block_stop" not in [name for name, _ in sse_events(answer)]
    response = translate(responses, [engine])
    check_responses_order(response)
    names = [name for name, _ in sse_events(response)]
    assert names[-1] == "response.failed" and "response.function_call_arguments.done" not in names
