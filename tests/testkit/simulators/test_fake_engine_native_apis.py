"""The simulated engine serving Anthropic Messages and OpenAI Responses natively (``--apis``), read
by the official ``anthropic`` and ``openai`` clients, and its faults in each API's shape; a model
with a fault of its own (``--model-fault``)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from luftpause.testkit.commands.fake_engine import add_arguments, settings_from_args
from luftpause.testkit.engine import EngineSettings, RunningEngine
from luftpause.testkit.engine.faults import StatusFault, parse_fault_option

pytestmark = pytest.mark.anyio

EngineFactory = Callable[..., Awaitable[RunningEngine]]
MODEL = EngineSettings().models[0]
NATIVE = ("chat", "messages", "responses")
TOOL = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def test_messages_streamed_and_whole_through_the_anthropic_client(make_engine: EngineFactory) -> None:
    engine = await make_engine(apis=NATIVE, decode_ms=0.1)
    client = anthropic.AsyncAnthropic(base_url=engine.url, api_key="unused")
    tools: Any = [{"name": "count", "description": "counts", "input_schema": TOOL}]
    async with client.messages.stream(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "count things"}], tools=tools
    ) as stream:
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "count" and isinstance(call.input["n"], int)
    assert call.id.startswith("toolu_")  # the engine's own ids, never a translator's call_...
    # the tool round answered: the simulated model says what it saw
    answer = await client.messages.create(
        model=MODEL,
        max_tokens=8,
        tools=tools,
        messages=[
            {"role": "user", "content": "count things"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": "count", "input": call.input}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"}]},
            {"role": "user", "content": "and now?"},
        ],
        tool_choice={"type": "none"},
    )
    assert answer.stop_reason == "end_turn" and answer.usage.output_tokens == 8
    await client.close()
    assert answer.content[0].type == "text" and answer.content[0].text.startswith("I saw")


async def test_responses_streamed_and_whole_through_the_openai_client(make_engine: EngineFactory) -> None:
    engine = await make_engine(apis=NATIVE, decode_ms=0.1)
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused")
    tools: Any = [{"type": "function", "name": "count", "parameters": TOOL, "strict": False}]
    stream = await client.responses.create(model=MODEL, input="count", tools=tools, stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    call = completed.response.output[-1]
    assert call.type == "function_call" and call.name == "count" and orjson.loads(call.arguments)["n"] >= 0
    whole = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "count"},
            {"type": "function_call", "call_id": call.call_id, "name": "count", "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
        ],
        tools=tools,
        tool_choice="none",
        max_output_tokens=30,
    )
    assert whole.status == "completed" and whole.output_text.startswith("I saw 1 tool result.")
    cut = await client.responses.create(model=MODEL, input="hello", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    await client.close()


async def test_a_route_not_served_is_404(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/messages", "/v1/responses"):
            async with session.post(engine.url + path, json={"model": MODEL}) as response:
                assert response.status == 404


async def test_faults_in_each_apis_shape(make_engine: EngineFactory) -> None:
    engine = await make_engine(apis=NATIVE, decode_ms=0.1)
    client = anthropic.AsyncAnthropic(base_url=engine.url, api_key="unused", max_retries=0)
    fault = {"kind": "status", "status": 429, "retry_after": 3}
    with pytest.raises(anthropic.RateLimitError) as refused:
        await client.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"luftpause_fault": fault},
        )
    assert refused.value.response.headers["retry-after"] == "3"
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "simulated engine fault: status 429"},
    }
    with pytest.raises(anthropic.APIStatusError) as failed:
        async with client.messages.stream(
            model=MODEL,
            max_tokens=20,
            messages=[{"role": "user", "content": "x"}],
            extra_body={
                "luftpause_fault": {"kind": "error_mid_stream", "after_chunks": 3, "message": "boom"}
            },
        ) as stream:
            async for _ in stream:
                pass
    assert "boom" in str(failed.value)
    responses = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)
    stream = await responses.responses.create(
        model=MODEL,
        input="x",
        stream=True,
        extra_body={"luftpause_fault": {"kind": "error_mid_stream", "after_chunks": 3, "message": "boom"}},
    )
    last = [event async for event in stream][-1]
    assert last.type == "response.failed" and last.response.error is not None
    assert last.response.error.message == "boom"
    await client.close()
    await responses.close()


async def test_a_model_with_a_fault_of_its_own(make_engine: EngineFactory) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--model-fault", 'broken={"kind": "status", "status": 503}', "--apis", "messages"]
    )
    settings = settings_from_args(args)
    assert settings.models == ("broken",) and settings.apis == ("chat", "messages")
    assert settings.model_fault("broken") == StatusFault(503)
    engine = await make_engine(
        models=(MODEL, "broken"), model_faults=(("broken", parse_fault_option("close")),)
    )
    async with aiohttp.ClientSession() as session:
        body = {"model": "broken", "messages": [{"role": "user", "content": "x"}]}
        with pytest.raises(aiohttp.ClientError):
            async with session.post(engine.url + "/v1/chat/completions", json=body) as response:
                await response.read()
        body["model"] = MODEL
        async with session.post(engine.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
    with pytest.raises(ValueError, match="not served"):
        EngineSettings(model_faults=(("elsewhere", StatusFault()),))
