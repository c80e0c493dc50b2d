"""The scheduler as a real process: gRPC Admit / Report / Resync and ``GET /status`` on loopback.

Every test starts ``luftpause scheduler --config FILE`` as a child process on free ports and stops
it, even on failure; clients are a real ``grpc.aio`` stub and aiohttp.
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

from luftpause.testkit.procs import ChildProcess, free_port
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

WAIT_S = 10.0  # a fail-safe for polling, never a measured bound


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
        first = await stub.Admit(admit("t1", "r1"))
        second = await stub.Admit(admit("t2", "r2"))
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
        reply = await stub.Admit(admit("t1", "r1", model="gpt-nope"))
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
        first = await stub.Admit(admit("t1", "r1"))
        assert first.placed.replica == "solo"
        waiting = asyncio.ensure_future(stub.Admit(admit("t2", "r2", service_class=pb.BATCH, caller="ci")))
        held = await status.until(lambda s: s["held"]["count"] == 1)
        assert held["held"]["by_class"] == {"interactive": 0, "batch": 1}
        assert held["held"]["by_caller"] == {"ci": 1}
        assert inflight(held) == {"solo": 1}
        assert not waiting.done()

        report = stub.Report()
        await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.STARTED))
        await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.FIRST_TOKEN))
        await report.write(
            pb.TurnEvent(
                turn_id="t1",
                run_id="r1",
                kind=pb.TurnEvent.FINISHED,
                finish_reason="stop",
                prompt_tokens=12,
                completion_tokens=3,
            )
        )
        second = await waiting
        assert second.placed.replica == "solo"
        await report.done_writing()
        summary = await report
        assert summary.events == 3

        after = await status.get()
        assert after["held"]["count"] == 0
        assert inflight(after) == {"solo": 1}
        assert after["counters"]["finished"] == 1
        assert after["runs"] == {"idle": 1, "generating": 1, "tool_paused": 0}

    run_scenario(one_slot, scenario)


def test_a_cancelled_held_admit_leaves_the_queue(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        await stub.Admit(admit("t1", "r1"))
        call = stub.Admit(admit("t2", "r2"))
        await status.until(lambda s: s["held"]["count"] == 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        gone = await status.until(lambda s: s["held"]["count"] == 0)
        assert gone["counters"]["abandoned"] == 1

        # the abandoned turn never took the slot: once t1 fails, nothing is in flight
        report = stub.Report()
        await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.FAILED, error="gone"))
        await report.done_writing()
        assert (await report).events == 1
        after = await status.get()
        assert inflight(after) == {"solo": 0}
        assert after["counters"]["failed"] == 1

    run_scenario(one_slot, scenario)


def test_a_retried_admit_of_a_placed_turn_gets_its_placement(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        first = await stub.Admit(admit("t1", "r1"))
        await stub.Admit(admit("t2", "r2"))
        again = await stub.Admit(admit("t1", "r1"))
        assert again.placed.replica == first.placed.replica
        assert sum(inflight(await status.get()).values()) == 2

    run_scenario(two_replicas, scenario)


def test_resync_is_counted_against_capacity_and_keeps_affinity(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        reply = await stub.Resync(
            pb.ResyncRequest(
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
        )
        assert (reply.runs, reply.turns) == (2, 2)
        now = await status.get()
        assert inflight(now) == {"a": 2, "b": 0}
        assert now["counters"]["adopted"] == 2
        assert now["runs"] == {"idle": 0, "generating": 2, "tool_paused": 1}
        # a is full with the adopted turns: a new run goes to b, and so does q1, paused on b
        assert (await stub.Admit(admit("t1", "r1"))).placed.replica == "b"
        assert (await stub.Admit(admit("t2", "q1"))).placed.replica == "b"

    run_scenario(two_replicas, scenario)


def test_run_ended_report_forgets_the_run(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        await stub.Admit(admit("t1", "r1"))
        report = stub.Report()
        await report.write(
            pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.FINISHED, tool_calls=True)
        )
        await report.write(pb.TurnEvent(run_id="r1", kind=pb.TurnEvent.RUN_ENDED))
        await report.done_writing()
        assert (await report).events == 2
        now = await status.get()
        assert now["runs"] == {"idle": 0, "generating": 0, "tool_paused": 0}
        assert now["counters"]["runs_ended"] == 1

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
            assert (await stub.Admit(admit("t1", "r1"))).placed.replica == "solo"
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            # a GOAWAY (too_many_pings) takes the channel out of READY, even with no call open
            left_ready = asyncio.ensure_future(channel.wait_for_state_change(grpc.ChannelConnectivity.READY))
            try:
                report = stub.Report()
                await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.STARTED))
                await asyncio.sleep(HOLD_S)  # the stream stays open, no data moves: only pings
                assert not left_ready.done(), f"the link dropped: channel went {channel.get_state()}"
                await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.FIRST_TOKEN))
                await report.done_writing()
                assert (await report).events == 2
                await asyncio.sleep(HOLD_S)  # no call open at all: only pings
                assert not left_ready.done(), f"the link dropped: channel went {channel.get_state()}"
            finally:
                left_ready.cancel()
                await asyncio.gather(left_ready, return_exceptions=True)
            assert (await stub.Admit(admit("t1", "r1"))).placed.replica == "solo"

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
        reply = await stub.Resync(request)
        assert (reply.runs, reply.turns) == (runs, 0)
        now = await status.get()
        assert now["runs"] == {"idle": runs // 2, "generating": 0, "tool_paused": runs // 2}

    run_scenario(two_replicas, scenario)


# -- turns the dataplane reports abandoned ---------------------------------------------------------------

ABANDONED_REASON = "turn was abandoned by its dataplane"


def test_an_abandoned_report_frees_a_placed_turns_slot_and_refuses_later_admits(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        # the client left while t1's Admit was on the wire: the placement crossed the cancel
        assert (await stub.Admit(admit("t1", "r1"))).placed.replica == "solo"
        report = stub.Report()
        await report.write(pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.ABANDONED))
        freed = await status.until(lambda s: inflight(s) == {"solo": 0})
        assert freed["runs"] == {"idle": 1, "generating": 0, "tool_paused": 0}
        assert freed["counters"]["abandoned"] == 1

        # t9 reported abandoned before its Admit arrived
        await report.write(pb.TurnEvent(turn_id="t9", run_id="r9", kind=pb.TurnEvent.ABANDONED))
        await report.done_writing()
        assert (await report).events == 2  # both applied once the summary is back
        for turn in ("t9", "t1"):  # and a retried Admit of t1 is refused too
            reply = await stub.Admit(admit(turn, "r9"))
            assert reply.WhichOneof("outcome") == "refused"
            assert (reply.refused.reason, reply.refused.http_status) == (ABANDONED_REASON, 499)
        after = await status.get()
        assert after["held"]["count"] == 0
        assert inflight(after) == {"solo": 0}
        assert after["runs"] == {"idle": 1, "generating": 0, "tool_paused": 0}

    run_scenario(one_slot, scenario)


def test_an_abandoned_report_answers_the_held_admit_of_that_turn(one_slot: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        await stub.Admit(admit("t1", "r1"))
        waiting = asyncio.ensure_future(stub.Admit(admit("t2", "r2")))
        try:
            await status.until(lambda s: s["held"]["count"] == 1)
            report = stub.Report()
            await report.write(pb.TurnEvent(turn_id="t2", run_id="r2", kind=pb.TurnEvent.ABANDONED))
            reply = await asyncio.wait_for(waiting, WAIT_S)
        finally:
            waiting.cancel()
        assert (reply.refused.reason, reply.refused.http_status) == (ABANDONED_REASON, 499)
        await report.done_writing()
        assert (await report).events == 1
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
