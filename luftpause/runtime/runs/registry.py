"""The registry that owns every run's task: adding, starting, finishing, cancelling, budgets,
messages and stops, lookup and eviction.

The run record itself is :mod:`luftpause.runtime.runs.record`, what ``await``/``status`` show
:mod:`luftpause.runtime.runs.views`, the journal's replay and compaction
:mod:`luftpause.runtime.runs.replay`, waiting :mod:`luftpause.runtime.runs.waiting`, the asyncio
task of each run's loop :mod:`luftpause.runtime.runs.loop_tasks`; their public names are
re-exported here.

Runs form trees: ``spawn(parent=handle)`` makes a child. Cancelling a run cancels its running
descendants. A run may carry budgets (tokens = prompt + completion, tool calls, seconds since it
started) that bound it and all its descendants, children spawned later included; they are checked
before every turn and every tool call, after every turn and tool round, and the seconds by a
timer; on excess the whole subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.

With a store (:class:`~luftpause.runtime.runs.store.RecordStore`: the file journal or
PostgreSQL) the registry records every run's start, tool rounds and end, and replays the journal
after a restart. A run the runtime's shutdown interrupts is not recorded as ended: it resumes on
the next start.

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
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.runs.budgets import ancestors, budget_used, first_exceeded, subtree
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.listeners import RunListener
from luftpause.runtime.runs.loop_tasks import LoopTasks, confirm_start
from luftpause.runtime.runs.record import (
    BUDGET_KEYS,
    COUNTER_KEYS,
    TASK_SUMMARY_CHARS,
    Counters,
    PendingRound,
    Run,
    RunState,
    ServiceClass,
    add_counters,
    new_handle,
    summarize,
    take_message,
)
from luftpause.runtime.runs.replay import JournalReport, Replayed, journal_snapshot, replay_journal
from luftpause.runtime.runs.retention import (
    DEFAULT_MAX_EXPIRED_HANDLES,
    DEFAULT_MAX_FINISHED,
    DEFAULT_RETAINED_BYTES,
    DEFAULT_RETENTION_SECONDS,
    FinishedRuns,
)
from luftpause.runtime.runs.store import RecordStore
from luftpause.runtime.runs.tenants import Tenant, only_visible, visible
from luftpause.runtime.runs.views import run_tree
from luftpause.runtime.runs.waiting import PROGRESS_INTERVAL_SECONDS, WaitMode, wait_for_runs

__all__ = [
    "BUDGET_KEYS",
    "COUNTER_KEYS",
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


FINAL_STATES: tuple[RunState, ...] = ("completed", "failed", "cancelled")


@dataclass(slots=True)
class RunCounts:
    """What the registry counts since the process started (``GET /metrics``): runs it recorded
    (replayed ones are not new), runs that ended by final state (not those the shutdown
    interrupted: they resume), and subtrees cancelled because a budget ran out, by budget."""

    started: int = 0
    ended: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINAL_STATES, 0))
    budget_cancellations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUDGET_KEYS, 0))


class RunRegistry:
    """Every run of this server, by handle, and the task group that owns their tasks.

    Use :meth:`serving` (or ``async with`` for a registry whose runs are started with their own
    bodies) inside the server's lifespan. Entering replays the journal, if there is one; serving
    then resumes the unfinished runs. Leaving cancels the runs still going (marking them
    ``interrupted`` and listing them in :attr:`interrupted`; with a journal they are not recorded
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
        journal: RecordStore | None = None,
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
        self.journal = journal
        self.listeners = tuple(listeners)
        self._foreign = frozenset().union(*(listener.record_types for listener in self.listeners))
        self._runs: dict[str, Run] = {}
        self._loops = LoopTasks(lambda run, state, error: self.finish(run, state, error=error))
        self._drive: Drive | None = None
        # The counters of each running run at its last completed tool round: what a compaction
        # writes, so that a turn in flight is not counted twice after a crash.
        self._checkpoints: dict[str, Counters] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._to_resume: list[Run] = []
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
        """Open the registry (replaying the journal), resume its unfinished runs with ``drive``,
        and start every run later :meth:`start` ed with ``drive(run)``; on leaving, as ``async
        with`` does."""
        async with self:
            self._drive = drive
            following = asyncio.create_task(self._follow_takeovers(), name="run takeovers")
            try:
                self._resume()
                self.ready = True
                yield self
            finally:
                self.ready = False
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following
                self._drive = None

    async def _follow_takeovers(self) -> None:
        """With a store several runtimes share: stop driving the runs another runtime took over,
        and resume the runs this one took over from a dead runtime, as a restart resumes them."""
        if self.journal is None:
            return
        async for change in self.journal.takeovers():
            self._release(change.lost)
            took: list[str] = []
            if change.took is not None:
                replayed = replay_journal(change.took, self.listeners, self._foreign)
                self._install(replayed)
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
        """Stop driving ``handles`` and forget them, without recording an end: another runtime
        holds them now (their records would be refused anyway)."""
        for handle in handles:
            run = self._runs.pop(handle, None)
            if run is None:
                continue
            if not run.done:
                run.interrupted = True
                self._loops.cancel(run)
            log.error("run %s is held by another runtime now; this one stopped driving it", handle)
        if handles:
            self.notify_changed()

    async def __aenter__(self) -> RunRegistry:
        if self.journal is not None:
            self.journal.claim()
            replayed = replay_journal(self.journal, self.listeners, self._foreign)
            self.journal_report = replayed.report
            self._install(replayed)
            self.journal.open(
                snapshot=self.journal_snapshot, on_failure=self._journal_failed, held=list(replayed.runs)
            )
            for run in replayed.failed:  # failed for a damaged journal: now an outcome like any
                self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
                for listener in self.listeners:
                    listener.run_ended(run)
            if self.journal.size > self.journal.compact_bytes:
                self.journal.compact_later(self.journal_snapshot())
        await self._loops.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.interrupted.extend(self._loops.interrupt())
        for run in self._to_resume:  # replayed, never started: still resumable
            run.interrupted = True
        try:
            await self._loops.__aexit__(exc_type, exc, tb)
        finally:
            if self.journal is not None:
                self.journal.close()

    @property
    def unresumable_interrupted(self) -> list[Run]:
        """The runs the shutdown interrupted that no restart will resume (all of them without a
        journal, none with one): the server ends these at the dataplane."""
        return [] if self.journal is not None else list(self.interrupted)

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started), link it under its parent and journal its start."""
        self.evict_expired()
        self._runs[run.handle] = run
        parent = self._runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
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
        if self.journal is None or run.durability.error is not None:
            return None
        written = self.journal.append(record)
        run.durability.last_written = written
        return written

    async def durable(self) -> None:
        """Wait until every change journaled so far is durable (:meth:`Journal.written`; at once
        without a journal). A tool or route that changes a run awaits this before it answers, so a
        change it reported survives a kill right after the answer."""
        if self.journal is not None:
            await self.journal.written()

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
        # Its own seconds budget, and those of its ancestors that no timer watches (a finished
        # ancestor replayed after a restart has none, yet its budget bounds this run).
        for holder in ancestors(run, self._runs):
            seconds = holder.spec.budget_seconds
            if seconds is not None and holder.handle not in self._timers:
                delay = max(0.0, holder.started_at + seconds - time.time())
                # A hair late on purpose: the check compares elapsed wall time with the limit.
                self._timers[holder.handle] = asyncio.get_running_loop().call_later(
                    delay + 0.01, self._seconds_up, holder
                )

    def _resume(self) -> int:
        """Start the unfinished runs the journal held, from their last completed tool round;
        returns how many."""
        runs, self._to_resume = self._to_resume, []
        for run in runs:
            self.start(run)
        if runs:
            log.info("resumed %d unfinished runs from %s", len(runs), self.journal and self.journal.label)
        return len(runs)

    def notify_changed(self) -> None:
        """Wake every :meth:`wait` to look again (a run finished, or now waits for approval), and
        bump :attr:`version` (the network changed)."""
        self.changes.notify()

    # The changes to a run, journaled.

    def finish(
        self, run: Run, state: RunState, *, answer: str | None = None, error: str | None = None
    ) -> None:
        """End ``run`` as ``state`` (``completed``, ``failed``, ``cancelled``) once, journaled as an
        ``end`` record (but for a run the shutdown interrupted: it resumes); later calls are
        ignored (the first outcome stands). Its listeners hear of it; waiters wake."""
        if not run.end(state, answer=answer, error=error):
            return
        self._checkpoints.pop(run.handle, None)
        if not run.interrupted:
            self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
            self.counts.ended[state] = self.counts.ended.get(state, 0) + 1
        if self._runs.get(run.handle) is run:
            self.retention.finished(run)
            self.evict_expired()
        if not run.interrupted:  # a run the shutdown stopped resumes: not news
            for listener in self.listeners:
                listener.run_ended(run)
        self.notify_changed()

    def complete_round(self, run: Run, round_messages: list[dict[str, Any]], **extra: Any) -> None:
        """Append a completed tool round (the assistant message and its tool messages) to the
        conversation; it is journaled, with the counters as they stand now, as the point a
        resumed run restarts from. ``extra`` goes into the ``round`` record as it is (pods put
        the ids of the messages and events a round delivered there, so delivery and conversation
        are one record). Then the budgets are checked."""
        run.messages.extend(round_messages)
        run.pending_round = None
        counters = run.costs.to_json()
        self._checkpoints[run.handle] = counters
        self.append(
            run,
            {
                "type": "round",
                "handle": run.handle,
                "messages": round_messages,
                "counters": counters,
                **extra,
            },
        )
        self.check_budgets(run)

    def begin_round(self, run: Run, message: dict[str, Any]) -> concurrent.futures.Future[None] | None:
        """``run``'s reply ``message`` (an assistant message with ``tool_calls``) begins a tool
        round: it becomes the run's pending round, journaled as a ``turn`` record with the
        counters as they stand now (this turn counted, no call of the round yet). The write's
        future, as :meth:`append` gives it: the loop waits for it before any call runs, so a call
        that ran is always one a restart finds again, under the same id."""
        pending = PendingRound(run.costs.turns, message, run.costs.to_json())
        run.pending_round = pending
        return self.append(run, pending.turn_record(run.handle))

    def complete_call(self, run: Run, index: int, message: dict[str, Any], failed: bool) -> None:
        """Call ``index`` of ``run``'s pending round completed with ``message`` (its ``role:
        tool`` message): journaled as a ``call`` record, so a restart does not run it again. Not
        waited for (a record lost in a crash only makes the call run again). Nothing for a run
        that ended meanwhile."""
        pending = run.pending_round
        if pending is None or run.done:
            return
        pending.done[index] = (message, failed)
        self.append(run, pending.call_record(run.handle, index))

    def check_budgets(self, run: Run, ahead: dict[str, float] | None = None) -> None:
        """Check the budgets of ``run`` and its ancestors now; one that ran out, or that ``ahead``
        (what is about to be used: ``{"toolCalls": 1}`` before a tool call, ``{"tokens": 1}``
        before a turn) would pass, cancels its subtree, ``run`` included
        (:func:`luftpause.runtime.runs.budgets.first_exceeded`)."""
        found = first_exceeded(run, self._runs, time.time(), ahead)
        if found is not None:
            holder, which, message = found
            holder.exceeded = holder.exceeded or message
            if self._cancel_subtree(holder, message):
                self.counts.budget_cancellations[which] = self.counts.budget_cancellations.get(which, 0) + 1

    # Pods: messages to a run and graceful stops (luftpause.runtime.pods decides who may).

    def deliver(self, run: Run, content: str, sender: str, message_id: str) -> bool:
        """Give ``run`` a user message (journaled first as a ``message`` record): an idle run is
        re-opened with it (``True``: the caller starts its loop again), a running one gets it in
        its inbox for its next turn (``False``). Raises ``ValueError`` for a run that takes no
        message (:attr:`Run.message_refusal`: stopped, its conversation dropped, its start lost)."""
        refused = run.message_refusal
        if refused is not None:
            raise ValueError(refused)
        self.append(
            run,
            {"type": "message", "handle": run.handle, "id": message_id, "content": content, "from": sender},
        )
        if run.done:
            self.retention.reopened(run)
        return take_message(run, content, sender, message_id)

    def request_stop(self, run: Run, by: str) -> None:
        """Mark ``run`` to stop after its current turn (journaled); an idle run is stopped at
        once (its state stays as it finished). Does nothing to a stopped run."""
        if run.pod_state == "stopped":
            return
        run.stopped_by = by
        self.append(run, {"type": "stop", "handle": run.handle, "by": by})
        if run.done:
            for listener in self.listeners:
                listener.run_ended(run)
        self.notify_changed()

    # Trees, cancel and budgets.

    def cancel(self, handle: str, reason: str = "cancelled") -> list[Run]:
        """Cancel the run ``handle`` and its running descendants with ``reason`` as their error;
        returns the runs this stopped (a finished run is left as it is, but its running
        descendants are cancelled). Raises :class:`UnknownRun` / :class:`ExpiredRun`."""
        return self._cancel_subtree(self.get(handle), reason)

    def _cancel_subtree(self, root: Run, reason: str) -> list[Run]:
        stopped = [run for run in subtree(root, self._runs) if not run.done]
        for run in stopped:
            self.finish(run, "cancelled", error=reason)
            self._loops.cancel(run)
        return stopped

    def _seconds_up(self, run: Run) -> None:
        self._timers.pop(run.handle, None)
        if any(not r.done for r in subtree(run, self._runs)):
            self.check_budgets(run)

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

    # The journal.

    def journal_snapshot(self) -> Iterator[dict[str, Any]]:
        """Records that rebuild every held run (:func:`~luftpause.runtime.runs.replay.journal_snapshot`)
        and the listeners' state."""
        return journal_snapshot(
            list(self._runs.values()),
            dict(self._checkpoints),
            [listener.snapshot for listener in self.listeners],
        )

    def _install(self, replayed: Replayed) -> None:
        """Take the runs a replay rebuilt (:func:`~luftpause.runtime.runs.replay.replay_journal`):
        hold them, date the finished ones for retention, then tell the listeners. At start, or
        later for the runs taken over from a dead runtime (:meth:`serving`)."""
        now_wall = time.time()
        self._runs.update(replayed.runs)
        self._checkpoints.update(replayed.checkpoints)
        finished = sorted((r for r in replayed.runs.values() if r.done), key=lambda r: r.finished_at or 0.0)
        for run in finished:
            self.retention.finished(run, ago=max(0.0, now_wall - (run.finished_at or now_wall)))
        self.evict_expired()
        self._to_resume += [r for r in replayed.runs.values() if not r.done and r.handle in self._runs]
        for listener in self.listeners:
            listener.replayed(self._runs)

    def evict_expired(self) -> int:
        """Drop what :mod:`~luftpause.runtime.runs.retention` says is due (listeners hear of each
        run dropped); returns how many runs were dropped."""
        dropped = self.retention.evict(self._runs)
        for handle in dropped:
            for listener in self.listeners:
                listener.run_dropped(handle)
        return len(dropped)

    def get(self, handle: str) -> Run:
        """The run with ``handle``; raises :class:`ExpiredRun` for a finished run that was dropped,
        :class:`UnknownRun` for a handle this registry never had (or dropped too long ago)."""
        self.evict_expired()
        try:
            return self._runs[handle]
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
        missing = [h for h in handles if h not in self._runs]
        unknown = [h for h in missing if not self.retention.expired(h)]
        if unknown:
            raise UnknownRun(", ".join(unknown)) if len(unknown) > 1 else UnknownRun(unknown[0])
        if missing:
            raise self.retention.missing(missing[0])
        return [self._runs[h] for h in handles]

    def all(self) -> list[Run]:
        """Every run still held (running, or finished within retention), oldest first."""
        self.evict_expired()
        return list(self._runs.values())

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
