"""Soft affinity for idle runs (``policies/idle_affinity.py``): a run idle between its turns (no
tool call the proxy saw: a chat, an agent whose tool rounds the proxy cannot see) waits a bounded
time for the replica holding its prefix before it may move (bench/README.md, "REAL ENGINE": such
runs moving between llama.cpp replicas lost their prompt cache)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from decide_helpers import arrive, fail, feed, finish, held_turns, make_state, placements

from luftpause.scheduler.core import (
    Event,
    FirstToken,
    Place,
    ReplicaDrained,
    ReplicaProbed,
    RunEnded,
    Tick,
    TurnFinished,
    decide,
)
from luftpause.scheduler.core.policies import idle_affinity
from luftpause.scheduler.core.policies.idle_affinity import IdleAffinity
from luftpause.scheduler.core.state import Replica, Run

# -- the policy's functions ---------------------------------------------------------------------------


def _run(phase: str = "idle", last: str | None = "a", idle_at: float | None = 10.0, **fields: object) -> Run:
    run = Run("r", phase, last, "interactive", "ide", 0.0)  # type: ignore[arg-type]
    run.idle_at = idle_at
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def _replicas(**flags: bool) -> tuple[Replica, ...]:
    a = Replica("a", ("m",), "generative", 4, 0)
    for name, value in flags.items():
        setattr(a, name, value)
    return (a, Replica("b", ("m",), "generative", 4, 1))


@pytest.mark.parametrize(
    ("why", "settings", "run", "replicas", "now", "expected"),
    [
        ("idle after a finished turn, within the window", IdleAffinity(), _run(), _replicas(), 20.0, "a"),
        ("at the window's end", IdleAffinity(window_s=10.0), _run(), _replicas(), 20.0, "a"),
        ("past the window", IdleAffinity(window_s=10.0), _run(), _replicas(), 20.1, None),
        ("the rule off", IdleAffinity(mode="off"), _run(), _replicas(), 20.0, None),
        (
            "prefer: a soft replica, never held for",
            IdleAffinity(mode="prefer"),
            _run(),
            _replicas(),
            20.0,
            "a",
        ),
        ("a new run", IdleAffinity(), None, _replicas(), 20.0, None),
        ("its last turn failed (no idle time)", IdleAffinity(), _run(idle_at=None), _replicas(), 20.0, None),
        ("generating: strict affinity's", IdleAffinity(), _run("generating"), _replicas(), 20.0, None),
        ("tool-paused: strict affinity's", IdleAffinity(), _run("tool_paused"), _replicas(), 20.0, None),
        ("no last replica", IdleAffinity(), _run(last=None), _replicas(), 20.0, None),
        ("its replica unhealthy", IdleAffinity(), _run(), _replicas(healthy=False), 20.0, None),
        ("its replica's breaker open", IdleAffinity(), _run(), _replicas(breaker="open"), 20.0, None),
        ("its replica draining", IdleAffinity(), _run(), _replicas(draining=True), 20.0, None),
        ("its replica being removed", IdleAffinity(), _run(), _replicas(removing=True), 20.0, None),
        ("its replica not among the serving", IdleAffinity(), _run(last="c"), _replicas(), 20.0, None),
    ],
)
def test_the_soft_replica(
    why: str,
    settings: IdleAffinity,
    run: Run | None,
    replicas: tuple[Replica, ...],
    now: float,
    expected: str | None,
) -> None:
    soft = idle_affinity.soft_replica(settings, run, replicas, now)
    assert (None if soft is None else soft.name) == expected, why


@pytest.mark.parametrize(
    ("why", "settings", "run", "caller_rate", "sharing", "expected"),
    [
        ("nothing shown yet: the default", IdleAffinity(), _run(), None, 3, 2.0),
        ("no tokens held", IdleAffinity(), _run(cold_s_per_token=0.01), None, 3, 2.0),
        # 0.01 s a token x 300 tokens = 3 s of prefill; the soft replica's turns do not count
        (
            "its own rate: the miss",
            IdleAffinity(),
            _run(cold_s_per_token=0.01, prefix_tokens=300),
            None,
            8,
            3.0,
        ),
        (
            "shared (for measuring): the miss once per turn sharing the steps, 1 + 1 here",
            IdleAffinity(shared=True),
            _run(cold_s_per_token=0.01, prefix_tokens=300),
            None,
            1,
            6.0,
        ),
        ("its caller's rate before its own", IdleAffinity(), _run(prefix_tokens=300), 0.005, 0, 1.5),
        ("its own wins", IdleAffinity(), _run(cold_s_per_token=0.002, prefix_tokens=300), 0.05, 0, 0.6),
        ("at most max_s", IdleAffinity(), _run(cold_s_per_token=0.1, prefix_tokens=300), None, 0, 10.0),
        ("at least min_s", IdleAffinity(), _run(cold_s_per_token=1e-5, prefix_tokens=300), None, 8, 0.5),
        (
            "a factor: 2 x a miss of 1 s",
            IdleAffinity(factor=2.0),
            _run(cold_s_per_token=0.001, prefix_tokens=1000),
            None,
            1,
            2.0,
        ),
    ],
)
def test_the_wait(
    why: str,
    settings: IdleAffinity,
    run: Run,
    caller_rate: float | None,
    sharing: int,
    expected: float,
) -> None:
    assert idle_affinity.wait_s(settings, run, caller_rate, sharing, now=12.0) == pytest.approx(expected), why


@pytest.mark.parametrize(
    ("now", "expected"),
    [(12.0, 298.0), (310.0, 0.0), (400.0, 0.0)],  # the run went idle at 10.0; a window of 300 s
)
def test_pin_holds_until_the_window_ends(now: float, expected: float) -> None:
    run = _run(cold_s_per_token=0.01, prefix_tokens=300)
    assert idle_affinity.wait_s(IdleAffinity(mode="pin"), run, None, 8, now=now) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("placed_at", "first_token_at", "prompt_tokens", "expected"),
    [
        (1.0, 4.0, 300, 0.01),
        (1.0, None, 300, None),  # no first token seen
        (1.0, 4.0, 0, None),  # no prompt count
        (5.0, 4.0, 100, 0.0),  # a first token dated before the placement (clocks): no negative rate
    ],
)
def test_the_cold_rate(
    placed_at: float, first_token_at: float | None, prompt_tokens: int, expected: float | None
) -> None:
    assert idle_affinity.cold_rate(placed_at, first_token_at, prompt_tokens) == pytest.approx(expected)


@pytest.mark.parametrize(("until", "now", "over"), [(None, 1e9, False), (5.0, 4.9, False), (5.0, 5.0, True)])
def test_a_wait_is_over(until: float | None, now: float, over: bool) -> None:
    assert idle_affinity.over(until, now) == over


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "sticky"},
        {"window_s": -1.0},
        {"factor": 0.0},
        {"min_s": 0.0},
        {"min_s": 5.0, "max_s": 1.0},
        {"default_s": 0.0},
        {"default_s": 20.0},  # past max_s: a wait the bounds do not allow
        {"max_s": float("nan")},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    field = next(iter(bad))
    with pytest.raises(ValueError, match=f"idle affinity {field}: expected"):
        IdleAffinity(**bad)  # type: ignore[arg-type]


# -- through decide -----------------------------------------------------------------------------------

TWO = [("a", ["m"], 1), ("b", ["m"], 1)]

# r1's first turn on a (finished at 1.0, idle there since), r2 takes a at 1.5: a is full, b is free
R1_IDLE_ON_A_FULL: list[Event] = [
    arrive("t1", "r1", at=0.0),
    finish("t1", at=1.0),
    arrive("t2", "r2", at=1.5),
]


@dataclass(frozen=True)
class Case:
    name: str
    settings: IdleAffinity
    before: list[Event]
    event: Event
    actions: list[Place]
    placed: dict[str, str]
    held: list[str]
    replicas: tuple[tuple[str, list[str], int], ...] = tuple(TWO)


CASES = [
    Case(
        "goes to its last replica when it has room, though another is less loaded",
        IdleAffinity(),
        [
            *(arrive(f"t{i}", f"r{i}", at=i / 10) for i in range(1, 6)),  # a: t1 t3 t5, b: t2 t4
            finish("t1", at=1.0),
            finish("t4", at=1.1),
        ],
        arrive("t6", "r1", at=2.0),
        [Place("t6", "a")],
        {"t2": "b", "t3": "a", "t5": "a", "t6": "a"},
        [],
        (("a", ["m"], 3), ("b", ["m"], 3)),
    ),
    Case(
        "held for its last replica while another has room",
        IdleAffinity(),
        R1_IDLE_ON_A_FULL,
        arrive("t3", "r1", at=2.0),
        [],
        {"t2": "a"},
        ["t3"],
    ),
    Case(
        "a tick before its wait's end (2 s by default) leaves it held",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        Tick(3.9),
        [],
        {"t2": "a"},
        ["t3"],
    ),
    Case(
        "the first tick at its wait's end lets it go anywhere",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0), Tick(3.9)],
        Tick(4.0),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "its last replica freeing within the wait takes it",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        finish("t2", at=3.0),
        [Place("t3", "a")],
        {"t3": "a"},
        [],
    ),
    Case(
        "its last replica turning unhealthy ends the wait",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        ReplicaProbed("a", 2.5, False),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "its last replica draining ends the wait",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        ReplicaDrained("a", 2.5),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "its run ending ends the wait (it starts afresh)",
        IdleAffinity(),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        RunEnded("r1", 2.5),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "a run whose last turn failed is not held for its replica",
        IdleAffinity(),
        [arrive("t1", "r1", at=0.0), fail("t1", at=1.0), arrive("t2", "r2", at=1.5)],
        arrive("t3", "r1", at=2.0),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "a run idle past the window is not held for its replica",
        IdleAffinity(window_s=60.0),
        [arrive("t1", "r1", at=0.0), finish("t1", at=1.0), arrive("t2", "r2", at=61.5)],
        arrive("t3", "r1", at=61.5),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "off: it goes to the replica with room at once (the rule before)",
        IdleAffinity(mode="off"),
        R1_IDLE_ON_A_FULL,
        arrive("t3", "r1", at=2.0),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "prefer: its replica when it has room, never held for it",
        IdleAffinity(mode="prefer"),
        R1_IDLE_ON_A_FULL,
        arrive("t3", "r1", at=2.0),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
    Case(
        "pin: held while the window lasts",
        IdleAffinity(mode="pin", window_s=60.0),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        Tick(50.0),
        [],
        {"t2": "a"},
        ["t3"],
    ),
    Case(
        "pin: the window's end ends the wait",
        IdleAffinity(mode="pin", window_s=60.0),
        [*R1_IDLE_ON_A_FULL, arrive("t3", "r1", at=2.0)],
        Tick(61.0),
        [Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decide(case: Case) -> None:
    state = make_state(case.replicas)
    state.idle_affinity = case.settings
    feed(state, case.before)
    state, actions = decide(state, case.event)
    assert [a for a in actions if isinstance(a, Place)] == case.actions
    assert placements(state) == case.placed
    assert held_turns(state) == case.held


def test_the_wait_is_learned_from_the_runs_first_prefill() -> None:
    """r1's first turn: placed at 0, first token at 3 s for 300 prompt tokens (0.01 s a token, a
    prefill with nothing cached), 20 tokens of reply; its next turn, held for a full ``a`` where
    one turn runs, waits 0.01 x 320 = 3.2 s, and its caller's next run starts from that."""
    state = make_state(TWO)
    feed(
        state,
        [
            arrive("t1", "r1", at=0.0, caller="ide"),
            FirstToken("t1", 3.0),
            TurnFinished("t1", 4.0, "stop", False, 300, 20),
            arrive("t2", "r2", at=4.5),
            arrive("t3", "r1", at=5.0, caller="ide"),
        ],
    )
    run = state.runs["r1"]
    assert run.cold_s_per_token == pytest.approx(0.01) and run.prefix_tokens == 320
    assert state.caller_cold_rates["ide"] == pytest.approx(0.01)
    held = state.held.get("t3")
    assert held is not None and held.soft == "a"
    assert held.soft_since == 5.0 and held.soft_until == pytest.approx(8.2)
    assert feed(state, [Tick(8.0)]) == [] and held_turns(state) == ["t3"]
    assert feed(state, [Tick(9.0)]) == [Place("t3", "b")]


def test_a_later_turn_teaches_no_cold_rate() -> None:
    """Only a run's first finished turn shows a prefill with nothing cached."""
    state = make_state(TWO)
    feed(
        state,
        [
            arrive("t1", "r1", at=0.0),
            finish("t1", at=1.0),  # no first token seen: no rate
            arrive("t2", "r1", at=2.0),
            FirstToken("t2", 2.1),
            TurnFinished("t2", 3.0, "stop", False, 100, 10),
        ],
    )
    run = state.runs["r1"]
    assert run.cold_s_per_token is None and run.finished_turns == 2 and run.prefix_tokens == 110


def test_once_its_wait_is_over_it_takes_the_first_slot_that_frees_anywhere() -> None:
    """Both replicas full: held for ``a`` until its wait ends, then in the queue of every replica,
    so ``b`` freeing first takes it."""
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    feed(
        state,
        [
            arrive("t1", "r1", at=0.0),
            finish("t1", at=1.0),
            arrive("t2", "r2", at=1.1),  # a
            arrive("t3", "r3", at=1.2),  # b
            arrive("t4", "r4", at=1.3),  # a: full
            arrive("t5", "r1", at=2.0),  # held for a
            arrive("t6", "r6", at=2.1),  # b: full
        ],
    )
    assert held_turns(state) == ["t5"]
    feed(state, [Tick(4.0)])  # its wait is over: it may go anywhere, both are full
    assert held_turns(state) == ["t5"]
    assert feed(state, [finish("t3", at=5.0)]) == [Place("t5", "b")]


def test_what_is_learned_per_caller_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller is a header the client chooses: a client that sends a new one on every run must
    not grow the scheduler. The tables keep the most recent callers (here 8 of 20)."""
    monkeypatch.setattr("luftpause.scheduler.core.state.MAX_REMEMBERED_CALLERS", 8)
    state = make_state(TWO)
    for i in range(20):
        t = 10.0 * i
        caller = f"caller-{i}"
        feed(
            state,
            [
                arrive(f"a{i}", f"r{i}", at=t, caller=caller),
                FirstToken(f"a{i}", t + 1.0),
                finish(f"a{i}", at=t + 2.0, tools=True),  # paused on a tool
                arrive(f"b{i}", f"r{i}", at=t + 3.0, caller=caller),  # back from it
                finish(f"b{i}", at=t + 4.0),
                RunEnded(f"r{i}", t + 5.0),
            ],
        )
    expected = [f"caller-{i}" for i in range(12, 20)]
    assert list(state.caller_cold_rates) == expected
    assert list(state.caller_pauses) == expected
