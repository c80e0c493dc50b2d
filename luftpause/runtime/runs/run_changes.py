"""The changes to a run, each journaled, that the run registry makes
(:class:`~luftpause.runtime.runs.registry.RunRegistry` is a :class:`RunChanges`): a run's end, its
tool rounds and calls, budgets checked and their subtrees cancelled, messages to a run and
graceful stops (pods), and cancelling a run and its descendants; and what the registry counts of
them (:class:`RunCounts`, ``GET /metrics``).

Each change goes to the store first (``append``: its future, or ``None`` without a store), then
to the run; the registry's listeners hear of ends.
"""

from __future__ import annotations

import concurrent.futures
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from luftpause.runtime.runs.budgets import first_exceeded, subtree
from luftpause.runtime.runs.held import HeldRuns
from luftpause.runtime.runs.listeners import RunListener
from luftpause.runtime.runs.loop_tasks import LoopTasks
from luftpause.runtime.runs.record import BUDGET_KEYS, PendingRound, Run, RunState, take_message
from luftpause.runtime.runs.retention import FinishedRuns

FINAL_STATES: tuple[RunState, ...] = ("completed", "failed", "cancelled")


@dataclass(slots=True)
class RunCounts:
    """What the registry counts since the process started (``GET /metrics``): runs it recorded
    (replayed ones are not new), runs that ended by final state (not those the shutdown
    interrupted: they resume), and subtrees cancelled because a budget ran out, by budget."""

    started: int = 0
    ended: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINAL_STATES, 0))
    budget_cancellations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUDGET_KEYS, 0))


class RunChanges(ABC):
    """The journaled changes to a run (module docstring), over what the registry keeps: its
    :attr:`held` runs, :attr:`counts`, :attr:`listeners`, :attr:`retention` and loop tasks."""

    held: HeldRuns
    counts: RunCounts
    listeners: tuple[RunListener, ...]
    retention: FinishedRuns
    _runs: dict[str, Run]
    _loops: LoopTasks

    @abstractmethod
    def append(self, run: Run, record: dict[str, Any]) -> concurrent.futures.Future[None] | None:
        """Queue ``record`` of ``run`` for the store (the registry's :meth:`RunRegistry.append`)."""

    @abstractmethod
    def notify_changed(self) -> None:
        """Wake every wait to look again."""

    @abstractmethod
    def get(self, handle: str) -> Run:
        """The run with ``handle``; raises ``UnknownRun`` / ``ExpiredRun``."""

    def finish(
        self, run: Run, state: RunState, *, answer: str | None = None, error: str | None = None
    ) -> None:
        """End ``run`` as ``state`` (``completed``, ``failed``, ``cancelled``) once, journaled as an
        ``end`` record (but for a run the shutdown interrupted: it resumes); later calls are
        ignored (the first outcome stands). Its listeners hear of it; waiters wake."""
        if not run.end(state, answer=answer, error=error):
            return
        if not run.interrupted:
            self.append(run, {"type": "end", "handle": run.handle, **run.outcome_record()})
            self.counts.ended[state] = self.counts.ended.get(state, 0) + 1
        self.held.ended(run)
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
        self.held.checkpoint(run, counters)
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
        self.held.fired(run)
        if any(not r.done for r in subtree(run, self._runs)):
            self.check_budgets(run)
