"""The MCP tools that start runs and wait for them: ``spawn``, ``run`` and ``await``.

``spawn`` and ``run`` take :class:`~luftpause.runtime.runs.spec.SpawnArguments` (their signatures
are generated from it: :mod:`luftpause.runtime.mcp.signatures`), ``run`` with its ``timeout``
besides, and hand them to the one spawner (:mod:`luftpause.runtime.spawn.spawner`)::

    spawn(<spawn's arguments>)          -> {"handle": "run-…", "state": "running", "caller"}   at once
    await(handles: [handle], mode = "all" | "any", timeout = 60)
        -> {"runs": [run result], "timedOut": bool, "events"?: [event],
            "timeoutCut"?: {"asked": s, "max": 600}}
    run(<spawn's arguments>, timeout = 60)
        -> what await answers for the one run, or, to a 2026-07-28 request that declares the Tasks
           extension, a task (resultType "task", at once: :mod:`luftpause.runtime.mcp.tasks`)

``model`` is declared as an enum of the models the runtime's generative replicas serve (the ones
the spawner accepts), so a client and its model see which names are valid; left out, the runtime's
default model; a name outside the enum is refused by the spawner, naming the models served
(:func:`model_override`).

``timeout`` is at most :data:`MAX_AWAIT_SECONDS`: a longer one is waited for 600 s and the answer
says so (``timeoutCut``), so a client that asked for more knows to ``await`` again. ``caller`` is
the caller the run is counted for (:mod:`luftpause.runtime.mcp.callers`): ``list(caller=...)``
finds its runs again from another connection.

While they wait, ``await`` and ``run`` send MCP progress notifications every few seconds (to a
client that sent a ``progressToken``) and ask about tool calls that wait for approval
(:mod:`luftpause.runtime.mcp.elicitation`). ``await`` gives the caller's pending notifications
once, as ``events``; an event about a run it names is taken without being repeated (the run's
result says it).
"""

from __future__ import annotations

import inspect
import math
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import Field, WithJsonSchema

from luftpause.runtime.agent import spans
from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.errors import RuntimeFault, UnknownRun
from luftpause.runtime.mcp.annotations import ANNOTATIONS, title
from luftpause.runtime.mcp.callers import actor_of, caller_of, tenant_of
from luftpause.runtime.mcp.elicitation import elicits_forms, request_state, wait_asking
from luftpause.runtime.mcp.signatures import Override, tool_function
from luftpause.runtime.mcp.tasks import TaskRegistry
from luftpause.runtime.mcp.tasks_extension import task_slot
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.runs.spec import SpawnArguments
from luftpause.runtime.runs.tenants import visible
from luftpause.runtime.spawn.spawner import Spawner

MAX_AWAIT_SECONDS = 600.0
DEFAULT_AWAIT_SECONDS = 60.0

Timeout = Annotated[
    # NaN would compare false with every bound and end the wait at once: refused instead.
    float,
    Field(allow_inf_nan=False, description="seconds to wait, at most 600"),
]

RunReturns = dict[str, Any] | InputRequiredResult
"""What ``run`` returns (and so how the SDK renders its result)."""


def _run_result_shape() -> RunReturns:
    raise NotImplementedError  # only its return annotation is read


_RUN_RESULT = Tool.from_function(_run_result_shape, name="run").fn_metadata


def render_run_result(payload: dict[str, Any]) -> CallToolResult | InputRequiredResult:
    """``run``'s answer as the SDK renders it for the tool (the same return annotation as the
    registered ``run``): a task's result is what a blocking ``run`` would have answered."""
    return _RUN_RESULT.convert_result(payload)


SPAWN_DESCRIPTION = (
    "Start a sub-agent on `task` and return its handle at once. It runs its own loop of LLM "
    "turns and tool calls on the runtime's MCP tools until it answers; collect the answer "
    "with `await`. `serviceClass` is 'interactive' (someone waits) or 'batch'. `tools` "
    "limits which tools it may use (names; default all). `maxToolCalls` is its tool "
    "budget; `maxTokens` the reply length per turn (0 = the engine's default). `system` is its "
    "system prompt inline; `instruction` names one from the runtime's instructions folder. `task` "
    "and `system` may each be up to 1 MiB (UTF-8). `parent` makes it a child of that run "
    "(cancelling the parent cancels it; it may use only the parent's tools, default all of "
    "them, and the parent's `approveTools` apply to it). `budgetTokens`, `budgetToolCalls` and "
    "`budgetSeconds` bound this run and all its descendants; when one runs out the "
    "subtree is cancelled. Calls of the tools in `approveTools`, and of tools their server "
    "marks destructive, wait for your approval."
)

AWAIT_DESCRIPTION = (
    "Wait for runs started with `spawn`: until all of `handles` are done (mode 'all') or any "
    "one is (mode 'any'), or `timeout` seconds pass (default 60, at most 600: a longer timeout "
    "is cut to 600 and the answer says so in `timeoutCut`). Returns each run's state and, when "
    "done, its answer or error, with its tool-call and token counts; `timedOut` tells whether the "
    "wait ended by timeout. Await again to keep waiting. A run whose tool call waits for your "
    "approval is asked about here if your client supports elicitation; otherwise the wait ends "
    "with it 'AwaitingApproval' (answer with `approve`)."
)

RUN_DESCRIPTION = (
    "`spawn` and `await` in one call: start a sub-agent on `task` (same arguments as "
    "`spawn`) and wait up to `timeout` seconds (default 60, at most 600) for it; returns "
    "what `await` returns for it. If it is still running then, `await` its handle."
)


def model_override(spawner: Spawner) -> dict[str, Override]:
    """``spawn``'s and ``run``'s ``model`` as the MCP tools declare it: the JSON Schema of
    :meth:`Spawner.model_schema` (an enum of the models served). Only the schema changes: a name
    outside it still reaches the spawner, whose refusal lists the models served
    (:class:`~luftpause.runtime.errors.UnknownModel`), clearer than a validation error."""
    return {"model": Override(Annotated[str | None, WithJsonSchema(spawner.model_schema())], None)}


def _ctx_parameter() -> inspect.Parameter:
    return inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)


class SpawnTools:
    """``spawn``, ``run`` and ``await`` over the runtime's parts (each given when it is built)."""

    def __init__(
        self,
        *,
        spawner: Spawner,
        registry: RunRegistry,
        approvals: Approvals,
        notifications: Notifications,
        tasks: TaskRegistry,
    ) -> None:
        self.spawner = spawner
        self.registry = registry
        self.approvals = approvals
        self.notifications = notifications
        self.tasks = tasks

    def register(self, mcp: MCPServer) -> None:
        """Add the three tools to ``mcp``."""
        served = model_override(self.spawner)
        spawn = tool_function(
            "spawn", SpawnArguments, self.spawn, [_ctx_parameter()], returns=dict[str, Any], overrides=served
        )
        mcp.add_tool(
            spawn,
            name="spawn",
            title=title("spawn"),
            description=SPAWN_DESCRIPTION,
            annotations=ANNOTATIONS["spawn"],
        )
        run = tool_function(
            "run",
            SpawnArguments,
            self.run,
            [
                _ctx_parameter(),
                inspect.Parameter(
                    "timeout",
                    inspect.Parameter.KEYWORD_ONLY,
                    default=DEFAULT_AWAIT_SECONDS,
                    annotation=Timeout,
                ),
            ],
            returns=RunReturns,
            overrides=served,
        )
        mcp.add_tool(
            run, name="run", title=title("run"), description=RUN_DESCRIPTION, annotations=ANNOTATIONS["run"]
        )
        mcp.add_tool(
            self.await_,
            name="await",
            title=title("await"),
            description=AWAIT_DESCRIPTION,
            annotations=ANNOTATIONS["await"],
        )

    async def _start(self, arguments: SpawnArguments, ctx: Context) -> Run:
        """Spawn for the MCP caller of ``ctx`` and wait until the run's start is journaled; raise
        :class:`ToolError` with what was refused, or when the start could not be journaled (the
        run then fails without taking a turn), so no handle is acknowledged that a restart would
        lose."""
        try:
            run = self.spawner.spawn(arguments, actor_of(ctx), trace=ctx)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        try:
            await self.registry.confirm_start(run)
        except OSError as exc:
            raise ToolError(
                f"spawn refused: the run could not be journaled ({exc}); nothing was started"
            ) from None
        return run

    async def spawn(self, arguments: SpawnArguments, ctx: Context) -> dict[str, Any]:
        run = await self._start(arguments, ctx)
        return {"handle": run.handle, "state": run.state, "caller": run.caller}

    async def run(self, arguments: SpawnArguments, ctx: Context, timeout: float) -> RunReturns:  # noqa: ASYNC109 (the wire name; bounded below)
        if not math.isfinite(timeout):
            raise ToolError(f"timeout must be a finite number of seconds, got {timeout!r}")
        slot = task_slot()
        handle = request_state(ctx).get("run")
        if isinstance(handle, str):  # a 2026-07-28 retry with approval answers: the run exists already
            try:
                run = self.registry.get_for(handle, tenant_of(ctx))
            except RuntimeFault as exc:
                raise ToolError(str(exc)) from None
        else:
            run = await self._start(arguments, ctx)
            if slot is not None:  # the client declared the Tasks extension: a task, not a wait
                try:
                    slot.task = await self.tasks.create(run, elicits=elicits_forms(ctx))
                except OSError as exc:
                    self.registry.cancel(run.handle, reason=f"its task could not be journaled: {exc}")
                    raise ToolError(
                        f"run refused: its task could not be journaled, so none was created: {exc}"
                    ) from None
                return {"handle": run.handle, "state": run.state}  # the interceptor answers instead
        return await self.wait_for(ctx, [run], "all", timeout, state={"run": run.handle})

    async def await_(
        self,
        handles: Annotated[list[str], Field(min_length=1, description="run handles from spawn")],
        ctx: Context,
        mode: Literal["all", "any"] = "all",
        timeout: Timeout = DEFAULT_AWAIT_SECONDS,  # noqa: ASYNC109 (the wire name; bounded below)
    ) -> dict[str, Any] | InputRequiredResult:
        try:
            runs = self.registry.lookup(handles)
            tenant = tenant_of(ctx)
            hidden = [run.handle for run in runs if not visible(run, tenant)]
            if hidden:  # another tenant's: answered as a handle that does not exist
                raise UnknownRun(hidden[0])
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        with spans.touching("await", [run.handle for run in runs], ctx):  # linked to each run's trace
            answer = await self.wait_for(ctx, runs, mode, timeout)
        if isinstance(answer, dict):
            named = set(handles)
            pending = self.notifications.take_caller_events(caller_of(ctx))
            events = [e for e in pending if e["handle"] not in named]
            if events:
                answer["events"] = events
        return answer

    async def wait_for(
        self,
        ctx: Context,
        runs: list[Run],
        mode: Literal["all", "any"],
        timeout: float,  # noqa: ASYNC109 (the tool's argument, capped and handed to the wait)
        state: dict[str, Any] | None = None,
    ) -> dict[str, Any] | InputRequiredResult:
        """What ``await`` answers for ``runs``: ``{"runs": [run result], "timedOut",
        "timeoutCut"?}`` after waiting at most ``timeout`` seconds (cut to 600) with progress
        notifications and approval questions (:func:`~luftpause.runtime.mcp.elicitation.wait_asking`),
        or the ``InputRequiredResult`` that asks a 2026-07-28 client for approvals (its
        ``requestState`` carries ``state``)."""
        if not math.isfinite(timeout):  # the schema refuses it already; never wait on NaN
            raise ToolError(f"timeout must be a finite number of seconds, got {timeout!r}")
        wait_seconds = min(max(timeout, 0.0), MAX_AWAIT_SECONDS)

        async def progress(elapsed: float, finished: int) -> None:
            await ctx.report_progress(
                round(elapsed, 1), wait_seconds, f"{finished} of {len(runs)} runs finished"
            )

        outcome = await wait_asking(
            self.approvals, ctx, runs, mode, wait_seconds, on_progress=progress, state=state
        )
        if isinstance(outcome, InputRequiredResult):
            return outcome
        answer: dict[str, Any] = {"runs": [self.registry.result(run) for run in runs], "timedOut": outcome}
        if timeout > MAX_AWAIT_SECONDS:
            answer["timeoutCut"] = {"asked": timeout, "max": MAX_AWAIT_SECONDS}
        return answer
