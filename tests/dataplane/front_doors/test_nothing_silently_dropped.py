"""Nothing silently dropped: a tool, field or content kind the translation cannot serve is refused
with the API's own error naming it, or served (docs/front-doors.md, the mapping tables)."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.dataplane.apis.errors import TranslationError
from luftpause.dataplane.apis.messages_request import messages_to_chat
from luftpause.dataplane.apis.responses_request import responses_to_chat

MESSAGES = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES: dict[str, Any] = {"model": "m", "input": "hi"}


@pytest.mark.parametrize("kind", ["web_search", "web_search_preview"])
def test_a_responses_web_search_tool_is_refused_as_messages_refuses_server_tools(kind: str) -> None:
    tools = [{"type": "function", "name": "read", "parameters": {}}, {"type": kind}]
    with pytest.raises(TranslationError, match=kind) as refused:
        responses_to_chat({**RESPONSES, "tools": tools})
    assert refused.value.param == "tools[1].type"
    with pytest.raises(TranslationError) as also:
        messages_to_chat({**MESSAGES, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert also.value.param == "tools[0].type"


def test_store_true_is_refused_and_false_or_absent_served() -> None:
    with pytest.raises(TranslationError, match="store") as refused:
        responses_to_chat({**RESPONSES, "store": True})
    assert refused.value.param == "store"
    assert responses_to_chat({**RESPONSES, "store": False}).body["messages"][-1]["content"] == "hi"
    assert "store" not in responses_to_chat(RESPONSES).body


@pytest.mark.parametrize(
    ("thinking", "enabled"),
    [
        ({"type": "adaptive"}, True),
        ({"type": "enabled", "budget_tokens": 1024}, True),
        ({"type": "disabled"}, False),
    ],
)
def test_messages_thinking_asks_the_chat_template_for_it_or_not(
    thinking: dict[str, Any], enabled: bool
) -> None:
    body = messages_to_chat({**MESSAGES, "thinking": thinking}).body
    assert body["chat_template_kwargs"] == {"enable_thinking": enabled}
    assert "chat_template_kwargs" not in messages_to_chat(MESSAGES).body


def test_past_thinking_blocks_go_back_as_the_assistants_reasoning_content() -> None:
    body = messages_to_chat(
        {
            **MESSAGES,
            "messages": [
                {"role": "user", "content": "count"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Count first.", "signature": ""},
                        {"type": "tool_use", "id": "call_1", "name": "count", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "3"}],
                },
            ],
        }
    ).body
    assistant = body["messages"][1]
    assert assistant["reasoning_content"] == "Count first."
    assert assistant["tool_calls"][0]["id"] == "call_1"


def test_redacted_thinking_is_refused_naming_it() -> None:
    with pytest.raises(TranslationError, match="redacted_thinking") as refused:
        messages_to_chat(
            {
                **MESSAGES,
                "messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}],
            }
        )
    assert refused.value.param == "messages[0].content[0].type"


def test_past_reasoning_items_go_back_as_the_assistants_reasoning_content() -> None:
    body = responses_to_chat(
        {
            **RESPONSES,
            "input": [
                {"type": "message", "role": "user", "content": "count"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Count first."}],
                },
                {"type": "function_call", "call_id": "call_1", "name": "count", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "3"},
                {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Say it."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3."}]},
            ],
        }
    ).body
    roles = [(m["role"], m.get("reasoning_content")) for m in body["messages"]]
    assert roles == [("user", None), ("assistant", "Count first."), ("tool", None), ("assistant", "Say it.")]
    assert body["messages"][3]["content"] == "3."


def test_a_reasoning_item_with_only_encrypted_content_is_refused() -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA..."}
    with pytest.raises(TranslationError) as refused:
        responses_to_chat({**RESPONSES, "input": [item, {"role": "user", "content": "go on"}]})
    assert refused.value.param == "input[0].encrypted_content"
