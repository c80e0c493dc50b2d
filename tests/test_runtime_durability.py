"""Durable runs with real processes: SIGKILL the runtime mid-run, restart it on the same state
directory, and every run finishes without repeating a completed tool round.

The whole stack runs (simulated engines with three tool rounds per run, fake MCP server, scheduler,
dataplane, runtime). Tool calls are counted at the fake MCP server (``GET /testkit/calls``): each
run's task is one unique word, which the simulated model uses as every call's ``query``.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.types import CallToolResult, TextContent

from luftpause.runtime.journal import JOURNAL_NAME, read_records
from luftpause.testkit.loadgen import runtime_client
from luftpause.testkit.stack import Stack

pytestmark = pytest.mark.integration

RUNS = 16
TOOL_ROUNDS = 3


@pytest.fixture()
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Engines decoding at 20 ms a token: a run takes a few seconds, so it can be killed mid-way."""
    running = Stack.start(
        tmp_path_factory.mktemp("durable"),
        tool_rounds=TOOL_ROUNDS,
        decode_ms=20,
        slots=RUNS,
        env={"LUFTPAUSE_TOKEN": ""},
    )
    try:
        yield running
    finally:
        running.stop()


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _journal(stack: Stack) -> list[dict[str, Any]]:
    return list(read_records(stack.workdir / "state" / JOURNAL_NAME))


def _tool_calls_at_server(stack: Stack) -> Counter[str]:
    url = stack.mcp_url.removesuffix("/mcp") + "/testkit/calls"
    with urllib.request.urlopen(url, timeout=10) as response:
        return Counter(json.loads(response.read()))


def _calls_for(counts: Counter[str], word: str) -> int:
    return sum(n for key, n in counts.items() if key.split(" ", 1)[1] == word)


def _rounds(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["handle"] for r in records if r["type"] == "round")


def _ended(records: list[dict[str, Any]]) -> set[str]:
    return {r["handle"] for r in records if r["type"] in ("end", "run")}


def test_sigkilled_runtime_resumes_every_run_without_repeating_completed_rounds(stack: Stack) -> None:
    words = {f"zebra{i:02d}": "" for i in range(RUNS)}

    async def spawn() -> None:
        async with runtime_client(stack.runtime_url) as client:
            for word in words:
                spawned = _payload(await client.call_tool("spawn", {"task": word, "maxTokens": 64}))
                words[word] = spawned["handle"]

    asyncio.run(spawn())
    handles = list(words.values())

    # Kill once every run has completed at least one tool round.
    deadline = time.monotonic() + 60
    while min(_rounds(_journal(stack))[h] for h in handles) < 1:
        assert time.monotonic() < deadline, f"not every run completed a tool round\n{stack.logs()}"
        time.sleep(0.02)
    stack.children["runtime"].kill()

    journal_path = stack.workdir / "state" / JOURNAL_NAME
    at_kill = _journal(stack)
    rounds_at_kill, ended_at_kill = _rounds(at_kill), _ended(at_kill)
    unfinished = [h for h in handles if h not in ended_at_kill]
    assert len(unfinished) >= RUNS // 2, f"only {len(unfinished)} runs were mid-flight at the kill"
    # A crash mid-write leaves a torn last line: the restart must skip it, not fail on it.
    with journal_path.open("ab") as journal:
        journal.write(b'{"type": "round", "handle": "' + handles[0].encode() + b'", "messages": [{"ro')

    # Calls already sent before the kill finish at the server by themselves: wait until it is quiet.
    before = _tool_calls_at_server(stack)
    while True:
        time.sleep(0.5)
        again = _tool_calls_at_server(stack)
        if again == before:
            break
        before = again

    stack.restart("runtime")

    async def await_all() -> dict[str, Any]:
        async with runtime_client(stack.runtime_url) as client:  # a new client, old handles
            return _payload(
                await client.call_tool(
                    "await", {"handles": handles, "timeout": 120}, read_timeout_seconds=180
                )
            )

    result = asyncio.run(await_all())
    assert result["timedOut"] is False, result
    after = _tool_calls_at_server(stack)
    for word, handle in words.items():
        run = next(r for r in result["runs"] if r["handle"] == handle)
        assert run["state"] == "completed", (run, stack.logs())
        assert run["answer"], run
        assert run["toolCalls"] == TOOL_ROUNDS, run
        # After the restart, only the rounds the journal had not recorded were called again.
        expected = 0 if handle in ended_at_kill else TOOL_ROUNDS - rounds_at_kill[handle]
        assert _calls_for(after, word) - _calls_for(before, word) == expected, (word, handle, rounds_at_kill)

    final = _journal(stack)
    assert _rounds(final) == Counter(dict.fromkeys(handles, TOOL_ROUNDS))
    assert _ended(final) == set(handles)
    assert all(r["state"] == "completed" for r in final if r["type"] == "end")
    assert "torn last record" in stack.children["runtime"].log_tail(200)


def test_runs_interrupted_by_shutdown_resume_after_restart_and_end_at_the_scheduler_once(
    stack: Stack,
) -> None:
    before = stack.status()

    async def spawn() -> list[str]:
        async with runtime_client(stack.runtime_url) as client:
            return [
                _payload(await client.call_tool("spawn", {"task": f"giraffe{i}", "maxTokens": 64}))["handle"]
                for i in range(3)
            ]

    handles = asyncio.run(spawn())
    deadline = time.monotonic() + 60
    while min(_rounds(_journal(stack))[h] for h in handles) < 1:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.02)
    runtime = stack.children["runtime"]
    runtime.stop()  # SIGTERM: a clean shutdown
    assert runtime.poll() == 0, runtime.log_tail()
    # The shutdown journals no end for the runs it stopped: they are to resume, not over. (A run
    # that completed just before the signal has its end, from before.)
    at_stop = _ended(_journal(stack)) & set(handles)
    assert len(at_stop) < len(handles), "every run finished before the shutdown: nothing was tested"

    stack.restart("runtime")

    async def await_all() -> dict[str, Any]:
        async with runtime_client(stack.runtime_url) as client:
            return _payload(
                await client.call_tool(
                    "await", {"handles": handles, "timeout": 120}, read_timeout_seconds=180
                )
            )

    result = asyncio.run(await_all())
    assert [r["state"] for r in result["runs"]] == ["completed"] * 3, result
    # Each run was ended at the scheduler once, when it completed; the shutdown ended none (it
    # would have counted as a second end, since the resumed run came back to the scheduler).
    status = stack.wait_status(lambda s: s["counters"]["runs_ended"] - before["counters"]["runs_ended"] >= 3)
    assert status["counters"]["runs_ended"] - before["counters"]["runs_ended"] == 3, status
