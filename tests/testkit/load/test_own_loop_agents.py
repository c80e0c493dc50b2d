"""Own-loop agents (:mod:`luftpause.testkit.load.agents`) against a scripted proxy in-process: what they
send, how they count tool rounds, how they end runs and how they back off after failures."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from luftpause.testkit.load.agents import (
    CALL_PREFILL,
    CALL_STOP,
    AgentGroup,
    AgentSettings,
    RunOutcome,
    closed_loop,
)


@dataclass
class ScriptedProxy:
    """Answers every chat turn as ``mode`` says; records each turn's headers and every DELETE.

    ``mode``: ``"parallel"`` (two tool calls per reply while tools are offered, then an answer),
    ``"text"`` (always a text answer, tools offered or not: a model that never calls tools),
    ``"stall"`` (never answers), ``"429"`` (429 with ``Retry-After: retry_after``), ``"500"``."""

    mode: str
    retry_after: str = "5"
    turns: list[dict[str, str]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.turns.append(dict(request.headers))
        self.bodies.append(body)
        if self.mode == "stall":
            await asyncio.sleep(3600)
        if self.mode == "429":
            return web.json_response(
                {"error": {"message": "busy"}}, status=429, headers={"Retry-After": self.retry_after}
            )
        if self.mode == "500":
            return web.json_response({"error": {"message": "broken"}}, status=500)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if body.get("tools") and self.mode != "text":
            calls = [
                {"index": i, "id": f"call_{i}", "type": "function",
                 "function": {"name": "lookup", "arguments": '{"query": "x"}'}}
                for i in range(2)
            ]  # fmt: skip
            delta: dict[str, Any] = {"tool_calls": calls}
            finish = "tool_calls"
        else:
            delta, finish = {"content": "done"}, "stop"
        for chunk in (
            {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        ):
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def delete(self, request: web.Request) -> web.Response:
        self.deleted.append(request.match_info["run_id"])
        return web.json_response({})

    async def release(self, request: web.Request) -> web.Response:
        self.released.append(orjson.loads(await request.read())["program_id"])
        return web.json_response({})


@asynccontextmanager
async def serving(proxy: ScriptedProxy) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", proxy.chat)
    app.router.add_delete("/v1/runs/{run_id}", proxy.delete)
    app.router.add_post("/programs/release", proxy.release)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _run(
    proxy: ScriptedProxy,
    duration_s: float,
    tool_rounds: int = 2,
    group: AgentGroup | None = None,
    tool_rounds_by: str = "model",
    **more: Any,
) -> list[RunOutcome]:
    async def go() -> list[RunOutcome]:
        async with serving(proxy) as url:
            settings = AgentSettings(
                proxy=url,
                model="m",
                task="t",
                tool_rounds=tool_rounds,
                tool_seconds=0.0,
                context_tokens=8,
                tool_rounds_by=tool_rounds_by,
                **more,
            )
            return await closed_loop(settings, [group or AgentGroup(1, "batch", "bulk")], duration_s)

    return asyncio.run(go())


def _completed(outcomes: list[RunOutcome]) -> list[RunOutcome]:
    return [o for o in outcomes if o.state == "completed"]


def test_tool_rounds_count_replies_that_ask_for_tools_not_the_calls_in_them() -> None:
    proxy = ScriptedProxy("parallel")
    outcomes = _run(proxy, duration_s=0.5, tool_rounds=2)
    done = _completed(outcomes)
    assert done, outcomes
    for outcome in done:
        # Two rounds of two parallel calls each, then the answer: three turns.
        assert (outcome.tool_rounds, outcome.tool_calls, outcome.turns) == (2, 4, 3), outcome


def test_forced_calls_open_the_call_on_each_turn_that_offers_the_tool_and_keep_the_parsed_call() -> None:
    proxy = ScriptedProxy("parallel")
    outcomes = _run(proxy, duration_s=0.3, tool_rounds=2, forced_calls=True, tool_choice="required")
    assert _completed(outcomes) and all(o.unforced == 0 for o in outcomes)
    offered = [b for b in proxy.bodies if b.get("tools")]
    answers = [b for b in proxy.bodies if not b.get("tools")]
    assert offered and answers
    for body in offered:
        assert body["messages"][-1] == {"role": "assistant", "content": CALL_PREFILL}
        assert (body["stop"], body["tool_choice"], body["temperature"]) == ([CALL_STOP], "required", 0)
    for body in answers:  # the answer's turn: no tool, no prefill, no stop, no tool_choice
        assert body["messages"][-1]["role"] == "tool" and not {"stop", "tool_choice"} & set(body)
    # the prefill is sent with its turn only: the run's conversation keeps the call as parsed
    second = next(b for b in offered if len(b["messages"]) > 3)
    kept = [m for m in second["messages"] if m["role"] == "assistant"]
    assert kept[0]["tool_calls"] and kept[0]["content"] is None and kept[-1]["content"] == CALL_PREFILL


def test_a_forced_turn_that_comes_back_without_a_call_is_counted_and_answers() -> None:
    proxy = ScriptedProxy("text")
    outcomes = _run(proxy, duration_s=0.3, tool_rounds=2, forced_calls=True)
    done = _completed(outcomes)
    assert done and all((o.turns, o.tool_rounds, o.unforced) == (1, 0, 1) for o in done)
    with pytest.raises(ValueError, match="tool_choice"):
        AgentSettings(proxy="p", model="m", task="t", tool_choice="always")


@dataclass(frozen=True)
class Fixed:
    seconds: float

    def draw(self, rng: random.Random) -> float:
        return self.seconds


def test_a_group_s_own_rounds_tool_time_and_priority_override_the_settings() -> None:
    proxy = ScriptedProxy("parallel")
    group = AgentGroup(1, "interactive", "ide", tool_rounds=1, tool_seconds=Fixed(0.0), priority=1)
    outcomes = _run(proxy, duration_s=0.3, tool_rounds=3, group=group)
    done = _completed(outcomes)
    assert done and all((o.turns, o.tool_rounds) == (2, 1) for o in done)
    assert {b["priority"] for b in proxy.bodies} == {1}


def test_every_turn_carries_the_group_s_class_and_caller() -> None:
    proxy = ScriptedProxy("parallel")
    _run(proxy, duration_s=0.3, group=AgentGroup(1, "batch", "bulk"))
    assert proxy.turns
    assert {(t["x-luftpause-class"], t["x-luftpause-caller"]) for t in proxy.turns} == {("batch", "bulk")}


def test_a_program_id_group_names_its_run_in_every_body_and_releases_it_at_the_end() -> None:
    proxy = ScriptedProxy("parallel")
    outcomes = _run(proxy, duration_s=0.3, group=AgentGroup(1, "batch", "bulk", program_id=True))
    done = _completed(outcomes)
    assert done and proxy.bodies
    # Each body names the run its turn belongs to (a run the deadline cut after its first turn
    # was sent may have no outcome: compare with the turn's own run header, not the outcomes).
    runs = [{k.lower(): v for k, v in headers.items()}["x-luftpause-run-id"] for headers in proxy.turns]
    assert [body["program_id"] for body in proxy.bodies] == runs
    # The one agent's runs end one after another; the deadline may cancel the last completed one's
    # release (it is posted after the outcome is recorded), never an earlier one's.
    assert {o.run_id for o in done[:-1]} <= set(proxy.released) <= {o.run_id for o in outcomes}
    plain = ScriptedProxy("parallel")
    _run(plain, duration_s=0.2)
    assert plain.bodies and not any("program_id" in body for body in plain.bodies) and not plain.released


def test_a_run_cut_at_the_deadline_is_ended_on_the_proxy_too() -> None:
    proxy = ScriptedProxy("stall")
    outcomes = _run(proxy, duration_s=0.5)
    (outcome,) = outcomes
    assert outcome.state == "unfinished"
    assert proxy.deleted == [outcome.run_id]


def test_failed_runs_back_off_instead_of_retrying_in_a_hot_loop() -> None:
    proxy = ScriptedProxy("500")
    outcomes = _run(proxy, duration_s=2.5)
    # Fails at 0 s, pauses 1 s, fails, pauses 2 s: past the deadline. A hot loop makes hundreds.
    assert 1 <= len(outcomes) <= 3, len(outcomes)
    assert all(o.state == "failed" and "HTTP 500" in o.error for o in outcomes)
    assert proxy.deleted == [o.run_id for o in outcomes]  # failed runs are ended too


def test_a_429_s_retry_after_is_honoured() -> None:
    proxy = ScriptedProxy("429", retry_after="30")
    outcomes = _run(proxy, duration_s=2.5)
    # Without Retry-After the backoff (1 s, then 2 s) would try a second time within 2.5 s.
    (outcome,) = outcomes
    assert outcome.state == "failed" and outcome.retry_after == 30.0


def test_a_completed_run_resets_the_backoff() -> None:
    # Two failures, then success: the agent runs again at once (no pause after completed runs).
    answers: list[str] = ["500", "500"]
    proxy = ScriptedProxy("parallel")
    original: Callable[[web.Request], Any] = ScriptedProxy.chat

    async def chat(request: web.Request) -> web.StreamResponse:
        proxy.mode = answers.pop(0) if answers else "parallel"
        return await original(proxy, request)

    proxy.chat = chat  # type: ignore[method-assign]
    outcomes = _run(proxy, duration_s=4.0, tool_rounds=0)
    states = [o.state for o in outcomes]
    assert states[:2] == ["failed", "failed"], states
    assert states.count("completed") >= 3, states  # many quick runs once the proxy answers


# -- agent-made tool rounds, for models that never call tools (issue 13) -----------------------------


def test_a_model_that_never_calls_tools_ends_every_run_at_its_first_turn() -> None:
    # SmolLM2-135M on llama.cpp: the input that made a flood on it have no tool rounds at all
    outcomes = _completed(_run(ScriptedProxy("text"), duration_s=0.3))
    assert outcomes and all((o.turns, o.tool_rounds) == (1, 0) for o in outcomes)


def test_agent_made_tool_rounds_treat_each_reply_as_a_lookup_and_answer_it() -> None:
    proxy = ScriptedProxy("text")
    outcomes = _completed(_run(proxy, duration_s=0.5, tool_rounds=2, tool_rounds_by="agent"))
    assert outcomes
    assert all((o.turns, o.tool_rounds, o.tool_calls) == (3, 2, 2) for o in outcomes), outcomes
    run = [b["messages"] for b in proxy.bodies[:3]]
    assert [len(m) for m in run] == [2, 4, 6]  # system + task, then an assistant + tool pair per round
    assistant, tool = run[2][2], run[2][3]
    assert assistant["content"] == "done"  # what the model said stays in the conversation
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert orjson.loads(call["function"]["arguments"]) == {"query": "done"}
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": tool["content"]}
    assert run[2][4]["tool_calls"][0]["id"] != call["id"]  # one id per round
    assert [bool(b.get("tools")) for b in proxy.bodies[:3]] == [True, True, False]  # then it answers


def test_agent_made_tool_rounds_keep_the_models_own_tool_calls() -> None:
    outcomes = _completed(_run(ScriptedProxy("parallel"), duration_s=0.5, tool_rounds_by="agent"))
    assert outcomes and all((o.tool_rounds, o.tool_calls) == (2, 4) for o in outcomes)


def test_agents_spread_over_several_base_urls_one_each_in_turn() -> None:
    first, second = ScriptedProxy("text"), ScriptedProxy("text")

    async def go() -> None:
        async with serving(first) as one, serving(second) as two:
            settings = AgentSettings(proxy="", model="m", task="t", tool_seconds=0.0, spread=(one, two))
            await closed_loop(settings, [AgentGroup(1, "interactive"), AgentGroup(1, "batch")], 0.3)

    asyncio.run(go())
    assert {t["x-luftpause-class"] for t in first.turns} == {"interactive"}
    assert {t["x-luftpause-class"] for t in second.turns} == {"batch"}


def test_an_unknown_tool_rounds_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="tool_rounds_by must be one of"):
        AgentSettings(proxy="p", model="m", task="t", tool_rounds_by="engine")
