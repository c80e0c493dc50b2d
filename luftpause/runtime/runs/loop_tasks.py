"""The asyncio task that drives each run's loop, in a task group the server's lifespan enters.

:class:`LoopTasks` is the registry's (:mod:`luftpause.runtime.runs.registry`): a run's task is
owned here, never by the MCP request that spawned it, so a run outlives the ``spawn`` call, the
client's session and a client crash. One run never has two loops: a run re-opened by ``send``
just after it finished waits for its old loop's last step. Every way a loop can end without an
outcome becomes one, through the ``end`` it is given (the registry's ``finish``): a body that
raises fails the run with the error text (one broken run never takes the task group down), one
cancelled (also before its first step) cancels it, one that returns without an outcome fails it;
a run whose ``start`` record could not be journaled fails without taking a turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from luftpause.runtime.errors import JournalWriteError
from luftpause.runtime.runs.record import Run, RunState

End = Callable[[Run, RunState, str], None]
"""Ends a run as a state with an error text, once (the registry's ``finish(run, state,
error=...)``; a later outcome is ignored)."""


async def confirm_start(run: Run) -> None:
    """Wait until ``run``'s ``start`` record is durable. Raises :class:`JournalWriteError`."""
    if run.durability.start_written is not None:
        await asyncio.wrap_future(run.durability.start_written)


@dataclass(frozen=True, slots=True)
class _Loop:
    run: Run
    task: asyncio.Task[None]


class LoopTasks:
    """The loop task of every run started, by handle, in a task group entered with ``async with``.

    :meth:`start` raises ``RuntimeError`` outside it; :meth:`interrupt` cancels every task before
    leaving (marking the runs not done ``interrupted``), and leaving waits for them to end."""

    def __init__(self, end: End) -> None:
        self._end = end
        self._loops: dict[str, _Loop] = {}
        self._group: asyncio.TaskGroup | None = None
        self._entered: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> LoopTasks:
        group = asyncio.TaskGroup()
        await group.__aenter__()
        self._group = self._entered = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        group, self._entered, self._group = self._entered, None, None
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)

    def interrupt(self) -> list[Run]:
        """Take no more runs and cancel every loop task; the runs it stopped before they finished
        (now marked ``interrupted``), in start order. A finished run still ending itself at the
        dataplane was not stopped."""
        self._group = None
        interrupted = []
        for loop in self._loops.values():
            if not loop.run.done:
                loop.run.interrupted = True
                interrupted.append(loop.run)
            loop.task.cancel()
        return interrupted

    def start(self, run: Run, body: Coroutine[Any, Any, None]) -> None:
        """Run ``body`` as ``run``'s loop task. ``body`` must record the outcome; see the module
        docstring for what happens when it does not. Raises ``RuntimeError`` (``body`` closed)
        outside ``async with`` or once :meth:`interrupt` ed."""
        if self._group is None:
            body.close()
            raise RuntimeError("the run registry is not open (outside the server's lifespan)")
        # A run re-opened by ``send`` just after it finished may still have its old loop task in
        # its last step (ending the run at the dataplane): the new loop waits for it, so one run
        # never has two loops, and that ending comes before the new turns, not after them.
        before = self._loops.get(run.handle)
        task = self._group.create_task(
            self._own(run, body, before.task if before is not None else None), name=run.handle
        )
        self._loops[run.handle] = _Loop(run, task)
        closing = body

        def settled(_: asyncio.Task[None]) -> None:
            # A task cancelled before its first step (the runtime stopping right after a spawn)
            # never enters ``_own``: close its body so it is not left unawaited, and record the run
            # as cancelled rather than running for ever.
            closing.close()
            if not self._owns(run, task):
                return  # a newer loop owns the run (re-opened): its outcome is not this task's
            self._loops.pop(run.handle, None)
            if not run.done:
                self._end(run, "cancelled", "runtime shut down" if run.interrupted else "cancelled")

        task.add_done_callback(settled)

    def cancel(self, run: Run) -> None:
        """Cancel ``run``'s loop task, unless it is the task calling (a run that checks its own
        budget stops itself at its next step: the sub-agent loop)."""
        loop = self._loops.get(run.handle)
        if loop is not None and loop.task is not asyncio.current_task():
            loop.task.cancel()

    def _owns(self, run: Run, task: asyncio.Task[None] | None) -> bool:
        loop = self._loops.get(run.handle)
        return loop is not None and loop.task is task

    async def _own(
        self, run: Run, body: Coroutine[Any, Any, None], before: asyncio.Task[None] | None = None
    ) -> None:
        try:
            if before is not None:
                await asyncio.wait([before])  # not ``await before``: cancelling us must not cancel it
            try:
                await confirm_start(run)
            except JournalWriteError as exc:  # not durable from the start: never takes a turn
                body.close()
                self._end(run, "failed", f"not started: its start could not be journaled: {exc}")
                return
            await body
        except asyncio.CancelledError:
            self._end(run, "cancelled", "runtime shut down" if run.interrupted else "cancelled")
            raise
        except Exception as exc:  # a bug in the loop must fail this run, not the server
            self._end(run, "failed", f"internal error: {exc!r}")
        finally:
            # Only the run's newest loop task speaks for it: an older one ending after a ``send``
            # re-opened the run must neither unregister the new loop nor fail the run.
            if self._owns(run, asyncio.current_task()):
                self._loops.pop(run.handle, None)
                if not run.done:
                    self._end(run, "failed", "internal error: the run loop ended without an outcome")
