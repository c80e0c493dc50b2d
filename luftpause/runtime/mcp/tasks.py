"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``) for ``run``: a task instead of a
blocking call, recorded in ``tasks.jsonl`` beside ``runs.jsonl``.

Spec followed: the Tasks extension document for protocol revision 2026-07-28
(``modelcontextprotocol/ext-tasks``, ``specification/2026-07-28/tasks.md``, from SEP-2663), with
input requests shaped as in the 2026-07-28 multi round-trip requests pattern. The ``mcp`` SDK
2.3.0 has no Tasks support; this is built on its public extension API (``mcp.server.extension``:
an ``Extension`` with three ``MethodBinding`` s and a ``tools/call`` interceptor,
:mod:`luftpause.runtime.mcp.tasks_extension`), not by patching it. This module is the tasks
themselves: their states read from the runs, their journal and retention, and how they follow
their runs between runtimes sharing a store; their records are
:mod:`luftpause.runtime.mcp.task_records`.

Wire shapes (JSON, camelCase; all on 2026-07-28 only)::

    tools/call run(...)     from a request whose client capabilities declare the extension
        -> {"resultType": "task", "taskId", "status": "working", "statusMessage",
            "createdAt", "lastUpdatedAt", "ttlMs": null, "pollIntervalMs"}       CreateTaskResult
    tasks/get    {"taskId"}
        -> {"resultType": "complete", "taskId", "status", "statusMessage"?, "createdAt",
            "lastUpdatedAt", "ttlMs", "pollIntervalMs",
            "inputRequests"   (input_required: {"approve:<approval id>":
                               {"method": "elicitation/create", "params": {"mode": "form",
                                "message", "requestedSchema": {allow: boolean}}}}),
            "result"          (completed: the CallToolResult that a blocking ``run`` answers,
                               ``{"content", "structuredContent": {"runs": [run result],
                               "timedOut": false}, "isError": false}``),
            "error"           (failed: a JSON-RPC error object {"code", "message"})}
    tasks/update {"taskId", "inputResponses": {"approve:<approval id>":
                                               {"action": "accept", "content": {"allow": bool}}
                                               | {"action": "decline"}}}     -> {} (ack)
    tasks/cancel {"taskId"}                                                  -> {} (ack)

Timestamps are ISO 8601 UTC; ``ttlMs`` (integer milliseconds from ``createdAt``) is ``null`` while
the task is open, since a task is never discarded while its run goes on, and once it ended says
when it will be dropped (:data:`DEFAULT_RETENTION_SECONDS` after its end).

Task states follow the run (:mod:`luftpause.runtime.runs.registry`):

* ``working``: the run is running. A run that waits for approval while the client that created
  the task did not declare form elicitation also shows ``working``, with a ``statusMessage`` that
  says so: that client can answer only with the ``approve`` tool.
* ``input_required``: the run waits for approval of a tool call (:mod:`luftpause.runtime.agent.approvals`)
  and the creating request declared form elicitation; ``inputRequests`` holds the question (one
  boolean field ``allow``), keyed ``approve:<approval id>``, a key never reused within the task.
  ``tasks/update`` answers it (``accept`` with ``allow``, or ``decline`` = refused); the task goes
  back to ``working``. Keys not outstanding and answers without a decision are ignored, as the spec
  says. ``approve`` works too.
* ``completed``: the run ended (completed, failed, or cancelled by ``cancel``, a parent or a budget);
  ``result`` is exactly what a blocking ``run`` would have answered for it (a failed *run* is a tool
  result, not a JSON-RPC error, so its task is ``completed``, as the spec requires).
* ``cancelled``: ``tasks/cancel`` stopped the run, cascading to its running descendants as the
  ``cancel`` tool does. A run that had already ended keeps its task ``completed``.
* ``failed``: the runtime serving the task stopped (crash or shutdown) while the task was open,
  and started again. On that start the task is failed with a JSON-RPC internal error saying so,
  while its run resumes from its journal as every run does: ``await`` its handle (named in the
  message) for the answer. (A runtime that does not come back: see below.)

Errors (JSON-RPC): ``-32602`` for an unknown or dropped ``taskId``; ``-32021`` (missing required
client capability) when the request does not declare the extension. Other clients, and
2025-era connections, get the blocking ``run``.

Journal: ``<state_dir>/tasks.jsonl`` (or the ``tasks`` records of the PostgreSQL store,
:mod:`luftpause.runtime.runs.store`), written like ``runs.jsonl`` (:mod:`luftpause.runtime.runs.journal`:
one ``O_APPEND`` write and ``fsync`` per record, a torn last line cut and skipped with a warning);
its two record types (``task``, ``end``): :mod:`luftpause.runtime.mcp.task_records`.
``working`` and ``input_required`` are not journaled: they are read from the run, and after a
restart no task is in either. On start the journal is replayed, open tasks are failed (an ``end``
record each) and the file is rewritten with the tasks still kept.

Several runtimes on one PostgreSQL store (docs/runtime-store.md): a task is served by the runtime
holding its run (its lease, :mod:`luftpause.runtime.runs.custody`), and its records are that
runtime's (``owner``). Any other runtime forwards ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` there (:mod:`luftpause.runtime.mcp.tasks_extension`), finding the task's run
from its ``task`` record (:meth:`TaskRegistry.locate`). When a runtime takes over a dead
runtime's runs, it **adopts** their tasks (the run registry's takeover listener): rebuilt from the
dead runtime's records, ``elicits`` kept, open ones followed as if created here (their state read
from the run that goes on here, their end recorded when it ends), their records written again
under this runtime and the dead runtime's removed. Tasks taken over this way are not failed, since
nothing about them stopped: only their runtime did. The runtime that lost runs (one paused past its
leases) lets their tasks go without recording anything. A runtime starting again fails only the
open tasks of runs it still holds (as above); those of runs another runtime took meanwhile are left
to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from mcp import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolResult,
    InputRequiredResult,
    InputResponses,
)

from luftpause.runtime.agent.approvals import Approvals, PendingApproval
from luftpause.runtime.errors import JournalWriteError, RuntimeFault, StoreUnusable
from luftpause.runtime.mcp.elicitation import INPUT_KEY_PREFIX, allow_of, input_request
from luftpause.runtime.mcp.task_records import (
    TASK_ID,
    TERMINAL,
    SharedTaskRecords,
    Task,
    TaskJournal,
    TaskStatus,
    iso8601,
    new_task_id,
    rebuild_tasks,
)
from luftpause.runtime.runs.journal import TASKS_JOURNAL_NAME, Record
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.runs.store import RecordStore
from luftpause.runtime.runs.tenants import Tenant, visible

__all__ = [
    "TASKS_JOURNAL_NAME",
    "TERMINAL",
    "SharedTaskRecords",
    "Task",
    "TaskJournal",
    "TaskRegistry",
    "TaskStatus",
    "iso8601",
    "new_task_id",
]

log = logging.getLogger("luftpause.runtime.mcp.tasks")

POLL_INTERVAL_MS = 1000
"""The ``pollIntervalMs`` suggested to clients: a run's turns take seconds, so polling faster
learns nothing sooner."""

DEFAULT_RETENTION_SECONDS = 3600.0
"""How long an ended task is kept (seconds), as long as a finished run is."""

DEFAULT_MAX_ENDED = 10_000
"""Most ended tasks kept; past it the oldest ended are dropped first."""

WATCH_SECONDS = 3600.0
"""Longest single wait of a task's watcher (a wait needs a finite bound; it just waits again)."""

FOUND_TASKS = 10_000
"""Most task ids whose run :meth:`TaskRegistry.locate` remembers (a task's run never changes)."""


class TaskRegistry:
    """Every task of this runtime, its journal, and a watcher per open task.

    Use as an async context manager inside the server's lifespan, after the run registry is
    entered (so that it is left before the runs are stopped: a task open at shutdown stays open in
    the journal and is failed on the next start). ``render_result`` turns ``run``'s answer
    (``{"runs": [...], "timedOut": false}``) into its CallToolResult exactly as the SDK does for the
    tool (:func:`luftpause.runtime.mcp.spawn_tools.render_run_result`).
    """

    def __init__(
        self,
        journal: RecordStore | Path,
        runs: RunRegistry,
        approvals: Approvals,
        render_result: Callable[[dict[str, Any]], CallToolResult | InputRequiredResult],
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        max_ended: int = DEFAULT_MAX_ENDED,
        shared: SharedTaskRecords | None = None,
    ) -> None:
        self.journal = TaskJournal(journal) if isinstance(journal, Path) else journal
        self.shared = shared
        self.runs = runs
        self.approvals = approvals
        self.retention_seconds = retention_seconds
        self.max_ended = max_ended
        self.render_result = render_result
        self._tasks: dict[str, Task] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._found: dict[str, str] = {}
        self._adopting: set[asyncio.Task[None]] = set()
        runs.on_takeover(self._runs_moved)

    async def __aenter__(self) -> TaskRegistry:
        had_records = self._replay()
        self.journal.open(snapshot=self.snapshot)
        elsewhere = 0
        for task in list(self._tasks.values()):
            if task.ended:
                continue
            if self.shared is not None and self.runs.find(task.handle) is None:
                # Its run moved to another runtime while this one was down: that one adopts the
                # task, from these records, which the compaction below would delete.
                self._forget(task)
                elsewhere += 1
                continue
            message = (
                f"the luftpause runtime restarted while this task was open; its run {task.handle} "
                f"resumed and goes on: await {task.handle} for its answer"
            )
            self._end(task, "failed", message, error={"code": INTERNAL_ERROR, "message": message})
        if had_records and not elsewhere:
            self.journal.compact_later(self.snapshot())
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        if self.shared is not None:  # runs taken over from a dead runtime as this one started
            await self._adopt([run.handle for run in self.runs.all()])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        group, self._group = self._group, None
        for watcher in [*self._watchers.values(), *self._adopting]:
            watcher.cancel()
        try:
            if group is not None:
                await group.__aexit__(exc_type, exc, tb)
        finally:
            self.journal.close()

    # Creating and reading tasks.

    async def create(self, run: Run, *, elicits: bool) -> Task:
        """A new task for ``run`` (already started), journaled durably (written and fsynced, as
        SEP-2663 asks) before it is returned, and watched until the run ends. Raises
        ``RuntimeError`` outside the lifespan, :class:`~luftpause.runtime.runs.journal.JournalWriteError`
        when the task could not be journaled (it is then not kept)."""
        if self._group is None:
            raise RuntimeError("the task registry is not open (outside the server's lifespan)")
        now = time.time()
        task = Task(task_id=new_task_id(), handle=run.handle, created_at=now, updated_at=now, elicits=elicits)
        task.status_message = f"run {run.handle} started"
        self._evict()
        await self.journal.write(task.created_record())
        if self._group is None:
            raise RuntimeError("the task registry closed while the task was journaled")
        self._tasks[task.task_id] = task
        self._watchers[task.task_id] = self._group.create_task(self._watch(task, run), name=task.task_id)
        return task

    def get(self, task_id: str, tenant: Tenant | None = None) -> Task:
        """The task ``task_id``, its state brought up to date with its run. Raises ``MCPError``
        ``-32602`` for an unknown (or dropped) task, and for another ``tenant``'s (the same
        answer: task ids must not be probeable)."""
        self._evict()
        task = self._tasks.get(task_id)
        run = self.runs.find(task.handle) if task is not None else None
        if task is not None and tenant is not None and (run is None or not visible(run, tenant)):
            task = None
        if task is not None and not task.ended:
            self._observe(task)  # forgets it when its run moved to another runtime
        if task is None or task.task_id not in self._tasks:
            raise MCPError(
                INVALID_PARAMS,
                f"Failed to retrieve task: no task {task_id!r} (unknown, or ended more than "
                f"{self.retention_seconds:g} s ago and dropped)",
            )
        return task

    def held_here(self, task_id: str) -> bool:
        """Whether this runtime answers for the task ``task_id``: it holds the task, and its run
        unless the task ended (on a shared store an open task is served by the runtime holding
        its run; an ended one by whichever holds it, its run maybe dropped by retention)."""
        task = self._tasks.get(task_id)
        return task is not None and (task.ended or self.runs.find(task.handle) is not None)

    async def locate(self, task_id: str) -> str | None:
        """The run handle of the task ``task_id``: this runtime's, or on a shared store the one
        its record names, whichever runtime wrote it; ``None`` for no such task. Raises
        :class:`~luftpause.runtime.errors.StoreUnusable` when the store cannot be read."""
        task = self._tasks.get(task_id)
        if task is not None:
            return task.handle
        if self.shared is None or TASK_ID.fullmatch(task_id) is None:
            return None
        handle = self._found.get(task_id)
        if handle is None:
            handle = await asyncio.to_thread(self.shared.find_task, task_id)
            if handle is not None:
                if len(self._found) >= FOUND_TASKS:
                    self._found.pop(next(iter(self._found)))
                self._found[task_id] = handle
        return handle

    def describe(self, task: Task) -> dict[str, Any]:
        """The task on the wire (``Task`` with its status's fields: ``inputRequests``, ``result``
        or ``error``), as ``tasks/get`` answers it; see the module docstring."""
        out: dict[str, Any] = {
            "taskId": task.task_id,
            "status": task.status,
            "createdAt": iso8601(task.created_at),
            "lastUpdatedAt": iso8601(task.updated_at),
            "ttlMs": None,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if task.status_message is not None:
            out["statusMessage"] = task.status_message
        if task.ended and task.ended_at is not None:
            out["ttlMs"] = int((task.ended_at + self.retention_seconds - task.created_at) * 1000)
        if task.status == "input_required":
            out["inputRequests"] = self._input_requests(task)
        elif task.status == "completed":
            out["result"] = task.result
        elif task.status == "failed":
            out["error"] = task.error
        return out

    def update(self, task_id: str, responses: InputResponses, tenant: Tenant | None = None) -> int:
        """``tasks/update``: apply the answers to the task's outstanding approval questions (one
        input request each); returns how many were applied (others are ignored, as the spec
        says). Raises ``MCPError`` ``-32602`` for an unknown task."""
        task = self.get(task_id, tenant)
        if task.ended:
            return 0
        applied = 0
        for approval in self._outstanding(self._run_of(task)):
            answer = responses.get(f"{INPUT_KEY_PREFIX}{approval.id}")
            allow = allow_of(answer) if answer is not None else None
            if allow is not None and self.approvals.decide(approval, allow):
                applied += 1
        if applied:
            self._observe(task)
        return applied

    def cancel(self, task_id: str, tenant: Tenant | None = None) -> None:
        """``tasks/cancel``: cancel the task's run and its running descendants (as ``cancel``
        does); the task ends ``cancelled`` unless the run had already ended. Raises ``MCPError``
        ``-32602`` for an unknown task."""
        task = self.get(task_id, tenant)
        if task.ended:
            return
        task.cancel_requested = True
        try:
            self.runs.cancel(task.handle, reason=f"cancelled by tasks/cancel of {task.task_id}")
        except RuntimeFault:
            pass  # the run is gone; _observe below ends the task
        self._observe(task)

    # State.

    def _run_of(self, task: Task) -> Run | None:
        try:
            return self.runs.get(task.handle)
        except RuntimeFault:
            return None

    @staticmethod
    def _outstanding(run: Run | None) -> list[PendingApproval]:
        """The approvals ``run`` waits on, but those already answered: the run clears them only
        when it resumes, and an answered question must not be asked again meanwhile."""
        if run is None or run.done:
            return []
        return run.approvals.open()

    def _input_requests(self, task: Task) -> dict[str, Any]:
        return {
            f"{INPUT_KEY_PREFIX}{approval.id}": input_request(approval).model_dump(
                by_alias=True, mode="json", exclude_none=True
            )
            for approval in self._outstanding(self._run_of(task))
        }

    def _live(self, task: Task, run: Run) -> tuple[TaskStatus, str]:
        """The open task's status and message as its running ``run`` stands now."""
        pending = self._outstanding(run)
        if pending:
            tools = ", ".join(repr(a.tool) for a in pending)
            what = f"run {run.handle} waits for approval of {len(pending)} call(s): {tools}"
            if task.elicits:
                return "input_required", what
            return (
                "working",
                f"{what}: answer with the approve tool (your client did not declare form elicitation)",
            )
        return (
            "working",
            f"run {run.handle} is running: {run.costs.turns} turns, {run.costs.tool_calls} tool calls",
        )

    def _observe(self, task: Task) -> None:
        """Bring an open task up to date with its run: end it once the run ended, else follow
        ``working`` / ``input_required`` (stamping ``lastUpdatedAt`` when the status changes)."""
        if task.ended:
            return
        run = self._run_of(task)
        if run is None and self.shared is not None:  # taken over: its new runtime serves it
            self._forget(task)
            return
        if run is None:  # dropped while the task was open: only possible if a watcher died
            message = f"run {task.handle} is no longer held by the runtime"
            self._end(task, "failed", message, error={"code": INTERNAL_ERROR, "message": message})
            return
        if run.done:
            if run.interrupted:  # the runtime is stopping: the task stays open, failed on restart
                return
            if task.cancel_requested and run.state == "cancelled":
                self._end(task, "cancelled", run.error or "cancelled")
                return
            payload = {"runs": [self.runs.result(run)], "timedOut": False}
            self._end(task, "completed", f"run {run.handle} {run.state}", result=self._render(payload))
            return
        status, message = self._live(task, run)
        if status != task.status:
            task.updated_at = time.time()
        task.status, task.status_message = status, message

    def _render(self, payload: dict[str, Any]) -> dict[str, Any]:
        result = self.render_result(payload)
        if not isinstance(result, CallToolResult):  # run answers a dict, never an input request here
            raise TypeError(f"run's result rendered as {type(result).__name__}, not a CallToolResult")
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    def _end(
        self,
        task: Task,
        status: TaskStatus,
        message: str,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        now = time.time()
        task.status, task.status_message = status, message
        task.result, task.error = result, error
        task.updated_at = task.ended_at = now
        self.journal.append(task.end_record())

    async def _watch(self, task: Task, run: Run) -> None:
        """Follow ``run`` until it ends, so the task's end is journaled when it happens (not when
        someone next polls) and ``lastUpdatedAt`` is the time of each status change."""
        try:
            while not task.ended and not run.done and task.task_id in self._tasks:
                self._observe(task)
                await self.runs.wait(
                    [run], "all", WATCH_SECONDS, interrupt=lambda: self._live(task, run)[0] != task.status
                )
            self._observe(task)
        except Exception as exc:  # a fault here must fail this task, never the other watchers
            log.exception("task %s: its watcher failed", task.task_id)
            if not task.ended:
                message = f"internal error of the luftpause runtime following run {task.handle}: {exc!r}"
                self._end(task, "failed", message, error={"code": INTERNAL_ERROR, "message": message})
        finally:
            if self._watchers.get(task.task_id) is asyncio.current_task():
                del self._watchers[task.task_id]

    # Runs that move between runtimes sharing a store: their tasks follow them.

    def _forget(self, task: Task) -> None:
        """Let go of ``task`` without recording anything: another runtime serves it now."""
        self._tasks.pop(task.task_id, None)
        watcher = self._watchers.pop(task.task_id, None)
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()

    def _runs_moved(self, took: list[str], lost: list[str]) -> None:
        """The run registry's takeover listener: the tasks of runs ``lost`` are left to the
        runtime that took them; those of runs this runtime ``took`` are adopted."""
        if self.shared is None or self._group is None:
            return
        gone = set(lost)
        for task in [t for t in self._tasks.values() if t.handle in gone]:
            self._forget(task)
        if took:
            adopting = self._group.create_task(self._adopt(took), name="adopt tasks")
            self._adopting.add(adopting)
            adopting.add_done_callback(self._adopting.discard)

    async def _adopt(self, handles: list[str]) -> None:
        """Adopt the tasks of the runs ``handles`` (taken over from another runtime) that other
        runtimes recorded: rebuilt from their records, kept as they were (``elicits`` too), open
        ones followed to their run's end; their records written again under this runtime, then
        the other runtimes' removed (a crash in between leaves both: adopted again, once)."""
        shared = self.shared
        if shared is None or not handles:
            return
        try:
            records = await asyncio.to_thread(shared.records_of_others, handles)
        except StoreUnusable as exc:
            log.error("the tasks of %d runs taken over could not be read: %s", len(handles), exc)
            return
        found: dict[str, Task] = {}
        rebuild_tasks(records, found, self.journal.label)
        adopted = [task for task in found.values() if task.task_id not in self._tasks]
        writes = []
        for task in adopted:
            self._tasks[task.task_id] = task
            writes.append(self.journal.append(task.created_record()))
            if task.ended:
                writes.append(self.journal.append(task.end_record()))
            else:
                run = self._run_of(task)
                if run is not None and self._group is not None:
                    self._watchers[task.task_id] = self._group.create_task(
                        self._watch(task, run), name=task.task_id
                    )
                else:
                    self._observe(task)
        if adopted:
            log.warning("adopted %d tasks of runs taken over", len(adopted))
        try:
            for written in writes:
                await asyncio.wrap_future(written)
            if records:
                await asyncio.to_thread(shared.drop_others, handles)
        except (JournalWriteError, StoreUnusable) as exc:
            log.error("the adopted tasks' records are kept where they were: %s", exc)

    def _evict(self) -> None:
        """Drop ended tasks past their retention, then the oldest ended beyond the cap."""
        cutoff = time.time() - self.retention_seconds
        ended = sorted((t for t in self._tasks.values() if t.ended), key=lambda t: t.ended_at or 0.0)
        excess = len(ended) - self.max_ended
        for index, task in enumerate(ended):
            if (task.ended_at or 0.0) > cutoff and index >= excess:
                break
            del self._tasks[task.task_id]

    # The journal.

    def snapshot(self) -> Iterator[Record]:
        """Records that rebuild every held task (compaction)."""
        for task in list(self._tasks.values()):
            yield task.created_record()
            if task.ended:
                yield task.end_record()

    def _replay(self) -> bool:
        """Rebuild the tasks of ``tasks.jsonl``; whether it held any record."""
        seen = rebuild_tasks(self.journal.records(), self._tasks, self.journal.label)
        self._evict()
        return seen
