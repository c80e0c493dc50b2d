"""The dataplanes a scheduler serves, as its shell sees them, and which run emitted each tool call.

Several dataplanes may share one scheduler, and a dataplane of several workers is several
dataplanes to it (one ``Connect`` stream and one dataplane id per worker; docs/architecture.md
"Several workers and several dataplanes"). Two things live here, beside the pure core, because
they are bookkeeping about the links rather than placement decisions:

* **Who is there.** Per dataplane id: its open streams, when it was first and last heard from
  (any item read counts, pings included), and how many turns it brought (admitted or placed
  under a lease). ``GET /status`` shows them with the turns the core holds and has placed for
  each (:meth:`Dataplanes.status`). A dataplane gone for longer than ``FORGET_GONE_S`` with
  nothing placed for it is forgotten.
* **Which run emitted a tool call.** A finished turn's event carries the tool-call ids it emitted
  (``TurnEvent.tool_call_ids``; a resync carries each tool-paused run's,
  ``RunRecord.tool_call_ids``), remembered under its run in the same bounded
  ``tool_call_id -> run`` table a dataplane keeps (:mod:`luftpause.tool_calls`, shared: the
  ttl is ``[scheduler] run_expiry_s``, at most ``DEFAULT_MAX_ENTRIES`` ids). An admission whose
  dataplane did not know the ids its request answers sends them (``AdmitRequest.tool_call_ids``)
  and is admitted as the run found (:meth:`Dataplanes.run_of`): an agent that sends no run id
  keeps its run, and so its replica, whichever worker or dataplane its next turn reaches. A run
  ended (``RUN_ENDED``) is found by its ids no more until a turn names it again, as on a dataplane.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from luftpause.scheduler.core import State
from luftpause.tool_calls import ToolCallTable

__all__ = ["FORGET_GONE_S", "MAX_ENDED_RUNS", "DataplaneSeen", "Dataplanes"]

FORGET_GONE_S = 3600.0
"""Seconds after its last stream ended that a dataplane with no turn placed for it leaves the list."""
MAX_ENDED_RUNS = 100_000
"""Ended runs remembered (their tool-call ids resolve to them no more), oldest first out."""


@dataclass(slots=True)
class DataplaneSeen:
    """One dataplane id as the shell saw it; times are the host's monotonic seconds."""

    dataplane_id: str
    first_seen: float
    last_seen: float
    streams: int = 0
    """Its resynced ``Connect`` streams open now (a reconnect may overlap the old stream)."""
    turns: int = 0
    """Turns it brought since it was first seen: admissions (a failover's included) and turns it
    placed under a lease."""


class Dataplanes:
    """The dataplanes seen and the ``tool_call_id -> run`` table (see the module docstring).

    ``ttl_s``: seconds a tool-call id is remembered (``[scheduler] run_expiry_s``).
    """

    def __init__(self, ttl_s: float) -> None:
        self.seen: dict[str, DataplaneSeen] = {}
        self.tool_calls = ToolCallTable(ttl_s=ttl_s)
        self.ended: dict[str, float] = {}
        """Run id -> when it ended (``RUN_ENDED``), oldest first; at most ``MAX_ENDED_RUNS``."""
        self.asked = 0
        """Admissions that sent tool-call ids to look up."""
        self.found = 0
        """Of those, admissions whose ids named a run (taken as that run's)."""

    # -- the links -------------------------------------------------------------------------------

    def connected(self, dataplane_id: str, now: float) -> DataplaneSeen:
        """A stream of ``dataplane_id`` was resynced at ``now``: its record, to mark it heard."""
        seen = self.seen.get(dataplane_id)
        if seen is None:
            seen = self.seen[dataplane_id] = DataplaneSeen(dataplane_id, now, now)
        seen.streams += 1
        seen.last_seen = now
        return seen

    @staticmethod
    def disconnected(seen: DataplaneSeen, now: float) -> None:
        """One of ``seen``'s streams ended at ``now``."""
        seen.streams = max(0, seen.streams - 1)
        seen.last_seen = now

    # -- run identity ----------------------------------------------------------------------------

    def remember(self, run_id: str, ids: Iterable[str], now: float) -> None:
        """Run ``run_id`` emitted the tool calls ``ids`` (a finished turn's, or a resync's)."""
        if run_id:
            self.tool_calls.remember(run_id, ids, now)

    def run_of(self, ids: Iterable[str], now: float) -> str | None:
        """The run that most recently emitted one of ``ids`` and has not ended, else ``None``."""
        self.asked += 1
        found: str | None = self.tool_calls.lookup(list(ids), now)
        if found is None or found in self.ended:
            return None
        self.found += 1
        return found

    def run_named(self, run_id: str) -> None:
        """A turn named ``run_id`` (by its client, or as found here): if it had ended, its tool-call
        ids count again."""
        if self.ended:
            self.ended.pop(run_id, None)

    def run_ended(self, run_id: str, now: float) -> None:
        """``run_id`` ended (``DELETE /v1/runs/{id}`` on some dataplane)."""
        ended = self.ended
        ended.pop(run_id, None)
        ended[run_id] = now
        if len(ended) > MAX_ENDED_RUNS:
            del ended[next(iter(ended))]

    def prune(self, state: State, now: float) -> None:
        """Forget expired tool-call ids, ended runs older than their ttl, and dataplanes gone for
        ``FORGET_GONE_S`` with nothing placed for them."""
        self.tool_calls.prune(now)
        ended, horizon = self.ended, now - self.tool_calls.ttl_s
        while ended and next(iter(ended.values())) < horizon:
            del ended[next(iter(ended))]
        stale = [
            seen.dataplane_id
            for seen in self.seen.values()
            if not seen.streams and now - seen.last_seen > FORGET_GONE_S
        ]
        if stale:
            busy = {placed.dataplane_id for placed in state.placed.values()}
            for dataplane_id in stale:
                if dataplane_id not in busy:
                    del self.seen[dataplane_id]

    # -- GET /status -----------------------------------------------------------------------------

    def status(self, state: State, now: float) -> dict[str, Any]:
        """``GET /status``'s ``dataplanes`` (each dataplane seen, by id) and ``tool_call_runs``::

        "dataplanes": [{"id": str, "connected": bool, "streams": int,
                        "turns_in_flight": int,   # placed for it and not ended
                        "turns_held": int,        # its admissions waiting for a slot
                        "turns_total": int,       # admitted or leased since first seen
                        "last_seen_s": float,     # seconds since it was last heard from
                        "lost_s": float | None}]  # seconds since its last stream ended, while
                                                  # the core counts it lost (its grace runs)
        "tool_call_runs": {"ids": int, "asked": int, "found": int, "ended_runs": int}
        """
        in_flight: dict[str, int] = {}
        for placed in state.placed.values():
            in_flight[placed.dataplane_id] = in_flight.get(placed.dataplane_id, 0) + 1
        held: dict[str, int] = {}
        for waiting in state.held:
            held[waiting.dataplane_id] = held.get(waiting.dataplane_id, 0) + 1
        listed = []
        for seen in sorted(self.seen.values(), key=lambda s: s.dataplane_id):
            lost_at = state.lost_dataplanes.get(seen.dataplane_id)
            listed.append(
                {
                    "id": seen.dataplane_id,
                    "connected": seen.streams > 0,
                    "streams": seen.streams,
                    "turns_in_flight": in_flight.get(seen.dataplane_id, 0),
                    "turns_held": held.get(seen.dataplane_id, 0),
                    "turns_total": seen.turns,
                    "last_seen_s": max(0.0, now - seen.last_seen),
                    "lost_s": None if lost_at is None else max(0.0, now - lost_at),
                }
            )
        return {
            "dataplanes": listed,
            "tool_call_runs": {
                "ids": len(self.tool_calls),
                "asked": self.asked,
                "found": self.found,
                "ended_runs": len(self.ended),
            },
        }
