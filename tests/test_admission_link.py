"""The dataplane's scheduler link against an in-process fake scheduler (real gRPC on loopback).

Covers what the real scheduler cannot be made to do on cue: a slow Resync, a Report stream that is
not read, an Admit answered only after a Resync, a non-transient error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import grpc.aio
import pytest

from luftpause.dataplane import admission
from luftpause.dataplane.admission import SchedulerLink
from luftpause.dataplane.runs import RunTable
from luftpause.testkit.procs import free_port
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc


class FakeScheduler(pb_grpc.SchedulerServicer):  # type: ignore[misc]
    """Records what it is sent; tests steer it through its events and hooks."""

    def __init__(self) -> None:
        self.resyncs: list[pb.ResyncRequest] = []
        self.events: list[tuple[str, int]] = []
        self.admits: list[str] = []
        self.resync_delay = 0.0
        self.reading = asyncio.Event()
        self.reading.set()
        self.admit_hook: Callable[[pb.AdmitRequest, Any], Coroutine[Any, Any, pb.AdmitReply]] | None = None

    async def Resync(self, request: pb.ResyncRequest, context: Any) -> pb.ResyncReply:
        await asyncio.sleep(self.resync_delay)
        self.resyncs.append(request)
        return pb.ResyncReply()

    async def Report(self, requests: AsyncIterator[pb.TurnEvent], context: Any) -> pb.ReportSummary:
        await self.reading.wait()
        async for event in requests:
            self.events.append((event.turn_id, event.kind))
        return pb.ReportSummary(events=len(self.events))

    async def Admit(self, request: pb.AdmitRequest, context: Any) -> pb.AdmitReply:
        self.admits.append(request.turn_id)
        if self.admit_hook is not None:
            return await self.admit_hook(request, context)
        return pb.AdmitReply(placed=pb.Placement(replica="a"))


async def _serve(fake: FakeScheduler, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(fake, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def _until(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - polls state changed by gRPC callbacks
            await asyncio.sleep(0.01)
    assert check(), what


def _event(turn_id: str, kind: int = pb.TurnEvent.FINISHED) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id="run", kind=kind)  # type: ignore[arg-type]


def run(scenario: Callable[[FakeScheduler, SchedulerLink], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        fake, port = FakeScheduler(), free_port()
        server = await _serve(fake, port)
        link = SchedulerLink(f"127.0.0.1:{port}", RunTable(), "dp-test")
        await link.start()
        try:
            await scenario(fake, link)
        finally:
            await asyncio.wait_for(link.close(), 10)
            await server.stop(None)

    asyncio.run(main())


def test_events_reported_once_connected_reach_the_scheduler_in_order() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        await _until(lambda: link.connected, "connected")
        for i in range(5):
            link.report(_event(f"t{i}"))
        await _until(lambda: len(fake.events) == 5, "all events delivered")
        assert [t for t, _ in fake.events] == [f"t{i}" for i in range(5)]

    run(scenario)


def test_a_full_queue_ends_the_stream_and_resyncs_then_events_flow_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_EVENTS", 5)

    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        fake.reading.clear()  # the scheduler stops reading the Report stream
        await _until(lambda: link.connected, "connected")
        for i in range(12):
            link.report(_event(f"t{i}"))
        fake.reading.set()
        await _until(lambda: len(fake.resyncs) == 2 and link.connected, "resynced after the overflow")
        link.report(_event("after"))
        await _until(lambda: ("after", pb.TurnEvent.FINISHED) in fake.events, "an event after the resync")
        assert [t for t, _ in fake.events] == ["t0", "t1", "t2", "t3", "t4", "after"]

    run(scenario)


def test_a_queue_that_fills_while_the_resync_is_out_is_resnapshotted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_EVENTS", 5)

    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        await _until(lambda: link.connected, "connected")
        fake.resync_delay = 0.5
        fake.reading.clear()
        for i in range(6):  # overflow: the stream ends and a slow Resync goes out
            link.report(_event(f"first{i}"))
        fake.reading.set()
        await _until(lambda: not link.connected, "reconnecting")
        for i in range(8):  # the new connection's queue overflows during its Resync
            link.report(_event(f"during{i}"))
        fake.resync_delay = 0.0
        await _until(lambda: len(fake.resyncs) >= 3 and link.connected, "snapshotted again")
        link.report(_event("later"))
        await _until(lambda: ("later", pb.TurnEvent.FINISHED) in fake.events, "events flow after it")

    run(scenario)


def test_close_returns_after_an_overflow_while_the_scheduler_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_EVENTS", 3)

    async def main() -> None:
        fake, port = FakeScheduler(), free_port()
        server = await _serve(fake, port)
        link = SchedulerLink(f"127.0.0.1:{port}", RunTable(), "dp-test")
        await link.start()
        await _until(lambda: link.connected, "connected")
        fake.reading.clear()
        for i in range(5):
            link.report(_event(f"t{i}"))
        await server.stop(None)
        await asyncio.wait_for(link.close(), 5)  # before the fix this never returned

    asyncio.run(main())


def test_a_placement_answered_across_a_resync_stands_as_the_resync_lists_it_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_EVENTS", 2)

    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        release = asyncio.Event()

        async def late(request: pb.AdmitRequest, context: Any) -> pb.AdmitReply:
            await release.wait()
            return pb.AdmitReply(placed=pb.Placement(replica="a"))

        fake.admit_hook = late
        await _until(lambda: link.connected, "connected")
        request = pb.AdmitRequest(turn_id="the-turn", run_id="run", model="m")
        admit = asyncio.ensure_future(link.admit(request))
        await _until(lambda: fake.admits == ["the-turn"], "the Admit is out")
        fake.reading.clear()
        for i in range(3):  # force a reconnect (and so a Resync) while the Admit is out
            link.report(_event(f"x{i}"))
        fake.reading.set()
        await _until(lambda: len(fake.resyncs) == 2 and link.connected, "resynced")
        assert list(fake.resyncs[1].pending_turn_ids) == ["the-turn"]
        release.set()
        reply = await asyncio.wait_for(admit, 10)
        assert reply.WhichOneof("outcome") == "placed"
        assert fake.admits == ["the-turn"]  # not asked again, keeps its place
        link.report(_event("after"))
        await _until(lambda: ("after", pb.TurnEvent.FINISHED) in fake.events, "later events")
        assert ("the-turn", pb.TurnEvent.ABANDONED) not in fake.events
        assert link._pending == set()

    run(scenario)


def test_a_scheduler_fault_other_than_unavailability_is_raised_not_retried() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        async def broken(request: pb.AdmitRequest, context: Any) -> pb.AdmitReply:
            await context.abort(grpc.StatusCode.INTERNAL, "bug in the scheduler")
            raise AssertionError("unreachable")

        fake.admit_hook = broken
        await _until(lambda: link.connected, "connected")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(link.admit(pb.AdmitRequest(turn_id="t", run_id="r", model="m")), 10)
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert fake.admits == ["t"]

    run(scenario)
