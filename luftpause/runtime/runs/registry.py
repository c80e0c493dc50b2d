"""The registry that owns every run's task: adding, starting, finishing, cancelling, budgets,
messages and stops, lookup and eviction.

The run record itself is :mod:`luftpause.runtime.runs.record`, what ``await``/``status`` show
:mod:`luftpause.runtime.runs.views`, the journal's replay and compaction
:mod:`luftpause.runtime.runs.replay`, waiting :mod:`luftpause.runtime.runs.waiting`; their public
names are re-exported here.

Runs form trees: ``spawn(parent=handle)`` makes a child. Cancelling a run cancels its running
descendants. A run may carry budgets (tokens = prompt + completion, tool calls, seconds since it
started) that bound it and all its descendants, children spawned later included; they are checked
before every turn and every tool call, after every turn and tool round, and the seconds by a
timer; on excess the whole subtree is cancelled with ``budget exceeded: <which> <used>/<limit>``.

With a :class:`~luftpause.runtime.runs.journal.Journal` the registry records every run's start, tool
rounds and end, and replays the journal after a restart. A run the runtime's shutdown interrupts
is not recorded as ended: it resumes on the next start.

The :class:`RunRegistry` owns the asyncio task of every run in a task group entered in the
server's lifespan, never in the MCP request that spawned it: a run outlives the ``spawn`` call,
the client's session and a client crash. Waiting (``await``) is answered from the records.

The registry is bounded: a finished run (completed, failed, cancelled) is kept for a retention time
after it ends (default one hour) and at most a cap of finished runs is kept (default 10,000, the
oldest finished dropped first). A running run is never dropped. A dropped run's handle is
remembered (a bounded number of them) so ``await`` / ``status`` can say it expired rather than
that it never existed.

It is bounded by bytes too (``[runtime] retained_bytes``, default 256 MiB): each finished run is
counted for the bytes of the record compaction writes for it
(:func:`~luftpause.runtime.runs.record.retained_size`: task, system prompt, conversation, answer).
Past the budget, the least recently finished runs first drop their conversation
(:func:`~luftpause.runtime.runs.record.drop_conversation`: they keep state, answer, counters and
their newest output entries with their ``read`` indices; ``send`` to them is refused), then, if
that is not enough, the least recently finished are forgotten. Compaction writes only what is
retained, so the compacted journal is about the retained bytes plus the running runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any

from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.runs.budgets import ancestors, budget_used, first_exceeded, subtree
from luftpause.runtime.runs.journal import Journal, JournalWriteError
from luftpause.runtime.runs.record import (
    BUDGET_KEYS,
    CONVERSATION_DROPPED,
    COUNTER_KEYS,
    TASK_SUMMARY_CHARS,
    Counters,
    Run,
    RunState,
    ServiceClass,
    add_counters,
    drop_conversation,
    new_handle,
    retained_size,
    summarize,
)
from luftpause.runtime.runs.replay import journal_snapshot, replay_journal
from luftpause.runtime.runs.views import run_tree
from luftpause.runtime.runs.waiting import PROGRESS_INTERVAL_SECONDS, WaitMode, wait_for_runs

__all__ = [
    "BUDGET_KEYS",
    "COUNTER_KEYS",
    "PROGRESS_INTERVAL_SECONDS",
    "TASK_SUMMARY_CHARS",
    "Counters",
    "Run",
    "RunRegistry",
    "RunState",
    "ServiceClass",
    "WaitMode",
    "add_counters",
    "new_handle",
    "summarize",
]

log = logging.getLogger("luftpause.runtime.runs.registry")

DEFAULT_RETENTION_SECONDS = 3600.0
"""How long a finished run stays in the registry after it ended (seconds)."""

DEFAULT_MAX_FINISHED = 10_000
"""Most finished runs the registry keeps; past it the oldest finished are dropped first. A run
holds its whole conversation, so this caps the memory that finished runs can take."""

DEFAULT_RETAINED_BYTES = 256 * 1024 * 1024
"""Bytes finished runs keep at most (``[runtime] retained_bytes``): see the module's docstring."""

DEFAULT_MAX_EXPIRED_HANDLES = 100_000
"""Most dropped handles remembered to answer "expired" (about 100 bytes each); a handle dropped
longer ago than that is reported as unknown."""


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
        retained_bytes: int = DEFAULT_RETAINED_BYTES,
        clock: Callable[[], float] = time.monotonic,
        journal: Journal | None = None,
    ) -> None:
        if not (math.isfinite(retention_seconds) and retention_seconds >= 0):
            raise ValueError(f"retention_seconds must be finite and >= 0, got {retention_seconds!r}")
        if max_finished < 1 or max_expired_handles < 0 or retained_bytes < 1:
            raise ValueError("max_finished and retained_bytes must be >= 1 and max_expired_handles >= 0")
        self.retained_bytes = retained_bytes
        # Bytes counted for the finished runs held (Run.retained summed), and the finished runs
        # that still hold their conversation, in the order they finished (a dict as ordered set).
        self.retained_total = 0
        self._full: dict[str, None] = {}
        # Bumped on every change to the run network: a record journaled (or that would be), a run
        # added, finished, re-opened, dropped or forgotten, an approval asked or answered, an event
        # queued (luftpause.runtime.pods.operations). The monitor answers "unchanged" while it stands.
        self.version = 0
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
        # Pods (luftpause.runtime.pods.operations) listen here: every finish (not replayed ones), every
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
            self.journal.on_failure = self._journal_failed
            self.journal.open()
            if self.journal.size > self.journal.compact_bytes:
                self.journal.compact_later(self.journal_snapshot())
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
        run._on_budget_check = self._check_budgets

    def add(self, run: Run) -> Run:
        """Record ``run`` (not yet started), link it under its parent and journal its start."""
        self.evict_expired()
        self._hook(run)
        self._runs[run.handle] = run
        parent = self._runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
        run.start_written = self.append(run, run.start_record())
        self.version += 1
        return run

    def append(self, run: Run, record: dict[str, Any]) -> concurrent.futures.Future[None] | None:
        """Queue ``record`` of ``run`` for the journal; the write's future (also kept as
        ``run.last_written``), or ``None`` without a journal or once a record of ``run`` could
        not be written (its later records would replay into a conversation with a hole). Every
        record is a change to the run network: :attr:`version` is bumped."""
        self.version += 1
        if self.journal is None or run.journal_error is not None:
            return None
        written = self.journal.append(record)
        run.last_written = written
        return written

    def _journal_failed(self, record: dict[str, Any], error: OSError) -> None:
        run = self._runs.get(str(record.get("handle")))
        if run is not None and run.journal_error is None:
            run.journal_error = f"{record.get('type')} record not written: {error}"
            log.error("run %s is no longer durable: %s", run.handle, run.journal_error)
            self.notify_changed()

    async def confirm_start(self, run: Run) -> None:
        """Wait until ``run``'s ``start`` record is durable. Raises :class:`JournalWriteError`
        (the run then fails without taking a turn: :meth:`start`)."""
        if run.start_written is not None:
            await asyncio.wrap_future(run.start_written)

    def start(self, run: Run, body: Coroutine[Any, Any, None]) -> None:
        """Run ``body`` (the run's loop) as a task owned by this registry, not by the caller.

        ``body`` must record the outcome on ``run`` itself; if it raises, the run fails with the
        error text (so one broken run never takes the task group down). A run with a seconds
        budget gets a timer that cancels its subtree when the time is up.
        """
        if self._group is None:
            body.close()
            raise RuntimeError("the run registry is not open (outside the server's lifespan)")
        # A run re-opened by ``send`` just after it finished may still have its old loop task in
        # its last step (ending the run at the dataplane): the new loop waits for it, so one run
        # never has two loops, and that ending comes before the new turns, not after them.
        before = self._tasks.get(run.handle)
        task = self._group.create_task(self._own(run, body, before), name=run.handle)
        self._tasks[run.handle] = task
        # Its own seconds budget, and those of its ancestors that no timer watches (a finished
        # ancestor replayed after a restart has none, yet its budget bounds this run).
        for holder in ancestors(run, self._runs):
            if holder.budget_seconds is not None and holder.handle not in self._timers:
                delay = max(0.0, holder.started_at + holder.budget_seconds - time.time())
                # A hair late on purpose: the check compares elapsed wall time with the limit.
                self._timers[holder.handle] = asyncio.get_running_loop().call_later(
                    delay + 0.01, self._seconds_up, holder
                )

        def settled(_: asyncio.Task[None]) -> None:
            # A task cancelled before its first step (the runtime stopping right after a spawn)
            # never enters ``_own``: close its body so it is not left unawaited, and record the run
            # as cancelled rather than running for ever.
            body.close()
            if self._tasks.get(run.handle) is not task:
                return  # a newer loop owns the run (re-opened): its outcome is not this task's
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

    async def _own(
        self, run: Run, body: Coroutine[Any, Any, None], before: asyncio.Task[None] | None = None
    ) -> None:
        try:
            if before is not None:
                await asyncio.wait([before])  # not ``await before``: cancelling us must not cancel it
            try:
                await self.confirm_start(run)
            except JournalWriteError as exc:  # not durable from the start: never takes a turn
                body.close()
                run.finish("failed", error=f"not started: its start could not be journaled: {exc}")
                return
            await body
        except asyncio.CancelledError:
            run.finish("cancelled", error="runtime shut down" if run.interrupted else "cancelled")
            raise
        except Exception as exc:  # a bug in the loop must fail this run, not the server
            run.finish("failed", error=f"internal error: {exc!r}")
        finally:
            # Only the run's newest loop task speaks for it: an older one ending after a ``send``
            # re-opened the run must neither unregister the new loop nor fail the run.
            if self._tasks.get(run.handle) is asyncio.current_task():
                self._tasks.pop(run.handle, None)
                if not run.done:
                    run.finish("failed", error="internal error: the run loop ended without an outcome")

    def notify_changed(self) -> None:
        """Wake every :meth:`wait` to look again (a run finished, or now waits for approval), and
        bump :attr:`version` (the network changed)."""
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _retain(self, run: Run) -> None:
        """Count finished ``run`` toward :attr:`retained_total` (once; its size is taken now)."""
        self._unretain(run)
        run.retained = retained_size(run)
        self.retained_total += run.retained
        if not run.conversation_dropped:
            self._full[run.handle] = None

    def _unretain(self, run: Run) -> None:
        self.retained_total -= run.retained
        run.retained = 0
        self._full.pop(run.handle, None)

    def _finished(self, run: Run) -> None:
        self._checkpoints.pop(run.handle, None)
        if not run.interrupted:
            self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
        if self._runs.get(run.handle) is run:
            self._ended_at[run.handle] = self._clock()
            self._retain(run)
            self.evict_expired()
        if not run.interrupted:  # a run the shutdown stopped resumes: not news
            for listener in self.on_finish:
                listener(run)
        self.notify_changed()

    def _round(self, run: Run, messages: list[dict[str, Any]], extra: dict[str, Any]) -> None:
        counters = run.counters()
        self._checkpoints[run.handle] = counters
        self.append(
            run, {"type": "round", "handle": run.handle, "messages": messages, "counters": counters, **extra}
        )
        self.version += 1
        self._check_budgets(run)

    # Pods: messages to a run and graceful stops (luftpause.runtime.pods.operations decides who may).

    def deliver(self, run: Run, content: str, sender: str, message_id: str) -> bool:
        """Give ``run`` a user message (journaled first as a ``message`` record): an idle run is
        re-opened with it (``True``: the caller starts its loop again), a running one gets it in
        its inbox for its next turn (``False``). Raises ``ValueError`` for a stopped run."""
        if run.pod_state == "stopped":
            raise ValueError(f"run {run.handle} is stopped; it takes no messages")
        if run.conversation_dropped:
            raise ValueError(CONVERSATION_DROPPED.format(handle=run.handle))
        self.append(
            run,
            {"type": "message", "handle": run.handle, "id": message_id, "content": content, "from": sender},
        )
        return self._take_message(run, content, sender, message_id)

    def _take_message(self, run: Run, content: str, sender: str, message_id: str) -> bool:
        self.version += 1
        if run.done:
            run.reopen({"role": "user", "content": content})
            self._ended_at.pop(run.handle, None)
            self._unretain(run)
            return True
        run.inbox.append({"id": message_id, "content": content, "from": sender})
        return False

    def request_stop(self, run: Run, by: str) -> None:
        """Mark ``run`` to stop after its current turn (journaled); an idle run is stopped at
        once (its state stays as it finished). Does nothing to a stopped run."""
        if run.pod_state == "stopped":
            return
        run.stopped_by = by
        self.append(run, {"type": "stop", "handle": run.handle, "by": by})
        self.version += 1
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

    def _check_budgets(self, run: Run, ahead: dict[str, float] | None = None) -> None:
        found = first_exceeded(run, self._runs, time.time(), ahead)
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
        """Every held run with its own and subtree costs (:func:`~luftpause.runtime.runs.views.run_tree`)."""
        return run_tree(self)

    # The journal.

    def journal_snapshot(self) -> Iterator[dict[str, Any]]:
        """Records that rebuild every held run (:func:`~luftpause.runtime.runs.replay.journal_snapshot`)."""
        return journal_snapshot(self)

    def _replay(self, journal: Journal) -> list[Run]:
        return replay_journal(self, journal)

    def evict_expired(self) -> int:
        """Drop the finished runs whose retention time has passed, then the oldest finished ones
        beyond ``max_finished``; returns how many were dropped. Running runs are never dropped,
        nor the finished ancestors of a running run: their budgets still bound it (and the
        chain of parents is how they are found)."""
        cutoff = self._clock() - self.retention_seconds
        dropped = 0
        over = len(self._ended_at) - self.max_finished
        protected: set[str] | None = None
        oldest = next(iter(self._ended_at.values()), None)
        # The usual case first, without copying: the oldest finished run is not due yet.
        due = list(self._ended_at.items()) if oldest is not None and (oldest <= cutoff or over > 0) else []
        for handle, ended in due:
            if ended > cutoff and over <= 0:
                break
            if protected is None:
                protected = {
                    a.handle for r in self._runs.values() if not r.done for a in ancestors(r, self._runs)
                }
            if handle in protected:
                continue
            over -= 1
            self._forget(handle)
            dropped += 1
        if self.retained_total > self.retained_bytes:
            dropped += self._within_bytes()
        while len(self._expired) > self.max_expired_handles:
            del self._expired[next(iter(self._expired))]
        return dropped

    def _forget(self, handle: str) -> None:
        del self._ended_at[handle]
        run = self._runs.pop(handle, None)
        if run is not None:
            self._unretain(run)
        self._expired[handle] = None
        self.version += 1
        for listener in self.on_evict:
            listener(handle)

    def _within_bytes(self) -> int:
        """Bring :attr:`retained_total` within :attr:`retained_bytes`: drop the conversations of
        the least recently finished runs, then forget the least recently finished (never the
        finished ancestors of a running run). Returns how many runs were forgotten."""
        while self.retained_total > self.retained_bytes and self._full:
            handle = next(iter(self._full))
            run = self._runs[handle]
            drop_conversation(run)
            self._retain(run)
            self.version += 1
        if self.retained_total <= self.retained_bytes:
            return 0
        protected = {a.handle for r in self._runs.values() if not r.done for a in ancestors(r, self._runs)}
        forgotten = 0
        for handle in list(self._ended_at):
            if self.retained_total <= self.retained_bytes:
                break
            if handle not in protected:
                self._forget(handle)
                forgotten += 1
        return forgotten

    def _missing(self, handle: str) -> ExpiredRun | UnknownRun:
        if handle in self._expired:
            return ExpiredRun(handle, self.retention_seconds, self.max_finished, self.retained_bytes)
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

    @property
    def changed_event(self) -> asyncio.Event:
        """The event the next change sets (:meth:`notify_changed` replaces it)."""
        return self._changed

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
        return await wait_for_runs(self, runs, mode, seconds, on_progress, progress_interval, interrupt)
