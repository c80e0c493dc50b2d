"""Load shapes as data (``luftpause.testkit.sim.shapes``, ``bench/flood_sim.py --shape FILE``): a
shape file runs the same flood as the built-in shape it describes, and a bad key is refused with
its name."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from luftpause.testkit.sim.flood import FloodSpec, simulate
from luftpause.testkit.sim.shapes import ShapeError, load_shape_file, parse_shape
from luftpause.testkit.sim.workload import ToolTime, published_shape
from tests.repo_paths import ROOT as REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import flood_matrix  # bench/ is a folder of scripts

SHAPES = REPO_ROOT / "bench" / "shapes"


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("groups", "classes", "engines", "submitted", "arrangementCounters")}


@pytest.mark.parametrize("arrangement", ["router", "luftpause"])
def test_the_published_shape_file_runs_the_built_in_published_flood(arrangement: str) -> None:
    shape = load_shape_file(SHAPES / "published.toml")
    from_file = simulate(shape.spec(seed=1), arrangement)
    built_in = simulate(
        FloodSpec(published_shape(), "sglang-llama-3.2-1b-fp8-8gb", slots=8, seed=1), arrangement
    )
    assert _figures(from_file) == _figures(built_in)
    assert sum(row["completed"] for row in from_file["groups"]) > 0


def test_every_committed_shape_file_parses() -> None:
    names = sorted(path.stem for path in SHAPES.glob("*.toml"))
    assert "published" in names and len(names) >= 10
    for path in SHAPES.glob("*.toml"):
        shape = load_shape_file(path)
        assert shape.load.groups and shape.seeds


def _valid() -> dict[str, Any]:
    return {
        "duration_s": 60,
        "seeds": [0],
        "replicas": 2,
        "slots": "none",
        "profile": "sglang-llama-3.2-1b-fp8-8gb",
        "via": "own_loop",
        "context_tokens": 2650,
        "reply_tokens": 256,
        "engine": {"queue": "lpm", "pool_scale": 1.5},
        "groups": [
            {
                "agents": 4,
                "class": "interactive",
                "caller": "ide",
                "tool_rounds": 3,
                "tool_seconds": {"dist": "constant", "seconds": 0.5},
            }
        ],
    }


def test_a_valid_shape_carries_its_engine_settings_into_the_spec() -> None:
    shape = parse_shape(_valid())
    spec = shape.spec(seed=0)
    assert (spec.slots, spec.queue, spec.pool_scale, spec.replicas) == (None, "lpm", 1.5, 2)
    assert shape.load.groups[0].tool_seconds == ToolTime("constant", seconds=0.5)


def test_a_shape_may_size_its_tool_calls_and_results_and_defaults_to_llama_3s_counts() -> None:
    default = parse_shape(_valid()).load
    assert (default.tool_call_tokens, default.tool_result_tokens) == (22, 18)
    sized = parse_shape({**_valid(), "tool_call_tokens": 800, "tool_result_tokens": 2000}).load
    assert (sized.tool_call_tokens, sized.tool_result_tokens) == (800, 2000)
    calibration = load_shape_file(SHAPES / "calibration" / "thunderagent-hle-qwen3-8b.toml")
    assert (calibration.profile, calibration.replicas, calibration.slots) == (
        "vllm-qwen3-8b-bf16-rtx5090",
        1,
        None,
    )
    real = load_shape_file(SHAPES / "real-engine" / "llamacpp-forced.toml")
    assert (real.slots, real.replicas, real.load.tool_call_tokens) == (4, 2, 24)
    with pytest.raises(ShapeError, match="tool_call_tokens"):
        parse_shape({**_valid(), "tool_call_tokens": 0})


def _with(change: dict[str, Any], group: dict[str, Any] | None = None, drop: str = "") -> dict[str, Any]:
    data = {**_valid(), **change}
    if group is not None:
        data["groups"] = [{**data["groups"][0], **group}]
    data.pop(drop, None)
    return data


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (_with({"slot": 8}), "slot"),
        (_with({}, drop="reply_tokens"), "reply_tokens"),
        (_with({"slots": "many"}), "slots"),
        (_with({"via": "http"}), "via"),
        (_with({"engine": {"queue": "lifo"}}), "engine.queue"),
        (_with({"engine": {"pool_scale": 0}}), "engine.pool_scale"),
        (_with({"engine": {"cache": "big"}}), "engine.cache"),
        (_with({"profile": "tgi-llama"}), "profile"),
        (_with({}, {"class": "bulk"}), "groups[0].class"),
        (_with({}, {"tool_second": 1.0}), "groups[0].tool_second"),
        (_with({}, {"tool_seconds": {"dist": "pareto", "alpha": 1.5}}), "groups[0].tool_seconds"),
        (_with({}, {"tool_seconds": {"dist": "lognormal", "median": 2.0}}), "groups[0].tool_seconds.p99"),
        (
            _with({}, {"tool_seconds": {"dist": "lognormal", "median": 2.0, "p99": 1.0}}),
            "groups[0].tool_seconds",
        ),
        (
            _with({}, {"tool_seconds": {"dist": "choice", "values": [1.0], "weights": [1.0, 2.0]}}),
            "tool_seconds",
        ),
    ],
)
def test_a_bad_key_is_refused_with_its_name(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ShapeError) as refused:
        parse_shape(data, "bad")
    assert named in str(refused.value)


def test_flood_sim_refuses_a_bad_shape_file_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((SHAPES / "light.toml").read_text().replace("reply_tokens", "reply_tokenz"))
    done = subprocess.run(
        [sys.executable, "bench/flood_sim.py", "--shape", str(bad)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 2
    assert "reply_tokenz" in done.stderr and "reply_tokens" in done.stderr
    # the message opens with the file's path as given, so a matrix of many files names the one
    assert f"error: {bad}: " in done.stderr


@pytest.mark.parametrize(
    ("tool", "median", "p99"),
    [
        (ToolTime("lognormal", median=2.0, p99=60.0), 2.0, 60.0),
        (ToolTime("choice", values=(0.1, 30.0), weights=(0.9, 0.1)), 0.1, 30.0),
        (ToolTime("constant", seconds=0.5), 0.5, 0.5),
    ],
)
def test_tool_times_are_drawn_from_their_distribution(tool: ToolTime, median: float, p99: float) -> None:
    rng = random.Random(7)
    draws = sorted(tool.draw(rng) for _ in range(20_000))
    assert draws[len(draws) // 2] == pytest.approx(median, rel=0.05)
    assert draws[int(len(draws) * 0.99)] == pytest.approx(p99, rel=0.15)


def test_flood_matrix_runs_shape_files_and_names_the_best_peer(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    done = subprocess.run(
        [
            sys.executable,
            "bench/flood_matrix.py",
            "--shapes",
            "bench/shapes/published.toml",
            "--seeds",
            "0",
            "--duration-s",
            "30",
            "--arrangements",
            "router,thunderagent,luftpause",
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "| published | router |" in done.stdout and "luftpause vs best peer" in done.stdout
    result = json.loads(out.read_text())
    assert result["simulated"] is True
    (shape,) = result["shapes"]
    rows = {row["arrangement"]: row for row in shape["rows"]}
    assert set(rows) == {"router", "thunderagent", "luftpause"}
    batch = shape["luftpause"]["batchRunsPerMinute"]
    best = max(("router", "thunderagent"), key=lambda name: rows[name]["batchRunsPerMinute"])
    assert batch["bestPeer"] == best
    assert batch["vsBestPeer"] == pytest.approx(
        rows["luftpause"]["batchRunsPerMinute"] / rows[best]["batchRunsPerMinute"], abs=0.001
    )


def _matrix(arrangements: str, out: Path) -> tuple[str, dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            "bench/flood_matrix.py",
            "--shapes",
            "bench/shapes/published.toml",
            "--seeds",
            "0",
            "--duration-s",
            "20",
            "--arrangements",
            arrangements,
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (shape,) = json.loads(out.read_text())["shapes"]
    return done.stdout, shape


def test_whether_the_flood_matters_does_not_depend_on_the_arrangements_asked(tmp_path: Path) -> None:
    # the reviewer's command: without the router the published flood printed "(no flood)"; in 20 s
    # no interactive run ends under the router while the light-load control's do
    stdout, without = _matrix("smg,luftpause", tmp_path / "without.json")
    _, with_router = _matrix("router,luftpause", tmp_path / "with.json")
    assert without["floodMatters"] is True and with_router["floodMatters"] is True
    assert without["routerP50"] == with_router["routerP50"]
    assert "| published | smg |" in stdout and "(no flood)" not in stdout
    assert {row["arrangement"] for row in without["rows"]} == {"smg", "luftpause"}


def test_the_flood_matters_when_the_router_slows_or_ends_no_interactive_run() -> None:
    assert flood_matrix.flood_matters(10.1, 5.0) and not flood_matrix.flood_matters(10.0, 5.0)
    assert flood_matrix.flood_matters(None, 5.0)  # none ended under the flood, the control's did
    assert not flood_matrix.flood_matters(None, None) and not flood_matrix.flood_matters(3.0, None)


def _row(
    arrangement: str, interactive: float | None, batch: float | None, p50: float | None
) -> dict[str, Any]:
    total = None if interactive is None or batch is None else interactive + batch
    return {
        "arrangement": arrangement,
        "interactiveRunsPerMinute": interactive,
        "batchRunsPerMinute": batch,
        "totalRunsPerMinute": total,
        "interactiveRunTimeP50": p50,
        "cacheHitRate": None,
    }


def test_a_missing_ratio_and_a_peer_at_zero_render_honestly() -> None:
    # the router ended nothing (0 runs/min, no p50); the batch of both peers is 0
    rows = [_row("router", 0.0, 0.0, None), _row("smg", 12.0, 0.0, 15.0), _row("luftpause", 21.0, 42.0, 10.0)]
    result = {
        "shape": "published",
        "floodMatters": True,
        "rows": rows,
        "luftpause": flood_matrix.ratios(rows),
    }
    mine = result["luftpause"]
    assert mine["batchRunsPerMinute"] == {"bestPeer": "router", "vsBestPeer": "inf", "vsRouter": "inf"}
    assert mine["interactiveRunTimeP50"] == {"bestPeer": "smg", "vsBestPeer": 1.5, "vsRouter": None}
    json.dumps(mine, allow_nan=False)  # "inf" is a string: the JSON stays JSON
    line = flood_matrix.render([result]).splitlines()[-1]
    assert line == (
        "| | luftpause vs best peer; vs router | 1.75x smg; inf (router 0) | inf (router 0); inf (router 0) "
        f"| 5.25x smg; inf (router 0) | 1.50x smg; {flood_matrix.NO_RATIO} router | |"
    )
    assert flood_matrix.NO_RATIO == "\N{EN DASH}" and "-x" not in line
