"""Another MCP client than our own: the MCP Inspector's command-line mode (npm
``@modelcontextprotocol/inspector``) lists and calls the runtime's tools over streamable HTTP.

Run through ``npx --yes`` (fetched from the npm registry on first use, cached after) with a
timeout; skipped, with the reason, only where ``npx`` is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from luftpause.testkit.launch.stack import Stack

INSPECTOR = "@modelcontextprotocol/inspector"
TIMEOUT_S = 300  # the first run downloads the package


def inspector(stack: Stack, *args: str) -> Any:
    """Run ``npx --yes @modelcontextprotocol/inspector --cli <runtime> --transport http ARGS``;
    its JSON answer."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx (npm) is not installed: the MCP Inspector cannot run here")
    result = subprocess.run(
        [npx, "--yes", INSPECTOR, "--cli", stack.runtime_url, "--transport", "http", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"inspector {args}: {result.stderr}\n{result.stdout}"
    return json.loads(result.stdout)


@pytest.mark.integration
def test_inspector_lists_the_runtime_tools(stack: Stack) -> None:
    listed = inspector(stack, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"spawn", "await", "status", "cancel", "run", "decide"} <= names
    spawn = next(tool for tool in listed["tools"] if tool["name"] == "spawn")
    assert "task" in spawn["inputSchema"]["properties"]


@pytest.mark.integration
def test_inspector_calls_status_and_spawn(stack: Stack) -> None:
    spawned = inspector(stack, "--method", "tools/call", "--tool-name", "spawn", "--tool-arg", "task=say hi")
    assert not spawned.get("isError"), spawned
    handle = json.loads(spawned["content"][0]["text"])["handle"]
    status = inspector(
        stack, "--method", "tools/call", "--tool-name", "status", "--tool-arg", f"handle={handle}"
    )
    assert not status.get("isError"), status
    assert handle in status["content"][0]["text"]
