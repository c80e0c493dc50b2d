"""The fake MCP tool server (``luftpause fake-mcp``), as a real process and in-process."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextContent

from luftpause.testkit.fakes.fake_mcp import build_server
from luftpause.testkit.launch.procs import ChildProcess, free_port, port_open

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fake_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ChildProcess]]:
    """``luftpause fake-mcp`` on a free port; yields its /mcp URL and the process."""
    port = free_port()
    log: Path = tmp_path_factory.mktemp("fake-mcp") / "fake-mcp.log"
    child = ChildProcess(
        "fake-mcp", ["fake-mcp", "--port", str(port)], log_path=log, ready_port=("127.0.0.1", port)
    )
    child.start()
    try:
        child.wait_ready()
        yield f"http://127.0.0.1:{port}/mcp", child
    finally:
        child.stop()


def text_of(content: list[object]) -> str:
    assert len(content) == 1 and isinstance(content[0], TextContent)
    return content[0].text


async def test_lists_both_tools_as_read_only(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    async with Client(url) as client:
        listing = await client.list_tools()
    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == {"lookup", "deep_search"}
    for tool in tools.values():
        assert tool.description
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is True
        assert tool.annotations.destructive_hint is False
    assert tools["lookup"].input_schema["required"] == ["query"]
    deep = tools["deep_search"].input_schema
    assert deep["required"] == ["query"]
    assert deep["properties"]["depth"]["default"] == 2
    assert deep["properties"]["depth"]["type"] == "integer"


async def test_lookup_answers_about_the_query(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    async with Client(url) as client:
        result = await client.call_tool("lookup", {"query": "tidal energy"})
    assert result.is_error is False
    text = text_of(list(result.content))
    assert text.startswith("Lookup: tidal energy.")
    assert text.count("tidal energy") >= 3


async def test_deep_search_answers_one_section_per_layer(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    async with Client(url) as client:
        default = await client.call_tool("deep_search", {"query": "glaciers"})
        deeper = await client.call_tool("deep_search", {"query": "glaciers", "depth": 4})
        refused = await client.call_tool("deep_search", {"query": "glaciers", "depth": 99})
    assert text_of(list(default.content)).count("Layer ") == 2
    assert text_of(list(deeper.content)).count("Layer ") == 4
    assert len(text_of(list(deeper.content))) > len(text_of(list(default.content)))
    assert refused.is_error is True


async def test_legacy_handshake_clients_are_served(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    async with Client(url, mode="legacy") as client:
        result = await client.call_tool("lookup", {"query": "owls"})
        assert client.protocol_version < "2026"
    assert "owls" in text_of(list(result.content))


async def test_in_process_server_with_a_seed_repeats_itself() -> None:
    answers = []
    for _ in range(2):
        async with Client(build_server(seed=7)) as client:
            result = await client.call_tool("lookup", {"query": "comets"})
            answers.append(text_of(list(result.content)))
    assert answers[0] == answers[1]


def _testkit(url: str, route: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url.removesuffix("/mcp") + route, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


async def test_calls_are_counted_by_the_call_id_in_their_meta(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    async with Client(url) as client:
        for meta in ({"io.luftpause/call-id": "run-x:1:0"}, {"io.luftpause/call-id": "run-x:1:0"}, None):
            await client.call_tool("lookup", {"query": "ids"}, meta=meta)
        await client.call_tool(
            "deep_search", {"query": "ids", "depth": 1}, meta={"io.luftpause/call-id": "b"}
        )
    ids = _testkit(url, "/testkit/call-ids")
    assert ids["run-x:1:0"] == 2 and ids["b"] == 1  # the call without an id is counted by query only
    assert _testkit(url, "/testkit/calls")["lookup ids"] == 3


async def test_a_held_query_waits_until_released(fake_mcp: tuple[str, ChildProcess]) -> None:
    url, _ = fake_mcp
    assert _testkit(url, "/testkit/hold/gated", "POST") == {"held": ["gated"]}
    async with Client(url) as client:
        held = asyncio.ensure_future(client.call_tool("lookup", {"query": "gated"}))
        free = await client.call_tool("lookup", {"query": "free"})  # another query goes through
        assert "free" in text_of(list(free.content))
        for _ in range(500):  # until the held call has started (a fail-safe bound, not a timing)
            if _testkit(url, "/testkit/calls").get("lookup gated") == 1:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # longer than the lookup's own delay: it would have answered
        assert not held.done()
        assert _testkit(url, "/testkit/release/gated", "POST") == {"held": []}
        assert "gated" in text_of(list((await held).content))


def test_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    child = ChildProcess(
        "fake-mcp",
        ["fake-mcp", "--port", str(port), "--seed", "3"],
        log_path=tmp_path / "fake-mcp.log",
        ready_port=("127.0.0.1", port),
    )
    child.start()
    try:
        child.wait_ready()
    finally:
        child.stop()
    assert child.poll() == 0
    assert (
        f"luftpause fake-mcp: serving lookup, deep_search on http://127.0.0.1:{port}/mcp" in child.log_tail()
    )
    assert not port_open("127.0.0.1", port)
