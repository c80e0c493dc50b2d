"""A session cut off in the middle of a tool call gives its headroom slot back (issue 12): on a real
stack, an interactive run whose harness never sends the turn after its tool call keeps a slot from
batch turns only for its pause hold, learned from how long its caller's tools took."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp

from luftpause.testkit.launch.stack import Stack
from luftpause.testkit.load.agents import LOOKUP_TOOL, stream_turn


def _headroom(status: dict[str, Any]) -> int:
    return sum(replica["reserved_headroom"] for replica in status["replicas"])


async def _turn(
    session: aiohttp.ClientSession, stack: Stack, run_id: str, messages: list[dict[str, Any]]
) -> Any:
    headers = {
        "content-type": "application/json",
        "x-luftpause-run-id": run_id,
        "x-luftpause-class": "interactive",
        "x-luftpause-caller": "cutoff-test",
        "authorization": "Bearer unused",
    }
    body = {
        "model": stack.model,
        "messages": messages,
        "stream": True,
        "max_tokens": 16,
        "tools": [LOOKUP_TOOL],
    }
    return await stream_turn(session, f"{stack.dataplane_url}/v1/chat/completions", headers, body)


def test_a_session_cut_off_in_a_tool_call_gives_its_headroom_slot_back(stack: Stack) -> None:
    stack.wait_connected()
    taught = f"cutoff-{uuid.uuid4().hex}"
    cut = f"cutoff-{uuid.uuid4().hex}"

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            # the caller's tools take 0.2 s: one run shows it (turn, tool, next turn, DELETE)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "look it up"}]
            reply = await _turn(session, stack, taught, messages)
            assert reply.tool_calls, "the simulated model asks for the tool while one is offered"
            await asyncio.sleep(0.2)
            messages += [
                {"role": "assistant", "content": None, "tool_calls": reply.tool_calls},
                {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "an entry"},
            ]
            await _turn(session, stack, taught, messages)
            async with session.delete(f"{stack.dataplane_url}/v1/runs/{taught}"):
                pass
            # this session is cut off after its tool call: no next turn, no DELETE, ever
            reply = await _turn(session, stack, cut, [{"role": "user", "content": "look it up"}])
            assert reply.tool_calls

    asyncio.run(scenario())
    # Its hold is at most the 0.2 s its caller showed (the cost model of policies/pause_hold.py: on
    # an engine far from its bound a kept slot saves next to nothing, so it keeps none at all);
    # before the pause hold, 30 min (run expiry).
    # Both at once: the run is known paused on its tool (its turn's end, reported after the client
    # read it and coalesced for up to 20 ms, has reached the scheduler) and keeps no slot. Headroom
    # alone is 0 before that report too, which would prove nothing.
    freed = stack.wait_status(lambda s: s["runs"]["tool_paused"] >= 1 and _headroom(s) == 0, timeout=30)
    # the run itself is still known, paused on its tool, with its affinity: only the slot went back
    assert freed["runs"]["tool_paused"] >= 1
    assert _headroom(freed) == 0, f"the cut-off run still keeps a slot: {freed['replicas']}"
