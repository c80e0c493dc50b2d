"""The ``luftpause.v1.Scheduler`` gRPC service (``proto/luftpause/v1/scheduler.proto``).

Each RPC becomes core events (stamped with the host's monotonic clock) and each answer comes from
the core's actions:

* ``Admit`` -> ``TurnArrived``; replies ``placed{replica}`` or ``refused{reason, http_status}``;
  a call cancelled before its answer -> ``TurnAbandoned``.
* ``Report`` (client stream of ``TurnEvent``) -> ``TurnStarted`` / ``FirstToken`` / ``TurnFinished``
  / ``TurnFailed`` / ``AbandonReported`` (ABANDONED) / ``RunEnded``; replies
  ``ReportSummary{events}`` when the dataplane closes it. An ABANDONED turn whose Admit still waits
  here is answered ``refused{"turn was abandoned by its dataplane", 499}``. A stream that names its
  dataplane (metadata ``x-luftpause-dataplane-id``) -> ``DataplaneReturned`` when it opens and,
  when the last open stream of that dataplane ends (closed, broken or cancelled), ``DataplaneLost``:
  if the dataplane does not come back within the grace, the turns placed for it are released.
* ``Resync`` -> ``Resynced``; replies the counts of runs and in-flight turns taken over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from luftpause.scheduler.core import (
    AbandonReported,
    AckResync,
    DataplaneLost,
    DataplaneReturned,
    Event,
    FirstToken,
    InFlightRecord,
    Place,
    Resynced,
    RunEnded,
    RunPhase,
    RunRecord,
    ServiceClass,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.host import SchedulerHost
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

DATAPLANE_ID_METADATA = "x-luftpause-dataplane-id"
"""gRPC metadata key naming the dataplane of a Report stream (the ``dataplane_id`` of its Resync)."""

_PHASES: dict[int, RunPhase] = {
    pb.RUN_PHASE_UNSPECIFIED: "idle",
    pb.IDLE: "idle",
    pb.GENERATING: "generating",
    pb.TOOL_PAUSED: "tool_paused",
}


def service_class(value: int) -> ServiceClass:
    """Proto ``ServiceClass`` -> the core's: BATCH is ``batch``; anything else ``interactive``."""
    return "batch" if value == pb.BATCH else "interactive"


if TYPE_CHECKING:
    _Context = grpc.aio.ServicerContext[Any, Any]


def run_phase(value: int) -> RunPhase:
    """Proto ``RunPhase`` -> the core's (unspecified or unknown values count as ``idle``)."""
    return _PHASES.get(value, "idle")


def dataplane_of(context: _Context) -> str:
    """The dataplane id a call names in its ``x-luftpause-dataplane-id`` metadata; ``""`` if none.

    Dataplanes older than that metadata send none: their streams are never taken as lost.
    """
    for key, value in context.invocation_metadata() or ():
        if key == DATAPLANE_ID_METADATA:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


class SchedulerService(pb_grpc.SchedulerServicer):  # type: ignore[misc]  # untyped generated base
    """Serves Admit, Report and Resync from one :class:`SchedulerHost`."""

    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        self._open_reports: dict[str, int] = {}
        """Dataplane id -> its Report streams open now (a reconnect may open the new one before the
        old one is seen to end, so a count, not a flag)."""

    async def Admit(self, request: pb.AdmitRequest, context: _Context) -> pb.AdmitReply:
        outcome = await self.host.admit(
            TurnArrived(
                request.turn_id,
                request.run_id,
                request.model,
                service_class(request.service_class),
                request.caller,
                request.dataplane_id,
                self.host.now(),
            )
        )
        if isinstance(outcome, Place):
            return pb.AdmitReply(placed=pb.Placement(replica=outcome.replica))
        return pb.AdmitReply(refused=pb.Refusal(reason=outcome.reason, http_status=outcome.http_status))

    async def Report(
        self, request_iterator: AsyncIterator[pb.TurnEvent], context: _Context
    ) -> pb.ReportSummary:
        dataplane_id = dataplane_of(context)
        if dataplane_id:
            self._open_reports[dataplane_id] = self._open_reports.get(dataplane_id, 0) + 1
            self.host.feed(DataplaneReturned(dataplane_id, self.host.now()))
        try:
            count = 0
            async for message in request_iterator:
                event = self._event(message)
                if event is not None:
                    self.host.feed(event)
                    count += 1
            return pb.ReportSummary(events=count)
        finally:
            # closed, broken (an error from the iterator) or cancelled (the peer is gone): all the same
            if dataplane_id:
                left = self._open_reports[dataplane_id] - 1
                if left:
                    self._open_reports[dataplane_id] = left
                else:
                    del self._open_reports[dataplane_id]
                    self.host.feed(DataplaneLost(dataplane_id, self.host.now()))

    def _event(self, message: pb.TurnEvent) -> Event | None:
        at = self.host.now()
        kind = message.kind
        if kind == pb.TurnEvent.STARTED:
            return TurnStarted(message.turn_id, at)
        if kind == pb.TurnEvent.FIRST_TOKEN:
            return FirstToken(message.turn_id, at)
        if kind == pb.TurnEvent.FINISHED:
            return TurnFinished(
                message.turn_id,
                at,
                message.finish_reason,
                message.tool_calls,
                message.prompt_tokens,
                message.completion_tokens,
            )
        if kind == pb.TurnEvent.FAILED:
            return TurnFailed(message.turn_id, at, message.error)
        if kind == pb.TurnEvent.ABANDONED:
            return AbandonReported(message.turn_id, at)
        if kind == pb.TurnEvent.RUN_ENDED:
            return RunEnded(message.run_id, at)
        return None  # KIND_UNSPECIFIED or a kind from a newer dataplane: nothing to apply

    async def Resync(self, request: pb.ResyncRequest, context: _Context) -> pb.ResyncReply:
        event = Resynced(
            request.dataplane_id,
            self.host.now(),
            tuple(
                RunRecord(
                    run.run_id,
                    run.last_replica,
                    run_phase(run.phase),
                    service_class(run.service_class),
                    run.caller,
                )
                for run in request.runs
            ),
            tuple(
                InFlightRecord(
                    turn.turn_id,
                    turn.run_id,
                    turn.replica,
                    turn.model,
                    service_class(turn.service_class),
                    turn.caller,
                )
                for turn in request.turns
            ),
            frozenset(request.pending_turn_ids),
        )
        for action in self.host.feed(event):
            if isinstance(action, AckResync):
                return pb.ResyncReply(runs=action.runs, turns=action.turns)
        raise AssertionError("the core answers every Resynced with AckResync")  # pragma: no cover
