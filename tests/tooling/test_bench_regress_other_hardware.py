"""``make bench-regress`` compares against a baseline saved on other hardware (issue 22: it stopped
with an INTERNALERROR on every machine but the one that saved ``bench/baselines/``, because
pytest-benchmark warns that ``machine_info`` differs and the suite's ``filterwarnings = ["error"]``
made that warning a crash).

The comparison runs as the Makefile runs it (its ``REGRESS_BASELINE`` and ``REGRESS_FAIL``, the
repository's warning filters, ``bench/baseline_machine.py`` loaded) against a copy of the committed
baseline whose ``machine_info`` says another CPU, host and Python, stored under another platform's
folder. The benchmarks compared are stand-ins with the committed ones' names whose every round
is a fixed ratio (the suite's own clock trick, ``RatioClock``), so no engine, nginx or dataplane
is started: a ratio at the baseline's passes, one grown past the threshold is the regression
failure (exit 1), and the differing machine is reported in both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from repo_paths import ROOT

BASELINES = ROOT / "bench" / "baselines"
OTHER_PLATFORM = "Linux-CPython-3.99-64bit"
"""The folder pytest-benchmark would file a baseline saved under another Python in."""

STAND_IN = """
import os

import pytest


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def _rounds(benchmark):
    clock = Clock()
    benchmark._timer = clock
    ratio = float(os.environ["STAND_IN_RATIO"])

    def one_round():
        clock.now += ratio

    benchmark.pedantic(one_round, rounds=5, iterations=1)


@pytest.mark.benchmark(group="e2e-ratio")
def test_a_streamed_turn_through_the_dataplane_against_the_engine_directly(benchmark):
    _rounds(benchmark)


@pytest.mark.benchmark(group="e2e-ratio")
def test_a_streamed_turn_through_the_dataplane_against_nginx(benchmark):
    _rounds(benchmark)
"""
"""Benchmarks named as ``bench/test_bench_e2e_ratio.py``'s, each round a ratio of ``STAND_IN_RATIO``."""


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name} \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile sets no {name}"
    return match.group(1).strip()


def _committed_baseline() -> tuple[str, dict[str, object]]:
    baseline = _make_variable("REGRESS_BASELINE")
    number = baseline.rsplit("/", 1)[-1]
    (path,) = BASELINES.glob(f"*/{number}_*.json")
    return path.name, json.loads(path.read_text())


@pytest.fixture
def other_hardware(tmp_path: Path) -> Path:
    """A checkout-like folder: the stand-in benchmarks at ``bench/test_bench_e2e_ratio.py``, the
    repository's pytest warning filters, and the committed baseline as saved on other hardware."""
    name, saved = _committed_baseline()
    machine = saved["machine_info"]
    assert isinstance(machine, dict)
    machine.update(node="elsewhere", python_version="3.99.0", processor="other")
    machine["cpu"] = {**machine["cpu"], "brand_raw": "Some Other CPU", "count": 96}
    storage = tmp_path / "bench" / "baselines" / OTHER_PLATFORM
    storage.mkdir(parents=True)
    (storage / name).write_text(json.dumps(saved))
    (tmp_path / "bench" / "test_bench_e2e_ratio.py").write_text(STAND_IN)
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nfilterwarnings =\n" + "".join(f"    {f}\n" for f in options["filterwarnings"])
    )
    return tmp_path


def _regress(folder: Path, ratio: float, plugin: bool = True) -> subprocess.CompletedProcess[str]:
    """``make bench-regress``'s pytest command, run in ``folder``."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "bench/test_bench_e2e_ratio.py",
        "--benchmark-only",
        "--benchmark-storage=bench/baselines",
        "-p",
        "no:cacheprovider",
        f"--benchmark-compare={_make_variable('REGRESS_BASELINE')}",
        f"--benchmark-compare-fail={_make_variable('REGRESS_FAIL')}",
    ]
    if plugin:
        command[3:3] = ["-p", "baseline_machine"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), "STAND_IN_RATIO": str(ratio)}
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def _median(name: str) -> float:
    _, saved = _committed_baseline()
    benchmarks = saved["benchmarks"]
    assert isinstance(benchmarks, list)
    return float(next(b for b in benchmarks if b["name"] == name)["stats"]["median"])


def test_a_baseline_from_other_hardware_is_compared_and_the_difference_reported(other_hardware: Path) -> None:
    # the lower of the two saved medians: neither benchmark grew against its own
    at_baseline = min(
        _median("test_a_streamed_turn_through_the_dataplane_against_the_engine_directly"),
        _median("test_a_streamed_turn_through_the_dataplane_against_nginx"),
    )
    done = _regress(other_hardware, at_baseline)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "2 passed" in out
    assert "was saved on other hardware" in out and "cpu.brand_raw 'Some Other CPU' -> " in out, out[-4000:]
    assert "INTERNALERROR" not in out


def test_a_grown_ratio_still_fails_against_a_baseline_from_other_hardware(other_hardware: Path) -> None:
    grown = 2 * _median("test_a_streamed_turn_through_the_dataplane_against_the_engine_directly")
    done = _regress(other_hardware, grown)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "Performance has regressed" in out, out[-4000:]
    assert "was saved on other hardware" in out
    assert "INTERNALERROR" not in out


def test_without_the_plugin_the_same_comparison_is_the_internal_error_it_was(other_hardware: Path) -> None:
    """The stand-in meets the fault the plugin fixes: pytest-benchmark's warning, made an error."""
    done = _regress(other_hardware, 1.0, plugin=False)
    out = done.stdout + done.stderr
    assert done.returncode == 3, out[-4000:]
    assert "INTERNALERROR" in out and "machine_info is different" in out
