"""The scheduler as a real process: gRPC ``Connect`` streams and ``GET /status`` on loopback.

Every test starts ``luftpause scheduler --config FILE`` as a child process on free ports and stops
it, even on failure; clients are real ``grpc.aio`` streams (:class:`Stream`, a dataplane's side
reduced to what a test needs) and aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

WAIT_S = 30.0  # a fail-safe for polling, never a measured bound (a loaded 2-core machine)


@dataclass
class Scheduler:
    grpc_address: str
    status_url: str
    process: ChildProcess


def start_scheduler(tmp_path: Path, replicas: str) -> Scheduler:
    grpc_port, http_port = free_port(), free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{http_port}"\n\n{replicas}'
    )
    process = ChildProcess(
        "scheduler",
        ["scheduler", "--config", str(config)],
        log_path=tmp_path / "scheduler.log",
        ready_url=f"http://127.0.0.1:{http_port}/health",
    )
    process.start()
    try:
        process.wait_ready()
    except BaseException:
        process.kill()
        raise
    return Scheduler(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}/status", process)


ONE_SLOT = """
[[replicas]]
name = "solo"
url = "http://127.0.0.1:1"
health_path = ""  # nothing listens: not health-checked, so it stays in rotation
models = ["m"]
max_inflight = 1
"""

TWO_REPLICAS = """
[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
health_path = ""  # nothing listens: not health-checked, so it stays in rotation
models = ["m"]
max_inflight = 2

[[replicas]]
name = "b"
url = "http://127.0.0.1:2"
health_path = ""
models = ["m"]
max_inflight = 2
"""


GENERATIVE_AND_SINGLE_PASS = """
[[replicas]]
name = "gen"
url = "http://127.0.0.1:1"
health_path = ""
models = ["m"]
max_inflight = 1

[[replicas]]
name = "judge"
url = "http://127.0.0.1:2"
health_path = ""
kind = "single_pass"
models = ["m"]
max_inflight = 1
"""


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[Scheduler]:
    scheduler = start_scheduler(tmp_path, ONE_SLOT)
    try:
        yield scheduler
    finally:
        scheduler.process.stop()


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[Scheduler]:
    scheduler = start_scheduler(tmp_path, TWO_REPLICAS)
    try:
        yield scheduler
    finally:
        scheduler.process.stop()


def one(**item: Any) -> pb.DataplaneMessage:
    """A ``DataplaneMessage`` of one item (``resync=``, ``admit=``, ``cancel=`` or ``event=``)."""
    return pb.DataplaneMessage(items=[pb.DataplaneItem(**item)])


class Stream:
    """One ``Connect`` stream as a dataplane holds it: answers are collected by turn id, in order.

    Use ``async with Stream(stub) as stream`` (it opens with an empty resync unless given one) and
    ``await stream.admit(...)``, or :meth:`send_admit` and :meth:`answer` to keep several out.
    """

    def __init__(self, stub: pb_grpc.SchedulerStub, resync: pb.ResyncRequest | None = None) -> None:
        self.stub = stub
        self.resync = resync or pb.ResyncRequest(dataplane_id="dp-test")
        self.call: Any = None
        self.acked: asyncio.Future[pb.ResyncReply] | None = None
        self.answers: dict[str, asyncio.Future[pb.AdmitReply]] = {}
        self.order: list[str] = []  # turn ids in the order their answers came
        self.replicas: list[list[str]] = []  # the replica sets the scheduler sent, names in order
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stream:
        self.call = self.stub.Connect()
        self.acked = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        await self.call.write(one(resync=self.resync))
        await asyncio.wait_for(asyncio.shield(self.acked), WAIT_S)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.call.cancel()
        assert self._reader is not None
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        assert self.acked is not None
        async for message in self.call:
            for item in message.items:
                kind = item.WhichOneof("item")
                if kind == "resynced":
                    self.acked.set_result(item.resynced)
                elif kind == "replicas":
                    self.replicas.append([spec.name for spec in item.replicas.replicas])
                elif kind == "admitted":
                    self.order.append(item.admitted.turn_id)
                    self._future(item.admitted.turn_id).set_result(item.admitted)

    def _future(self, turn_id: str) -> asyncio.Future[pb.AdmitReply]:
        if turn_id not in self.answers:
            self.answers[turn_id] = asyncio.get_running_loop().create_future()
        return self.answers[turn_id]

    async def send_admit(self, request: pb.AdmitRequest) -> None:
        self.answers.pop(request.turn_id, None)  # an admit sent again waits for a new answer
        self._future(request.turn_id)
        await self.call.write(one(admit=request))

    async def answer(self, turn_id: str) -> pb.AdmitReply:
        return await asyncio.wait_for(asyncio.shield(self._future(turn_id)), WAIT_S)

    async def admit(self, request: pb.AdmitRequest) -> pb.AdmitReply:
        await self.send_admit(request)
        return await self.answer(request.turn_id)

    async def cancel(self, turn_id: str) -> None:
        await self.call.write(one(cancel=pb.CancelAdmit(turn_id=turn_id)))

    async def event(self, turn_id: str, run_id: str, kind: int, **fields: Any) -> None:
        event = pb.TurnEvent(turn_id=turn_id, run_id=run_id, kind=kind, **fields)  # type: ignore[arg-type]
        await self.call.write(one(event=event))


Scenario = Callable[[pb_grpc.SchedulerStub, "StatusReader"], Awaitable[None]]


class StatusReader:
    """``GET /status`` as JSON, and polling until a condition on it holds."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def get(self) -> dict[str, Any]:
        async with self.session.get(self.url) as response:
            assert response.status == 200
            assert response.content_type == "application/json"
            body: dict[str, Any] = await response.json()
            return body

    async def until(self, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            status = await self.get()
            if condition(status):
                return status
            if loop.time() > deadline:
                raise AssertionError(f"condition never held; last status: {status}")
            await asyncio.sleep(0.02)


def run_scenario(scheduler: Scheduler, scenario: Scenario) -> None:
    async def main() -> None:
        async with (
            grpc.aio.insecure_channel(scheduler.grpc_address) as channel,
            aiohttp.ClientSession() as session,
        ):
            await scenario(pb_grpc.SchedulerStub(channel), StatusReader(session, scheduler.status_url))

    asyncio.run(main())


def admit(turn: str, run: str, model: str = "m", **fields: Any) -> pb.AdmitRequest:
    return pb.AdmitRequest(turn_id=turn, run_id=run, model=model, dataplane_id="dp-test", **fields)


def inflight(status: dict[str, Any]) -> dict[str, int]:
    return {replica["name"]: replica["inflight"] for replica in status["replicas"]}


# -- tests ----------------------------------------------------------------------------------------------


def test_admit_places_the_turn_on_a_replica_serving_its_model(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            first = await stream.admit(admit("t1", "r1"))
            second = await stream.admit(admit("t2", "r2"))
        assert (first.turn_id, second.turn_id) == ("t1", "t2")
        assert first.WhichOneof("outcome") == "placed"
        # two idle runs on two empty replicas: least loaded first, so they spread
        assert {first.placed.replica, second.placed.replica} == {"a", "b"}
        now = await status.get()
        assert inflight(now) == {"a": 1, "b": 1}
        assert now["runs"] == {"idle": 0, "generating": 2, "tool_paused": 0}
        assert now["counters"]["admitted"] == 2

    run_scenario(two_replicas, scenario)


def test_unknown_model_is_refused_with_404(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            reply = await stream.admit(admit("t1", "r1", model="gpt-nope"))
        assert reply.WhichOneof("outcome") == "refused"
        assert reply.refused.reason == "no Generative replica serves model 'gpt-nope'"
        assert reply.refused.http_status == 404
        now = await status.get()
        assert now["held"]["count"] == 0
        assert sum(inflight(now).values()) == 0
        assert now["counters"]["rejected"] == 1
        assert now["runs"] == {"idle": 0, "generating": 0, "tool_paused": 0}

    run_scenario(two_replicas, scenario)


def test_a_held_admit_waits_until_a_finished_report_frees_the_slot(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            first = await stream.admit(admit("t1", "r1"))
            assert first.placed.replica == "solo"
            await stream.send_admit(admit("t2", "r2", service_class=pb.BATCH, caller="ci"))
            held = await status.until(lambda s: s["held"]["count"] == 1)
            assert held["held"]["by_class"] == {"interactive": 0, "batch": 1}
            assert held["held"]["by_caller"] == {"ci": 1}
            assert inflight(held) == {"solo": 1}
            assert not stream.answers["t2"].done()

            await stream.event("t1", "r1", pb.TurnEvent.STARTED)
            await stream.event("t1", "r1", pb.TurnEvent.FIRST_TOKEN)
            await stream.event(
                "t1", "r1", pb.TurnEvent.FINISHED, finish_reason="stop", prompt_tokens=12, completion_tokens=3
            )
            second = await stream.answer("t2")
            assert second.placed.replica == "solo"

            after = await status.get()
            assert after["held"]["count"] == 0
            assert inflight(after) == {"solo": 1}
            assert after["counters"]["finished"] == 1
            assert after["runs"] == {"idle": 1, "generating": 1, "tool_paused": 0}

    run_scenario(one_slot, scenario)


def test_a_cancelled_held_admit_leaves_the_queue(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            await stream.admit(admit("t1", "r1"))
            await stream.send_admit(admit("t2", "r2"))
            await status.until(lambda s: s["held"]["count"] == 1)
            await stream.cancel("t2")
            gone = await status.until(lambda s: s["held"]["count"] == 0)
            assert gone["counters"]["abandoned"] == 1

            # the abandoned turn never took the slot: once t1 fails, nothing is in flight
            await stream.event("t1", "r1", pb.TurnEvent.FAILED, error="gone")
            after = await status.until(lambda s: s["counters"]["failed"] == 1)
            assert inflight(after) == {"solo": 0}
            assert not stream.answers["t2"].done()  # a cancelled admit is never answered

    run_scenario(one_slot, scenario)


def test_a_cancel_crossing_its_placement_on_the_wire_frees_the_slot(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            await stream.admit(admit("t1", "r1"))
            await stream.send_admit(admit("t2", "r2"))
            await status.until(lambda s: s["held"]["count"] == 1)
            # t1 ends, which places t2; the cancel of t2 is sent before that answer could be read
            await stream.event("t1", "r1", pb.TurnEvent.FINISHED, finish_reason="stop")
            await stream.cancel("t2")
            crossed = await stream.answer("t2")
            assert crossed.placed.replica == "solo"  # the placement went out ...
            after = await status.until(lambda s: s["counters"]["abandoned"] == 1)
            assert inflight(after) == {"solo": 0}  # ... and the cancel behind it gave the slot back
            assert after["runs"] == {"idle": 2, "generating": 0, "tool_paused": 0}

    run_scenario(one_slot, scenario)


def test_many_admits_on_one_stream_are_answered_in_decision_order(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            assert (await stream.admit(admit("t0", "r0"))).placed.replica == "solo"
            # three held behind the one slot, batch before interactive on the wire
            await stream.send_admit(admit("b1", "rb1", service_class=pb.BATCH))
            await stream.send_admit(admit("b2", "rb2", service_class=pb.BATCH))
            await stream.send_admit(admit("i1", "ri1"))
            await status.until(lambda s: s["held"]["count"] == 3)
            # an unknown model sent last is refused at once, ahead of the three sent before it
            refused = await stream.admit(admit("x", "rx", model="gpt-nope"))
            assert refused.refused.http_status == 404
            assert stream.order == ["t0", "x"]
            run_of = {"t0": "r0", "b1": "rb1", "b2": "rb2", "i1": "ri1"}
            for answered in (3, 4, 5):  # each finish frees the slot for the next held turn
                previous = stream.order[-1] if stream.order[-1] != "x" else "t0"
                await stream.event(previous, run_of[previous], pb.TurnEvent.FINISHED, finish_reason="stop")
                async with asyncio.timeout(WAIT_S):
                    while len(stream.order) < answered:  # noqa: ASYNC110 - filled by the stream's reader
                        await asyncio.sleep(0.01)
                assert (await stream.answer(stream.order[-1])).placed.replica == "solo"
        # interactive first, then arrival order: not the order they were sent
        assert stream.order == ["t0", "x", "i1", "b1", "b2"]

    run_scenario(one_slot, scenario)


def test_a_retried_admit_of_a_placed_turn_gets_its_placement(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            first = await stream.admit(admit("t1", "r1"))
            await stream.admit(admit("t2", "r2"))
        # the first stream is gone; its dataplane resyncs with t1 pending and asks again
        resync = pb.ResyncRequest(dataplane_id="dp-test", pending_turn_ids=["t1"])
        async with Stream(stub, resync) as again:
            reply = await again.admit(admit("t1", "r1"))
        assert reply.placed.replica == first.placed.replica
        assert sum(inflight(await status.get()).values()) == 1  # t2 was neither listed nor pending

    run_scenario(two_replicas, scenario)


def test_resync_is_counted_against_capacity_and_keeps_affinity(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        resync = pb.ResyncRequest(
            dataplane_id="dp-test",
            runs=[
                pb.RunRecord(run_id="q1", last_replica="b", phase=pb.TOOL_PAUSED),
                pb.RunRecord(run_id="q2", last_replica="a", phase=pb.GENERATING),
            ],
            turns=[
                pb.InFlightTurn(turn_id="x1", run_id="q2", replica="a", model="m"),
                pb.InFlightTurn(turn_id="x1", run_id="q2", replica="a", model="m"),
                pb.InFlightTurn(turn_id="x2", run_id="q3", replica="a", model="m"),
            ],
        )
        async with Stream(stub, resync) as stream:
            assert stream.acked is not None
            reply = stream.acked.result()
            assert (reply.runs, reply.turns) == (2, 2)
            now = await status.get()
            assert inflight(now) == {"a": 2, "b": 0}
            assert now["counters"]["adopted"] == 2
            assert now["runs"] == {"idle": 0, "generating": 2, "tool_paused": 1}
            # a is full with the adopted turns: a new run goes to b, and so does q1, paused on b
            assert (await stream.admit(admit("t1", "r1"))).placed.replica == "b"
            assert (await stream.admit(admit("t2", "q1"))).placed.replica == "b"

    run_scenario(two_replicas, scenario)


def test_a_stream_that_does_not_open_with_its_resync_is_refused(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        call = stub.Connect()
        await call.write(one(admit=admit("t1", "r1")))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in call:
                raise AssertionError("nothing is answered before the resync")
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await status.get())["counters"]["admitted"] == 0

    run_scenario(two_replicas, scenario)


def test_held_admits_of_a_stream_that_ends_are_abandoned(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            await stream.admit(admit("t1", "r1"))
            await stream.send_admit(admit("t2", "r2"))
            await stream.send_admit(admit("t3", "r3"))
            await status.until(lambda s: s["held"]["count"] == 2)
        gone = await status.until(lambda s: s["held"]["count"] == 0)
        assert gone["counters"]["abandoned"] == 2
        assert inflight(gone) == {"solo": 1}  # the placed turn stays until the grace runs out
        assert list(gone["lost_dataplanes"]) == ["dp-test"]

    run_scenario(one_slot, scenario)


def test_a_single_pass_admit_goes_to_the_single_pass_replica(tmp_path: Path) -> None:
    scheduler = start_scheduler(tmp_path, GENERATIVE_AND_SINGLE_PASS)

    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            assert (await stream.admit(admit("g1", "r1"))).placed.replica == "gen"
            assert (await stream.admit(admit("s1", "r2", single_pass=True))).placed.replica == "judge"
        # a single-pass turn never enters run state
        assert (await status.get())["runs"] == {"idle": 0, "generating": 1, "tool_paused": 0}

    try:
        run_scenario(scheduler, scenario)
    finally:
        scheduler.process.stop()


def test_run_ended_report_forgets_the_run(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            await stream.admit(admit("t1", "r1"))
            await stream.event("t1", "r1", pb.TurnEvent.FINISHED, tool_calls=True)
            await stream.event("", "r1", pb.TurnEvent.RUN_ENDED)
            now = await status.until(lambda s: s["counters"]["runs_ended"] == 1)
        assert now["runs"] == {"idle": 0, "generating": 0, "tool_paused": 0}

    run_scenario(two_replicas, scenario)


def test_sigterm_stops_the_scheduler_cleanly(one_slot: Scheduler) -> None:
    one_slot.process.stop()
    assert one_slot.process.poll() == 0
    log = one_slot.process.log_tail()
    assert f"luftpause scheduler: gRPC on {one_slot.grpc_address}, status on {one_slot.status_url}" in log


def test_a_bad_configuration_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[replicas]]\nname = "a"\nurl = "ftp://x"\nmodels = ["m"]\n')
    process = ChildProcess("scheduler", ["scheduler", "--config", str(config)], log_path=tmp_path / "log")
    process.start()
    try:
        assert process.proc is not None
        assert process.proc.wait(timeout=WAIT_S) == 2
        assert "bad.toml: replicas[0].url" in process.log_tail()
    finally:
        process.kill()


# -- the link to dataplanes: keepalive pings and large messages ------------------------------------------

# Pings far more often than a dataplane (every 10 s), with or without a call open; a client sends
# at most 2 pings without data unless max_pings_without_data is 0. gRPC 1.85 still sends them only
# about once a second: a server with gRPC's default options strikes from the third ping with no data
# moving and sends GOAWAY too_many_pings at the fifth, within HOLD_S.
EAGER_PINGS = [
    ("grpc.keepalive_time_ms", 200),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
HOLD_S = 6.0  # how long the link is watched, with a stream open and with no call: ~6 pings each


def test_eager_keepalive_pings_never_cost_the_link(one_slot: Scheduler) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(one_slot.grpc_address, options=EAGER_PINGS) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            # a GOAWAY (too_many_pings) takes the channel out of READY, even with no call open
            left_ready: asyncio.Future[None] | None = None
            try:
                async with Stream(stub) as stream:
                    assert (await stream.admit(admit("t1", "r1"))).placed.replica == "solo"
                    assert channel.get_state() == grpc.ChannelConnectivity.READY
                    left_ready = asyncio.ensure_future(
                        channel.wait_for_state_change(grpc.ChannelConnectivity.READY)
                    )
                    await stream.event("t1", "r1", pb.TurnEvent.STARTED)
                    await asyncio.sleep(HOLD_S)  # the stream stays open, no data moves: only pings
                    assert not left_ready.done(), f"the link dropped: channel went {channel.get_state()}"
                    await stream.event("t1", "r1", pb.TurnEvent.FIRST_TOKEN)
                await asyncio.sleep(HOLD_S)  # no call open at all: only pings
                assert not left_ready.done(), f"the link dropped: channel went {channel.get_state()}"
            finally:
                if left_ready is not None:
                    left_ready.cancel()
                    await asyncio.gather(left_ready, return_exceptions=True)
            resync = pb.ResyncRequest(dataplane_id="dp-test", pending_turn_ids=["t1"])
            async with Stream(stub, resync) as stream:
                assert (await stream.admit(admit("t1", "r1"))).placed.replica == "solo"

    asyncio.run(main())


def test_a_resync_of_ten_megabytes_is_taken_over(two_replicas: Scheduler) -> None:
    runs = 40_000
    request = pb.ResyncRequest(
        dataplane_id="dp-test",
        runs=[
            pb.RunRecord(
                run_id=f"{i:08d}".ljust(200, "r"),  # the dataplane's limit is 256 bytes
                last_replica="a" if i % 2 else "b",
                phase=pb.TOOL_PAUSED if i % 2 else pb.IDLE,
                caller="c" * 40,
            )
            for i in range(runs)
        ],
    )
    assert request.ByteSize() > 10_000_000  # well past gRPC's default 4 MiB receive limit

    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub, request) as stream:
            assert stream.acked is not None
            reply = stream.acked.result()
            assert (reply.runs, reply.turns) == (runs, 0)
            now = await status.get()
            assert now["runs"] == {"idle": runs // 2, "generating": 0, "tool_paused": runs // 2}

    run_scenario(two_replicas, scenario)


# -- turns the dataplane reports abandoned ---------------------------------------------------------------

ABANDONED_REASON = "turn was abandoned by its dataplane"


def test_an_abandoned_report_frees_a_placed_turns_slot_and_refuses_later_admits(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            # the client left while t1's admit was on the wire: the placement crossed the cancel
            assert (await stream.admit(admit("t1", "r1"))).placed.replica == "solo"
            await stream.event("t1", "r1", pb.TurnEvent.ABANDONED)
            freed = await status.until(lambda s: inflight(s) == {"solo": 0})
            assert freed["runs"] == {"idle": 1, "generating": 0, "tool_paused": 0}
            assert freed["counters"]["abandoned"] == 1

            # t9 reported abandoned before its admit arrived
            await stream.event("t9", "r9", pb.TurnEvent.ABANDONED)
            for turn in ("t9", "t1"):  # and a retried admit of t1 is refused too
                reply = await stream.admit(admit(turn, "r9"))
                assert reply.WhichOneof("outcome") == "refused"
                assert (reply.refused.reason, reply.refused.http_status) == (ABANDONED_REASON, 499)
            after = await status.get()
            assert after["held"]["count"] == 0
            assert inflight(after) == {"solo": 0}
            assert after["runs"] == {"idle": 1, "generating": 0, "tool_paused": 0}

    run_scenario(one_slot, scenario)


def test_an_abandoned_report_answers_the_held_admit_of_that_turn(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub) as stream:
            await stream.admit(admit("t1", "r1"))
            await stream.send_admit(admit("t2", "r2"))
            await status.until(lambda s: s["held"]["count"] == 1)
            await stream.event("t2", "r2", pb.TurnEvent.ABANDONED)
            reply = await stream.answer("t2")
            assert (reply.refused.reason, reply.refused.http_status) == (ABANDONED_REASON, 499)
            after = await status.get()
            assert after["held"]["count"] == 0
            assert inflight(after) == {"solo": 1}
            assert after["counters"]["abandoned"] == 1

    run_scenario(one_slot, scenario)


# -- HTTP errors -----------------------------------------------------------------------------------------


def test_http_errors_are_answered_with_the_json_error_body(one_slot: Scheduler) -> None:
    base = one_slot.status_url.removesuffix("/status")

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/nope") as response:
                assert response.status == 404
                assert response.content_type == "application/json"
                assert await response.json() == {"error": {"message": "no route GET /nope"}}
            async with session.post(f"{base}/status", data=b"{}") as response:
                assert response.status == 405
                assert response.content_type == "application/json"
                assert response.headers["Allow"] == "GET, HEAD"
                assert await response.json() == {"error": {"message": "/status takes GET, HEAD, not POST"}}

    asyncio.run(main())
