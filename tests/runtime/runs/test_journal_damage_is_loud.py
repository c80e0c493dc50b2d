"""Journal damage is loud (issue 25, item 6): every record a replay cannot apply is counted and the
runs it may have lost are named in the log; ``GET /status`` carries a ``journal`` section and
``/readyz`` answers ``degraded`` (200, still serving) with the reason; a journal found shorter than
its manifest says it was (truncated, emptied) is reported with the runs it lost, never taken for a
fresh start.

In-process over the registry and its journal, one kind of damage each (truncated, emptied, a
record whose run cannot be told, garbage lines, a pod record that does not apply); then the real
runtime process, its journal truncated between two starts, asked over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import call, get_json, script, start_pod
from runtime_helpers import make_run, replay_into_registry

from luftpause.runtime.runs.journal import JOURNAL_NAME, MANIFEST_NAME, encode
from luftpause.runtime.runs.registry import Run, RunRegistry

COUNTERS = {"turns": 1, "toolCalls": 0, "promptTokens": 10}


def _start(handle: str) -> bytes:
    return encode(make_run(handle, task="count the " + "sheep " * 20).start_record())


def _end(handle: str) -> bytes:
    record = {"type": "end", "handle": handle, "state": "completed", "answer": "42"}
    return encode({**record, "finishedAt": time.time(), "counters": COUNTERS})


def _replay(state_dir: Path) -> tuple[RunRegistry, list[Run]]:
    return asyncio.run(replay_into_registry(state_dir))


def _three_runs(state_dir: Path) -> bytes:
    """A journal of run-a and run-b (finished) and run-c (running), replayed once so that its
    manifest says what it held; its bytes."""
    data = _start("run-a") + _end("run-a") + _start("run-b") + _end("run-b") + _start("run-c")
    (state_dir / JOURNAL_NAME).write_bytes(data)
    registry, resumed = _replay(state_dir)
    assert registry.journal_report.damaged is False and [r.handle for r in resumed] == ["run-c"]
    assert json.loads((state_dir / MANIFEST_NAME).read_bytes())["runs"] == ["run-a", "run-b", "run-c"]
    return (state_dir / JOURNAL_NAME).read_bytes()


def test_a_truncated_journal_names_the_runs_it_lost_and_fails_the_one_cut_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _three_runs(tmp_path)
    cut = len(_start("run-a") + _end("run-a") + _start("run-b")) + 10  # inside run-b's end
    (tmp_path / JOURNAL_NAME).write_bytes(data[:cut])
    with caplog.at_level(logging.ERROR):
        registry, resumed = _replay(tmp_path)
    report = registry.journal_report.to_json()
    assert report["damaged"] is True and report["runsLost"] == ["run-c"], report
    assert report["shrunk"].startswith(f"runs.jsonl is truncated: {cut} bytes, but it held {len(data)} bytes")
    # run-b's end was cut off: it is not resumed as if nothing happened, but failed, saying why.
    b = registry.get("run-b")
    assert resumed == [] and b.state == "failed" and "truncated" in (b.durability.damaged or "")
    assert report["runsPossiblyLost"] == ["run-b", "run-c"]
    assert "runs lost: run-c" in caplog.text
    assert "truncated" in registry.journal_report.summary()


def test_an_emptied_journal_is_an_error_not_a_fresh_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _three_runs(tmp_path)
    (tmp_path / JOURNAL_NAME).write_bytes(b"")
    with caplog.at_level(logging.ERROR):
        registry, _ = _replay(tmp_path)
    report = registry.journal_report.to_json()
    assert report["shrunk"].startswith("runs.jsonl is empty (or missing): 0 bytes"), report
    assert report["runsLost"] == ["run-a", "run-b", "run-c"] and report["damaged"] is True
    assert "runs lost: run-a, run-b, run-c" in caplog.text
    # A journal removed altogether is the same.
    _three_runs(tmp_path)
    (tmp_path / JOURNAL_NAME).unlink()
    registry, _ = _replay(tmp_path)
    assert registry.journal_report.lost == {"run-a", "run-b", "run-c"}


def test_a_record_whose_run_cannot_be_told_marks_every_run_open_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # run-a's end, with its handle gone: it may have been any open run's record, and run-a,
    # left running, would otherwise be resumed as if clean (and run again after it ended).
    nameless = _end("run-a").replace(b'"handle":"run-a"', b'"han\xffle":"run-a"', 1)
    (tmp_path / JOURNAL_NAME).write_bytes(_start("run-a") + _start("run-b") + nameless + _start("run-c"))
    with caplog.at_level(logging.ERROR):
        registry, resumed = _replay(tmp_path)
    report = registry.journal_report.to_json()
    assert (report["recordsSkipped"], report["firstBadLine"], report["unidentifiedRecords"]) == (1, 3, 1)
    assert report["runsPossiblyLost"] == ["run-a", "run-b"], report
    for handle in ("run-a", "run-b"):
        run = registry.get(handle)
        assert run.state == "failed" and "line 3" in (run.durability.damaged or ""), handle
        assert "names no run" in registry.result(run)["journalError"]
    assert [r.handle for r in resumed] == ["run-c"]  # started after the line: untouched
    assert "(run-a, run-b)" in caplog.text


def test_garbage_lines_are_counted_from_the_first_and_a_pod_record_that_does_not_apply_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad_grant = encode({"type": "scopeGrant", "handle": "run-b", "parent": None, "scope": "everything"})
    (tmp_path / JOURNAL_NAME).write_bytes(
        _start("run-a")
        + _end("run-a")
        + b"\x00\x13garbage\xfe\n"
        + b"[1, 2, 3]\n"
        + _start("run-b")
        + bad_grant
        + _end("run-b")
    )
    with caplog.at_level(logging.ERROR):
        registry, _ = _replay(tmp_path)
    report = registry.journal_report.to_json()
    assert (report["recordsSkipped"], report["firstBadLine"], report["unidentifiedRecords"]) == (3, 3, 2)
    assert report["runsPossiblyLost"] == ["run-b"]  # no run was open at the garbage; b's grant
    assert "3 records skipped (2 naming no run that could be told), the first at line 3" in report["summary"]
    assert "runs that may have lost records: run-b" in caplog.text
    assert "line 6: a scopeGrant record of run-b could not be applied" in caplog.text


def test_a_clean_journal_reports_nothing(tmp_path: Path) -> None:
    _three_runs(tmp_path)
    registry, _ = _replay(tmp_path)  # the manifest written on close matches the file
    assert registry.journal_report.to_json()["damaged"] is False


# The real runtime process.


def _get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.mark.integration
def test_a_runtime_over_a_truncated_journal_says_so_in_status_and_readyz(tmp_path: Path) -> None:
    with start_pod(tmp_path, workspace=None) as pod:

        async def spawn() -> list[str]:
            async with Client(f"{pod.url}/mcp") as client:
                handles = [
                    (await call(client, "spawn", task=script({"say": str(i)})))["handle"] for i in range(3)
                ]
                await call(client, "await", handles=handles, timeout=60)
                return handles

        handles = asyncio.run(spawn())
        status, ready = _get(f"{pod.url}/readyz")
        assert (status, ready["status"]) == (200, "ok")
        assert get_json(f"{pod.url}/status")["journal"]["damaged"] is False
        assert pod.runtime is not None
        pod.runtime.stop()
        path = pod.workdir / "state" / JOURNAL_NAME
        lines = path.read_bytes().splitlines(keepends=True)
        (first_of_last,) = [i for i, line in enumerate(lines) if handles[2].encode() in line][:1]
        path.write_bytes(b"".join(lines[:first_of_last]))
        pod.start_runtime()

        status, ready = _get(f"{pod.url}/readyz")
        assert (status, ready["status"]) == (200, "degraded"), ready
        check = ready["checks"]["journal"]
        assert check["ok"] is True and check["degraded"] is True and "truncated" in check["detail"]
        journal = get_json(f"{pod.url}/status")["journal"]
        assert journal["damaged"] is True and journal["runsLost"] == [handles[2]], journal
        assert "truncated" in journal["shrunk"]
        assert f"runs lost: {handles[2]}" in pod.runtime.log_tail(200)
