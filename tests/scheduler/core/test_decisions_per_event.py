"""Table-driven tests of the scheduler core: (state, event) -> (actions, resulting state).

Each case builds a state from its replicas by feeding ``before`` through ``decide``, then feeds one
``event`` and compares the actions and the resulting placements, held turns and runs exactly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from decide_helpers import (
    Case,
    ReplicaRow,
    abandon,
    arrive,
    fail,
    feed,
    finish,
    held_turns,
    inflight,
    make_state,
    placements,
    probe,
    refused,
    reported,
    run_record,
    runs,
    single,
)
from repo_paths import ROOT

from luftpause.config import parse_config
from luftpause.scheduler.core import (
    AckResync,
    DataplaneLost,
    Event,
    FirstToken,
    Forget,
    Place,
    Reject,
    Resynced,
    RunEnded,
    State,
    Tick,
    TurnArrived,
    TurnStarted,
    decide,
    new_state,
    snapshot,
)
from luftpause.scheduler.core.policies import abandoned
from luftpause.scheduler.core.policies.pause_hold import PauseHold

TWO = [("a", ["m"], 2), ("b", ["m"], 2)]
GEN_AND_SP: list[ReplicaRow] = [("a", ["m"], 1), ("s", ["m"], 1, "single_pass")]
"""One generative and one single-pass replica, one slot each, both serving ``m``."""
TWO_OF_ONE = [("a", ["m"], 1), ("b", ["m"], 1)]
ONE_OF_ONE = [("a", ["m"], 1)]


CASES = [
    # -- model routing ------------------------------------------------------------------------------
    Case(
        "routes to the replica declaring the model",
        [("a", ["m1"], 2), ("b", ["m2"], 2)],
        [],
        arrive("t1", "r1", model="m2"),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "never routes to a single-pass replica",
        [("s", ["m"], 8, "single_pass"), ("b", ["m"], 2)],
        [],
        arrive("t1", "r1"),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "unknown model is rejected at once and nothing is recorded",
        TWO,
        [],
        arrive("t1", "r1", model="gpt-9"),
        [Reject("t1", "no Generative replica serves model 'gpt-9'", 404)],
        {},
        [],
        {},
    ),
    Case(
        "a model served only by single-pass replicas is unknown to generative routing",
        [("s", ["cls"], 8, "single_pass"), ("b", ["m"], 2)],
        [],
        arrive("t1", "r1", model="cls"),
        [Reject("t1", "no Generative replica serves model 'cls'", 404)],
        {},
        [],
        {},
    ),
    # -- choice and capacity ------------------------------------------------------------------------
    Case(
        "a new run goes to the least loaded replica",
        TWO,
        [arrive("t1", "r1")],
        arrive("t2", "r2"),
        [Place("t2", "b")],
        {"t1": "a", "t2": "b"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b")},
    ),
    Case(
        "equal load goes to the replica configured first",
        [("b", ["m"], 2), ("a", ["m"], 2)],
        [],
        arrive("t1", "r1"),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "a full replica holds the turn",
        ONE_OF_ONE,
        [arrive("t1", "r1")],
        arrive("t2", "r2", at=1.0),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a full replica is skipped for one with room",
        [("a", ["m"], 1), ("b", ["m"], 3)],
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3")],
        arrive("t4", "r4"),
        [Place("t4", "b")],
        {"t1": "a", "t2": "b", "t3": "b", "t4": "b"},
        [],
        {
            "r1": ("generating", "a"),
            "r2": ("generating", "b"),
            "r3": ("generating", "b"),
            "r4": ("generating", "b"),
        },
    ),
    # -- held turns ---------------------------------------------------------------------------------
    Case(
        "a freed slot goes to the oldest held turn",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2", at=1.0), arrive("t3", "r3", at=2.0)],
        finish("t1", at=3.0),
        [Place("t2", "a")],
        {"t2": "a"},
        ["t3"],
        {"r1": ("idle", "a"), "r2": ("generating", "a"), "r3": ("idle", None)},
    ),
    Case(
        "a turn pinned to a full replica does not block a later turn for another replica",
        TWO_OF_ONE,
        [
            arrive("t1", "r1"),  # a
            arrive("t2", "r2"),  # b
            finish("t1", at=1.0, tools=True),  # r1 tool_paused on a, a free
            arrive("t3", "r3", at=2.0),  # a (the only room)
            arrive("t4", "r1", at=3.0),  # pinned to a, held
            arrive("t5", "r5", at=4.0),  # may go anywhere, held
        ],
        finish("t2", at=5.0),
        [Place("t5", "b")],
        {"t3": "a", "t5": "b"},
        ["t4"],
        {
            "r1": ("tool_paused", "a"),
            "r2": ("idle", "b"),
            "r3": ("generating", "a"),
            "r5": ("generating", "b"),
        },
    ),
    Case(
        "a slot freed on the pinned replica goes to the turn pinned there",
        TWO_OF_ONE,
        [
            arrive("t1", "r1"),
            arrive("t2", "r2"),
            finish("t1", at=1.0, tools=True),
            arrive("t3", "r3", at=2.0),  # takes a
            arrive("t4", "r1", at=3.0),  # pinned to a, held
        ],
        finish("t3", at=4.0),
        [Place("t4", "a")],
        {"t2": "b", "t4": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b"), "r3": ("idle", "a")},
    ),
    # -- affinity -----------------------------------------------------------------------------------
    Case(
        "a generating run's next turn goes to its last replica although another is less loaded",
        TWO,
        [arrive("t1", "r1")],
        arrive("t2", "r1", at=1.0),
        [Place("t2", "a")],
        {"t1": "a", "t2": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a tool-paused run's next turn goes to its last replica although another is less loaded",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r2"), finish("t1", tools=True), arrive("t3", "r3")],
        arrive("t4", "r1", at=2.0),
        [Place("t4", "a")],
        {"t2": "b", "t3": "a", "t4": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b"), "r3": ("generating", "a")},
    ),
    Case(
        "a tool-paused run waits for its full last replica although another has room",
        TWO_OF_ONE,
        [arrive("t1", "r1"), finish("t1", tools=True), arrive("t2", "r2")],
        arrive("t3", "r1", at=2.0),
        [],
        {"t2": "a"},
        ["t3"],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "a")},
    ),
    Case(
        # its last replica holds its prefix: the soft replica of policies/idle_affinity.py
        "an idle run whose last turn finished waits for its replica although another has room",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3"), finish("t1"), arrive("t5", "r3")],
        arrive("t4", "r1", at=2.0),
        [],
        {"t2": "b", "t3": "a", "t5": "a"},
        ["t4"],
        {"r1": ("idle", "a"), "r2": ("generating", "b"), "r3": ("generating", "a")},
    ),
    Case(
        "an idle run whose last turn failed may move to a less loaded replica",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3"), fail("t1"), arrive("t5", "r3")],
        arrive("t4", "r1", at=2.0),
        [Place("t4", "b")],
        {"t2": "b", "t3": "a", "t5": "a", "t4": "b"},
        [],
        {"r1": ("generating", "b"), "r2": ("generating", "b"), "r3": ("generating", "a")},
    ),
    Case(
        "a failed turn leaves the run idle, free to move",
        TWO_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2"), fail("t1"), arrive("t3", "r3")],
        arrive("t4", "r1", at=2.0),
        [],
        {"t2": "b", "t3": "a"},
        ["t4"],
        {"r1": ("idle", "a"), "r2": ("generating", "b"), "r3": ("generating", "a")},
    ),
    Case(
        "a held turn of a generating run waits for its replica although another frees",
        TWO_OF_ONE,
        [
            arrive("t1", "r1"),  # a
            arrive("t2", "r1"),  # pinned to a, held
            arrive("t3", "r3"),  # b
        ],
        finish("t3", at=2.0),
        [],  # t2 stays pinned: r1 still generating on a
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r3": ("idle", "b")},
    ),
    # -- abandon ------------------------------------------------------------------------------------
    Case(
        "an abandoned held turn leaves the queue without an action",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3")],
        abandon("t2"),
        [],
        {"t1": "a"},
        ["t3"],
        {"r1": ("generating", "a"), "r2": ("idle", None), "r3": ("idle", None)},
    ),
    Case(
        "an abandoned placed turn frees its slot for the oldest held turn",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        abandon("t1"),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("idle", "a"), "r2": ("generating", "a")},
    ),
    # -- abandon reported by the dataplane (TurnEvent.ABANDONED) -------------------------------------
    Case(
        "a reported abandon of a held turn takes it out of the queue and refuses its waiting Admit",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3")],
        reported("t2"),
        [refused("t2")],
        {"t1": "a"},
        ["t3"],
        {"r1": ("generating", "a"), "r2": ("idle", None), "r3": ("idle", None)},
    ),
    Case(
        "a reported abandon of a placed turn frees its slot and leaves its run idle",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        reported("t1"),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("idle", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "a reported abandon of an earlier turn leaves the phase to the run's newer turn in flight",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r1")],
        reported("t1"),
        [],
        {"t2": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a reported abandon of a run's latest turn leaves the run idle though an earlier one runs",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r1")],
        reported("t2"),
        [],
        {"t1": "a"},
        [],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a reported abandon of a turn never seen changes nothing",
        TWO,
        [arrive("t1", "r1")],
        reported("zz"),
        [],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "an Admit arriving after its turn was reported abandoned is refused and nothing is recorded",
        ONE_OF_ONE,
        [reported("t1", at=0.0)],
        arrive("t1", "r1", at=1.0),
        [refused("t1")],
        {},
        [],
        {},
    ),
    Case(
        "a retried Admit of a placed turn reported abandoned since is refused",
        TWO,
        [arrive("t1", "r1"), reported("t1", at=1.0)],
        arrive("t1", "r1", at=2.0),
        [refused("t1")],
        {},
        [],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a tombstone younger than 120 s survives a tick",
        TWO,
        [reported("t1", at=0.0), Tick(119.0)],
        arrive("t1", "r1", at=119.5),
        [refused("t1")],
        {},
        [],
        {},
    ),
    Case(
        "a tombstone is forgotten by the first tick 120 s after the report",
        TWO,
        [reported("t1", at=0.0), Tick(120.0)],
        arrive("t1", "r1", at=120.5),
        [Place("t1", "a")],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    # -- run ended ----------------------------------------------------------------------------------
    Case(
        "a run that ended is forgotten at once",
        TWO,
        [arrive("t1", "r1"), finish("t1", tools=True)],
        RunEnded("r1", 2.0),
        [Forget("r1")],
        {},
        [],
        {},
    ),
    Case(
        "a held turn of an ended run loses its affinity and takes a replica with room",
        TWO_OF_ONE,
        [arrive("t1", "r1"), finish("t1", tools=True), arrive("t2", "r2"), arrive("t3", "r1")],
        RunEnded("r1", 2.0),
        [Forget("r1"), Place("t3", "b")],
        {"t2": "a", "t3": "b"},
        [],
        {"r2": ("generating", "a"), "r1": ("generating", "b")},
    ),
    Case(
        "held turns of an ended run follow the affinity of its fresh placement",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [
            arrive("t0", "r0"),
            arrive("t1", "r0"),
            arrive("t2", "r0"),  # pinned to full a
            arrive("t3", "r0"),  # pinned to full a
            RunEnded("r0", 1.0),  # t2 starts r0 afresh on b; t3 is now pinned to b
        ],
        abandon("t0", at=2.0),
        [],
        {"t1": "a", "t2": "b"},
        ["t3"],
        {"r0": ("generating", "b")},
    ),
    Case(
        "a turn of an ended run does not change the run started afresh when it ends",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [arrive("t0", "r0"), RunEnded("r0", 1.0), arrive("t1", "r0", at=2.0)],
        finish("t0", at=3.0, tools=True),
        [],
        {"t1": "b"},
        [],
        {"r0": ("generating", "b")},
    ),
    # -- tick: expiry -------------------------------------------------------------------------------
    Case(
        "a placed turn is kept until 600 s without a completion",
        ONE_OF_ONE,
        [arrive("t1", "r1", at=0.0), arrive("t2", "r2", at=1.0)],
        Tick(599.0),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a placed turn without a completion after 600 s is dropped and its slot freed",
        ONE_OF_ONE,
        [arrive("t1", "r1", at=0.0), arrive("t2", "r2", at=1.0)],
        Tick(600.0),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("idle", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "a run is kept until 1800 s without a turn",
        TWO,
        [arrive("t1", "r1", at=0.0), finish("t1", at=10.0)],
        Tick(1809.0),
        [],
        {},
        [],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a run without a turn for 1800 s is forgotten",
        TWO,
        [arrive("t1", "r1", at=0.0), finish("t1", at=10.0, tools=True), arrive("t2", "r2", at=1700.0)],
        Tick(1810.0),
        [Forget("r1")],
        {"t2": "a"},
        [],
        {"r2": ("generating", "a")},
    ),
    Case(
        "a run whose turn is held is never forgotten",
        ONE_OF_ONE,
        [arrive("t1", "r1", at=0.0), arrive("t2", "r2", at=1.0), arrive("t3", "r3", at=2.0)],
        Tick(2000.0),
        [Place("t2", "a")],  # t1 expired and t2 took its slot; r3, still held, is kept
        {"t2": "a"},
        ["t3"],
        {"r1": ("idle", "a"), "r2": ("generating", "a"), "r3": ("idle", None)},
    ),
    # -- resync -------------------------------------------------------------------------------------
    Case(
        "resynced in-flight turns count against capacity",
        TWO_OF_ONE,
        [Resynced("dp", 0.0, (), (inflight("x1", "q1", "a"),))],
        arrive("t1", "r1", at=1.0),
        [Place("t1", "b")],
        {"x1": "a", "t1": "b"},
        [],
        {"q1": ("generating", "a"), "r1": ("generating", "b")},
    ),
    Case(
        "a resynced turn id listed twice is counted once",
        [("a", ["m"], 2)],
        [],
        Resynced("dp", 0.0, (), (inflight("x1", "q1", "a"), inflight("x1", "q1", "a"))),
        [AckResync("dp", 0, 1)],
        {"x1": "a"},
        [],
        {"q1": ("generating", "a")},
    ),
    Case(
        "a resynced turn already placed is counted once",
        [("a", ["m"], 2)],
        [arrive("t1", "r1")],
        Resynced("dp", 1.0, (run_record("r1", "a", "generating"),), (inflight("t1", "r1", "a"),)),
        [AckResync("dp", 1, 1)],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a resynced tool-paused run keeps its affinity",
        TWO,
        [
            Resynced("dp", 0.0, (run_record("q1", "b", "tool_paused"),), ()),
            arrive("t1", "r1"),
            arrive("t2", "r2"),
        ],
        arrive("t3", "q1", at=1.0),
        [Place("t3", "b")],
        {"t1": "a", "t2": "b", "t3": "b"},
        [],
        {"q1": ("generating", "b"), "r1": ("generating", "a"), "r2": ("generating", "b")},
    ),
    Case(
        "a resynced idle run may go anywhere",
        TWO,
        [Resynced("dp", 0.0, (run_record("q1", "b", "idle"),), ()), arrive("t1", "r1")],
        arrive("t2", "q1", at=1.0),
        [Place("t2", "b")],
        {"t1": "a", "t2": "b"},
        [],
        {"q1": ("generating", "b"), "r1": ("generating", "a")},
    ),
    Case(
        "a held turn the dataplane says is running is answered with that replica",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        Resynced("dp", 1.0, (), (inflight("t1", "r1", "a"), inflight("t2", "r2", "a"))),
        [Place("t2", "a"), AckResync("dp", 0, 2)],
        {"t1": "a", "t2": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "turns a dataplane no longer lists free their slots on its resync",
        ONE_OF_ONE,
        [arrive("t1", "r1"), TurnArrived("t2", "r2", "m", "batch", "", "other-dp", 0.5)],
        Resynced("dp", 1.0, (), ()),
        [Place("t2", "a"), AckResync("dp", 0, 0)],
        {"t2": "a"},
        [],
        # r1's latest turn is gone and the dataplane sent no record of r1: it is idle, not generating
        {"r1": ("idle", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "a placed turn the dataplane lists as pending (its Admit answer on the wire) stands",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        Resynced("dp", 1.0, (), (), frozenset({"t1"})),
        [AckResync("dp", 0, 0)],  # without "pending", t1 would be released and t2 placed
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a gone turn leaves a run the dataplane sent a record of in the recorded phase",
        ONE_OF_ONE,
        [arrive("t1", "r1")],
        Resynced("dp", 1.0, (run_record("r1", "a", "tool_paused"),), ()),
        [AckResync("dp", 1, 0)],
        {},
        [],
        {"r1": ("tool_paused", "a")},
    ),
    Case(
        "a gone turn that was not its run's latest leaves the phase to the latest",
        TWO,
        [arrive("t1", "r1"), TurnArrived("t2", "r1", "m", "interactive", "", "other-dp", 0.5)],
        Resynced("dp", 1.0, (), ()),
        [AckResync("dp", 0, 0)],
        {"t2": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a held turn of a run whose latest turn is gone loses its affinity",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [
            arrive("t1", "r1"),
            TurnArrived("t2", "r2", "m", "interactive", "", "other-dp", 0.5),  # b
            TurnArrived("t5", "r5", "m", "interactive", "", "other-dp", 0.5),  # a, now full
            TurnArrived("t3", "r1", "m", "interactive", "", "other-dp", 0.6),  # pinned to full a
            finish("t2", at=0.7),  # b has room, but t3 stays pinned to a
        ],
        Resynced("dp", 1.0, (), ()),
        # r1 is idle now, so t3 may go anywhere: to the least loaded, b (pinned, it would take a)
        [Place("t3", "b"), AckResync("dp", 0, 0)],
        {"t5": "a", "t3": "b"},
        [],
        {"r1": ("generating", "b"), "r2": ("idle", "b"), "r5": ("generating", "a")},
    ),
    Case(
        "a resynced turn on a replica not configured here is not adopted",
        ONE_OF_ONE,
        [],
        Resynced("dp", 0.0, (), (inflight("x1", "q1", "gone"),)),
        [AckResync("dp", 0, 0)],
        {},
        [],
        {},
    ),
    # -- retries and stray reports ------------------------------------------------------------------
    Case(
        "a retried arrival of a placed turn is answered with its placement",
        TWO,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        arrive("t1", "r1", at=1.0),
        [Place("t1", "a")],
        {"t1": "a", "t2": "b"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b")},
    ),
    Case(
        "a retried arrival of a held turn stays held once",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2")],
        arrive("t2", "r2", at=1.0),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a report about an unknown turn is ignored",
        ONE_OF_ONE,
        [arrive("t1", "r1")],
        finish("nope"),
        [],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    # -- health ---------------------------------------------------------------------------------------
    Case(
        "an unhealthy replica gets no turns",
        TWO,
        [probe("a", healthy=False)],
        arrive("t1", "r1", at=1.0),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "a known model whose replicas are all unhealthy waits, it is not refused",
        ONE_OF_ONE,
        [probe("a", healthy=False)],
        arrive("t1", "r1", at=1.0),
        [],
        {},
        ["t1"],
        {"r1": ("idle", None)},
    ),
    Case(
        "a held turn is placed when its replica is healthy again",
        ONE_OF_ONE,
        [probe("a", healthy=False), arrive("t1", "r1", at=1.0)],
        probe("a", at=2.0),
        [Place("t1", "a")],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a never probed replica counts as healthy",
        ONE_OF_ONE,
        [probe("b", healthy=False)],  # not configured: ignored
        arrive("t1", "r1", at=1.0),
        [Place("t1", "a")],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "strict affinity yields when the run's replica is unhealthy",
        TWO,
        [arrive("t1", "r1"), finish("t1", at=1.0, tools=True), probe("a", at=1.5, healthy=False)],
        arrive("t2", "r1", at=2.0),
        [Place("t2", "b")],
        {"t2": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "a turn held for its replica moves to one with room when that replica turns unhealthy",
        TWO_OF_ONE,
        [
            arrive("t1", "r1"),  # a
            arrive("t2", "r2"),  # b
            finish("t1", at=1.0, tools=True),  # r1 paused on a
            arrive("t3", "r3", at=2.0),  # takes a
            arrive("t4", "r1", at=3.0),  # pinned to a: held
            finish("t2", at=4.0),  # b frees, nothing for it
        ],
        probe("a", at=5.0, healthy=False),
        [Place("t4", "b")],
        {"t3": "a", "t4": "b"},
        [],
        {"r1": ("generating", "b"), "r2": ("idle", "b"), "r3": ("generating", "a")},
    ),
    Case(
        "a held turn of a run paused on a healthy replica stays pinned there",
        TWO_OF_ONE,
        [
            arrive("t1", "r1"),
            arrive("t2", "r2"),
            finish("t1", at=1.0, tools=True),
            arrive("t3", "r3", at=2.0),
            arrive("t4", "r1", at=3.0),
        ],
        probe("b", at=4.0, running=0, waiting=0),
        [],
        {"t2": "b", "t3": "a"},
        ["t4"],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "b"), "r3": ("generating", "a")},
    ),
    # -- engine-load admission ----------------------------------------------------------------------
    Case(
        "with no engine queue a replica accepts turns up to max_inflight",
        [("a", ["m"], 3)],
        [probe("a", running=1, waiting=0), arrive("t1", "r1", at=1.0), arrive("t2", "r2", at=1.0)],
        arrive("t3", "r3", at=1.0),
        [Place("t3", "a")],
        {"t1": "a", "t2": "a", "t3": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "a"), "r3": ("generating", "a")},
    ),
    Case(
        "once the engine reports a queue in-flight turns are capped at its running count",
        [("a", ["m"], 4)],
        [arrive("t1", "r1"), arrive("t2", "r2"), probe("a", at=1.0, running=2, waiting=3)],
        arrive("t3", "r3", at=1.5),
        [],
        {"t1": "a", "t2": "a"},
        ["t3"],
        {"r1": ("generating", "a"), "r2": ("generating", "a"), "r3": ("idle", None)},
    ),
    Case(
        "the cap lifts when the engine's queue drains",
        [("a", ["m"], 4)],
        [
            arrive("t1", "r1"),
            arrive("t2", "r2"),
            probe("a", at=1.0, running=2, waiting=3),
            arrive("t3", "r3", at=1.5),
        ],
        probe("a", at=2.0, running=2, waiting=0),
        [Place("t3", "a")],
        {"t1": "a", "t2": "a", "t3": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "a"), "r3": ("generating", "a")},
    ),
    Case(
        "a queued engine's cap never exceeds max_inflight",
        [("a", ["m"], 1)],
        [arrive("t1", "r1"), probe("a", at=1.0, running=9, waiting=3)],
        arrive("t2", "r2", at=1.5),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a replica that reports no load is capped only by max_inflight",
        [("a", ["m"], 3)],
        [probe("a"), arrive("t1", "r1", at=1.0), arrive("t2", "r2", at=1.0)],
        arrive("t3", "r3", at=1.0),
        [Place("t3", "a")],
        {"t1": "a", "t2": "a", "t3": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "a"), "r3": ("generating", "a")},
    ),
    Case(
        "a turn goes to the replica whose engine has no queue",
        TWO,
        [probe("a", running=0, waiting=2)],
        arrive("t1", "r1", at=1.0),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    # -- headroom -----------------------------------------------------------------------------------
    Case(
        "a batch turn may use a slot beyond the headroom",
        [("a", ["m"], 2)],
        [arrive("t1", "r1"), finish("t1", at=1.0, tools=True)],
        arrive("t2", "r2", at=2.0, cls="batch"),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "a batch turn may not take the slot kept for a paused interactive run",
        [("a", ["m"], 2)],
        [arrive("t1", "r1"), finish("t1", at=1.0, tools=True), arrive("t2", "r2", at=2.0, cls="batch")],
        arrive("t3", "r3", at=3.0, cls="batch"),
        [],
        {"t2": "a"},
        ["t3"],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "a"), "r3": ("idle", None)},
    ),
    Case(
        "an interactive turn may take the kept slot",
        [("a", ["m"], 2)],
        [arrive("t1", "r1"), finish("t1", at=1.0, tools=True), arrive("t2", "r2", at=2.0, cls="batch")],
        arrive("t3", "r3", at=3.0),
        [Place("t3", "a")],
        {"t2": "a", "t3": "a"},
        [],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "a"), "r3": ("generating", "a")},
    ),
    Case(
        "the returning paused run takes its kept slot",
        [("a", ["m"], 2)],
        [
            arrive("t1", "r1"),
            finish("t1", at=1.0, tools=True),
            arrive("t2", "r2", at=2.0, cls="batch"),
            arrive("t3", "r3", at=3.0, cls="batch"),
        ],
        arrive("t4", "r1", at=4.0),
        [Place("t4", "a")],
        {"t2": "a", "t4": "a"},
        ["t3"],
        {"r1": ("generating", "a"), "r2": ("generating", "a"), "r3": ("idle", None)},
    ),
    Case(
        "a paused batch run keeps no slot",
        [("a", ["m"], 1)],
        [arrive("t1", "r1", cls="batch"), finish("t1", at=1.0, tools=True)],
        arrive("t2", "r2", at=2.0, cls="batch"),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("tool_paused", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "the kept slot is released when the paused run ends",
        [("a", ["m"], 2)],
        [
            arrive("t1", "r1"),
            finish("t1", at=1.0, tools=True),
            arrive("t2", "r2", at=2.0, cls="batch"),
            arrive("t3", "r3", at=3.0, cls="batch"),
        ],
        RunEnded("r1", 4.0),
        [Forget("r1"), Place("t3", "a")],
        {"t2": "a", "t3": "a"},
        [],
        {"r2": ("generating", "a"), "r3": ("generating", "a")},
    ),
    Case(
        "the kept slot is released when the paused run expires",
        [("a", ["m"], 2)],
        [
            arrive("t1", "r1"),
            finish("t1", at=1.0, tools=True),
            arrive("t2", "r2", at=2.0, cls="batch"),
            arrive("t3", "r3", at=3.0, cls="batch"),
            finish("t2", at=1500.0),  # r3's turn takes t2's slot at once
            arrive("t4", "r4", at=1600.0, cls="batch"),
        ],
        Tick(1801.0),
        [Forget("r1"), Place("t4", "a")],
        {"t3": "a", "t4": "a"},
        [],
        {"r2": ("idle", "a"), "r3": ("generating", "a"), "r4": ("generating", "a")},
    ),
    # -- order of held turns ------------------------------------------------------------------------
    Case(
        "an interactive held turn goes before an older batch one",
        ONE_OF_ONE,
        [arrive("t1", "r1"), arrive("t2", "r2", at=1.0, cls="batch"), arrive("t3", "r3", at=2.0)],
        finish("t1", at=3.0),
        [Place("t3", "a")],
        {"t3": "a"},
        ["t2"],
        {"r1": ("idle", "a"), "r2": ("idle", None), "r3": ("generating", "a")},
    ),
    Case(
        "the caller with fewer in-flight turns goes before an older turn of a busier caller",
        [("a", ["m"], 2)],
        [
            arrive("t1", "r1", caller="x"),
            arrive("t2", "r2", caller="x"),
            arrive("t3", "r3", at=1.0, caller="x"),
            arrive("t4", "r4", at=2.0, caller="y"),
        ],
        finish("t1", at=3.0),
        [Place("t4", "a")],
        {"t2": "a", "t4": "a"},
        ["t3"],
        {
            "r1": ("idle", "a"),
            "r2": ("generating", "a"),
            "r3": ("idle", None),
            "r4": ("generating", "a"),
        },
    ),
    Case(
        "callers with equally many in-flight turns go in arrival order",
        [("a", ["m"], 3)],
        [
            arrive("t1", "r1", caller="x"),
            arrive("t2", "r2", caller="y"),
            arrive("t3", "r3", caller="z"),
            arrive("t4", "r4", at=1.0, caller="y"),
            arrive("t5", "r5", at=2.0, caller="x"),
        ],
        finish("t3", at=3.0),
        [Place("t4", "a")],
        {"t1": "a", "t2": "a", "t4": "a"},
        ["t5"],
        {
            "r1": ("generating", "a"),
            "r2": ("generating", "a"),
            "r3": ("idle", "a"),
            "r4": ("generating", "a"),
            "r5": ("idle", None),
        },
    ),
    Case(
        "class comes before the caller's load",
        [("a", ["m"], 2)],
        [
            arrive("t1", "r1", caller="x"),
            arrive("t2", "r2", caller="x"),
            arrive("t3", "r3", at=1.0, caller="y", cls="batch"),
            arrive("t4", "r4", at=2.0, caller="x"),
        ],
        finish("t1", at=3.0),
        [Place("t4", "a")],
        {"t2": "a", "t4": "a"},
        ["t3"],
        {
            "r1": ("idle", "a"),
            "r2": ("generating", "a"),
            "r3": ("idle", None),
            "r4": ("generating", "a"),
        },
    ),
    # -- the re-filing of held turns keeps their order --------------------------------------------------
    Case(
        "a batch turn set free by its run's failure does not take the slot an interactive turn "
        "pinned there waits for",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [
            arrive("t0", "r0"),
            arrive("t1", "r1"),
            arrive("t2", "r3"),
            arrive("t3", "r0", at=1.0),  # pinned to a
            arrive("t4", "r3", at=2.0, cls="batch"),  # pinned to a, until t2 fails
        ],
        fail("t2", at=3.0),
        [Place("t3", "a")],
        {"t0": "a", "t1": "b", "t3": "a"},
        ["t4"],
        {"r0": ("generating", "a"), "r1": ("generating", "b"), "r3": ("idle", "a")},
    ),
    # -- single-pass turns (rule 13) -----------------------------------------------------------------
    Case(
        "a single-pass turn goes to a single-pass replica and creates no run",
        GEN_AND_SP,
        [],
        single("d1", "r1"),
        [Place("d1", "s")],
        {"d1": "s"},
        [],
        {},
    ),
    Case(
        "a single-pass turn goes only to a single-pass replica declaring its model",
        [("a", ["m"], 2), ("s1", ["other"], 2, "single_pass"), ("s2", ["m"], 2, "single_pass")],
        [],
        single("d1", "r1"),
        [Place("d1", "s2")],
        {"d1": "s2"},
        [],
        {},
    ),
    Case(
        "a single-pass turn for a model only generative replicas serve is refused at once",
        [("a", ["m", "g"], 1), ("s", ["m"], 1, "single_pass")],
        [],
        single("d1", "r1", model="g"),
        [Reject("d1", "no SinglePass replica serves model 'g'", 404)],
        {},
        [],
        {},
    ),
    Case(
        "a single-pass turn goes to the least loaded single-pass replica",
        [("a", ["m"], 1), ("s1", ["m"], 2, "single_pass"), ("s2", ["m"], 2, "single_pass")],
        [single("d1")],
        single("d2"),
        [Place("d2", "s2")],
        {"d1": "s1", "d2": "s2"},
        [],
        {},
    ),
    Case(
        "a generative turn waits rather than take a free single-pass slot",
        GEN_AND_SP,
        [arrive("t1", "r1")],
        arrive("t2", "r2"),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a single-pass turn waits rather than take a free generative slot",
        GEN_AND_SP,
        [single("d1")],
        single("d2"),
        [],
        {"d1": "s"},
        ["d2"],
        {},
    ),
    Case(
        "a single-pass turn of a generating run leaves its phase, affinity and last replica alone",
        GEN_AND_SP,
        [arrive("t1", "r1")],
        single("d1", "r1"),
        [Place("d1", "s")],
        {"t1": "a", "d1": "s"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a single-pass turn ending with tool calls leaves its run alone",
        GEN_AND_SP,
        [arrive("t1", "r1"), finish("t1"), single("d1", "r1", at=2.0)],
        finish("d1", at=3.0, tools=True),
        [],
        {},
        [],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a failed single-pass turn leaves a tool-paused run paused",
        GEN_AND_SP,
        [arrive("t1", "r1"), finish("t1", tools=True), single("d1", "r1", at=2.0)],
        fail("d1", at=3.0),
        [],
        {},
        [],
        {"r1": ("tool_paused", "a")},
    ),
    Case(
        "an ended run leaves its single-pass turns alone, held ones too",
        GEN_AND_SP,
        [arrive("t1", "r1"), single("d1", "r1"), single("d2", "r1")],
        RunEnded("r1", 1.0),
        [Forget("r1")],
        {"t1": "a", "d1": "s"},
        ["d2"],
        {},
    ),
    Case(
        "a freed single-pass slot does not release a held generative turn",
        GEN_AND_SP,
        [arrive("t1", "r1"), arrive("t2", "r2"), single("d1")],
        finish("d1"),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a freed generative slot does not release a held single-pass turn",
        GEN_AND_SP,
        [arrive("t1", "r1"), single("d1"), single("d2")],
        finish("t1"),
        [],
        {"d1": "s"},
        ["d2"],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a held single-pass turn takes the single-pass slot a finish frees",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        finish("d1"),
        [Place("d2", "s")],
        {"d2": "s"},
        [],
        {},
    ),
    Case(
        "a held single-pass turn takes the single-pass slot a failure frees",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        fail("d1"),
        [Place("d2", "s")],
        {"d2": "s"},
        [],
        {},
    ),
    Case(
        "a held single-pass turn takes the single-pass slot an abandon frees",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        abandon("d1"),
        [Place("d2", "s")],
        {"d2": "s"},
        [],
        {},
    ),
    Case(
        "a held single-pass turn takes the single-pass slot expiry frees",
        GEN_AND_SP,
        [single("d1", at=0.0), single("d2", at=1.0)],
        Tick(600.0),
        [Place("d2", "s")],
        {"d2": "s"},
        [],
        {},
    ),
    Case(
        "an abandoned held single-pass turn leaves its queue",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        abandon("d2"),
        [],
        {"d1": "s"},
        [],
        {},
    ),
    Case(
        "a retried Admit of a placed single-pass turn is answered again",
        GEN_AND_SP,
        [single("d1")],
        single("d1", at=1.0),
        [Place("d1", "s")],
        {"d1": "s"},
        [],
        {},
    ),
    Case(
        "a single-pass turn reported abandoned while held is refused",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        reported("d2"),
        [refused("d2")],
        {"d1": "s"},
        [],
        {},
    ),
    Case(
        "a single-pass turn skips an unhealthy single-pass replica",
        [("s1", ["m"], 2, "single_pass"), ("s2", ["m"], 2, "single_pass")],
        [probe("s1", healthy=False)],
        single("d1", at=1.0),
        [Place("d1", "s2")],
        {"d1": "s2"},
        [],
        {},
    ),
    Case(
        "a single-pass turn held for an unhealthy replica is placed when it recovers",
        GEN_AND_SP,
        [probe("s", healthy=False), single("d1", at=1.0)],
        probe("s", at=2.0),
        [Place("d1", "s")],
        {"d1": "s"},
        [],
        {},
    ),
    Case(
        "a single-pass replica whose engine queues is capped at its running count",
        [("a", ["m"], 1), ("s", ["m"], 4, "single_pass")],
        [probe("s", running=1, waiting=2), single("d1", at=1.0)],
        single("d2", at=1.0),
        [],
        {"d1": "s"},
        ["d2"],
        {},
    ),
    Case(
        "a probe lifting a single-pass replica's cap releases its held turns",
        [("a", ["m"], 1), ("s", ["m"], 4, "single_pass")],
        [probe("s", running=1, waiting=2), single("d1", at=1.0), single("d2", at=1.0)],
        probe("s", at=2.0, running=1, waiting=0),
        [Place("d2", "s")],
        {"d1": "s", "d2": "s"},
        [],
        {},
    ),
    Case(
        "a held interactive single-pass turn comes before a batch one",
        GEN_AND_SP,
        [single("d1"), single("d2", at=1.0, cls="batch"), single("d3", at=2.0)],
        finish("d1", at=3.0),
        [Place("d3", "s")],
        {"d3": "s"},
        ["d2"],
        {},
    ),
    Case(
        "a held single-pass turn of the caller with fewer single-pass turns in flight comes first",
        [("a", ["m"], 1), ("s", ["m"], 2, "single_pass")],
        [
            single("d1", caller="x"),
            single("d2", caller="y"),
            single("d3", at=1.0, caller="x"),
            single("d4", at=2.0, caller="y"),
        ],
        finish("d2", at=3.0),
        [Place("d4", "s")],
        {"d1": "s", "d4": "s"},
        ["d3"],
        {},
    ),
    Case(
        "single-pass fairness counts single-pass turns only: generative ones do not push a caller back",
        [("a", ["m"], 2), ("s", ["m"], 2, "single_pass")],
        [
            arrive("t1", "r1", caller="x"),
            arrive("t2", "r2", caller="x"),
            single("d1", caller="y"),
            single("d2", caller="z"),
            single("d3", at=1.0, caller="y"),
            single("d4", at=2.0, caller="x"),
        ],
        finish("d2", at=3.0),
        [Place("d4", "s")],
        {"t1": "a", "t2": "a", "d1": "s", "d4": "s"},
        ["d3"],
        {"r1": ("generating", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "generative fairness counts generative turns only: single-pass ones do not push a caller back",
        [("a", ["m"], 2), ("s", ["m"], 2, "single_pass")],
        [
            single("d1", caller="x"),
            single("d2", caller="x"),
            arrive("t1", "r1", caller="y"),
            arrive("t2", "r2", caller="z"),
            arrive("t3", "r3", at=1.0, caller="y"),
            arrive("t4", "r4", at=2.0, caller="x"),
        ],
        finish("t2", at=3.0),
        [Place("t4", "a")],
        {"d1": "s", "d2": "s", "t1": "a", "t4": "a"},
        ["t3"],
        {
            "r1": ("generating", "a"),
            "r2": ("idle", "a"),
            "r3": ("idle", None),
            "r4": ("generating", "a"),
        },
    ),
    Case(
        "a resync adopts an in-flight turn on a single-pass replica and touches no run",
        GEN_AND_SP,
        [],
        Resynced("dp", 0.0, (), (inflight("x1", "q1", "s"),)),
        [AckResync("dp", 0, 1)],
        {"x1": "s"},
        [],
        {},
    ),
    Case(
        "an adopted single-pass turn counts against its replica's capacity",
        GEN_AND_SP,
        [Resynced("dp", 0.0, (), (inflight("x1", "q1", "s"),))],
        single("d1", at=1.0),
        [],
        {"x1": "s"},
        ["d1"],
        {},
    ),
    Case(
        "a resync saying a held single-pass turn already runs answers its Admit",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        Resynced("dp", 1.0, (), (inflight("d1", "", "s"), inflight("d2", "", "s"))),
        [Place("d2", "s"), AckResync("dp", 0, 2)],
        {"d1": "s", "d2": "s"},
        [],
        {},
    ),
    Case(
        "a resync no longer listing a single-pass turn frees its slot for a held one",
        GEN_AND_SP,
        [single("d1"), single("d2")],
        Resynced("dp", 1.0, (), (), frozenset({"d2"})),
        [Place("d2", "s"), AckResync("dp", 0, 0)],
        {"d2": "s"},
        [],
        {},
    ),
    Case(
        "a resync listing a generative turn on a single-pass replica moves it there as single-pass",
        GEN_AND_SP,
        [arrive("t1", "r1")],
        Resynced("dp", 1.0, (), (inflight("t1", "r1", "s"),)),
        [AckResync("dp", 0, 1)],
        {"t1": "s"},
        [],
        {"r1": ("idle", "a")},
    ),
    Case(
        "a lost dataplane's single-pass turns are released past the grace, for held ones",
        GEN_AND_SP,
        [single("d1"), single("d2", dataplane="dp2"), DataplaneLost("dp", 1.0)],
        Tick(61.0),
        [Place("d2", "s")],
        {"d2": "s"},
        [],
        {},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decide(case: Case) -> None:
    state = make_state(case.replicas)
    feed(state, case.before)
    state, actions = decide(state, case.event)
    assert actions == case.actions
    assert placements(state) == case.placed
    assert held_turns(state) == case.held
    assert runs(state) == case.runs
    for replica in state.replicas.values():
        assert replica.inflight == sum(1 for p in state.placed.values() if p.replica == replica.name)


def test_unknown_model_is_counted_as_rejected_only() -> None:
    state = make_state(TWO)
    feed(state, [arrive("t1", "r1", model="nope")])
    counters = snapshot(state, 0.0)["counters"]
    assert counters["rejected"] == 1
    assert counters["arrived"] == 0
    assert counters["admitted"] == 0


def test_tombstones_are_capped_oldest_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(abandoned, "MAX_TOMBSTONES", 3)
    state = make_state(TWO)
    feed(state, [reported(f"t{i}", at=float(i)) for i in range(1, 5)])
    assert list(state.tombstones) == ["t2", "t3", "t4"]
    assert feed(state, [arrive("t1", "r1", at=5.0)]) == [Place("t1", "a")]
    assert feed(state, [arrive("t2", "r2", at=5.0)]) == [refused("t2")]


def test_a_refused_abandoned_turn_is_counted_as_rejected_only() -> None:
    state = make_state(TWO)
    feed(state, [reported("t1", at=0.0), arrive("t1", "r1", at=1.0)])
    counters = snapshot(state, 1.0)["counters"]
    assert (counters["rejected"], counters["arrived"], counters["abandoned"]) == (1, 0, 0)


def test_started_and_first_token_are_recorded_without_actions() -> None:
    state = make_state(TWO)
    feed(state, [arrive("t1", "r1", at=0.0)])
    assert feed(state, [TurnStarted("t1", 0.1), FirstToken("t1", 0.3), TurnStarted("t1", 0.5)]) == []
    assert state.placed["t1"].started_at == 0.1
    assert state.placed["t1"].first_token_at == 0.3


def test_resync_reply_counts_runs_and_turns() -> None:
    state = make_state(TWO)
    event = Resynced(
        "dp",
        0.0,
        (run_record("q1", "a", "tool_paused"), run_record("q2", "", "idle")),
        (inflight("x1", "q3", "b"), inflight("x2", "q3", "b")),
    )
    assert feed(state, [event]) == [AckResync("dp", 2, 2)]
    assert runs(state) == {"q1": ("tool_paused", "a"), "q2": ("idle", None), "q3": ("generating", "b")}
    assert state.replicas["b"].inflight == 2


def test_snapshot_counts_replicas_held_turns_runs_and_counters() -> None:
    state = make_state(ONE_OF_ONE)
    feed(
        state,
        [
            arrive("t1", "r1", at=0.0),
            arrive("t2", "r2", at=1.0, cls="batch", caller="ci"),
            arrive("t3", "r3", at=2.0, caller="alice"),
            arrive("t4", "r4", at=3.0, caller="alice"),
            arrive("t5", "r5", model="nope", at=3.0),
            abandon("t4", at=3.5),
        ],
    )
    assert snapshot(state, 11.0) == {
        "replicas": [
            {
                "name": "a",
                "kind": "generative",
                "models": ["m"],
                "inflight": 1,
                "capacity": 1,
                "effective_capacity": 1,
                "batch_capacity": None,
                "reserved_headroom": 0,
                "leased": 0,
                "healthy": True,
                "draining": False,
                "removing": False,
                "breaker": "closed",
                "tripped": False,
                "failures_in_a_row": 0,
                "probed_s_ago": None,
                "running": None,
                "waiting": None,
                "kv_usage": None,
                "cache_hit_rate": None,
            }
        ],
        "held": {
            "count": 2,
            "by_kind": {"generative": 2, "single_pass": 0},
            "by_class": {"interactive": 1, "batch": 1},
            "by_caller": {"ci": 1, "alice": 1},
            "oldest_wait_s": 10.0,
            "oldest_wait_s_by_kind": {"generative": 10.0, "single_pass": 0.0},
            "oldest_wait_s_by_class": {"interactive": 9.0, "batch": 10.0},
            "oldest_wait_s_by_caller": {"ci": 10.0, "alice": 9.0},
        },
        "runs": {"idle": 3, "generating": 1, "tool_paused": 0},
        "runs_by_class": {"interactive": 3, "batch": 1},
        "runs_by_caller": {"": 1, "ci": 1, "alice": 2},
        "inflight_by_caller": {"": 1},
        "inflight_by_root": {"": 1},
        "counters": {
            "arrived": 4,
            "admitted": 1,
            "adopted": 0,
            "finished": 0,
            "failed": 0,
            "rejected": 1,
            "abandoned": 1,
            "abandoned_held": 1,
            "abandoned_placed": 0,
            "held_adopted": 0,
            "expired_turns": 0,
            "expired_runs": 0,
            "runs_ended": 0,
            "turns_released_resync": 0,
            "turns_released_lost_dataplane": 0,
            "leased": 0,
            "lease_crossings": 0,
            "leased_off_affinity": 0,
            "lease_revocations": 0,
            "limited_held": 0,
            "limited_token_rate": 0,
            "held_timed_out": 0,
            "breaker_trips": 0,
            "breaker_closes": 0,
            "replicas_added": 0,
            "replicas_retired": 0,
        },
        "leases": {},
        "lost_dataplanes": {},
        "startup_hold_s": 0.0,
        "limits": {
            "on": False,
            "breaker_failures": 0,
            "breaker_transitions": [],
            "refused": {"held": 0, "queue_timeout": 0, "token_rate": 0},
            "refused_by_class": {},
            "refused_by_caller": {},
            "token_buckets": {},
        },
    }
    feed(state, [finish("t1", at=12.0, tools=True)])
    after = snapshot(state, 12.0)
    # interactive first: alice's t3 took the slot, the batch turn t2 (arrived at 1.0) still waits
    assert after["held"]["count"] == 1 and after["held"]["oldest_wait_s"] == 11.0
    assert after["held"]["by_class"] == {"interactive": 0, "batch": 1}
    assert after["runs"] == {"idle": 2, "generating": 1, "tool_paused": 1}
    assert after["counters"]["finished"] == 1 and after["counters"]["admitted"] == 2


def test_snapshot_shows_single_pass_replicas_and_held_single_pass_turns() -> None:
    state = make_state([("a", ["m"], 1), ("s", ["m", "cls"], 1, "single_pass")])
    feed(
        state,
        [
            arrive("t1", "r1", at=0.0),
            arrive("t2", "r2", at=1.0, cls="batch"),
            single("d1", "r1", at=2.0, caller="ci"),
            single("d2", "r1", model="cls", at=3.0, caller="ci"),
            single("d3", at=4.0, cls="batch"),
        ],
    )
    status = snapshot(state, 10.0)
    kinds = {(r["name"], r["kind"], r["inflight"], r["capacity"]) for r in status["replicas"]}
    assert kinds == {("a", "generative", 1, 1), ("s", "single_pass", 1, 1)}
    assert status["held"] == {
        "count": 3,
        "by_kind": {"generative": 1, "single_pass": 2},
        "by_class": {"interactive": 1, "batch": 2},
        "by_caller": {"": 2, "ci": 1},
        "oldest_wait_s": 9.0,
        "oldest_wait_s_by_kind": {"generative": 9.0, "single_pass": 7.0},
        "oldest_wait_s_by_class": {"interactive": 7.0, "batch": 9.0},
        "oldest_wait_s_by_caller": {"": 9.0, "ci": 7.0},
    }
    # single-pass turns have no runs: only r1 (generating) and r2 (its turn held) are counted
    assert status["runs"] == {"idle": 1, "generating": 1, "tool_paused": 0}
    assert status["counters"]["arrived"] == 5 and status["counters"]["admitted"] == 2


def _runs_in_full(state: State) -> list[tuple[object, ...]]:
    """Every field of every run, in the order of ``state.runs`` (which is by last activity)."""
    return [
        (r.run_id, r.phase, r.last_replica, r.service_class, r.caller, r.last_activity,
         sorted(r.turns), r.latest_turn, r.reserved_on)
        for r in state.runs.values()
    ]  # fmt: skip


def test_single_pass_turns_never_change_any_run() -> None:
    """No field of any run moves, nor the runs' order, on any event about a single-pass turn."""
    state = make_state([("a", ["m"], 2), ("s", ["m"], 1, "single_pass")])
    state.pause_hold = PauseHold(mode="pause")  # r2's slot outlives the 600 s tick (no TTL here)
    feed(
        state,
        [
            single("d0", "r1", at=0.0),  # on s; expires first
            arrive("t1", "r1", at=1.0),
            arrive("t2", "r2", at=1.5),
            finish("t2", at=2.0, tools=True),  # r2 paused on a tool, keeping a slot on a
        ],
    )
    before = _runs_in_full(state)
    reserved = set(state.replicas["a"].reserved_for)
    steps: list[Event] = [
        single("d1", "r1", at=3.0, cls="batch", caller="x"),  # held: s is full
        single("d2", "r2", at=4.0, caller="x"),  # held
        single("d3", "r1", at=5.0),  # held
        abandon("d3", at=5.5),
        single("d6", "r3", at=5.7),  # held; r3 is unknown and stays so
        reported("d6", at=5.8),
        reported("d4", at=6.0),
        single("d4", "r1", at=6.5),  # refused: reported abandoned
        Tick(600.0),  # d0 expires; d2 (interactive) takes the slot
        finish("d2", at=600.5, tools=True),  # d1 takes the slot
        fail("d1", at=601.0),
        single("d5", "r2", at=602.0),  # placed
        abandon("d5", at=603.0),
        RunEnded("r3", 604.0),
    ]
    for step in steps:
        feed(state, [step])
        assert _runs_in_full(state) == before, step
        assert state.replicas["a"].reserved_for == reserved
    assert placements(state) == {"t1": "a"}
    assert state.single_pass_inflight == {} and state.caller_inflight == {"": 1}
    assert state.counters.expired_turns == 1


def test_a_held_generative_turn_adopted_on_a_single_pass_replica_leaves_its_run() -> None:
    state = make_state(GEN_AND_SP)
    feed(state, [arrive("t1", "r1"), arrive("t2", "r2", at=1.0)])
    event = Resynced("dp", 2.0, (), (inflight("t1", "r1", "a"), inflight("t2", "r2", "s")))
    assert feed(state, [event]) == [Place("t2", "s"), AckResync("dp", 0, 2)]
    assert state.placed["t2"].single_pass
    assert state.runs["r2"].turns == set()  # else r2 would hold a turn id forever, never expiring
    assert (state.caller_inflight, state.single_pass_inflight) == ({"": 1}, {"": 1})


def test_held_turns_are_placed_in_arrival_order_across_many_frees() -> None:
    state = make_state(TWO_OF_ONE)
    feed(state, [arrive(f"t{i}", f"r{i}", at=float(i)) for i in range(10)])
    order: list[str] = []
    for i in range(10):
        actions = feed(state, [finish(f"t{i}", at=20.0 + i)])
        order.extend(a.turn_id for a in actions if isinstance(a, Place))
    assert order == [f"t{i}" for i in range(2, 10)]


def test_many_abandons_behind_a_stuck_head_do_not_lose_live_turns() -> None:
    state = make_state(ONE_OF_ONE)
    feed(state, [arrive("t0", "r0")])
    feed(state, [arrive(f"t{i}", f"r{i}", at=float(i)) for i in range(1, 400)])
    feed(state, [abandon(f"t{i}", at=500.0) for i in range(1, 400) if i % 7])
    live = [f"t{i}" for i in range(1, 400) if i % 7 == 0]
    assert held_turns(state) == live
    placed: list[str] = []
    for turn in ["t0", *live]:
        actions = feed(state, [finish(turn, at=600.0)])
        placed.extend(a.turn_id for a in actions if isinstance(a, Place))
    assert placed == live


_CORE = ROOT / "luftpause" / "scheduler" / "core"


@pytest.mark.parametrize("module", sorted(_CORE.rglob("*.py")), ids=lambda p: p.name)
def test_core_imports_no_io_clock_or_randomness(module: Path) -> None:
    forbidden = {"asyncio", "grpc", "time", "random", "socket", "aiohttp", "os"}
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in forbidden, f"{module.name} imports {name}"


def test_a_caller_with_held_turns_is_placed_under_continuous_load_from_another() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [arrive(f"f{i}", f"fr{i}", at=0.0, cls="batch", caller="flood") for i in range(2)])
    feed(state, [arrive("lone", "lr", at=0.5, cls="batch", caller="lone")])
    flood = 2
    placed: list[str] = []
    for step in range(10):  # the flood keeps two turns waiting ahead in arrival order
        at = 1.0 + step
        feed(
            state,
            [arrive(f"f{flood + k}", f"fr{flood + k}", at=at, cls="batch", caller="flood") for k in (0, 1)],
        )
        flood += 2
        running = next(turn_id for turn_id in state.placed if turn_id.startswith("f"))
        placed.extend(a.turn_id for a in feed(state, [finish(running, at=at + 0.5)]) if isinstance(a, Place))
        if "lone" in placed:
            break
    assert placed[0] == "lone"  # the first freed slot: lone has no turn in flight, flood has one


def test_with_strict_affinity_off_a_tool_paused_run_takes_the_replica_with_room() -> None:
    # The ablation bench/flood.py measures: the same events as "a tool-paused run waits for its
    # full last replica although another has room", with [scheduler] strict_affinity = false.
    config = parse_config(
        "[scheduler]\nstrict_affinity = false\n"
        + "".join(
            f'[[replicas]]\nname = "{name}"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 1\n'
            for name in ("a", "b")
        ),
        "test.toml",
    )
    state = new_state(config)
    assert not state.strict_affinity
    feed(state, [arrive("t1", "r1"), finish("t1", tools=True), arrive("t2", "r2")])
    assert placements(state) == {"t2": "a"}
    assert feed(state, [arrive("t3", "r1", at=2.0)]) == [Place("t3", "b")]
    assert runs(state)["r1"] == ("generating", "b")
