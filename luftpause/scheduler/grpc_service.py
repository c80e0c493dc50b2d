"""The ``luftpause.v1.Scheduler`` gRPC service (``proto/luftpause/v1/scheduler.proto``).

One ``Connect`` stream per dataplane. Each message is a batch of items, applied in order; each item
becomes a core event (stamped with the host's monotonic clock) and each answer comes from the core's
actions. Answers queued while the stream's writer was busy, or in one loop iteration, go out as one
``SchedulerMessage`` (never held back for a timer):

* the first item, ``resync`` -> ``Resynced``; answered ``resynced{runs, turns}`` before anything
  else on the stream is read. A stream that opens with anything else is refused
  (``FAILED_PRECONDITION``).
* ``admit`` -> ``TurnArrived``, of the run its ``tool_call_ids`` name when they name one
  (:class:`~luftpause.scheduler.dataplanes.Dataplanes`; the answer then says ``run_id``);
  answered ``admitted{turn_id, placed{replica} | refused{reason, http_status}}`` whenever the
  core decides, so many admissions are outstanding at once and their answers come in decision
  order. A placement answered is also the turn's ``TurnStarted``: the dataplane sends the engine
  request as soon as it reads it (or reports the turn ABANDONED), so it sends no STARTED. An
  admit the core fails on is refused with 503 rather than ending the stream (and with it every
  other admission).
* ``leased`` -> ``LeasedTurnPlaced`` (a turn the dataplane placed under a capacity lease, rule 14 of
  the core; its start too). A stream whose resync says ``takes_leases`` gets the core's
  ``GrantLease`` / ``RevokeLease`` for its dataplane as ``lease`` items, in decision order with the
  answers; the newest resynced stream of a dataplane gets them.
* ``ping`` -> ``pong`` with its ``seq``, at once (the dataplane's heartbeat; every ``resynced``
  says ``pongs``). ``resynced`` and every ``pong`` carry ``healthy_replicas``
  (:meth:`SchedulerHost.healthy_replicas`), the dataplane's readiness.
* ``cancel`` -> ``TurnAbandoned`` (through :meth:`SchedulerHost.abandon`: a held turn leaves the
  queue, a placement that crossed the cancel frees its slot).
* ``event`` -> ``TurnStarted`` / ``FirstToken`` / ``TurnFinished`` / ``TurnFailed`` /
  ``AbandonReported`` (ABANDONED) / ``RunEnded``; a FINISHED event's ``tool_call_ids`` (and a
  resync's runs') are remembered under its run for the admissions of other dataplanes. A
  FINISHED or FAILED with ``first_token_ago_s`` is preceded by the ``FirstToken`` it dates (the
  dataplane sends no live FIRST_TOKEN). An ABANDONED turn whose admit still waits here is
  answered ``refused{"turn was abandoned by its dataplane", 499}``.

When a stream ends (the dataplane closed it, or it broke, or the scheduler is stopping) the
admissions still waiting on it are abandoned, and when it was the last open stream of its dataplane,
``DataplaneLost``: if the dataplane does not resync within the grace, the turns placed for it are
released. A reconnecting dataplane's new stream is counted open from its resync on, so an old
stream seen to end after that loses nothing.

Tracing (:mod:`luftpause.observe.tracing`, only while it is active): one ``admit`` span per admission,
child of the item's ``traceparent``, from the admit's arrival to its answer, with
``luftpause.replica`` and ``luftpause.held_ms`` (milliseconds the turn waited here for its
placement); a refusal sets the span's status to ERROR, an admission given up (cancel, stream end)
ends it with ``luftpause.abandoned``. The span is not an inference: it carries no ``gen_ai.*``
attribute (the turn's model is ``luftpause.model``), so that LLM-observability backends, which type
a span carrying ``gen_ai.request.model`` as an LLM call, count each turn once, at the dataplane's
``chat`` span. A ``leased`` turn gets its ``admit`` span when it is read,
with ``luftpause.leased`` and ``luftpause.held_ms`` 0 (the dataplane placed it with no wait).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.trace import SpanKind, StatusCode

from luftpause.config import ReplicaConfig
from luftpause.observe import tracing
from luftpause.scheduler.core import (
    AbandonReported,
    AckResync,
    DataplaneLost,
    Event,
    FirstToken,
    GrantLease,
    InFlightRecord,
    LeasedTurnPlaced,
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
from luftpause.scheduler.dataplanes import Dataplanes, DataplaneSeen
from luftpause.scheduler.errors import StreamOutOfOrder
from luftpause.scheduler.host import Answer, LeaseChange, Outcome, SchedulerHost
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
    from opentelemetry.trace import Span

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
        request.takes_leases,
    )


def leased_turn(message: pb.LeasedTurn, dataplane_id: str, at: float) -> LeasedTurnPlaced:
    """A ``LeasedTurn`` from dataplane ``dataplane_id``'s stream as the core's event at ``at``."""
    return LeasedTurnPlaced(
        message.turn_id,
        message.run_id,
        message.model,
        service_class(message.service_class),
        message.caller,
        dataplane_id,
        message.replica,
        message.epoch,
        at,
        trace_id=tracing.trace_id_of(message.traceparent),
    )


def lease_item(change: LeaseChange) -> pb.SchedulerItem:
    """The stream item for a core ``GrantLease`` or ``RevokeLease``."""
    if type(change) is GrantLease:
        lease = pb.CapacityLease(
            replica=change.replica, epoch=change.epoch, grant=change.count, models=change.models
        )
    else:
        lease = pb.CapacityLease(replica=change.replica, epoch=change.epoch, revoke=True)
    return pb.SchedulerItem(lease=lease)


CLIENT_GONE_ERROR = "client disconnected"
"""How a FAILED event from the dataplane begins when its client left mid-stream."""

_FINISHED = pb.TurnEvent.FINISHED
_FAILED = pb.TurnEvent.FAILED


def turn_event(message: pb.TurnEvent, at: float) -> Event | None:
    """A ``TurnEvent`` as the core's event at ``at``; None for a kind this scheduler does not know.

    The ``FirstToken`` a FINISHED or FAILED carries is :func:`first_token`'s.
    """
    kind = message.kind
    if kind == _FINISHED:
        return TurnFinished(
            message.turn_id,
            at,
            message.finish_reason,
            message.tool_calls,
            message.prompt_tokens,
            message.completion_tokens,
        )
    if kind == _FAILED:
        # the dataplane's words for a client that left mid-stream (luftpause.dataplane.relay.machine):
        # no fault of the engine, so the circuit breaker does not count it
        engine_fault = not message.error.startswith(CLIENT_GONE_ERROR)
        return TurnFailed(message.turn_id, at, message.error, engine_fault, message.unreachable)
    if kind == pb.TurnEvent.STARTED:
        return TurnStarted(message.turn_id, at)
    if kind == pb.TurnEvent.FIRST_TOKEN:
        return FirstToken(message.turn_id, at)
    if kind == pb.TurnEvent.ABANDONED:
        return AbandonReported(message.turn_id, at)
    if kind == pb.TurnEvent.RUN_ENDED:
        return RunEnded(message.run_id, at)
    return None  # KIND_UNSPECIFIED or a kind from a newer dataplane: nothing to apply


def first_token(message: pb.TurnEvent, at: float) -> FirstToken | None:
    """The ``FirstToken`` a FINISHED or FAILED event at ``at`` carries (``first_token_ago_s``), if any."""
    if message.HasField("first_token_ago_s"):
        return FirstToken(message.turn_id, at - max(message.first_token_ago_s, 0.0))
    return None


def admitted(outcome: Outcome, run_id: str = "") -> pb.SchedulerItem:
    """The stream item answering an admission with the core's ``Place`` or ``Reject``; ``run_id``:
    the run the turn was admitted as, when its tool-call ids named another than its admit's."""
    if isinstance(outcome, Place):
        reply = pb.AdmitReply(turn_id=outcome.turn_id, placed=pb.Placement(replica=outcome.replica))
    else:
        refusal = pb.Refusal(reason=outcome.reason, http_status=outcome.http_status)
        if outcome.retry_after_s:
            refusal.retry_after_s = max(1, math.ceil(outcome.retry_after_s))
        reply = pb.AdmitReply(turn_id=outcome.turn_id, refused=refusal)
    if run_id:
        reply.run_id = run_id
    return pb.SchedulerItem(admitted=reply)


def replica_set(
    replicas: Iterable[ReplicaConfig], context_lengths: Mapping[str, int] | None = None
) -> pb.SchedulerItem:
    """The stream item telling a dataplane the whole replica set (what it needs to send turns);
    ``context_lengths``: replica -> the context length (tokens) its engine reported, where one did."""
    lengths = context_lengths or {}
    return pb.SchedulerItem(
        replicas=pb.ReplicaSet(
            replicas=[
                pb.ReplicaSpec(
                    name=replica.name,
                    url=replica.url,
                    models=replica.models,
                    kind=replica.kind,
                    api_key_env=replica.api_key_env or "",
                    priority=replica.priority or "",
                    apis=replica.apis,
                    max_model_len=lengths.get(replica.name, 0),
                )
                for replica in replicas
            ]
        )
    )


def _admit_attributes(
    turn_id: str, run_id: str, model: str, service_class_value: int, caller: str
) -> dict[str, str | bool | int | float]:
    return {
        "luftpause.turn_id": turn_id,
        "luftpause.run_id": run_id,
        "luftpause.model": model,
        "luftpause.service_class": service_class(service_class_value),
        "luftpause.caller": caller,
    }


def admit_span(request: pb.AdmitRequest) -> Span:
    """The ``admit`` span of an admission, started now as a child of its ``traceparent``."""
    attributes = _admit_attributes(
        request.turn_id, request.run_id, request.model, request.service_class, request.caller
    )
    if request.single_pass:
        attributes["luftpause.single_pass"] = True
    return tracing.tracer().start_span(
        "admit", context=tracing.parent(request.traceparent), kind=SpanKind.SERVER, attributes=attributes
    )


def end_admit_span(span: Span, outcome: Outcome, held_s: float) -> None:
    """End an ``admit`` span with its outcome after ``held_s`` seconds of waiting."""
    span.set_attribute("luftpause.held_ms", max(held_s, 0.0) * 1000.0)
    if isinstance(outcome, Place):
        span.set_attribute("luftpause.replica", outcome.replica)
    else:
        span.set_attribute("luftpause.refused_status", outcome.http_status)
        span.set_status(StatusCode.ERROR, outcome.reason)
    span.end()


def leased_admit_span(message: pb.LeasedTurn) -> None:
    """The ``admit`` span of a turn placed under a lease, emitted as the scheduler learns of it."""
    attributes = _admit_attributes(
        message.turn_id, message.run_id, message.model, message.service_class, message.caller
    )
    attributes["luftpause.replica"] = message.replica
    attributes["luftpause.held_ms"] = 0.0
    attributes["luftpause.leased"] = True
    tracing.tracer().start_span(
        "admit", context=tracing.parent(message.traceparent), kind=SpanKind.SERVER, attributes=attributes
    ).end()


class _Stream:
    """One dataplane's ``Connect`` stream: its outgoing items and its admissions still waiting.

    ``outbox`` is unbounded by count, bounded in fact: one answer per admission the dataplane sent.
    Its writer takes all of it at once (``wake`` is set while the writer waits for items).
    """

    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        self.outbox: list[pb.SchedulerItem] = []
        self.wake: asyncio.Future[None] | None = None
        self.waiting: dict[str, Answer] = {}
        self.spans: dict[str, Span] = {}  # turn id -> its admit span, while waiting (tracing only)
        self.dataplane_id = ""  # from its resync
        self.seen = DataplaneSeen("", 0.0, 0.0)  # its dataplane's record, from its resync

    def lease(self, change: LeaseChange) -> None:
        self.put(lease_item(change))

    def put(self, item: pb.SchedulerItem) -> None:
        self.outbox.append(item)
        wake, self.wake = self.wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    def admit(self, request: pb.AdmitRequest) -> None:
        turn_id = request.turn_id
        if turn_id in self.waiting:
            return  # sent twice on one stream: the first admission's answer serves both
        host = self.host
        now = host.now()
        self.seen.turns += 1
        run_id, found = request.run_id, ""
        if request.tool_call_ids:
            # Its dataplane did not know the tool calls its request answers: another worker or
            # dataplane may have relayed the turn that emitted them.
            found = host.dataplanes.run_of(request.tool_call_ids, now) or ""
            if found == run_id:
                found = ""
            elif found:
                run_id = found
        host.dataplanes.run_named(run_id)
        if tracing.active:
            self.spans[turn_id] = admit_span(request)

        def answer(outcome: Outcome) -> None:
            self.waiting.pop(turn_id, None)
            self.put(admitted(outcome, found))
            if type(outcome) is Place:
                # The dataplane sends the request as soon as it reads this: the turn has started.
                host.feed(TurnStarted(turn_id, host.now()))
            if self.spans:
                span = self.spans.pop(turn_id, None)
                if span is not None:
                    end_admit_span(span, outcome, host.now() - now)

        self.waiting[turn_id] = answer
        arrived = TurnArrived(
            turn_id,
            run_id,
            request.model,
            service_class(request.service_class),
            request.caller,
            request.dataplane_id,
            now,
            single_pass=request.single_pass,
            # Kept with the turn whether or not this scheduler traces: the log line of its
            # expiry or abandon names the trace (luftpause.scheduler.host).
            trace_id=tracing.trace_id_of(request.traceparent),
            failover_from=request.failover_from,
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
                self.put(pb.SchedulerItem(admitted=reply))
                self._span_abandoned(turn_id)

    def cancel(self, turn_id: str) -> None:
        # Answered already (the placement crossed the cancel on the wire): undone all the same.
        self.host.abandon(turn_id, self.waiting.pop(turn_id, None))
        self._span_abandoned(turn_id)

    def close(self) -> None:
        """The stream ended: the admissions still waiting on it are abandoned."""
        waiting, self.waiting = self.waiting, {}
        for turn_id, answer in waiting.items():
            self.host.abandon(turn_id, answer)
            self._span_abandoned(turn_id)

    def _span_abandoned(self, turn_id: str) -> None:
        """End the admit span of an admission given up before its answer (if it has one still)."""
        if self.spans:
            span = self.spans.pop(turn_id, None)
            if span is not None:
                span.set_attribute("luftpause.abandoned", True)
                span.end()


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
        writer = asyncio.create_task(self._write(stream, context), name="luftpause-connect-writer")
        dataplane_id: str | None = None
        seen: DataplaneSeen | None = None
        unwatch: Callable[[], None] | None = None
        try:
            first = await _read(context)
            if first is None:
                return
            if not first.items or first.items[0].WhichOneof("item") != "resync":
                refusal = StreamOutOfOrder("the first item of a Connect stream must be its resync")
                await context.abort(refusal.grpc_code, str(refusal))
            resync = first.items[0].resync
            rest = first.items[1:]
            while resync.more_follows:  # a resync in parts, one per message: join them
                message = await _read(context)
                if message is None:
                    return
                if not message.items or message.items[0].WhichOneof("item") != "resync":
                    missing = StreamOutOfOrder("a resync part is missing")
                    await context.abort(missing.grpc_code, str(missing))
                part = message.items[0].resync
                resync.runs.extend(part.runs)
                resync.turns.extend(part.turns)
                resync.pending_turn_ids.extend(part.pending_turn_ids)
                resync.more_follows = part.more_follows
                rest = message.items[1:]
            dataplane_id = stream.dataplane_id = resync.dataplane_id
            host = self.host
            now = host.now()
            for run in resync.runs:
                if run.tool_call_ids:  # what a restarted scheduler has not been told yet
                    host.dataplanes.remember(run.run_id, run.tool_call_ids, now)
            if resync.takes_leases and dataplane_id:
                self.host.lease_to(dataplane_id, stream.lease)  # before the resync: its grants follow
            for action in self.host.feed(resynced(resync, self.host.now())):
                if isinstance(action, AckResync):
                    stream.put(
                        pb.SchedulerItem(
                            resynced=pb.ResyncReply(
                                runs=action.runs,
                                turns=action.turns,
                                pongs=True,
                                healthy_replicas=self.host.healthy_replicas(),
                            )
                        )
                    )
            # the scheduler's replica set, now and whenever it changes (the admin API, SIGHUP)
            stream.put(replica_set(host.replicas.values(), host.context_lengths))
            unwatch = host.watch_replicas(
                lambda: stream.put(replica_set(host.replicas.values(), host.context_lengths))
            )
            self._open[dataplane_id] = self._open.get(dataplane_id, 0) + 1
            seen = stream.seen = host.dataplanes.connected(dataplane_id, now)
            apply = self._apply
            for item in rest:
                apply(item, stream)
            clock = host.clock
            while (message := await _read(context)) is not None:
                seen.last_seen = clock()
                for item in message.items:
                    apply(item, stream)
        finally:
            # closed, broken (an error from the read) or cancelled (the peer is gone): all the same
            if unwatch is not None:
                unwatch()
            writer.cancel()
            stream.close()
            if seen is not None:
                Dataplanes.disconnected(seen, self.host.now())
            if dataplane_id is not None:
                self.host.lease_ended(dataplane_id, stream.lease)
                self._stream_ended(dataplane_id)
            await asyncio.gather(writer, return_exceptions=True)

    def _apply(self, item: pb.DataplaneItem, stream: _Stream) -> None:
        kind = item.WhichOneof("item")
        if kind == "event":
            message = item.event
            at = self.host.now()
            event = turn_event(message, at)
            if event is None:
                return
            if type(event) is TurnFailed:
                # The one place a failed turn's trace id is seen here: logged, to find its trace. A
                # client that left mid-stream (an agent interrupted, a load run at its deadline) is
                # no fault of an engine or of luftpause: INFO, as a turn abandoned while held is.
                log.log(
                    logging.WARNING if event.engine_fault else logging.INFO,
                    "turn %s of run %s failed: %s",
                    message.turn_id,
                    message.run_id,
                    message.error,
                    extra={
                        "trace_id": message.trace_id,
                        "turn_id": message.turn_id,
                        "run_id": message.run_id,
                    },
                )
            if type(event) is TurnFinished or type(event) is TurnFailed:
                dated = first_token(message, at)
                if dated is not None:
                    self.host.feed(dated)
                if message.tool_call_ids:
                    self.host.dataplanes.remember(message.run_id, message.tool_call_ids, at)
            elif type(event) is RunEnded:
                self.host.dataplanes.run_ended(message.run_id, at)
            self.host.feed(event)
        elif kind == "admit":
            stream.admit(item.admit)
        elif kind == "leased":
            stream.seen.turns += 1
            self.host.dataplanes.run_named(item.leased.run_id)
            self.host.feed(leased_turn(item.leased, stream.dataplane_id, self.host.now()))
            if tracing.active:
                leased_admit_span(item.leased)
        elif kind == "cancel":
            stream.cancel(item.cancel.turn_id)
        elif kind == "ping":
            # The dataplane's heartbeat: answered at once, so a scheduler that stops answering
            # (stopped, hung) is taken as lost within seconds.
            pong = pb.Pong(seq=item.ping.seq, healthy_replicas=self.host.healthy_replicas())
            stream.put(pb.SchedulerItem(pong=pong))
        elif kind == "resync":
            log.warning("a second resync on one stream of %s is ignored", item.resync.dataplane_id)
        # None: a kind from a newer dataplane, which this scheduler does not know

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
    async def _write(stream: _Stream, context: _Context) -> None:
        """The stream's one writer: whatever is queued when it gets to write goes out as one message."""
        loop = asyncio.get_running_loop()
        while True:
            if not stream.outbox:
                stream.wake = loop.create_future()
                await stream.wake
                continue
            items, stream.outbox = stream.outbox, []
            await context.write(pb.SchedulerMessage(items=items))
