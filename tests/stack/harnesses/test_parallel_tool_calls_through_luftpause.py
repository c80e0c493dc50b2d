"""Claude Code and Codex CLI on a real tool loop through luftpause: a scripted Chat Completions
engine behind a scheduler and a dataplane answers the harness's first turn with two parallel calls
of the fake MCP server's ``count_items``, streamed the hard way (both under one ``index``, told
apart only by their ids, their argument fragments interleaved), then, once both results came back,
with the final text. Each harness must run both calls and send both results back.

Skipped, saying why, where npm's harnesses are not installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dataplane_procs import SchedulerAndDataplane, scheduler_and_dataplane
from harness_capture import MODEL
from harness_runs import HARNESSES_ENV, HarnessRun, harness_bin, run_claude_code, run_codex
from parallel_calls_engine import FINAL, LIMIT_SAID, LIMITS, ParallelCallsEngine

pytestmark = pytest.mark.integration


def _require(name: str) -> None:
    if harness_bin(name) is None:
        pytest.skip(
            f"{name} is not installed: npm install --prefix ~/.cache/luftpause/harnesses "
            f"@anthropic-ai/claude-code @openai/codex (or set {HARNESSES_ENV})"
        )


@pytest.fixture
def through_luftpause(tmp_path: Path) -> Iterator[tuple[ParallelCallsEngine, SchedulerAndDataplane]]:
    engine = ParallelCallsEngine().start()
    replicas = (
        f'\n[[replicas]]\nname = "scripted"\nurl = "{engine.url}"\nmodels = ["{MODEL}"]\nhealth_path = ""\n'
    )
    try:
        with scheduler_and_dataplane(tmp_path, [], replicas=replicas) as pair:
            yield engine, pair
    finally:
        engine.stop()


def _both_results_came_back(engine: ParallelCallsEngine) -> None:
    answered = [r for r in engine.recorded() if any(m.get("role") == "tool" for m in r["messages"])]
    assert answered, "no request carried a tool result"
    messages = answered[0]["messages"]
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or ()]
    # the tool's answer as the harness passes it on (Codex prefixes its wall time)
    results = {
        m["tool_call_id"]: int(LIMIT_SAID.findall(str(m["content"]))[-1])
        for m in messages
        if m.get("role") == "tool"
    }
    assert len(calls) == 2 and {json.loads(c["function"]["arguments"])["limit"] for c in calls} == set(LIMITS)
    assert results == {c["id"]: json.loads(c["function"]["arguments"])["limit"] for c in calls}


def _until_offered(engine: ParallelCallsEngine, run: Callable[[], HarnessRun]) -> HarnessRun:
    """``run`` again (3 tries in all) while the harness offered its turns no ``count_items``: its MCP
    server was not listed yet, which is the harness's start-up race, not luftpause's doing."""
    for _ in range(3):
        engine.forget()
        done = run()
        if engine.offered_the_tool():
            return done
    pytest.fail(f"the harness never offered count_items: {done.stdout} {done.stderr}")


def test_claude_code_runs_both_parallel_calls_and_sends_both_results(
    through_luftpause: tuple[ParallelCallsEngine, SchedulerAndDataplane], home: str
) -> None:
    _require("claude")
    engine, pair = through_luftpause
    run = _until_offered(
        engine, lambda: run_claude_code(pair.dataplane_url, home, "Count items with limits 2 and 5", mcp=True)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["is_error"] is False and result["result"] == FINAL, run.stdout
    _both_results_came_back(engine)


def test_codex_runs_both_parallel_calls_and_sends_both_results(
    through_luftpause: tuple[ParallelCallsEngine, SchedulerAndDataplane], home: str
) -> None:
    _require("codex")
    engine, pair = through_luftpause
    run = run_codex(
        pair.dataplane_url, home, "Count items with limits 2 and 5 using the count_items tool", mcp=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    messages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    said = [m["item"].get("text") for m in messages if m.get("type") == "item.completed"]
    assert FINAL in said, run.stdout
    _both_results_came_back(engine)
