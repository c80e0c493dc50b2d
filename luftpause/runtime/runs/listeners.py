"""What the parts that keep state beside the runs implement to follow their lives: the
:class:`RunListener` protocol. The registry (:mod:`luftpause.runtime.runs.registry`) is given its
listeners when it is built (pods' scopes, notifications, tree depths) and calls them; the journal's
replay (:mod:`luftpause.runtime.runs.replay`) hands them their records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from luftpause.runtime.runs.journal import Record
from luftpause.runtime.runs.record import Run


class RunListener(Protocol):
    """A part that keeps state beside the runs and follows their lives (pods' scopes,
    notifications, tree depths). Called on the event loop; must not raise, but for :meth:`replay`."""

    record_types: frozenset[str]
    """The journal record types it owns: replayed to it, never read as a run's."""

    def replay(self, record: Record) -> None:
        """Every journal record at start, in order: its own and the runs' (it may read those too).
        A record of its own it cannot apply raises (``KeyError``, ``TypeError``, ``ValueError`` or
        a :class:`~luftpause.runtime.errors.RuntimeFault`): the replay counts it as damage."""

    def replayed(self, runs: Mapping[str, Run]) -> None:
        """The replay is over; ``runs`` are the runs held now, by handle."""

    def run_ended(self, run: Run) -> None:
        """``run`` finished (not one replayed, nor one the shutdown interrupted), or an idle run was
        stopped."""

    def run_dropped(self, handle: str) -> None:
        """The run ``handle`` left the registry: a finished run retention dropped, or a run (maybe
        running) another runtime sharing the store took over (:mod:`~luftpause.runtime.runs.held`).
        Forget it; a record written about it then is refused by fencing, never stored."""

    def snapshot(self) -> Iterable[Record]:
        """Its records that rebuild its state, for a compaction (lists copied)."""
