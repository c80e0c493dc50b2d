"""The runtime's MCP tools: ``spawn``, ``await``, ``run``, ``status``, ``cancel``, ``approve``,
``decide``, ``tools``, and the pods' ``send``, ``read``, ``stop``, ``list``.

Argument names are camelCase on the wire, as in DESIGN.md ("The runtime"). Results are JSON
objects (``structuredContent``, and the same JSON as the text content)::

    spawn(task, model?, serviceClass = "interactive" | "batch", system?, maxToolCalls = 8,
          tools?: [name], maxTokens = 256, parallelToolCalls = false, parent?: handle,
          budgetTokens?, budgetToolCalls?, budgetSeconds?, approveTools?: [name],
          name?, scope?: [rule], orchestrate = false)
                                                                    task, system: at most 1 MiB
        -> {"handle": "run-…", "state": "running"}                       at once
    await(handles: [handle], mode = "all" | "any", timeout = 60)        timeout capped at 600 s
        -> {"runs": [run result], "timedOut": bool}
    run(<spawn's arguments>, timeout = 60)                              spawn, then await it
        -> {"runs": [run result], "timedOut": bool}
        -> a task (resultType "task"), at once, to a 2026-07-28 request that declares the Tasks
           extension; its result is the above (:mod:`luftpause.runtime.mcp.tasks`)
    approve(handle, allow: bool, call?: approval id)          call: needed when several wait
        -> {"handle", "call", "tool", "arguments", "allow"}             the call it answered
    decide(input, labels?: [2..20 labels], model?)
        -> {"mode": "single-pass", "model", "label", "probs", "numClasses"}     without labels
        -> {"mode": "labels", "model", "label", "probabilities", "unscored"}   with labels
    status(handle?, limit = 100 (at most 1000), offset = 0)
        -> {"run": run status, whole task}  or  {"runs": [run status of the caller's runs,
                                                          task summarized, no answer text:
                                                          "answerChars"], "total",
                                                 "nextOffset"? (more to page through)}
    cancel(handle)
        -> {"handle", "cancelled": [handles stopped: the run and its running descendants]}
    send(handle, message)            handle: a handle or the name of one of your runs
        -> {"handle", "name", "state", "delivered": "now" | "next turn"}
    read(handle, since?: cursor)
        -> {"handle", "name", "state": running|idle|stopped, "entries": [text], "cursor", "error"?}
    stop(handle)                     graceful: the current turn finishes, no new one starts
        -> {"handle", "name", "state"}
    list(handle?, caller?)           a run's children, or a caller's runs (default: yours)
        -> {"runs": [{"handle", "name", "state", "runState", "parent", "caller", "task",
                      "scope", "lastAnswer", "children", "pendingEvents", "error"?}]}
    tools(handle?)
        -> {"servers": [{"server", "transport", "reachable", "error"?, "tools": [{"name",
            "description", "inputSchema", "annotations"}]}]}      (UpstreamPool.catalog)
           with handle: what that run is offered, its built-ins last as {"server": "luftpause",
           "transport": "builtin", "reachable": true, "tools": [...]}       (offered_catalog)

    run result = {"handle", "state": running|AwaitingApproval|completed|failed|cancelled,
                  "pendingApprovals"?: [{"id", "tool", "arguments", "repeat"?}],
                  "pendingApproval"?: the first of them, "answer"?, "error"?,
                  "durable"?: false, "journalError"? (a record of the run was not written),
                  "toolCalls", "failedToolCalls", "turns", "seconds",
                  "usage": {"promptTokens", "completionTokens"},
                  "limits"?, "used"?, "exceeded"? (a run that sets budgets)}
    run status = run result + {"model", "serviceClass", "caller", "task", "taskChars",
                               "maxToolCalls", "startedAt", "parent", "children"}

Pods (:mod:`luftpause.runtime.pods.operations`): every run result carries ``podState`` (``running``,
``idle``: completed or failed, ``send`` continues it; ``stopped``: cancelled or stopped) beside
``state``, which keeps its meaning (``await`` waits until a run is done, so an idle run is done
there). ``name``, ``scope`` (allow/deny rules within the spawner's scope) and ``orchestrate``
(offer the sub-agent spawn/send/read/stop/list on its own children) are the pod options of
``spawn`` and ``run``.
``await`` and ``status`` (without a handle) give the caller's pending notifications once, as
``events`` (present when there are some); an event about a run the ``await`` names is taken
without being repeated, the run's result says it.

Budgets bound the run and all its descendants (:mod:`luftpause.runtime.runs.budgets`): ``budgetTokens``
(prompt + completion tokens), ``budgetToolCalls``, ``budgetSeconds`` (wall time since the run
started); on excess the subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.
A cancelled run reports state ``cancelled`` and the reason as its ``error``.

``await`` and ``run`` send MCP progress notifications every few seconds while they wait (to a
client that sent a ``progressToken``), so clients that reset their timeout on progress keep
waiting. A run that waits for approval (:mod:`luftpause.runtime.agent.approvals`) is asked about inside
``await`` / ``run`` when the client declared form elicitation; otherwise the wait ends early with
the run ``AwaitingApproval`` so the client can answer with ``approve``. ``decide`` is described in
:mod:`luftpause.runtime.decide`.

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
from mcp.server.mcpserver.tools import Tool
from mcp_types import InputRequiredResult
from pydantic import ConfigDict, Field

from luftpause import __version__
from luftpause.runtime.agent import spans as run_spans
from luftpause.runtime.agent.approvals import elicits_forms, request_state, wait_asking
from luftpause.runtime.agent.upstream import tool_listing
from luftpause.runtime.decide import MAX_LABELS, MIN_LABELS
from luftpause.runtime.errors import RuntimeFault, UnknownModel
from luftpause.runtime.mcp.tasks import task_slot
from luftpause.runtime.pods.operations import Actor, inherited_approvals, inherited_tools
from luftpause.runtime.pods.scope import SCOPE_SCHEMA
from luftpause.runtime.runs.registry import Run, new_handle

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
answer; `run` spawns and waits in one call. `status` shows one run or all of yours; `cancel` stops \
a run and its descendants. `spawn(parent=...)` builds a tree; budgets (tokens, tool calls, \
seconds) bound a whole subtree. A destructive tool call waits for your approval: you are asked \
inside `await`/`run` if your client supports elicitation, or answer with `approve`. `decide` \
classifies an input, with or without your own labels. \
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


Task = Annotated[str, Field(min_length=1, description="what the sub-agent should do")]
Model = Annotated[str | None, Field(description="model name; default: the runtime's")]
System = Annotated[str | None, Field(description="system prompt")]
MaxToolCalls = Annotated[int, Field(ge=0, le=MAX_TOOL_CALLS, description="tool budget of the run")]
ToolNames = Annotated[list[str] | None, Field(description="tool names it may use")]
MaxTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS_PER_TURN, description="reply length per turn, tokens")]
Parent = Annotated[str | None, Field(description="handle of the parent run")]
ParallelToolCalls = Annotated[bool, Field(description="several tool calls per reply, run concurrently")]
BudgetTokens = Annotated[
    int | None, Field(ge=1, le=MAX_BUDGET_TOKENS, description="tokens for the whole subtree")
]
BudgetToolCalls = Annotated[
    int | None, Field(ge=1, le=MAX_BUDGET_TOOL_CALLS, description="tool calls for the whole subtree")
]
BudgetSeconds = Annotated[
    float | None,
    Field(gt=0, le=MAX_BUDGET_SECONDS, allow_inf_nan=False, description="seconds for the whole subtree"),
]
PodName = Annotated[
    str | None, Field(min_length=1, max_length=64, description="a name unique among your live runs")
]
ScopeRules = Annotated[
    list[dict[str, Any]] | None,
    Field(description=SCOPE_SCHEMA["description"], json_schema_extra={"items": SCOPE_SCHEMA["items"]}),
]
Orchestrate = Annotated[bool, Field(description="offer it spawn/send/read/stop/list on its own children")]
ApproveTools = Annotated[
    list[str] | None, Field(description="tool names whose every call waits for your approval")
]
Timeout = Annotated[
    # NaN would compare false with every bound and end the wait at once: refused instead.
    float, Field(allow_inf_nan=False, description="seconds to wait, at most 600")
]

SPAWN_DESCRIPTION = (
    "Start a sub-agent on `task` and return its handle at once. It runs its own loop of LLM "
    "turns and tool calls on the runtime's MCP tools until it answers; collect the answer "
    "with `await`. `serviceClass` is 'interactive' (someone waits) or 'batch'. `tools` "
    "limits which tools it may use (names; default all). `maxToolCalls` is its tool "
    "budget; `maxTokens` the reply length per turn (0 = the engine's default). `task` and "
    "`system` may each be up to 1 MiB (UTF-8). `parent` makes it a child of that run "
    "(cancelling the parent cancels it; it may use only the parent's tools, default all of "
    "them, and the parent's `approveTools` apply to it). `budgetTokens`, `budgetToolCalls` and "
    "`budgetSeconds` bound this run and all its descendants; when one runs out the "
    "subtree is cancelled. Calls of the tools in `approveTools`, and of tools their server "
    "marks destructive, wait for your approval."
)


def start_run(
    runtime: Runtime,
    ctx: Context | None,
    *,
    task: str,
    model: str | None,
    serviceClass: Literal["interactive", "batch"],
    system: str | None,
    maxToolCalls: int,
    tools: list[str] | None,
    maxTokens: int,
    parent: str | None,
    parallelToolCalls: bool = False,
    budgetTokens: int | None,
    budgetToolCalls: int | None,
    budgetSeconds: float | None,
    approveTools: list[str] | None,
    name: str | None = None,
    scope: list[dict[str, Any]] | None = None,
    orchestrate: bool = False,
    caller: str | None = None,
) -> Run:
    """Check ``spawn``'s arguments (raising :class:`ToolError` with what is wrong), record the run
    and start its loop; the running run. ``caller`` replaces ``caller_of(ctx)`` (a sub-agent's
    own spawn has no MCP context: ``ctx`` is ``None`` then)."""
    check_text_size("task", task)
    check_text_size("system", system)
    parent_run: Run | None = None
    if parent is not None:
        try:
            parent_run = runtime.registry.get(parent)
        except RuntimeFault as exc:
            raise ToolError(f"parent: {exc}") from None
        if parent_run.state == "cancelled":
            raise ToolError(f"parent run {parent!r} is cancelled; its subtree takes no new runs")
        if parent_run.pod_state == "stopped":
            raise ToolError(f"parent run {parent!r} is stopped; its subtree takes no new runs")
        # as a sub-agent's own spawn (Pods.child_limits): the parent's tools or fewer
        try:
            tools = inherited_tools(parent_run, tools, f"the parent run {parent!r}")
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        approveTools = inherited_approvals(parent_run, approveTools)
    if caller is None:
        assert ctx is not None
        caller = caller_of(ctx)
    chosen_model = model or runtime.config.default_model
    served = generative_models(runtime)
    if chosen_model not in served:
        # Refused here, at once: the dataplane would refuse every turn of it with a 404 anyway.
        raise ToolError(str(UnknownModel(chosen_model, served)))
    named = set(tools or ()) | set(approveTools or ())
    if named:
        known = runtime.upstream.known_tool_names()
        unknown = sorted(named - known) if known is not None else []
        if unknown:
            listed = ", ".join(map(repr, unknown))
            raise ToolError(f"unknown tool(s) {listed}; known: {', '.join(sorted(known or ()))}")
    try:
        plan = runtime.pods.plan_spawn(parent_run, caller, name, scope)
    except RuntimeFault as exc:
        raise ToolError(str(exc)) from None
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
            caller=caller,
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
            approve_tools=frozenset(approveTools or ()),
            name=name,
            orchestrate=orchestrate,
        )
    )
    runtime.pods.grant(run, plan)
    run_spans.spawned(run, ctx)  # where its invoke_agent span belongs, when tracing
    runtime.registry.start(run, runtime.loop.drive(run))
    return run


DEFAULT_STATUS_LIST = 100
"""Runs ``status`` lists without a handle, by default (``limit``)."""

MAX_STATUS_LIST = 1000
"""Most runs one ``status`` listing gives; page with ``offset``."""


def listed_status(status: dict[str, Any]) -> dict[str, Any]:
    """A run's status as a listing shows it: without its answer text (``answerChars`` gives its
    length; ``status(handle)`` or ``await`` give it whole), so a listing stays small however
    long the answers."""
    answer = status.pop("answer", None)
    if isinstance(answer, str):
        status["answerChars"] = len(answer)
    return status


async def confirm_start(runtime: Runtime, run: Run) -> None:
    """Wait until ``run``'s start is journaled; raise :class:`ToolError` when it could not be (the
    run then fails without taking a turn), so no handle is acknowledged that a restart would lose."""
    try:
        await runtime.registry.confirm_start(run)
    except OSError as exc:
        raise ToolError(
            f"spawn refused: the run could not be journaled ({exc}); nothing was started"
        ) from None


async def wait_for(
    runtime: Runtime,
    ctx: Context,
    runs: list[Run],
    mode: Literal["all", "any"],
    timeout: float,  # noqa: ASYNC109 (the tool's argument, capped and handed to the wait)
    state: dict[str, Any] | None = None,
) -> dict[str, Any] | InputRequiredResult:
    """What ``await`` answers for ``runs``: ``{"runs": [run result], "timedOut"}`` after waiting
    at most ``timeout`` seconds (capped at 600) with progress notifications and approval
    questions (:func:`luftpause.runtime.agent.approvals.wait_asking`), or the ``InputRequiredResult``
    that asks a 2026-07-28 client for approvals (its ``requestState`` carries ``state``)."""
    if not math.isfinite(timeout):  # the schema refuses it already; never wait on NaN
        raise ToolError(f"timeout must be a finite number of seconds, got {timeout!r}")
    wait_seconds = min(max(timeout, 0.0), MAX_AWAIT_SECONDS)

    async def progress(elapsed: float, finished: int) -> None:
        await ctx.report_progress(round(elapsed, 1), wait_seconds, f"{finished} of {len(runs)} runs finished")

    outcome = await wait_asking(
        runtime.approvals, ctx, runs, mode, wait_seconds, on_progress=progress, state=state
    )
    if isinstance(outcome, InputRequiredResult):
        return outcome
    return {"runs": [runtime.registry.result(run) for run in runs], "timedOut": outcome}


BUILTIN_SERVER = "luftpause"
"""The ``server`` of the entry that lists a run's built-in tools in ``tools(handle)``; its
``transport`` is ``"builtin"`` (they run inside the runtime)."""


def offered_catalog(runtime: Runtime, run: Run) -> list[dict[str, Any]]:
    """What ``tools(handle)`` answers for ``run``: the tools its turns are offered, as the loop
    builds them (:meth:`SubAgentLoop._turns`), by server::

        [upstream entries (UpstreamPool.catalog of the run's allowed tools, less any tool a
         built-in of the run hides)...,
         {"server": "luftpause", "transport": "builtin", "reachable": true,
          "tools": [tool_listing(tool)]}]     the run's built-ins (Pods.builtin_tools), maybe none

    The built-ins are those of the run as it stands now: the workspace tools while it holds a
    filesystem scope, the orchestration tools when it was spawned with ``orchestrate``. A run whose
    tool budget is spent is offered nothing in its turns; this still lists what it may use. An
    unreachable server's entry (``reachable: false``) shows what the run is offered once it is
    back, as :meth:`UpstreamPool.catalog` says."""
    builtin = runtime.pods.builtin_tools(run)
    hidden = {tool.name for tool in builtin}  # a built-in wins a name clash, as in the loop
    servers = runtime.upstream.catalog(run.allowed_tools)
    for server in servers:
        server["tools"] = [tool for tool in server["tools"] if tool["name"] not in hidden]
    servers.append(
        {
            "server": BUILTIN_SERVER,
            "transport": "builtin",
            "reachable": True,
            "tools": [tool_listing(tool) for tool in builtin],
        }
    )
    return servers


def build_mcp_server(runtime: Runtime) -> MCPServer:
    """The ``MCPServer`` with the runtime's tools, bound to ``runtime`` (its registry, loop and
    configuration)."""
    mcp: MCPServer = MCPServer(
        "luftpause", instructions=INSTRUCTIONS, version=__version__, extensions=runtime.mcp_extensions()
    )

    @mcp.tool(name="spawn", description=SPAWN_DESCRIPTION)
    async def spawn(
        task: Task,
        ctx: Context,
        model: Model = None,
        serviceClass: Literal["interactive", "batch"] = "interactive",
        system: System = None,
        maxToolCalls: MaxToolCalls = 8,
        tools: ToolNames = None,
        maxTokens: MaxTokens = 256,
        parent: Parent = None,
        parallelToolCalls: ParallelToolCalls = False,
        budgetTokens: BudgetTokens = None,
        budgetToolCalls: BudgetToolCalls = None,
        budgetSeconds: BudgetSeconds = None,
        approveTools: ApproveTools = None,
        name: PodName = None,
        scope: ScopeRules = None,
        orchestrate: Orchestrate = False,
    ) -> dict[str, Any]:
        run = start_run(
            runtime,
            ctx,
            task=task,
            model=model,
            serviceClass=serviceClass,
            system=system,
            maxToolCalls=maxToolCalls,
            tools=tools,
            maxTokens=maxTokens,
            parent=parent,
            budgetTokens=budgetTokens,
            budgetToolCalls=budgetToolCalls,
            budgetSeconds=budgetSeconds,
            parallelToolCalls=parallelToolCalls,
            approveTools=approveTools,
            name=name,
            scope=scope,
            orchestrate=orchestrate,
        )
        await confirm_start(runtime, run)
        return {"handle": run.handle, "state": run.state}

    @mcp.tool(
        name="await",
        description=(
            "Wait for runs started with `spawn`: until all of `handles` are done (mode 'all') or any "
            "one is (mode 'any'), or `timeout` seconds pass (default 60, at most 600). Returns each "
            "run's state and, when done, its answer or error, with its tool-call and token counts; "
            "`timedOut` tells whether the wait ended by timeout. Await again to keep waiting. A run "
            "whose tool call waits for your approval is asked about here if your client supports "
            "elicitation; otherwise the wait ends with it 'AwaitingApproval' (answer with `approve`)."
        ),
    )
    async def await_(
        handles: Annotated[list[str], Field(min_length=1, description="run handles from spawn")],
        ctx: Context,
        mode: Literal["all", "any"] = "all",
        timeout: Timeout = DEFAULT_AWAIT_SECONDS,  # noqa: ASYNC109 (the wire name; bounded below)
    ) -> dict[str, Any] | InputRequiredResult:
        try:
            runs = runtime.registry.lookup(handles)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        answer = await wait_for(runtime, ctx, runs, mode, timeout)
        if isinstance(answer, dict):
            named = set(handles)
            events = [e for e in runtime.pods.take_caller_events(caller_of(ctx)) if e["handle"] not in named]
            if events:
                answer["events"] = events
        return answer

    @mcp.tool(
        name="run",
        description=(
            "`spawn` and `await` in one call: start a sub-agent on `task` (same arguments as "
            "`spawn`) and wait up to `timeout` seconds (default 60, at most 600) for it; returns "
            "what `await` returns for it. If it is still running then, `await` its handle."
        ),
    )
    async def run_(
        task: Task,
        ctx: Context,
        model: Model = None,
        serviceClass: Literal["interactive", "batch"] = "interactive",
        system: System = None,
        maxToolCalls: MaxToolCalls = 8,
        tools: ToolNames = None,
        maxTokens: MaxTokens = 256,
        parent: Parent = None,
        parallelToolCalls: ParallelToolCalls = False,
        budgetTokens: BudgetTokens = None,
        budgetToolCalls: BudgetToolCalls = None,
        budgetSeconds: BudgetSeconds = None,
        approveTools: ApproveTools = None,
        name: PodName = None,
        scope: ScopeRules = None,
        orchestrate: Orchestrate = False,
        timeout: Timeout = DEFAULT_AWAIT_SECONDS,  # noqa: ASYNC109 (the wire name; bounded below)
    ) -> dict[str, Any] | InputRequiredResult:
        if not math.isfinite(timeout):
            raise ToolError(f"timeout must be a finite number of seconds, got {timeout!r}")
        slot = task_slot()
        handle = request_state(ctx).get("run")
        if isinstance(handle, str):  # a 2026-07-28 retry with approval answers: the run exists already
            try:
                run = runtime.registry.get(handle)
            except RuntimeFault as exc:
                raise ToolError(str(exc)) from None
        else:
            run = start_run(
                runtime,
                ctx,
                task=task,
                model=model,
                serviceClass=serviceClass,
                system=system,
                maxToolCalls=maxToolCalls,
                tools=tools,
                maxTokens=maxTokens,
                parent=parent,
                budgetTokens=budgetTokens,
                budgetToolCalls=budgetToolCalls,
                budgetSeconds=budgetSeconds,
                parallelToolCalls=parallelToolCalls,
                approveTools=approveTools,
                name=name,
                scope=scope,
                orchestrate=orchestrate,
            )
            await confirm_start(runtime, run)
            if slot is not None:  # the client declared the Tasks extension: a task, not a wait
                try:
                    slot.task = await runtime.tasks.create(run, elicits=elicits_forms(ctx))
                except OSError as exc:
                    runtime.registry.cancel(run.handle, reason=f"its task could not be journaled: {exc}")
                    raise ToolError(
                        f"run refused: its task could not be journaled, so none was created: {exc}"
                    ) from None
                return {"handle": run.handle, "state": run.state}  # the interceptor answers instead
        return await wait_for(runtime, ctx, [run], "all", timeout, state={"run": run.handle})

    # A task's result is what this tool would have answered: the SDK's own conversion of it.
    runtime.tasks.render_result = Tool.from_function(run_, name="run").fn_metadata.convert_result

    @mcp.tool(
        name="status",
        description=(
            "One run's status by `handle`, with its whole task and answer, its parent and children; "
            "or, without one, the runs you spawned (oldest first, at most `limit`, from `offset`; "
            "`total` and `nextOffset` for paging), each task cut to its first 200 characters "
            "(`taskChars` gives the whole length) and no answer text (`answerChars`)."
        ),
    )
    async def status(
        ctx: Context,
        handle: str | None = None,
        limit: Annotated[
            int, Field(ge=1, le=MAX_STATUS_LIST, description="most runs listed (newest last)")
        ] = DEFAULT_STATUS_LIST,
        offset: Annotated[int, Field(ge=0, description="runs to skip, oldest first (paging)")] = 0,
    ) -> dict[str, Any]:
        registry = runtime.registry
        if handle is None:
            caller = caller_of(ctx)
            held = registry.of_caller(caller)
            page = held[offset : offset + limit]
            listing: dict[str, Any] = {
                "runs": [listed_status(registry.status_of(run)) for run in page],
                "total": len(held),
            }
            if offset + limit < len(held):
                listing["nextOffset"] = offset + limit
            events = runtime.pods.take_caller_events(caller)
            if events:
                listing["events"] = events
            return listing
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
            # An idle run (and idle ones below it) ends too: stopped, its scope returned (pods.py).
            stopped += runtime.pods.end_idle(runtime.registry.get(handle), "cancel")
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return {"handle": handle, "cancelled": [run.handle for run in stopped]}

    def pod_call(operation: Any, *args: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = operation(*args)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return result

    @mcp.tool(
        name="send",
        description=(
            "Send `message` to a run (`handle`, or the name you gave it): an idle run (answered or "
            "failed) continues its whole conversation with it as a new user turn; a busy one gets it "
            "at its next turn. Its spawner is told, if that is not you."
        ),
    )
    async def send(
        handle: Annotated[str, Field(min_length=1, description="a run's handle or name")],
        message: Annotated[str, Field(min_length=1, description="the message")],
        ctx: Context,
    ) -> dict[str, Any]:
        check_text_size("message", message)
        sent = pod_call(runtime.pods.send, Actor.of_caller(caller_of(ctx)), handle, message)
        if sent["delivered"] == "now":  # re-opened: its drive's task has not run yet
            run_spans.reopened(sent["handle"], ctx)
        return sent

    @mcp.tool(
        name="read",
        description=(
            "A run's output entries (the text of each of its assistant messages, its answers "
            "included) after cursor `since` (all without it), a new `cursor` to pass next time, and "
            "its state: running, idle (takes `send`) or stopped."
        ),
    )
    async def read(
        handle: Annotated[str, Field(min_length=1, description="a run's handle or name")],
        ctx: Context,
        since: Annotated[int | None, Field(ge=0, description="cursor from an earlier read")] = None,
    ) -> dict[str, Any]:
        return pod_call(runtime.pods.read, Actor.of_caller(caller_of(ctx)), handle, since)

    @mcp.tool(
        name="stop",
        description=(
            "Stop a run gracefully: its current turn finishes, no new one starts, its filesystem "
            "scope returns to its spawner (`cancel` stops at once, with its descendants)."
        ),
    )
    async def stop(
        handle: Annotated[str, Field(min_length=1, description="a run's handle or name")],
        ctx: Context,
    ) -> dict[str, Any]:
        return pod_call(runtime.pods.stop, Actor.of_caller(caller_of(ctx)), handle)

    @mcp.tool(
        name="list",
        description=(
            "Runs with name, state (running, idle, stopped), scope held and the first line of the "
            "last answer: the children of run `handle`; or the runs of `caller` (an earlier "
            "session's id, to find your runs from a new connection); default: your runs."
        ),
    )
    async def list_(
        ctx: Context,
        handle: Annotated[str | None, Field(description="a run whose children to list")] = None,
        caller: Annotated[str | None, Field(description="list this caller's runs instead")] = None,
    ) -> dict[str, Any]:
        return pod_call(runtime.pods.list_runs, Actor.of_caller(caller_of(ctx)), handle, caller)

    def launch(**arguments: Any) -> Run:
        """A sub-agent's own ``spawn`` (pods.py): spawn's defaults for what it does not give."""
        defaults: dict[str, Any] = dict(
            model=None,
            serviceClass="interactive",
            system=None,
            maxToolCalls=8,
            tools=None,
            maxTokens=256,
            parent=None,
            budgetTokens=None,
            budgetToolCalls=None,
            budgetSeconds=None,
            approveTools=None,
        )
        return start_run(runtime, None, **{**defaults, **arguments})

    runtime.pods.launch = launch

    @mcp.tool(
        name="approve",
        description=(
            "Answer a tool call the run `handle` waits on (state 'AwaitingApproval', listed in "
            "`pendingApprovals` with ids): `allow` true lets it go (once), false refuses it (the "
            "sub-agent is told you declined). `call` names the approval id; it may be left out when "
            "exactly one waits. Returns the call it answered."
        ),
    )
    async def approve(
        handle: str,
        allow: bool,
        call: Annotated[
            str | None,
            Field(description="the approval id (pendingApprovals[].id); needed when several wait"),
        ] = None,
    ) -> dict[str, Any]:
        try:
            approval = runtime.approvals.answer(handle, allow, call)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return {
            "handle": handle,
            "call": approval.id,
            "tool": approval.tool,
            "arguments": approval.arguments,
            "allow": allow,
        }

    @mcp.tool(
        name="decide",
        description=(
            "Classify `input` quickly. Without `labels`: the single-pass classifier model (its own "
            "labels). With 2-20 `labels`: one one-token turn of a generative model, scored by its "
            "first-token probabilities: returns the `label`, `probabilities` (over the labels "
            "that were scored) and `unscored` labels. Single-word labels score best."
        ),
    )
    async def decide(
        input: Annotated[str, Field(min_length=1, description="the text to classify")],
        ctx: Context,
        labels: Annotated[
            list[Annotated[str, Field(min_length=1)]] | None,
            Field(min_length=MIN_LABELS, max_length=MAX_LABELS, description="2-20 distinct labels"),
        ] = None,
        model: Annotated[str | None, Field(description="model name; default: the first that fits")] = None,
    ) -> dict[str, Any]:
        check_text_size("input", input)
        replicas = runtime.config.replicas
        caller = caller_of(ctx)
        try:
            if labels is None:
                kinds = (r.models for r in replicas if r.kind == "single_pass")
                single_pass = list(dict.fromkeys(m for models in kinds for m in models))
                chosen = model or (single_pass[0] if single_pass else None)
                if chosen is None:
                    raise ToolError(
                        "no single-pass model is configured (no [[replicas]] of kind single_pass); "
                        "give 2-20 labels to decide on a generative model"
                    )
                if chosen not in single_pass:
                    raise ToolError(
                        f"no single-pass replica serves {chosen!r}; single-pass models: "
                        f"{', '.join(single_pass) or 'none configured'} (or give labels)"
                    )
                return await runtime.decider.single_pass(input, chosen, caller)
            # Scoring matches the first token case-insensitively, so "Yes" and "yes" would share
            # one score: labels must differ in more than case.
            seen: dict[str, str] = {}
            for label in labels:
                key = label.strip().casefold()
                if key in seen:
                    raise ToolError(f"labels must be distinct ignoring case: {seen[key]!r} and {label!r}")
                seen[key] = label
            chosen = model or runtime.config.default_model
            served = generative_models(runtime)
            if chosen not in served:
                raise ToolError(str(UnknownModel(chosen, served)))
            return await runtime.decider.by_labels(input, labels, chosen, caller)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None

    @mcp.tool(
        name="tools",
        description=(
            "The tools a sub-agent may use, by upstream MCP server: each tool's name, description, "
            "input schema and annotations (readOnlyHint, destructiveHint, ...), and whether its "
            "server is reachable now. With `handle`: what that run is offered in its turns as it "
            "stands now (its turns offer none once its tool budget is spent): the upstream tools it "
            "may use, and a last entry, "
            "server 'luftpause' with transport 'builtin', holding the runtime's own tools it is "
            "offered (read_file, write_file, edit_file, list_directory while it holds a filesystem "
            "scope; spawn, send, read, stop, list with `orchestrate`; a built-in hides an upstream "
            "tool of the same name). Without `handle`, only the upstream servers' tools: the "
            "built-ins depend on the run."
        ),
    )
    async def tools_(
        handle: Annotated[str | None, Field(description="a run's handle; default: any run")] = None,
    ) -> dict[str, Any]:
        if handle is None:
            return {"servers": runtime.upstream.catalog(None)}
        try:
            run = runtime.registry.get(handle)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return {"servers": offered_catalog(runtime, run)}

    refuse_unknown_arguments(mcp)
    return mcp


def refuse_unknown_arguments(mcp: MCPServer) -> None:
    """Make every tool of ``mcp`` refuse an argument name it does not declare (a misspelt
    ``budgetToolcalls`` was silently ignored): the argument model forbids extra keys, so the call
    is a tool error whose text names the key ("Extra inputs are not permitted"), and the input
    schema says ``additionalProperties: false``.

    The SDK has no public way to reach a registered tool's argument model (``MCPServer`` lists
    only the wire form of its tools) nor an option to forbid extra arguments, so this goes through
    its ``_tool_manager``; should that change, the assertion below fails loudly at start."""
    manager = getattr(mcp, "_tool_manager", None)
    assert manager is not None, "mcp SDK: MCPServer._tool_manager is gone; refuse unknown arguments anew"
    for tool in manager.list_tools():
        base = tool.fn_metadata.arg_model
        strict = type(
            base.__name__,
            (base,),
            {
                "model_config": ConfigDict(arbitrary_types_allowed=True, extra="forbid"),
                "__module__": base.__module__,
            },
        )
        tool.fn_metadata.arg_model = strict
        tool.parameters["additionalProperties"] = False
