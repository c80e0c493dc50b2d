"""A turn's admission: the replica the scheduler (or a capacity lease) gives it, or the refusal.

Placed at once under a lease when one allows it (no round trip, the turn reported after:
:meth:`~luftpause.dataplane.link.admission.SchedulerLink.place_leased`); else an ``Admit`` is sent
and the turn is held until its answer. While it is held its client leaving must take it out of the
queue at once (the caller watches for that before awaiting :meth:`Placement.admit`). A refusal
becomes the error the client gets (429 with ``Retry-After`` for a protection limit, the
scheduler's status else); a turn given up before any engine saw it is reported ``ABANDONED``, so
the scheduler undoes what it did with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc.aio

from luftpause.dataplane.errors import DataplaneError, TooManyRequests
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.observe.metrics import DataplaneMetrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.turn import Turn
from luftpause.observe import tracing
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Placement"]


class Placement:
    """``Placement(link, runs, metrics)``: admits turns over ``link``; forgets a run made up for a
    turn that never reached a replica (``runs``); counts refused and abandoned turns. ``held``:
    turns whose ``Admit`` is out now."""

    def __init__(self, link: SchedulerLink, runs: RunTable, metrics: DataplaneMetrics) -> None:
        self.link = link
        self.runs = runs
        self.metrics = metrics
        self.held = 0

    def leased(self, turn: Turn) -> str | None:
        """The replica a capacity lease places ``turn`` on at once, or ``None`` (it must ask; a
        single-pass turn always asks, and so does one whose run the scheduler must name)."""
        if turn.single_pass or turn.ask_ids:
            # Not a turn whose run the scheduler must name first (run_identity).
            return None
        return self.link.place_leased(
            turn.turn_id, turn.run_id, turn.model, turn.service_class, turn.caller, turn.traceparent
        )

    async def admit(self, turn: Turn, failover_from: str = "", span: Span | None = None) -> tuple[str, Turn]:
        """Ask the scheduler to place ``turn``: the replica's name, and the turn as admitted: the
        same, or, for a turn that asked which run emitted the tool calls it answers
        (``Turn.ask_ids``), that run when the scheduler named another (maybe relayed by another
        worker or dataplane), instead of the one made up for it. ``failover_from``: the replica
        that failed it before answering, when it comes again. Raises :class:`DataplaneError` when
        the scheduler refuses the turn (:class:`TooManyRequests` for a protection limit) or the
        link fails (503); cancellation (the client left) reports the turn abandoned (on ``span``
        too, the turn's own while tracing is active)."""
        request = pb.AdmitRequest(
            turn_id=turn.turn_id,
            run_id=turn.run_id,
            model=turn.model,
            service_class=turn.service_class,  # type: ignore[arg-type]
            caller=turn.caller,
            dataplane_id=self.link.dataplane_id,
            single_pass=turn.single_pass,
            failover_from=failover_from,
        )
        if turn.traceparent:
            request.traceparent = turn.traceparent
        if turn.ask_ids:
            request.tool_call_ids.extend(turn.ask_ids)
        self.held += 1
        try:
            reply = await self.link.admit(request, leased_first=False)
        except BaseException as exc:
            # The client left (or the link failed) while the Admit was out: the placement may cross
            # the cancel on the wire, so tell the scheduler to undo whatever it did.
            self.abandoned(turn, span)
            if isinstance(exc, grpc.aio.AioRpcError):
                self.metrics.turn_ended("failed", turn.service_class)
                raise DataplaneError(f"scheduler failed: {exc.code().name}: {exc.details()}", 503) from None
            self.metrics.turn_ended("abandoned", turn.service_class)
            raise
        finally:
            self.held -= 1
        if reply.WhichOneof("outcome") == "refused":
            if turn.new_run:
                self.runs.forget_unplaced(turn.run_id)  # unknown model and the like: nothing recorded
            self.metrics.turn_ended("refused", turn.service_class)
            if reply.refused.http_status == 429:  # a protection limit: Retry-After with it
                raise TooManyRequests(reply.refused.reason, reply.refused.retry_after_s or 1)
            raise DataplaneError(reply.refused.reason, reply.refused.http_status or 503)
        if turn.ask_ids:
            if reply.run_id and reply.run_id != turn.run_id:
                # The scheduler knew the tool calls answered: the run that emitted them, maybe on
                # another worker or dataplane, goes on here instead of the one made up.
                self.runs.forget_unplaced(turn.run_id)
                return reply.placed.replica, turn.named(reply.run_id)
            return reply.placed.replica, turn.named(turn.run_id, made_up=turn.new_run)
        return reply.placed.replica, turn

    def abandoned(self, turn: Turn, span: Span | None = None) -> None:
        """``turn`` was given up before any engine saw it: the scheduler undoes what it did with
        it, and a run made up for it is forgotten."""
        if span is not None:
            span.set_attribute("luftpause.abandoned", True)
        event = pb.TurnEvent(turn_id=turn.turn_id, run_id=turn.run_id, kind=pb.TurnEvent.ABANDONED)
        if turn.traceparent:
            event.trace_id = tracing.trace_id_of(turn.traceparent)
        self.link.report(event, "")
        if turn.new_run:
            self.runs.forget_unplaced(turn.run_id)
