"""Which finished runs the registry keeps: by age, by count and by bytes.

A finished run (completed, failed, cancelled) is kept for a retention time after it ends (default
one hour), and at most a cap of finished runs is kept (default 10,000, the oldest finished dropped
first). A running run is never dropped, nor a finished ancestor of a running run (its budgets
still bound it, and the chain of parents is how they are found). A dropped run's handle is
remembered (a bounded number of them) so ``await`` / ``status`` can say it expired rather than
that it never existed.

Bytes too (``[runtime] retained_bytes``, default 256 MiB): each finished run is counted for the
bytes of the record compaction writes for it (:func:`~luftpause.runtime.runs.record.retained_size`:
task, system prompt, conversation, answer). Past the budget, the least recently finished runs
first drop their conversation (:func:`~luftpause.runtime.runs.record.drop_conversation`: they keep
state, answer, counters and their newest output entries with their ``read`` indices; ``send`` to
them is refused), then, if that is not enough, the least recently finished are forgotten.

Dropping is lazy: :meth:`FinishedRuns.evict` runs whenever the registry is used (a run added,
finished or looked up), so no timer is needed and memory stays bounded by the caps between uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, MutableMapping

from luftpause.runtime.errors import ExpiredRun, UnknownRun
from luftpause.runtime.runs.budgets import ancestors
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.record import Run, drop_conversation, retained_size

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


class FinishedRuns:
    """The registry's bookkeeping of finished runs (module docstring). ``clock`` gives the time in
    seconds retention is measured in (monotonic by default; a test passes its own); every drop, of
    a run or of a conversation, is a change to the network (``changes``)."""

    def __init__(
        self,
        *,
        retention_seconds: float,
        max_finished: int,
        max_expired_handles: int,
        retained_bytes: int,
        clock: Callable[[], float],
        changes: NetworkChanges,
    ) -> None:
        if not (math.isfinite(retention_seconds) and retention_seconds >= 0):
            raise ValueError(f"retention_seconds must be finite and >= 0, got {retention_seconds!r}")
        if max_finished < 1 or max_expired_handles < 0 or retained_bytes < 1:
            raise ValueError("max_finished and retained_bytes must be >= 1 and max_expired_handles >= 0")
        self.retention_seconds = retention_seconds
        self.max_finished = max_finished
        self.max_expired_handles = max_expired_handles
        self.retained_bytes = retained_bytes
        self.retained_total = 0
        """Bytes counted for the finished runs held (``Retention.retained`` summed)."""
        self.clock = clock
        self.changes = changes
        # Finished runs' handles -> when they ended (on ``clock``), in the order they ended, so the
        # oldest finished is always first.
        self._ended_at: dict[str, float] = {}
        # The finished runs that still hold their conversation, in the order they finished, and
        # the handles dropped, oldest first (dicts used as ordered sets).
        self._full: dict[str, None] = {}
        self._expired: dict[str, None] = {}

    def finished(self, run: Run, ago: float = 0.0) -> None:
        """``run`` ended ``ago`` seconds before now: date it and count its bytes."""
        self._ended_at[run.handle] = self.clock() - ago
        self.recount(run)

    def reopened(self, run: Run) -> None:
        """``run`` runs again (``send``): it is no longer finished, nor counted."""
        self._ended_at.pop(run.handle, None)
        self._uncount(run)

    def release(self, run: Run) -> None:
        """Forget ``run`` without remembering its handle as expired: it left this registry for
        another runtime (:meth:`~luftpause.runtime.runs.held.HeldRuns.release`), not by age."""
        self._ended_at.pop(run.handle, None)
        self._uncount(run)
        self._expired.pop(run.handle, None)
        self.changes.bump()

    def recount(self, run: Run) -> None:
        """Count finished ``run`` toward :attr:`retained_total` (once; its size is taken now)."""
        self._uncount(run)
        run.retention.retained = retained_size(run)
        self.retained_total += run.retention.retained
        if not run.conversation_dropped:
            self._full[run.handle] = None

    def _uncount(self, run: Run) -> None:
        self.retained_total -= run.retention.retained
        run.retention.retained = 0
        self._full.pop(run.handle, None)

    def evict(self, runs: MutableMapping[str, Run]) -> list[str]:
        """Drop from ``runs`` the finished runs whose retention time has passed, then the oldest
        finished ones beyond ``max_finished``, then bring the bytes within ``retained_bytes``;
        the handles dropped, in the order they were."""
        cutoff = self.clock() - self.retention_seconds
        dropped: list[str] = []
        over = len(self._ended_at) - self.max_finished
        protected: set[str] | None = None
        oldest = next(iter(self._ended_at.values()), None)
        # The usual case first, without copying: the oldest finished run is not due yet.
        due = list(self._ended_at.items()) if oldest is not None and (oldest <= cutoff or over > 0) else []
        for handle, ended in due:
            if ended > cutoff and over <= 0:
                break
            if protected is None:
                protected = _ancestors_of_running(runs)
            if handle in protected:
                continue
            over -= 1
            self._forget(runs, handle)
            dropped.append(handle)
        if self.retained_total > self.retained_bytes:
            dropped += self._within_bytes(runs)
        while len(self._expired) > self.max_expired_handles:
            del self._expired[next(iter(self._expired))]
        return dropped

    def _forget(self, runs: MutableMapping[str, Run], handle: str) -> None:
        del self._ended_at[handle]
        run = runs.pop(handle, None)
        if run is not None:
            self._uncount(run)
        self._expired[handle] = None
        self.changes.bump()

    def _within_bytes(self, runs: MutableMapping[str, Run]) -> list[str]:
        """Drop the conversations of the least recently finished runs, then forget the least
        recently finished (never the finished ancestors of a running run), until the bytes fit;
        the handles forgotten."""
        while self.retained_total > self.retained_bytes and self._full:
            run = runs[next(iter(self._full))]
            drop_conversation(run)
            self.recount(run)
            self.changes.bump()
        if self.retained_total <= self.retained_bytes:
            return []
        protected = _ancestors_of_running(runs)
        forgotten = []
        for handle in list(self._ended_at):
            if self.retained_total <= self.retained_bytes:
                break
            if handle not in protected:
                self._forget(runs, handle)
                forgotten.append(handle)
        return forgotten

    def expired(self, handle: str) -> bool:
        """Whether ``handle`` was dropped (and is still remembered)."""
        return handle in self._expired

    def missing(self, handle: str) -> ExpiredRun | UnknownRun:
        """The error for a handle that is not held: expired, or never issued."""
        if handle in self._expired:
            return ExpiredRun(handle, self.retention_seconds, self.max_finished, self.retained_bytes)
        return UnknownRun(handle)


def _ancestors_of_running(runs: MutableMapping[str, Run]) -> set[str]:
    running: Iterable[Run] = (r for r in runs.values() if not r.done)
    return {a.handle for r in running for a in ancestors(r, runs)}
