"""``bench/flood.py --shape FILE.toml``: a load shape file (the files ``bench/flood_sim.py --shape``
runs in virtual time) runs live, its groups, replicas, slots, profile, queue order, pool and seeds
all taken from the file. The mapping is checked without processes; one short live pass on a tiny
shape checks that the engines and agents really run as the file says (real processes on loopback
ports: simulated engines, the scheduler and the dataplane)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from repo_paths import ROOT

from luftpause.testkit.engine.model.profiles import profile
from luftpause.testkit.sim.shapes import ShapeFile, parse_shape
from luftpause.testkit.sim.workload import ToolTime

sys.path.insert(0, str(ROOT / "bench"))

from flood_load import real_engine_refusal, shape_engine_args, shape_load

TINY = """
duration_s = 3
seeds = [0, 1]
replicas = 3
slots = 2
profile = "sglang-llama-3.2-1b-fp8-8gb"
via = "own_loop"
context_tokens = 300
reply_tokens = 8

[engine]
queue = "lpm"
pool_scale = 0.5

[[groups]]
agents = 1
class = "interactive"
caller = "ide-tiny"
tool_rounds = 2
tool_seconds = { dist = "constant", seconds = 0.05 }

[[groups]]
agents = 2
class = "batch"
caller = "bulk-tiny"
tool_rounds = 1
tool_seconds = { dist = "lognormal", median = 0.05, p99 = 0.2 }
"""
SGLANG = "sglang-llama-3.2-1b-fp8-8gb"


def _shape(text: str = TINY, **changes: str) -> ShapeFile:
    data = tomllib.loads(text)
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (data[section] if section else data)[name] = value
    return parse_shape(data, "tiny")


def test_a_shape_maps_onto_the_live_groups_and_the_engines_flags() -> None:
    shape = _shape()
    load = shape_load(shape, duration_s=3.0)
    interactive, batch = load.groups("luftpause")
    assert (interactive.agents, interactive.service_class, interactive.caller) == (
        1,
        "interactive",
        "ide-tiny",
    )
    assert (batch.agents, batch.service_class, batch.caller) == (2, "batch", "bulk-tiny")
    assert (interactive.tool_rounds, batch.tool_rounds) == (2, 1)
    assert batch.tool_seconds == ToolTime("lognormal", median=0.05, p99=0.2)
    assert (interactive.priority, batch.priority) == (None, None)  # lpm: no priority sent
    assert (load.context_tokens, load.max_tokens, load.interactive) == (300, 8, 1)
    assert [g.caller for g in load.light().groups("luftpause")] == ["ide-tiny"]
    through_ta = load.groups("thunderagent")
    assert all(g.program_id for g in through_ta)
    args = shape_engine_args(shape, model_rounds=2, time_scale=1.0)
    pool = round(profile(SGLANG).pool_tokens * 0.5)
    assert args == [
        "--profile", SGLANG, "--tool-rounds", "2", "--time-scale", "1.0",
        "--max-running", "2", "--pool-tokens", str(pool), "--schedule-policy", "lpm",
    ]  # fmt: skip
    assert real_engine_refusal(shape) is not None  # lpm and a pool scale are the simulator's


@pytest.mark.parametrize(
    ("name", "order", "interactive"),
    [(SGLANG, "higher_first", 1), ("vllm-llama-3.2-1b-fp8-8gb", "lower_first", -1)],
)
def test_a_priority_queue_orders_the_engines_and_the_agents_send_their_class(
    name: str, order: str, interactive: int
) -> None:
    shape = _shape(**{"profile": name, "engine.queue": "priority", "slots": "none"})
    args = shape_engine_args(shape, model_rounds=0, time_scale=1.0)
    assert args[-2:] == ["--priority", order] and "--max-running" not in args
    groups = shape_load(shape, 3.0).groups("luftpause")
    assert [g.priority for g in groups] == [interactive, 0]


def _flood(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/flood.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_load_flags_beside_a_shape_and_a_bad_shape_are_refused(tmp_path: Path) -> None:
    shape = tmp_path / "tiny.toml"
    shape.write_text(TINY)
    beside = _flood(["--shape", str(shape), "--batch", "3", "--slots", "4"])
    assert beside.returncode == 2 and "--batch, --slots: the shape file says the load" in beside.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("reply_tokens", "reply_tokenz"))
    refused = _flood(["--shape", str(bad)])
    assert refused.returncode == 2 and f"{bad}: " in refused.stderr and "reply_tokenz" in refused.stderr
    real = _flood(["--shape", str(shape), "--engine", "llama-server"])
    assert real.returncode == 2 and (
        "queue and pool_scale" in real.stderr or "llama-server not found" in real.stderr
    )


@pytest.mark.integration
def test_a_tiny_shape_runs_live_as_its_file_says(tmp_path: Path) -> None:
    shape = tmp_path / "tiny.toml"
    shape.write_text(TINY)
    report = tmp_path / "flood.json"
    done = _flood(
        ["--shape", str(shape), "--arrangements", "luftpause", "--repeat", "1", "--no-control",
         "--json", str(report)]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["simulated"] is True and result["settings"]["seeds"] == [0, 1]
    engine = result["settings"]["engine"]
    assert engine[engine.index("--schedule-policy") + 1] == "lpm"
    assert engine[engine.index("--max-running") + 1] == "2"
    (row,) = result["flood"]
    (one,) = row["repetitions"]
    assert (row["failed"], one["replicas"]) == (0, 3)
    rounds = {"ide-tiny": 2, "bulk-tiny": 1}
    for group in one["groups"]:
        per_run = rounds[group["caller"]]
        assert group["completed"] > 0, one
        # every completed run made its group's rounds; a run the deadline cut made at most as many
        assert per_run * group["completed"] <= group["toolRounds"], group
        assert group["toolRounds"] <= per_run * (group["completed"] + group["agents"]), group
    assert {g["caller"] for g in one["groups"]} == set(rounds)
