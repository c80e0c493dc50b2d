"""The MCP tools about runs once they exist, and the runtime's other tools: ``status``, ``cancel``,
``approve``, ``tools`` and ``decide``::

    status(handle?, limit = 100 (at most 1000), offset = 0)
        -> {"run": run status, whole task}  or  {"runs": [run status of the caller's runs, task
           summarized, no answer text: "answerChars"], "total", "caller", "nextOffset"? (more to
           page through), "events"? (the caller's pending notifications, given once)}
    cancel(handle)
        -> {"handle", "cancelled": [handles stopped: the run and its running descendants]}
    approve(handle, allow: bool, call?: approval id)          call: needed when several wait
        -> {"handle", "call", "tool", "arguments", "allow"}             the call it answered
    tools(handle?)
        -> {"servers": [{"server", "transport", "reachable", "error"?, "tools": [{"name",
            "description", "inputSchema", "annotations"}]}]}      (UpstreamPool.catalog)
           with handle: what that run is offered, its built-ins last as {"server": "luftpause",
           "transport": "builtin", "reachable": true, "tools": [...]}       (offered_catalog)
    decide(input, labels?: [2..20 labels], model?)
        -> {"mode": "single-pass", "model", "label", "probs", "numClasses"}     without labels
        -> {"mode": "labels", "model", "label", "probabilities", "unscored"}   with labels

    run status = run result + {"model", "serviceClass", "caller", "task", "taskChars",
                               "maxToolCalls", "maxTokens", "instruction", "startedAt",
                               "parent", "children"}

A handle that names no run (or another tenant's) is refused by ``cancel`` and ``approve`` naming
the caller's own handles that would do: its runs still running, or waiting for approval (at most
:data:`MAX_HANDLES_NAMED`), so a client (or its model) that made one up sees the real ones.

A listing of runs shows each task summarized (its first 200 characters and ``…``; ``taskChars`` is
the whole length), so it stays small however long the tasks; ``status`` for one handle shows it
whole. ``decide`` is described in :mod:`luftpause.runtime.decide`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from luftpause.config import Config
from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.agent.upstream import UpstreamPool, tool_listing
from luftpause.runtime.decide import MAX_LABELS, MIN_LABELS, Decider
from luftpause.runtime.errors import RuntimeFault, UnknownModel, UnknownRun
from luftpause.runtime.mcp.annotations import ANNOTATIONS, title
from luftpause.runtime.mcp.callers import caller_of, tenant_of
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.pods.operations import PodOperations
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.runs.spec import text_size_problem
from luftpause.runtime.runs.tenants import only_visible
from luftpause.runtime.spawn.builtin_tools import BuiltinTools

MAX_HANDLES_NAMED = 10
"""Most of the caller's handles an unknown handle's refusal names (then how many more)."""

DEFAULT_STATUS_LIST = 100
"""Runs ``status`` lists without a handle, by default (``limit``)."""

MAX_STATUS_LIST = 1000
"""Most runs one ``status`` listing gives; page with ``offset``."""

BUILTIN_SERVER = "luftpause"
"""The ``server`` of the entry that lists a run's built-in tools in ``tools(handle)``; its
``transport`` is ``"builtin"`` (they run inside the runtime)."""


def listed_status(status: dict[str, Any]) -> dict[str, Any]:
    """A run's status as a listing shows it: without its answer text (``answerChars`` gives its
    length; ``status(handle)`` or ``await`` give it whole), so a listing stays small however
    long the answers."""
    answer = status.pop("answer", None)
    if isinstance(answer, str):
        status["answerChars"] = len(answer)
    return status


def check_text(name: str, text: str | None) -> None:
    """Raise :class:`ToolError` when ``text`` is over spawn's 1 MiB (UTF-8) per text."""
    problem = text_size_problem(name, text)
    if problem is not None:
        raise ToolError(problem)


class RunTools:
    """``status``, ``cancel``, ``approve``, ``tools`` and ``decide`` over the runtime's parts."""

    def __init__(
        self,
        *,
        config: Config,
        registry: RunRegistry,
        approvals: Approvals,
        notifications: Notifications,
        pods: PodOperations,
        upstream: UpstreamPool,
        builtins: BuiltinTools,
        decider: Decider,
        models: list[str],
    ) -> None:
        self.config = config
        self.registry = registry
        self.approvals = approvals
        self.notifications = notifications
        self.pods = pods
        self.upstream = upstream
        self.builtins = builtins
        self.decider = decider
        self.models = models

    def register(self, mcp: MCPServer) -> None:
        for name, fn, description in (
            ("status", self.status, STATUS_DESCRIPTION),
            ("cancel", self.cancel, CANCEL_DESCRIPTION),
            ("approve", self.approve, APPROVE_DESCRIPTION),
            ("decide", self.decide, DECIDE_DESCRIPTION),
            ("tools", self.tools, TOOLS_DESCRIPTION),
        ):
            mcp.add_tool(
                fn, name=name, title=title(name), description=description, annotations=ANNOTATIONS[name]
            )

    async def status(
        self,
        ctx: Context,
        handle: str | None = None,
        limit: Annotated[
            int, Field(ge=1, le=MAX_STATUS_LIST, description="most runs listed (newest last)")
        ] = DEFAULT_STATUS_LIST,
        offset: Annotated[int, Field(ge=0, description="runs to skip, oldest first (paging)")] = 0,
    ) -> dict[str, Any]:
        registry = self.registry
        tenant = tenant_of(ctx)
        if handle is None:
            caller = caller_of(ctx)
            held = only_visible(registry.of_caller(caller), tenant)
            page = held[offset : offset + limit]
            listing: dict[str, Any] = {
                "runs": [listed_status(registry.status_of(run)) for run in page],
                "total": len(held),
                "caller": caller,
            }
            if offset + limit < len(held):
                listing["nextOffset"] = offset + limit
            events = self.notifications.take_caller_events(caller)
            if events:
                listing["events"] = events
            return listing
        try:
            return {"run": registry.status_of(registry.get_for(handle, tenant), full_task=True)}
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None

    def _unknown(self, exc: UnknownRun, ctx: Context, what: str, fits: Callable[[Run], bool]) -> ToolError:
        """The refusal of an unknown ``handle``: ``exc``'s message and the caller's own runs
        that ``fits`` (``what`` says how: "still running")."""
        handles = [
            r.handle for r in only_visible(self.registry.of_caller(caller_of(ctx)), tenant_of(ctx)) if fits(r)
        ]
        if not handles:
            return ToolError(f"{exc}; none of your runs is {what} (a handle is what spawn returned)")
        named = ", ".join(handles[:MAX_HANDLES_NAMED])
        more = len(handles) - MAX_HANDLES_NAMED
        return ToolError(f"{exc}; your runs {what}: {named}" + (f" and {more} more" if more > 0 else ""))

    async def cancel(self, handle: str, ctx: Context) -> dict[str, Any]:
        try:
            self.registry.get_for(handle, tenant_of(ctx))
            stopped = self.registry.cancel(handle)
            # An idle run (and idle ones below it) ends too: stopped, its scope returned (pods/).
            stopped += self.pods.end_idle(self.registry.get(handle), "cancel")
        except UnknownRun as exc:
            raise self._unknown(exc, ctx, "still running", lambda run: not run.done) from None
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        await self.registry.durable()  # the ends survive a kill after this answer
        return {"handle": handle, "cancelled": [run.handle for run in stopped]}

    async def approve(
        self,
        handle: str,
        allow: bool,
        ctx: Context,
        call: Annotated[
            str | None,
            Field(description="the approval id (pendingApprovals[].id); needed when several wait"),
        ] = None,
    ) -> dict[str, Any]:
        try:
            self.registry.get_for(handle, tenant_of(ctx))
            approval = await self.approvals.answer_when_asked(handle, allow, call)
        except UnknownRun as exc:
            waiting = "waiting for approval"
            raise self._unknown(
                exc, ctx, waiting, lambda run: bool(run.approvals.open()) and not run.done
            ) from None
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        await self.registry.durable()  # the decision is not asked again after a kill
        return {
            "handle": handle,
            "call": approval.id,
            "tool": approval.tool,
            "arguments": approval.arguments,
            "allow": allow,
        }

    async def decide(
        self,
        input: Annotated[str, Field(min_length=1, description="the text to classify")],
        ctx: Context,
        labels: Annotated[
            list[Annotated[str, Field(min_length=1)]] | None,
            Field(min_length=MIN_LABELS, max_length=MAX_LABELS, description="2-20 distinct labels"),
        ] = None,
        model: Annotated[str | None, Field(description="model name; default: the first that fits")] = None,
    ) -> dict[str, Any]:
        check_text("input", input)
        replicas = self.config.replicas
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
                return await self.decider.single_pass(input, chosen, caller)
            # Scoring matches the first token case-insensitively, so "Yes" and "yes" would share
            # one score: labels must differ in more than case.
            seen: dict[str, str] = {}
            for label in labels:
                key = label.strip().casefold()
                if key in seen:
                    raise ToolError(f"labels must be distinct ignoring case: {seen[key]!r} and {label!r}")
                seen[key] = label
            chosen = model or self.config.default_model
            if chosen not in self.models:
                raise ToolError(str(UnknownModel(chosen, self.models)))
            return await self.decider.by_labels(input, labels, chosen, caller)
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None

    async def tools(
        self,
        ctx: Context,
        handle: Annotated[str | None, Field(description="a run's handle; default: any run")] = None,
    ) -> dict[str, Any]:
        if handle is None:
            return {"servers": self.upstream.catalog(None)}
        try:
            run = self.registry.get_for(handle, tenant_of(ctx))
        except RuntimeFault as exc:
            raise ToolError(str(exc)) from None
        return {"servers": self.offered_catalog(run)}

    def offered_catalog(self, run: Run) -> list[dict[str, Any]]:
        """What ``tools(handle)`` answers for ``run``: the tools its turns are offered, as the loop
        builds them (:meth:`SubAgentLoop._turns`), by server::

            [upstream entries (UpstreamPool.catalog of the run's allowed tools, less any tool a
             built-in of the run hides)...,
             {"server": "luftpause", "transport": "builtin", "reachable": true,
              "tools": [tool_listing(tool)]}]     the run's built-ins (BuiltinTools.offered), maybe none

        The built-ins are those of the run as it stands now: the workspace tools while it holds a
        filesystem scope, the orchestration tools when it was spawned with ``orchestrate``. A run
        whose tool budget is spent is offered nothing in its turns; this still lists what it may
        use. An unreachable server's entry (``reachable: false``) shows what the run is offered
        once it is back, as :meth:`UpstreamPool.catalog` says."""
        builtin = self.builtins.offered(run)
        hidden = {tool.name for tool in builtin}  # a built-in wins a name clash, as in the loop
        servers = self.upstream.catalog(run.spec.allowed_tools)
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


STATUS_DESCRIPTION = (
    "One run's status by `handle`, with its whole task and answer, its parent and children; "
    "or, without one, the runs you spawned (oldest first, at most `limit`, from `offset`; "
    "`total` and `nextOffset` for paging; `caller` is who you are counted as), each task cut to "
    "its first 200 characters (`taskChars` gives the whole length) and no answer text (`answerChars`)."
)

CANCEL_DESCRIPTION = (
    "Cancel the run `handle` now, and every running run below it in its tree. Cancelled runs "
    "report state 'cancelled'. Returns the handles it stopped."
)

APPROVE_DESCRIPTION = (
    "Answer a tool call the run `handle` waits on (state 'AwaitingApproval', listed in "
    "`pendingApprovals` with ids): `allow` true lets it go (once), false refuses it (the "
    "sub-agent is told you declined). `call` names the approval id; it may be left out when "
    "exactly one waits. Returns the call it answered."
)

DECIDE_DESCRIPTION = (
    "Classify `input` quickly. Without `labels`: the single-pass classifier model (its own "
    "labels). With 2-20 `labels`: one one-token turn of a generative model, scored by its "
    "first-token probabilities: returns the `label`, `probabilities` (over the labels "
    "that were scored) and `unscored` labels. Single-word labels score best."
)

TOOLS_DESCRIPTION = (
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
)
