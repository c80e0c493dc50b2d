"""The dataplane's run table: bounded by count (least recently active evicted), and its resync in
parts that the real scheduler joins, however large the table."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.runs import InFlight, RunRecord, RunTable, resync_parts
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.v1 import scheduler_pb2 as pb


def test_the_table_forgets_the_least_recently_active_run_past_its_limit() -> None:
    table = RunTable(max_runs=3)
    for i in range(3):
        table.new_run(f"r{i}", pb.INTERACTIVE, "", float(i))
    table.placed(InFlight("t0", "r0", "a", "m", pb.INTERACTIVE, ""), 3.0)  # r0 active again
    table.new_run("r3", pb.INTERACTIVE, "", 4.0)  # one too many: r1 is the least recently active
    assert list(table.runs) == ["r2", "r0", "r3"]
    assert table.evicted == 1
    table.ended("t0", False, 5.0)
    table.new_run("r4", pb.INTERACTIVE, "", 6.0)
    assert list(table.runs) == ["r3", "r0", "r4"]


def test_a_made_up_run_whose_turn_was_never_placed_is_forgotten() -> None:
    table = RunTable()
    table.new_run("made-up", pb.INTERACTIVE, "", 0.0)
    table.forget_unplaced("made-up")
    assert "made-up" not in table.runs
    table.placed(InFlight("t", "placed", "a", "m", pb.INTERACTIVE, ""), 0.0)
    table.forget_unplaced("placed")  # it reached a replica: its affinity stays
    assert "placed" in table.runs


def test_a_resync_in_parts_joins_to_the_whole() -> None:
    table = RunTable()
    for i in range(5):
        table.placed(InFlight(f"t{i}", f"r{i}", "a", "m", pb.BATCH, "c"), float(i))
    parts = asyncio.run(resync_parts(table.snapshot(), "dp", ["held"], True, per_part=2))
    assert [p.more_follows for p in parts] == [True, True, False]
    assert [list(p.pending_turn_ids) for p in parts] == [["held"], [], []]
    joined = pb.ResyncRequest()
    for part in parts:
        joined.runs.extend(part.runs)
        joined.turns.extend(part.turns)
    whole = table.resync_request("dp", ["held"], True)
    assert list(joined.runs) == list(whole.runs) and list(joined.turns) == list(whole.turns)


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[str]:
    grpc_port, http_port = free_port(), free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{http_port}"

[[replicas]]
name = "a"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]
health_path = ""
"""
    )
    child = ChildProcess(
        "scheduler",
        ["scheduler", "--config", str(config)],
        tmp_path / "scheduler.log",
        ready_url=f"http://127.0.0.1:{http_port}/health",
    )
    try:
        child.start().wait_ready()
        yield f"127.0.0.1:{grpc_port}"
    finally:
        child.stop()


@pytest.mark.integration
def test_the_real_scheduler_takes_a_resync_of_170000_runs_with_the_longest_ids(scheduler: str) -> None:
    """One message of it would be 66 MiB, over the scheduler's 64 MiB limit: refused for ever."""
    table = RunTable(max_runs=200_000)
    for i in range(170_000):
        run_id = f"run-{i}-".ljust(256, "x")
        table.runs[run_id] = RunRecord(run_id, pb.BATCH, "c" * 128, "a", pb.TOOL_PAUSED, 0.0)

    async def main() -> None:
        link = SchedulerLink(scheduler, table, "dp-many-runs")
        await link.start()
        try:
            async with asyncio.timeout(60):
                while not link.connected:  # noqa: ASYNC110 - set by the link's stream task
                    await asyncio.sleep(0.05)
        finally:
            await link.close()

    asyncio.run(main())
