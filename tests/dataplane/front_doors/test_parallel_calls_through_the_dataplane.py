"""Two parallel tool calls that the engine streams under one index, interleaved, reach the official
``anthropic`` and ``openai`` clients whole through a real scheduler and dataplane (translated
answers), in an event order the APIs themselves keep; the tool round that answers both is one run
with them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from api_helpers import check_messages_order, check_responses_order
from dataplane_procs import SchedulerAndDataplane, scheduler_and_dataplane
from parallel_calls_engine import FINAL, LIMITS, ParallelCallsEngine

MODEL = "scripted-model"
TOOL: Any = {"name": "count_items", "description": "Count.", "input_schema": {"type": "object"}}
RESPONSES_TOOL: Any = {"type": "function", "name": "count_items", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def through(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ParallelCallsEngine, SchedulerAndDataplane]]:
    engine = ParallelCallsEngine().start()
    replicas = (
        f'\n[[replicas]]\nname = "scripted"\nurl = "{engine.url}"\nmodels = ["{MODEL}"]\nhealth_path = ""\n'
    )
    try:
        with scheduler_and_dataplane(tmp_path_factory.mktemp("parallel"), [], replicas=replicas) as pair:
            yield engine, pair
    finally:
        engine.stop()


def test_the_anthropic_client_gets_both_calls_and_the_round_is_one_run(
    through: tuple[ParallelCallsEngine, SchedulerAndDataplane],
) -> None:
    _, pair = through
    prompt: Any = [{"role": "user", "content": "count twice"}]
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": prompt, "tools": [TOOL]}
    raw = httpx2.post(f"{pair.dataplane_url}/v1/messages", json=body, timeout=30)
    check_messages_order(raw.content)
    client = anthropic.Anthropic(base_url=pair.dataplane_url, api_key="k", max_retries=0)
    with client.messages.stream(model=MODEL, max_tokens=64, messages=prompt, tools=[TOOL]) as stream:
        message = stream.get_final_message()
        run_id = stream.response.headers["x-luftpause-run-id"]
    calls = [b for b in message.content if b.type == "tool_use"]
    assert [(c.name, c.input) for c in calls] == [("count_items", {"limit": limit}) for limit in LIMITS]
    assert len({c.id for c in calls}) == 2 and message.stop_reason == "tool_use"
    results: Any = [{"type": "tool_result", "tool_use_id": c.id, "content": str(c.input)} for c in calls]
    answer = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=64,
        tools=[TOOL],
        messages=[
            *prompt,
            {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in calls]},
            {"role": "user", "content": results},
        ],
        stream=False,
    )
    client.close()
    assert answer.headers["x-luftpause-run-id"] == run_id  # both echoed ids name the run
    assert answer.parse().content[0].text == FINAL  # type: ignore[union-attr]


def test_the_openai_client_gets_both_calls_whole(
    through: tuple[ParallelCallsEngine, SchedulerAndDataplane],
) -> None:
    _, pair = through
    body = {"model": MODEL, "input": "count twice", "stream": True, "tools": [RESPONSES_TOOL]}
    raw = httpx2.post(f"{pair.dataplane_url}/v1/responses", json=body, timeout=30)
    check_responses_order(raw.content)
    done = [
        json.loads(line[6:])["arguments"]
        for line in raw.text.splitlines()
        if line.startswith("data: ") and '"response.function_call_arguments.done"' in line
    ]
    assert [json.loads(a) for a in done] == [{"limit": limit} for limit in LIMITS]
    client = openai.OpenAI(base_url=f"{pair.dataplane_url}/v1", api_key="k", max_retries=0)
    with client.responses.stream(model=MODEL, input="count twice", tools=[RESPONSES_TOOL]) as stream:
        final = stream.get_final_response()
    client.close()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"limit": limit} for limit in LIMITS]
    assert len({c.call_id for c in calls}) == 2
