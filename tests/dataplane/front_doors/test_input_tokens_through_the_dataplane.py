"""The prompt's tokens before the first content, and ``count_tokens``, through a real dataplane and
scheduler with the official clients: ``message_start.usage`` and ``response.created``'s usage
carry the count the engine makes (``stream_options.continuous_usage_stats``, which the simulator
honours as vLLM does), and ``POST /v1/messages/count_tokens`` answers the same count (the engine's
``/tokenize``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from front_door_helpers import NATIVE, TOKEN, TRANSLATED, FrontDoorStack, front_door_stack

TOOLS: Any = [{"name": "count", "description": "Count.", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoorStack]:
    with front_door_stack(tmp_path_factory.mktemp("input-tokens")) as running:
        yield running


@pytest.fixture
def claude(stack: FrontDoorStack) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=stack.url, api_key=TOKEN, max_retries=0)
    yield client
    client.close()


def _prompt() -> Any:
    # a prompt no earlier turn began with: nothing of it is in the engine's prefix cache
    return [{"role": "user", "content": f"{uuid.uuid4().hex} " + "tell me about the weather " * 40}]


@pytest.mark.parametrize("model", [TRANSLATED, NATIVE], ids=["translated", "native"])
def test_message_start_carries_the_count_that_count_tokens_answers(
    claude: anthropic.Anthropic, model: str
) -> None:
    prompt = _prompt()
    counted = claude.messages.count_tokens(model=model, messages=prompt, tools=TOOLS)
    with claude.messages.stream(model=model, max_tokens=16, messages=prompt, tools=TOOLS) as stream:
        first = next(iter(stream))
        for _ in stream:
            pass
        message = stream.get_final_message()
    assert first.type == "message_start"
    usage = first.message.usage
    at_start = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert at_start > 100
    assert counted.input_tokens == at_start
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == at_start


def test_response_created_carries_the_prompts_tokens(stack: FrontDoorStack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=TOKEN, max_retries=0)
    prompt = _prompt()[0]["content"]
    with client.responses.stream(model=TRANSLATED, input=prompt, max_output_tokens=16) as stream:
        first = next(iter(stream))
        for _ in stream:
            pass
        final = stream.get_final_response()
    client.close()
    assert first.type == "response.created" and first.response.usage is not None
    assert final.usage is not None and first.response.usage.input_tokens == final.usage.input_tokens > 100


def test_count_tokens_of_an_unknown_model_is_a_404_in_anthropics_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError, match="no-such-model"):
        claude.messages.count_tokens(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_count_tokens_refuses_what_a_turn_would_refuse(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="tools"):
        claude.messages.count_tokens(
            model=TRANSLATED,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
