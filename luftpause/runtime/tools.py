"""The runtime's MCP tools: ``spawn``, ``await``, ``status``, ``cancel``.

Argument names are camelCase on the wire, as in DESIGN.md ("The runtime"). Results are JSON
objects (``structuredContent``, and the same JSON as the text content)::

    spawn(task, model?, serviceClass = "interactive" | "batch", system?, maxToolCalls = 8,
          tools?: [name], maxTokens = 256, parallelToolCalls = false, parent?: handle,
          budgetTokens?, budgetToolCalls?, budgetSeconds?)             task, system: at most 1 MiB
        -> {"handle": "run-…", "state": "running"}                       at once
    await(handles: [handle], mode = "all" | "any", timeout = 60)        timeout capped at 600 s
        -> {"runs": [run result], "timedOut": bool}
    status(handle?)
        -> {"run": run status, whole task}  or  {"runs": [run status of the caller's runs,
                                                          task summarized]}
    cancel(handle)
        -> {"handle", "cancelled": [handles stopped: the run and its running descendants]}
    tools(handle?)
        -> {"servers": [{"server", "transport", "reachable", "error"?, "tools": [{"name",
            "description", "inputSchema", "annotations"}]}]}      (UpstreamPool.catalog)

    run result = {"handle", "state": running|completed|failed|cancelled, "answer"?, "error"?,
                  "toolCalls", "failedToolCalls", "turns", "seconds",
                  "usage": {"promptTokens", "completionTokens"},
                  "limits"?, "used"?, "exceeded"? (a run that sets budgets)}
    run status = run result + {"model", "serviceClass", "caller", "task", "taskChars",
                               "maxToolCalls", "startedAt", "parent", "children"}

Budgets bound the run and all its descendants (:mod:`luftpause.runtime.budgets`): ``budgetTokens``
(prompt + completion tokens), ``budgetToolCalls``, ``budgetSeconds`` (wall time since the run
started); on excess the subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.
A cancelled run reports state ``cancelled`` and the reason as its ``error``.

A listing of runs shows each task summarized (its first 200 characters and ``…``; ``taskChars`` is
the whole length), so it stays small however long the tasks; ``status`` for one handle shows it whole.

Bad input comes back as an MCP tool error (``isError: true``) whose text says what was wrong: an
unknown or expired handle (or ``parent``), a cancelled ``parent``, a ``serviceClass`` or ``mode``
outside its enum, an unknown tool name, a model no generative replica serves, ``maxToolCalls``
outside 0..1000, ``maxTokens`` outside 0..1,000,000, a budget below 1 (or past its bound), a
``task`` or ``system`` longer than 1 MiB (UTF-8), a ``timeout`` that is not a finite number.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from luftpause import __version__
from luftpause.runtime.errors import RuntimeFault, UnknownModel
from luftpause.runtime.runs import Run, new_handle

if TYPE_CHECKING:
    from luftpause.runtime.server import Runtime

MAX_AWAIT_SECONDS = 600.0
DEFAULT_AWAIT_SECONDS = 60.0

MAX_TOOL_CALLS = 1000
"""Highest ``maxToolCalls``: 125 times the default budget of 8, far past any sub-agent task, and
low enough that every counter stays a small integer (an unbounded one reached ``GET /status`` as a
number JSON encoders refuse)."""

MAX_TOKENS_PER_TURN = 1_000_000
"""Highest ``maxTokens`` per turn: above the longest context any engine serves today, so it never
refuses a real request, and a bound on what we send on."""

MAX_BUDGET_TOKENS = 10**12
"""Highest ``budgetTokens``: far past any run, and a bound that keeps counters small integers."""

MAX_BUDGET_TOOL_CALLS = 10**9
"""Highest ``budgetToolCalls``."""

MAX_BUDGET_SECONDS = 365 * 24 * 3600.0
"""Highest ``budgetSeconds`` (a year): past it a timer is pointless."""

MAX_TEXT_BYTES = 1024 * 1024
"""Longest ``spawn`` ``task`` and ``system``, each, in UTF-8 bytes (1 MiB, about 260,000 tokens):
past the context of any engine served today, so no real task is refused, while every run a client
spawns holds at most this much of its own text until it is dropped. (The SDK refuses a whole request
body past 4 MiB with HTTP 413 before any tool sees it.)"""


def check_text_size(name: str, text: str | None, limit: int = MAX_TEXT_BYTES) -> None:
    """Raise :class:`ToolError` naming ``name``, its size and ``limit`` when ``text`` is longer than
    ``limit`` UTF-8 bytes (a lone surrogate counts 3, as it would be written)."""
    if text is None or len(text) * 4 <= limit:  # at most 4 bytes a character: no need to encode
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ToolError(
            f"{name} is {size:,} bytes (UTF-8); spawn accepts at most {limit:,} bytes "
            f"({limit / 1024 / 1024:g} MiB) of it"
        )


INSTRUCTIONS = """\
luftpause runs sub-agents for you. `spawn` starts one on a task and returns a handle at once; \
the sub-agent works through its own LLM turns and tool calls while you continue. `await` waits for \
handles (all or any, up to `timeout` seconds) and returns each run's state and, when done, its \
answer. `status` shows one run or all of yours; `cancel` stops a run and its descendants. \
`spawn(parent=...)` builds a tree; budgets (tokens, tool calls, seconds) bound a whole subtree. \
Runs survive your disconnecting and a restart of the runtime: await a handle from a new session \
and you still get its answer."""


def caller_of(ctx: Context) -> str:
    """Who is asking, for fairness at the scheduler: the MCP session id (2025-era connections),
    else the client's declared name (``clientInfo.name``), else ``"anonymous"``."""
    headers = ctx.headers
    if headers is not None:
        session_id = headers.get("mcp-session-id")
        if session_id:
            return session_id
    params = ctx.session.client_params
    name = params.client_info.name if params is not None else None
    return name if isinstance(name, str) and name else "anonymous"


def generative_models(runtime: Runtime) -> list[str]:
    """The models a sub-agent can run on: those of generative replicas, in configuration order
    (a single-pass replica cannot answer a chat turn)."""
    replicas = runtime.config.replicas
    return list(dict.fromkeys(m for r in replicas if r.kind == "generative" for m in r.models))


def build_mcp_server(runtime: Runtime) -> MCPServer:
    """The ``MCPServer`` with the runtime's tools, bound to ``runtime`` (its registry, loop and
    configuration)."""
    mcp: MCPServer = MCPServer("luftpause", instructions=INSTRUCTIONS, version=__version__)

    @mcp.tool(
        name="spawn",
        description=(
            "Start a sub-agent on `task` and return its handle at once. It runs its own loop of LLM "
            "turns and tool calls on the runtime's MCP tools until it answers; collect the answer "
            "with `await`. `serviceClass` is 'interactive' (someone waits) or 'batch'. `tools` "
            "limits which tools it may use (names; default all). `maxToolCalls` is its tool "
            "budget; `maxTokens` the reply length per turn (0 = the engine's default). `task` and "
            "`system` may each be up to 1 MiB (UTF-8). `parent` makes it a child of that run "
            "(cancelling the parent cancels it). `budgetTokens`, `budgetToolCalls` and "
            "`budgetSeconds` bound this run and all its descendants; when one runs out the "
            "subtree is cancelled."
        ),
    )
    async def spawn(
        task: Annotated[str, Field(min_length=1, description="what the sub-agent should do")],
        ctx: Context,
        model: Annotated[str | None, Field(description="model name; default: the runtime's")] = None,
        serviceClass: Literal["interactive", "batch"] = "interactive",
        system: Annotated[str | None, Field(description="system prompt")] = None,
        maxToolCalls: Annotated[
            int, Field(ge=0, le=MAX_TOOL_CALLS, description="tool budget of the run")
        ] = 8,
        tools: Annotated[list[str] | None, Field(description="tool names it may use")] = None,
        maxTokens: Annotated[
            int, Field(ge=0, le=MAX_TOKENS_PER_TURN, description="reply length per turn, tokens")
        ] = 256,
        parallelToolCalls: Annotated[
            bool, Field(description="several tool calls per reply, run concurrently")
        ] = False,
        parent: Annotated[str | None, Field(description="handle of the parent run")] = None,
        budgetTokens: Annotated[
            int | None, Field(ge=1, le=MAX_BUDGET_TOKENS, description="tokens for the whole subtree")
        ] = None,
        budgetToolCalls: Annotated[
            int | None, Field(ge=1, le=MAX_BUDGET_TOOL_CALLS, description="tool calls for the whole subtree")
        ] = None,
        budgetSeconds: Annotated[
            float | None,
            Field(
                gt=0, le=MAX_BUDGET_SECONDS, allow_inf_nan=False, description="seconds for the whole subtree"
            ),
        ] = None,
    ) -> dict[str, Any]:
        check_text_size("task", task)
        check_text_size("system", system)
        if parent is not None:
            try:
                parent_run = runtime.registry.get(parent)
            except RuntimeFault as exc:
                raise ToolError(f"parent: {exc}") from None
            if parent_run.state == "cancelled":
                raise ToolError(f"parent run {parent!r} is cancelled; its subtree takes no new runs")
        chosen_model = model or runtime.config.default_model
        served = generative_models(runtime)
        if chosen_model not in served:
            # Refused here, at once: the dataplane would refuse every turn of it with a 404 anyway.
            raise ToolError(str(UnknownModel(chosen_model, served)))
        if tools is not None:
            known = runtime.upstream.known_tool_names()
            unknown = sorted(set(tools) - known) if known is not None else []
            if unknown:
                named = ", ".join(map(repr, unknown))
                raise ToolError(f"unknown tool(s) {named}; known: {', '.join(sorted(known or ()))}")
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": task})
        run = runtime.registry.add(
            Run(
                handle=new_handle(),
                task=task,
                model=chosen_model,
                service_class=serviceClass,
                caller=caller_of(ctx),
                max_tool_calls=maxToolCalls,
                max_tokens=maxTokens,
                parallel_tool_calls=parallelToolCalls,
                allowed_tools=frozenset(tools) if tools is not None else None,
                messages=messages,
                system=system or None,
                parent=parent,
                budget_tokens=budgetTokens,
                budget_tool_calls=budgetToolCalls,
                budget_seconds=budgetSeconds,
            )
        )
        runtime.registry.start(run, runtime.loop.drive(run))
        return {"handle": run.handle, "state": run.state}

    @mcp.tool(
        name="await",
        description=(
            "Wait for runs started with `spawn`: until all of `handles` are done (mode 'all') or any "
            "one is (mode 'any'), or `timeout` seconds pass (default 60, at most 600). Returns each "
            "run's state and, when done, its answer or error, with its tool-call and token counts; "
            "`timedOut` tells whether the wait ended by timeout. Await again to keep waiting."
        ),
    )
    async def await_(
        handles: Annotated[list[str], Field(min_length=1, description="run handles from spawn")],
        ctx: Context,
        mode: Literal["all", "any"] = "all",
        timeout: Annotated[  # noqa: ASYNC109 (the wire name; the wait is bounded by it below)
            # NaN would compare false with every bound and end the wait at once: refused instead.
            float, Field(allow_inf_nan=False, description="seconds to wait, at most 600")
        ] = DEFAULT_AWAIT_SECONDS,
    ) -> dict[str, Any]:
        try:
            runs = runtime.registry.lookup(handles)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        if not math.isfinite(timeout):  # the schema refuses it already; never wait on NaN
            raise ToolError(f"timeout must be a finite number of seconds, got {timeout!r}")
        wait_seconds = min(max(timeout, 0.0), MAX_AWAIT_SECONDS)

        async def progress(elapsed: float, finished: int) -> None:
            await ctx.report_progress(
                round(elapsed, 1), wait_seconds, f"{finished} of {len(runs)} runs finished"
            )

        timed_out = await runtime.registry.wait(runs, mode, wait_seconds, on_progress=progress)
        return {"runs": [runtime.registry.result(run) for run in runs], "timedOut": timed_out}

    @mcp.tool(
        name="status",
        description=(
            "One run's status by `handle`, with its whole task, its parent and children; or, without "
            "one, every run you spawned, each task cut to its first 200 characters (`taskChars` "
            "gives the whole length)."
        ),
    )
    async def status(ctx: Context, handle: str | None = None) -> dict[str, Any]:
        registry = runtime.registry
        if handle is None:
            return {"runs": [registry.status_of(run) for run in registry.of_caller(caller_of(ctx))]}
        try:
            return {"run": registry.status_of(registry.get(handle), full_task=True)}
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None

    @mcp.tool(
        name="cancel",
        description=(
            "Cancel the run `handle` now, and every running run below it in its tree. Cancelled runs "
            "report state 'cancelled'. Returns the handles it stopped."
        ),
    )
    async def cancel(handle: str) -> dict[str, Any]:
        try:
            stopped = runtime.registry.cancel(handle)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return {"handle": handle, "cancelled": [run.handle for run in stopped]}

    @mcp.tool(
        name="tools",
        description=(
            "The tools a sub-agent may use, by upstream MCP server: each tool's name, description, "
            "input schema and annotations (readOnlyHint, destructiveHint, ...), and whether its "
            "server is reachable now. With `handle`, only the tools that run may use."
        ),
    )
    async def tools_(
        handle: Annotated[str | None, Field(description="a run's handle; default: any run")] = None,
    ) -> dict[str, Any]:
        # {"servers": UpstreamPool.catalog()}; its shape is documented there.
        allowed: frozenset[str] | None = None
        if handle is not None:
            try:
                allowed = runtime.registry.get(handle).allowed_tools
            except RuntimeFault as exc:
                raise ToolError(str(exc)) from None
        return {"servers": runtime.upstream.catalog(allowed)}

    return mcp
