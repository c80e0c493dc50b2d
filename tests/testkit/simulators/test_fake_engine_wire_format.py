"""The engine simulator (``luftpause fake-engine``): wire format, tool rounds, slots, metrics."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall
from prometheus_client.parser import text_string_to_metric_families

from luftpause.cli import main as cli_main
from luftpause.testkit.commands.fake_engine import add_arguments as add_engine_arguments
from luftpause.testkit.engine import RunningEngine
from luftpause.testkit.engine.faults import KINDS as FAULT_KINDS
from luftpause.testkit.engine.scheduling import EngineStats, SlotPool
from luftpause.testkit.engine.server import REQUEST_BYTES_KEPT, KeptRequestBodies
from luftpause.testkit.engine.toolargs import ArgumentMaker
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.anyio

MODEL = "llama-3.2-1b"

Factory = Callable[..., Awaitable[RunningEngine]]

# Any: the openai client types these as TypedDicts; the tests also send them as raw JSON.
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}

SEARCH_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search documents.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "default": 5},
                "exact": {"type": "boolean"},
                "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
                "filter": {"$ref": "#/$defs/Filter"},
                "owner": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
            },
            "required": ["query", "limit", "exact", "score", "tags", "filter", "owner"],
            "$defs": {
                "Filter": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string", "enum": ["title", "body"]},
                        "after": {"type": "string", "format": "date"},
                        "weights": {"type": "array", "items": {"type": "number", "minimum": 2}},
                    },
                    "required": ["field", "after", "weights"],
                }
            },
        },
    },
}

TOOLS: list[Any] = [WEATHER_TOOL, SEARCH_TOOL]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture
async def engine(make_engine: Factory) -> RunningEngine:
    return await make_engine(prefill_ms_per_1k=0.0, decode_ms=0.0)


def client_for(engine: RunningEngine) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def first_call(answer: ChatCompletion) -> ChatCompletionMessageFunctionToolCall:
    calls = answer.choices[0].message.tool_calls
    assert calls is not None and isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    return calls[0]


async def raw_sse(engine: RunningEngine, body: dict[str, Any]) -> tuple[str, list[Any]]:
    """POST ``body`` with ``stream: true``; the Content-Type and the decoded ``data:`` payloads."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(engine.url + "/v1/chat/completions", json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    events = text.split("\n\n")
    assert events[-1] == "", "the stream must end with a complete event"
    payloads: list[Any] = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        data = event[len("data: ") :]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return resp.headers["Content-Type"], payloads


async def metrics(session: aiohttp.ClientSession, engine: RunningEngine) -> dict[str, float]:
    async with session.get(engine.url + "/metrics") as resp:
        text = await resp.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model_name") == MODEL
    }


# --- answers -------------------------------------------------------------------------------------


async def test_non_streamed_answer_parses_with_the_openai_client(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=user("hello there"), max_tokens=12
        )
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None and choice.message.content.startswith("I saw 0 tool results.")
    assert choice.message.tool_calls is None
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 12
    per_message = [math.ceil(len(text) / 4) for text in ("You are terse.", "hello there")]
    assert answer.usage.prompt_tokens == sum(per_message)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 12


async def test_reply_length_defaults_to_the_engine_setting(make_engine: Factory) -> None:
    engine = await make_engine(decode_ms=0.0, max_tokens=9)
    async with client_for(engine) as client:
        for limit in (None, 0):
            kwargs: dict[str, Any] = {} if limit is None else {"max_tokens": limit}
            answer = await client.chat.completions.create(model=MODEL, messages=user("hi"), **kwargs)
            assert answer.usage is not None and answer.usage.completion_tokens == 9
        answer = await client.chat.completions.create(
            model=MODEL, messages=user("hi"), max_completion_tokens=15, max_tokens=3
        )
        assert answer.usage is not None and answer.usage.completion_tokens == 15


async def test_streamed_answer_parses_with_the_openai_client(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=user("hello"), max_tokens=10, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.created for c in chunks} == {chunks[0].created}
    assert {c.model for c in chunks} == {MODEL}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith("I saw 0 tool results.")
    assert len(chunks) == 1 + 10 + 1  # role chunk, one chunk per token, the finish chunk
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)


async def test_stream_follows_the_vllm_event_format(engine: RunningEngine) -> None:
    content_type, events = await raw_sse(
        engine,
        {
            "model": MODEL,
            "messages": user("hello"),
            "max_tokens": 3,
            "stream_options": {"include_usage": True},
        },
    )
    assert content_type == "text/event-stream"
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in chunks[1:-1]] == [
        {"content": "I"},
        {"content": " saw"},
        {"content": " 0"},
    ]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert all(c["object"] == "chat.completion.chunk" for c in [*chunks, usage_chunk])
    assert usage_chunk["choices"] == []
    assert usage_chunk["id"] == chunks[0]["id"]
    # Tokens are estimated per message, 4 characters a token, rounded up.
    prompt = math.ceil(len("You are terse.") / 4) + math.ceil(len("hello") / 4)
    assert usage_chunk["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 3,
        "total_tokens": prompt + 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert all(c["system_fingerprint"] == "luftpause-simulator" for c in [*chunks, usage_chunk])


async def test_the_bytes_sent_are_kept_for_a_relay_to_be_checked_against(engine: RunningEngine) -> None:
    body = {"model": MODEL, "messages": user("hello"), "max_tokens": 8}
    async with aiohttp.ClientSession() as session:
        for stream in (True, False):
            request = {**body, "stream": stream}
            async with session.post(engine.url + "/v1/chat/completions", json=request) as resp:
                received = await resp.read()
            first = received.split(b"\n", 1)[0].removeprefix(b"data: ") if stream else received
            completion_id = json.loads(first)["id"]
            async with session.get(f"{engine.url}/testkit/sent/{completion_id}") as resp:
                assert resp.status == 200
                assert await resp.read() == received
        async with session.get(f"{engine.url}/testkit/sent/chatcmpl-never") as resp:
            assert resp.status == 404


async def test_request_bodies_are_kept_within_a_byte_bound(engine: RunningEngine) -> None:
    # The simulator kept 256 whole bodies, up to 8 GiB at the dataplane's 32 MiB limit.
    assert engine.engine.request_bodies.limit_bytes == REQUEST_BYTES_KEPT
    engine.engine.request_bodies = KeptRequestBodies(limit_bytes=10_000)

    def body(size: int) -> bytes:
        """A chat request of exactly ``size`` bytes."""
        head = b'{"model": "%s", "max_tokens": 1, "messages": [{"role": "user", "content": "' % MODEL.encode()
        tail = b'"}]}'
        return head + b"x" * (size - len(head) - len(tail)) + tail

    async with aiohttp.ClientSession() as session:

        async def send(raw: bytes) -> str:
            async with session.post(
                engine.url + "/v1/chat/completions", data=raw, headers={"content-type": "application/json"}
            ) as resp:
                assert resp.status == 200
                completion_id: str = (await resp.json())["id"]
                return completion_id

        async def kept(completion_id: str) -> tuple[int, bytes]:
            async with session.get(f"{engine.url}/testkit/request/{completion_id}") as resp:
                return resp.status, await resp.read()

        bodies = [body(3_000) for _ in range(4)]
        ids = [await send(raw) for raw in bodies]
        # 12,000 bytes sent, 10,000 kept: the oldest body was dropped, the newest three are exact.
        assert (await kept(ids[0]))[0] == 404
        for completion_id, raw in zip(ids[1:], bodies[1:], strict=True):
            assert await kept(completion_id) == (200, raw)
        assert engine.engine.request_bodies.total_bytes == 9_000

        too_large = await send(body(10_001))
        status, answer = await kept(too_large)
        assert status == 404
        message = json.loads(answer)["error"]["message"]
        assert message.startswith(f"request body of {too_large} not kept: 10001 bytes")
        # What was kept before is still there.
        assert await kept(ids[3]) == (200, bodies[3])
        assert (await kept("chatcmpl-never"))[0] == 404


async def test_usage_chunk_only_when_asked(engine: RunningEngine) -> None:
    _, events = await raw_sse(engine, {"model": MODEL, "messages": user("hello"), "max_tokens": 4})
    assert all(e == "[DONE]" or e["choices"] for e in events)
    assert all(e == "[DONE]" or "usage" not in e for e in events)


async def test_short_limit_cuts_the_answer_with_finish_reason_length(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        answer = await client.chat.completions.create(model=MODEL, messages=user("hello"), max_tokens=2)
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content == "I saw"
    assert answer.usage is not None and answer.usage.completion_tokens == 2


async def test_first_token_logprobs(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=user("Is this review positive or negative? Answer yes or no."),
            max_tokens=1,
            logprobs=True,
            top_logprobs=4,
        )
    choice = answer.choices[0]
    assert choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    (first,) = choice.logprobs.content
    assert first.token == choice.message.content
    assert first.logprob < 0
    assert len(first.top_logprobs) == 4
    values = [t.logprob for t in first.top_logprobs]
    assert values == sorted(values, reverse=True)
    assert first.top_logprobs[0].token == first.token
    assert len({t.token for t in first.top_logprobs}) == 4
    assert sum(math.exp(v) for v in values) <= 1.0
    # The alternatives come from the prompt's words, so a label scorer finds its labels.
    assert {"positive", "negative"} & {t.token for t in first.top_logprobs}


async def test_logprobs_stream_with_each_content_token(engine: RunningEngine) -> None:
    _, events = await raw_sse(
        engine, {"model": MODEL, "messages": user("hi"), "max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    )
    tokens = [e for e in events[1:] if e != "[DONE]" and e["choices"][0]["delta"].get("content")]
    assert [t["choices"][0]["logprobs"]["content"][0]["token"] for t in tokens] == ["I", " saw"]
    assert all(len(t["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2 for t in tokens)


# --- tool rounds ---------------------------------------------------------------------------------


async def collect_streamed_calls(stream: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """Rebuild tool calls from streamed deltas as a harness does; (calls, finish_reason, text)."""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    text = ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or ():
            if delta.index not in calls:
                # The first delta of a call carries its id, type and name, and no argument text.
                assert delta.id is not None and delta.id.startswith("call_")
                assert delta.type == "function"
                assert delta.function is not None and delta.function.name
                assert delta.function.arguments == ""
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None and delta.type is None
                assert delta.function is not None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, text


async def test_tool_rounds_then_a_final_answer(engine: RunningEngine) -> None:
    messages = user("What is the weather in Lisbon this week?")
    seen_ids: set[str] = set()
    async with client_for(engine) as client:
        for _ in range(2):  # the engine's default: two tool rounds
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOLS, stream=True, max_tokens=500
            )
            calls, finish, text = await collect_streamed_calls(stream)
            assert finish == "tool_calls"
            assert text == ""
            assert len(calls) == 1
            (call,) = calls
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
            seen_ids.add(call["id"])
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"})
        final = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert len(seen_ids) == 2
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content is not None
    assert final.choices[0].message.content.startswith("I saw 2 tool results.")


async def test_non_streamed_tool_call(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=user("search the archive for budget reports"), tools=TOOLS
        )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = first_call(answer)
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert answer.usage is not None and answer.usage.completion_tokens >= 2


async def test_tool_choice_differs_between_conversations(engine: RunningEngine) -> None:
    names = set()
    async with client_for(engine) as client:
        for i in range(12):
            answer = await client.chat.completions.create(
                model=MODEL, messages=user(f"question number {i} about things"), tools=TOOLS
            )
            names.add(first_call(answer).function.name)
    assert names == {"get_weather", "search"}


async def test_parallel_tool_calls_give_one_or_two_calls(engine: RunningEngine) -> None:
    counts = set()
    async with client_for(engine) as client:
        for i in range(12):
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=user(f"compare cities {i}"),
                tools=TOOLS,
                parallel_tool_calls=True,
                stream=True,
            )
            calls, finish, _ = await collect_streamed_calls(stream)
            assert finish == "tool_calls"
            counts.add(len(calls))
            assert len({c["id"] for c in calls}) == len(calls)
            for call in calls:
                jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assert counts == {1, 2}


async def test_tool_choice_none_and_named(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        plain = await client.chat.completions.create(
            model=MODEL, messages=user("weather?"), tools=TOOLS, tool_choice="none"
        )
        assert plain.choices[0].finish_reason == "stop"
        for _ in range(3):
            named = await client.chat.completions.create(
                model=MODEL,
                messages=user("anything at all"),
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "search"}},
            )
            assert first_call(named).function.name == "search"


async def test_tool_call_cut_by_the_limit_ends_with_length(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=user("weather in Oslo"), tools=[WEATHER_TOOL], max_tokens=3
        )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 3


@pytest.mark.parametrize(
    "schema",
    [
        SCHEMAS["search"],
        SCHEMAS["get_weather"],
        {"type": "object", "properties": {}},
        {"type": "object"},
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5},
                "m": {"type": "integer", "maximum": -10},
                "k": {"type": "integer", "multipleOf": 7, "minimum": 10},
                "x": {"type": "number", "minimum": -1.5, "maximum": -1.0},
                "f": {"type": ["null", "number"]},
                "c": {"const": "fixed"},
                "s": {"type": "string", "minLength": 12, "maxLength": 14},
                "u": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "maxItems": 2},
                "p": {
                    "type": "array",
                    "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
                    "items": False,
                },
                "e": {"type": "string", "format": "email"},
                "all": {
                    "allOf": [
                        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                        {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
                    ]
                },
                "tree": {"$ref": "#/$defs/Node"},
            },
            "required": ["n", "m", "k", "x", "f", "c", "s", "u", "p", "e", "all", "tree"],
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    },
                    "required": ["name", "children"],
                }
            },
        },
    ],
)
def test_arguments_are_valid_against_the_schema(schema: dict[str, Any]) -> None:
    for i in range(25):
        arguments = ArgumentMaker(schema, ["alpha", "beta", "gamma"], key=f"k{i}").arguments()
        jsonschema.Draft202012Validator(schema).validate(arguments)
        assert set(schema.get("required", ())) <= set(arguments)


def test_string_arguments_come_from_the_users_words() -> None:
    schema = SCHEMAS["get_weather"]
    arguments = ArgumentMaker(schema, ["lisbon", "weather"], key="x").arguments()
    assert arguments["city"] in {"lisbon", "weather"}


# --- errors --------------------------------------------------------------------------------------


async def test_unknown_model_is_404(engine: RunningEngine) -> None:
    async with client_for(engine) as client:
        with pytest.raises(openai.NotFoundError) as raised:
            await client.chat.completions.create(model="no-such-model", messages=user("hi"))
    assert "no-such-model" in str(raised.value)
    assert engine.stats.requests == 0


def _deep_schema(levels: int) -> dict[str, Any]:
    """An object schema whose one required property nests ``levels`` objects deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        json.dumps({"model": MODEL}).encode(),
        json.dumps({"model": MODEL, "messages": []}).encode(),
        json.dumps({"model": MODEL, "messages": [{"content": "no role"}]}).encode(),
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}
        ).encode(),
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "9"}
        ).encode(),
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}
        ).encode(),
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "x"}]}
        ).encode(),
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "absent"}},
            }
        ).encode(),
        # Nested 100,000 deep: a RecursionError (500) once; 400 as the dataplane answers it.
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # A tool schema too deep to fill arguments for without recursing past Python's limit.
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {"type": "function", "function": {"name": "deep", "parameters": _deep_schema(400)}}
                ],
            }
        ).encode(),
    ],
)
async def test_malformed_body_is_400(engine: RunningEngine, body: bytes) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            engine.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        assert resp.status == 400
        assert resp.headers["Content-Type"].startswith("application/json")
        error = (await resp.json())["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert engine.stats.requests == 0


async def test_a_deeply_nested_classify_body_is_400(engine: RunningEngine) -> None:
    body = b'{"model": "m", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with aiohttp.ClientSession() as session, session.post(engine.url + "/classify", data=body) as resp:
        assert resp.status == 400
        assert "not valid JSON" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("command", ["fake-engine", "fake-mcp"])
@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_a_port_outside_1_to_65535_is_refused(
    command: str, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main([command, "--port", port])
    assert exited.value.code == 2
    assert "--port" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_name_is_refused(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["fake-engine", "--model", model])
    assert exited.value.code == 2
    assert "a model name must not be empty" in capsys.readouterr().err


def test_the_fault_help_names_every_fault_kind() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    text = " ".join(parser.format_help().split())
    for kind in FAULT_KINDS:
        assert kind in text, kind


# --- scheduling ----------------------------------------------------------------------------------


async def wait_for_queue(
    session: aiohttp.ClientSession, engine: RunningEngine, waiting: float
) -> dict[str, float]:
    """Poll /metrics until ``sglang:num_queue_reqs`` reads ``waiting`` (10 s at most)."""
    for _ in range(1000):
        sample = await metrics(session, engine)
        if sample["sglang:num_queue_reqs"] == waiting:
            return sample
        await asyncio.sleep(0.01)
    raise AssertionError(f"the queue never held {waiting} requests: {sample}")


async def test_one_slot_runs_two_requests_one_after_the_other(make_engine: Factory) -> None:
    engine = await make_engine(slots=1, decode_ms=10.0)
    body = {"model": MODEL, "messages": user("first"), "stream": True, "max_tokens": 100}
    async with aiohttp.ClientSession() as session:
        first = await session.post(engine.url + "/v1/chat/completions", json=body)
        await first.content.readuntil(b"\n\n")  # the first request holds the slot now
        second = asyncio.create_task(
            session.post(engine.url + "/v1/chat/completions", json={**body, "max_tokens": 3})
        )
        sample = await wait_for_queue(session, engine, 1.0)
        assert sample["sglang:num_running_reqs"] == 1.0
        assert sample["sglang:token_usage"] > 0
        first_text = await first.text()
        second_response = await second
        second_text = await second_response.text()
        idle = await metrics(session, engine)
    assert first_text.endswith("data: [DONE]\n\n") and second_text.endswith("data: [DONE]\n\n")
    assert engine.stats.max_running_seen == 1
    assert engine.stats.max_waiting_seen == 1
    assert engine.stats.completed == 2
    assert (engine.stats.running, engine.stats.waiting) == (0, 0)
    assert idle["sglang:num_running_reqs"] == 0 and idle["sglang:num_queue_reqs"] == 0
    assert idle["sglang:token_usage"] == 0


async def test_two_slots_run_two_requests_together(make_engine: Factory) -> None:
    engine = await make_engine(slots=2, decode_ms=1.0)
    body = {"model": MODEL, "messages": user("hello"), "stream": True, "max_tokens": 100_000}
    async with aiohttp.ClientSession() as session:
        first = await session.post(engine.url + "/v1/chat/completions", json=body)
        second = await session.post(engine.url + "/v1/chat/completions", json=body)
        await first.content.readuntil(b"\n\n")
        await second.content.readuntil(b"\n\n")
        assert engine.stats.running == 2
        first.close()
        second.close()
    assert engine.stats.max_running_seen == 2
    assert engine.stats.max_waiting_seen == 0


async def test_client_disconnect_frees_the_slot(make_engine: Factory) -> None:
    engine = await make_engine(slots=1, decode_ms=1.0)
    endless = {"model": MODEL, "messages": user("go on"), "stream": True, "max_tokens": 1_000_000}
    async with aiohttp.ClientSession() as session:
        hog = await session.post(engine.url + "/v1/chat/completions", json=endless)
        await hog.content.readuntil(b"\n\n")
        # Streamed responses start at once (headers first), so both of these are queued when
        # post() returns: one gives up while waiting, the other waits and gets the slot.
        quitter = await session.post(engine.url + "/v1/chat/completions", json=endless)
        await wait_for_queue(session, engine, 1.0)
        patient = await session.post(engine.url + "/v1/chat/completions", json={**endless, "max_tokens": 2})
        await wait_for_queue(session, engine, 2.0)
        quitter.close()
        await wait_for_queue(session, engine, 1.0)
        hog.close()  # the client leaves mid-stream
        answer = await patient.text()
        assert answer.endswith("data: [DONE]\n\n")
        idle = await metrics(session, engine)
    assert engine.stats.disconnected == 2
    assert engine.stats.completed == 1
    assert engine.stats.max_running_seen == 1
    assert (engine.stats.running, engine.stats.waiting) == (0, 0)
    assert idle["sglang:num_running_reqs"] == 0 and idle["sglang:num_queue_reqs"] == 0


async def test_non_streamed_client_disconnect_frees_the_slot(make_engine: Factory) -> None:
    engine = await make_engine(slots=1, decode_ms=1.0)
    body = {"model": MODEL, "messages": user("long"), "max_tokens": 1_000_000}
    async with aiohttp.ClientSession() as session:
        pending = asyncio.create_task(session.post(engine.url + "/v1/chat/completions", json=body))
        for _ in range(1000):
            if engine.stats.running == 1:
                break
            await asyncio.sleep(0.01)
        assert engine.stats.running == 1
        pending.cancel()
        for _ in range(1000):
            if engine.stats.running == 0:
                break
            await asyncio.sleep(0.01)
    assert engine.stats.running == 0
    assert engine.stats.disconnected == 1


async def test_slot_pool_passes_on_a_slot_handed_to_a_cancelled_waiter() -> None:
    stats = EngineStats()
    pool = SlotPool(1, stats)
    holder_may_leave = asyncio.Event()
    order: list[str] = []

    async def hold(name: str, until: asyncio.Event | None = None) -> None:
        async with pool.slot():
            order.append(name)
            if until is not None:
                await until.wait()

    holder = asyncio.create_task(hold("holder", holder_may_leave))
    await asyncio.sleep(0)
    doomed = asyncio.create_task(hold("doomed"))
    last = asyncio.create_task(hold("last"))
    await asyncio.sleep(0)
    assert stats.waiting == 2
    holder_may_leave.set()
    await asyncio.sleep(0)  # the holder leaves and hands the slot to "doomed" ...
    doomed.cancel()  # ... which is cancelled before it runs
    await holder
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await last
    assert order == ["holder", "last"]
    assert (stats.running, stats.waiting, stats.max_running_seen) == (0, 0, 1)


# --- the other routes ----------------------------------------------------------------------------


async def test_metrics_use_sglang_names(make_engine: Factory) -> None:
    engine = await make_engine(models=(MODEL, "qwen-7b"))
    async with aiohttp.ClientSession() as session, session.get(engine.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
    ):
        assert families[name].type == "gauge"
        assert {s.labels["model_name"] for s in families[name].samples} == {MODEL, "qwen-7b"}


async def test_health_models_and_sglang_info(engine: RunningEngine) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(engine.url + "/health") as resp:
            assert resp.status == 200 and await resp.json() == {}
        for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            async with session.get(engine.url + path) as resp:
                assert resp.status == 200
                assert (await resp.json())["model_path"] == MODEL
    async with client_for(engine) as client:
        models = await client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [(MODEL, "model", "luftpause-sim")]


def test_runs_as_a_real_process(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = ChildProcess(
        "fake-engine",
        ["fake-engine", "--port", str(port), "--model", "m-one", "--model", "m-two", "--decode-ms", "0"],
        log_path=tmp_path / "engine.log",
        ready_url=url + "/health",
    )
    child.start()
    try:
        child.wait_ready()
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            answer = client.chat.completions.create(model="m-two", messages=user("hello"), max_tokens=5)
            assert answer.choices[0].message.content == "I saw 0 tool results."
            assert [m.id for m in client.models.list().data] == ["m-one", "m-two"]
            leave_mid_stream(port)
            answer = client.chat.completions.create(model="m-one", messages=user("again"), max_tokens=5)
            assert answer.choices[0].finish_reason == "stop"
    finally:
        child.stop()
    assert child.poll() == 0
    # One line when listening, and nothing else: no access log, no error for the client that left.
    assert child.log_tail().strip() == f"luftpause fake-engine: serving m-one, m-two on {url}"


def leave_mid_stream(port: int) -> None:
    """Start an endless stream on a raw socket, read its first bytes, and hang up."""
    body = json.dumps({"model": "m-one", "messages": user("x"), "stream": True, "max_tokens": 10**7}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)


# --- single pass ---------------------------------------------------------------------------------


async def test_classify_answers_vllm_s_shape_deterministically(make_engine: Factory) -> None:
    engine = await make_engine(labels=("spam", "ham", "eggs"), prefill_ms_per_1k=0.0)
    other = await make_engine(labels=("spam", "ham", "eggs"), prefill_ms_per_1k=0.0)
    texts = [f"message number {i} about lunch" for i in range(8)]
    async with aiohttp.ClientSession() as session:
        async with session.post(engine.url + "/classify", json={"model": MODEL, "input": texts}) as resp:
            assert resp.status == 200
            assert resp.headers["x-luftpause-simulated"] == "1"
            body = await resp.json()
        async with session.post(other.url + "/v1/classify", json={"model": MODEL, "input": texts[3]}) as resp:
            single = await resp.json()
        async with session.post(engine.url + "/classify", json={"model": "nope", "input": "x"}) as resp:
            assert resp.status == 404
        async with session.post(engine.url + "/classify", json={"model": MODEL, "input": [1]}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "input"
    assert body["object"] == "list" and body["id"].startswith("classify-") and body["model"] == MODEL
    assert isinstance(body["created"], int)
    assert [item["index"] for item in body["data"]] == list(range(8))
    for item in body["data"]:
        assert item["num_classes"] == 3 and len(item["probs"]) == 3
        assert math.isclose(sum(item["probs"]), 1.0)
        assert item["label"] == ("spam", "ham", "eggs")[item["probs"].index(max(item["probs"]))]
    assert len({item["label"] for item in body["data"]}) > 1, "labels must depend on the text"
    assert single["data"] == [{**body["data"][3], "index": 0}], "same text, same answer, any replica"
    tokens = sum(-(-len(t) // 4) for t in texts)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    assert engine.stats.completed == 1 and engine.stats.completion_tokens == 0
