"""What a dataplane knows about runs and in-flight turns, kept for Resync.

On every (re)connect the dataplane hands this to the scheduler before any new admission, so that
affinity (each run's last replica and phase) and capacity counts (in-flight turns) survive a
scheduler restart (DESIGN.md, "Resync"). Runs with no turn for ``RUN_IDLE_EXPIRY_S`` are pruned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from luftpause.v1 import scheduler_pb2 as pb

RUN_IDLE_EXPIRY_S = 30 * 60.0


@dataclass(slots=True)
class RunRecord:
    run_id: str
    service_class: int
    caller: str
    last_replica: str = ""
    phase: int = pb.IDLE
    last_seen: float = 0.0


@dataclass(slots=True)
class InFlight:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: int
    caller: str


@dataclass(slots=True)
class RunTable:
    """Runs by id and in-flight turns by turn id; times are ``loop.time()`` seconds."""

    runs: dict[str, RunRecord] = field(default_factory=dict)
    inflight: dict[str, InFlight] = field(default_factory=dict)

    def placed(self, turn: InFlight, now: float) -> None:
        """The scheduler placed ``turn``: the run is generating on that replica."""
        run = self.runs.get(turn.run_id)
        if run is None:
            run = self.runs[turn.run_id] = RunRecord(turn.run_id, turn.service_class, turn.caller)
        run.last_replica = turn.replica
        run.phase = pb.GENERATING
        run.last_seen = now
        self.inflight[turn.turn_id] = turn

    def ended(self, turn_id: str, tool_calls: bool, now: float) -> bool:
        """The turn finished (``tool_calls``: the run pauses on a tool) or failed (False).

        Returns False when the turn was not in flight (already ended), so it is reported once.
        """
        turn = self.inflight.pop(turn_id, None)
        if turn is None:
            return False
        run = self.runs.get(turn.run_id)
        if run is not None:
            run.phase = pb.TOOL_PAUSED if tool_calls else pb.IDLE
            run.last_seen = now
        return True

    def new_run(self, run_id: str, service_class: int, caller: str, now: float) -> None:
        """A run this dataplane just made up (no header, no known tool call): idle, on no replica.

        Recorded at once, so that its first turn may be placed under a capacity lease: the
        scheduler cannot know a run nobody has named yet.
        """
        if run_id not in self.runs:
            self.runs[run_id] = RunRecord(run_id, service_class, caller, last_seen=now)

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def prune(self, now: float) -> int:
        """Drop runs idle for longer than ``RUN_IDLE_EXPIRY_S`` with nothing in flight."""
        busy = {t.run_id for t in self.inflight.values()}
        stale = [
            rid for rid, r in self.runs.items() if rid not in busy and now - r.last_seen > RUN_IDLE_EXPIRY_S
        ]
        for rid in stale:
            del self.runs[rid]
        return len(stale)

    def resync_request(
        self, dataplane_id: str, pending: Iterable[str] = (), takes_leases: bool = False
    ) -> pb.ResyncRequest:
        """This table as a Resync; ``pending`` are the turn ids whose Admit is still out;
        ``takes_leases``: the dataplane places turns under capacity leases."""
        return pb.ResyncRequest(
            dataplane_id=dataplane_id,
            takes_leases=takes_leases,
            pending_turn_ids=list(pending),
            runs=[
                pb.RunRecord(
                    run_id=r.run_id,
                    last_replica=r.last_replica,
                    phase=r.phase,  # type: ignore[arg-type]
                    service_class=r.service_class,  # type: ignore[arg-type]
                    caller=r.caller,
                )
                for r in self.runs.values()
            ],
            turns=[
                pb.InFlightTurn(
                    turn_id=t.turn_id,
                    run_id=t.run_id,
                    replica=t.replica,
                    model=t.model,
                    service_class=t.service_class,  # type: ignore[arg-type]
                    caller=t.caller,
                )
                for t in self.inflight.values()
            ],
        )
