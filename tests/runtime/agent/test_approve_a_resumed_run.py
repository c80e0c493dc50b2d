"""``approve`` for a run just resumed (after a restart, or taken over from a dead runtime) whose
loop has not yet reached the gated call of the round it resumes: the kill test's input
(tests/runtime/runs/test_runtimes_share_a_store.py), where a person approves through the runtime
that takes the run over right after the kill. The answer came at the moment the run was installed,
before its loop asked again, and was refused with "it waits for no approval"; it now waits for the
question and answers it. A run that will ask nothing is still refused at once."""

from __future__ import annotations

import asyncio

import pytest
from runtime_helpers import make_run

from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.errors import NoPendingApproval
from luftpause.runtime.runs.record import PendingRound, Run
from luftpause.runtime.runs.registry import RunRegistry


def _resumed(registry: RunRegistry, handle: str, tool: str) -> Run:
    """A run as a replay leaves it: its round's reply recorded (one call of ``tool``), no call
    made, no question asked yet; ``delete_note`` needs a person (``approveTools``)."""
    run = registry.add(make_run(handle, approve_tools={"delete_note"}))
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": tool, "arguments": "{}"}}],
    }
    run.pending_round = PendingRound(1, reply, {})
    return run


def test_an_approval_made_before_the_resumed_run_asks_again_answers_its_question() -> None:
    async def scenario() -> tuple[str, str | None]:
        registry = RunRegistry()
        approvals = Approvals(registry, UpstreamPool([]))
        run = _resumed(registry, "run-resumed", "delete_note")
        with pytest.raises(NoPendingApproval):  # what approve answered before
            approvals.answer(run.handle, True)
        answering = asyncio.create_task(approvals.answer_when_asked(run.handle, True))
        await asyncio.sleep(0.2)
        assert not answering.done()  # waiting for the question
        gated = await approvals.gate(run, "delete_note", {}, 0)  # the loop reaches the call
        return (await answering).tool, gated

    tool, gated = asyncio.run(scenario())
    assert tool == "delete_note" and gated is None  # answered, and the call goes


def test_a_run_that_will_ask_nothing_is_refused_at_once() -> None:
    async def scenario() -> None:
        registry = RunRegistry()
        approvals = Approvals(registry, UpstreamPool([]))
        ungated = _resumed(registry, "run-lists", "list_directory")
        idle = registry.add(make_run("run-idle"))
        for run in (ungated, idle):
            assert not approvals.about_to_ask(run)
            answering = asyncio.create_task(approvals.answer_when_asked(run.handle, True))
            await asyncio.sleep(0)
            assert answering.done()  # refused in its first step: it did not wait
            with pytest.raises(NoPendingApproval, match="waits for no approval"):
                await answering

    asyncio.run(scenario())
