"""Sub-agents over MCP in a closed loop: a flood's load, with the runtime driving every run.

Each :class:`~luftpause.testkit.load.agents.AgentGroup` is one MCP client of the runtime (the official
``mcp`` client, :func:`~luftpause.testkit.commands.loadgen.runtime_client`), whose every request names the
group's caller in ``x-luftpause-caller``, as a harness configured with a header per user sends it.
The client keeps ``agents`` sub-agents of the group's service class running for ``duration_s``
seconds: it calls ``spawn`` that many times at once, then ``await`` on the running handles with
``mode = "any"``, and for each run that ended spawns the next at once, until the deadline. The
runtime's sub-agent loop makes the runs' turns (through the dataplane, where the scheduler sees
them as that caller's) and their tool rounds (on its upstream MCP servers); the client only
spawns and waits, as an orchestrating harness does.

Each run is spawned with the own-loop agents' prompt shape (:mod:`luftpause.testkit.load.agents`): a
``context_tokens`` system prompt that begins with an id of its own (``loadgen-<32 hex digits>``,
so no two runs share a prefix), the task, ``max_tokens`` per turn, and only the tools named in
``tools`` (default ``lookup``; no parallel calls). Runs still running at the deadline are
cancelled (``cancel``) and count as ``unfinished``.

What a run was comes from the runtime's ``await`` result, as a
:class:`~luftpause.testkit.load.agents.RunOutcome`: ``completed``, or ``failed`` (a ``failed`` or
``cancelled`` run, or a ``spawn`` the runtime refused; ``error`` says why), its ``seconds`` (the
runtime's own), turns, tool calls (one round each: calls are not parallel) and prompt tokens. The
runtime does not pass on the engine's cached prompt tokens, so ``cached_tokens`` is 0 and the
prefix cache is read from the engines instead; no time to first token is seen. So the summary of
:func:`~luftpause.testkit.load.agents_summary.summarize_agents` applies as it does to own-loop agents.

Errors: a transport failure of a group's MCP connection propagates (the pass is not valid); a
refused ``spawn`` is a failed run and its agent waits as an own-loop agent does after one (1 s,
doubling to 10 s), so a refusing runtime is not hammered. Each spawn (and its waits) runs as a task
of its own, gathered at the deadline, so an agent waiting holds up none of its group's others.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from mcp import Client
from mcp.types import Implementation

from luftpause import __version__
from luftpause.testkit.commands.loadgen import (
    AWAIT_SLICE_SECONDS,
    describe_error,
    runtime_client,
    tool_payload,
)
from luftpause.testkit.load.agents import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    AgentGroup,
    RunOutcome,
    system_prompt,
)

FINISHED = frozenset({"completed", "failed", "cancelled"})
"""Run states after which a run takes no more turns (``await``'s ``state``)."""
SPAWNING_SLICE_S = 1.0
"""Longest ``await`` call while a spawn is on its way (seconds): its run is awaited from the next."""


@dataclass(frozen=True, slots=True)
class SubagentSettings:
    """What every sub-agent of a pass is spawned with; ``runtime_url`` is the runtime's MCP
    endpoint (``http://host:port/mcp``), sizes in tokens."""

    runtime_url: str
    task: str
    context_tokens: int = 512
    max_tokens: int = 64
    tools: tuple[str, ...] = ("lookup",)
    token: str | None = None
    first_backoff_s: float = FIRST_BACKOFF_S
    """An agent's wait after its first refused spawn (seconds; doubled after each refusal since,
    up to :data:`MAX_BACKOFF_S`)."""


def spawn_arguments(settings: SubagentSettings, service_class: str) -> tuple[str, dict[str, object]]:
    """A new run's id of our own and its ``spawn`` arguments (module docstring)."""
    own_id = f"loadgen-{uuid.uuid4().hex}"
    arguments: dict[str, object] = {
        "task": settings.task,
        "system": system_prompt(own_id, settings.context_tokens),
        "serviceClass": service_class,
        "maxTokens": settings.max_tokens,
        "tools": list(settings.tools),
        "parallelToolCalls": False,
    }
    return own_id, arguments


def _record(outcome: RunOutcome, run: dict[str, Any]) -> None:
    """Fill ``outcome`` from the ``await`` result of its run, which has ended."""
    state = str(run.get("state"))
    outcome.state = "completed" if state == "completed" else "failed"
    outcome.error = "" if state == "completed" else f"{state}: {run.get('error') or ''}"
    outcome.seconds = float(run.get("seconds") or 0.0)
    outcome.turns = int(run.get("turns") or 0)
    outcome.tool_calls = outcome.tool_rounds = int(run.get("toolCalls") or 0)
    usage = run.get("usage")
    if isinstance(usage, dict):
        outcome.prompt_tokens = int(usage.get("promptTokens") or 0)


async def _group(
    settings: SubagentSettings,
    index: int,
    spec: AgentGroup,
    deadline: float,
    outcomes: list[RunOutcome],
) -> None:
    """One group's client: ``spec.agents`` sub-agents kept running until ``deadline``."""
    info = Implementation(name=f"luftpause-loadgen-{spec.caller or 'anonymous'}", version=__version__)
    running: dict[str, RunOutcome] = {}
    spawning: set[asyncio.Task[None]] = set()
    async with runtime_client(settings.runtime_url, settings.token, info, spec.caller or None) as client:

        async def spawn_one() -> None:
            """Spawn one run, after a refused one waiting as an own-loop agent waits."""
            backoff = 0.0
            while time.monotonic() < deadline:
                outcome = RunOutcome(group=index, service_class=spec.service_class, caller=spec.caller)
                outcomes.append(outcome)
                own_id, arguments = spawn_arguments(settings, spec.service_class)
                try:
                    payload = tool_payload(await client.call_tool("spawn", arguments))
                    outcome.run_id = str(payload["handle"])
                    running[outcome.run_id] = outcome
                    return
                except RuntimeError as exc:  # the runtime refused: a failed run of this agent
                    outcome.state, outcome.error = "failed", f"spawn {own_id}: {describe_error(exc)}"
                backoff = min(MAX_BACKOFF_S, backoff * 2) if backoff else settings.first_backoff_s
                await asyncio.sleep(max(0.0, min(backoff, deadline - time.monotonic())))

        def start_spawn() -> None:
            # In the background: an agent backing off after a refused spawn holds up no other.
            spawning.add(asyncio.create_task(spawn_one()))

        for _ in range(spec.agents):
            start_spawn()
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                _reap(spawning)
                if not running:
                    if not spawning:
                        break
                    await asyncio.wait(spawning, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # While spawns are on their way, ask again soon, so their runs join the awaited ones.
                wait = min(remaining, SPAWNING_SLICE_S if spawning else AWAIT_SLICE_SECONDS)
                result = await client.call_tool(
                    "await",
                    {"handles": list(running), "mode": "any", "timeout": wait},
                    read_timeout_seconds=wait + 30,
                )
                for run in tool_payload(result)["runs"]:
                    outcome = running.get(str(run.get("handle")))
                    if outcome is not None and run.get("state") in FINISHED:
                        _record(outcome, run)
                        del running[outcome.run_id]
                        if time.monotonic() < deadline:
                            start_spawn()
            # The deadline: spawns still on their way end (a back-off stops at it) ...
            await asyncio.gather(*spawning)
        finally:
            for task in spawning:
                task.cancel()
        # ... and what still runs is unfinished, cancelled as an own-loop agent ends its run.
        await asyncio.gather(*(_cancel(client, handle) for handle in list(running)))


def _reap(spawning: set[asyncio.Task[None]]) -> None:
    """Drop the spawns that are done; a transport failure in one propagates (module docstring)."""
    for task in [t for t in spawning if t.done()]:
        spawning.discard(task)
        task.result()


async def _cancel(client: Client, handle: str) -> None:
    try:
        await client.call_tool("cancel", {"handle": handle})
    except Exception:  # a courtesy: the run's end frees its state sooner, nothing more
        pass


async def closed_loop_subagents(
    settings: SubagentSettings, groups: list[AgentGroup], duration_s: float
) -> list[RunOutcome]:
    """Every group's sub-agents for ``duration_s`` seconds (module docstring): each run that
    ended within the duration, refused spawns as failed runs, and the runs the deadline cut
    short as ``unfinished``."""
    outcomes: list[RunOutcome] = []
    deadline = time.monotonic() + duration_s
    await asyncio.gather(*(_group(settings, i, spec, deadline, outcomes) for i, spec in enumerate(groups)))
    return outcomes
