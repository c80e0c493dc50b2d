"""Run records and the registry that owns every run's task.

A *run* is one sub-agent: its task, its conversation, its counters and, once finished, its answer
or error. Its state moves one way only::

    running ──▶ completed   the model answered without calling a tool
            ├─▶ failed      a turn failed (dataplane error, bad reply) or the loop broke
            └─▶ cancelled   its task was cancelled (today only by the runtime shutting down)

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
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from luftpause.runtime.errors import ExpiredRun, UnknownRun

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


@dataclass(eq=False)
class Run:
    """One sub-agent run.

    ``messages`` is the OpenAI chat conversation so far (system?, user, then assistant and tool
    messages of each completed tool round). Counters: ``turns`` (LLM turns answered),
    ``tool_calls`` / ``failed_tool_calls`` (calls the model made; failed = refused, raised, or an
    MCP ``isError`` result), ``prompt_tokens`` / ``completion_tokens`` summed over the turns'
    ``usage``. Times are ``time.time()`` seconds.
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
    state: RunState = "running"
    answer: str | None = None
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    interrupted: bool = False
    """Set when the runtime shuts down under a running run: it did not end, it was stopped."""
    _on_finish: Callable[[Run], None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.state != "running"

    @property
    def seconds(self) -> float:
        """Run time so far, or in total once finished (seconds)."""
        end = self.finished_at if self.finished_at is not None else time.time()
        return max(0.0, end - self.started_at)

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
        if self._on_finish is not None:
            self._on_finish(self)

    def result(self) -> dict[str, Any]:
        """The run as ``await`` reports it (MCP tool result, camelCase)::

        {"handle", "state", "answer"? (completed), "error"? (failed, cancelled),
         "toolCalls", "failedToolCalls", "turns", "seconds",
         "usage": {"promptTokens", "completionTokens"}}
        """
        out: dict[str, Any] = {"handle": self.handle, "state": self.state}
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
        ``task``, ``taskChars``, ``maxToolCalls``, ``startedAt`` (Unix seconds).

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
        }


class RunRegistry:
    """Every run of this server, by handle, and the task group that owns their tasks.

    Use as an async context manager inside the server's lifespan. Leaving it cancels the runs that
    are still going (marking them ``interrupted`` and listing them in :attr:`interrupted`) and
    waits for their tasks to end.

    Finished runs are dropped ``retention_seconds`` after they end and beyond ``max_finished`` of
    them (oldest finished first); running runs never. Dropping is done lazily, whenever the
    registry is used (a run added, finished or looked up), so no timer is needed and memory stays
    bounded by the cap between uses. ``clock`` gives the time in seconds that retention is measured
    in (monotonic by default; a test passes its own).
    """

    def __init__(
        self,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        max_finished: int = DEFAULT_MAX_FINISHED,
        max_expired_handles: int = DEFAULT_MAX_EXPIRED_HANDLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(retention_seconds) and retention_seconds >= 0):
            raise ValueError(f"retention_seconds must be finite and >= 0, got {retention_seconds!r}")
        if max_finished < 1 or max_expired_handles < 0:
            raise ValueError("max_finished must be >= 1 and max_expired_handles >= 0")
        self.retention_seconds = retention_seconds
        self.max_finished = max_finished
        self.max_expired_handles = max_expired_handles
        self._clock = clock
        self._runs: dict[str, Run] = {}
        # Finished runs' handles -> when they ended (on ``clock``), in the order they ended, so the
        # oldest finished is always first.
        self._ended_at: dict[str, float] = {}
        # Handles dropped from the registry, oldest first (a dict used as an ordered set).
        self._expired: dict[str, None] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        # Runs that leaving the registry cancelled before they finished, in start order; a list of
        # its own because eviction may drop them from ``_runs`` before the server ends them.
        self.interrupted: list[Run] = []
        # Replaced on every finish: a waiter takes the current one, re-checks, then waits on it,
        # so a finish between its check and its wait is never missed.
        self._changed = asyncio.Event()

    async def __aenter__(self) -> RunRegistry:
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
        for handle, task in self._tasks.items():
            run = self._runs[handle]
            if not run.done:  # a finished run still ending itself at the dataplane was not stopped
                run.interrupted = True
                self.interrupted.append(run)
            task.cancel()
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started)."""
        self.evict_expired()
        run._on_finish = self._finished
        self._runs[run.handle] = run
        return run

    def start(self, run: Run, body: Coroutine[Any, Any, None]) -> None:
        """Run ``body`` (the run's loop) as a task owned by this registry, not by the caller.

        ``body`` must record the outcome on ``run`` itself; if it raises, the run fails with the
        error text (so one broken run never takes the task group down).
        """
        if self._group is None:
            body.close()
            raise RuntimeError("the run registry is not open (outside the server's lifespan)")
        task = self._group.create_task(self._own(run, body), name=run.handle)
        self._tasks[run.handle] = task

        def settled(_: asyncio.Task[None]) -> None:
            # A task cancelled before its first step (the runtime stopping right after a spawn)
            # never enters ``_own``: close its body so it is not left unawaited, and record the run
            # as cancelled rather than running for ever.
            body.close()
            self._tasks.pop(run.handle, None)
            if not run.done:
                run.finish("cancelled", error="runtime shut down" if run.interrupted else "cancelled")

        task.add_done_callback(settled)

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

    def _finished(self, run: Run) -> None:
        if self._runs.get(run.handle) is run:
            self._ended_at[run.handle] = self._clock()
            self.evict_expired()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

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
    ) -> bool:
        """Wait until all (``mode="all"``) or any (``"any"``) of ``runs`` are done.

        Waits at most ``seconds``. While waiting, ``on_progress(elapsed_seconds, finished_count)``
        is awaited every ``progress_interval`` seconds. Returns ``True`` when the timeout passed
        first (the caller reports ``timedOut``), ``False`` when the condition holds. Raises
        ``ValueError`` for a non-finite ``seconds`` (NaN would otherwise end the wait at once).
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
