"""The dataplane's link to the scheduler: one long-lived ``Connect`` stream (gRPC, bidirectional).

Contract (``proto/luftpause/v1/scheduler.proto``, DESIGN.md "Admission transport", "Failure
contract"):

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
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from luftpause.dataplane.runs import RunTable
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

log = logging.getLogger("luftpause.dataplane")

RETRY_S = 1.0
PRUNE_EVERY_S = 60.0
RESYNC_TIMEOUT_S = 30.0
"""A stream whose resync is not acknowledged within this is given up and opened again."""
MAX_QUEUED_EVENTS = 100_000
"""Turn events waiting to be written; past it the stream is ended and a resync heals."""

# The stream ended because the scheduler is away, restarting or stopping: hold the turns and open a
# new stream. Any other status is a fault on one side, answered to the waiting clients rather than
# retried for ever.
_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)

_Outbox = asyncio.Queue[pb.DataplaneMessage | None]
"""What waits to be written on one stream, in order; None ends the stream after what precedes it."""


class SchedulerLink:
    """One dataplane's connection to the scheduler at ``target`` (``host:port``).

    Use :meth:`start` once inside the running loop, :meth:`admit` per turn and :meth:`report` for
    every turn event; :meth:`close` at shutdown. ``dataplane_id`` should be stable across restarts
    of the same dataplane (host and port), so its resync after a crash releases what it held.
    """

    def __init__(self, target: str, runs: RunTable, dataplane_id: str | None = None) -> None:
        self.target = target
        self.runs = runs
        self.dataplane_id = dataplane_id or f"dp-{uuid.uuid4().hex[:12]}"
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._admits: dict[str, tuple[pb.AdmitRequest, asyncio.Future[pb.AdmitReply]]] = {}
        """Turn id -> its admit and the future its client awaits, from the admit until that returns."""
        self._outbox: _Outbox | None = None  # the current stream's; None between streams
        self._queued_events = 0  # turn events in the current outbox
        self._overflowed = False
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prune_task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """True while a stream is open whose resync the scheduler has acknowledged."""
        return self._synced.is_set()

    async def start(self) -> None:
        """Open the channel and start keeping a stream open (in the background, every ``RETRY_S``)."""
        self._channel = grpc.aio.insecure_channel(
            self.target,
            options=[
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.initial_reconnect_backoff_ms", int(RETRY_S * 1000)),
                ("grpc.max_reconnect_backoff_ms", int(RETRY_S * 1000)),
            ],
        )
        self._stub = pb_grpc.SchedulerStub(self._channel)
        self._task = asyncio.create_task(self._connect_forever(), name="luftpause-connect")
        self._prune_task = asyncio.create_task(self._prune_forever(), name="luftpause-prune")

    async def close(self) -> None:
        """Stop the stream and the channel; admissions still waiting stay waiting (their clients go)."""
        for task in (self._task, self._prune_task):
            if task is not None:
                task.cancel()
        for task in (self._task, self._prune_task):
            if task is not None:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self._channel is not None:
            await self._channel.close()

    async def admit(self, request: pb.AdmitRequest) -> pb.AdmitReply:
        """Place a turn: returns the scheduler's answer (placed or refused) for ``request.turn_id``.

        Waits while the turn is held, and while the scheduler is unreachable (the admit is re-sent on
        each new stream). Cancelling the awaiting task sends a cancel, which the scheduler takes as
        the turn being abandoned. Raises ``grpc.aio.AioRpcError`` when the stream ends on a
        non-transient failure, and ``ValueError`` when an admit of the same turn id is already out.
        """
        assert self._stub is not None, "start() first"
        turn_id = request.turn_id
        if turn_id in self._admits:
            raise ValueError(f"an admit of turn {turn_id!r} is already out")
        future: asyncio.Future[pb.AdmitReply] = asyncio.get_running_loop().create_future()
        self._admits[turn_id] = (request, future)
        self._send(pb.DataplaneMessage(admit=request))
        try:
            return await future
        except asyncio.CancelledError:
            self._send(pb.DataplaneMessage(cancel=pb.CancelAdmit(turn_id=turn_id)))
            raise
        finally:
            del self._admits[turn_id]

    def report(self, event: pb.TurnEvent) -> None:
        """Queue a turn event for the stream; never blocks the relay.

        Between streams events are dropped: the next resync carries their effect.
        """
        if self._outbox is None or self._overflowed:
            return
        if self._queued_events >= MAX_QUEUED_EVENTS:
            # Stop queueing; what is queued still goes out, then the stream ends (the None) and
            # the next stream's resync carries what was dropped.
            log.error("%d turn events wait for the scheduler; reconnecting to resync", MAX_QUEUED_EVENTS)
            self._overflowed = True
            self._outbox.put_nowait(None)
            return
        self._queued_events += 1
        self._outbox.put_nowait(pb.DataplaneMessage(event=event))

    def _send(self, message: pb.DataplaneMessage) -> None:
        """Queue an admit or cancel on the current stream; between streams (or once the stream is
        ending) it waits for the next: admits are re-sent with its resync, and a cancel is then
        implied (the old stream's end abandoned the turn, and the next resync does not list it)."""
        if self._outbox is not None and not self._overflowed:
            self._outbox.put_nowait(message)

    async def _write(self, outbox: _Outbox) -> AsyncIterator[pb.DataplaneMessage]:
        while (message := await outbox.get()) is not None:
            if message.WhichOneof("message") == "event":
                self._queued_events -= 1
            yield message

    async def _connect_forever(self) -> None:
        while True:
            try:
                await self._stream()
            except grpc.aio.AioRpcError as exc:
                self._stream_failed(exc)
            except TimeoutError:
                log.error(
                    "scheduler %s did not acknowledge the resync within %.0f s", self.target, RESYNC_TIMEOUT_S
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
        # From the snapshot on, every event is queued: snapshot + queue is the whole truth.
        outbox: _Outbox = asyncio.Queue()
        resync = self.runs.resync_request(self.dataplane_id, self._admits)
        outbox.put_nowait(pb.DataplaneMessage(resync=resync))
        for request, future in self._admits.values():
            if not future.done():
                outbox.put_nowait(pb.DataplaneMessage(admit=request))
        self._outbox, self._queued_events, self._overflowed = outbox, 0, False
        call = self._stub.Connect(self._write(outbox))
        try:
            async with asyncio.timeout(RESYNC_TIMEOUT_S) as resync_deadline:
                async for message in call:
                    kind = message.WhichOneof("message")
                    if kind == "admitted":
                        self._answer(message.admitted)
                    elif kind == "resynced":
                        resync_deadline.reschedule(None)
                        self._synced.set()
                        log.info(
                            "connected to scheduler %s (resynced %d runs, %d in-flight turns)",
                            self.target,
                            len(resync.runs),
                            len(resync.turns),
                        )
                    # None: a kind from a newer scheduler (a lease, say), which this dataplane ignores
        finally:
            call.cancel()
        if not self._overflowed:
            log.warning("scheduler %s ended the stream", self.target)

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

    async def _prune_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PRUNE_EVERY_S)
            self.runs.prune(loop.time())
