"""The ``luftpause.v1.Scheduler`` gRPC service (``proto/luftpause/v1/scheduler.proto``).

One ``Connect`` stream per dataplane. Each message it carries becomes a core event (stamped with
the host's monotonic clock) and each answer comes from the core's actions:

* the first message, ``resync`` -> ``Resynced``; answered ``resynced{runs, turns}`` before anything
  else on the stream is read. A stream that opens with anything else is refused
  (``FAILED_PRECONDITION``).
* ``admit`` -> ``TurnArrived``; answered ``admitted{turn_id, placed{replica} | refused{reason,
  http_status}}`` whenever the core decides, so many admissions are outstanding at once and their
  answers come in decision order. An admit the core fails on is refused with 503 rather than
  ending the stream (and with it every other admission).
* ``cancel`` -> ``TurnAbandoned`` (through :meth:`SchedulerHost.abandon`: a held turn leaves the
  queue, a placement that crossed the cancel frees its slot).
* ``event`` -> ``TurnStarted`` / ``FirstToken`` / ``TurnFinished`` / ``TurnFailed`` /
  ``AbandonReported`` (ABANDONED) / ``RunEnded``. An ABANDONED turn whose admit still waits here is
  answered ``refused{"turn was abandoned by its dataplane", 499}``.

When a stream ends (the dataplane closed it, or it broke, or the scheduler is stopping) the
admissions still waiting on it are abandoned, and when it was the last open stream of its dataplane,
``DataplaneLost``: if the dataplane does not resync within the grace, the turns placed for it are
released. A reconnecting dataplane's new stream is counted open from its resync on, so an old
stream seen to end after that loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import grpc

from luftpause.scheduler.core import (
    AbandonReported,
    AckResync,
    DataplaneLost,
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
from luftpause.scheduler.host import Answer, Outcome, SchedulerHost
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

log = logging.getLogger("luftpause.scheduler")

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
    _Context = grpc.aio.ServicerContext[pb.DataplaneMessage, pb.SchedulerMessage]


def run_phase(value: int) -> RunPhase:
    """Proto ``RunPhase`` -> the core's (unspecified or unknown values count as ``idle``)."""
    return _PHASES.get(value, "idle")


def resynced(request: pb.ResyncRequest, at: float) -> Resynced:
    """A dataplane's resync as the core's ``Resynced`` event at ``at`` (monotonic seconds)."""
    return Resynced(
        request.dataplane_id,
        at,
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


def turn_event(message: pb.TurnEvent, at: float) -> Event | None:
    """A ``TurnEvent`` as the core's event at ``at``; None for a kind this scheduler does not know."""
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


def admitted(outcome: Outcome) -> pb.SchedulerMessage:
    """The stream message answering an admission with the core's ``Place`` or ``Reject``."""
    if isinstance(outcome, Place):
        reply = pb.AdmitReply(turn_id=outcome.turn_id, placed=pb.Placement(replica=outcome.replica))
    else:
        reply = pb.AdmitReply(
            turn_id=outcome.turn_id,
            refused=pb.Refusal(reason=outcome.reason, http_status=outcome.http_status),
        )
    return pb.SchedulerMessage(admitted=reply)


class _Stream:
    """One dataplane's ``Connect`` stream: its outgoing messages and its admissions still waiting."""

    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        # Unbounded by count, bounded in fact: one answer per admission the dataplane sent.
        self.outbox: asyncio.Queue[pb.SchedulerMessage] = asyncio.Queue()
        self.waiting: dict[str, Answer] = {}

    def admit(self, request: pb.AdmitRequest) -> None:
        turn_id = request.turn_id
        if turn_id in self.waiting:
            return  # sent twice on one stream: the first admission's answer serves both

        def answer(outcome: Outcome) -> None:
            self.waiting.pop(turn_id, None)
            self.outbox.put_nowait(admitted(outcome))

        self.waiting[turn_id] = answer
        arrived = TurnArrived(
            turn_id,
            request.run_id,
            request.model,
            service_class(request.service_class),
            request.caller,
            request.dataplane_id,
            self.host.now(),
            single_pass=request.single_pass,
        )
        try:
            self.host.arrive(arrived, answer)
        except Exception as exc:
            # One admission the core fails on must not end the stream, and every admission with it.
            log.exception("admit %s failed", turn_id)
            if turn_id in self.waiting:
                self.host.drop(turn_id, answer)
                del self.waiting[turn_id]
                reply = pb.AdmitReply(
                    turn_id=turn_id,
                    refused=pb.Refusal(reason=f"scheduler failed: {type(exc).__name__}", http_status=503),
                )
                self.outbox.put_nowait(pb.SchedulerMessage(admitted=reply))

    def cancel(self, turn_id: str) -> None:
        # Answered already (the placement crossed the cancel on the wire): undone all the same.
        self.host.abandon(turn_id, self.waiting.pop(turn_id, None))

    def close(self) -> None:
        """The stream ended: the admissions still waiting on it are abandoned."""
        waiting, self.waiting = self.waiting, {}
        for turn_id, answer in waiting.items():
            self.host.abandon(turn_id, answer)


async def _read(context: _Context) -> pb.DataplaneMessage | None:
    """The stream's next message; None once the dataplane has closed its side (``grpc.aio.EOF``)."""
    message: object = await context.read()
    return message if isinstance(message, pb.DataplaneMessage) else None


class SchedulerService(pb_grpc.SchedulerServicer):  # type: ignore[misc]  # untyped generated base
    """Serves ``Connect`` streams from one :class:`SchedulerHost`."""

    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        self._open: dict[str, int] = {}
        """Dataplane id -> its resynced streams open now (a reconnect may resync on the new stream
        before the old one is seen to end, so a count, not a flag)."""

    async def Connect(self, requests: Any, context: _Context) -> None:
        stream = _Stream(self.host)
        writer = asyncio.create_task(self._write(stream.outbox, context), name="luftpause-connect-writer")
        dataplane_id: str | None = None
        try:
            first = await _read(context)
            if first is None:
                return
            if first.WhichOneof("message") != "resync":
                refusal = "the first message of a Connect stream must be its resync"
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
            dataplane_id = first.resync.dataplane_id
            for action in self.host.feed(resynced(first.resync, self.host.now())):
                if isinstance(action, AckResync):
                    stream.outbox.put_nowait(
                        pb.SchedulerMessage(resynced=pb.ResyncReply(runs=action.runs, turns=action.turns))
                    )
            self._open[dataplane_id] = self._open.get(dataplane_id, 0) + 1
            while (message := await _read(context)) is not None:
                self._apply(message, stream)
        finally:
            # closed, broken (an error from the read) or cancelled (the peer is gone): all the same
            writer.cancel()
            stream.close()
            if dataplane_id is not None:
                self._stream_ended(dataplane_id)
            await asyncio.gather(writer, return_exceptions=True)

    def _apply(self, message: pb.DataplaneMessage, stream: _Stream) -> None:
        kind = message.WhichOneof("message")
        if kind == "admit":
            stream.admit(message.admit)
        elif kind == "event":
            event = turn_event(message.event, self.host.now())
            if event is not None:
                self.host.feed(event)
        elif kind == "cancel":
            stream.cancel(message.cancel.turn_id)
        elif kind == "resync":
            log.warning("a second resync on one stream of %s is ignored", message.resync.dataplane_id)
        # None: a kind from a newer dataplane (a lease, say), which this scheduler does not offer

    def _stream_ended(self, dataplane_id: str) -> None:
        if not dataplane_id:
            return  # a dataplane that names itself "" is never taken as lost
        left = self._open[dataplane_id] - 1
        if left:
            self._open[dataplane_id] = left
        else:
            del self._open[dataplane_id]
            self.host.feed(DataplaneLost(dataplane_id, self.host.now()))

    @staticmethod
    async def _write(outbox: asyncio.Queue[pb.SchedulerMessage], context: _Context) -> None:
        while True:
            await context.write(await outbox.get())
