"""The client side of the MCP Tasks extension (``io.modelcontextprotocol/tasks``, 2026-07-28) for
tests, on the SDK's public client extension API: the SDK has no request models for it, so
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` are defined here; their ``name_param`` makes the
SDK set the ``Mcp-Name`` header to the task id, as the extension requires."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.types import CallToolResult
from mcp_types import Request, Result
from pydantic import TypeAdapter

from luftpause.runtime.mcp.tasks_extension import TASKS_EXTENSION, TaskIdParams, TaskUpdateParams

TERMINAL = ("completed", "failed", "cancelled")
"""A task's states after which it changes no more."""


class CreatedTask(Result):
    """``CreateTaskResult``: ``resultType: "task"`` and the task's fields."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[TaskUpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TaskUpdateParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


RAW = TypeAdapter(dict[str, Any])


async def get_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    return await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), RAW)


async def update_task(session: ClientSession, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    params = TaskUpdateParams.model_validate({"taskId": task_id, "inputResponses": responses})
    return await session.send_request(UpdateTask(params=params), RAW)


async def cancel_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    return await session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), RAW)


async def poll(
    session: ClientSession, task_id: str, until: Callable[[dict[str, Any]], bool], seconds: float = 60
) -> dict[str, Any]:
    """``tasks/get`` until ``until(state)``; fails with the last state after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        state = await get_task(session, task_id)
        if until(state):
            return state
        assert loop.time() < deadline, f"task never got there: {state}"
        await asyncio.sleep(0.05)


class TasksDeclared(ClientExtension):
    """Declares the extension; ``run`` answers with the task itself (``allow_claimed``)."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        raise AssertionError("tasks are polled by the tests themselves")
