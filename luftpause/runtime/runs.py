"""Run records and the registry that owns every run's task.

A *run* is one sub-agent: its task, its conversation, its counters and, once finished, its answer
or error. Its state moves one way only::

    running ──▶ completed   the model answered without calling a tool
            ├─▶ failed      a turn failed (dataplane error, bad reply) or the loop broke
            └─▶ cancelled   ``cancel`` on it or an ancestor, or a budget of its subtree ran out

Pods (DESIGN.md "Pods", :mod:`luftpause.runtime.pods`): a finished run is not closed for good. A
``message`` record (``send``) re-opens a completed or failed run (``running`` again, its answer
kept in its conversation, the message a new user turn) or, while it runs, waits in its
``inbox`` for its next turn; ``stop`` (a ``stop`` record) lets the current turn finish and then
ends it as ``cancelled`` with ``stopped by ...``. :attr:`Run.pod_state` is the three-state view
pods use: ``running``, ``idle`` (completed or failed, takes ``send``), ``stopped`` (cancelled or
stopped, takes nothing more).

A running run whose next tool call waits for a person (:mod:`luftpause.runtime.approvals`) is
reported as ``AwaitingApproval`` with ``pendingApproval {tool, arguments}``; it is still running.

Runs form trees: ``spawn(parent=handle)`` makes a child. Cancelling a run cancels its running
descendants. A run may carry budgets (tokens = prompt + completion, tool calls, seconds since it
started) that bound it and all its descendants, children spawned later included; they are checked
before and after every turn and after every tool round, and the seconds by a timer; on excess the
whole subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.

With a :class:`~luftpause.runtime.journal.Journal` the registry records every run's start, tool
rounds and end, and :meth:`RunRegistry.replay` rebuilds the runs after a restart. A run the
runtime's shutdown interrupts is not recorded as ended: it resumes on the next start.

The :class:`RunRegistry` owns the asyncio task of every run in a task group entered in the
server's lifespan, never in the MCP request that spawned it: a run outlives the ``spawn`` call,
the client's session and a client crash. Waiting (``await``) is answered from the records.

The registry is bounded: a finished run (completed, failed, cancelled) is kept for a retention time
after it ends (default one hour) and at most a cap of finished runs is kept (default 10,000, the
oldest finished dropped first). A running run is never dropped. A dropped run's handle is
remembered (a bounded number of them) so ``await`` / ``status`` can say it expired rather than
that it never existed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from luftpause.runtime.budgets import all_subtree_counters, budget_used, first_exceeded, subtree
from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.journal import Journal

log = logging.getLogger("luftpause.runtime.runs")

RunState = Literal["running", "completed", "failed", "cancelled"]
ServiceClass = Literal["interactive", "batch"]
WaitMode = Literal["all", "any"]

# How often a long ``await`` tells its caller it is still waiting (seconds). Claude Code resets
# its idle timeout on progress; a few seconds keeps every reasonable client waiting.
PROGRESS_INTERVAL_SECONDS = 5.0

DEFAULT_RETENTION_SECONDS = 3600.0
"""How long a finished run stays in the registry after it ended (seconds)."""

DEFAULT_MAX_FINISHED = 10_000
"""Most finished runs the registry keeps; past it the oldest finished are dropped first. A run
holds its whole conversation, so this caps the memory that finished runs can take."""

DEFAULT_MAX_EXPIRED_HANDLES = 100_000
"""Most dropped handles remembered to answer "expired" (about 100 bytes each); a handle dropped
longer ago than that is reported as unknown."""


TASK_SUMMARY_CHARS = 200
"""Characters of a run's task shown where many runs are listed (``GET /status``, ``status`` without
a handle): enough to recognise it, while a listing stays small however long the tasks are."""


def summarize(text: str, limit: int = TASK_SUMMARY_CHARS) -> str:
    """``text`` itself when it has at most ``limit`` characters, else its first ``limit``
    characters followed by ``…`` (U+2026); the full length goes beside it (``taskChars``)."""
    return text if len(text) <= limit else f"{text[:limit]}…"


def new_handle() -> str:
    """A fresh run handle, ``run-`` and 16 hex digits (64 random bits)."""
    return f"run-{secrets.token_hex(8)}"


COUNTER_KEYS = (
    "turns",
    "toolCalls",
    "failedToolCalls",
    "promptTokens",
    "completionTokens",
    "turnSeconds",
    "toolSeconds",
)
"""The cost counters of a run (and of a subtree), as ``GET /status`` and the journal name them:
turns, tool calls, failed tool calls, prompt and completion tokens, and the seconds spent in turns
(waiting for the dataplane, queue included) and in tool rounds."""

Counters = dict[str, float]

BUDGET_KEYS = ("tokens", "toolCalls", "seconds")
"""The budgets a run may set for its subtree, in the order they are checked."""


def add_counters(total: Counters, more: Counters) -> Counters:
    """``total`` with ``more`` added key by key (in place; returned for chaining)."""
    for key in COUNTER_KEYS:
        total[key] = total.get(key, 0) + more.get(key, 0)
    return total


def _rounded(counters: Counters) -> Counters:
    return {k: round(v, 3) if k.endswith("Seconds") else int(v) for k, v in counters.items()}


@dataclass(eq=False)
class Run:
    """One sub-agent run.

    ``messages`` is the OpenAI chat conversation so far (system?, user, then assistant and tool
    messages of each completed tool round). Counters: ``turns`` (LLM turns answered),
    ``tool_calls`` / ``failed_tool_calls`` (calls the model made; failed = refused, raised, or an
    MCP ``isError`` result), ``prompt_tokens`` / ``completion_tokens`` summed over the turns'
    ``usage``, ``turn_seconds`` / ``tool_seconds`` spent in turns and tool rounds. Times are
    ``time.time()`` seconds. ``parent`` and ``children`` are handles; ``budget_*`` bound the
    subtree rooted here (``None``: no bound).
    """

    handle: str
    task: str
    model: str
    service_class: ServiceClass
    caller: str
    max_tool_calls: int
    max_tokens: int
    allowed_tools: frozenset[str] | None
    messages: list[dict[str, Any]]
    system: str | None = None
    parallel_tool_calls: bool = False
    """The model may ask for several tool calls in one reply, run concurrently (loop.py)."""
    parent: str | None = None
    budget_tokens: int | None = None
    budget_tool_calls: int | None = None
    budget_seconds: float | None = None
    approve_tools: frozenset[str] = frozenset()
    """Tools that wait for a person's approval in this run, whatever their annotations."""
    decisions: dict[str, bool] = field(default_factory=dict)
    """Approval decisions by call key (:func:`luftpause.runtime.approvals.call_key`), journaled."""
    pending_approval: Any = None
    """The :class:`~luftpause.runtime.approvals.PendingApproval` the run waits on, if any."""
    children: list[str] = field(default_factory=list)
    state: RunState = "running"
    answer: str | None = None
    error: str | None = None
    exceeded: str | None = None
    """``budget exceeded: <which> <used>/<limit>`` once one of this run's own budgets ran out."""
    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0
    tool_seconds: float = 0.0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    resumed: bool = False
    """Rebuilt from the journal after a restart (and, if running, resumed)."""
    interrupted: bool = False
    """Set when the runtime shuts down under a running run: it did not end, it was stopped."""
    name: str | None = None
    """The name its spawner gave it (unique among the spawner's live children), if any."""
    orchestrate: bool = False
    """Offered the orchestration tools (spawn, send, read, stop, list) in its turns."""
    stopped_by: str | None = None
    """Who asked for a graceful stop (``stop``), once someone did: no new turn starts."""
    inbox: list[dict[str, Any]] = field(default_factory=list)
    """Messages sent while it ran, ``{"id", "content", "from"}``, for its next turn."""
    _on_finish: Callable[[Run], None] | None = field(default=None, repr=False)
    _on_round: Callable[[Run, list[dict[str, Any]], dict[str, Any]], None] | None = field(
        default=None, repr=False
    )
    _on_progress: Callable[[Run], None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.state != "running"

    @property
    def pod_state(self) -> Literal["running", "idle", "stopped"]:
        """``running``; ``idle`` once completed or failed (``send`` continues it); ``stopped``
        once cancelled or stopped (it takes nothing more)."""
        if self.state == "running":
            return "running"
        return "stopped" if self.state == "cancelled" or self.stopped_by is not None else "idle"

    @property
    def display_state(self) -> str:
        """:attr:`state`, or ``AwaitingApproval`` for a running run that waits for a person."""
        return "AwaitingApproval" if self.pending_approval is not None and not self.done else self.state

    @property
    def seconds(self) -> float:
        """Run time so far, or in total once finished (seconds)."""
        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

    @property
    def limits(self) -> dict[str, float]:
        """The budgets this run sets for its subtree, by :data:`BUDGET_KEYS` name (only those set)."""
        values = {
            "tokens": self.budget_tokens,
            "toolCalls": self.budget_tool_calls,
            "seconds": self.budget_seconds,
        }
        return {k: v for k, v in values.items() if v is not None}

    def counters(self) -> Counters:
        """This run's own costs, keyed by :data:`COUNTER_KEYS`."""
        return {
            "turns": self.turns,
            "toolCalls": self.tool_calls,
            "failedToolCalls": self.failed_tool_calls,
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "turnSeconds": self.turn_seconds,
            "toolSeconds": self.tool_seconds,
        }

    def set_counters(self, counters: Counters) -> None:
        """Take the counters of a journal record (missing keys stay as they are)."""
        self.turns = int(counters.get("turns", self.turns))
        self.tool_calls = int(counters.get("toolCalls", self.tool_calls))
        self.failed_tool_calls = int(counters.get("failedToolCalls", self.failed_tool_calls))
        self.prompt_tokens = int(counters.get("promptTokens", self.prompt_tokens))
        self.completion_tokens = int(counters.get("completionTokens", self.completion_tokens))
        self.turn_seconds = float(counters.get("turnSeconds", self.turn_seconds))
        self.tool_seconds = float(counters.get("toolSeconds", self.tool_seconds))

    def finish(self, state: RunState, *, answer: str | None = None, error: str | None = None) -> None:
        """Move to a final state once; later calls are ignored (the first outcome stands)."""
        if self.done:
            return
        if state == "running":
            raise ValueError("finish() needs a final state")
        self.state = state
        self.answer = answer
        self.error = error
        self.finished_at = time.time()
        _keep_answer(self)
        if self._on_finish is not None:
            self._on_finish(self)

    def complete_round(self, round_messages: list[dict[str, Any]], **extra: Any) -> None:
        """Append a completed tool round (the assistant message and its tool messages) to the
        conversation; it is journaled, with the counters as they stand now, as the point a
        resumed run restarts from. ``extra`` goes into the ``round`` record as it is (pods put
        the ids of the messages and events a round delivered there, so delivery and conversation
        are one record)."""
        self.messages.extend(round_messages)
        if self._on_round is not None:
            self._on_round(self, round_messages, extra)

    def reopen(self, message: dict[str, Any]) -> None:
        """A finished (completed or failed) run takes ``message`` (a ``user`` message) as a new
        turn: ``running`` again. The caller starts its loop."""
        if self.pod_state != "idle":
            raise ValueError(f"run {self.handle} is {self.pod_state}, not idle")
        self.state = "running"
        self.answer = self.error = None
        self.finished_at = None
        self.messages.append(message)

    def check_budgets(self) -> None:
        """Check the budgets of this run and its ancestors now (after a turn or a tool round);
        one that ran out cancels its subtree, this run included."""
        if self._on_progress is not None:
            self._on_progress(self)

    def result(self) -> dict[str, Any]:
        """The run as ``await`` reports it (MCP tool result, camelCase)::

        {"handle", "state", "podState": running|idle|stopped, "answer"? (completed),
         "error"? (failed, cancelled),
         "pendingApproval"?: {"tool", "arguments"} (state "AwaitingApproval"),
         "toolCalls", "failedToolCalls", "turns", "seconds",
         "usage": {"promptTokens", "completionTokens"}}

        The registry adds ``limits``, ``used`` and ``exceeded`` for a run with budgets
        (:meth:`RunRegistry.result`).
        """
        out: dict[str, Any] = {"handle": self.handle, "state": self.display_state, "podState": self.pod_state}
        if self.pending_approval is not None and not self.done:
            out["pendingApproval"] = {
                "tool": self.pending_approval.tool,
                "arguments": self.pending_approval.arguments,
            }
        if self.answer is not None:
            out["answer"] = self.answer
        if self.error is not None:
            out["error"] = self.error
        out.update(
            toolCalls=self.tool_calls,
            failedToolCalls=self.failed_tool_calls,
            turns=self.turns,
            seconds=round(self.seconds, 3),
            usage={"promptTokens": self.prompt_tokens, "completionTokens": self.completion_tokens},
        )
        return out

    def status(self, *, full_task: bool = False) -> dict[str, Any]:
        """:meth:`result` plus what the run was asked: ``model``, ``serviceClass``, ``caller``,
        ``task``, ``taskChars``, ``maxToolCalls``, ``startedAt`` (Unix seconds), ``parent`` and
        ``children`` (handles).

        ``task`` is the whole task with ``full_task``, else its :func:`summarize` summary (the
        first 200 characters and ``…``), so that listings of many runs stay small; ``taskChars``
        is always the whole task's length in characters.
        """
        return {
            **self.result(),
            "model": self.model,
            "serviceClass": self.service_class,
            "caller": self.caller,
            "task": self.task if full_task else summarize(self.task),
            "taskChars": len(self.task),
            "maxToolCalls": self.max_tool_calls,
            "startedAt": round(self.started_at, 3),
            "parent": self.parent,
            "children": list(self.children),
        }

    # The journal's records of this run (shapes: :mod:`luftpause.runtime.journal`).

    def start_record(self) -> dict[str, Any]:
        """Every spawn argument, so that a restart can rebuild the run."""
        return {
            "type": "start",
            "handle": self.handle,
            "at": self.started_at,
            "task": self.task,
            "system": self.system,
            "model": self.model,
            "serviceClass": self.service_class,
            "caller": self.caller,
            "maxToolCalls": self.max_tool_calls,
            "maxTokens": self.max_tokens,
            "parallelToolCalls": self.parallel_tool_calls,
            "tools": sorted(self.allowed_tools) if self.allowed_tools is not None else None,
            "parent": self.parent,
            "budgetTokens": self.budget_tokens,
            "budgetToolCalls": self.budget_tool_calls,
            "budgetSeconds": self.budget_seconds,
            "approveTools": sorted(self.approve_tools),
            "name": self.name,
            "orchestrate": self.orchestrate,
        }

    def outcome_record(self) -> dict[str, Any]:
        """How the run ended (``state``, ``answer``?, ``error``?, ``exceeded``?, ``finishedAt``,
        ``counters``); the ``end`` record, and with :meth:`start_record` a compacted ``run``."""
        out: dict[str, Any] = {
            "state": self.state,
            "finishedAt": self.finished_at,
            "counters": self.counters(),
        }
        pairs = (
            ("answer", self.answer),
            ("error", self.error),
            ("exceeded", self.exceeded),
            ("stoppedBy", self.stopped_by),
        )
        for key, value in pairs:
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_start_record(cls, record: dict[str, Any]) -> Run:
        """The run a ``start`` (or compacted ``run``) record describes, at its first turn.
        Raises ``KeyError`` / ``TypeError`` / ``ValueError`` for a record missing what a run needs."""
        task = str(record["task"])
        system = record.get("system")
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": task})
        tools = record.get("tools")
        service_class = record.get("serviceClass")
        return cls(
            handle=str(record["handle"]),
            task=task,
            model=str(record["model"]),
            service_class="batch" if service_class == "batch" else "interactive",
            caller=str(record.get("caller") or "anonymous"),
            max_tool_calls=int(record["maxToolCalls"]),
            max_tokens=int(record["maxTokens"]),
            parallel_tool_calls=bool(record.get("parallelToolCalls", False)),
            allowed_tools=frozenset(map(str, tools)) if tools is not None else None,
            messages=messages,
            system=system if isinstance(system, str) else None,
            parent=record.get("parent") if isinstance(record.get("parent"), str) else None,
            budget_tokens=_optional_int(record.get("budgetTokens")),
            budget_tool_calls=_optional_int(record.get("budgetToolCalls")),
            budget_seconds=_optional_float(record.get("budgetSeconds")),
            approve_tools=frozenset(map(str, record.get("approveTools") or ())),
            started_at=float(record["at"]),
            name=record.get("name") if isinstance(record.get("name"), str) else None,
            orchestrate=bool(record.get("orchestrate", False)),
            resumed=True,
        )


def _keep_answer(run: Run) -> None:
    """A completed run's answer is the last message of its conversation, so that a ``send``
    continues from it and ``read`` shows it (not appended twice on replay)."""
    if run.state != "completed" or run.answer is None:
        return
    last = run.messages[-1] if run.messages else {}
    said = last.get("role") == "assistant" and not last.get("tool_calls")
    if not (said and last.get("content") == run.answer):
        run.messages.append({"role": "assistant", "content": run.answer})


def _optional_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _optional_float(value: Any) -> float | None:
    return float(value) if value is not None else None


class RunRegistry:
    """Every run of this server, by handle, and the task group that owns their tasks.

    Use as an async context manager inside the server's lifespan. Entering it with a ``journal``
    replays the journal (:meth:`resume` then starts the unfinished runs). Leaving it cancels the
    runs that are still going (marking them ``interrupted`` and listing them in
    :attr:`interrupted`; with a journal they are not recorded as ended, so they resume on the next
    start) and waits for their tasks to end.

    Finished runs are dropped ``retention_seconds`` after they end and beyond ``max_finished`` of
    them (oldest finished first); running runs never. Dropping is done lazily, whenever the
    registry is used (a run added, finished or looked up), so no timer is needed and memory stays
    bounded by the cap between uses. A dropped run no longer counts toward its ancestors' subtree
    totals and budgets. ``clock`` gives the time in seconds that retention is measured in
    (monotonic by default; a test passes its own).
    """

    def __init__(
        self,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        max_finished: int = DEFAULT_MAX_FINISHED,
        max_expired_handles: int = DEFAULT_MAX_EXPIRED_HANDLES,
        clock: Callable[[], float] = time.monotonic,
        journal: Journal | None = None,
    ) -> None:
        if not (math.isfinite(retention_seconds) and retention_seconds >= 0):
            raise ValueError(f"retention_seconds must be finite and >= 0, got {retention_seconds!r}")
        if max_finished < 1 or max_expired_handles < 0:
            raise ValueError("max_finished must be >= 1 and max_expired_handles >= 0")
        self.retention_seconds = retention_seconds
        self.max_finished = max_finished
        self.max_expired_handles = max_expired_handles
        self.journal = journal
        self._clock = clock
        self._runs: dict[str, Run] = {}
        # Finished runs' handles -> when they ended (on ``clock``), in the order they ended, so the
        # oldest finished is always first.
        self._ended_at: dict[str, float] = {}
        # Handles dropped from the registry, oldest first (a dict used as an ordered set).
        self._expired: dict[str, None] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        # The counters of each running run at its last completed tool round: what a compaction
        # writes, so that a turn in flight is not counted twice after a crash.
        self._checkpoints: dict[str, Counters] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._to_resume: list[Run] = []
        # Runs that leaving the registry cancelled before they finished, in start order; a list of
        # its own because eviction may drop them from ``_runs`` before the server ends them.
        self.interrupted: list[Run] = []
        # Pods (luftpause.runtime.pods) listen here: every finish (not replayed ones), every
        # dropped handle, every journal record replayed (theirs included: ``foreign_records``
        # names the types this registry leaves to them), and add records to a compaction.
        self.on_finish: list[Callable[[Run], None]] = []
        self.on_evict: list[Callable[[str], None]] = []
        self.on_replay: list[Callable[[dict[str, Any]], None]] = []
        self.foreign_records: set[str] = set()
        self.extra_snapshot: list[Callable[[], Iterable[dict[str, Any]]]] = []
        # Replaced on every finish: a waiter takes the current one, re-checks, then waits on it,
        # so a finish between its check and its wait is never missed.
        self._changed = asyncio.Event()

    async def __aenter__(self) -> RunRegistry:
        if self.journal is not None:
            self._to_resume = self._replay(self.journal)
            self.journal.snapshot = self.journal_snapshot
            self.journal.open()
            if self.journal.size > self.journal.compact_bytes:
                self.journal.compact(self.journal_snapshot())
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        group, self._group = self._group, None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for handle, task in self._tasks.items():
            run = self._runs[handle]
            if not run.done:  # a finished run still ending itself at the dataplane was not stopped
                run.interrupted = True
                self.interrupted.append(run)
            task.cancel()
        for run in self._to_resume:  # replayed, never started: still resumable
            run.interrupted = True
        try:
            if group is not None:
                await group.__aexit__(exc_type, exc, tb)
        finally:
            if self.journal is not None:
                self.journal.close()

    @property
    def unresumable_interrupted(self) -> list[Run]:
        """The runs the shutdown interrupted that no restart will resume (all of them without a
        journal, none with one): the server ends these at the dataplane."""
        return [] if self.journal is not None else list(self.interrupted)

    def _hook(self, run: Run) -> None:
        run._on_finish = self._finished
        run._on_round = self._round
        run._on_progress = self._check_budgets

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started), link it under its parent and journal its start."""
        self.evict_expired()
        self._hook(run)
        self._runs[run.handle] = run
        parent = self._runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
        if self.journal is not None:
            self.journal.append(run.start_record())
        return run

    def start(self, run: Run, body: Coroutine[Any, Any, None]) -> None:
        """Run ``body`` (the run's loop) as a task owned by this registry, not by the caller.

        ``body`` must record the outcome on ``run`` itself; if it raises, the run fails with the
        error text (so one broken run never takes the task group down). A run with a seconds
        budget gets a timer that cancels its subtree when the time is up.
        """
        if self._group is None:
            body.close()
            raise RuntimeError("the run registry is not open (outside the server's lifespan)")
        task = self._group.create_task(self._own(run, body), name=run.handle)
        self._tasks[run.handle] = task
        if run.budget_seconds is not None:
            delay = max(0.0, run.started_at + run.budget_seconds - time.time())
            # A hair late on purpose: the check compares elapsed wall time with the limit.
            self._timers[run.handle] = asyncio.get_running_loop().call_later(
                delay + 0.01, self._seconds_up, run
            )

        def settled(_: asyncio.Task[None]) -> None:
            # A task cancelled before its first step (the runtime stopping right after a spawn)
            # never enters ``_own``: close its body so it is not left unawaited, and record the run
            # as cancelled rather than running for ever.
            body.close()
            self._tasks.pop(run.handle, None)
            if not run.done:
                run.finish("cancelled", error="runtime shut down" if run.interrupted else "cancelled")

        task.add_done_callback(settled)

    def resume(self, drive: Callable[[Run], Coroutine[Any, Any, None]]) -> int:
        """Start the unfinished runs the journal held (``drive(run)`` is each one's loop), from
        their last completed tool round; returns how many."""
        runs, self._to_resume = self._to_resume, []
        for run in runs:
            self.start(run, drive(run))
        if runs:
            log.info("resumed %d unfinished runs from %s", len(runs), self.journal and self.journal.path)
        return len(runs)

    async def _own(self, run: Run, body: Coroutine[Any, Any, None]) -> None:
        try:
            await body
        except asyncio.CancelledError:
            run.finish("cancelled", error="runtime shut down" if run.interrupted else "cancelled")
            raise
        except Exception as exc:  # a bug in the loop must fail this run, not the server
            run.finish("failed", error=f"internal error: {exc!r}")
        finally:
            self._tasks.pop(run.handle, None)
            if not run.done:
                run.finish("failed", error="internal error: the run loop ended without an outcome")

    def notify_changed(self) -> None:
        """Wake every :meth:`wait` to look again (a run finished, or now waits for approval)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _finished(self, run: Run) -> None:
        self._checkpoints.pop(run.handle, None)
        if self.journal is not None and not run.interrupted:
            self.journal.append({"type": "end", "handle": run.handle, **run.outcome_record()})
        if self._runs.get(run.handle) is run:
            self._ended_at[run.handle] = self._clock()
            self.evict_expired()
        if not run.interrupted:  # a run the shutdown stopped resumes: not news
            for listener in self.on_finish:
                listener(run)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _round(self, run: Run, messages: list[dict[str, Any]], extra: dict[str, Any]) -> None:
        counters = run.counters()
        self._checkpoints[run.handle] = counters
        if self.journal is not None:
            self.journal.append(
                {"type": "round", "handle": run.handle, "messages": messages, "counters": counters, **extra}
            )
        self._check_budgets(run)

    # Pods: messages to a run and graceful stops (luftpause.runtime.pods decides who may).

    def deliver(self, run: Run, content: str, sender: str, message_id: str) -> bool:
        """Give ``run`` a user message (journaled first as a ``message`` record): an idle run is
        re-opened with it (``True``: the caller starts its loop again), a running one gets it in
        its inbox for its next turn (``False``). Raises ``ValueError`` for a stopped run."""
        if run.pod_state == "stopped":
            raise ValueError(f"run {run.handle} is stopped; it takes no messages")
        if self.journal is not None:
            self.journal.append(
                {
                    "type": "message",
                    "handle": run.handle,
                    "id": message_id,
                    "content": content,
                    "from": sender,
                }
            )
        return self._take_message(run, content, sender, message_id)

    def _take_message(self, run: Run, content: str, sender: str, message_id: str) -> bool:
        if run.done:
            run.reopen({"role": "user", "content": content})
            self._ended_at.pop(run.handle, None)
            return True
        run.inbox.append({"id": message_id, "content": content, "from": sender})
        return False

    def request_stop(self, run: Run, by: str) -> None:
        """Mark ``run`` to stop after its current turn (journaled); an idle run is stopped at
        once (its state stays as it finished). Does nothing to a stopped run."""
        if run.pod_state == "stopped":
            return
        run.stopped_by = by
        if self.journal is not None:
            self.journal.append({"type": "stop", "handle": run.handle, "by": by})
        if run.done:
            for listener in self.on_finish:
                listener(run)
        self.notify_changed()

    # Trees, cancel and budgets.

    def cancel(self, handle: str, reason: str = "cancelled") -> list[Run]:
        """Cancel the run ``handle`` and its running descendants with ``reason`` as their error;
        returns the runs this stopped (a finished run is left as it is, but its running
        descendants are cancelled). Raises :class:`UnknownRun` / :class:`ExpiredRun`."""
        return self._cancel_subtree(self.get(handle), reason)

    def _cancel_subtree(self, root: Run, reason: str) -> list[Run]:
        stopped = [run for run in subtree(root, self._runs) if not run.done]
        current = asyncio.current_task()
        for run in stopped:
            run.finish("cancelled", error=reason)
            task = self._tasks.get(run.handle)
            # A run that checks its own budget stops itself at its next step (loop.py).
            if task is not None and task is not current:
                task.cancel()
        return stopped

    def _check_budgets(self, run: Run) -> None:
        found = first_exceeded(run, self._runs, time.time())
        if found is not None:
            holder, message = found
            holder.exceeded = holder.exceeded or message
            self._cancel_subtree(holder, message)

    def _seconds_up(self, run: Run) -> None:
        self._timers.pop(run.handle, None)
        if any(not r.done for r in subtree(run, self._runs)):
            self._check_budgets(run)

    def budget_report(self, run: Run) -> dict[str, Any]:
        """``{"limits", "used", "exceeded"}`` for a run that sets budgets, else ``{}``."""
        if not run.limits:
            return {}
        used = budget_used(run, self._runs, run.finished_at if run.done and run.finished_at else time.time())
        return {"limits": run.limits, "used": used, "exceeded": run.exceeded}

    def result(self, run: Run) -> dict[str, Any]:
        """:meth:`Run.result` plus, for a run with budgets, :meth:`budget_report`."""
        return {**run.result(), **self.budget_report(run)}

    def status_of(self, run: Run, *, full_task: bool = False) -> dict[str, Any]:
        """:meth:`Run.status` plus, for a run with budgets, :meth:`budget_report`."""
        return {**run.status(full_task=full_task), **self.budget_report(run)}

    def of_caller(self, caller: str) -> list[Run]:
        """The runs ``caller`` spawned that are still held, oldest first."""
        return [run for run in self.all() if run.caller == caller]

    def tree(self) -> list[dict[str, Any]]:
        """Every held run with its own and subtree costs, oldest first (``GET /status``)::

        {"id", "state", "parent", "children": [ids], "task" (summary), "taskChars", "model",
         "serviceClass", "caller", "error"?, "own": {COUNTER_KEYS}, "subtree": {COUNTER_KEYS}}
        """
        runs = self.all()
        totals = all_subtree_counters(self._runs)
        out = []
        for run in runs:
            item: dict[str, Any] = {
                "id": run.handle,
                "state": run.display_state,
                "parent": run.parent,
                "children": [h for h in run.children if h in self._runs],
                "task": summarize(run.task),
                "taskChars": len(run.task),
                "model": run.model,
                "serviceClass": run.service_class,
                "caller": run.caller,
                "own": _rounded(run.counters()),
                "subtree": _rounded(totals[run.handle]),
            }
            if run.error is not None:
                item["error"] = run.error
            item.update(self.budget_report(run))
            out.append(item)
        return out

    # The journal.

    def journal_snapshot(self) -> Iterator[dict[str, Any]]:
        """Records that rebuild every held run: a finished run as one ``run`` record, a running
        run as its ``start`` and one ``round`` with all its completed rounds (compaction)."""
        for run in list(self._runs.values()):
            start = run.start_record()
            first = 2 if run.system else 1
            if run.done and not run.interrupted:
                compacted = {**start, "type": "run", **run.outcome_record()}
                if run.pod_state == "idle":  # ``send`` continues its whole conversation
                    compacted["messages"] = run.messages[first:]
                yield compacted
                continue
            yield start
            for key, allow in run.decisions.items():
                yield {"type": "approval", "handle": run.handle, "key": key, "allow": allow}
            for message in run.inbox:
                yield {"type": "message", "handle": run.handle, **message}
            if run.stopped_by is not None:
                yield {"type": "stop", "handle": run.handle, "by": run.stopped_by}
            if len(run.messages) > first:
                counters = self._checkpoints.get(run.handle, run.counters())
                yield {
                    "type": "round",
                    "handle": run.handle,
                    "messages": run.messages[first:],
                    "counters": counters,
                }
        for extra in self.extra_snapshot:
            yield from extra()

    def _replay(self, journal: Journal) -> list[Run]:
        """Rebuild the runs of ``journal``: finished ones into the registry as they ended, the
        unfinished ones (returned, in start order) at their last completed tool round. A record
        that does not fit (no start before it, a field missing) is skipped with a warning."""
        runs: dict[str, Run] = {}
        for record in journal.records():
            kind, handle = record.get("type"), record["handle"]
            try:
                for listener in self.on_replay:
                    listener(record)
                if kind in self.foreign_records:
                    continue
                if kind in ("start", "run"):
                    run = Run.from_start_record(record)
                    if kind == "run":
                        messages = record.get("messages") or []
                        if not isinstance(messages, list):
                            raise TypeError("messages is not a list")
                        run.messages.extend(messages)
                        _apply_outcome(run, record)
                    runs[handle] = run
                    continue
                run = runs[handle]
                if kind == "message":
                    if run.pod_state != "stopped":
                        content, sender = str(record["content"]), str(record.get("from") or "")
                        self._take_message(run, content, sender, str(record["id"]))
                    continue
                if kind == "stop":
                    run.stopped_by = str(record.get("by") or "someone")
                    continue
                if run.done:
                    continue
                if kind == "round":
                    messages = record["messages"]
                    if not isinstance(messages, list):
                        raise TypeError("messages is not a list")
                    run.messages.extend(messages)
                    run.set_counters(record["counters"])
                    self._checkpoints[handle] = run.counters()
                    delivered = set(record.get("delivered") or ())
                    if delivered:
                        run.inbox = [m for m in run.inbox if m["id"] not in delivered]
                elif kind == "end":
                    _apply_outcome(run, record)
                elif kind == "approval":
                    run.decisions[str(record["key"])] = bool(record["allow"])
                else:
                    raise ValueError(f"unknown record type {kind!r}")
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("journal %s: a %s record of %s skipped: %r", journal.path, kind, handle, exc)
        for run in runs.values():
            parent = runs.get(run.parent) if run.parent is not None else None
            if parent is not None:
                parent.children.append(run.handle)
        now_wall, now = time.time(), self._clock()
        for run in runs.values():
            self._hook(run)
            self._runs[run.handle] = run
        for run in sorted((r for r in runs.values() if r.done), key=lambda r: r.finished_at or 0.0):
            self._ended_at[run.handle] = now - max(0.0, now_wall - (run.finished_at or now_wall))
        self.evict_expired()
        unfinished = [run for run in runs.values() if not run.done]
        if runs:
            log.info(
                "journal %s: %d runs, %d finished, %d to resume",
                journal.path,
                len(runs),
                len(runs) - len(unfinished),
                len(unfinished),
            )
        return unfinished

    def evict_expired(self) -> int:
        """Drop the finished runs whose retention time has passed, then the oldest finished ones
        beyond ``max_finished``; returns how many were dropped. Running runs are never dropped."""
        cutoff = self._clock() - self.retention_seconds
        dropped = 0
        while self._ended_at:
            handle, ended = next(iter(self._ended_at.items()))
            if ended > cutoff and len(self._ended_at) <= self.max_finished:
                break
            del self._ended_at[handle]
            self._runs.pop(handle, None)
            self._expired[handle] = None
            dropped += 1
            for listener in self.on_evict:
                listener(handle)
        while len(self._expired) > self.max_expired_handles:
            del self._expired[next(iter(self._expired))]
        return dropped

    def _missing(self, handle: str) -> ExpiredRun | UnknownRun:
        if handle in self._expired:
            return ExpiredRun(handle, self.retention_seconds, self.max_finished)
        return UnknownRun(handle)

    def get(self, handle: str) -> Run:
        """The run with ``handle``; raises :class:`ExpiredRun` for a finished run that was dropped,
        :class:`UnknownRun` for a handle this registry never had (or dropped too long ago)."""
        self.evict_expired()
        try:
            return self._runs[handle]
        except KeyError:
            raise self._missing(handle) from None

    def lookup(self, handles: Iterable[str]) -> list[Run]:
        """The runs for ``handles`` in order. Raises :class:`UnknownRun` naming every unknown
        handle, else :class:`ExpiredRun` for the first dropped one."""
        self.evict_expired()
        handles = list(handles)
        missing = [h for h in handles if h not in self._runs]
        unknown = [h for h in missing if h not in self._expired]
        if unknown:
            raise UnknownRun(", ".join(unknown)) if len(unknown) > 1 else UnknownRun(unknown[0])
        if missing:
            raise self._missing(missing[0])
        return [self._runs[h] for h in handles]

    def all(self) -> list[Run]:
        """Every run still held (running, or finished within retention), oldest first."""
        self.evict_expired()
        return list(self._runs.values())

    async def wait(
        self,
        runs: list[Run],
        mode: WaitMode,
        seconds: float,
        on_progress: Callable[[float, int], Awaitable[None]] | None = None,
        progress_interval: float = PROGRESS_INTERVAL_SECONDS,
        interrupt: Callable[[], bool] | None = None,
    ) -> bool:
        """Wait until all (``mode="all"``) or any (``"any"``) of ``runs`` are done.

        Waits at most ``seconds``. While waiting, ``on_progress(elapsed_seconds, finished_count)``
        is awaited every ``progress_interval`` seconds. Returns ``True`` when the timeout passed
        first (the caller reports ``timedOut``), ``False`` when the condition holds. Raises
        ``ValueError`` for a non-finite ``seconds`` (NaN would otherwise end the wait at once).
        ``interrupt()``, checked whenever something changed (:meth:`notify_changed`), ends the
        wait early (returning ``False``) when it returns true: the caller has something to do.
        """
        if not math.isfinite(seconds):
            raise ValueError(f"a wait needs a finite number of seconds, got {seconds!r}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + max(0.0, seconds)
        next_progress = start + progress_interval
        while True:
            changed = self._changed
            finished = sum(1 for run in runs if run.done)
            if (finished == len(runs)) if mode == "all" else (finished > 0 or not runs):
                return False
            if interrupt is not None and interrupt():
                return False
            now = loop.time()
            if now >= deadline:
                return True
            if on_progress is not None and now >= next_progress:
                await on_progress(now - start, finished)
                next_progress = now + progress_interval
                continue
            wake_at = min(deadline, next_progress) if on_progress is not None else deadline
            try:
                await asyncio.wait_for(changed.wait(), wake_at - now)
            except TimeoutError:
                pass


def _apply_outcome(run: Run, record: dict[str, Any]) -> None:
    """Put a journaled outcome (``end`` or compacted ``run`` record) on a replayed run, without
    the finish hooks (it is not news)."""
    state = record["state"]
    if state not in ("completed", "failed", "cancelled"):
        raise ValueError(f"not a final state: {state!r}")
    run.set_counters(record.get("counters") or {})
    run.state = state
    run.answer = record.get("answer")
    run.error = record.get("error")
    run.exceeded = record.get("exceeded")
    if record.get("stoppedBy") is not None:
        run.stopped_by = str(record["stoppedBy"])
    _keep_answer(run)
    finished_at = record.get("finishedAt")
    run.finished_at = float(finished_at) if finished_at is not None else time.time()
