"""What a dataplane knows about runs and in-flight turns, kept for Resync.

On every (re)connect the dataplane hands this to the scheduler before any new admission, so that
affinity (each run's last replica and phase) and capacity counts (in-flight turns) survive a
scheduler restart (docs/architecture.md "Resync"). Runs with no turn for ``RUN_IDLE_EXPIRY_S``
(``[dataplane] run_expiry_s``) are pruned, and the table holds at most ``MAX_RUNS`` runs: past it
the least recently active run is forgotten (the runs dict is kept in order of activity, oldest
first). A forgotten run loses only its affinity hint at the next scheduler restart (and the use of a
lease for its next turn, which then asks).

The resync is built in two steps so that a large table never stalls the event loop for long: an
atomic snapshot of plain tuples (:meth:`RunTable.snapshot`), then ``ResyncRequest`` parts of at most
``RESYNC_PART_RUNS`` runs each (:func:`resync_parts`), built between other work and sent one per
message (``ResyncRequest.more_follows``), each far below gRPC's 64 MiB message limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from luftpause.v1 import scheduler_pb2 as pb

RUN_IDLE_EXPIRY_S = 30 * 60.0
MAX_RUNS = 100_000
"""Runs the table holds; past it the least recently active run is forgotten. About 0.4 KB each
at the largest ids (256-byte run id, 128-byte caller): 40 MB at most."""
RESYNC_PART_RUNS = 2_000
"""Runs (and in-flight turns) per resync part: about 0.8 MB at most per message, and a few
milliseconds of building between two yields to the loop."""

_RunRow = tuple[str, str, int, int, str, tuple[str, ...]]
"""A run as snapshotted: run id, last replica, phase, service class, caller, the tool-call ids its
last turn emitted."""
_TurnRow = tuple[str, str, str, str, int, str]
"""An in-flight turn as snapshotted: turn id, run id, replica, model, service class, caller."""


@dataclass(slots=True)
class RunRecord:
    run_id: str
    service_class: int
    caller: str
    last_replica: str = ""
    phase: int = pb.IDLE
    last_seen: float = 0.0
    tool_call_ids: tuple[str, ...] = ()
    """The tool-call ids its last turn emitted (while it is tool-paused): in the resync, so that a
    restarted scheduler finds the run by them again for whichever worker or dataplane its next turn
    reaches."""


@dataclass(slots=True)
class InFlight:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: int
    caller: str


@dataclass(slots=True)
class Snapshot:
    """The run table at one instant, as plain tuples (see ``_RunRow``, ``_TurnRow``)."""

    runs: list[_RunRow]
    turns: list[_TurnRow]


@dataclass(slots=True)
class RunTable:
    """Runs by id (oldest activity first) and in-flight turns by turn id; times are
    ``loop.time()`` seconds. ``max_runs`` bounds the runs; ``evicted`` counts runs forgotten for it."""

    runs: dict[str, RunRecord] = field(default_factory=dict)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    max_runs: int = MAX_RUNS
    evicted: int = 0
    idle_expiry_s: float = RUN_IDLE_EXPIRY_S
    """Seconds with no turn after which :meth:`prune` forgets a run (``[dataplane] run_expiry_s``)."""

    def _add(self, run: RunRecord) -> None:
        runs = self.runs
        runs[run.run_id] = run
        if len(runs) > self.max_runs:
            del runs[next(iter(runs))]  # the least recently active
            self.evicted += 1

    def placed(self, turn: InFlight, now: float) -> None:
        """The scheduler placed ``turn``: the run is generating on that replica (most recent now)."""
        run = self.runs.pop(turn.run_id, None)
        if run is None:
            run = RunRecord(turn.run_id, turn.service_class, turn.caller)
        run.last_replica = turn.replica
        run.phase = pb.GENERATING
        run.last_seen = now
        self._add(run)
        self.inflight[turn.turn_id] = turn

    def ended(self, turn_id: str, tool_calls: bool, now: float, tool_call_ids: tuple[str, ...] = ()) -> bool:
        """The turn finished (``tool_calls``: the run pauses on a tool, on the calls
        ``tool_call_ids``) or failed (False).

        Returns False when the turn was not in flight (already ended), so it is reported once.
        """
        turn = self.inflight.pop(turn_id, None)
        if turn is None:
            return False
        run = self.runs.pop(turn.run_id, None)
        if run is not None:
            run.phase = pb.TOOL_PAUSED if tool_calls else pb.IDLE
            run.tool_call_ids = tool_call_ids
            run.last_seen = now
            self.runs[turn.run_id] = run  # the most recently active now
        return True

    def new_run(self, run_id: str, service_class: int, caller: str, now: float) -> None:
        """A run this dataplane just made up (no header, no known tool call): idle, on no replica.

        Recorded before its first turn is admitted, so that the turn may be placed under a capacity
        lease (the scheduler cannot know a run nobody has named yet); :meth:`forget_unplaced`
        drops it again when that turn is refused or given up.
        """
        if run_id not in self.runs:
            self._add(RunRecord(run_id, service_class, caller, last_seen=now))

    def forget_unplaced(self, run_id: str) -> None:
        """Forget a run made up by :meth:`new_run` whose first turn never reached a replica."""
        run = self.runs.get(run_id)
        if run is not None and not run.last_replica:
            del self.runs[run_id]

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def prune(self, now: float) -> int:
        """Drop runs idle for longer than ``idle_expiry_s`` with nothing in flight."""
        busy = {t.run_id for t in self.inflight.values()}
        expiry = self.idle_expiry_s
        stale = [rid for rid, r in self.runs.items() if rid not in busy and now - r.last_seen > expiry]
        for rid in stale:
            del self.runs[rid]
        return len(stale)

    def snapshot(self) -> Snapshot:
        """The table now, as tuples: cheap to take at once, built into a resync later."""
        return Snapshot(
            [
                (r.run_id, r.last_replica, r.phase, r.service_class, r.caller, r.tool_call_ids)
                for r in self.runs.values()
            ],
            [
                (t.turn_id, t.run_id, t.replica, t.model, t.service_class, t.caller)
                for t in self.inflight.values()
            ],
        )

    def resync_request(
        self, dataplane_id: str, pending: Iterable[str] = (), takes_leases: bool = False
    ) -> pb.ResyncRequest:
        """This table as one whole Resync (for small tables and tests; the link sends
        :func:`resync_parts`); ``pending`` are the turn ids whose Admit is still out;
        ``takes_leases``: the dataplane places turns under capacity leases."""
        snapshot = self.snapshot()
        return _part(dataplane_id, takes_leases, list(pending), snapshot.runs, snapshot.turns, False)


def _part(
    dataplane_id: str,
    takes_leases: bool,
    pending: list[str],
    runs: list[_RunRow],
    turns: list[_TurnRow],
    more_follows: bool,
) -> pb.ResyncRequest:
    return pb.ResyncRequest(
        dataplane_id=dataplane_id,
        takes_leases=takes_leases,
        pending_turn_ids=pending,
        more_follows=more_follows,
        runs=[
            pb.RunRecord(
                run_id=r[0],
                last_replica=r[1],
                phase=r[2],  # type: ignore[arg-type]  # an int of the proto enum
                service_class=r[3],  # type: ignore[arg-type]
                caller=r[4],
                tool_call_ids=r[5],
            )
            for r in runs
        ],
        turns=[
            pb.InFlightTurn(
                turn_id=t[0],
                run_id=t[1],
                replica=t[2],
                model=t[3],
                service_class=t[4],  # type: ignore[arg-type]  # an int of the proto enum
                caller=t[5],
            )
            for t in turns
        ],
    )


async def resync_parts(
    snapshot: Snapshot,
    dataplane_id: str,
    pending: list[str],
    takes_leases: bool,
    per_part: int = RESYNC_PART_RUNS,
) -> list[pb.ResyncRequest]:
    """``snapshot`` as a Resync in parts of at most ``per_part`` runs and ``per_part`` turns, every
    part but the last saying ``more_follows``; the first carries ``pending``. Yields to the loop
    after each part, so a table of 100,000 runs never holds it for more than a part's building."""
    parts: list[pb.ResyncRequest] = []
    runs, turns = snapshot.runs, snapshot.turns
    count = max(1, -(-len(runs) // per_part), -(-len(turns) // per_part))
    for i in range(count):
        window = slice(i * per_part, (i + 1) * per_part)
        parts.append(
            _part(
                dataplane_id,
                takes_leases,
                pending if i == 0 else [],
                runs[window],
                turns[window],
                i < count - 1,
            )
        )
        if i < count - 1:
            await asyncio.sleep(0)
    return parts
