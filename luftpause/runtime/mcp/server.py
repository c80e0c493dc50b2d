"""The runtime's MCP server: its tools, their instructions, and the Tasks extension.

Tools (argument names camelCase on the wire, as in docs/architecture.md "The runtime"; results
are JSON objects, as ``structuredContent`` and as the same JSON in the text content), by group:

* :mod:`~luftpause.runtime.mcp.spawn_tools`: ``spawn``, ``await``, ``run``;
* :mod:`~luftpause.runtime.mcp.run_tools`: ``status``, ``cancel``, ``approve``, ``decide``,
  ``tools``;
* :mod:`~luftpause.runtime.mcp.pod_tools`: ``send``, ``read``, ``stop``, ``list``.

Every tool carries MCP tool annotations and a title (:mod:`~luftpause.runtime.mcp.annotations`)
and refuses an argument name it does not declare (:func:`refuse_unknown_arguments`). Bad input
comes back as an MCP tool error (``isError: true``) whose text says what was wrong: an unknown or
expired handle (or ``parent``), a cancelled ``parent``, a ``serviceClass`` or ``mode`` outside its
enum, an unknown tool name, a model no generative replica serves, ``maxToolCalls`` outside
0..1000, ``maxTokens`` outside 0..1,000,000, a budget below 1 (or past its bound), a ``task`` or
``system`` longer than 1 MiB (UTF-8), an ``instruction`` that is not in the instructions folder, a
``timeout`` that is not a finite number.

Every run result carries ``podState`` (``running``, ``idle``: completed or failed, ``send``
continues it; ``stopped``: cancelled or stopped) beside ``state``, which keeps its meaning
(``await`` waits until a run is done, so an idle run is done there)::

    run result = {"handle", "state": running|AwaitingApproval|completed|failed|cancelled,
                  "podState", "pendingApprovals"?: [{"id", "tool", "arguments", "repeat"?}],
                  "pendingApproval"?: the first of them, "answer"?, "error"?,
                  "durable"?: false, "journalError"? (a record of the run was not written),
                  "toolCalls", "failedToolCalls", "turns", "seconds",
                  "usage": {"promptTokens", "completionTokens"},
                  "limits"?, "used"?, "exceeded"? (a run that sets budgets)}

Budgets bound the run and all its descendants (:mod:`luftpause.runtime.runs.budgets`); on excess
the subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``. A cancelled run reports
state ``cancelled`` and the reason as its ``error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import ConfigDict

from luftpause import __version__
from luftpause.runtime.mcp.across import AcrossRuntimes
from luftpause.runtime.mcp.pod_tools import PodTools
from luftpause.runtime.mcp.routing import Router
from luftpause.runtime.mcp.run_tools import RunTools
from luftpause.runtime.mcp.spawn_tools import SpawnTools

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


class RuntimeMCPServer(MCPServer):
    """``MCPServer`` whose tool calls about runs another runtime holds go to that runtime, when
    it has a :class:`~luftpause.runtime.mcp.routing.Router` (a shared PostgreSQL store), and whose
    listings and pod names take in every runtime's runs
    (:class:`~luftpause.runtime.mcp.across.AcrossRuntimes`)."""

    router: Router | None = None
    across: AcrossRuntimes | None = None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if self.router is not None and context is not None:
            forwarded = await self.router.route(name, arguments, context)
            if forwarded is not None:
                return forwarded
        if self.across is not None and context is not None:
            ctx = context

            async def local(tool: str, args: dict[str, Any]) -> CallToolResult | InputRequiredResult:
                return await MCPServer.call_tool(self, tool, args, ctx)

            async def routed(tool: str, args: dict[str, Any]) -> CallToolResult | InputRequiredResult:
                return await self.call_tool(tool, args, ctx)

            answered = await self.across.answer(name, arguments, ctx, local, routed)
            if isinstance(answered, dict):  # a merged listing: rendered as the tool renders it
                tool = self._tool_manager.get_tool(name)
                assert tool is not None, name
                return tool.fn_metadata.convert_result(answered)
            if answered is not None:
                return answered
        return await super().call_tool(name, arguments, context)


def build_mcp_server(
    *,
    spawn_tools: SpawnTools,
    run_tools: RunTools,
    pod_tools: PodTools,
    extensions: Sequence[Any] = (),
    router: Router | None = None,
) -> MCPServer:
    """The ``MCPServer`` with the runtime's tools (each group bound to the parts it uses), the
    SDK ``Extension`` s given (the Tasks extension: :mod:`luftpause.runtime.mcp.tasks_extension`)
    and, on a shared store, the ``router`` of calls about other runtimes' runs."""
    mcp = RuntimeMCPServer(
        "luftpause", instructions=INSTRUCTIONS, version=__version__, extensions=list(extensions)
    )
    mcp.router = router
    mcp.across = AcrossRuntimes(router) if router is not None else None
    spawn_tools.register(mcp)
    run_tools.register(mcp)
    pod_tools.register(mcp)
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
