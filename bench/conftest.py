"""Benchmark helpers: print, after the run, how much faster each compiled twin was than its pure one.

A benchmark records its median time per round with ``record_twin_time(group, twin)``, ``twin`` being
``"py"`` or ``"c"``; the terminal summary then prints ``py / c`` for every group that has both, so the
ratio comes from one run on one machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import baseline_machine
import pytest

pytest_benchmark_compare_machine_info = baseline_machine.pytest_benchmark_compare_machine_info
"""A baseline saved on other hardware is reported, not fatal (``baseline_machine``)."""

# group -> twin -> median seconds per round
_MEDIANS: dict[str, dict[str, float]] = {}
# group -> label -> (median and min seconds per round, items per round), for record_against_baseline
_AGAINST: dict[str, dict[str, tuple[float, float, int]]] = {}


@pytest.fixture
def record_twin_time(benchmark: object) -> Callable[[str, str], None]:
    """Return ``record(group, twin)``, to be called after ``benchmark(...)`` has run."""

    def record(group: str, twin: str) -> None:
        stats = getattr(benchmark, "stats", None)  # None when benchmarks are disabled
        if stats is not None:
            _MEDIANS.setdefault(group, {})[twin] = float(stats["median"])

    return record


@pytest.fixture
def record_against_baseline(benchmark: object) -> Callable[[str, str, int], None]:
    """Return ``record(group, label, items)``, to be called after ``benchmark(...)`` has run: the
    summary prints each label's median per round and per item (``items`` per round, e.g. the
    events of a stream), and its median's and its minimum's ratios to the label ``"baseline"`` of
    its group, same run (on a loaded machine the minimum says more of the work itself)."""

    def record(group: str, label: str, items: int) -> None:
        stats = getattr(benchmark, "stats", None)
        if stats is not None:
            _AGAINST.setdefault(group, {})[label] = (float(stats["median"]), float(stats["min"]), items)

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    baseline_machine.pytest_terminal_summary(terminalreporter)
    against = {group: by_label for group, by_label in _AGAINST.items() if "baseline" in by_label}
    if against:
        terminalreporter.section("against the baseline of each group (median per round, same run)")
        for group, by_label in against.items():
            base, base_min, _ = by_label["baseline"]
            for label, (median, least, items) in by_label.items():
                per, least_per = median * 1e9 / items, least * 1e9 / items
                terminalreporter.write_line(
                    f"{group}: {label:<10} median {median * 1e6:8.1f} us ({per:6.0f} ns per item, "
                    f"{median / base:5.2f}x), min {least * 1e6:8.1f} us ({least_per:6.0f} ns per item, "
                    f"{least / base_min:5.2f}x the baseline)"
                )
    pairs = {group: by_twin for group, by_twin in _MEDIANS.items() if {"py", "c"} <= by_twin.keys()}
    if not pairs:
        return
    terminalreporter.section("compiled twin vs pure twin (median per round, same run)")
    for group, by_twin in pairs.items():
        py, c = by_twin["py"], by_twin["c"]
        terminalreporter.write_line(
            f"{group}: py {py * 1e6:9.1f} us   c {c * 1e6:9.1f} us   c is {py / c:5.1f}x faster"
        )


RATIO_GROUP = "e2e-ratio"
"""pytest-benchmark group of ``test_bench_e2e_ratio.py``, whose "times" are ratios."""


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_scale_unit(
    config: pytest.Config, unit: str, benchmarks: list[dict[str, Any]], best: float, worst: float, sort: str
) -> tuple[str, float] | None:
    """Show the ratio benchmarks' values as they are (a ratio of 1.5 as 1.5, not 1,500 ms)."""
    if unit == "seconds" and benchmarks and all(b.get("group") == RATIO_GROUP for b in benchmarks):
        return "", 1.0
    return None  # pytest-benchmark's own scaling
