"""Run records and the registry that owns every run's task.

A *run* is one sub-agent: its task, its conversation, its counters and, once finished, its answer
or error. Its state moves one way only::

    running ──▶ completed   the model answered without calling a tool
            ├─▶ failed      a turn failed (dataplane error, bad reply) or the loop broke
            └─▶ cancelled   its task was cancelled (today only by the runtime shutting down)

The :class:`RunRegistry` owns the asyncio task of every run in a task group entered in the
server's lifespan, never in the MCP request that spawned it: a run outlives the ``spawn`` call,
the client's session and a client crash. Waiting (``await``) is answered from the records.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from luftpause.runtime.errors import UnknownRun

RunState = Literal["running", "completed", "failed", "cancelled"]
ServiceClass = Literal["interactive", "batch"]
WaitMode = Literal["all", "any"]

# How often a long ``await`` tells its caller it is still waiting (seconds). Claude Code resets
# its idle timeout on progress; a few seconds keeps every reasonable client waiting.
PROGRESS_INTERVAL_SECONDS = 5.0


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

    def status(self) -> dict[str, Any]:
        """:meth:`result` plus what the run was asked: ``model``, ``serviceClass``, ``caller``,
        ``task``, ``maxToolCalls``, ``startedAt`` (Unix seconds)."""
        return {
            **self.result(),
            "model": self.model,
            "serviceClass": self.service_class,
            "caller": self.caller,
            "task": self.task,
            "maxToolCalls": self.max_tool_calls,
            "startedAt": round(self.started_at, 3),
        }


class RunRegistry:
    """Every run of this server, by handle, and the task group that owns their tasks.

    Use as an async context manager inside the server's lifespan. Leaving it cancels the runs that
    are still going (marking them ``interrupted``) and waits for their tasks to end.
    """

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
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
            self._runs[handle].interrupted = True
            task.cancel()
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started)."""
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
        self._tasks[run.handle] = self._group.create_task(self._own(run, body), name=run.handle)

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
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def get(self, handle: str) -> Run:
        """The run with ``handle``; raises :class:`UnknownRun`."""
        try:
            return self._runs[handle]
        except KeyError:
            raise UnknownRun(handle) from None

    def lookup(self, handles: Iterable[str]) -> list[Run]:
        """The runs for ``handles`` in order; raises :class:`UnknownRun` naming every unknown one."""
        handles = list(handles)
        unknown = [h for h in handles if h not in self._runs]
        if unknown:
            raise UnknownRun(", ".join(unknown)) if len(unknown) > 1 else UnknownRun(unknown[0])
        return [self._runs[h] for h in handles]

    def all(self) -> list[Run]:
        """Every run, oldest first."""
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
        first (the caller reports ``timedOut``), ``False`` when the condition holds.
        """
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
