"""The Tasks extension's binding to the ``mcp`` SDK: ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` (their params models), and the ``tools/call`` interceptor that lets ``run``
answer with a task to a client that declared the extension in that request.

What a task is, its wire shapes, states, errors and journal: :mod:`luftpause.runtime.mcp.tasks`
(the :class:`~luftpause.runtime.mcp.tasks.TaskRegistry` these methods answer from). Built on the
SDK's public extension API (``mcp.server.extension``), not by patching it.

On a PostgreSQL store several runtimes share, a task is served by the runtime holding its run
(docs/runtime-store.md): ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` about a task this
runtime does not serve are forwarded there, as :mod:`luftpause.runtime.mcp.routing` forwards
tool calls, and the answer (or JSON-RPC error) comes back unchanged. The task's run is found from
its ``task`` record in the store, its runtime from the run's lease. The request goes with the
caller's ``Authorization`` (the tenant rules are the serving runtime's: another tenant's task is
``-32602`` from every runtime) and :data:`~luftpause.runtime.mcp.routing.FORWARDED_HEADER` (a
forwarded request is answered where it lands). A dead runtime's tasks wait for the takeover of
their run; ``tasks/update`` and ``tasks/cancel`` whose runtime died under them answer ``-32603``
saying their outcome is unknown, never repeated silently.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx2
from mcp import Client, MCPError
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    CallToolRequestParams,
    InputResponses,
    Request,
    RequestParams,
    Result,
)
from pydantic import ConfigDict, Field, SerializeAsAny

from luftpause.runtime.errors import StoreUnusable
from luftpause.runtime.mcp.routing import FORWARDED_HEADER, Router
from luftpause.runtime.mcp.tasks import Task, TaskRegistry
from luftpause.runtime.runs.custody import Whereabouts
from luftpause.runtime.runs.tenants import Tenant, tenant_in

log = logging.getLogger("luftpause.runtime.mcp.tasks")

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


class _Forwarded(Request[TaskIdParams, str]):
    """A ``tasks/*`` request as it is forwarded to the runtime serving the task (the SDK sets
    ``Mcp-Name`` to the task id from ``name_param``, as the extension requires; ``params`` keep
    their own class's fields: ``inputResponses`` of ``tasks/update``)."""

    method: str
    params: SerializeAsAny[TaskIdParams]
    name_param = "taskId"


class _Answer(Result):
    """The serving runtime's answer, every field kept as it came (given back unchanged)."""

    model_config = ConfigDict(extra="allow")


FORWARD_TIMEOUT = httpx2.Timeout(30.0)
"""Limits of a forwarded ``tasks/*`` request (seconds): each is answered at once."""


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

    def __init__(self, tasks: TaskRegistry, router: Router | None = None) -> None:
        self.tasks = tasks
        self.router = router
        """Forwards requests about tasks another runtime serves (a shared store), or ``None``."""

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
        if (forwarded := await self._routed("tasks/get", ctx, params)) is not None:
            return forwarded
        return {"resultType": "complete", **self.tasks.describe(self.tasks.get(params.task_id, _tenant(ctx)))}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        if (forwarded := await self._routed("tasks/update", ctx, params)) is not None:
            return forwarded
        self.tasks.update(params.task_id, params.input_responses, _tenant(ctx))
        await self.tasks.runs.durable()  # the decisions are not asked again after a kill
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        require_client_extension(ctx, TASKS_EXTENSION)
        if (forwarded := await self._routed("tasks/cancel", ctx, params)) is not None:
            return forwarded
        self.tasks.cancel(params.task_id, _tenant(ctx))
        await self.tasks.runs.durable()  # the cancelled runs stay ended after a kill
        return {"resultType": "complete"}

    # Tasks another runtime serves (module docstring).

    async def _routed(
        self, method: str, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any] | None:
        """The answer of the runtime serving the task, or ``None`` when it is this runtime's to
        answer (it serves the task, no runtime recorded it, or the request was forwarded here).
        Raises the serving runtime's ``MCPError``, or ``MCPError`` ``-32603`` when that runtime
        cannot be reached (:meth:`Router.reach`) or the store cannot be read."""
        router, task_id = self.router, params.task_id
        headers: Mapping[str, str] | None = getattr(ctx.request, "headers", None)
        if router is None or (headers is not None and headers.get(FORWARDED_HEADER)):
            return None
        if self.tasks.held_here(task_id):
            return None
        try:
            handle = await self.tasks.locate(task_id)
        except StoreUnusable as exc:
            raise MCPError(INTERNAL_ERROR, f"task {task_id}: {exc}") from exc
        if handle is None:
            return None

        async def forward(place: Whereabouts) -> dict[str, Any]:
            return await self._forward(router, place, method, params, headers)

        def refuse(reason: str) -> Exception:
            return MCPError(INTERNAL_ERROR, f"{method} of {task_id}: {reason}")

        return await router.reach(
            [handle],
            method,
            forward,
            changing=method != "tasks/get",
            held_here=lambda: self.tasks.held_here(task_id),
            refuse=refuse,
        )

    @staticmethod
    async def _forward(
        router: Router,
        place: Whereabouts,
        method: str,
        params: TaskIdParams,
        headers: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        """``method`` with ``params`` at the runtime ``place``, as a client declaring the
        extension; its answer. Its JSON-RPC error is raised as it is (``MCPError``); a lost
        connection raises what the transport raised (for :meth:`Router.reach`)."""
        assert place.url is not None
        sent = {FORWARDED_HEADER: router.custody.owner}
        authorization = headers.get("authorization") if headers is not None else None
        if authorization:
            sent["authorization"] = authorization
        # Without the caller's _meta: the forwarding client stamps its own (protocol, capabilities).
        request = _Forwarded(method=method, params=params.model_copy(update={"meta": None}))
        refused: MCPError | None = None
        async with (
            httpx2.AsyncClient(headers=sent, timeout=FORWARD_TIMEOUT) as http,
            Client(
                streamable_http_client(f"{place.url}/mcp", http_client=http),
                mode=sorted(TASKS_PROTOCOL_VERSIONS)[-1],
                extensions=[advertise(TASKS_EXTENSION)],
            ) as client,
        ):
            log.info("forwarding %s of %s to runtime %s", method, params.task_id, place.owner)
            try:
                answer = await client.session.send_request(request, _Answer)
                return answer.model_dump(by_alias=True, mode="json", exclude_unset=True)
            except MCPError as exc:
                if exc.error.code == CONNECTION_CLOSED:
                    raise ConnectionResetError(f"runtime {place.owner} closed the connection") from exc
                refused = exc  # the serving runtime's answer: raised outside the client's task group
        raise refused


def _tenant(ctx: ServerRequestContext[Any, Any]) -> Tenant | None:
    """The tenant of the request behind ``ctx`` (:mod:`luftpause.runtime.runs.tenants`)."""
    return tenant_in(getattr(getattr(ctx, "request", None), "scope", None))
