"""Long tasks in-process: ``spawn`` bounds ``task`` and ``system`` at 1 MiB each, and listings of
runs (``GET /status``, ``status`` without a handle) show a summary of each task, never all of it.

The MCP tools are called through the official client on the SDK's in-memory transport; the runs
that ``spawn`` accepts talk to a dataplane port where nothing listens, so they fail at once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult, TextContent
from runtime_helpers import MINIMAL_CONFIG, asgi_request, make_run, with_store

from luftpause.runtime.runs.registry import TASK_SUMMARY_CHARS, summarize
from luftpause.runtime.runs.spec import MAX_TEXT_BYTES
from luftpause.runtime.server import create_app
from luftpause.runtime.wiring import Runtime, build_runtime
from luftpause.testkit.launch.procs import free_port

CONFIG = MINIMAL_CONFIG

LONG_TASK = "Summarise this report. " + "x" * 200_000 + " THE END"


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def test_summarize_keeps_short_text_and_cuts_long_text_at_200_characters() -> None:
    assert summarize("") == ""
    exactly = "é" * TASK_SUMMARY_CHARS
    assert summarize(exactly) == exactly
    assert summarize(exactly + "z") == exactly + "…"
    assert summarize(LONG_TASK) == LONG_TASK[:200] + "…"


def test_run_status_summarizes_the_task_unless_asked_for_all_of_it() -> None:
    run = make_run("run-long", task=LONG_TASK)
    listed = run.status()
    assert listed["task"] == LONG_TASK[:200] + "…"
    assert listed["taskChars"] == len(LONG_TASK)
    whole = run.status(full_task=True)
    assert whole["task"] == LONG_TASK and whole["taskChars"] == len(LONG_TASK)
    short = make_run("run-short", task="Find two facts about tides.").status()
    assert short["task"] == "Find two facts about tides." and short["taskChars"] == 27


def test_http_status_never_repeats_a_whole_long_task() -> None:
    app = create_app(CONFIG, token="")
    runtime: Runtime = app.state.runtime
    for i in range(5):
        runtime.registry.add(make_run(f"run-long{i}", task=LONG_TASK))

    status, _, body, _ = asyncio.run(asgi_request(app, "GET", "/status"))
    assert status == 200
    assert len(body) < 10_000  # five 200 KB tasks, listed
    assert b"THE END" not in body
    for run in json.loads(body)["runs"]:
        assert run["task"] == LONG_TASK[:200] + "…"
        assert run["taskChars"] == len(LONG_TASK)


async def _spawn_session(
    calls: list[dict[str, Any]], state_dir: Path, store: str
) -> tuple[list[CallToolResult], Runtime]:
    """``spawn`` with each of ``calls`` on a runtime whose dataplane is unreachable (its runs on
    ``store``, its state in ``state_dir``), then ``status`` with and without each accepted handle;
    returns every result in that order."""
    config = with_store(CONFIG, store, state_dir)
    dead = config.runtime.model_copy(update={"dataplane": f"http://127.0.0.1:{free_port()}"})
    runtime = build_runtime(config.model_copy(update={"runtime": dead}), token=None)
    results: list[CallToolResult] = []
    async with runtime.serving(with_mcp_sessions=False):
        async with Client(runtime.mcp) as client:
            for arguments in calls:
                results.append(await client.call_tool("spawn", arguments))
            accepted = [r.structured_content for r in results if isinstance(r.structured_content, dict)]
            handles = [content["handle"] for content in accepted]
            results.append(await client.call_tool("status", {}))
            for handle in handles:
                results.append(await client.call_tool("status", {"handle": handle}))
    return results, runtime


def test_spawn_refuses_a_task_or_system_past_1_mib_and_accepts_one_at_it(tmp_path: Path, store: str) -> None:
    at_limit = "a" * MAX_TEXT_BYTES
    over_in_bytes = "é" * (MAX_TEXT_BYTES // 2 + 1)  # 2 bytes each: fewer characters than the limit
    results, _ = asyncio.run(
        _spawn_session(
            [
                {"task": at_limit},
                {"task": "t", "system": at_limit},
                {"task": "a" * (MAX_TEXT_BYTES + 1)},
                {"task": over_in_bytes},
                {"task": "t", "system": "s" * (2 * MAX_TEXT_BYTES)},
            ],
            tmp_path,
            store,
        )
    )
    accepted_task, accepted_system, over_task, over_multibyte, over_system = results[:5]
    assert not accepted_task.is_error, _text(accepted_task)
    assert not accepted_system.is_error, _text(accepted_system)
    assert over_task.is_error
    assert "task is 1,048,577 bytes" in _text(over_task) and "at most 1,048,576 bytes" in _text(over_task)
    assert over_multibyte.is_error and "task is 1,048,578 bytes" in _text(over_multibyte)
    assert over_system.is_error and "system is 2,097,152 bytes" in _text(over_system)


def test_status_lists_runs_with_task_summaries_and_shows_one_run_whole(tmp_path: Path, store: str) -> None:
    results, runtime = asyncio.run(_spawn_session([{"task": LONG_TASK}], tmp_path, store))
    spawned, listing, one = results
    assert isinstance(spawned.structured_content, dict)
    handle = spawned.structured_content["handle"]
    assert isinstance(listing.structured_content, dict) and isinstance(one.structured_content, dict)
    (listed,) = listing.structured_content["runs"]
    assert listed["handle"] == handle
    assert listed["task"] == LONG_TASK[:200] + "…" and listed["taskChars"] == len(LONG_TASK)
    assert "THE END" not in _text(listing)
    assert one.structured_content["run"]["task"] == LONG_TASK
    assert runtime.registry.get(handle).task == LONG_TASK  # the run itself keeps all of it
