"""Dataplanes lost for good: the turns placed for them are released after the grace (rule 9, 12).

Table-driven like ``test_decisions_per_event``: each case feeds ``before`` through ``decide``, then one
``event``, and compares the actions, placements, held turns, runs, the dataplanes still tracked as
lost and the count of released turns exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from luftpause.config import parse_config
from luftpause.scheduler.core import (
    AckResync,
    Action,
    DataplaneLost,
    Event,
    InFlightRecord,
    Place,
    Resynced,
    Tick,
    TurnArrived,
    TurnFinished,
    decide,
    new_state,
    snapshot,
)
from luftpause.scheduler.core.policies import lost_dataplane
from luftpause.scheduler.core.state import State

CONFIG = """
[scheduler]
dataplane_grace_s = 60.0
resync_hold_s = 0  # no startup hold (rule 15): these cases resync at once

[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
models = ["m"]
max_inflight = 2

[[replicas]]
name = "b"
url = "http://127.0.0.1:2"
models = ["m"]
max_inflight = 1
"""


def arrive(turn: str, run: str, dataplane: str, at: float = 0.0) -> TurnArrived:
    return TurnArrived(turn, run, "m", "interactive", "", dataplane, at)


def lost(dataplane: str, at: float) -> DataplaneLost:
    return DataplaneLost(dataplane, at)


def make_state() -> State:
    return new_state(parse_config(CONFIG, "lost.toml"))


@dataclass
class Case:
    name: str
    before: list[Event]
    event: Event
    actions: list[Action]
    placed: dict[str, str]
    held: list[str] = field(default_factory=list)
    runs: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    still_lost: list[str] = field(default_factory=list)
    released: int = 0


# dp1 holds t1 on a and t2 on b; dp2 holds t3 on a; t4 (dp2) is held, every slot being taken
THREE_PLACED: list[Event] = [
    arrive("t1", "r1", "dp1"),
    arrive("t2", "r2", "dp1"),
    arrive("t3", "r3", "dp2"),
    arrive("t4", "r4", "dp2", at=1.0),
]
PLACED_ALL = {"t1": "a", "t2": "b", "t3": "a"}
RUNS_ALL = {
    "r1": ("generating", "a"),
    "r2": ("generating", "b"),
    "r3": ("generating", "a"),
    "r4": ("idle", None),
}

CASES = [
    Case(
        "lost past the grace: its placed turns are released, runs go idle there, held turns move in",
        [*THREE_PLACED, lost("dp1", 10.0)],
        Tick(70.0),
        [Place("t4", "b")],  # the least loaded of the replicas the release opened (a has t3)
        {"t3": "a", "t4": "b"},
        runs={
            "r1": ("idle", "a"),
            "r2": ("idle", "b"),
            "r3": ("generating", "a"),
            "r4": ("generating", "b"),
        },
        released=2,
    ),
    Case(
        "lost within the grace: nothing is released yet",
        [*THREE_PLACED, lost("dp1", 10.0)],
        Tick(69.9),
        [],
        PLACED_ALL,
        ["t4"],
        RUNS_ALL,
        ["dp1"],
    ),
    Case(
        "back in time by a Resync listing its turns: nothing more is released",
        [
            *THREE_PLACED,
            lost("dp1", 10.0),
            Resynced(
                "dp1",
                40.0,
                (),
                (
                    InFlightRecord("t1", "r1", "a", "m", "interactive", ""),
                    InFlightRecord("t2", "r2", "b", "m", "interactive", ""),
                ),
            ),
        ],
        Tick(200.0),
        [],
        PLACED_ALL,
        ["t4"],
        RUNS_ALL,
    ),
    Case(
        "back too late: the released turn is adopted again from its Resync",
        [*THREE_PLACED, lost("dp1", 10.0), Tick(70.0)],
        Resynced("dp1", 80.0, (), (InFlightRecord("t2", "r2", "b", "m", "interactive", ""),)),
        [AckResync("dp1", 0, 1)],
        {"t3": "a", "t4": "b", "t2": "b"},
        runs={
            "r1": ("idle", "a"),
            "r2": ("generating", "b"),
            "r3": ("generating", "a"),
            "r4": ("generating", "b"),
        },
        released=2,  # by the tick before; none now
    ),
    Case(
        "two dataplanes lost at different times: only the one past its grace is released",
        [*THREE_PLACED, lost("dp1", 10.0), lost("dp2", 30.0)],
        Tick(75.0),
        [Place("t4", "b")],  # held turns are not the release's business (their Admits are)
        {"t3": "a", "t4": "b"},
        [],
        {
            "r1": ("idle", "a"),
            "r2": ("idle", "b"),
            "r3": ("generating", "a"),
            "r4": ("generating", "b"),
        },
        ["dp2"],
        released=2,
    ),
    Case(
        "two dataplanes lost, one resynced: the other's turns alone are released",
        [
            *THREE_PLACED,
            lost("dp1", 10.0),
            lost("dp2", 10.0),
            Resynced("dp2", 20.0, (), (InFlightRecord("t3", "r3", "a", "m", "interactive", ""),)),
        ],
        Tick(75.0),
        [Place("t4", "b")],
        {"t3": "a", "t4": "b"},
        runs={
            "r1": ("idle", "a"),
            "r2": ("idle", "b"),
            "r3": ("generating", "a"),
            "r4": ("generating", "b"),
        },
        released=2,
    ),
    Case(
        "a second loss before any return keeps the first time",
        [*THREE_PLACED, lost("dp1", 10.0), lost("dp1", 50.0)],
        Tick(70.0),
        [Place("t4", "b")],  # the least loaded of the replicas the release opened (a has t3)
        {"t3": "a", "t4": "b"},
        runs={
            "r1": ("idle", "a"),
            "r2": ("idle", "b"),
            "r3": ("generating", "a"),
            "r4": ("generating", "b"),
        },
        released=2,
    ),
    Case(
        "a dataplane without an id is never lost",
        [arrive("t1", "r1", ""), lost("", 0.0)],
        Tick(500.0),  # before the 600 s turn expiry
        [],
        {"t1": "a"},
        runs={"r1": ("generating", "a")},
    ),
    Case(
        "an overlapping earlier turn released leaves the phase to the run's latest turn",
        [
            arrive("t1", "r1", "dp1"),
            arrive("t2", "r1", "dp2", at=1.0),  # the run's latest turn, pinned to a
            lost("dp1", 10.0),
        ],
        Tick(70.0),
        [],
        {"t2": "a"},
        runs={"r1": ("generating", "a")},
        released=1,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lost_dataplane(case: Case) -> None:
    state = make_state()
    for event in case.before:
        state, _ = decide(state, event)
    state, actions = decide(state, case.event)
    assert actions == case.actions
    assert {turn_id: placed.replica for turn_id, placed in state.placed.items()} == case.placed
    assert [turn.turn_id for turn in state.held] == case.held
    assert {run_id: (run.phase, run.last_replica) for run_id, run in state.runs.items()} == case.runs
    assert list(state.lost_dataplanes) == case.still_lost
    assert state.counters.turns_released_lost_dataplane == case.released
    for replica in state.replicas.values():
        assert replica.inflight == sum(1 for p in state.placed.values() if p.replica == replica.name)


@pytest.mark.parametrize(
    ("lost_at", "now", "grace", "gone"),
    [
        (0.0, 59.9, 60.0, False),
        (0.0, 60.0, 60.0, True),
        (10.0, 100.0, 60.0, True),
        (10.0, 10.0, 0.5, False),
        (10.0, 10.5, 0.5, True),
    ],
)
def test_gone_for_good(lost_at: float, now: float, grace: float, gone: bool) -> None:
    assert lost_dataplane.gone_for_good(lost_at, now, grace) is gone


def test_the_grace_comes_from_the_configuration() -> None:
    state = new_state(parse_config(CONFIG.replace("60.0", "2.5"), "lost.toml"))
    assert state.dataplane_grace_s == 2.5
    events: list[Event] = [arrive("t1", "r1", "dp1"), lost("dp1", 1.0), Tick(3.5)]
    for event in events:
        state, _ = decide(state, event)
    assert not state.placed and state.replicas["a"].inflight == 0
    assert new_state(parse_config(CONFIG, "x.toml")).dataplane_grace_s == lost_dataplane.DATAPLANE_GRACE_S


def test_status_shows_lost_dataplanes_and_released_turns() -> None:
    state = make_state()
    events: list[Event] = [*THREE_PLACED, lost("dp1", 10.0), lost("dp2", 30.0)]
    for event in events:
        state, _ = decide(state, event)
    shown = snapshot(state, 40.0)
    assert shown["lost_dataplanes"] == {"dp1": 30.0, "dp2": 10.0}
    state, _ = decide(state, Tick(70.0))
    shown = snapshot(state, 70.0)
    assert shown["lost_dataplanes"] == {"dp2": 40.0}
    assert shown["counters"]["turns_released_lost_dataplane"] == 2


def test_a_finished_report_after_the_release_is_ignored() -> None:
    state = make_state()
    events: list[Event] = [*THREE_PLACED, lost("dp1", 10.0), Tick(70.0)]
    for event in events:
        state, _ = decide(state, event)
    state, actions = decide(state, TurnFinished("t1", 71.0, "stop", False, 1, 1))
    assert actions == [] and state.counters.finished == 0
