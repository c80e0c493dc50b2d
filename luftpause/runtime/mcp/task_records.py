"""The MCP tasks' records (:mod:`luftpause.runtime.mcp.tasks` is the tasks themselves): a task,
its two record types, the file they are kept in, and what a store several runtimes share gives.

Records (``tasks.jsonl``, or the ``tasks`` records of the PostgreSQL store), each carrying the
run's ``handle``, which the shared reader requires::

    {"type": "task", "taskId", "handle", "at", "elicits"}    created, written before the
                                                             CreateTaskResult is sent
    {"type": "end", "taskId", "handle", "at", "status", "statusMessage"?, "result"?, "error"?}
                                                             the task reached a terminal state
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from luftpause.runtime.runs.journal import TASKS_JOURNAL_NAME, Journal, Record

log = logging.getLogger("luftpause.runtime.mcp.tasks")

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


def iso8601(seconds: float) -> str:
    """Unix ``seconds`` as an ISO 8601 UTC timestamp with milliseconds (``...T10:30:00.000Z``)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


TASK_ID = re.compile(r"task-[0-9a-f]{32}")
"""What :func:`new_task_id` makes: an id of any other shape names no task."""


def new_task_id() -> str:
    """A fresh task id, ``task-`` and 32 hex digits (128 random bits: unguessable, since any
    client that knows it may poll or cancel the task)."""
    return f"task-{secrets.token_hex(16)}"


@runtime_checkable
class SharedTaskRecords(Protocol):
    """The tasks' records on a store several runtimes share
    (:class:`~luftpause.runtime.runs.postgres.PostgresJournal`): what a runtime needs to adopt
    the tasks of the runs it took over, and to find a task another runtime serves. Each raises
    :class:`~luftpause.runtime.errors.StoreUnusable` when the store cannot be reached."""

    @property
    def shared(self) -> bool:
        """Whether other runtimes share the store (else the rest is never called)."""

    def records_of_others(self, handles: list[str]) -> list[Record]:
        """The task records about runs ``handles`` that other runtimes wrote, in order."""

    def drop_others(self, handles: list[str]) -> None:
        """Delete those records (once this runtime's copies are durable)."""

    def find_task(self, task_id: str) -> str | None:
        """The run handle of the task ``task_id``, whoever recorded it; ``None``: none did."""


@dataclass(eq=False)
class Task:
    """One task: the ``run`` call of a client with the extension, bound to the run ``handle``.

    ``elicits``: whether the creating request declared form elicitation (approvals are then asked
    as ``input_required``). Times are Unix seconds. ``status`` is the last state observed (for
    ``lastUpdatedAt``); ``result`` (completed: the CallToolResult wire object) and ``error``
    (failed: a JSON-RPC error object) are set once it ended.
    """

    task_id: str
    handle: str
    created_at: float
    elicits: bool
    updated_at: float = 0.0
    status: TaskStatus = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    ended_at: float | None = None
    cancel_requested: bool = False

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    def created_record(self) -> Record:
        return {
            "type": "task",
            "taskId": self.task_id,
            "handle": self.handle,
            "at": self.created_at,
            "elicits": self.elicits,
        }

    def end_record(self) -> Record:
        record: Record = {
            "type": "end",
            "taskId": self.task_id,
            "handle": self.handle,
            "at": self.ended_at,
            "status": self.status,
        }
        extra = (("statusMessage", self.status_message), ("result", self.result), ("error", self.error))
        for key, value in extra:
            if value is not None:
                record[key] = value
        return record


class TaskJournal(Journal):
    """``tasks.jsonl``: the runs journal's format rules (:class:`Journal`) under another name.
    Every record carries the run's ``handle``, which the shared reader requires."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, file_name=TASKS_JOURNAL_NAME)


def rebuild_tasks(records: Iterable[Record], tasks: dict[str, Task], label: str) -> bool:
    """Apply the tasks' ``records`` to ``tasks`` (by task id); whether there was any. A record
    that cannot be applied is skipped with a warning naming ``label`` (the store)."""
    seen = False
    for record in records:
        seen = True
        kind, task_id = record.get("type"), record.get("taskId")
        try:
            if not isinstance(task_id, str):
                raise TypeError("taskId is not a string")
            if kind == "task":
                at = float(record["at"])
                tasks[task_id] = Task(
                    task_id=task_id,
                    handle=str(record["handle"]),
                    created_at=at,
                    updated_at=at,
                    elicits=bool(record.get("elicits")),
                )
            elif kind == "end":
                task = tasks[task_id]
                status = record["status"]
                if status not in TERMINAL:
                    raise ValueError(f"not a terminal status: {status!r}")
                task.status = status
                task.status_message = record.get("statusMessage")
                task.result = record.get("result")
                task.error = record.get("error")
                task.ended_at = task.updated_at = float(record["at"])
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s: a %s record of %s skipped: %r", label, kind, task_id, exc)
    return seen
