"""The runtime in-process: the bounded run registry (retention, cap, expired handles), waits that
refuse NaN, and the HTTP edge (``GET /status`` on any value, JSON 500) driven as an ASGI app.

Times are injected (a fake clock), nothing sleeps for the retention time.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent
from runtime_helpers import MINIMAL_CONFIG, asgi_request, make_run

from luftpause.config import parse_config
from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.server import create_app
from luftpause.runtime.web.status import json_bytes
from luftpause.runtime.wiring import Runtime, build_runtime


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_finished_runs_are_dropped_after_retention_and_running_ones_never() -> None:
    clock = FakeClock()
    registry = RunRegistry(retention_seconds=3600, clock=clock)
    done, running = registry.add(make_run("run-done")), registry.add(make_run("run-running"))
    registry.finish(done, "completed", answer="ok")

    clock.now += 3599
    assert registry.get("run-done") is done  # still within its hour

    clock.now += 2
    with pytest.raises(ExpiredRun, match="run-done") as expired:
        registry.get("run-done")
    assert "expired" in str(expired.value) and "3600 s" in str(expired.value)
    assert registry.all() == [running]

    clock.now += 10 * 3600  # a running run is never dropped, however old
    assert registry.get("run-running") is running
    registry.finish(running, "failed", error="x")
    clock.now += 3599
    assert registry.get("run-running") is running  # retention counts from its end, not its start
    clock.now += 2
    with pytest.raises(ExpiredRun):
        registry.lookup(["run-running"])


def test_the_cap_drops_the_oldest_finished_first_and_spares_running_runs() -> None:
    clock = FakeClock()
    registry = RunRegistry(max_finished=3, clock=clock)
    running = registry.add(make_run("run-live"))
    finished = [registry.add(make_run(f"run-{i}")) for i in range(5)]
    # Finish out of creation order: the order they ended is what counts.
    for i in (2, 0, 4, 1, 3):
        clock.now += 1
        registry.finish(finished[i], "completed", answer=str(i))

    held = {run.handle for run in registry.all()}
    assert held == {"run-live", "run-4", "run-1", "run-3"}
    assert running in registry.all()
    for gone in ("run-2", "run-0"):
        with pytest.raises(ExpiredRun):
            registry.get(gone)


def test_a_finished_ancestor_of_a_running_run_is_kept_so_its_budget_still_applies() -> None:
    """The parent (budget 2 tool calls) finished long ago; its child still runs. The parent used
    to be dropped after retention and its budget stopped bounding the child."""
    clock = FakeClock()
    registry = RunRegistry(retention_seconds=10, max_finished=1, clock=clock)
    parent = registry.add(make_run("run-parent", budget_tool_calls=2))
    child = registry.add(make_run("run-child", parent="run-parent"))
    registry.finish(parent, "completed", answer="delegated")
    others = [registry.add(make_run(f"run-other-{i}")) for i in range(3)]
    for other in others:
        registry.finish(other, "completed", answer="x")
    clock.now += 100
    assert registry.get("run-parent") is parent
    assert {r.handle for r in registry.all()} == {"run-parent", "run-child"}
    child.costs.tool_calls = 3

    async def check() -> None:  # cancelling looks at the current task
        registry.check_budgets(child)

    asyncio.run(check())
    assert child.state == "cancelled" and child.error == "budget exceeded: toolCalls 3/2"
    clock.now += 100  # now nothing runs below it: dropped like any finished run
    with pytest.raises(ExpiredRun):
        registry.get("run-parent")


def test_an_expired_handle_is_told_apart_from_one_never_issued() -> None:
    clock = FakeClock()
    registry = RunRegistry(retention_seconds=60, clock=clock)
    registry.finish(registry.add(make_run("run-old")), "cancelled", error="cancelled")
    clock.now += 61

    with pytest.raises(UnknownRun, match="run-never"):
        registry.lookup(["run-old", "run-never"])  # unknown handles are named first
    with pytest.raises(ExpiredRun, match="run-old"):
        registry.lookup(["run-old"])
    with pytest.raises(UnknownRun):
        registry.get("run-never")


def test_remembered_expired_handles_are_bounded() -> None:
    clock = FakeClock()
    registry = RunRegistry(retention_seconds=0, max_expired_handles=2, clock=clock)
    for i in range(3):
        registry.finish(registry.add(make_run(f"run-{i}")), "completed", answer="")
        clock.now += 1
    registry.evict_expired()

    with pytest.raises(UnknownRun):  # the oldest tombstone itself was dropped
        registry.get("run-0")
    for kept in ("run-1", "run-2"):
        with pytest.raises(ExpiredRun):
            registry.get(kept)


def test_registry_refuses_bounds_that_would_keep_nothing_or_forever() -> None:
    with pytest.raises(ValueError):
        RunRegistry(retention_seconds=math.inf)
    with pytest.raises(ValueError):
        RunRegistry(retention_seconds=math.nan)
    with pytest.raises(ValueError):
        RunRegistry(max_finished=0)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf])
def test_a_wait_on_a_non_finite_time_is_refused(seconds: float) -> None:
    async def scenario() -> None:
        async with RunRegistry() as registry:
            run = registry.add(make_run("run-wait"))
            registry.start(run, asyncio.sleep(3600))
            with pytest.raises(ValueError, match="finite"):
                await registry.wait([run], "all", seconds)

    asyncio.run(scenario())


def test_json_bytes_writes_what_orjson_refuses() -> None:
    data = {"big": 10**30, "text": "lone \ud800 surrogate", "ok": [1, "a"]}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(data)
    assert json.loads(json_bytes(data)) == data
    assert json_bytes({"ok": [1, "a"]}) == orjson.dumps({"ok": [1, "a"]})  # the fast path otherwise


CONFIG = MINIMAL_CONFIG


def test_http_status_answers_even_with_values_orjson_refuses() -> None:
    app = create_app(CONFIG, token="")
    runtime: Runtime = app.state.runtime
    # Values that once reached GET /status and made it answer 500 for ever (orjson: "Integer
    # exceeds 64-bit range"); spawn refuses them now, the page must not depend on that.
    runtime.registry.add(
        make_run("run-huge", max_tool_calls=10**30, prompt_tokens=2**70, budget_tokens=2**80)
    )

    status, headers, body, raised = asyncio.run(asgi_request(app, "GET", "/status"))
    assert raised is None
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    (run,) = json.loads(body)["runs"]
    assert run["id"] == "run-huge"
    assert run["own"]["promptTokens"] == 2**70 and run["subtree"]["promptTokens"] == 2**70
    assert run["limits"]["tokens"] == 2**80 and run["used"]["tokens"] == 2**70


def test_an_unexpected_error_is_a_json_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(self: Runtime, tenant: object = None) -> dict[str, Any]:
        raise RuntimeError("status exploded")

    monkeypatch.setattr(Runtime, "status", explode)
    status, headers, body, raised = asyncio.run(asgi_request(create_app(CONFIG, token=""), "GET", "/status"))
    assert isinstance(raised, RuntimeError) and "status exploded" in str(raised)
    assert status == 500
    assert headers["content-type"] == "application/json"
    message = json.loads(body)["error"]["message"]
    assert "internal error" in message and "exploded" not in message  # no internals leak


def test_unknown_path_and_wrong_method_are_json_in_process() -> None:
    app = create_app(CONFIG, token="")
    status, headers, body, _ = asyncio.run(asgi_request(app, "GET", "/nope"))
    assert (status, headers["content-type"]) == (404, "application/json")
    assert json.loads(body) == {"error": {"message": "no route GET /nope"}}
    status, headers, body, _ = asyncio.run(asgi_request(app, "DELETE", "/health"))
    assert (status, headers["content-type"]) == (405, "application/json")
    assert headers["allow"] == "GET, HEAD"
    assert json.loads(body) == {"error": {"message": "/health takes GET, HEAD, not DELETE"}}


def test_a_run_stopped_before_its_first_step_ends_cancelled() -> None:
    async def scenario() -> Run:
        async with RunRegistry() as registry:
            run = registry.add(make_run("run-unstarted"))
            registry.start(run, asyncio.sleep(3600))
            # Leaving the registry at once cancels the task before it ever ran.
        return run

    run = asyncio.run(scenario())
    assert run.state == "cancelled"
    assert run.error == "runtime shut down"


def test_await_and_status_tools_say_an_evicted_handle_expired() -> None:
    clock = FakeClock()
    runtime = build_runtime(CONFIG, retention_seconds=60, clock=clock)
    runtime.registry.finish(runtime.registry.add(make_run("run-gone")), "completed", answer="ok")
    clock.now += 61
    mcp = runtime.mcp

    async def scenario() -> list[CallToolResult]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("await", {"handles": ["run-gone"], "timeout": 0}),
                await client.call_tool("status", {"handle": "run-gone"}),
                await client.call_tool("status", {"handle": "run-never"}),
            ]

    awaited, status, never = asyncio.run(scenario())
    for result in (awaited, status):
        text = "\n".join(b.text for b in result.content if isinstance(b, TextContent))
        assert result.is_error and "run-gone" in text and "expired" in text, text
    never_text = "\n".join(b.text for b in never.content if isinstance(b, TextContent))
    assert never.is_error and "unknown run handle 'run-never'" in never_text


def test_the_retention_window_comes_from_the_configuration(tmp_path: Path) -> None:
    # [runtime] retained_s bounds how long finished runs and their tasks stay (a soak shortens it);
    # before the key, the runtime kept them an hour whatever its file said.
    config = parse_config(
        f'[runtime]\nstate_dir = "{tmp_path}"\nretained_s = 90\n'
        '[[replicas]]\nname = "sim"\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n',
        "test.toml",
    )
    clock = FakeClock()
    runtime = build_runtime(config, clock=clock)
    assert runtime.tasks.retention_seconds == 90
    runtime.registry.finish(runtime.registry.add(make_run("run-old")), "completed", answer="ok")
    clock.now += 89
    assert runtime.registry.get("run-old").state == "completed"
    clock.now += 2
    with pytest.raises(ExpiredRun, match="90 s"):
        runtime.registry.get("run-old")
