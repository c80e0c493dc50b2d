"""The end-to-end overhead benchmark (``bench/e2e_overhead.py``) still runs, with tiny numbers.

It measures nothing here: no figure is compared with a limit, only that every arrangement that
could start answered every turn, that the report has the shape the README's table is read from,
and that no process the benchmark started outlives it (a process started twice and lost would
share its port with SO_REUSEPORT, halve the measured load and survive with PPID 1).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "bench" / "e2e_overhead.py"
TURNS = 3


MARK = "LUFTPAUSE_BENCH_SMOKE_MARK"


def _run_bench(argv: list[str], mark: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run the script with ``MARK=mark`` in its environment (every process it starts inherits it);
    on a timeout SIGTERM it (it stops its children on SIGTERM), then SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, MARK: mark},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the benchmark did not finish in {timeout:.0f} s:\n{out}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _left_behind(mark: str, workdir: Path) -> dict[int, str]:
    """Processes (pid: command line) that carry ``MARK=mark`` in their environment or name
    ``workdir`` on their command line: what the benchmark started and did not stop."""
    needle_env = f"{MARK}={mark}".encode()
    needle_dir = str(workdir).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        if state != b"Z" and (needle_env in environ.split(b"\0") or needle_dir in cmdline):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def test_every_arrangement_answers_every_turn_and_the_report_is_complete(tmp_path: Path) -> None:
    report_path = tmp_path / "e2e.json"
    workdir = tmp_path / "bench"
    mark = uuid.uuid4().hex
    try:
        done = _run_bench(
            [
                "--streams", "1,2", "--turns", str(TURNS), "--warmup", "1", "--rounds", "2",
                "--json", str(report_path), "--keep", str(workdir),
            ],
            mark,
        )  # fmt: skip
    finally:
        # A stop that was sent may take a moment to land; whatever is left after that leaked.
        deadline = time.monotonic() + 30  # ChildProcess.stop gives 5 s before SIGKILL, per child
        while (left := _left_behind(mark, workdir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)  # ours to end: it carries this test's mark
            except ProcessLookupError:
                pass
    assert not left, f"processes the benchmark started outlived it: {left}"
    _check_report(done, report_path)


def _check_report(done: subprocess.CompletedProcess[str], report_path: Path) -> None:
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = orjson.loads(report_path.read_bytes())

    arrangements = report["arrangements"]
    assert arrangements["direct"]["measured"] and arrangements["luftpause"]["measured"], arrangements
    for name in ("nginx", "sglang-router"):
        # Either measured, or the reason it was not is printed: never silently absent.
        state = arrangements[name]
        assert state["measured"] or f"{name}: not measured: " in done.stdout, (name, state)
    measured = {name for name, state in arrangements.items() if state["measured"]}

    rows = report["rows"]
    assert {(r["streams"], r["mode"], r["arrangement"]) for r in rows} == {
        (streams, mode, name) for streams in (1, 2) for mode in ("stream", "whole") for name in measured
    }
    for row in rows:
        # Two rounds of TURNS turns each, pooled; every one of them a complete answer.
        assert row["turns"] == 2 * TURNS and row["errors"] == 0, row
        assert len(row["completions_per_s_by_round"]) == 2, row
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"], row
        if row["arrangement"] == "direct":
            assert row["proxy_cpu_s_per_1k_turns"] is None and row["added_ttft_p50_s"] == 0.0, row
        else:
            assert row["proxy_cpu_s_per_1k_turns"] >= 0, row
            by_process = row["proxy_cpu_s_per_1k_turns_by_process"]
            assert math.isclose(sum(by_process.values()), row["proxy_cpu_s_per_1k_turns"]), row
            if row["arrangement"] == "luftpause":
                assert set(by_process) == {"scheduler", "dataplane"}, row
            assert math.isfinite(row["added_ttft_p50_s"]), row
        line = f"| {row['streams']} | {row['mode']} | {row['arrangement']} |"
        assert line in done.stdout, line

    first_token = next(t for t in report["targets"] if t["target"].startswith("added TTFT"))
    assert first_token["streams"] == 1 and first_token["met"] in (True, False), first_token
    assert report["dataplane_memory"] and all(m["peak_rss_bytes"] > 0 for m in report["dataplane_memory"])
    assert len(report["commit"]) == 40 and report["source"] == "working tree"
