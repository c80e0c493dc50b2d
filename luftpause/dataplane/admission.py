"""The dataplane's link to the scheduler: Admit calls, the Report stream and Resync (gRPC).

Contract (``proto/luftpause/v1/scheduler.proto``, DESIGN.md "Failure contract"):

* one long-lived ``Report`` stream per dataplane carries turn events in order;
* on every (re)connect the dataplane first sends ``Resync`` with its runs and in-flight turns, and
  no ``Admit`` is sent before that has been answered;
* while the scheduler is unreachable or restarting a turn stays held here: ``Admit`` is retried
  every ``RETRY_S`` seconds under the same turn id until it is answered or the client leaves. Turns
  whose Admit is out are listed as pending in each Resync, so a placement whose answer crosses a
  Resync on the wire is kept by the scheduler rather than released as gone.

Events that were queued, or sent on a stream that then broke, are not replayed after a reconnect:
the Resync that opens every connection already carries their effect (the run table is updated in
the same step as each event is queued).
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
MAX_QUEUED_EVENTS = 100_000
"""Events waiting for the Report stream; past it the stream is dropped and a Resync heals."""

# The scheduler is away or restarting: hold the turn and ask again. Any other status is a fault
# on one side, answered to the client rather than retried for ever.
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class SchedulerLink:
    """One dataplane's connection to the scheduler at ``target`` (``host:port``).

    Use :meth:`start` once inside the running loop, :meth:`admit` per turn and :meth:`report` for
    every turn event; :meth:`close` at shutdown. ``dataplane_id`` should be stable across restarts
    of the same dataplane (host and port), so its Resync after a crash releases what it held.
    """

    def __init__(self, target: str, runs: RunTable, dataplane_id: str | None = None) -> None:
        self.target = target
        self.runs = runs
        self.dataplane_id = dataplane_id or f"dp-{uuid.uuid4().hex[:12]}"
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        # The queue of the current connection (None before the first); None in it ends the stream.
        self._events: asyncio.Queue[pb.TurnEvent | None] | None = None
        self._collecting = False
        self._pending: set[str] = set()  # turn ids whose Admit is out
        self._overflowed = False
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prune_task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        """True while a resynced Report stream is open."""
        return self._synced.is_set()

    async def start(self) -> None:
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
        self._task = asyncio.create_task(self._report_forever(), name="luftpause-report")
        self._prune_task = asyncio.create_task(self._prune_forever(), name="luftpause-prune")

    async def close(self) -> None:
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
        """Place a turn: blocks while it is held, and while the scheduler is unreachable.

        Cancelling the awaiting task cancels the call, which the scheduler takes as the turn being
        abandoned. While the call is out its turn id is listed as pending in every Resync, so a
        placement whose answer crosses a Resync stands. Raises ``grpc.aio.AioRpcError`` for
        non-transient failures.
        """
        assert self._stub is not None, "start() first"
        self._pending.add(request.turn_id)
        try:
            while True:
                await self._synced.wait()
                try:
                    reply: pb.AdmitReply = await self._stub.Admit(request)
                    return reply
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in _TRANSIENT:
                        raise
                    log.warning(
                        "admit %s: scheduler unavailable (%s); retrying", request.turn_id, exc.code().name
                    )
                    await asyncio.sleep(RETRY_S)
        finally:
            self._pending.discard(request.turn_id)

    def report(self, event: pb.TurnEvent) -> None:
        """Queue a turn event for the Report stream; never blocks the relay.

        Between connections events are dropped: the next Resync snapshot carries their effect.
        """
        if not self._collecting or self._events is None:
            return
        if self._events.qsize() >= MAX_QUEUED_EVENTS:
            # Stop queueing; what is queued still goes out, then the stream ends (the None) and
            # the next connection's Resync carries what was dropped.
            log.error("%d turn events wait for the scheduler; reconnecting to resync", MAX_QUEUED_EVENTS)
            self._collecting = False
            self._overflowed = True
            self._events.put_nowait(None)
            return
        self._events.put_nowait(event)

    @staticmethod
    async def _drain(events: asyncio.Queue[pb.TurnEvent | None]) -> AsyncIterator[pb.TurnEvent]:
        while (event := await events.get()) is not None:
            yield event

    async def _report_forever(self) -> None:
        assert self._stub is not None and self._channel is not None
        while True:
            try:
                await self._channel.channel_ready()
                # From the snapshot on, every event is queued: snapshot + queue is the whole truth.
                events: asyncio.Queue[pb.TurnEvent | None] = asyncio.Queue()
                self._events, self._collecting, self._overflowed = events, True, False
                request = self.runs.resync_request(self.dataplane_id, self._pending)
                await self._stub.Resync(request, timeout=RESYNC_TIMEOUT_S)
                if self._overflowed:  # the queue filled while the Resync was out: snapshot again
                    continue
                # names this stream's dataplane, so that the scheduler releases what it held if the
                # stream ends and the dataplane never comes back (scheduler's DATAPLANE_ID_METADATA)
                call = self._stub.Report(
                    self._drain(events), metadata=(("x-luftpause-dataplane-id", self.dataplane_id),)
                )
                self._synced.set()
                log.info(
                    "connected to scheduler %s (resynced %d runs, %d in-flight turns)",
                    self.target,
                    len(request.runs),
                    len(request.turns),
                )
                await call
                if self._overflowed:
                    continue  # the stream ended on our overflow: resync at once
                log.warning("scheduler %s closed the report stream", self.target)
            except grpc.aio.AioRpcError as exc:
                if self._synced.is_set():
                    log.warning("lost the scheduler %s: %s", self.target, exc.code().name)
                elif exc.code() != grpc.StatusCode.UNAVAILABLE:
                    # Not the scheduler being away: a refused Resync would otherwise repeat silently.
                    log.error(
                        "resync with scheduler %s failed: %s %s", self.target, exc.code().name, exc.details()
                    )
            finally:
                self._synced.clear()
                self._collecting = False
            await asyncio.sleep(RETRY_S)

    async def _prune_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PRUNE_EVERY_S)
            self.runs.prune(loop.time())
