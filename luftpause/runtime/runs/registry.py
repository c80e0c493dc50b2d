"""The registry that owns every run's task: adding, starting, finishing, cancelling, budgets,
messages and stops, lookup and eviction.

The run record itself is :mod:`luftpause.runtime.runs.record`, what the registry keeps for each
run it holds and the lookups :mod:`luftpause.runtime.runs.held`, what ``await``/``status`` show
:mod:`luftpause.runtime.runs.views`, the journal's replay and compaction
:mod:`luftpause.runtime.runs.replay`, waiting :mod:`luftpause.runtime.runs.waiting`, the asyncio
task of each run's loop :mod:`luftpause.runtime.runs.loop_tasks`, following the leases of a store
several runtimes share :mod:`luftpause.runtime.runs.takeovers`; their public names are
re-exported here.

Runs form trees: ``spawn(parent=handle)`` makes a child. Cancelling a run cancels its running
descendants. A run may carry budgets (tokens = prompt + completion, tool calls, seconds since it
started) that bound it and all its descendants, children spawned later included; they are checked
before every turn and every tool call, after every turn and tool round, and the seconds by a
timer; on excess the whole subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.

With a store (:class:`~luftpause.runtime.runs.store.RecordStore`: the file journal or
PostgreSQL) the registry records every run's start, tool rounds and end, and replays the journal
after a restart. A run the runtime's shutdown interrupts is not recorded as ended: it resumes on
the next start. On a store several runtimes share, a run another runtime took over is released
(nothing of it stays here) and the runs taken over from a dead runtime are resumed.

The :class:`RunRegistry` owns the asyncio task of every run in a task group entered in the
server's lifespan (:meth:`RunRegistry.serving`, which is given the function that drives a run:
the sub-agent loop's), never in the MCP request that spawned it: a run outlives the ``spawn``
call, the client's session and a client crash. Waiting (``await``) is answered from the records.

Every change to a run goes through the registry, which journals it: :meth:`RunRegistry.add`,
:meth:`~RunRegistry.finish`, :meth:`~RunRegistry.begin_round`, :meth:`~RunRegistry.complete_call`,
:meth:`~RunRegistry.complete_round`,
:meth:`~RunRegistry.check_budgets`, :meth:`~RunRegistry.deliver`,
:meth:`~RunRegistry.request_stop`, :meth:`~RunRegistry.cancel`. The parts that keep state beside the
runs (scopes, notifications, tree depths) are its :class:`RunListener` s, given when it is built:
they hear of ends and evictions, own journal record types of their own (replayed to them) and add
their records to a compaction.

The registry is bounded: finished runs are kept for a retention time, up to a count and within
``[runtime] retained_bytes`` (:mod:`luftpause.runtime.runs.retention`); running runs never leave.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

from luftpause.runtime.errors import UnknownRun
from luftpause.runtime.runs.budgets import budget_used
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.held import HeldRuns
from luftpause.runtime.runs.listeners import RunListener
from luftpause.runtime.runs.loop_tasks import LoopTasks, confirm_start
from luftpause.runtime.runs.record import (
    BUDGET_KEYS,
    COUNTER_KEYS,
    TASK_SUMMARY_CHARS,
    Counters,
    Run,
    RunState,
    ServiceClass,
    add_counters,
    new_handle,
    summarize,
)
from luftpause.runtime.runs.replay import JournalReport, journal_snapshot, replay_journal
from luftpause.runtime.runs.retention import (
    DEFAULT_MAX_EXPIRED_HANDLES,
    DEFAULT_MAX_FINISHED,
    DEFAULT_RETAINED_BYTES,
    DEFAULT_RETENTION_SECONDS,
    FinishedRuns,
)
from luftpause.runtime.runs.run_changes import FINAL_STATES, RunChanges, RunCounts
from luftpause.runtime.runs.store import RecordStore, Takeover
from luftpause.runtime.runs.takeovers import follow_custody
from luftpause.runtime.runs.tenants import Tenant, only_visible, visible
from luftpause.runtime.runs.views import run_tree
from luftpause.runtime.runs.waiting import PROGRESS_INTERVAL_SECONDS, WaitMode, wait_for_runs

__all__ = [
    "BUDGET_KEYS",
    "COUNTER_KEYS",
    "FINAL_STATES",
    "PROGRESS_INTERVAL_SECONDS",
    "TASK_SUMMARY_CHARS",
    "Counters",
    "Drive",
    "Run",
    "RunCounts",
    "RunListener",
    "RunRegistry",
    "RunState",
    "ServiceClass",
    "WaitMode",
    "add_counters",
    "new_handle",
    "summarize",
]

log = logging.getLogger("luftpause.runtime.runs")

Drive = Callable[[Run], Coroutine[Any, Any, None]]
"""What drives one run from where it stands to its end (the sub-agent loop's ``drive``)."""

TakeoverListener = Callable[[list[str], list[str]], None]
"""Told of each change of custody on a shared store (:meth:`RunRegistry.on_takeover`): the
handles this runtime ``took`` over (installed and resumed already) and those it ``lost``
(released already). Called on the event loop; must not raise."""


class RunRegistry(RunChanges):
    """Every run of this server, by handle, and the task group that owns their tasks; its
    changes are :class:`~luftpause.runtime.runs.run_changes.RunChanges`'.

    Use :meth:`serving` (or ``async with`` for a registry whose runs are started with their own
    bodies) inside the server's lifespan. Entering replays the ``store``, if there is one; serving
    then resumes the unfinished runs. Leaving cancels the runs still going (marking them
    ``interrupted`` and listing them in :attr:`interrupted`; with a store they are not recorded
    as ended, so they resume on the next start) and waits for their tasks to end.

    Finished runs are dropped ``retention_seconds`` after they end and beyond ``max_finished`` of
    them (oldest finished first); running runs never. Dropping is done lazily, whenever the
    registry is used (a run added, finished or looked up), so no timer is needed and memory stays
    bounded by the cap between uses. A dropped run no longer counts toward its ancestors' subtree
    totals and budgets. ``clock`` gives the time in seconds that retention is measured in
    (monotonic by default; a test passes its own). ``changes`` is the network's change counter
    (shared with the ``listeners``).
    """

    def __init__(
        self,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        max_finished: int = DEFAULT_MAX_FINISHED,
        max_expired_handles: int = DEFAULT_MAX_EXPIRED_HANDLES,
        retained_bytes: int = DEFAULT_RETAINED_BYTES,
        clock: Callable[[], float] = time.monotonic,
        store: RecordStore | None = None,
        changes: NetworkChanges | None = None,
        listeners: Sequence[RunListener] = (),
    ) -> None:
        self.changes = changes if changes is not None else NetworkChanges()
        self.retention = FinishedRuns(
            retention_seconds=retention_seconds,
            max_finished=max_finished,
            max_expired_handles=max_expired_handles,
            retained_bytes=retained_bytes,
            clock=clock,
            changes=self.changes,
        )
        self.store = store
        """Where the runs' records go (the file journal or PostgreSQL); ``None``: nowhere."""
        self.listeners = tuple(listeners)
        self._foreign = frozenset().union(*(listener.record_types for listener in self.listeners))
        self.held = HeldRuns(self.retention, self.listeners)
        """The runs held and what is kept for each (:mod:`~luftpause.runtime.runs.held`)."""
        self._runs = self.held.runs  # the same dict, never replaced: read on every change
        self._loops = LoopTasks(lambda run, state, error: self.finish(run, state, error=error))
        self._drive: Drive | None = None
        # Runs that leaving the registry cancelled before they finished, in start order; a list of
        # its own because eviction may drop them from ``_runs`` before the server ends them.
        self.interrupted: list[Run] = []
        self.counts = RunCounts()
        self.journal_report = JournalReport()
        """The damage the journal's replay met (``GET /status``'s ``journal``, ``/readyz``)."""
        self.ready = False
        """True from when the journal is replayed and its unfinished runs resumed (:meth:`serving`)
        until the registry is left: the runtime's readiness."""
        self._takeover_listeners: list[TakeoverListener] = []

    @property
    def retained_total(self) -> int:
        """Bytes counted for the finished runs held (:mod:`~luftpause.runtime.runs.retention`)."""
        return self.retention.retained_total

    @property
    def retained_bytes(self) -> int:
        """The bytes finished runs may keep (``[runtime] retained_bytes``)."""
        return self.retention.retained_bytes

    @retained_bytes.setter
    def retained_bytes(self, value: int) -> None:
        self.retention.retained_bytes = value

    @property
    def version(self) -> int:
        """The network's change counter (:class:`~luftpause.runtime.runs.changes.NetworkChanges`):
        bumped on every record journaled (or that would be), every run added, finished, re-opened,
        dropped or forgotten, every approval asked or answered, every event queued."""
        return self.changes.version

    @asynccontextmanager
    async def serving(self, drive: Drive) -> AsyncIterator[RunRegistry]:
        """Open the registry (replaying the store), resume its unfinished runs with ``drive``,
        and start every run later :meth:`start` ed with ``drive(run)``; on leaving, as ``async
        with`` does. On a store several runtimes share, follow the leases meanwhile
        (:func:`~luftpause.runtime.runs.takeovers.follow_custody`)."""
        async with self:
            self._drive = drive
            following = (
                asyncio.create_task(follow_custody(self.store, self._take_over), name="run takeovers")
                if self.store is not None
                else None
            )
            try:
                self._resume()
                self.ready = True
                yield self
            finally:
                self.ready = False
                if following is not None:
                    following.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await following
                self._drive = None

    def _take_over(self, change: Takeover) -> None:
        """A custody round's change: stop driving the runs another runtime took over, and resume
        the runs this one took over from a dead runtime, as a restart resumes them; then tell the
        takeover listeners (:meth:`on_takeover`)."""
        self._release(change.lost)
        took: list[str] = []
        if change.took is not None:
            replayed = replay_journal(change.took, self.listeners, self._foreign)
            self.held.install(replayed)
            for run in replayed.failed:
                self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
            resumed = self._resume()
            log.warning("took over %d runs (%d resumed) from a dead runtime", len(replayed.runs), resumed)
            self.notify_changed()
            took = list(replayed.runs)
        for listener in self._takeover_listeners:
            listener(took, change.lost)

    def on_takeover(self, listener: TakeoverListener) -> None:
        """Tell ``listener`` of every later takeover (:data:`TakeoverListener`): a part that keeps
        state about runs beside the registry (the MCP tasks) follows its runs to and from other
        runtimes sharing the store. Nothing is ever told on a store of one runtime."""
        self._takeover_listeners.append(listener)

    def _release(self, handles: list[str]) -> None:
        """Stop driving ``handles`` and release them (:meth:`HeldRuns.release`: nothing of them
        stays here, their timers are cancelled, the listeners hear ``run_dropped``), without
        recording an end: another runtime holds them now (their records would be refused anyway)."""
        for handle in handles:
            run = self.held.release(handle)
            if run is None:
                continue
            if not run.done:
                run.interrupted = True
                self._loops.cancel(run)
            log.error("run %s is held by another runtime now; this one stopped driving it", handle)
        if handles:
            self.notify_changed()

    async def __aenter__(self) -> RunRegistry:
        store = self.store
        if store is not None:
            store.claim()
            replayed = replay_journal(store, self.listeners, self._foreign)
            self.journal_report = replayed.report
            self.held.install(replayed)
            store.open(
                snapshot=self.journal_snapshot, on_failure=self._journal_failed, held=list(replayed.runs)
            )
            for run in replayed.failed:  # failed for a damaged journal: now an outcome like any
                self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
                for listener in self.listeners:
                    listener.run_ended(run)
            if store.size > store.compact_bytes:
                store.compact_later(self.journal_snapshot())
        await self._loops.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.held.disarm_all()
        self.interrupted.extend(self._loops.interrupt())
        for run in self.held.to_resume:  # replayed, never started: still resumable
            run.interrupted = True
        try:
            await self._loops.__aexit__(exc_type, exc, tb)
        finally:
            if self.store is not None:
                self.store.close()

    @property
    def unresumable_interrupted(self) -> list[Run]:
        """The runs the shutdown interrupted that no restart will resume (all of them without a
        store, none with one): the server ends these at the dataplane."""
        return [] if self.store is not None else list(self.interrupted)

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started), link it under its parent and journal its start."""
        self.evict_expired()
        self.held.hold(run)
        run.durability.start_written = self.append(run, run.start_record())
        self.counts.started += 1
        self.changes.bump()
        return run

    def append(self, run: Run, record: dict[str, Any]) -> concurrent.futures.Future[None] | None:
        """Queue ``record`` of ``run`` for the journal; the write's future (also kept as
        ``run.durability.last_written``), or ``None`` without a journal or once a record of ``run``
        could not be written (its later records would replay into a conversation with a hole).
        Every record is a change to the run network: :attr:`version` is bumped."""
        self.changes.bump()
        if self.store is None or run.durability.error is not None:
            return None
        written = self.store.append(record)
        run.durability.last_written = written
        return written

    async def durable(self) -> None:
        """Wait until every change journaled so far is durable (:meth:`Journal.written`; at once
        without a journal). A tool or route that changes a run awaits this before it answers, so a
        change it reported survives a kill right after the answer."""
        if self.store is not None:
            await self.store.written()

    def _journal_failed(self, record: dict[str, Any], error: OSError) -> None:
        run = self._runs.get(str(record.get("handle")))
        if run is not None and run.durability.error is None:
            run.durability.error = f"{record.get('type')} record not written: {error}"
            log.error("run %s is no longer durable: %s", run.handle, run.durability.error)
            self.notify_changed()

    async def confirm_start(self, run: Run) -> None:
        """Wait until ``run``'s ``start`` record is durable. Raises
        :class:`~luftpause.runtime.errors.JournalWriteError` (the run then fails without taking a
        turn: :meth:`start`)."""
        await confirm_start(run)

    def start(self, run: Run, body: Coroutine[Any, Any, None] | None = None) -> None:
        """Run ``body`` (default: the drive :meth:`serving` was given, for ``run``) as a task owned
        by this registry, not by the caller (:class:`~luftpause.runtime.runs.loop_tasks.LoopTasks`).

        ``body`` must record the outcome (:meth:`finish`); if it raises, the run fails with the
        error text (so one broken run never takes the task group down). A run with a seconds
        budget gets a timer that cancels its subtree when the time is up. Raises ``RuntimeError``
        outside :meth:`serving` (and, without a ``body``, outside it even when entered).
        """
        if body is None:
            if self._drive is None:
                raise RuntimeError("the run registry is not serving (outside the server's lifespan)")
            body = self._drive(run)
        self._loops.start(run, body)
        self.held.arm_budgets(run, self._seconds_up)

    def _resume(self) -> int:
        """Start the unfinished runs the journal held, from their last completed tool round;
        returns how many."""
        runs = self.held.take_to_resume()
        for run in runs:
            self.start(run)
        if runs:
            log.info("resumed %d unfinished runs from %s", len(runs), self.store and self.store.label)
        return len(runs)

    def notify_changed(self) -> None:
        """Wake every :meth:`wait` to look again (a run finished, or now waits for approval), and
        bump :attr:`version` (the network changed)."""
        self.changes.notify()

    def budget_report(self, run: Run) -> dict[str, Any]:
        """``{"limits", "used", "exceeded"}`` for a run that sets budgets, else ``{}``."""
        limits = run.spec.limits
        if not limits:
            return {}
        used = budget_used(run, self._runs, run.finished_at if run.done and run.finished_at else time.time())
        return {"limits": limits, "used": used, "exceeded": run.exceeded}

    def result(self, run: Run) -> dict[str, Any]:
        """:meth:`Run.result` plus, for a run with budgets, :meth:`budget_report`."""
        return {**run.result(), **self.budget_report(run)}

    def status_of(self, run: Run, *, full_task: bool = False) -> dict[str, Any]:
        """:meth:`Run.status` plus, for a run with budgets, :meth:`budget_report`."""
        return {**run.status(full_task=full_task), **self.budget_report(run)}

    def of_caller(self, caller: str) -> list[Run]:
        """The runs ``caller`` spawned that are still held, oldest first."""
        return [run for run in self.all() if run.caller == caller]

    def children(self, run: Run) -> list[Run]:
        """``run``'s children still held, oldest first."""
        return [self._runs[h] for h in run.children if h in self._runs]

    def get_for(self, handle: str, tenant: Tenant | None) -> Run:
        """:meth:`get`, for a request of ``tenant``: another tenant's run raises
        :class:`UnknownRun`, exactly as a handle that does not exist (handles must not be
        probeable; :mod:`~luftpause.runtime.runs.tenants`)."""
        run = self.get(handle)
        if not visible(run, tenant):
            raise UnknownRun(handle)
        return run

    def tree(self, tenant: Tenant | None = None) -> list[dict[str, Any]]:
        """Every held run ``tenant`` may see with its own and subtree costs
        (:func:`~luftpause.runtime.runs.views.run_tree`)."""
        runs = only_visible(self.all(), tenant)
        return run_tree(runs, self._runs, self.budget_report)

    # The store, and lookups (:class:`~luftpause.runtime.runs.held.HeldRuns`).

    def journal_snapshot(self) -> Iterator[dict[str, Any]]:
        """Records that rebuild every held run (:func:`~luftpause.runtime.runs.replay.journal_snapshot`)
        and the listeners' state."""
        return journal_snapshot(
            list(self._runs.values()),
            dict(self.held.checkpoints),
            [listener.snapshot for listener in self.listeners],
        )

    def evict_expired(self) -> int:
        """:meth:`HeldRuns.evict_expired`: drop the finished runs retention says are due."""
        return self.held.evict_expired()

    def get(self, handle: str) -> Run:
        """:meth:`HeldRuns.get`: the run, or :class:`ExpiredRun` / :class:`UnknownRun`."""
        return self.held.get(handle)

    def find(self, handle: str) -> Run | None:
        """The run with ``handle``, or ``None`` when it is not held."""
        return self.held.find(handle)

    def lookup(self, handles: Iterable[str]) -> list[Run]:
        """:meth:`HeldRuns.lookup`: the runs in order, or :class:`UnknownRun` / :class:`ExpiredRun`."""
        return self.held.lookup(handles)

    def all(self) -> list[Run]:
        """Every run still held (running, or finished within retention), oldest first."""
        return self.held.all()

    @property
    def changed_event(self) -> asyncio.Event:
        """The event the next change sets (:meth:`notify_changed` replaces it)."""
        return self.changes.event

    async def wait(
        self,
        runs: list[Run],
        mode: WaitMode,
        seconds: float,
        on_progress: Callable[[float, int], Awaitable[None]] | None = None,
        progress_interval: float = PROGRESS_INTERVAL_SECONDS,
        interrupt: Callable[[], bool] | None = None,
    ) -> bool:
        """Wait for ``runs`` (:func:`~luftpause.runtime.runs.waiting.wait_for_runs`): ``True`` when
        the timeout passed first."""
        return await wait_for_runs(
            self.changes, runs, mode, seconds, on_progress, progress_interval, interrupt
        )
