"""The dataplane's link to the scheduler: Admit calls, the Report stream and Resync (gRPC).

Contract (``proto/luftpause/v1/scheduler.proto``, DESIGN.md "Failure contract"):

* one long-lived ``Report`` stream per dataplane carries turn events in order;
* on every (re)connect the dataplane first sends ``Resync`` with its runs and in-flight turns, and
  no ``Admit`` is sent before that has been answered;
* while the scheduler is unreachable or restarting a turn stays held here: ``Admit`` is retried
  every ``RETRY_S`` seconds under the same turn id until it is answered or the client leaves.

Events that were queued, or sent on a stream that then broke, are not replayed after a reconnect:
the Resync that opens every connection already carries their effect (the run table is updated in
the same step as each event is queued).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import grpc
import grpc.aio

from luftpause.dataplane.runs import RunTable
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

log = logging.getLogger("luftpause.dataplane")

RETRY_S = 1.0
PRUNE_EVERY_S = 60.0

# Retry on these; any other status is a bug on one side and is raised.
_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
)


class SchedulerLink:
    """One dataplane's connection to the scheduler at ``target`` (``host:port``).

    Use :meth:`start` once inside the running loop, :meth:`admit` per turn and :meth:`report` for
    every turn event; :meth:`close` at shutdown.
    """

    def __init__(self, target: str, runs: RunTable, dataplane_id: str | None = None) -> None:
        self.target = target
        self.runs = runs
        self.dataplane_id = dataplane_id or f"dp-{uuid.uuid4().hex[:12]}"
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._events: asyncio.Queue[pb.TurnEvent | None] = asyncio.Queue()
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
        abandoned. Raises ``grpc.aio.AioRpcError`` only for non-transient failures.
        """
        assert self._stub is not None, "start() first"
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

    def report(self, event: pb.TurnEvent) -> None:
        """Queue a turn event for the Report stream; never blocks the relay."""
        if self._synced.is_set():
            self._events.put_nowait(event)

    async def _event_source(self) -> object:
        while True:
            event = await self._events.get()
            if event is None:
                return
            yield event

    async def _report_forever(self) -> None:
        assert self._stub is not None
        while True:
            try:
                # What was queued before this connection is already in the Resync snapshot.
                while not self._events.empty():
                    self._events.get_nowait()
                request = self.runs.resync_request(self.dataplane_id)
                await self._stub.Resync(request, wait_for_ready=True)
                call = self._stub.Report(self._event_source())
                self._synced.set()
                log.info(
                    "connected to scheduler %s (resynced %d runs, %d in-flight turns)",
                    self.target,
                    len(request.runs),
                    len(request.turns),
                )
                await call
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
            await asyncio.sleep(RETRY_S)

    async def _prune_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PRUNE_EVERY_S)
            self.runs.prune(loop.time())
