"""Durable runs with real processes: SIGKILL the runtime mid-run, restart it on the same store (the
state directory's journal, or the same PostgreSQL database), and every run finishes without
repeating a completed tool round.

The kill test runs the real runtime with a scripted engine as its dataplane
(tests/pods_helpers.py) that holds every run's third turn at a gate, so the kill happens
with exactly two rounds journaled per run and no run ended. The shutdown test runs the whole
stack (simulated engines with three tool rounds per run, fake MCP server, scheduler, dataplane,
runtime) and checks the runs end at the scheduler once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pods_helpers import Pod, payload, script, start_pod, until

from luftpause.runtime.runs.journal import JOURNAL_NAME, read_records
from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.stack import Stack

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


def _journal(stack: Stack) -> list[dict[str, Any]]:
    return list(read_records(stack.workdir / "state" / JOURNAL_NAME))


def _rounds(records: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["handle"] for r in records if r["type"] == "round")


def _ended(records: list[dict[str, Any]]) -> set[str]:
    return {r["handle"] for r in records if r["type"] in ("end", "run")}


HELD_AT_ROUND = 2
"""Tool rounds each run completes before the scripted engine holds its next turn."""


@pytest.fixture()
def pod(tmp_path: Path, store: str) -> Iterator[Pod]:
    """The real runtime process with a scripted engine as its dataplane (tests/pods_helpers.py),
    on each store (the file journal, PostgreSQL)."""
    with start_pod(tmp_path, store=store) as running:
        yield running


def test_sigkilled_runtime_resumes_every_run_without_repeating_completed_rounds(pod: Pod) -> None:
    # Each run lists the workspace (a built-in tool) in two rounds, then its third turn is held at
    # the engine's gate: the runtime is killed with exactly two rounds journaled for every run and
    # none ended, not when a poll happens to see "at least half mid-flight".
    listing = {"call": "list_directory", "args": {"path": str(pod.workspace)}}
    steps = [listing] * HELD_AT_ROUND + [{"hold": "third", **listing}, {"say": "done"}]

    async def spawn() -> list[str]:
        async with runtime_client(f"{pod.url}/mcp") as client:
            return [
                payload(await client.call_tool("spawn", {"task": script(*steps)}))["handle"]
                for _ in range(RUNS)
            ]

    handles = asyncio.run(spawn())

    async def all_held() -> bool:
        return all(pod.engine.holding(h) for h in handles)

    asyncio.run(until(all_held, "every run's third turn held at the engine", seconds=60))
    assert pod.runtime is not None
    pod.runtime.kill()

    at_kill = pod.journal()
    assert _rounds(at_kill) == Counter(dict.fromkeys(handles, HELD_AT_ROUND))
    assert not _ended(at_kill) & set(handles)
    turns_at_kill = {h: len(pod.engine.requests[h]) for h in handles}
    if pod.store == "file":
        # A crash mid-write leaves a torn last line: the restart must skip it, not fail on it.
        with (pod.workdir / "state" / JOURNAL_NAME).open("ab") as journal:
            journal.write(b'{"type": "round", "handle": "' + handles[0].encode() + b'", "messages": [{"ro')

    pod.engine.release("third")
    pod.start_runtime()

    async def await_all() -> dict[str, Any]:
        async with runtime_client(f"{pod.url}/mcp") as client:  # a new client, old handles
            return payload(
                await client.call_tool(
                    "await", {"handles": handles, "timeout": 120}, read_timeout_seconds=180
                )
            )

    result = asyncio.run(await_all())
    assert result["timedOut"] is False, result
    for run in result["runs"]:
        assert run["state"] == "completed" and run["answer"] == "done", run
        assert run["toolCalls"] == HELD_AT_ROUND + 1, run
    for handle in handles:
        # Resumed from its last journaled round: every turn after the restart already had the two
        # completed rounds in its conversation (none was asked for again, none re-executed).
        after = pod.engine.requests[handle][turns_at_kill[handle] :]
        assert [sum(m["role"] == "assistant" for m in body["messages"]) for body in after] == [2, 3], handle
    final = pod.journal()
    assert _rounds(final) == Counter(dict.fromkeys(handles, HELD_AT_ROUND + 1))
    assert _ended(final) == set(handles)
    if pod.store == "file":
        assert "torn last record" in pod.runtime.log_tail(200)


def test_runs_interrupted_by_shutdown_resume_after_restart_and_end_at_the_scheduler_once(
    stack: Stack,
) -> None:
    before = stack.status()

    async def spawn() -> list[str]:
        async with runtime_client(stack.runtime_url) as client:
            return [
                payload(await client.call_tool("spawn", {"task": f"giraffe{i}", "maxTokens": 64}))["handle"]
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
            return payload(
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
