"""The pods' MCP tools: ``send``, ``read``, ``stop``, ``list`` (:mod:`luftpause.runtime.pods.operations`
does them; this is their MCP face)::

    send(handle, message)            handle: a handle or the name of one of your runs
        -> {"handle", "name", "state", "delivered": "now" | "next turn"}
    read(handle, since?: cursor)
        -> {"handle", "name", "state": running|idle|stopped, "entries": [text], "cursor", "error"?}
    stop(handle)                     graceful: the current turn finishes, no new one starts
        -> {"handle", "name", "state", "scope": {"returns", "to", "when", "staysWith"} | null}
    list(handle?, caller?)           a run's children, or a caller's runs (default: yours)
        -> {"runs": [{"handle", "name", "state", "runState", "parent", "caller", "task",
                      "scope", "lastAnswer", "children", "pendingEvents", "error"?}]}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from luftpause.observe import tracing
from luftpause.runtime.agent import spans
from luftpause.runtime.errors import RuntimeFault
from luftpause.runtime.mcp.annotations import ANNOTATIONS, title
from luftpause.runtime.mcp.callers import actor_of
from luftpause.runtime.mcp.run_tools import check_text
from luftpause.runtime.pods.operations import PodOperations

Handle = Annotated[str, Field(min_length=1, description="a run's handle or name")]


def _pod_call(operation: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    try:
        return operation(*args)
    except RuntimeFault as exc:
        raise ToolError(str(exc)) from None


class PodTools:
    """The four pod tools over :class:`~luftpause.runtime.pods.operations.PodOperations`."""

    def __init__(self, pods: PodOperations) -> None:
        self.pods = pods

    def register(self, mcp: MCPServer) -> None:
        for name, fn, description in (
            ("send", self.send, SEND_DESCRIPTION),
            ("read", self.read, READ_DESCRIPTION),
            ("stop", self.stop, STOP_DESCRIPTION),
            ("list", self.list_, LIST_DESCRIPTION),
        ):
            mcp.add_tool(
                fn, name=name, title=title(name), description=description, annotations=ANNOTATIONS[name]
            )

    async def send(
        self,
        handle: Handle,
        message: Annotated[str, Field(min_length=1, description="the message")],
        ctx: Context,
    ) -> dict[str, Any]:
        check_text("message", message)
        sent = _pod_call(self.pods.send, actor_of(ctx), handle, message)
        if sent["delivered"] == "now":  # re-opened: its drive's task has not run yet
            spans.reopened(sent["handle"], ctx)
        await self.pods.registry.durable()  # the message survives a kill after this answer
        return sent

    async def read(
        self,
        handle: Handle,
        ctx: Context,
        since: Annotated[int | None, Field(ge=0, description="cursor from an earlier read")] = None,
    ) -> dict[str, Any]:
        actor = actor_of(ctx)
        if not tracing.active:
            read = _pod_call(self.pods.read, actor, handle, since)
        else:
            try:
                touched = [self.pods.resolve(actor, handle).handle]  # a name: linked to the run it names
            except RuntimeFault:
                touched = []  # refused below, with its message
            with spans.touching("read", touched, ctx):
                read = _pod_call(self.pods.read, actor, handle, since)
        await self.pods.registry.durable()  # the events it consumed stay read after a kill
        return read

    async def stop(self, handle: Handle, ctx: Context) -> dict[str, Any]:
        stopped = _pod_call(self.pods.stop, actor_of(ctx), handle)
        await self.pods.registry.durable()  # a kill after this answer does not bring the run back
        return stopped

    async def list_(
        self,
        ctx: Context,
        handle: Annotated[str | None, Field(description="a run whose children to list")] = None,
        caller: Annotated[str | None, Field(description="list this caller's runs instead")] = None,
    ) -> dict[str, Any]:
        return _pod_call(self.pods.list_runs, actor_of(ctx), handle, caller)


SEND_DESCRIPTION = (
    "Send `message` to a run (`handle`, or the name you gave it): an idle run (answered or "
    "failed) continues its whole conversation with it as a new user turn; a busy one gets it "
    "at its next turn. Its spawner is told, if that is not you."
)

READ_DESCRIPTION = (
    "A run's output entries (the text of each of its assistant messages, its answers "
    "included) after cursor `since` (all without it), a new `cursor` to pass next time, and "
    "its state: running, idle (takes `send`) or stopped."
)

STOP_DESCRIPTION = (
    "Stop a run gracefully: its current turn finishes, no new one starts, its filesystem "
    "scope returns to its spawner (`cancel` stops at once, with its descendants). The answer's "
    "`scope` says what returns, to whom and when, and what stays with its live descendants."
)

LIST_DESCRIPTION = (
    "Runs with name, state (running, idle, stopped), scope held and the first line of the "
    "last answer: the children of run `handle`; or the runs of `caller` (an earlier "
    "session's id, or the `caller` a spawn answered with, to find your runs from a new "
    "connection); default: your runs."
)
