"""What the run registry keeps for each run it holds, in one place: the run itself (by handle),
the counters of its last completed tool round (what a compaction writes), the timer of its
seconds budget, whether it waits to be resumed, and its retention bookkeeping
(:mod:`luftpause.runtime.runs.retention`); and the lookups over them.

A run leaves in one of two ways, and either way everything kept for it goes and the registry's
listeners (:class:`~luftpause.runtime.runs.listeners.RunListener`) hear ``run_dropped``:

* dropped by retention (:meth:`HeldRuns.evict_expired`): its handle is remembered, so ``await``
  and ``status`` say it expired;
* released (:meth:`HeldRuns.release`): another runtime sharing the store holds it now
  (:mod:`luftpause.runtime.runs.custody`); its timers are cancelled, and its handle is forgotten
  (a call about it is answered by the runtime that holds it, not as expired here).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence

from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.runs.budgets import ancestors
from luftpause.runtime.runs.listeners import RunListener
from luftpause.runtime.runs.record import Counters, Run
from luftpause.runtime.runs.replay import Replayed
from luftpause.runtime.runs.retention import FinishedRuns

SECONDS_UP_DELAY = 0.01
"""How late a seconds budget's timer fires (seconds), on purpose: the check compares the wall time
elapsed with the limit."""


class HeldRuns:
    """The runs one registry holds and what it keeps for each (module docstring). ``retention``
    decides which finished runs stay; ``listeners`` hear of every run that leaves."""

    def __init__(self, retention: FinishedRuns, listeners: Sequence[RunListener]) -> None:
        self.runs: dict[str, Run] = {}
        """Every run held, by handle, oldest first."""
        self.checkpoints: dict[str, Counters] = {}
        """The counters of each running run at its last completed tool round: what a compaction
        writes, so that a turn in flight is not counted twice after a crash."""
        self.timers: dict[str, asyncio.TimerHandle] = {}
        """The armed timer of each run whose seconds budget is watched, by the budget's run."""
        self.to_resume: list[Run] = []
        """Runs replayed (at start, or taken over) and not yet started."""
        self.retention = retention
        self.listeners = tuple(listeners)

    def hold(self, run: Run) -> None:
        """Hold ``run`` (new), linked under its parent when that is held."""
        self.runs[run.handle] = run
        parent = self.runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)

    def install(self, replayed: Replayed) -> None:
        """Hold the runs a replay rebuilt (:func:`~luftpause.runtime.runs.replay.replay_journal`),
        date the finished ones for retention, mark the unfinished ones to resume, then tell the
        listeners (``replayed``). At start, or later for runs taken over from a dead runtime."""
        now_wall = time.time()
        self.runs.update(replayed.runs)
        self.checkpoints.update(replayed.checkpoints)
        finished = sorted((r for r in replayed.runs.values() if r.done), key=lambda r: r.finished_at or 0.0)
        for run in finished:
            self.retention.finished(run, ago=max(0.0, now_wall - (run.finished_at or now_wall)))
        self.evict_expired()
        self.to_resume += [r for r in replayed.runs.values() if not r.done and r.handle in self.runs]
        for listener in self.listeners:
            listener.replayed(self.runs)

    def take_to_resume(self) -> list[Run]:
        """The runs waiting to be resumed, in order; none wait after."""
        runs, self.to_resume = self.to_resume, []
        return runs

    def checkpoint(self, run: Run, counters: Counters) -> None:
        """``run`` completed a tool round with ``counters``."""
        self.checkpoints[run.handle] = counters

    def ended(self, run: Run) -> None:
        """``run`` finished: it has no checkpoint any more and is dated for retention; then what
        retention says is due is dropped. Nothing for a run no longer held (released)."""
        if self.runs.get(run.handle) is not run:
            return
        self.checkpoints.pop(run.handle, None)
        self.retention.finished(run)
        self.evict_expired()

    # Seconds budgets.

    def arm_budgets(self, run: Run, seconds_up: Callable[[Run], None]) -> None:
        """Watch the seconds budget of ``run`` (starting) and of its ancestors that no timer
        watches (a finished ancestor replayed after a restart has none, yet its budget bounds
        ``run``): ``seconds_up(holder)`` is called on the event loop when one is up."""
        loop = asyncio.get_running_loop()
        for holder in ancestors(run, self.runs):
            seconds = holder.spec.budget_seconds
            if seconds is not None and holder.handle not in self.timers:
                delay = max(0.0, holder.started_at + seconds - time.time())
                self.timers[holder.handle] = loop.call_later(delay + SECONDS_UP_DELAY, seconds_up, holder)

    def fired(self, run: Run) -> None:
        """``run``'s budget timer fired: it is no longer armed."""
        self.timers.pop(run.handle, None)

    def disarm_all(self) -> None:
        """Cancel every timer (the registry is left)."""
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()

    # Leaving.

    def release(self, handle: str) -> Run | None:
        """Forget the run ``handle`` and everything kept for it, for good: another runtime holds
        it now (module docstring). Its timer is cancelled, retention forgets it (it is not
        remembered as expired) and the listeners hear ``run_dropped``. The run, or ``None`` when
        it was not held. Its loop is the caller's to stop."""
        run = self.runs.pop(handle, None)
        self.checkpoints.pop(handle, None)
        timer = self.timers.pop(handle, None)
        if timer is not None:
            timer.cancel()
        self.to_resume = [r for r in self.to_resume if r.handle != handle]
        if run is None:
            return None
        self.retention.release(run)
        for listener in self.listeners:
            listener.run_dropped(handle)
        return run

    def evict_expired(self) -> int:
        """Drop what :mod:`~luftpause.runtime.runs.retention` says is due (listeners hear of each
        run dropped; a dropped run's timer, if still armed, is cancelled); how many were dropped."""
        dropped = self.retention.evict(self.runs)
        for handle in dropped:
            self.checkpoints.pop(handle, None)
            timer = self.timers.pop(handle, None)
            if timer is not None:
                timer.cancel()
            for listener in self.listeners:
                listener.run_dropped(handle)
        return len(dropped)

    # Lookups.

    def get(self, handle: str) -> Run:
        """The run with ``handle``; raises :class:`ExpiredRun` for a finished run that was dropped,
        :class:`UnknownRun` for a handle never held here (or dropped too long ago, or released)."""
        self.evict_expired()
        try:
            return self.runs[handle]
        except KeyError:
            raise self.retention.missing(handle) from None

    def find(self, handle: str) -> Run | None:
        """The run with ``handle``, or ``None`` when it is not held."""
        try:
            return self.get(handle)
        except (UnknownRun, ExpiredRun):
            return None

    def lookup(self, handles: Iterable[str]) -> list[Run]:
        """The runs for ``handles`` in order. Raises :class:`UnknownRun` naming every unknown
        handle, else :class:`ExpiredRun` for the first dropped one."""
        self.evict_expired()
        handles = list(handles)
        missing = [h for h in handles if h not in self.runs]
        unknown = [h for h in missing if not self.retention.expired(h)]
        if unknown:
            raise UnknownRun(", ".join(unknown)) if len(unknown) > 1 else UnknownRun(unknown[0])
        if missing:
            raise self.retention.missing(missing[0])
        return [self.runs[h] for h in handles]

    def all(self) -> list[Run]:
        """Every run held (running, or finished within retention), oldest first."""
        self.evict_expired()
        return list(self.runs.values())
