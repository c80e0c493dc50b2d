"""A damaged journal never makes a run vanish (issue 17, item 5): a run whose start line is damaged
stays visible, as failed with the reason when it was unfinished; a torn last line (a crash cut its
write short, so nothing it held was acknowledged) is still skipped, never fatal.

In-process over the registry and its journal, with the bytes that break each line; then the real
runtime process, SIGKILLed with a run in flight, its start line damaged on disk, restarted, and
asked through the real ``mcp`` client and the monitor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import call, get_json, script, start_pod, tool_text, until
from runtime_helpers import make_run, replay_into_registry

from luftpause.runtime.errors import UnknownRun
from luftpause.runtime.runs.journal import JOURNAL_NAME, encode, read_records
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.runs.replay import LOST_TASK

ROUND = [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
]
COUNTERS = {"turns": 1, "toolCalls": 1, "promptTokens": 10}


def _start(handle: str, **extra: Any) -> bytes:
    return encode(make_run(handle, task="find the " + "needle " * 20, **extra).start_record())


def _line(record: dict[str, Any]) -> bytes:
    return encode(record)


def _round(handle: str) -> bytes:
    return _line({"type": "round", "handle": handle, "messages": ROUND, "counters": COUNTERS})


def _end(handle: str, state: str = "completed", **extra: Any) -> bytes:
    return _line(
        {
            "type": "end",
            "handle": handle,
            "state": state,
            "finishedAt": time.time(),
            "counters": COUNTERS,
            **extra,
        }
    )


def _flip_colon(line: bytes) -> bytes:
    """One bit: the ``:`` after ``"model"`` (0x3a) read back as ``;`` (0x3b)."""
    assert b'"model":' in line
    return line.replace(b'"model":', b'"model";', 1)


def _zeroed(line: bytes) -> bytes:
    """A block of the line read back as zeros (a lost sector), inside the task; the newline kept."""
    at = line.index(b"needle")
    return line[:at] + b"\0" * 64 + line[at + 64 :]


def _cut_in_the_middle(line: bytes) -> bytes:
    """The line's second half lost, yet a newline after it (a later write landed behind it)."""
    return line[: len(line) // 2] + b"\n"


def _out_of_bounds(line: bytes) -> bytes:
    """Still JSON, no longer a start: ``maxToolCalls`` past its bound (1000)."""
    assert b'"maxToolCalls":8,' in line
    return line.replace(b'"maxToolCalls":8,', b'"maxToolCalls":8000000,', 1)


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "flipped-bit": _flip_colon,
    "zeroed-block": _zeroed,
    "cut-in-the-middle": _cut_in_the_middle,
    "out-of-bounds": _out_of_bounds,
}


def _replay(state_dir: Path, **journal: Any) -> tuple[RunRegistry, list[Run]]:
    return asyncio.run(replay_into_registry(state_dir, **journal))


def _records(state_dir: Path) -> list[dict[str, Any]]:
    return list(read_records(state_dir / JOURNAL_NAME))


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_an_unfinished_run_whose_start_line_is_damaged_stays_visible_as_failed(
    tmp_path: Path, damage: Callable[[bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(
        damage(_start("run-a")) + _round("run-a") + _start("run-b") + _end("run-b", answer="42")
    )
    with caplog.at_level(logging.ERROR):
        registry, resumed = _replay(tmp_path)

    assert resumed == []  # nothing to resume: run-a cannot be, run-b has ended
    a = registry.get("run-a")
    assert a.state == "failed" and a.durability.start_lost
    assert a.error is not None and a.error.startswith("not resumed after a restart: runs.jsonl")
    reason = a.durability.damaged or ""
    if damage is _out_of_bounds:
        assert "its start record does not fit" in reason and "maxToolCalls" in reason, reason
    else:
        assert "line 1 (start record) is damaged: not JSON" in reason, reason
    assert reason in caplog.text or "is damaged" in caplog.text
    shown = registry.status_of(a)
    assert shown["state"] == "failed" and shown["durable"] is False and shown["journalError"] == reason
    assert shown["toolCalls"] == 1  # what its later records said
    if damage is not _cut_in_the_middle:  # the caller is in the half that was lost
        assert shown["caller"] == "tester"  # what the damaged line still shows
    assert a.messages[-2:] == ROUND  # its conversation, as far as it was journaled
    if damage is _zeroed:
        assert shown["task"] == LOST_TASK  # the task itself was in the zeroed block
    with pytest.raises(ValueError, match="cannot take another turn: what it was asked is lost"):
        registry.deliver(a, "go on", "a person", "m-1")
    b = registry.get("run-b")
    assert (b.state, b.answer, b.durability.damaged) == ("completed", "42", None)

    # Its failure is an outcome now, journaled once: the next restart finds it failed, not to fail again.
    ends = [r for r in _records(tmp_path) if r["type"] == "end" and r["handle"] == "run-a"]
    assert len(ends) == 1 and ends[0]["error"] == a.error
    again, resumed = _replay(tmp_path)
    assert resumed == [] and again.get("run-a").error == a.error
    assert [r["handle"] for r in _records(tmp_path) if r["type"] == "end"].count("run-a") == 1


def test_a_start_line_damaged_in_its_handle_is_found_by_the_records_that_name_the_run(tmp_path: Path) -> None:
    start = _start("run-a")
    (tmp_path / JOURNAL_NAME).write_bytes(
        start.replace(b'"handle":"run-a"', b'"han\0le":"run-a"', 1) + _round("run-a")
    )
    registry, resumed = _replay(tmp_path)
    a = registry.get("run-a")
    assert resumed == [] and a.state == "failed" and a.durability.start_lost
    assert "its start record is missing (a round record names it)" in (a.error or ""), a.error


def test_a_finished_run_whose_start_line_is_damaged_keeps_its_outcome(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(
        _flip_colon(_start("run-a")) + _round("run-a") + _end("run-a", answer="42")
    )
    registry, resumed = _replay(tmp_path)
    a = registry.get("run-a")
    assert resumed == [] and (a.state, a.answer, a.error) == ("completed", "42", None)
    assert "line 1 (start record) is damaged" in registry.result(a)["journalError"]
    with pytest.raises(ValueError, match="cannot take another turn"):  # it would run on a lost spec
        registry.deliver(a, "go on", "a person", "m-1")
    assert not [r for r in _records(tmp_path) if r["type"] == "end" and r.get("state") == "failed"]


def test_a_damaged_line_inside_an_unfinished_run_fails_it_and_one_naming_no_run_is_only_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(
        _start("run-a")
        + _round("run-a").replace(b'"messages":', b'"messages";', 1)
        + b"\0" * 40
        + b"\n"
        + _start("run-c")
    )
    with caplog.at_level(logging.ERROR):
        registry, resumed = _replay(tmp_path)
    a = registry.get("run-a")
    assert a.state == "failed" and not a.durability.start_lost
    assert "runs.jsonl line 2 (round record) is damaged: not JSON" in (a.error or ""), a.error
    assert [run.handle for run in resumed] == ["run-c"]  # the run the damage does not touch goes on
    assert "line 3 is damaged" in caplog.text and "names no run that could be told" in caplog.text
    assert [run.handle for run in registry.all()] == ["run-a", "run-c"]
    # A run that was only failed for a damage it did not cause still takes a person's message.
    assert registry.deliver(a, "go on", "a person", "m-1") is True


def test_a_torn_last_start_line_is_skipped_and_nothing_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torn = _start("run-a")[:-40]  # the write cut short: no newline after it
    (tmp_path / JOURNAL_NAME).write_bytes(_start("run-b") + _end("run-b", answer="42") + torn)
    with caplog.at_level(logging.WARNING):
        registry, resumed = _replay(tmp_path)
    assert resumed == []
    with pytest.raises(UnknownRun):  # its spawn was never acknowledged: there is no run to show
        registry.get("run-a")
    assert registry.get("run-b").state == "completed"
    assert "torn last record" in caplog.text and "is damaged" not in caplog.text
    assert [r["type"] for r in _records(tmp_path)] == ["start", "end"]  # cut off, nothing added


def test_a_damaged_line_with_a_newline_at_the_end_of_the_file_is_damage_not_a_torn_line(
    tmp_path: Path,
) -> None:
    # Written whole (its newline is there), so it may have been acknowledged: not skipped silently.
    (tmp_path / JOURNAL_NAME).write_bytes(_flip_colon(_start("run-a")))
    registry, _ = _replay(tmp_path)
    assert registry.get("run-a").state == "failed"


def test_compaction_keeps_what_a_replay_found_damaged(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(_flip_colon(_start("run-a")) + _round("run-a"))
    first, _ = _replay(tmp_path)
    error = first.get("run-a").error
    size = (tmp_path / JOURNAL_NAME).stat().st_size
    _replay(tmp_path, compact_bytes=size // 2)  # past the threshold: compacted at start
    (record,) = _records(tmp_path)
    assert record["type"] == "run" and record["startLost"] is True and "is damaged" in record["damaged"]
    registry, resumed = _replay(tmp_path)
    a = registry.get("run-a")
    assert resumed == [] and (a.state, a.error) == ("failed", error)
    assert a.durability.start_lost and registry.result(a)["journalError"] == record["damaged"]


# The real runtime process.


@pytest.mark.integration
def test_a_damaged_start_line_of_a_running_run_shows_it_failed_after_a_restart(tmp_path: Path) -> None:
    with start_pod(tmp_path, workspace=None) as pod:

        async def spawn() -> tuple[str, str]:
            async with Client(f"{pod.url}/mcp") as client:
                held = await call(client, "spawn", task=script({"hold": "gate", "say": "late"}))
                kept = await call(client, "spawn", task=script({"hold": "gate", "say": "kept"}))
                return held["handle"], kept["handle"]

        damaged, kept = asyncio.run(spawn())

        async def both_held() -> bool:
            return pod.engine.holding(damaged) and pod.engine.holding(kept)

        asyncio.run(until(both_held, "both runs' first turns held at the engine"))
        assert pod.runtime is not None
        pod.runtime.kill()
        path = pod.workdir / "state" / JOURNAL_NAME
        lines = path.read_bytes().splitlines(keepends=True)
        (at,) = [i for i, line in enumerate(lines) if b'"type":"start"' in line and damaged.encode() in line]
        lines[at] = _flip_colon(lines[at])
        # ... and a spawn the crash cut short: its start never acknowledged, its line torn.
        torn = _start("run-0000000000000000")[:-30]
        path.write_bytes(b"".join(lines) + torn)
        pod.engine.release("gate")
        pod.start_runtime()

        async def ask() -> tuple[dict[str, Any], dict[str, Any], str]:
            async with Client(f"{pod.url}/mcp") as client:
                waited = await call(client, "await", handles=[damaged, kept], timeout=60)
                status = await call(client, "status", handle=damaged)
                unknown = await client.call_tool("status", {"handle": "run-0000000000000000"})
                assert unknown.is_error
                refused = await client.call_tool("send", {"handle": damaged, "message": "go on"})
                assert refused.is_error and "cannot take another turn" in tool_text(refused)
                return waited, status, tool_text(unknown)

        waited, status, unknown = asyncio.run(ask())
        by_handle = {run["handle"]: run for run in waited["runs"]}
        failed = by_handle[damaged]
        assert failed["state"] == "failed" and failed["durable"] is False, failed
        assert (
            "runs.jsonl line" in failed["error"] and "(start record) is damaged: not JSON" in failed["error"]
        )
        assert failed["journalError"] in failed["error"]
        assert by_handle[kept]["state"] == "completed" and by_handle[kept]["answer"] == "kept"
        run = status["run"]
        assert run["state"] == "failed" and run["caller"] and run["error"] == failed["error"], run
        assert "run-0000000000000000" in unknown
        monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
        assert monitor[damaged]["runState"] == "failed" and monitor[damaged]["error"] == failed["error"]
        assert monitor[damaged]["journalError"] == failed["journalError"]
        log = pod.runtime.log_tail(400)
        assert "torn last record" in log and "is damaged" in log
        assert not pod.engine.holding(damaged)
        # The failed run took no turn after the restart: the engine saw only its first one.
        assert len(pod.engine.requests[damaged]) == 1
