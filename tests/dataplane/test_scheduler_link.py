"""The dataplane's scheduler link against an in-process fake scheduler (real gRPC on loopback).

Covers what the real scheduler cannot be made to do on cue: a slow resync, a stream that is not
read, admissions answered in an order the test picks, an answer held back across a reconnect, a
scheduler that goes away and comes back on the same port, a non-transient error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import grpc.aio
import pytest

from luftpause.dataplane.link import admission
from luftpause.dataplane.link.admission import SchedulerLink, _Outbox
from luftpause.dataplane.runs import RunRecord, RunTable
from luftpause.testkit.launch.procs import free_port
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

AdmitHook = Callable[[pb.AdmitRequest], Coroutine[Any, Any, pb.AdmitReply]]


def placed(turn_id: str, replica: str = "a") -> pb.AdmitReply:
    return pb.AdmitReply(turn_id=turn_id, placed=pb.Placement(replica=replica))


class FakeScheduler(pb_grpc.SchedulerServicer):  # type: ignore[misc]
    """Records what it is sent on each ``Connect`` stream; tests steer it through its events and hooks.

    Each admit is answered by its own task (``admit_hook``, placed on ``a`` by default), so many are
    outstanding at once and their answers go out in the order the hooks return.
    """

    def __init__(self) -> None:
        self.resyncs: list[pb.ResyncRequest] = []
        self.events: list[tuple[str, int]] = []
        self.admits: list[str] = []
        self.cancels: list[str] = []
        self.resync_delay = 0.0
        self.reading = asyncio.Event()
        self.reading.set()
        self.admit_hook: AdmitHook | None = None
        self.abort_on_admit: grpc.StatusCode | None = None
        self.batches: list[int] = []  # items per message read, in order

    async def Connect(self, requests: Any, context: Any) -> None:
        write = asyncio.Lock()  # one write at a time on a stream
        answering: set[asyncio.Task[None]] = set()

        async def send(item: pb.SchedulerItem) -> None:
            async with write:
                await context.write(pb.SchedulerMessage(items=[item]))

        async def answer(request: pb.AdmitRequest) -> None:
            hook = self.admit_hook
            reply = await hook(request) if hook is not None else placed(request.turn_id)
            await send(pb.SchedulerItem(admitted=reply))

        try:
            first = await context.read()
            self.batches.append(len(first.items))
            assert first.items[0].WhichOneof("item") == "resync"
            await asyncio.sleep(self.resync_delay)
            self.resyncs.append(first.items[0].resync)
            await send(pb.SchedulerItem(resynced=pb.ResyncReply()))
            items = list(first.items[1:])
            while True:
                if not items:
                    await self.reading.wait()
                    message = await context.read()
                    if message is grpc.aio.EOF:
                        return
                    self.batches.append(len(message.items))
                    items = list(message.items)
                item = items.pop(0)
                kind = item.WhichOneof("item")
                if kind == "event":
                    self.events.append((item.event.turn_id, item.event.kind))
                elif kind == "cancel":
                    self.cancels.append(item.cancel.turn_id)
                elif kind == "admit":
                    self.admits.append(item.admit.turn_id)
                    if self.abort_on_admit is not None:
                        await context.abort(self.abort_on_admit, "bug in the scheduler")
                    task = asyncio.create_task(answer(item.admit))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
        finally:
            for task in list(answering):
                task.cancel()
            await asyncio.gather(*answering, return_exceptions=True)


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


def _admit(turn_id: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(turn_id=turn_id, run_id=f"run-{turn_id}", model="m")


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


def test_what_one_loop_iteration_queues_goes_out_as_one_message_in_order() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        await _until(lambda: link.connected, "connected")
        assert fake.batches == [1]  # the resync, alone
        admit = asyncio.ensure_future(link.admit(_admit("a1")))
        await asyncio.sleep(0)  # the admit task queues its item
        for i in range(3):
            link.report(_event(f"t{i}"))
        await _until(lambda: len(fake.events) == 3, "all events delivered")
        assert fake.batches == [1, 4]
        assert fake.admits == ["a1"]
        assert [t for t, _ in fake.events] == ["t0", "t1", "t2"]
        assert (await asyncio.wait_for(admit, 10)).placed.replica == "a"
        link.report(_event("alone"))
        await _until(lambda: len(fake.events) == 4, "a lone event delivered")
        assert fake.batches == [1, 4, 1]

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


def test_a_placement_lost_with_its_stream_is_asked_again_under_the_same_turn_id_as_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "MAX_QUEUED_EVENTS", 2)

    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        release = asyncio.Event()

        async def late(request: pb.AdmitRequest) -> pb.AdmitReply:
            await release.wait()
            return placed(request.turn_id)

        fake.admit_hook = late
        await _until(lambda: link.connected, "connected")
        admit = asyncio.ensure_future(link.admit(_admit("the-turn")))
        await _until(lambda: fake.admits == ["the-turn"], "the admit is out")
        fake.reading.clear()
        for i in range(3):  # force a reconnect (and so a resync) while the admit is out
            link.report(_event(f"x{i}"))
        fake.reading.set()
        await _until(lambda: len(fake.resyncs) == 2 and link.connected, "resynced")
        assert list(fake.resyncs[1].pending_turn_ids) == ["the-turn"]
        await _until(lambda: fake.admits == ["the-turn", "the-turn"], "asked again on the new stream")
        assert not admit.done()
        release.set()
        reply = await asyncio.wait_for(admit, 10)
        assert (reply.turn_id, reply.placed.replica) == ("the-turn", "a")
        link.report(_event("after"))
        await _until(lambda: ("after", pb.TurnEvent.FINISHED) in fake.events, "later events")
        assert fake.cancels == []
        assert link._admits == {}

    run(scenario)


def test_many_admissions_are_out_at_once_and_answered_out_of_order() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        gates = {f"t{i}": asyncio.Event() for i in range(8)}

        async def when_released(request: pb.AdmitRequest) -> pb.AdmitReply:
            await gates[request.turn_id].wait()
            return placed(request.turn_id, replica=f"replica-of-{request.turn_id}")

        fake.admit_hook = when_released
        await _until(lambda: link.connected, "connected")
        admits = {turn: asyncio.ensure_future(link.admit(_admit(turn))) for turn in gates}
        # all eight reach the scheduler while none is answered: pipelined, not one at a time
        await _until(lambda: sorted(fake.admits) == sorted(gates), "every admit is out")
        assert not any(admit.done() for admit in admits.values())
        for turn in reversed(list(gates)):  # answered last first
            gates[turn].set()
            reply = await asyncio.wait_for(admits[turn], 10)
            assert (reply.turn_id, reply.placed.replica) == (turn, f"replica-of-{turn}")
            assert all(not admits[t].done() for t in gates if not gates[t].is_set())
        assert link._admits == {}

    run(scenario)


def test_a_cancelled_admit_sends_its_cancel_and_a_late_answer_is_ignored() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        release = asyncio.Event()

        async def late(request: pb.AdmitRequest) -> pb.AdmitReply:
            await release.wait()
            return placed(request.turn_id)

        fake.admit_hook = late
        await _until(lambda: link.connected, "connected")
        admit = asyncio.ensure_future(link.admit(_admit("gone")))
        await _until(lambda: fake.admits == ["gone"], "the admit is out")
        admit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admit
        await _until(lambda: fake.cancels == ["gone"], "the cancel reached the scheduler")
        release.set()  # the placement crosses the cancel: nobody waits for it any more
        fake.admit_hook = None
        reply = await asyncio.wait_for(link.admit(_admit("next")), 10)
        assert reply.turn_id == "next"
        assert link._admits == {}

    run(scenario)


def test_admits_outstanding_across_a_scheduler_restart_are_resent_after_the_resync() -> None:
    async def main() -> None:
        fake, port = FakeScheduler(), free_port()
        never = asyncio.Event()

        async def held(request: pb.AdmitRequest) -> pb.AdmitReply:
            await never.wait()
            raise AssertionError("unreachable")

        fake.admit_hook = held
        server = await _serve(fake, port)
        link = SchedulerLink(f"127.0.0.1:{port}", RunTable(), "dp-test")
        await link.start()
        admits: dict[str, asyncio.Future[pb.AdmitReply]] = {}
        try:
            await _until(lambda: link.connected, "connected")
            admits = {turn: asyncio.ensure_future(link.admit(_admit(turn))) for turn in ("h1", "h2", "h3")}
            await _until(lambda: len(fake.admits) == 3, "the admits are out")
            await server.stop(None)  # the scheduler goes away with all three held
            await _until(lambda: not link.connected, "the link noticed")
            link.report(_event("dropped"))  # between streams: the resync carries its effect
            assert not any(admit.done() for admit in admits.values())

            restarted = FakeScheduler()  # a new process: it knows nothing
            server = await _serve(restarted, port)
            await _until(lambda: link.connected, "reconnected")
            assert sorted(restarted.resyncs[0].pending_turn_ids) == ["h1", "h2", "h3"]
            replies = await asyncio.wait_for(asyncio.gather(*admits.values()), 10)
            assert [reply.turn_id for reply in replies] == ["h1", "h2", "h3"]
            assert sorted(restarted.admits) == ["h1", "h2", "h3"]
            assert restarted.events == []
        finally:
            for admit in admits.values():
                admit.cancel()
            await asyncio.gather(*admits.values(), return_exceptions=True)
            await asyncio.wait_for(link.close(), 10)
            await server.stop(None)

    asyncio.run(main())


def test_a_scheduler_fault_other_than_unavailability_is_raised_not_retried() -> None:
    async def scenario(fake: FakeScheduler, link: SchedulerLink) -> None:
        fake.abort_on_admit = grpc.StatusCode.INTERNAL
        await _until(lambda: link.connected, "connected")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(link.admit(_admit("t")), 10)
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert fake.admits == ["t"]
        assert link._admits == {}

    run(scenario)


@pytest.mark.parametrize(("idle_affinity", "expected"), [(True, "a"), (False, "b")])
def test_an_idle_runs_leased_turn_follows_the_idle_affinity_setting(
    idle_affinity: bool, expected: str
) -> None:
    """An idle run last on ``a``: with idle affinity (the default) its turn takes ``a``'s lease, which
    holds its prefix; with ``[scheduler] idle_affinity = "off"`` it takes the lease with the most slots
    left, as the scheduler would place it (leases are the default, so "off" must hold on them too)."""

    async def main() -> None:
        table = RunTable()
        table.runs["r"] = RunRecord("r", pb.INTERACTIVE, "ide", last_replica="a", phase=pb.IDLE)
        link = SchedulerLink("127.0.0.1:1", table, "dp-test", idle_affinity=idle_affinity)
        link._outbox = _Outbox()
        link._on_lease(pb.CapacityLease(replica="a", grant=1, epoch=1, models=["m"]))
        link._on_lease(pb.CapacityLease(replica="b", grant=3, epoch=1, models=["m"]))
        assert link.place_leased("t", "r", "m", pb.INTERACTIVE, "ide", None) == expected

    asyncio.run(main())
