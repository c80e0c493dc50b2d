"""``luftpause loadgen --agents``: closed-loop own-loop agents through a real dataplane.

The ``--spawn`` mode (over MCP) is tested with the runtime in tests/runtime/test_runtime_end_to_end.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from repo_paths import ROOT

from luftpause.cli import main
from luftpause.testkit.launch.procs import free_port
from luftpause.testkit.launch.stack import Stack
from luftpause.testkit.load.agents import merge_tool_call_delta


def _loadgen(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "loadgen", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_a_mix_of_classes_and_callers_runs_closed_loop_and_is_summarized_per_group(stack: Stack) -> None:
    done = _loadgen(
        "--proxy", stack.dataplane_url,
        "--agents", "2", "--class", "interactive", "--caller", "ide",
        "--agents", "3", "--class", "batch", "--caller", "bulk",
        "--duration-s", "4", "--tool-rounds", "1", "--tool-seconds", "0.05", "--context-tokens", "64",
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["durationS"] == 4
    interactive, batch = summary["groups"]
    assert (interactive["class"], interactive["caller"], interactive["agents"]) == ("interactive", "ide", 2)
    assert (batch["class"], batch["caller"], batch["agents"]) == ("batch", "bulk", 3)
    for group in (interactive, batch):
        # Every agent started a run; how many completed in 4 s depends on the machine, not checked.
        assert group["completed"] + group["unfinished"] >= group["agents"], group
        assert group["failed"] == 0
        assert group["toolRounds"] >= group["completed"]  # one tool round per completed run
        assert group["turns"] >= 2 * group["completed"]  # the tool round, then the answer
        assert group["runsPerMinute"] == round(group["completed"] * 60 / 4, 2)
        assert group["turns"] >= 1 and group["promptTokens"] > 0  # from the usage chunk asked for
        if group["completed"]:
            assert 0 < group["ttftP50"] <= group["ttftP99"]
            assert 0 < group["runTimeP50"] <= group["runTimeP99"]


def test_the_scheduler_sees_each_group_s_class_and_caller(tmp_path: Path) -> None:
    """Batch agents of one caller, alone on a fresh stack: while they run, the scheduler counts
    runs of that caller and of class batch only (an agent sending the wrong class or no caller
    would show as interactive or anonymous)."""
    caller = f"bulk-{uuid.uuid4().hex[:8]}"
    with Stack.start(tmp_path / "stack") as fresh:
        fresh.wait_connected()
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "luftpause", "loadgen", "--proxy", fresh.dataplane_url,
                "--agents", "2", "--class", "batch", "--caller", caller, "--duration-s", "6",
                "--tool-rounds", "2", "--tool-seconds", "0.3", "--context-tokens", "64", "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        try:
            seen: list[tuple[dict[str, int], dict[str, int]]] = []
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                status = fresh.status()
                if status["runs_by_caller"]:
                    seen.append((status["runs_by_class"], status["runs_by_caller"]))
                time.sleep(0.1)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, out + err
        assert seen, "the scheduler never counted a run of the load"
        for by_class, by_caller in seen:
            assert set(by_caller) == {caller}, by_caller
            assert by_class.get("interactive", 0) == 0 and by_class["batch"] >= 1, by_class


def test_the_table_names_every_group(stack: Stack) -> None:
    done = _loadgen(
        "--proxy", stack.dataplane_url, "--agents", "1", "--caller", "table-caller",
        "--duration-s", "1", "--tool-rounds", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "table-caller" in done.stdout
    assert "runs/min" in done.stdout and "TTFT p50" in done.stdout


def test_failed_runs_are_counted_with_the_proxy_s_error_and_fail_the_exit_status(stack: Stack) -> None:
    done = _loadgen(
        "--proxy", stack.dataplane_url, "--model", "no-such-model", "--agents", "1",
        "--duration-s", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    (group,) = summary["groups"]
    assert group["failed"] >= 1 and group["completed"] == 0
    assert any("HTTP 404" in text and "no-such-model" in text for text in summary["errors"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--class", "batch", "--agents", "2"], "--class comes before any --agents"),
        (["--agents", "2", "--caller", "a", "--caller", "b"], "--caller given twice"),
        (["--agents", "0"], "--agents must be at least 1"),
        (["--agents", "1", "--duration-s", "0"], "--duration-s must be positive"),
        (["--agents", "1", "--spawn", "2"], "not allowed with argument"),
        (["--spawn", "2", "--caller", "x"], "--caller applies to --agents only"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main(["loadgen", *argv, "--proxy", "http://127.0.0.1:9"])
    except SystemExit as exited:
        status = exited.code  # type: ignore[assignment]
    assert status == 2
    assert message in capsys.readouterr().err


def test_streamed_tool_call_deltas_are_folded_by_index() -> None:
    calls: list[dict[str, Any]] = []
    for delta in (
        {"index": 0, "id": "call_0", "function": {"name": "lookup", "arguments": ""}},
        {"index": 1, "id": "call_1", "function": {"name": "lookup", "arguments": '{"q'}},
        {"index": 0, "id": "", "function": {"arguments": '{"query": "x"}'}},  # continuation: empty id
        {"index": 1, "function": {"arguments": '": 1}'}},
    ):
        merge_tool_call_delta(calls, delta)
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    assert [c["function"]["arguments"] for c in calls] == ['{"query": "x"}', '{"q": 1}']


def _config_naming(tmp_path: Path, dataplane: str, runtime: str) -> Path:
    """A configuration file whose ``[dataplane] listen`` and ``[runtime] listen`` are the given
    ``host:port`` addresses (the rest is never read by loadgen)."""
    path = tmp_path / "loadgen.toml"
    path.write_text(
        f'[dataplane]\nlisten = "{dataplane}"\n[runtime]\nlisten = "{runtime}"\n'
        '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
    )
    return path


def test_the_proxy_and_the_runtime_come_from_the_config_s_listen_addresses(stack: Stack) -> None:
    config = str(stack.config_path)
    agents = _loadgen(
        "--config", config, "--agents", "1", "--duration-s", "1", "--tool-rounds", "0", "--json"
    )
    assert agents.returncode == 0, agents.stdout + agents.stderr
    assert json.loads(agents.stdout)["groups"][0]["completed"] >= 1
    spawned = _loadgen("--config", config, "--spawn", "1", "--timeout", "120", "--json")
    assert spawned.returncode == 0, spawned.stdout + spawned.stderr
    assert json.loads(spawned.stdout)["completed"] == 1
    # The MCP client's per-request lines (httpx2, one per MCP message) stay out of the way.
    assert "HTTP Request" not in spawned.stderr, spawned.stderr


def test_an_explicit_proxy_or_runtime_wins_over_the_config(stack: Stack, tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    config = str(_config_naming(tmp_path, nowhere, nowhere))
    agents = _loadgen(
        "--config", config, "--proxy", stack.dataplane_url,
        "--agents", "1", "--duration-s", "1", "--tool-rounds", "0", "--json",
    )  # fmt: skip
    assert agents.returncode == 0, agents.stdout + agents.stderr
    spawned = _loadgen("--config", config, "--runtime", stack.runtime_url, "--spawn", "1", "--json")
    assert spawned.returncode == 0, spawned.stdout + spawned.stderr
    refused = _loadgen("--config", config, "--spawn", "1")  # the config's runtime: nobody listens
    assert refused.returncode == 1
    assert f"runtime http://{nowhere}/mcp:" in refused.stderr, refused.stderr
