"""A saved baseline from other hardware is compared, and the difference reported, never fatal.

pytest-benchmark checks the saved baseline's ``machine_info`` against this machine's when it loads
it (``--benchmark-compare``, at configure time) and, when they differ, warns with a
``PytestBenchmarkWarning``. The suite's ``filterwarnings = ["error"]`` turns that warning into an
exception raised from ``pytest_configure``: an INTERNALERROR, and ``make bench-regress`` could run
on no machine but the one that saved its baseline. The latency regression suite records ratios
(the dataplane's time over a baseline's, in the same session) precisely so that it compares across
machines; this plugin keeps that one warning from failing the run and reports which fields of
``machine_info`` differ instead, at once and again in the terminal summary. Every other warning
raised while the baseline loads (no baseline found, say) stays an error.

``bench/conftest.py`` registers it for the benchmarks; ``-p baseline_machine`` (with ``bench/`` on
the path) loads it elsewhere.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from pytest_benchmark.logger import PytestBenchmarkWarning

DIFFERENT_MACHINE = "Benchmark machine_info is different"
"""How pytest-benchmark's warning begins (``pytest_benchmark/plugin.py``, 5.x)."""

FIRST = ("node", "cpu.brand_raw", "cpu.count", "machine", "system", "release", "python_version")
"""The fields named first when they differ: what a reader tells machines apart by."""

SHOWN = 6
"""At most this many differing fields are named; the rest are counted."""

_REPORTS: list[str] = []


def differing_fields(here: Any, saved: Any, prefix: str = "") -> Iterator[str]:
    """The dotted paths (``cpu.brand_raw``) at which two ``machine_info`` trees, as JSON reads them
    back, differ, in key order; a list (``cpu.flags``) is one field."""
    if isinstance(here, dict) and isinstance(saved, dict):
        for key in sorted(here.keys() | saved.keys()):
            yield from differing_fields(here.get(key), saved.get(key), f"{prefix}{key}.")
    elif here != saved:
        yield prefix.rstrip(".")


def describe(here: dict[str, Any], saved: dict[str, Any]) -> str:
    """One line: the baseline was saved on other hardware, and the fields that differ with both
    values (the saved one first; a list of more than 4 by its length), :data:`FIRST` first."""
    here = json.loads(json.dumps(here))  # tuples as lists, as the saved file has them
    fields = sorted(differing_fields(here, saved), key=lambda f: FIRST.index(f) if f in FIRST else len(FIRST))

    def value(tree: dict[str, Any], path: str) -> str:
        node: Any = tree
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return f"{len(node)} items" if isinstance(node, list) and len(node) > 4 else repr(node)

    named = ", ".join(f"{path} {value(saved, path)} -> {value(here, path)}" for path in fields[:SHOWN])
    more = f" and {len(fields) - SHOWN} more" if len(fields) > SHOWN else ""
    return (
        f"the baseline compared was saved on other hardware ({named}{more}); its ratios are compared "
        "as they are, since both times of each ratio come from one run"
    )


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config,
    benchmarksession: Any,
    machine_info: dict[str, Any],
    compared_benchmark: dict[str, Any],
) -> Generator[None, object, object]:
    with warnings.catch_warnings(record=True) as caught:
        # only this warning is caught: any other still meets the run's own filters (an error)
        warnings.filterwarnings("always", message=DIFFERENT_MACHINE, category=PytestBenchmarkWarning)
        result = yield
    for warning in caught:
        if issubclass(warning.category, PytestBenchmarkWarning) and str(warning.message).startswith(
            DIFFERENT_MACHINE
        ):
            line = describe(machine_info, compared_benchmark.get("machine_info", {}))
            _REPORTS.append(line)
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"luftpause bench: {line}")
        else:  # pragma: no cover - only under filters that let another warning be recorded
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _REPORTS:
        terminalreporter.section("the saved baseline's machine")
        for line in _REPORTS:
            terminalreporter.write_line(line)
