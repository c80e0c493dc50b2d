"""The ``tool_call_id -> run`` table the dataplane and the scheduler share, and the id extractors,
both twins.

Every behaviour test runs on the pure twin (``py``) and the compiled one (``c``). The Hypothesis tests
feed both the same random operation sequences and require them, and a naive model of the rules
written out in this file, to agree on every result.
"""

from __future__ import annotations

import ast
import gc
import importlib
import math
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause import tool_calls
from luftpause.tool_calls import NO_EXTENSIONS, _tool_calls_py

TTL = 1800.0

TWINS: dict[str, ModuleType] = {"py": _tool_calls_py}
if not NO_EXTENSIONS:
    # An ImportError here is a failure, not a skip: a normal install must have built the twin.
    TWINS["c"] = importlib.import_module("luftpause.tool_calls._tool_calls_c")


@pytest.fixture(params=["py", "c"])
def twin(request: pytest.FixtureRequest) -> ModuleType:
    if request.param not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    return TWINS[request.param]


def assistant(*ids: object) -> dict[str, Any]:
    """An assistant message of one tool round, as a harness sends it back."""
    calls = [{"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result(call_id: object) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


USER = {"role": "user", "content": "go on"}
SYSTEM = {"role": "system", "content": "you are an agent"}


# --- the table ---------------------------------------------------------------------------------


def test_a_reused_id_resolves_to_the_run_that_emitted_it_last(twin: ModuleType) -> None:
    table = twin.ToolCallTable()
    table.remember("run-a", ["call_0"], 10.0)
    assert table.lookup(["call_0"], 11.0) == "run-a"
    table.remember("run-b", ["call_0"], 12.0)
    assert table.lookup(["call_0"], 13.0) == "run-b"
    assert len(table) == 1
    # and back again when run-a's next response emits call_0 once more
    table.remember("run-a", ["call_0"], 14.0)
    assert table.lookup(["call_0"], 15.0) == "run-a"


def test_ids_naming_several_runs_resolve_to_the_most_recently_remembered(twin: ModuleType) -> None:
    table = twin.ToolCallTable()
    table.remember("run-a", ["call_a"], 10.0)
    table.remember("run-b", ["call_b"], 20.0)
    table.remember("run-c", ["call_c"], 20.0)  # same time: the later remember still wins
    assert table.lookup(["call_b", "call_a"], 30.0) == "run-b"
    assert table.lookup(["call_a", "call_c", "call_b"], 30.0) == "run-c"
    assert table.lookup(["unknown", "call_a"], 30.0) == "run-a"
    assert table.lookup(["unknown"], 30.0) is None
    assert table.lookup([], 30.0) is None


def test_empty_and_non_string_ids_are_never_remembered_nor_looked_up(twin: ModuleType) -> None:
    table = twin.ToolCallTable()
    # continuation deltas carry "id": ""; JSON can put anything where an id belongs
    table.remember("run-a", ["", "call_1", None, 7, ["call_2"], b"call_3"], 1.0)
    assert len(table) == 1
    assert table.lookup(["call_1"], 2.0) == "run-a"
    table.remember("run-b", [""], 3.0)
    assert len(table) == 1
    assert table.lookup([""], 4.0) is None
    assert table.lookup(["", None, 7, {"id": "call_1"}, b"call_1"], 4.0) is None


def test_an_id_expires_at_exactly_ttl_after_it_was_remembered(twin: ModuleType) -> None:
    table = twin.ToolCallTable(ttl_s=TTL)
    table.remember("run-a", ["call_1"], 100.0)
    assert table.lookup(["call_1"], 100.0 + TTL - 0.001) == "run-a"
    assert table.lookup(["call_1"], 100.0 + TTL) is None
    assert len(table) == 1  # an expired id is held, unused, until pruned
    assert table.prune(100.0 + TTL) == 1
    assert len(table) == 0


def test_remembering_an_id_again_renews_its_expiry(twin: ModuleType) -> None:
    table = twin.ToolCallTable(ttl_s=10.0)
    table.remember("run-a", ["call_1", "call_2"], 0.0)
    table.remember("run-a", ["call_1"], 5.0)
    assert table.lookup(["call_2"], 12.0) is None
    assert table.lookup(["call_1"], 12.0) == "run-a"
    assert table.prune(12.0) == 1
    assert table.lookup(["call_1"], 14.9) == "run-a"
    assert table.prune(15.0) == 1


def test_prune_drops_only_expired_ids_and_counts_them(twin: ModuleType) -> None:
    table = twin.ToolCallTable(ttl_s=60.0)
    table.remember("run-a", ["a1", "a2", "a3"], 0.0)
    table.remember("run-b", ["b1", "b2"], 30.0)
    table.remember("run-c", ["c1"], 50.0)
    assert table.prune(59.0) == 0
    assert table.prune(60.0) == 3
    assert len(table) == 3
    assert table.prune(60.0) == 0
    assert table.prune(1000.0) == 3
    assert len(table) == 0
    assert table.prune(2000.0) == 0
    # the table works on after being emptied
    table.remember("run-d", ["d1"], 2000.0)
    assert table.lookup(["d1"], 2001.0) == "run-d"


def test_a_clock_going_back_counts_as_the_latest_time(twin: ModuleType) -> None:
    table = twin.ToolCallTable(ttl_s=10.0)
    table.remember("run-a", ["call_1"], 100.0)
    table.remember("run-b", ["call_2"], 50.0)  # taken as 100.0: expires at 110.0, not 60.0
    assert table.lookup(["call_2"], 60.0) == "run-b"
    assert table.lookup(["call_2"], 109.0) == "run-b"
    assert table.prune(math.nan) == 0  # NaN is the latest time too
    assert table.lookup(["call_1", "call_2"], 110.0) is None
    assert table.prune(0.0) == 2


def test_the_table_holds_at_most_max_entries_evicting_the_oldest(twin: ModuleType) -> None:
    table = twin.ToolCallTable(max_entries=3)
    table.remember("run-a", ["a1", "a2"], 1.0)
    table.remember("run-b", ["b1"], 2.0)
    assert (len(table), table.evictions) == (3, 0)
    table.remember("run-a", ["a1"], 3.0)  # a1 is now the newest: a2 is the oldest
    table.remember("run-c", ["c1", "c2"], 4.0)
    assert (len(table), table.evictions) == (3, 2)
    assert table.lookup(["a2"], 5.0) is None
    assert table.lookup(["b1"], 5.0) is None
    assert table.lookup(["a1"], 5.0) == "run-a"
    assert table.lookup(["c1", "c2"], 5.0) == "run-c"


def test_a_hostile_stream_of_ids_cannot_grow_the_table_past_its_bound(twin: ModuleType) -> None:
    table = twin.ToolCallTable(max_entries=1000)
    for turn in range(50):
        table.remember(f"run-{turn}", (f"call_{turn}_{i}" for i in range(500)), float(turn))
        assert len(table) <= 1000
    assert table.evictions == 50 * 500 - 1000
    assert table.lookup(["call_49_499"], 50.0) == "run-49"
    assert table.lookup(["call_47_999", "call_47_499"], 50.0) is None


def test_bad_arguments_are_refused(twin: ModuleType) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        twin.ToolCallTable(ttl_s=0.0)
    with pytest.raises(ValueError, match="ttl_s"):
        twin.ToolCallTable(ttl_s=math.inf)
    with pytest.raises(ValueError, match="ttl_s"):
        twin.ToolCallTable(ttl_s=math.nan)
    with pytest.raises(ValueError, match="max_entries"):
        twin.ToolCallTable(max_entries=0)
    with pytest.raises(ValueError, match="max_entries"):
        twin.ToolCallTable(max_entries=sys.maxsize + 1)
    with pytest.raises(TypeError):
        twin.ToolCallTable(max_entries=1.5)
    table = twin.ToolCallTable()
    with pytest.raises(TypeError, match="run_id"):
        table.remember(None, ["call_1"], 1.0)
    with pytest.raises(ValueError, match="run_id"):
        table.remember("", ["call_1"], 1.0)
    assert len(table) == 0
    assert (table.ttl_s, table.max_entries) == (1800.0, 1_000_000)


def test_a_freed_table_frees_its_ids(twin: ModuleType) -> None:
    # the compiled twin's entries are linked both ways and not tracked by the garbage collector,
    # so a link left unbroken would keep every entry alive
    def fill() -> None:
        table = twin.ToolCallTable(max_entries=5000, ttl_s=10.0)
        for turn in range(100):
            table.remember(f"run-{turn % 7}", [f"id-{turn}-{i}" for i in range(80)] + ["call_0"], turn)
            table.prune(turn)

    fill()  # warm caches and free lists first
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            fill()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # 5000 ids held take well over 500 KB; what is left over must be small change
    assert after - before < 64 * 1024


# --- the ids of a request -----------------------------------------------------------------------


def test_request_ids_are_those_of_the_latest_tool_round(twin: ModuleType) -> None:
    messages = [
        SYSTEM,
        USER,
        assistant("call_0"),
        result("call_0"),
        assistant("call_1", "call_2"),  # a parallel round
        result("call_1"),
        result("call_2"),
    ]
    assert twin.request_tool_call_ids(messages) == ["call_1", "call_2"]
    # a user message and a plain answer after the round do not hide it
    later = [*messages, {"role": "assistant", "content": "done"}, USER]
    assert twin.request_tool_call_ids(later) == ["call_1", "call_2"]


def test_request_ids_come_from_tool_results_and_assistant_calls(twin: ModuleType) -> None:
    # results only (the assistant message trimmed by the harness), calls only (not yet answered)
    assert twin.request_tool_call_ids([USER, result("call_7"), result("call_8")]) == ["call_7", "call_8"]
    assert twin.request_tool_call_ids([USER, assistant("call_7", "call_8")]) == ["call_7", "call_8"]
    # a result whose call the harness dropped, and a call not yet answered
    messages = [assistant("call_1", "call_2"), result("call_2"), result("call_9")]
    assert twin.request_tool_call_ids(messages) == ["call_1", "call_2", "call_9"]


def test_a_round_without_ids_does_not_stop_the_walk_back(twin: ModuleType) -> None:
    messages = [assistant("call_1"), result("call_1"), USER, assistant(""), result(""), USER]
    assert twin.request_tool_call_ids(messages) == ["call_1"]
    assert twin.request_tool_call_ids([SYSTEM, USER]) == []
    assert twin.request_tool_call_ids([]) == []


def test_request_ids_are_capped_at_the_latest_max_lookup_ids(twin: ModuleType) -> None:
    cap = twin.MAX_LOOKUP_IDS
    ids = [f"call_{i}" for i in range(cap * 3)]
    assert twin.request_tool_call_ids([assistant(*ids)]) == ids[-cap:]
    assert twin.request_tool_call_ids([result(i) for i in ids]) == ids[-cap:]


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "messages",
        {"role": "tool", "tool_call_id": "call_1"},
        [None, 1, "x", [], [result("call_1")]],
        [{"role": None, "tool_call_id": "call_1"}, {"role": ["tool"], "tool_call_id": "call_1"}],
        [{"tool_call_id": "call_1"}, {"role": "TOOL", "tool_call_id": "call_1"}],
        [result(None), result(3), result(["call_1"]), result({"id": "call_1"}), result("")],
        [{"role": "assistant", "tool_calls": None}, {"role": "assistant", "tool_calls": "call_1"}],
        [{"role": "assistant", "tool_calls": {"id": "call_1"}}],
        [{"role": "assistant", "tool_calls": [None, "call_1", ["call_1"], {"id": 1}, {"id": ""}, {}]}],
    ],
    ids=[
        "null",
        "string",
        "object",
        "junk items",
        "role not a string",
        "no or other role",
        "bad tool_call_id",
        "tool_calls not a list",
        "tool_calls an object",
        "junk calls",
    ],
)
def test_request_ids_of_hostile_shapes_are_none(twin: ModuleType, messages: object) -> None:
    assert twin.request_tool_call_ids(messages) == []


def test_duplicate_request_ids_are_taken_once(twin: ModuleType) -> None:
    messages = [assistant("call_1", "call_1"), result("call_1"), result("call_1")]
    assert twin.request_tool_call_ids(messages) == ["call_1"]


# --- the ids of a non-streamed response ---------------------------------------------------------


def test_completion_ids_are_every_choices_tool_call_ids(twin: ModuleType) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": assistant("call_1", "", "call_2", "call_1"),
                "finish_reason": "tool_calls",
            },
            {"index": 1, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
            {"index": 2, "message": assistant("call_3"), "finish_reason": "tool_calls"},
        ],
    }
    assert twin.completion_tool_call_ids(completion) == ["call_1", "call_2", "call_3"]


@pytest.mark.parametrize(
    "completion",
    [
        None,
        [],
        {"choices": None},
        {"choices": {"message": assistant("call_1")}},
        {"choices": [None, 1, {"message": None}, {"message": [assistant("call_1")]}]},
        {"choices": [{"message": {"tool_calls": [None, {"id": None}, {"id": 5}, {"id": ""}]}}]},
        {"choices": [{"delta": assistant("call_1")}]},
    ],
)
def test_completion_ids_of_hostile_shapes_are_none(twin: ModuleType, completion: object) -> None:
    assert twin.completion_tool_call_ids(completion) == []


# --- both twins and a model of the rules, on random inputs --------------------------------------

_KEYS = ["role", "tool_call_id", "tool_calls", "id", "choices", "message", "content"]
_IDS = st.sampled_from(["", "call_0", "call_1", "call_2", "call_3", "toolu_01A", "chatcmpl-tool-9f"])
# any JSON value, its strings and keys drawn from the words the extractors look for
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.sampled_from(["", "tool", "assistant", "user"])
    | _IDS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
    max_leaves=20,
)
_calls = st.lists(st.fixed_dictionaries({}, optional={"id": _IDS | _json}) | _json, max_size=4)
_messages_lists = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["tool", "assistant", "user"]) | _json,
            "tool_call_id": _IDS | _json,
            "tool_calls": _calls | _json,
        },
    )
    | _json,
    max_size=8,
)
_completions = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries({}, optional={"message": _messages_lists.map(lambda m: m[0] if m else {})})
            | _json,
            max_size=3,
        )
    },
)


@settings(max_examples=300, deadline=None)
@given(messages=_messages_lists | _json, completion=_completions | _json)
def test_extractors_never_raise_and_twins_agree_on_any_json(messages: object, completion: object) -> None:
    for extract, doc in (("request_tool_call_ids", messages), ("completion_tool_call_ids", completion)):
        results = [getattr(module, extract)(doc) for module in TWINS.values()]
        assert all(found == results[0] for found in results)
        assert all(type(call_id) is str and call_id for call_id in results[0])
        assert len(set(results[0])) == len(results[0])


@dataclass
class Model:
    """The rules of the module docstring, written out as plainly as possible."""

    ttl_s: float
    max_entries: int
    latest: float = -math.inf
    seq: int = 0
    evictions: int = 0

    def __post_init__(self) -> None:
        self.held: dict[str, tuple[str, float, int]] = {}  # id -> (run, expires, seq)

    def clock(self, now: float) -> float:
        if now > self.latest:
            self.latest = now
        return self.latest

    def remember(self, run_id: str, ids: Iterable[object], now: float) -> None:
        expires = self.clock(now) + self.ttl_s
        for call_id in ids:
            if isinstance(call_id, str) and call_id:
                self.seq += 1
                self.held[call_id] = (run_id, expires, self.seq)
                if len(self.held) > self.max_entries:
                    oldest = min(self.held, key=lambda i: self.held[i][2])
                    del self.held[oldest]
                    self.evictions += 1

    def lookup(self, ids: Iterable[object], now: float) -> str | None:
        now = self.clock(now)
        live = [self.held[i] for i in ids if isinstance(i, str) and i in self.held and now < self.held[i][1]]
        return max(live, key=lambda entry: entry[2])[0] if live else None

    def prune(self, now: float) -> int:
        now = self.clock(now)
        expired = [i for i, entry in self.held.items() if now >= entry[1]]
        for call_id in expired:
            del self.held[call_id]
        return len(expired)

    def __len__(self) -> int:
        return len(self.held)


_RUNS = st.sampled_from(["run-a", "run-b", "run-c", "run-d"])
_id_lists = st.lists(_IDS | st.sampled_from([None, 0, b"call_0"]), max_size=5)
# steps forward, mostly small against the ttl, sometimes exactly onto an expiry, now and then back
_steps = st.sampled_from([0.0, 0.0, 0.25, 1.0, 2.5, 5.0, 10.0, -1.0, -7.5, math.nan])
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("remember"), _steps, _RUNS, _id_lists),
        st.tuples(st.just("lookup"), _steps, _id_lists),
        st.tuples(st.just("prune"), _steps),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ttl=st.sampled_from([1.0, 2.5, 10.0, 0.1]), cap=st.integers(1, 6), operations=_operations)
def test_twins_and_the_model_agree_on_random_operations(
    ttl: float, cap: int, operations: list[tuple[Any, ...]]
) -> None:
    tables: list[Any] = [
        Model(ttl, cap),
        *(m.ToolCallTable(ttl_s=ttl, max_entries=cap) for m in TWINS.values()),
    ]
    now = 1000.0
    for operation in operations:
        kind, step = operation[0], operation[1]
        if not math.isnan(step):
            now += step
        passed = step if math.isnan(step) else now  # a NaN, or the clock
        if kind == "remember":
            outcomes = [t.remember(operation[2], operation[3], passed) for t in tables]
        elif kind == "lookup":
            outcomes = [t.lookup(operation[2], passed) for t in tables]
        else:
            outcomes = [t.prune(passed) for t in tables]
        assert all(o == outcomes[0] for o in outcomes), operation
        assert all(len(t) == len(tables[0]) <= cap for t in tables)
        assert all(t.evictions == tables[0].evictions for t in tables)


# --- which twin is loaded -----------------------------------------------------------------------


@pytest.mark.skipif(NO_EXTENSIONS, reason="LUFTPAUSE_NO_EXTENSIONS is set: the pure twin is expected")
def test_compiled_twin_is_loaded_in_a_normal_install() -> None:
    assert tool_calls.USING_EXTENSION, (
        "luftpause.tool_calls._tool_calls_c did not load: build it with pip install -e ."
    )
    for name in ("ToolCallTable", "request_tool_call_ids", "completion_tool_call_ids"):
        assert getattr(tool_calls, name).__module__ == "luftpause.tool_calls._tool_calls_c"


def test_no_extensions_variable_selects_the_pure_twin() -> None:
    code = (
        "from luftpause import tool_calls as t; "
        "print(t.USING_EXTENSION, t.ToolCallTable.__module__, t.request_tool_call_ids.__module__)"
    )
    env = {**os.environ, "LUFTPAUSE_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pure = "luftpause.tool_calls._tool_calls_py"
    assert out.stdout.split() == ["False", pure, pure]


def test_the_shared_table_imports_neither_process_that_uses_it() -> None:
    """The dataplane and the scheduler both import it, so it imports neither (nor anything else
    of luftpause but itself)."""
    package = Path(tool_calls.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith("luftpause.") or name.startswith("luftpause.tool_calls"), (
                    f"{path.name} imports {name}"
                )
