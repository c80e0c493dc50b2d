"""Without ``[runtime] workspace`` no run gets a filesystem scope (issue 6, a newcomer's finding).

The root scope of an MCP caller's runs comes from the configured workspace, and a ``spawn`` scope
must lie within it. With no workspace configured, ``spawn(scope=...)`` was taken within the
ledger's root, the whole filesystem: a caller could hand a sub-agent read and write on ``/`` with
the built-in file tools. Now it is refused, naming the setting.

Real processes: a runtime without a workspace and the scripted engine (:mod:`pods_helpers`),
driven through the real ``mcp`` client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from mcp import Client
from pods_helpers import Pod, call, script, start_pod, tool_text
from postgres_helpers import STORES, on_the_file_journal, store_of

from luftpause.runtime.pods.scopes import NO_WORKSPACE

pytestmark = pytest.mark.integration

FILE_TOOLS = {"read_file", "write_file", "edit_file", "list_directory"}


@pytest.fixture(scope="module", params=STORES)
def pod(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    with start_pod(
        tmp_path_factory.mktemp("no-workspace"),
        workspace=None,
        max_depth=None,
        max_children=None,
        store=store_of(request),
    ) as running:
        yield running


@pytest.mark.parametrize("path", ["/", "/etc", "/tmp", "src"])
@on_the_file_journal("pod")
def test_a_scope_asked_for_without_a_workspace_is_refused_naming_the_setting(pod: Pod, path: str) -> None:
    rules = [{"effect": "allow", "access": ["read", "write"], "path": path}]

    async def go() -> tuple[bool, str, list[dict[str, object]]]:
        async with Client(f"{pod.url}/mcp") as client:
            result = await client.call_tool("spawn", {"task": script({"say": "never"}), "scope": rules})
            return result.is_error, tool_text(result), (await call(client, "list"))["runs"]

    refused, text, runs = asyncio.run(go())
    assert refused and text.endswith(NO_WORKSPACE), text
    assert runs == []  # nothing was started
    assert not any(r["type"] == "scopeGrant" for r in pod.journal())


def test_a_run_without_a_workspace_is_offered_no_file_tools(pod: Pod) -> None:
    task = script({"call": "write_file", "args": {"path": "/tmp/x", "content": "y"}}, {"say": "done"})

    async def go() -> dict[str, object]:
        async with Client(f"{pod.url}/mcp") as client:
            handle = (await call(client, "spawn", task=task, orchestrate=True))["handle"]
            done = await call(client, "await", handles=[handle], timeout=60)
            run: dict[str, object] = done["runs"][0]
            return run

    run = asyncio.run(go())
    handle = str(run["handle"])
    offered = {
        tool["function"]["name"] for body in pod.engine.requests[handle] for tool in body.get("tools", ())
    }
    assert offered and not offered & FILE_TOOLS, offered
    assert (run["state"], run["failedToolCalls"]) == ("completed", 1)
