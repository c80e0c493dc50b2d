"""Micro-benchmark of the ``tool_call_id -> run`` table: the compiled twin against the pure one, same run.

Run: ``.venv/bin/pytest bench/test_bench_tool_calls.py --benchmark-only``. Each group holds both twins
and the summary prints their ratio (``bench/conftest.py``). The cases:

* ``lookup + remember`` -- 1,000 turns of 10,000 live runs, each turn as the dataplane handles it:
  look up the 1-4 ids of the run's latest tool round, then remember the 1-4 ids its response
  emitted. A quarter of the runs are on an engine that reuses ``call_0``..``call_3`` in every
  response; the rest get unique ids (``chatcmpl-tool-<hex>``). The table starts with every run's
  last round (about 15,000 ids), and each run draws its ids from a fixed set of 8, so it grows
  toward at most about 60,000 ids over the rounds.
* ``request ids`` -- :func:`request_tool_call_ids` over 1,000 requests of 40 messages each (the
  latest tool round, then a user message), the other half of finding a request's run.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from luftpause.tool_calls import _tool_calls_py

RUNS = 10_000
TURNS = 1_000
IDS_PER_RUN = 8


def _twin(name: str) -> ModuleType:
    if name == "py":
        return _tool_calls_py
    try:
        return importlib.import_module("luftpause.tool_calls._tool_calls_c")
    except ImportError:
        pytest.skip("the compiled twin is not built (pip install -e . --no-deps --no-build-isolation)")


def _vocabulary(rng: random.Random) -> list[list[str]]:
    """Each run's possible tool-call ids: shared ``call_N`` for a quarter of the runs, else unique."""
    runs = []
    for run in range(RUNS):
        if run % 4 == 0:
            runs.append([f"call_{i}" for i in range(IDS_PER_RUN)])
        else:
            runs.append([f"chatcmpl-tool-{rng.getrandbits(64):016x}" for _ in range(IDS_PER_RUN)])
    return runs


def _round_ids(rng: random.Random, vocabulary: list[str]) -> list[str]:
    """The ids of one tool round: 1-4 parallel calls, numbered from 0 on reusing engines."""
    count = rng.choice((1, 1, 1, 2, 2, 3, 4))
    if vocabulary[0] == "call_0":
        return vocabulary[:count]
    return rng.sample(vocabulary, count)


@pytest.mark.parametrize("twin", ["py", "c"])
def test_lookup_and_remember(benchmark: Any, record_twin_time: Callable[[str, str], None], twin: str) -> None:
    module = _twin(twin)
    rng = random.Random(5)
    vocabulary = _vocabulary(rng)
    latest = [_round_ids(rng, ids) for ids in vocabulary]
    table = module.ToolCallTable()
    now = 1000.0
    for run in range(RUNS):
        table.remember(f"run-{run}", latest[run], now)
    # each turn: a run sends the results of its latest round and emits a new round
    turns = []
    for _ in range(TURNS):
        run = rng.randrange(RUNS)
        emitted = _round_ids(rng, vocabulary[run])
        turns.append((f"run-{run}", latest[run], emitted))
        latest[run] = emitted
    group = "tool_call table: 1,000 turns (lookup 1-4 ids + remember 1-4 ids), 10,000 live runs"
    benchmark.group = group
    clock = [now]

    def handle_turns() -> list[str | None]:
        lookup, remember = table.lookup, table.remember
        t = clock[0]
        found = []
        for run_id, sent, emitted in turns:
            t += 0.001
            found.append(lookup(sent, t))
            remember(run_id, emitted, t)
        clock[0] = t
        return found

    found = benchmark(handle_turns)
    record_twin_time(group, twin)
    # what was measured must be correct: a run with unique ids is always found (the first round
    # replays state the table already has, so every round finds the same)
    unique = [
        (run_id, got) for (run_id, sent, _), got in zip(turns, found, strict=True) if sent[0] != "call_0"
    ]
    assert unique and all(got == run_id for run_id, got in unique)
    assert all(got is not None for got in found)
    assert RUNS <= len(table) <= RUNS * IDS_PER_RUN


@pytest.mark.parametrize("twin", ["py", "c"])
def test_request_ids(benchmark: Any, record_twin_time: Callable[[str, str], None], twin: str) -> None:
    module = _twin(twin)
    rng = random.Random(9)
    requests = []
    for _ in range(TURNS):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "you are a coding agent"}]
        while len(messages) < 36:
            ids = [f"call_{rng.getrandbits(40):010x}" for _ in range(rng.choice((1, 1, 2, 4)))]
            messages.append({"role": "user", "content": "next step"})
            messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": i} for i in ids]})
            messages += [{"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids]
        messages.append({"role": "user", "content": "go on"})
        requests.append(messages)
    group = "request ids: 1,000 requests of ~40 messages"
    benchmark.group = group
    extract = module.request_tool_call_ids

    def extract_all() -> list[list[str]]:
        return [extract(messages) for messages in requests]

    found = benchmark(extract_all)
    record_twin_time(group, twin)
    assert found == [_tool_calls_py.request_tool_call_ids(messages) for messages in requests]
    assert all(1 <= len(ids) <= 4 for ids in found)
