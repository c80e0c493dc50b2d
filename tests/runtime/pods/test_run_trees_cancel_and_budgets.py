"""Run trees, ``cancel`` and subtree budgets through the real ``mcp`` client against the real
runtime, with the whole stack running (engines decoding at 30 ms a token, so a run with its
256-token answer takes several seconds and can be cancelled while it runs)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, Implementation, TextContent
from postgres_helpers import STORES, store_line, store_of

from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=STORES)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(
        tmp_path_factory.mktemp("trees"),
        tool_rounds=3,
        decode_ms=30,
        slots=16,
        env={"LUFTPAUSE_TOKEN": ""},
        sections={"runtime": store_line(store_of(request))},
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


async def _spawn(client: Client, task: str, **extra: Any) -> str:
    handle = _payload(await client.call_tool("spawn", {"task": task, **extra}))["handle"]
    assert isinstance(handle, str)
    return handle


async def _await(client: Client, handles: list[str]) -> list[dict[str, Any]]:
    result = _payload(
        await client.call_tool("await", {"handles": handles, "timeout": 60}, read_timeout_seconds=90)
    )
    assert result["timedOut"] is False, result
    runs: list[dict[str, Any]] = result["runs"]
    return runs


def _http_status(stack: Stack) -> dict[str, Any]:
    url = stack.runtime_url.removesuffix("/mcp") + "/status"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        status: dict[str, Any] = json.loads(response.read())
        return status


def test_cancel_ends_the_run_and_cascades_to_its_running_descendants(stack: Stack) -> None:
    async def scenario() -> tuple[list[str], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        async with runtime_client(stack.runtime_url) as client:
            parent = await _spawn(client, "walrus")
            child = await _spawn(client, "otter", parent=parent)
            grandchild = await _spawn(client, "beaver", parent=child)
            tree = _payload(await client.call_tool("status", {"handle": child}))
            cancelled = _payload(await client.call_tool("cancel", {"handle": parent}))
            runs = await _await(client, [parent, child, grandchild])
            return [parent, child, grandchild], tree, cancelled, runs

    (parent, child, grandchild), tree, cancelled, runs = asyncio.run(scenario())
    assert tree["run"]["parent"] == parent and tree["run"]["children"] == [grandchild]
    assert sorted(cancelled["cancelled"]) == sorted([parent, child, grandchild])
    assert [run["state"] for run in runs] == ["cancelled"] * 3
    assert all(run["error"] == "cancelled" for run in runs)


def test_a_cancelled_run_takes_no_children_and_unknown_handles_are_refused(stack: Stack) -> None:
    async def scenario() -> tuple[CallToolResult, CallToolResult, CallToolResult]:
        async with runtime_client(stack.runtime_url) as client:
            parent = await _spawn(client, "heron")
            await client.call_tool("cancel", {"handle": parent})
            under_cancelled = await client.call_tool("spawn", {"task": "egret", "parent": parent})
            unknown_parent = await client.call_tool(
                "spawn", {"task": "egret", "parent": "run-0000000000000000"}
            )
            unknown_cancel = await client.call_tool("cancel", {"handle": "run-0000000000000000"})
            return under_cancelled, unknown_parent, unknown_cancel

    under_cancelled, unknown_parent, unknown_cancel = asyncio.run(scenario())
    assert under_cancelled.is_error and "is cancelled" in _text(under_cancelled)
    assert unknown_parent.is_error and "parent: unknown run handle" in _text(unknown_parent)
    assert unknown_cancel.is_error and "unknown run handle" in _text(unknown_cancel)


def test_status_without_a_handle_lists_only_the_callers_runs(stack: Stack) -> None:
    async def scenario() -> tuple[str, list[str], list[str]]:
        # Callers are told apart by MCP session, else (2026-07-28, stateless) by declared client name.
        me, someone = (
            Implementation(name="harness-a", version="1"),
            Implementation(name="harness-b", version="1"),
        )
        async with (
            runtime_client(stack.runtime_url, client_info=me) as mine,
            runtime_client(stack.runtime_url, client_info=someone) as other,
        ):
            handle = await _spawn(mine, "puffin", maxTokens=8)
            await _await(mine, [handle])
            own = [run["handle"] for run in _payload(await mine.call_tool("status", {}))["runs"]]
            others = [run["handle"] for run in _payload(await other.call_tool("status", {}))["runs"]]
            return handle, own, others

    handle, own, others = asyncio.run(scenario())
    assert handle in own
    assert handle not in others


def test_budget_tokens_cancels_after_the_turn_that_spent_them(stack: Stack) -> None:
    async def scenario() -> dict[str, Any]:
        async with runtime_client(stack.runtime_url) as client:
            handle = await _spawn(client, "lemur", budgetTokens=20)
            (run,) = await _await(client, [handle])
            return run

    run = asyncio.run(scenario())
    assert run["state"] == "cancelled", run
    match = re.fullmatch(r"budget exceeded: tokens (\d+)/20", run["error"])
    assert match, run
    spent = run["usage"]["promptTokens"] + run["usage"]["completionTokens"]
    assert int(match.group(1)) == spent > 20
    assert run["limits"] == {"tokens": 20} and run["used"] == {"tokens": spent}
    assert run["exceeded"] == run["error"]


def test_budget_tool_calls_cancels_before_the_call_past_it(stack: Stack) -> None:
    """The call that would pass the budget is not made (the review saw 2 calls under a budget of
    1); the message counts the call that was asked for."""

    async def scenario() -> dict[str, Any]:
        async with runtime_client(stack.runtime_url) as client:
            handle = await _spawn(client, "okapi", budgetToolCalls=1)
            (run,) = await _await(client, [handle])
            return run

    run = asyncio.run(scenario())
    assert run["state"] == "cancelled", run
    assert run["error"] == "budget exceeded: toolCalls 2/1"
    assert run["toolCalls"] == 1 and run["used"]["toolCalls"] == 1


def test_budget_seconds_cancels_a_run_by_the_timer(stack: Stack) -> None:
    async def scenario() -> dict[str, Any]:
        async with runtime_client(stack.runtime_url) as client:
            handle = await _spawn(client, "tapir", budgetSeconds=1)
            (run,) = await _await(client, [handle])
            return run

    run = asyncio.run(scenario())
    assert run["state"] == "cancelled", run
    assert re.fullmatch(r"budget exceeded: seconds 1\.\d+/1", run["error"]), run


def test_a_budget_bounds_the_whole_subtree_and_status_sums_it(stack: Stack) -> None:
    async def scenario() -> tuple[str, str, list[dict[str, Any]]]:
        async with runtime_client(stack.runtime_url) as client:
            parent = await _spawn(client, "narwhal", budgetToolCalls=3)
            child = await _spawn(client, "beluga", parent=parent)
            runs = await _await(client, [parent, child])
            return parent, child, runs

    parent, child, (parent_run, child_run) = asyncio.run(scenario())
    message = parent_run["exceeded"]
    assert message == "budget exceeded: toolCalls 4/3", parent_run  # the fourth was asked, not made
    # Alone, neither would pass 3 calls before its 256-token answer; together they would have.
    assert parent_run["state"] == child_run["state"] == "cancelled"
    assert parent_run["error"] == child_run["error"] == message
    assert parent_run["used"]["toolCalls"] == parent_run["toolCalls"] + child_run["toolCalls"] == 3

    by_id = {run["id"]: run for run in _http_status(stack)["runs"]}
    top, below = by_id[parent], by_id[child]
    assert top["children"] == [child] and below["parent"] == parent and top["parent"] is None
    for key in ("turns", "toolCalls", "promptTokens", "completionTokens"):
        assert top["subtree"][key] == top["own"][key] + below["own"][key], key
    assert below["subtree"] == below["own"]
    assert top["own"]["toolSeconds"] > 0 and top["own"]["turnSeconds"] > 0


@pytest.mark.parametrize("name", ["Zoë's harness", "ünïcödé " * 30, "evil\r\nx-luftpause-class: batch"])
def test_a_caller_with_non_ascii_or_control_characters_runs_through_the_real_dataplane(
    stack: Stack, name: str
) -> None:
    """The caller (a 2026-07-28 client's declared name) reaches the dataplane percent-encoded:
    raw UTF-8 went out as latin-1 and the dataplane refused every turn of such a caller; CR LF
    made the HTTP client raise. ``decide`` sends the same header."""
    from luftpause.runtime.dataplane import header_safe

    async def scenario() -> tuple[dict[str, Any], CallToolResult]:
        info = Implementation(name=name, version="1.0")
        async with Client(stack.runtime_url, client_info=info) as client:
            spawned = _payload(await client.call_tool("spawn", {"task": "say hi", "maxToolCalls": 0}))
            result = _payload(
                await client.call_tool("await", {"handles": [spawned["handle"]], "timeout": 60})
            )
            decided = await client.call_tool("decide", {"input": "is it?", "labels": ["yes", "no"]})
            return result["runs"][0], decided

    run, decided = asyncio.run(scenario())
    assert run["state"] == "completed", run
    assert not decided.is_error, decided
    encoded = header_safe(name)
    assert encoded.isascii() and encoded.isprintable() and len(encoded) <= 128 and "\r" not in encoded


def test_status_is_readable_by_the_scheduler_page_only_and_checks_host(stack: Stack) -> None:
    """Any web page could read ``/status`` (``Access-Control-Allow-Origin: *``) and a DNS-rebound
    name reached it; now only the scheduler page's origins get CORS, and a non-loopback ``Host``
    is refused 421 as on ``/mcp``."""
    url = stack.runtime_url.removesuffix("/mcp") + "/status"
    scheduler_port = stack.status_url.rsplit(":", 1)[1].split("/")[0]

    def get(headers: dict[str, str], method: str = "GET") -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(url, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}

    for page in (f"http://127.0.0.1:{scheduler_port}", f"http://localhost:{scheduler_port}"):
        status, headers = get({"Origin": page})
        assert status == 200 and headers["access-control-allow-origin"] == page
        status, headers = get({"Origin": page, "Access-Control-Request-Method": "GET"}, "OPTIONS")
        assert status == 204 and headers["access-control-allow-origin"] == page
    status, headers = get({"Origin": "http://evil.example"})
    assert status == 200 and "access-control-allow-origin" not in headers
    status, _ = get({"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}, "OPTIONS")
    assert status == 403
    status, _ = get({"Host": f"rebound.example:{scheduler_port}"})
    assert status == 421
