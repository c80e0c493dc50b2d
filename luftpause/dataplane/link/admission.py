"""The dataplane's link to the scheduler: one long-lived ``Connect`` stream (gRPC, bidirectional).

Contract (``proto/luftpause/v1/scheduler.proto``, docs/architecture.md "The Connect stream", "Admission
transport", "Failure contract"):

* every (re)connect opens a new stream whose first message is the resync (runs, in-flight turns,
  turn ids whose admit is out); the scheduler applies it before anything after it on the stream;
* admissions, cancels and turn events follow on the same stream, pipelined: many admissions are
  outstanding at once, each answered by turn id in whatever order the scheduler decides, and the
  awaiting task of each is woken by its own future (never one at a time behind a lock);
* while the scheduler is unreachable or restarting a turn stays held here: its admit is re-sent,
  under the same turn id, right after the resync of every new stream, until it is answered or its
  client leaves. The stream is re-opened every ``RETRY_S`` seconds. Turns whose admit is out are
  listed as pending in each resync, so a placement whose answer was lost with the old stream is
  kept by the scheduler (and answered again) rather than released as gone.

Heartbeat: gRPC's keepalive was seen not to notice a scheduler stopped by SIGSTOP (its TCP
connection open, its HTTP/2 session silent): ``/health`` said connected and turns waited for as
long as it was stopped. So, once a stream is resynced with a scheduler that answers pings
(``ResyncReply.pongs``), the link sends a ``ping`` item every ``PING_EVERY_S`` seconds, busy or
idle, and a stream from which nothing at all (a pong or any other item) has been read for
``PONG_TIMEOUT_S`` seconds is taken as a lost scheduler: it is cancelled and opened again like a
broken one (every ``RETRY_S``, with its resync), and its held turns stay held meanwhile. The
resync's answer and every pong say how many replicas the scheduler counts healthy
(:attr:`SchedulerLink.healthy_replicas`, the dataplane's readiness).

Everything queued on a stream is written by one writer task, and whatever is queued when it gets
to write goes out as one ``DataplaneMessage``. Admissions, cancels and pings go out as soon as the
writer is free (a lone admission at once, never behind a timer); facts (turn events, turns placed
under a lease) wait for company (but a finished turn's event carrying its tool-call ids, which
another worker's admission may soon ask the scheduler about), so that several turns share a
message rather than each costing two (measured in bench/README.md, "End to end"): up to
``LEASED_COALESCE_S`` when the turn's replica is leased to this dataplane (then no turn is held
for that replica anywhere: rule 14 withdraws a lease as soon as one is, so nobody waits for the
fact), else up to ``COALESCE_S``.
Answers come batched the same way.

Capacity leases (rule 14 of ``luftpause.scheduler.core.decide``): every resync says the link takes
them, and the scheduler may then grant slots of replicas (``lease`` items). The link keeps, per
replica, the unused slots, their epoch and the replica's models, and :meth:`SchedulerLink.admit`
answers a turn at once, with no round trip, when a lease allows it; the turn is reported after
(``leased``, queued on the stream like any item). A lease allows a turn when the replica serves its
model and the run's affinity lets it go there, read from the run table: a run generating or
tool-paused on a replica (that serves the model) may use only that replica's lease; an idle run
with a last replica uses that replica's lease, which holds its prefix, and asks when that has no
slot left or is not leased here (the scheduler then says whether it waits for it:
``policies/idle_affinity.py``; with ``[scheduler] idle_affinity = "off"`` it takes any lease, as
below); a run with no last replica (or one that does not serve the model)
any, the one with the most slots left; a run the table does not know (named by a header, maybe
known to the scheduler through another dataplane), or with an earlier turn's admit still out, asks.
Single-pass turns always ask. Every lease is dropped when its stream ends.

Turn events queued, or sent on a stream that then broke, are not replayed after a reconnect: the
resync that opens every stream already carries their effect (the run table is updated in the same
step as each event is queued). Between streams events are dropped for that reason, and at most
``MAX_QUEUED_EVENTS`` wait to be written: past that the stream is ended after what is queued, and
the next stream's resync heals what was dropped.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from luftpause.auth.grpc_link import LinkCredentials
from luftpause.dataplane.runs import RunTable, resync_parts
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

log = logging.getLogger("luftpause.dataplane")

if TYPE_CHECKING:
    _Call = grpc.aio.StreamStreamCall[pb.DataplaneMessage, pb.SchedulerMessage]

RETRY_S = 1.0
RESYNC_TIMEOUT_S = 30.0
"""A stream whose resync is not acknowledged within this is given up and opened again."""
PING_EVERY_S = 2.0
"""Seconds between two pings on a resynced stream (whether or not other items are flowing)."""
PONG_TIMEOUT_S = 6.0
"""Seconds without any item read from the scheduler after which its stream is taken as lost (the
pings make an idle scheduler answer: three of them unanswered)."""
MAX_QUEUED_EVENTS = 100_000
"""Turn events waiting to be written; past it the stream is ended and a resync heals."""
COALESCE_S = 0.002
"""Seconds a fact (a turn event, a turn placed under a lease) may wait for others to share its
gRPC message. They are facts the scheduler applies, not requests it answers: a turn ended is
acted on (its slot given to a held turn) up to this much later. Measured: one message per turn
event cost the scheduler and the dataplane about 0.2 ms of CPU each at one stream
(bench/README.md, "End to end")."""
LEASED_COALESCE_S = 0.02
"""The same for a fact about a turn on a replica this dataplane holds a lease on: no turn waits for
that replica, so the fact can wait longer for company."""
COALESCE_ITEMS = 512
"""Facts queued that go out at once, without waiting for ``COALESCE_S``."""

# The stream ended because the scheduler is away, restarting or stopping: hold the turns and open a
# new stream. Any other status is a fault on one side, answered to the waiting clients rather than
# retried for ever.
_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class _Outbox:
    """What waits to be written on one stream, in order, taken all at once by its writer.

    Two kinds of item: what the scheduler must answer or act on at once (admits, cancels, pings:
    :meth:`put`, written as soon as the writer is free) and facts (turn events, turns placed under a
    lease: :meth:`fact`), which wait up to ``COALESCE_S`` for company, or until ``COALESCE_ITEMS``
    are queued or an item of the first kind goes out with them. ``events`` counts the turn events
    in it (what ``MAX_QUEUED_EVENTS`` bounds); :meth:`end` ends the stream after what is queued.
    """

    __slots__ = ("_deadline", "_due", "_loop", "_timer", "_wake", "ending", "events", "items")

    def __init__(self) -> None:
        self.items: list[pb.DataplaneItem] = []
        self.events = 0
        self.ending = False
        self._due = False  # something queued must go out as soon as the writer is free
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # loop.time() the armed timer fires
        self._wake: asyncio.Future[None] | None = None  # set while the writer waits for items
        self._loop = asyncio.get_running_loop()

    def put(self, item: pb.DataplaneItem) -> None:
        self.items.append(item)
        self._flush()

    def fact(self, item: pb.DataplaneItem, wait: float = COALESCE_S) -> None:
        """Queue a fact that may wait up to ``wait`` seconds for company."""
        items = self.items
        items.append(item)
        if len(items) >= COALESCE_ITEMS:
            self._flush()
        elif not self._due:
            deadline = self._loop.time() + wait
            timer = self._timer
            if timer is None or deadline < self._deadline:
                if timer is not None:
                    timer.cancel()
                self._deadline = deadline
                self._timer = self._loop.call_at(deadline, self._flush)

    def end(self) -> None:
        self.ending = True
        self._flush()

    def _flush(self) -> None:
        self._due = True
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def take(self) -> list[pb.DataplaneItem] | None:
        """Everything queued once it is due (waiting until then), or None once ended and drained."""
        while not (self.items and self._due):
            if self.ending and not self.items:
                return None
            self._wake = self._loop.create_future()
            await self._wake
        items, self.items, self.events = self.items, [], 0
        self._due = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return items


class _Lease:
    """What the link holds of one replica: unused slots, their epoch, the replica's models."""

    __slots__ = ("count", "epoch", "models")

    def __init__(self, count: int, epoch: int, models: frozenset[str]) -> None:
        self.count = count
        self.epoch = epoch
        self.models = models


_PINNING = frozenset({pb.GENERATING, pb.TOOL_PAUSED})


class SchedulerLink:
    """One dataplane's connection to the scheduler at ``target`` (``host:port``).

    Use :meth:`start` once inside the running loop, :meth:`admit` per turn and :meth:`report` for
    every turn event; :meth:`close` at shutdown. ``dataplane_id`` should be stable across restarts
    of the same dataplane (host and port), so its resync after a crash releases what it held.
    """

    def __init__(
        self,
        target: str,
        runs: RunTable,
        dataplane_id: str | None = None,
        takes_leases: bool = True,
        credentials: LinkCredentials | None = None,
        idle_affinity: bool = True,
        on_placed: Callable[[int, float], None] | None = None,
        on_replicas: Callable[[pb.ReplicaSet], None] | None = None,
    ) -> None:
        self.target = target
        self.idle_affinity = idle_affinity
        """An idle run with a last replica uses only that replica's lease (else asks): false when the
        scheduler's ``idle_affinity`` is ``"off"``, and such a run takes any lease, as the scheduler
        would place it."""
        self.credentials = credentials or LinkCredentials()
        """The token and TLS of the link (:mod:`luftpause.auth.grpc_link`)."""
        self.takes_leases = takes_leases
        self._leases: dict[str, _Lease] = {}
        """Replica -> the lease held there, on the current stream (empty between streams)."""
        self._asking: dict[str, int] = {}
        """Run id -> its turns whose admit is out: such a run's next turn asks too."""
        self.leased_turns = 0
        """Turns this link placed under a lease (since it started)."""
        self.healthy_replicas: int | None = None
        """Replicas the scheduler counts healthy, as its last resync answer or pong said; ``None``
        until one did (or from a scheduler that does not say). Kept while the link is down."""
        self.on_placed = on_placed
        """Called with (``ServiceClass`` value, seconds from the admit to its answer) for each turn
        the scheduler placed after an admit; never for a turn placed under a lease, which waited
        for nobody (the dataplane's held-time histogram)."""
        self.on_replicas = on_replicas
        """Called with the scheduler's replica set (the ``replicas`` item: after the resync, and
        whenever the admin API or SIGHUP changes it)."""
        self.runs = runs
        self.dataplane_id = dataplane_id or f"dp-{uuid.uuid4().hex[:12]}"
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._admits: dict[str, tuple[pb.AdmitRequest, asyncio.Future[pb.AdmitReply]]] = {}
        """Turn id -> its admit and the future its client awaits, from the admit until that returns."""
        self._outbox: _Outbox | None = None  # the current stream's; None between streams
        self._overflowed = False
        self._synced = asyncio.Event()
        self._heard = 0.0  # loop.time() the current stream last delivered a message
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # start()'s; taken once, not per turn

    @property
    def connected(self) -> bool:
        """True while a stream is open whose resync the scheduler has acknowledged."""
        return self._synced.is_set()

    async def start(self) -> None:
        """Open the channel and start keeping a stream open (in the background, every ``RETRY_S``)."""
        self._channel = self.credentials.channel(
            self.target,
            [
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.initial_reconnect_backoff_ms", int(RETRY_S * 1000)),
                ("grpc.max_reconnect_backoff_ms", int(RETRY_S * 1000)),
            ],
        )
        self._stub = pb_grpc.SchedulerStub(self._channel)
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._connect_forever(), name="luftpause-connect")

    async def close(self) -> None:
        """Stop the stream and the channel; admissions still waiting stay waiting (their clients go)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._channel is not None:
            await self._channel.close()

    async def admit(self, request: pb.AdmitRequest, leased_first: bool = True) -> pb.AdmitReply:
        """Place a turn: returns the scheduler's answer (placed or refused) for ``request.turn_id``.

        Answered at once, with no round trip, when a capacity lease allows the turn and
        ``leased_first`` (False when the caller tried :meth:`place_leased` already); it is reported
        to the scheduler after, on the stream, and the caller must then record the turn in the run table
        before it next yields to the loop, as the relay does when it forwards. Otherwise it waits
        while the turn is held, and while the scheduler is unreachable (the admit is re-sent on
        each new stream). Cancelling the awaiting task sends a cancel, which the scheduler takes as
        the turn being abandoned. Raises ``grpc.aio.AioRpcError`` when the stream ends on a
        non-transient failure, and ``ValueError`` when an admit of the same turn id is already out.
        """
        assert self._stub is not None and self._loop is not None, "start() first"
        turn_id = request.turn_id
        if turn_id in self._admits:
            raise ValueError(f"an admit of turn {turn_id!r} is already out")
        if leased_first and self._leases and not request.single_pass:
            reply = self._place_leased(request)
            if reply is not None:
                return reply
        future: asyncio.Future[pb.AdmitReply] = self._loop.create_future()
        self._admits[turn_id] = (request, future)
        run_id = request.run_id
        asking = self._asking
        asking[run_id] = asking.get(run_id, 0) + 1
        self._send(pb.DataplaneItem(admit=request))
        sent = self._loop.time()
        try:
            reply = await future
            if self.on_placed is not None and reply.HasField("placed"):
                self.on_placed(request.service_class, self._loop.time() - sent)
            return reply
        except asyncio.CancelledError:
            self._send(pb.DataplaneItem(cancel=pb.CancelAdmit(turn_id=turn_id)))
            raise
        finally:
            del self._admits[turn_id]
            left = asking[run_id] - 1
            if left:
                asking[run_id] = left
            else:
                del asking[run_id]

    def leases(self) -> dict[str, int]:
        """Replica -> unused leased slots held now (replicas with none left out)."""
        return {name: lease.count for name, lease in self._leases.items() if lease.count}

    def place_leased(
        self, turn_id: str, run_id: str, model: str, service_class: int, caller: str, traceparent: str | None
    ) -> str | None:
        """Place a generative turn under a lease if one allows it (see the module's docstring):
        the replica's name, the turn reported ``leased`` on the stream; else None (ask with
        :meth:`admit`). The caller must record the turn in the run table before it next yields to
        the loop, as the relay does when it forwards."""
        outbox = self._outbox
        if not self._leases or outbox is None or self._overflowed or run_id in self._asking:
            return None
        run = self.runs.runs.get(run_id)
        if run is None:
            return None  # perhaps known to the scheduler (another dataplane's): ask
        replica = ""
        lease: _Lease | None = None
        last = self._leases.get(run.last_replica) if run.last_replica else None
        if run.phase in _PINNING and last is not None and model in last.models:
            if last.count > 0:
                replica, lease = run.last_replica, last
        elif run.phase in _PINNING and run.last_replica and last is None:
            return None  # its replica is not leased to us: whether it may move is the scheduler's call
        elif (
            self.idle_affinity
            and run.phase == pb.IDLE
            and run.last_replica
            and (last is None or model in last.models)
        ):
            # its last replica holds its prefix (the scheduler's idle affinity): there, or ask
            if last is None or last.count <= 0:
                return None
            replica, lease = run.last_replica, last
        else:
            for name, candidate in self._leases.items():
                if candidate.count > 0 and model in candidate.models:
                    if lease is None or candidate.count > lease.count:
                        replica, lease = name, candidate
        if lease is None:
            return None
        lease.count -= 1
        self.leased_turns += 1
        item = pb.DataplaneItem()
        leased = item.leased
        leased.turn_id = turn_id
        leased.run_id = run_id
        leased.model = model
        leased.service_class = service_class  # type: ignore[assignment]  # an int of the proto enum
        leased.caller = caller
        leased.replica = replica
        leased.epoch = lease.epoch
        if traceparent:
            leased.traceparent = traceparent
        outbox.fact(item, LEASED_COALESCE_S if lease.count else COALESCE_S)
        return replica

    def _place_leased(self, request: pb.AdmitRequest) -> pb.AdmitReply | None:
        replica = self.place_leased(
            request.turn_id,
            request.run_id,
            request.model,
            request.service_class,
            request.caller,
            request.traceparent,
        )
        if replica is None:
            return None
        return pb.AdmitReply(turn_id=request.turn_id, placed=pb.Placement(replica=replica))

    def _on_lease(self, message: pb.CapacityLease) -> None:
        """A grant adds slots under its epoch; a revocation empties the holding and sets its epoch."""
        lease = self._leases.get(message.replica)
        if message.revoke:
            if lease is not None:
                lease.count, lease.epoch = 0, message.epoch
            return
        if lease is None:
            self._leases[message.replica] = _Lease(message.grant, message.epoch, frozenset(message.models))
        elif lease.epoch != message.epoch:
            lease.count, lease.epoch = message.grant, message.epoch
        else:
            lease.count += message.grant

    def report(self, event: pb.TurnEvent, replica: str | None = None) -> None:
        """Queue a turn event for the stream; never blocks the relay. ``replica``: where the turn
        ran, if it did (a fact about a leased replica may wait longer, ``LEASED_COALESCE_S``).

        Between streams events are dropped: the next resync carries their effect.
        """
        outbox = self._outbox
        if outbox is None or self._overflowed:
            return
        if outbox.events >= MAX_QUEUED_EVENTS:
            # Stop queueing; what is queued still goes out, then the stream ends and the next
            # stream's resync carries what was dropped.
            log.error("%d turn events wait for the scheduler; reconnecting to resync", MAX_QUEUED_EVENTS)
            self._overflowed = True
            outbox.end()
            return
        outbox.events += 1
        if event.tool_call_ids:
            # The run's next turn may reach another worker or dataplane as soon as its client has
            # read this turn's end, and ask the scheduler for these ids: they go out at once.
            outbox.put(pb.DataplaneItem(event=event))
            return
        lease = self._leases.get(replica) if replica else None
        outbox.fact(pb.DataplaneItem(event=event), LEASED_COALESCE_S if lease and lease.count else COALESCE_S)

    def _send(self, item: pb.DataplaneItem) -> None:
        """Queue an admit or cancel on the current stream; between streams (or once the stream is
        ending) it waits for the next: admits are re-sent with its resync, and a cancel is then
        implied (the old stream's end abandoned the turn, and the next resync does not list it)."""
        if self._outbox is not None and not self._overflowed:
            self._outbox.put(item)

    @staticmethod
    async def _write(outbox: _Outbox, call: _Call, resync: list[pb.ResyncRequest]) -> None:
        """The stream's one writer: each part of ``resync`` as its own message, then each batch of
        queued items as one message, then half-close."""
        for part in resync:
            await call.write(pb.DataplaneMessage(items=[pb.DataplaneItem(resync=part)]))
        while (items := await outbox.take()) is not None:
            await call.write(pb.DataplaneMessage(items=items))
        await call.done_writing()

    async def _connect_forever(self) -> None:
        while True:
            try:
                await self._stream()
            except grpc.aio.AioRpcError as exc:
                self._stream_failed(exc)
            except TimeoutError:
                if self._synced.is_set():
                    log.error(
                        "scheduler %s answered no ping within %.0f s: taken as lost, reconnecting",
                        self.target,
                        PONG_TIMEOUT_S,
                    )
                else:
                    log.error(
                        "scheduler %s did not acknowledge the resync within %.0f s",
                        self.target,
                        RESYNC_TIMEOUT_S,
                    )
            finally:
                self._synced.clear()
                self._outbox = None
            if self._overflowed:
                continue  # the stream ended on our overflow: resync at once
            await asyncio.sleep(RETRY_S)

    async def _stream(self) -> None:
        """One stream, from the resync to its end; returns when the scheduler ends it cleanly."""
        assert self._stub is not None and self._channel is not None
        await self._channel.channel_ready()
        # From the snapshot on, every event is queued: snapshot + queue is the whole truth. The
        # snapshot is taken at once; building it into resync parts yields to the loop between parts.
        outbox = _Outbox()
        snapshot = self.runs.snapshot()
        pending = list(self._admits)
        for request, future in self._admits.values():
            if not future.done():
                outbox.put(pb.DataplaneItem(admit=request))
        self._outbox, self._overflowed = outbox, False
        parts = await resync_parts(snapshot, self.dataplane_id, pending, self.takes_leases)
        call: _Call = self._stub.Connect(metadata=self.credentials.metadata)
        # Every part of the resync goes first, one per message; then the writer sends the rest.
        writer = asyncio.create_task(self._write(outbox, call, parts), name="luftpause-connect-writer")
        pinger: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        try:
            # Until the resync is acknowledged: RESYNC_TIMEOUT_S. After, with a scheduler that
            # answers pings: PONG_TIMEOUT_S after the last message read (moved on by the pinger).
            async with asyncio.timeout(RESYNC_TIMEOUT_S) as deadline:
                while isinstance(message := await call.read(), pb.SchedulerMessage):  # else EOF
                    self._heard = loop.time()
                    for item in message.items:
                        kind = item.WhichOneof("item")
                        if kind == "admitted":
                            self._answer(item.admitted)
                        elif kind == "lease":
                            self._on_lease(item.lease)
                        elif kind == "replicas":
                            if self.on_replicas is not None:
                                self.on_replicas(item.replicas)
                        elif kind == "resynced":
                            deadline.reschedule(None)
                            if item.resynced.HasField("healthy_replicas"):
                                self.healthy_replicas = item.resynced.healthy_replicas
                            if item.resynced.pongs and pinger is None:
                                pinger = asyncio.create_task(
                                    self._ping(outbox, deadline), name="luftpause-connect-pinger"
                                )
                            self._synced.set()
                            log.info(
                                "connected to scheduler %s (resynced %d runs, %d in-flight turns)",
                                self.target,
                                len(snapshot.runs),
                                len(snapshot.turns),
                            )
                        elif kind == "pong":  # heard from (self._heard above), and the replicas' health
                            if item.pong.HasField("healthy_replicas"):
                                self.healthy_replicas = item.pong.healthy_replicas
                        # None: a kind from a newer scheduler, which this dataplane ignores
        finally:
            self._leases.clear()  # leases live and die with their stream
            call.cancel()
            writer.cancel()
            if pinger is not None:
                pinger.cancel()
            # its failure is the stream's, which the read above has raised or will on the next one
            await asyncio.gather(writer, *([pinger] if pinger else []), return_exceptions=True)
        if not self._overflowed:
            log.warning("scheduler %s ended the stream", self.target)

    async def _ping(self, outbox: _Outbox, deadline: asyncio.Timeout) -> None:
        """The heartbeat of one resynced stream: a ping every ``PING_EVERY_S`` seconds, and the
        stream's ``deadline`` kept at ``PONG_TIMEOUT_S`` after the last message read from it (when
        that passes, the reading task gets ``TimeoutError`` and the stream is opened again)."""
        self._heard = asyncio.get_running_loop().time()
        seq = 0
        while True:
            await asyncio.sleep(PING_EVERY_S)
            if deadline.expired():
                return
            seq += 1
            outbox.put(pb.DataplaneItem(ping=pb.Ping(seq=seq)))
            deadline.reschedule(self._heard + PONG_TIMEOUT_S)

    def _answer(self, reply: pb.AdmitReply) -> None:
        entry = self._admits.get(reply.turn_id)
        if entry is not None and not entry[1].done():
            entry[1].set_result(reply)
        # else its client left (a cancel crossed this answer) or it was answered on an older stream

    def _stream_failed(self, exc: grpc.aio.AioRpcError) -> None:
        if exc.code() in _TRANSIENT:
            if self._synced.is_set():
                log.warning("lost the scheduler %s: %s", self.target, exc.code().name)
            return
        # Not the scheduler being away: a fault that a retry would only repeat. The turns waiting on
        # it are answered with it; the stream is still opened again for the turns to come.
        log.error("scheduler %s failed the stream: %s %s", self.target, exc.code().name, exc.details())
        for _, future in self._admits.values():
            if not future.done():
                future.set_exception(exc)
