"""The Tasks extension's binding to the ``mcp`` SDK: ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` (their params models), and the ``tools/call`` interceptor that lets ``run``
answer with a task to a client that declared the extension in that request.

What a task is, its wire shapes, states, errors and journal: :mod:`luftpause.runtime.mcp.tasks`
(the :class:`~luftpause.runtime.mcp.tasks.TaskRegistry` these methods answer from). Built on the
SDK's public extension API (``mcp.server.extension``), not by patching it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp_types import CallToolRequestParams, InputResponses, RequestParams
from pydantic import Field

from luftpause.runtime.mcp.tasks import Task, TaskRegistry
from luftpause.runtime.runs.tenants import Tenant, tenant_in

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier (client and server capabilities ``extensions``)."""

TASKS_PROTOCOL_VERSIONS = frozenset({"2026-07-28"})
"""Protocol revisions whose requests may get tasks (the extension's spec is for 2026-07-28;
2025-11-25 had a different, core Tasks feature that this runtime does not serve)."""

TASK_TOOLS = frozenset({"run"})
"""Tools that answer with a task to a client that declared the extension."""


class TaskIdParams(RequestParams):
    """Params of ``tasks/get`` and ``tasks/cancel``: ``{"taskId"}`` (and the usual ``_meta``)."""

    task_id: str = Field(min_length=1)


class TaskUpdateParams(TaskIdParams):
    """Params of ``tasks/update``: ``{"taskId", "inputResponses"}``, keyed like the task's
    ``inputRequests`` (MRTR ``InputResponses``)."""

    input_responses: InputResponses


class TaskSlot:
    """Where the ``run`` tool leaves the task it created, for the interceptor to answer with.

    The interceptor opens one (a context variable) only for a request that may get a task; the
    tool learns from :func:`task_slot` that it should create one instead of waiting.
    """

    def __init__(self) -> None:
        self.task: Task | None = None


_slot: contextvars.ContextVar[TaskSlot | None] = contextvars.ContextVar("luftpause_task_slot", default=None)


def task_slot() -> TaskSlot | None:
    """The slot of the current ``tools/call`` when it may be answered with a task, else ``None``."""
    return _slot.get()


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request declared the extension in its client capabilities, on a protocol
    revision the extension is defined for."""
    if ctx.protocol_version not in TASKS_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return extensions is not None and TASKS_EXTENSION in extensions


class TasksExtension(Extension):
    """The SDK extension: ``tasks/get``, ``tasks/update``, ``tasks/cancel`` on 2026-07-28, and a
    ``tools/call`` interceptor that lets ``run`` answer with a task to a client that declared
    the extension in that request (:func:`task_slot`)."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: TaskRegistry) -> None:
        self.tasks = tasks

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskIdParams, self._get, TASKS_PROTOCOL_VERSIONS),
            MethodBinding("tasks/update", TaskUpdateParams, self._update, TASKS_PROTOCOL_VERSIONS),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, TASKS_PROTOCOL_VERSIONS),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not declares_tasks(ctx):
            return await call_next(ctx)
        slot = TaskSlot()
        token = _slot.set(slot)
        try:
            result = await call_next(ctx)
        finally:
            _slot.reset(token)
        if slot.task is None:  # refused (bad arguments) or answered without a task: as it is
            return result
        return {"resultType": "task", **self.tasks.describe(slot.task)}

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        return {"resultType": "complete", **self.tasks.describe(self.tasks.get(params.task_id, _tenant(ctx)))}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        self.tasks.update(params.task_id, params.input_responses, _tenant(ctx))
        await self.tasks.runs.durable()  # the decisions are not asked again after a kill
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        self.tasks.cancel(params.task_id, _tenant(ctx))
        await self.tasks.runs.durable()  # the cancelled runs stay ended after a kill
        return {"resultType": "complete"}


def _tenant(ctx: ServerRequestContext[Any, Any]) -> Tenant | None:
    """The tenant of the request behind ``ctx`` (:mod:`luftpause.runtime.runs.tenants`)."""
    return tenant_in(getattr(getattr(ctx, "request", None), "scope", None))
