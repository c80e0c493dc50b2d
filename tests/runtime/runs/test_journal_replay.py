"""The journal in-process: replay of start / round / end records, a torn last line, compaction.

What holds for every store (``[runtime] store``) runs on both, the file journal and PostgreSQL
(the ``store`` fixture); a torn last line and short writes are the file's own."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from runtime_helpers import make_run, open_store, replay_into_registry, seed_store, stored, stored_bytes

from luftpause.runtime.runs.journal import JOURNAL_NAME, Journal, read_records
from luftpause.runtime.runs.registry import Run, RunRegistry

ROUND = [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "result"},
]


def _start(handle: str, **extra: Any) -> dict[str, Any]:
    return {**make_run(handle, system="be brief", **extra).start_record()}


def _counters(tool_calls: int) -> dict[str, float]:
    return {"turns": tool_calls, "toolCalls": tool_calls, "promptTokens": 10 * tool_calls, "turnSeconds": 0.5}


def _write(path: Path, records: list[dict[str, Any]], tail: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail)


def test_replay_rebuilds_finished_and_unfinished_runs_and_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_NAME
    torn = b'{"type": "round", "handle": "run-a", "messages": [{"role": "assis'
    _write(
        path,
        [
            _start("run-a"),
            {"type": "round", "handle": "run-a", "messages": ROUND, "counters": _counters(1)},
            _start("run-b", parent="run-a"),
            {
                "type": "end",
                "handle": "run-b",
                "state": "completed",
                "answer": "42",
                "finishedAt": time.time(),
                "counters": _counters(0),
            },
        ],
        tail=torn,
    )
    registry, resumed = asyncio.run(replay_into_registry(tmp_path))

    (a,) = resumed
    assert a.handle == "run-a" and a.resumed
    assert a.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "t"}, *ROUND]
    assert (a.costs.tool_calls, a.costs.prompt_tokens, a.costs.turn_seconds) == (1, 10, 0.5)
    assert a.children == ["run-b"]
    b = registry.get("run-b")
    assert (b.state, b.answer, b.parent) == ("completed", "42", "run-a")
    # The torn line was cut before appending, so every line of the file is whole again.
    data = path.read_bytes()
    assert not data.endswith(torn) and data.endswith(b"\n")
    assert [r["type"] for r in read_records(path)] == ["start", "round", "start", "end"]


def test_shutdown_journals_no_end_for_the_runs_it_stops(tmp_path: Path, store: str) -> None:
    seed_store(store, tmp_path, [_start("run-a")])
    asyncio.run(replay_into_registry(tmp_path, store))  # leaving the registry cancels run-a: a shutdown
    assert [r["type"] for r in stored(store, tmp_path)] == ["start"]
    _, resumed = asyncio.run(replay_into_registry(tmp_path, store))
    assert [run.handle for run in resumed] == ["run-a"]


def test_compaction_keeps_finished_runs_as_one_record_and_running_ones_whole(
    tmp_path: Path, store: str
) -> None:
    records = [
        _start("run-live"),
        {"type": "round", "handle": "run-live", "messages": ROUND, "counters": _counters(1)},
    ]
    for i in range(40):
        records += [
            _start(f"run-{i}", task="x" * 500),
            {"type": "round", "handle": f"run-{i}", "messages": ROUND, "counters": _counters(1)},
            {
                "type": "end",
                "handle": f"run-{i}",
                "state": "failed",
                "error": "e",
                "finishedAt": 2e9,
                "counters": _counters(1),
            },
        ]
    seed_store(store, tmp_path, records)
    size = stored_bytes(store, tmp_path)
    # past the threshold: compacted
    asyncio.run(replay_into_registry(tmp_path, store, compact_bytes=size // 2))

    kinds = [r["type"] for r in stored(store, tmp_path)]
    assert kinds.count("run") == 40 and kinds.count("end") == 0
    assert kinds.count("start") == 1 and kinds.count("round") == 1  # the running run, whole
    assert stored_bytes(store, tmp_path) < size

    registry, resumed = asyncio.run(replay_into_registry(tmp_path, store))
    assert [run.handle for run in resumed] == ["run-live"] and resumed[0].messages[2:] == ROUND
    assert resumed[0].costs.tool_calls == 1
    assert registry.get("run-7").state == "failed" and registry.get("run-7").error == "e"


# Write failures and short writes (issue 5 review, item 2).


def test_a_short_write_is_finished_so_records_never_glue(tmp_path: Path, monkeypatch: Any) -> None:
    """``os.write`` may write part of a record; the rest must follow before the next record."""
    import os

    real_write = os.write

    def at_most_seven_bytes(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data)[:7])

    journal = Journal(tmp_path)
    journal.open()
    try:
        monkeypatch.setattr(os, "write", at_most_seven_bytes)
        first = journal.append({"type": "stop", "handle": "run-a", "by": "x" * 40})
        second = journal.append({"type": "stop", "handle": "run-b", "by": "y"})
        first.result(10), second.result(10)
    finally:
        monkeypatch.undo()
        journal.close()
    assert [r["handle"] for r in read_records(tmp_path / JOURNAL_NAME)] == ["run-a", "run-b"]


def test_a_spawn_whose_start_cannot_be_journaled_is_refused_and_never_runs(tmp_path: Path) -> None:
    """A full disk (``/dev/full`` in place of the file): the start record fails, the registry's
    ``confirm_start`` raises, the run fails without a turn, and a later record of it is not
    written (it is marked not durable)."""
    import os

    from luftpause.runtime.runs.journal import JournalWriteError

    turns: list[str] = []

    async def scenario() -> Run:
        registry = RunRegistry(store=Journal(tmp_path))
        async with registry:
            journal = registry.store
            assert journal is not None and journal._fd is not None
            os.dup2(os.open("/dev/full", os.O_WRONLY), journal._fd)
            run = registry.add(make_run("run-full"))

            async def body() -> None:
                turns.append(run.handle)

            registry.start(run, body())
            try:
                await registry.confirm_start(run)
            except JournalWriteError as exc:
                assert "No space left" in str(exc) or "space" in str(exc), exc
            else:
                raise AssertionError("the start record was acknowledged on a full disk")
            for _ in range(100):
                if run.done and run.durability.error is not None:
                    break
                await asyncio.sleep(0.01)
            return run

    run = asyncio.run(scenario())
    assert turns == []
    assert run.state == "failed" and "could not be journaled" in (run.error or ""), run.error
    assert run.durability.error is not None and run.result()["durable"] is False


def test_a_finished_ancestors_seconds_budget_is_rearmed_after_a_restart(tmp_path: Path, store: str) -> None:
    """The parent (budgetSeconds 1, started 100 s ago) ended; its child was running at the crash.
    After the restart nothing watched the parent's seconds and the child ran on unbounded."""
    long_ago = time.time() - 100
    seed_store(
        store,
        tmp_path,
        [
            {**_start("run-parent", budget_seconds=1.0), "at": long_ago},
            {**_start("run-child", parent="run-parent"), "at": long_ago + 0.5},
            {
                "type": "end",
                "handle": "run-parent",
                "state": "completed",
                "answer": "a",
                "finishedAt": long_ago + 0.6,
            },
        ],
    )

    async def scenario() -> Run:
        async def idle(run: Run) -> None:
            await asyncio.Event().wait()

        registry = RunRegistry(store=open_store(store, tmp_path))
        async with registry.serving(idle):
            child = registry.get("run-child")
            for _ in range(500):  # the timer fires at once (the budget ran out long ago)
                if child.done:
                    break
                await asyncio.sleep(0.01)
            return child

    child = asyncio.run(scenario())
    assert child.state == "cancelled", child.state
    assert (child.error or "").startswith("budget exceeded: seconds"), child.error


# A tool round journaled call by call (issue 17, item 5).

REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "lookup"}} for i in range(3)],
}


def _call(index: int, turn: int = 2, failed: bool = False) -> dict[str, Any]:
    message = {"role": "tool", "tool_call_id": f"c{index}", "content": f"result {index}"}
    return {
        "type": "call",
        "handle": "run-a",
        "turn": turn,
        "index": index,
        "message": message,
        "failed": failed,
    }


def test_a_round_begun_is_replayed_with_the_calls_it_completed_and_kept_by_compaction(
    tmp_path: Path, store: str
) -> None:
    at_reply = {**_counters(1), "turns": 2, "promptTokens": 20}
    seed_store(
        store,
        tmp_path,
        [
            _start("run-a"),
            {"type": "round", "handle": "run-a", "messages": ROUND, "counters": _counters(1)},
            {"type": "turn", "handle": "run-a", "turn": 2, "message": REPLY, "counters": at_reply},
            _call(0),
            _call(2, failed=True),
            _call(1, turn=1),  # of another turn: it does not fit this round, skipped
            _call(7),  # past the reply's calls: skipped
        ],
    )

    def check(run: Run) -> None:
        pending = run.pending_round
        assert pending is not None and pending.turn == 2 and pending.message == REPLY
        assert sorted(pending.done) == [0, 2] and pending.done[2][1] is True
        assert run.messages[2:] == ROUND  # the round is not in the conversation until it completes
        # Counted as the loop counted them: the reply's counters, then one call each (one failed).
        assert (run.costs.turns, run.costs.tool_calls, run.costs.failed_tool_calls) == (2, 3, 1)
        assert run.costs.prompt_tokens == 20

    _, resumed = asyncio.run(replay_into_registry(tmp_path, store))
    check(resumed[0])
    size = stored_bytes(store, tmp_path)
    asyncio.run(replay_into_registry(tmp_path, store, compact_bytes=size // 2))  # compacted at start
    kinds = [r["type"] for r in stored(store, tmp_path)]
    assert kinds == ["start", "round", "turn", "call", "call"], kinds
    _, resumed = asyncio.run(replay_into_registry(tmp_path, store))
    check(resumed[0])


def test_a_completed_round_closes_the_round_its_turn_began(tmp_path: Path, store: str) -> None:
    whole = [REPLY, *(_call(i)["message"] for i in range(3))]
    seed_store(
        store,
        tmp_path,
        [
            _start("run-a"),
            {"type": "turn", "handle": "run-a", "turn": 1, "message": REPLY, "counters": _counters(0)},
            *(_call(i, turn=1) for i in range(3)),
            {"type": "round", "handle": "run-a", "messages": whole, "counters": _counters(3)},
        ],
    )
    _, resumed = asyncio.run(replay_into_registry(tmp_path, store))
    (run,) = resumed
    assert run.pending_round is None and run.messages[2:] == whole and run.costs.tool_calls == 3
