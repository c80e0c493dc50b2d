"""The scheduler names a turn's run by the tool-call ids it answers, for whichever dataplane asks
(a real scheduler process, real ``grpc.aio`` streams; docs/architecture.md "Several workers and
several dataplanes").

One dataplane's finished turn reports the ids it emitted; another dataplane's admission that sends
them (``AdmitRequest.tool_call_ids``, under a run id it made up) is admitted as that run's, on its
replica, and told so (``AdmitReply.run_id``). A resync carries a tool-paused run's ids to a
restarted scheduler; an ended run is found no more; ``GET /status`` lists each dataplane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc
from tests.scheduler.test_connect_streams_and_status import (
    TWO_REPLICAS,
    Scheduler,
    StatusReader,
    Stream,
    run_scenario,
    start_scheduler,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[Scheduler]:
    scheduler = start_scheduler(tmp_path, TWO_REPLICAS)
    try:
        yield scheduler
    finally:
        scheduler.process.stop()


def _admit(turn: str, run: str, dataplane: str, *ids: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(turn_id=turn, run_id=run, model="m", dataplane_id=dataplane, tool_call_ids=ids)


def _dataplanes(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in status["dataplanes"]}


async def _paused_on(stream: Stream, status: StatusReader, turn: str, run: str, *ids: str) -> str:
    """Admit ``turn`` of ``run`` on ``stream`` and finish it on the tool calls ``ids``: its replica."""
    placed = await stream.admit(_admit(turn, run, stream.resync.dataplane_id))
    await stream.event(turn, run, pb.TurnEvent.FINISHED, tool_calls=True, tool_call_ids=list(ids))
    await status.until(lambda s: s["runs"]["tool_paused"] >= 1 and s["tool_call_runs"]["ids"] >= len(ids))
    return placed.placed.replica


def test_a_turn_another_dataplane_relayed_is_admitted_as_the_run_that_emitted_its_calls(
    two_replicas: Scheduler,
) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        first = Stream(stub, pb.ResyncRequest(dataplane_id="dp-a"))
        second = Stream(stub, pb.ResyncRequest(dataplane_id="dp-b"))
        async with first, second:
            await first.admit(_admit("t0", "busy", "dp-a"))
            replica = await _paused_on(first, status, "t1", "agent", "call_1", "call_2")

            reply = await second.admit(_admit("t2", "run-made-up", "dp-b", "call_2"))
            assert reply.WhichOneof("outcome") == "placed"
            assert reply.run_id == "agent"
            assert reply.placed.replica == replica  # the run's replica (strict affinity)

            # ids nobody emitted: the made-up run stands, and the answer names none
            unknown = await second.admit(_admit("t3", "run-new", "dp-b", "call_9"))
            assert unknown.WhichOneof("outcome") == "placed" and unknown.run_id == ""

            now = await status.get()
            assert now["tool_call_runs"]["asked"] == 2 and now["tool_call_runs"]["found"] == 1
            runs = now["runs"]
            assert runs["generating"] == 3 and runs["tool_paused"] == 0  # busy, agent, run-new
            dataplanes = _dataplanes(now)
            assert set(dataplanes) == {"dp-a", "dp-b"}
            assert dataplanes["dp-a"]["connected"] and dataplanes["dp-b"]["connected"]
            assert (dataplanes["dp-a"]["turns_total"], dataplanes["dp-b"]["turns_total"]) == (2, 2)
            assert (dataplanes["dp-a"]["turns_in_flight"], dataplanes["dp-b"]["turns_in_flight"]) == (1, 2)
        gone = await status.until(lambda s: not any(d["connected"] for d in s["dataplanes"]))
        assert all(d["lost_s"] is not None for d in gone["dataplanes"])

    run_scenario(two_replicas, scenario)


def test_an_ended_run_is_not_found_by_its_tool_calls_until_a_turn_names_it(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        first = Stream(stub, pb.ResyncRequest(dataplane_id="dp-a"))
        second = Stream(stub, pb.ResyncRequest(dataplane_id="dp-b"))
        async with first, second:
            await _paused_on(first, status, "t1", "agent", "call_1")
            await first.event("", "agent", pb.TurnEvent.RUN_ENDED)
            await status.until(lambda s: s["tool_call_runs"]["ended_runs"] == 1)

            reply = await second.admit(_admit("t2", "run-made-up", "dp-b", "call_1"))
            assert reply.run_id == ""

            # named again by its client: its ids count again
            await second.admit(_admit("t3", "agent", "dp-b"))
            await second.event(
                "t3", "agent", pb.TurnEvent.FINISHED, tool_calls=True, tool_call_ids=["call_3"]
            )
            await status.until(lambda s: s["tool_call_runs"]["ended_runs"] == 0)
            again = await first.admit(_admit("t4", "run-other", "dp-a", "call_3"))
            assert again.run_id == "agent"

    run_scenario(two_replicas, scenario)


def test_a_resync_gives_a_restarted_scheduler_the_tool_calls_of_paused_runs(two_replicas: Scheduler) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        paused = pb.RunRecord(
            run_id="agent", last_replica="b", phase=pb.TOOL_PAUSED, tool_call_ids=["call_7", "call_8"]
        )
        first = Stream(stub, pb.ResyncRequest(dataplane_id="dp-a", runs=[paused]))
        second = Stream(stub, pb.ResyncRequest(dataplane_id="dp-b"))
        async with first, second:
            reply = await second.admit(_admit("t1", "run-made-up", "dp-b", "call_8"))
            assert reply.run_id == "agent"
            assert reply.placed.replica == "b"

    run_scenario(two_replicas, scenario)


def test_a_dataplane_without_a_name_is_listed_and_shown_gone_when_its_stream_ends(
    two_replicas: Scheduler,
) -> None:
    async def scenario(stub: pb_grpc.SchedulerStub, status: StatusReader) -> None:
        async with Stream(stub, pb.ResyncRequest(dataplane_id="")):
            now = await status.get()
            assert [(d["id"], d["connected"]) for d in now["dataplanes"]] == [("", True)]
        after = await status.until(lambda s: not s["dataplanes"][0]["connected"])
        assert after["dataplanes"][0]["lost_s"] is None  # a dataplane named "" is never taken as lost

    run_scenario(two_replicas, scenario)
