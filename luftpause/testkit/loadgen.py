"""``luftpause loadgen``: spawn sub-agents through the runtime over MCP and report what happened.

It drives only the runtime: load reaches the proxy as the sub-agents' own turns, never from
loadgen itself. ``--spawn N`` connects to the runtime with the official ``mcp`` client, calls
``spawn`` N times at once, then calls ``await`` on every handle (again and again, at most 60 s per
call, until none is running or ``--timeout`` passes) and prints a summary: runs completed /
failed, tool calls, failed tool calls, tokens, run time p50 / p99 (the runtime's own ``seconds``
per run) and wall time.
The exit status is 0 only when all N runs completed.

``--json`` prints the summary as one JSON object instead::

    {"spawned", "spawnErrors", "completed", "failed", "cancelled", "unfinished", "toolCalls",
     "failedToolCalls", "promptTokens", "completionTokens", "runTimeP50", "runTimeP99",
     "wallTime", "errors": [first distinct error texts]}

Times are seconds. With ``LUFTPAUSE_TOKEN`` set (or ``--token``), every request to the runtime
carries ``Authorization: Bearer <token>``; :func:`runtime_client` is that connection, for tests too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, Implementation, TextContent

from luftpause import __version__

DEFAULT_RUNTIME = "http://127.0.0.1:7000/mcp"
DEFAULT_TASK = (
    "Find out when the first transatlantic telegraph cable went into service and why it failed "
    "within weeks. Look it up, check one detail with a deeper search, and answer in three sentences."
)
AWAIT_SLICE_SECONDS = 60.0
"""Longest single ``await`` call; the runtime answers within it and we ask again."""
MAX_ERRORS_SHOWN = 5
TOKEN_ENV = "LUFTPAUSE_TOKEN"

# The SDK's own defaults for its HTTP client (mcp.shared._httpx_utils): 30 s to connect, write and
# take a pooled connection, 300 s to read, because a response stream may stay open that long.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@asynccontextmanager
async def runtime_client(
    url: str, token: str | None = None, client_info: Implementation | None = None
) -> AsyncIterator[Client]:
    """A connected official ``mcp`` ``Client`` on the runtime's streamable HTTP endpoint ``url``.

    With ``token``, every HTTP request of the session (POST, the GET stream, the closing DELETE)
    carries ``Authorization: Bearer <token>``: the SDK's transport takes a caller's ``httpx2``
    client for that (``streamable_http_client(url, http_client=...)``), whose lifetime stays ours.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http:
        async with Client(streamable_http_client(url, http_client=http), client_info=client_info) as client:
            yield client


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The one-line description comes from luftpause.cli's COMMANDS table.
    parser.epilog = (
        "Load reaches the engines only as the runtime's sub-agent turns, through the dataplane the "
        "runtime is configured with; loadgen sends nothing to the proxy itself."
    )
    parser.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        metavar="URL",
        help=f"the runtime's MCP endpoint (default {DEFAULT_RUNTIME})",
    )
    parser.add_argument("--spawn", type=int, required=True, metavar="N", help="sub-agents to spawn at once")
    parser.add_argument("--task", default=DEFAULT_TASK, metavar="TEXT", help="the task of every sub-agent")
    parser.add_argument(
        "--class",
        dest="service_class",
        choices=("interactive", "batch"),
        default="interactive",
        help="service class of the runs (default interactive)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="give up waiting after S seconds (default 600)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        metavar="TOKEN",
        help=f"bearer token for the runtime (default: ${TOKEN_ENV}, else none)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


@dataclass
class Summary:
    """What a loadgen pass saw; times in seconds."""

    spawned: int = 0
    spawn_errors: int = 0
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    wall_time: float = 0.0

    def count(self, state: str) -> int:
        return sum(1 for run in self.runs.values() if run.get("state") == state)

    def note_error(self, text: str) -> None:
        if text not in self.errors and len(self.errors) < MAX_ERRORS_SHOWN:
            self.errors.append(text)

    def as_dict(self) -> dict[str, Any]:
        times = sorted(run["seconds"] for run in self.runs.values() if run.get("state") != "running")
        return {
            "spawned": self.spawned,
            "spawnErrors": self.spawn_errors,
            "completed": self.count("completed"),
            "failed": self.count("failed"),
            "cancelled": self.count("cancelled"),
            "unfinished": self.count("running"),
            "toolCalls": sum(run.get("toolCalls", 0) for run in self.runs.values()),
            "failedToolCalls": sum(run.get("failedToolCalls", 0) for run in self.runs.values()),
            "promptTokens": sum(run.get("usage", {}).get("promptTokens", 0) for run in self.runs.values()),
            "completionTokens": sum(
                run.get("usage", {}).get("completionTokens", 0) for run in self.runs.values()
            ),
            "runTimeP50": percentile(times, 50),
            "runTimeP99": percentile(times, 99),
            "wallTime": round(self.wall_time, 3),
            "errors": list(self.errors),
        }


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values; ``None`` for none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return round(sorted_values[rank - 1], 3)


def _describe(exc: BaseException) -> str:
    # The SDK's transports raise exception groups; the leaf says what actually went wrong.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def _payload(result: CallToolResult) -> dict[str, Any]:
    """A tool result's JSON object; ``RuntimeError`` with the text for an MCP tool error."""
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    if result.is_error:
        raise RuntimeError(text or "tool error")
    if isinstance(result.structured_content, dict):
        return result.structured_content
    data = json.loads(text)
    if not isinstance(data, dict):
        raise RuntimeError(f"unexpected tool result: {text[:200]}")
    return data


async def drive(
    runtime_url: str,
    spawn: int,
    task: str,
    service_class: str,
    wait_seconds: float,
    token: str | None = None,
) -> Summary:
    """Spawn ``spawn`` runs at once on ``runtime_url`` and await them for at most ``wait_seconds``;
    ``token`` is the runtime's bearer token, if it requires one."""
    summary = Summary()
    started = time.monotonic()
    deadline = started + wait_seconds
    info = Implementation(name="luftpause-loadgen", version=__version__)
    async with runtime_client(runtime_url, token, info) as client:

        async def spawn_one() -> str | None:
            try:
                result = await client.call_tool("spawn", {"task": task, "serviceClass": service_class})
                return str(_payload(result)["handle"])
            except Exception as exc:
                summary.spawn_errors += 1
                summary.note_error(f"spawn: {_describe(exc)}")
                return None

        handles = [h for h in await asyncio.gather(*(spawn_one() for _ in range(spawn))) if h]
        summary.spawned = len(handles)
        pending = list(handles)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = min(remaining, AWAIT_SLICE_SECONDS)
            result = await client.call_tool(
                "await",
                {"handles": pending, "mode": "all", "timeout": wait},
                read_timeout_seconds=wait + 30,
            )
            for run in _payload(result)["runs"]:
                summary.runs[run["handle"]] = run
                if run.get("error"):
                    summary.note_error(f"{run['state']}: {run['error']}")
            pending = [h for h in pending if summary.runs[h]["state"] == "running"]
    summary.wall_time = time.monotonic() - started
    return summary


def render(data: dict[str, Any]) -> str:
    """The summary as a small table."""

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = [
        f"runs        {data['spawned']} spawned ({data['spawnErrors']} spawn errors): "
        f"{data['completed']} completed, {data['failed']} failed, {data['cancelled']} cancelled, "
        f"{data['unfinished']} unfinished",
        f"tool calls  {data['toolCalls']} ({data['failedToolCalls']} failed)",
        f"tokens      {data['promptTokens']} prompt, {data['completionTokens']} completion",
        f"run time    p50 {secs(data['runTimeP50'])}, p99 {secs(data['runTimeP99'])}",
        f"wall time   {secs(data['wallTime'])}",
    ]
    lines += [f"error       {text}" for text in data["errors"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run one pass; 0 only if every requested run completed, 1 otherwise."""
    if args.spawn < 1:
        print("luftpause loadgen: --spawn must be at least 1", file=sys.stderr)
        return 2
    try:
        summary = asyncio.run(
            drive(args.runtime, args.spawn, args.task, args.service_class, args.timeout, args.token)
        )
    except Exception as exc:
        print(f"luftpause loadgen: runtime {args.runtime}: {_describe(exc)}", file=sys.stderr)
        return 1
    data = summary.as_dict()
    print(json.dumps(data) if args.json else render(data), flush=True)
    return 0 if data["completed"] == args.spawn else 1
