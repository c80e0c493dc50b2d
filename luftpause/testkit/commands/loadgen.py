"""``luftpause loadgen``: load for a luftpause stack, over MCP or through the proxy, and a summary.

Two modes, one per invocation:

* ``--spawn N``: fan-out over MCP. Connects to the runtime with the official ``mcp`` client, calls
  ``spawn`` N times at once (``--sequential``: spawn and await one at a time), then calls
  ``await`` on every handle (again and again, at most 60 s per call, until none is running or
  ``--timeout`` passes). Load reaches the proxy as the sub-agents' own turns. Summary: runs
  completed / failed, tool calls, failed tool calls, tokens, run time p50 / p99 (the runtime's
  own ``seconds`` per run), wall time and completed runs per minute of it; ``--json``::

    {"spawned", "spawnErrors", "completed", "failed", "cancelled", "unfinished", "toolCalls",
     "failedToolCalls", "promptTokens", "completionTokens", "runTimeP50", "runTimeP99",
     "wallTime", "runsPerMinute", "errors": [first distinct error texts]}

  The exit status is 0 only when all N runs completed. ``--caller`` is refused here: the caller of
  a sub-agent's turns is the runtime's, named after the MCP client (``luftpause-loadgen``), not
  something a ``spawn`` call sets.

* ``--agents N [--class C] [--caller NAME]``, repeatable for a mix (each ``--agents`` starts a
  group; the ``--class`` and ``--caller`` after it are that group's): closed-loop own-loop agents
  (:mod:`luftpause.testkit.load.agents`) through the proxy for ``--duration-s`` seconds, each run with
  up to ``--tool-rounds`` tool rounds (``--tool-rounds-by agent``: every reply counts as a tool
  call, for models that never call tools) and a ``--context-tokens`` system prompt. A progress bar
  runs on a terminal; the summary is a table per class and caller group (runs/min, run time and
  time to first token p50 / p99, failures, and the prompt tokens the engine reported as served
  from its prefix cache); ``--json``::

    {"durationS", "groups": [{"agents", "class", "caller", "completed", "failed", "unfinished",
     "runsPerMinute", "turns", "toolRounds", "toolCalls", "unforced", "promptTokens", "cacheHitRate",
     "runTimeP50", "runTimeP99", "ttftP50", "ttftP99"}],
     "errors": [...]}

  The exit status is 0 when no run failed. A failed run makes its agent pause before the next
  (1 s doubling to 10 s, at least a 429's ``Retry-After``; see :mod:`luftpause.testkit.load.agents`).

``--runtime`` (the MCP endpoint) and ``--proxy`` (the dataplane's base URL) default to the
configuration's ``[runtime] listen`` and ``[dataplane] listen`` (``--config FILE``, else
``LUFTPAUSE_CONFIG``, else the embedded default: ``http://127.0.0.1:7000/mcp`` and
``http://127.0.0.1:8080``); given, they win.

Times are seconds. With ``LUFTPAUSE_TOKEN`` set (or ``--token``), every request carries
``Authorization: Bearer <token>``; :func:`runtime_client` is the MCP connection, for tests too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, Implementation, TextContent

from luftpause import __version__
from luftpause.config import listen_url
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.extras import MissingExtra, require_tui
from luftpause.testkit.load.agents import TOOL_ROUNDS_BY, AgentGroup, AgentSettings, RunOutcome, closed_loop

# percentile and summarize_agents are re-exported: bench/fanout.py and bench/flood.py import them here
from luftpause.testkit.load.agents_summary import MAX_ERRORS_SHOWN, render_agents
from luftpause.testkit.load.agents_summary import percentile as percentile
from luftpause.testkit.load.agents_summary import summarize_agents as summarize_agents

DEFAULT_TASK = (
    "Find out when the first transatlantic telegraph cable went into service and why it failed "
    "within weeks. Look it up, check one detail with a deeper search, and answer in three sentences."
)
AWAIT_SLICE_SECONDS = 60.0
"""Longest single ``await`` call; the runtime answers within it and we ask again."""
TOKEN_ENV = "LUFTPAUSE_TOKEN"

# The SDK's own defaults for its HTTP client (mcp.shared._httpx_utils): 30 s to connect, write and
# take a pooled connection, 300 s to read, because a response stream may stay open that long.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@asynccontextmanager
async def runtime_client(
    url: str,
    token: str | None = None,
    client_info: Implementation | None = None,
    caller: str | None = None,
) -> AsyncIterator[Client]:
    """A connected official ``mcp`` ``Client`` on the runtime's streamable HTTP endpoint ``url``.

    With ``token``, every HTTP request of the session (POST, the GET stream, the closing DELETE)
    carries ``Authorization: Bearer <token>``: the SDK's transport takes a caller's ``httpx2``
    client for that (``streamable_http_client(url, http_client=...)``), whose lifetime stays ours.
    With ``caller``, every request names it in ``x-luftpause-caller``, so the runs this client
    spawns are that caller's (:mod:`luftpause.runtime.mcp.callers`), as a harness configured with
    a header per user would send.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if caller:
        headers["x-luftpause-caller"] = caller
    async with httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http:
        async with Client(streamable_http_client(url, http_client=http), client_info=client_info) as client:
            yield client


class _NewGroup(argparse.Action):
    """``--agents N`` starts a new group of own-loop agents."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values < 1:
            parser.error("--agents must be at least 1")
        groups = list(getattr(namespace, "groups", None) or [])
        groups.append({"agents": values})
        namespace.groups = groups


class _GroupField(argparse.Action):
    """``--class`` / ``--caller``: a field of the latest ``--agents`` group (or of ``--spawn``)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)  # --spawn reads the last one given
        groups = getattr(namespace, "groups", None)
        if not groups:
            namespace.loose_option = option_string  # an --agents pass refuses it: which group?
        else:
            if self.dest in groups[-1]:
                parser.error(f"{option_string} given twice for one --agents group")
            groups[-1][self.dest] = values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The one-line description comes from luftpause.cli's COMMANDS table.
    parser.epilog = (
        "--spawn drives the runtime over MCP: load reaches the engines only as its sub-agents' turns. "
        "--agents drives the proxy with own-loop agents; repeat it for a mix, e.g. "
        "--agents 48 --class batch --caller bulk --agents 4 --class interactive --caller ide."
    )
    add_config_argument(parser)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--spawn", type=int, metavar="N", help="sub-agents to spawn over MCP")
    mode.add_argument(
        "--agents",
        type=int,
        action=_NewGroup,
        metavar="N",
        help="closed-loop own-loop agents through the proxy",
    )
    parser.set_defaults(groups=[], loose_option=None)
    parser.add_argument(
        "--class",
        dest="service_class",
        choices=("interactive", "batch"),
        default="interactive",
        action=_GroupField,
        help="service class of the runs (default interactive)",
    )
    parser.add_argument(
        "--caller",
        default="",
        action=_GroupField,
        metavar="NAME",
        help="x-luftpause-caller of the group's runs (default: none, the header is not sent)",
    )
    parser.add_argument(
        "--task", default=DEFAULT_TASK, metavar="TEXT", help="the task of every run (default: %(default)r)"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        metavar="TOKEN",
        help=f"bearer token for luftpause (default: ${TOKEN_ENV}, else none)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    spawn = parser.add_argument_group("--spawn (MCP runtime)")
    spawn.add_argument(
        "--runtime",
        default=None,
        metavar="URL",
        help="the runtime's MCP endpoint (default: from the configuration's [runtime] listen, "
        "http://127.0.0.1:7000/mcp in the embedded default)",
    )
    spawn.add_argument("--sequential", action="store_true", help="spawn and await one run at a time")
    spawn.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="give up waiting after S seconds (default 600)",
    )
    agents = parser.add_argument_group("--agents (proxy)")
    agents.add_argument(
        "--proxy",
        default=None,
        metavar="URL",
        help="the dataplane's base URL (default: from the configuration's [dataplane] listen, "
        "http://127.0.0.1:8080 in the embedded default)",
    )
    agents.add_argument(
        "--model", metavar="NAME", help="model of every turn (default: the proxy's first model)"
    )
    agents.add_argument(
        "--duration-s", type=float, default=60.0, metavar="S", help="how long to run (default 60)"
    )
    agents.add_argument(
        "--tool-rounds", type=int, default=2, metavar="K", help="tool rounds per run at most (default 2)"
    )
    agents.add_argument(
        "--context-tokens",
        type=int,
        default=512,
        metavar="T",
        help="system prompt size per run (default 512)",
    )
    agents.add_argument(
        "--tool-seconds",
        type=float,
        default=0.2,
        metavar="S",
        help="time each simulated tool takes (default 0.2)",
    )
    agents.add_argument(
        "--max-tokens", type=int, default=64, metavar="T", help="reply length per turn (default 64)"
    )
    agents.add_argument(
        "--tool-rounds-by",
        choices=TOOL_ROUNDS_BY,
        default="model",
        help="model: a round when the reply calls a tool (default); agent: every reply counts as a "
        "tool call until --tool-rounds were made, for models that never call tools",
    )


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
            "runsPerMinute": (
                round(self.count("completed") * 60.0 / self.wall_time, 2) if self.wall_time > 0 else None
            ),
            "errors": list(self.errors),
        }


def describe_error(exc: BaseException) -> str:
    """What went wrong, in one line: the SDK's transports raise exception groups, and the first
    leaf says it (its text, else its type's name)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def tool_payload(result: CallToolResult) -> dict[str, Any]:
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
                return str(tool_payload(result)["handle"])
            except Exception as exc:
                summary.spawn_errors += 1
                summary.note_error(f"spawn: {describe_error(exc)}")
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
            for run in tool_payload(result)["runs"]:
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
        f"wall time   {secs(data['wallTime'])}, {data['runsPerMinute']} completed runs/min",
    ]
    lines += [f"error       {text}" for text in data["errors"]]
    return "\n".join(lines)


async def drive_sequential(
    runtime_url: str, spawn: int, task: str, service_class: str, wait_seconds: float, token: str | None = None
) -> Summary:
    """Like :func:`drive`, but each run is spawned only when the one before it has ended."""
    total = Summary()
    started = time.monotonic()
    for _ in range(spawn):
        remaining = wait_seconds - (time.monotonic() - started)
        if remaining <= 0:
            break
        one = await drive(runtime_url, 1, task, service_class, remaining, token)
        total.spawned += one.spawned
        total.spawn_errors += one.spawn_errors
        total.runs.update(one.runs)
        for text in one.errors:
            total.note_error(text)
    total.wall_time = time.monotonic() - started
    return total


async def first_model(proxy: str, token: str | None) -> str:
    """The first model the proxy's ``GET /v1/models`` lists; ``RuntimeError`` when none."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session:
        async with session.get(f"{proxy}/v1/models", headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(
                    f"GET /v1/models answered {response.status}: {(await response.text())[:200]}"
                )
            models = (await response.json()).get("data") or []
    if not models:
        raise RuntimeError("the proxy serves no model")
    return str(models[0]["id"])


async def drive_agents(args: argparse.Namespace, groups: list[AgentGroup]) -> dict[str, Any]:
    """Run the ``--agents`` pass with a progress bar on a terminal; the summary as a dict."""
    proxy = args.proxy.rstrip("/")
    model = args.model or await first_model(proxy, args.token)
    settings = AgentSettings(
        proxy=proxy,
        model=model,
        task=args.task,
        tool_rounds=args.tool_rounds,
        context_tokens=args.context_tokens,
        tool_seconds=args.tool_seconds,
        max_tokens=args.max_tokens,
        token=args.token,
        tool_rounds_by=args.tool_rounds_by,
    )
    if args.json or not sys.stderr.isatty():  # nothing is drawn: rich is not needed
        outcomes = await closed_loop(settings, groups, args.duration_s, lambda outcome: None)
        return summarize_agents(groups, outcomes, args.duration_s)
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError as exc:
        raise MissingExtra("tui", "its progress display", exc) from None
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[runs]} runs, {task.fields[failed]} failed"),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )
    labels = [f"{g.service_class} {g.caller or '(anonymous)'}" for g in groups]
    ids = [progress.add_task(label, total=args.duration_s, runs=0, failed=0) for label in labels]
    counts = [[0, 0] for _ in groups]

    def on_outcome(outcome: RunOutcome) -> None:
        counts[outcome.group][0 if outcome.state == "completed" else 1] += 1
        runs, failed = counts[outcome.group]
        progress.update(ids[outcome.group], runs=runs, failed=failed)

    async def tick() -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            for task_id in ids:
                progress.update(task_id, completed=min(args.duration_s, time.monotonic() - started))

    with progress:
        ticker = asyncio.ensure_future(tick())
        try:
            outcomes = await closed_loop(settings, groups, args.duration_s, on_outcome)
        finally:
            ticker.cancel()
    return summarize_agents(groups, outcomes, args.duration_s)


def _default_url(args: argparse.Namespace) -> None:
    """Fill the URL this pass needs (``--proxy`` for ``--agents``, ``--runtime`` for ``--spawn``)
    from the configuration's listen address when it was not given. Only then is the configuration
    read: a bad one ends the command (exit 2, see :func:`luftpause.config.arguments.config_from_args`)."""
    if args.groups and args.proxy is None:
        args.proxy = listen_url(config_from_args(args).dataplane.listen)
    elif not args.groups and args.runtime is None:
        args.runtime = f"{listen_url(config_from_args(args).runtime.listen)}/mcp"


def run(args: argparse.Namespace) -> int:
    """Run one pass. ``--spawn``: 0 only if every run completed; ``--agents``: 0 if none failed."""
    if args.groups:
        return _run_agents(args)
    if args.spawn < 1:
        print("luftpause loadgen: --spawn must be at least 1", file=sys.stderr)
        return 2
    if args.caller:
        print(
            "luftpause loadgen: --caller applies to --agents only; with --spawn the caller of the "
            "sub-agents' turns is the runtime's, named after the MCP client (luftpause-loadgen)",
            file=sys.stderr,
        )
        return 2
    _default_url(args)
    drive_spawn = drive_sequential if args.sequential else drive
    try:
        summary = asyncio.run(
            drive_spawn(args.runtime, args.spawn, args.task, args.service_class, args.timeout, args.token)
        )
    except Exception as exc:
        print(f"luftpause loadgen: runtime {args.runtime}: {describe_error(exc)}", file=sys.stderr)
        return 1
    data = summary.as_dict()
    print(json.dumps(data) if args.json else render(data), flush=True)
    return 0 if data["completed"] == args.spawn else 1


def _run_agents(args: argparse.Namespace) -> int:
    if args.loose_option:
        print(
            f"luftpause loadgen: {args.loose_option} comes before any --agents; "
            "put it after the --agents group it belongs to",
            file=sys.stderr,
        )
        return 2
    if args.duration_s <= 0 or args.tool_rounds < 0 or args.context_tokens < 0 or args.max_tokens < 1:
        print(
            "luftpause loadgen: --duration-s must be positive, --tool-rounds and --context-tokens "
            "not negative, --max-tokens at least 1",
            file=sys.stderr,
        )
        return 2
    if not args.json:  # the summary is a table (and, on a terminal, a progress display)
        require_tui("its summary table")
    _default_url(args)
    groups = [
        AgentGroup(g["agents"], g.get("service_class", "interactive"), g.get("caller", ""))
        for g in args.groups
    ]
    try:
        data = asyncio.run(drive_agents(args, groups))
    except Exception as exc:
        print(f"luftpause loadgen: proxy {args.proxy}: {describe_error(exc)}", file=sys.stderr)
        return 1
    print(json.dumps(data) if args.json else render_agents(data), flush=True)
    return 0 if all(row["failed"] == 0 for row in data["groups"]) else 1
