"""A stdio MCP tool server for tests: ``python -m luftpause.testkit.fakes.fake_mcp_stdio``.

Configured in a runtime as ``[[mcp_servers]] command = [python, "-m",
"luftpause.testkit.fakes.fake_mcp_stdio"]``. Its tools exist to check what a client sent and how it copes
with a server that dies:

* ``count_items(limit: integer)``: answers ``{"limit": <limit>, "type": "int"}``. ``limit`` is
  validated strictly (the text ``"3"`` is refused), so a success proves the caller sent a JSON
  integer;
* ``rendezvous(name, peers = 2, seconds = 10)``: waits until ``peers`` calls of it are in flight at
  once (answers ``met <name>``) or ``seconds`` pass (answers ``alone <name>``), so concurrent calls
  can be told from sequential ones without timing anything;
* ``exit_mid_call(code = 3)``: records the call, then the process exits with ``code`` before
  answering: the call is in flight when the server dies;
* ``pid()``: the server's process id, so a test can see it was restarted;
* ``delete_note(name)``: marked ``destructiveHint: true`` (and not read-only); records the call.

Every call is appended to the file named by the environment variable
:data:`CALLS_LOG_ENV` (if set) as one JSON line ``{"event": "start" | "end", "tool", "arguments",
"pid"}``, written and flushed before the tool does anything else, so a test can count calls across
restarts of the process. Built with the official SDK (``mcp`` 2.3, ``MCPServer``, stdio transport).
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import anyio
from mcp.server import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

CALLS_LOG_ENV = "LUFTPAUSE_FAKE_MCP_STDIO_LOG"
"""Environment variable naming the file every call is appended to (JSON lines)."""

TOOL_NAMES = ("count_items", "rendezvous", "exit_mid_call", "pid", "delete_note")


def _record(event: str, tool: str, arguments: dict[str, Any]) -> None:
    path = os.environ.get(CALLS_LOG_ENV)
    if not path:
        return
    line = json.dumps({"event": event, "tool": tool, "arguments": arguments, "pid": os.getpid()})
    with open(path, "a", encoding="utf-8") as log:
        log.write(line + "\n")


def read_calls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The calls recorded in ``path`` (see the module docstring), oldest first; ``[]`` if none."""
    try:
        with open(path, encoding="utf-8") as log:
            return [json.loads(line) for line in log if line.strip()]
    except FileNotFoundError:
        return []


def build_server() -> MCPServer:
    """The server with the tools of the module docstring."""
    server = MCPServer("luftpause-fake-mcp-stdio", log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False)
    in_flight = [0]
    # The calls in flight share one event, set when enough of them are in flight at once; the next
    # calls get a fresh one. (A waiter that re-counted after waking could miss a peer that met it
    # and already returned.)
    cohort = [anyio.Event()]

    async def count_items(
        limit: Annotated[int, Field(strict=True, ge=0, description="How many items to count.")],
    ) -> str:
        _record("start", "count_items", {"limit": limit})
        return json.dumps({"limit": limit, "type": type(limit).__name__})

    async def rendezvous(
        name: Annotated[str, Field(description="A label echoed back.")],
        peers: Annotated[int, Field(ge=1, description="Calls that must be in flight at once.")] = 2,
        seconds: Annotated[float, Field(gt=0, description="Longest wait.")] = 10.0,
    ) -> str:
        _record("start", "rendezvous", {"name": name, "peers": peers, "seconds": seconds})
        mine = cohort[0]
        in_flight[0] += 1
        try:
            if in_flight[0] >= peers:
                mine.set()
                cohort[0] = anyio.Event()
            with anyio.move_on_after(seconds):
                await mine.wait()
        finally:
            in_flight[0] -= 1
        _record("end", "rendezvous", {"name": name})
        return f"{'met' if mine.is_set() else 'alone'} {name}"

    async def exit_mid_call(code: Annotated[int, Field(ge=1, le=255)] = 3) -> str:
        _record("start", "exit_mid_call", {"code": code})
        os._exit(code)

    async def pid() -> str:
        return str(os.getpid())

    async def delete_note(name: Annotated[str, Field(description="The note to delete.")]) -> str:
        _record("start", "delete_note", {"name": name})
        return f"deleted {name}"

    server.add_tool(
        count_items, description="Count up to a limit.", annotations=read_only, structured_output=False
    )
    server.add_tool(
        rendezvous,
        description="Wait until enough calls of this tool are in flight at once.",
        annotations=read_only,
        structured_output=False,
    )
    server.add_tool(exit_mid_call, description="Exit the server process mid-call.", structured_output=False)
    server.add_tool(
        pid, description="The server's process id.", annotations=read_only, structured_output=False
    )
    server.add_tool(
        delete_note,
        description="Delete a note (destructive).",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
        structured_output=False,
    )
    return server


def main() -> None:
    """Serve on stdin/stdout until stdin closes."""
    build_server().run("stdio")


if __name__ == "__main__":
    main()
