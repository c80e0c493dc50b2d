"""The end-to-end overhead benchmark (``bench/e2e_overhead.py``) still runs, with tiny numbers.

It measures nothing here: no figure is compared with a limit, only that every arrangement that
could start answered every turn, and that the report has the shape the README's table is read from.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "e2e_overhead.py"
TURNS = 3


def _run_bench(argv: list[str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run the script; on a timeout SIGTERM it (it stops its children on SIGTERM), then SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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


def test_every_arrangement_answers_every_turn_and_the_report_is_complete(tmp_path: Path) -> None:
    report_path = tmp_path / "e2e.json"
    done = _run_bench(
        [
            "--streams",
            "1,2",
            "--turns",
            str(TURNS),
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--json",
            str(report_path),
        ]
    )
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
