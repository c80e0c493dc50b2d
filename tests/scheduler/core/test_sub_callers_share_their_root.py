"""The caller tree (``policies/caller_tree.py``, issue 17): a caller's sub-callers (``team-a/job-7``
under ``team-a``) share their root's part of the pool, and its limits.

Fairness: held turns go to the root caller with the fewest turns in flight first, then within it to
the sub-caller with the fewest, so a root spread over ten sub-callers and a root with one caller
take turns, not ten to one. Limits: a caller's are those of the most specific configured name of
its lineage (else the class defaults), counted for that name over everything under it, so
narrowing never escapes them; a configured sub-caller holds limits of its own.
"""

from __future__ import annotations

import pytest
from decide_helpers import arrive, feed, finish, held_turns, make_state, single

from luftpause.config import parse_config
from luftpause.scheduler.core import Place, Reject, State, Tick, new_state, snapshot
from luftpause.scheduler.core.policies import caller_tree
from luftpause.scheduler.core.policies.limits import ClassLimits, Protection

# -- the tree ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "root", "lineage"),
    [
        ("team-a", "team-a", ["team-a"]),
        ("team-a/job-7", "team-a", ["team-a/job-7", "team-a"]),
        ("a/b/c", "a", ["a/b/c", "a/b", "a"]),
        ("", "", [""]),  # the anonymous caller
        ("/x", "", ["/x", ""]),  # below the anonymous caller
        ("team-a/", "team-a", ["team-a/", "team-a"]),
    ],
)
def test_a_callers_root_and_lineage(caller: str, root: str, lineage: list[str]) -> None:
    assert caller_tree.root(caller) == root
    assert caller_tree.lineage(caller) == lineage


# -- fairness ----------------------------------------------------------------------------------------


def _roots_placed(actions: list[object]) -> list[str]:
    return [a.turn_id.split(":")[0] for a in actions if isinstance(a, Place)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("single_pass", [False, True], ids=["generative", "single-pass"])
def test_a_root_with_ten_sub_callers_and_a_root_with_one_take_turns(single_pass: bool) -> None:
    """Root ``a`` holds 30 turns spread over ten sub-callers, which arrived first; root ``b`` holds
    30 of one caller. As slots free, one at a time, they are placed a, b, a, b, ...: ranked by
    caller alone, every free slot went to one of ``a``'s sub-callers with none in flight (ten
    callers at 0 against one at 1 or more) and ``b`` waited for all 30."""
    kind = "single_pass" if single_pass else "generative"
    state = make_state([("r", ["m"], 4, kind)])
    new = single if single_pass else arrive
    fill = [new(f"z:{i}", f"z{i}", caller="z") for i in range(4)]
    assert _roots_placed(feed(state, fill)) == ["z"] * 4  # type: ignore[arg-type]
    backlog = [new(f"a:{i}", f"ra{i}", at=1.0, caller=f"a/job-{i % 10}") for i in range(30)]
    backlog += [new(f"b:{i}", f"rb{i}", at=1.0, caller="b") for i in range(30)]
    assert feed(state, backlog) == []  # type: ignore[arg-type]
    order: list[str] = []
    at = 2.0
    for _ in range(24):  # the oldest placed turn finishes; its slot goes to the first held turn
        at += 1.0
        order += _roots_placed(feed(state, [finish(next(iter(state.placed)), at=at)]))
    assert order == ["a", "b"] * 12
    roots = state.single_pass_root_inflight if single_pass else state.root_inflight
    assert roots == {"a": 2, "b": 2}
    if not single_pass:
        assert snapshot(state, at)["inflight_by_root"] == {"a": 2, "b": 2}


def test_within_a_root_its_sub_callers_take_turns_too() -> None:
    """Under root ``a``, ``a/busy`` arrived first with many turns and ``a/late`` after with one: once
    ``a/busy`` has a turn in flight, ``a/late``'s goes before its next (the root's count is theirs
    alike; the sub-caller's own decides)."""
    state = make_state([("r", ["m"], 2)])
    feed(state, [arrive("z:0", "z0", caller="z"), arrive("z:1", "z1", caller="z")])
    feed(state, [arrive(f"busy:{i}", f"rb{i}", at=1.0, caller="a/busy") for i in range(3)])
    feed(state, [arrive("late:0", "rl", at=2.0, caller="a/late")])
    placed = []
    for at in (3.0, 4.0, 5.0):
        placed += [
            a.turn_id for a in feed(state, [finish(next(iter(state.placed)), at=at)]) if isinstance(a, Place)
        ]
    assert placed == ["busy:0", "late:0", "busy:1"]


def test_a_sub_callers_turns_in_flight_on_one_pool_do_not_push_back_its_root_on_the_other() -> None:
    """The pools count apart, roots too: ``a/x`` busy on the single-pass replica leaves root ``a``
    at 0 for generative turns, so its turn (which arrived first) goes first there."""
    state = make_state([("g", ["m"], 1), ("s", ["m"], 2, "single_pass")])
    feed(state, [single("d1", caller="a/x"), single("d2", at=0.1, caller="a/x")])
    feed(state, [arrive("z", "rz", caller="z")])
    feed(state, [arrive("a1", "ra", at=1.0, caller="a/y"), arrive("b1", "rb", at=2.0, caller="b")])
    assert state.single_pass_root_inflight == {"a": 2} and state.root_inflight == {"z": 1}
    assert feed(state, [finish("z", at=3.0)]) == [Place("a1", "g")]


# -- limits ------------------------------------------------------------------------------------------

LIMITS = Protection(
    {"interactive": ClassLimits(max_held=3, queue_timeout_s=60.0), "batch": ClassLimits(max_held=1)},
    {
        "y": ClassLimits(max_held=2, tokens_per_s=10.0, burst_tokens=20.0),
        "y/j1": ClassLimits(max_held=4),
        "y/j1/k": ClassLimits(max_held=1),
        "q/r/s": ClassLimits(queue_timeout_s=5.0),
    },
)


@pytest.mark.parametrize(
    ("caller", "cls", "holder", "limits"),
    [
        ("y", "interactive", "y", ClassLimits(2, 60.0, 10.0, 20.0)),
        ("y/j2", "interactive", "y", ClassLimits(2, 60.0, 10.0, 20.0)),  # y's, for y/j2
        ("y/j2/deep", "batch", "y", ClassLimits(2, None, 10.0, 20.0)),
        ("y/j1", "interactive", "y/j1", ClassLimits(4, 60.0)),  # its own, replacing y's...
        ("y/j1/other", "interactive", "y/j1", ClassLimits(4, 60.0)),  # ...for everything below it
        ("y/j1/k/deeper", "batch", "y/j1/k", ClassLimits(1)),
        ("x", "interactive", "x", ClassLimits(3, 60.0)),  # not configured: the class defaults
        ("x/j1", "interactive", "x", ClassLimits(3, 60.0)),  # ...counted for its root
        ("q/r", "interactive", "q", ClassLimits(3, 60.0)),  # q/r/s is below it, not above
        ("q/r/s/t", "interactive", "q/r/s", ClassLimits(3, 5.0)),
        ("yy/j1", "interactive", "yy", ClassLimits(3, 60.0)),  # a longer name is not below y
        ("", "interactive", "", ClassLimits(3, 60.0)),
    ],
)
def test_a_callers_limits_are_the_most_specific_configured_names(
    caller: str, cls: str, holder: str, limits: ClassLimits
) -> None:
    assert LIMITS.holder(caller) == holder
    assert LIMITS.of(caller, cls) == limits  # type: ignore[arg-type]


def test_the_configured_names_below_a_holder_that_hold_their_own() -> None:
    assert LIMITS.carved("y") == ("y/j1",)  # y/j1/k is below y/j1, carved from it
    assert LIMITS.carved("y/j1") == ("y/j1/k",)
    assert LIMITS.carved("q") == ("q/r/s",)  # from an unconfigured root
    assert LIMITS.carved("x") == ()


def _limited(table: str) -> State:
    return new_state(
        parse_config(
            f"""
[scheduler]
resync_hold_s = 0
{table}
[[replicas]]
name = "r"
url = "http://127.0.0.1:1"
models = ["m"]
max_inflight = 1
""",
            "luftpause.toml",
        )
    )


def test_the_held_limit_of_a_configured_root_holds_for_its_sub_callers_together() -> None:
    state = _limited("[scheduler.protection.callers.y]\nmax_held = 2\n")
    feed(state, [arrive("z", "rz", caller="z")])  # the one slot is taken: what comes now is held
    assert feed(state, [arrive("t1", "r1", caller="y/j1"), arrive("t2", "r2", caller="y/j2")]) == []
    assert feed(state, [arrive("t3", "r3", at=1.0, caller="y/j3")]) == [
        Reject(
            "t3", "caller 'y' (for 'y/j3') has 2 interactive turns held, its limit (max_held = 2)", 429, 1.0
        )
    ]
    assert feed(state, [arrive("t4", "r4", at=1.0, caller="y")]) == [
        Reject("t4", "caller 'y' has 2 interactive turns held, its limit (max_held = 2)", 429, 1.0)
    ]
    assert feed(state, [arrive("t5", "r5", at=1.0, caller="x/j1")]) == []  # another root: its own
    assert held_turns(state) == ["t1", "t2", "t5"]
    assert snapshot(state, 1.0)["limits"]["refused_by_caller"] == {"y/j3": 1, "y": 1}


def test_an_unconfigured_roots_sub_callers_share_the_class_defaults() -> None:
    state = _limited("[scheduler.protection.batch]\nmax_held = 1\n")
    feed(state, [arrive("z", "rz", caller="z")])
    assert feed(state, [arrive("t1", "r1", cls="batch", caller="team-a/job-1")]) == []
    assert feed(state, [arrive("t2", "r2", at=1.0, cls="batch", caller="team-a/job-2")]) == [
        Reject(
            "t2",
            "caller 'team-a' (for 'team-a/job-2') has 1 batch turns held, its limit (max_held = 1)",
            429,
            1.0,
        )
    ]
    assert feed(state, [arrive("t3", "r3", at=1.0, cls="batch", caller="/job-3")]) == []  # root ""
    assert feed(state, [arrive("t4", "r4", at=1.0, cls="batch", caller="/job-4")]) == [
        Reject(
            "t4",
            "the anonymous caller (for '/job-4') has 1 batch turns held, its limit (max_held = 1)",
            429,
            1.0,
        )
    ]


def test_a_configured_sub_caller_holds_its_own_limit_and_leaves_its_roots_alone() -> None:
    state = _limited(
        "[scheduler.protection.callers.y]\nmax_held = 1\n"
        '[scheduler.protection.callers."y/j1"]\nmax_held = 3\n'
    )
    feed(state, [arrive("z", "rz", caller="z")])
    assert feed(state, [arrive(f"j1:{i}", f"r1{i}", caller="y/j1") for i in range(2)]) == []
    assert feed(state, [arrive("deep", "rd", caller="y/j1/deep")]) == []  # y/j1's third
    assert feed(state, [arrive("j1:2", "r12", at=1.0, caller="y/j1")]) == [
        Reject("j1:2", "caller 'y/j1' has 3 interactive turns held, its limit (max_held = 3)", 429, 1.0)
    ]
    # y/j1's three do not count for y: y/j2 may still have y's one held
    assert feed(state, [arrive("j2:0", "r20", at=1.0, caller="y/j2")]) == []
    assert feed(state, [arrive("j3:0", "r30", at=1.0, caller="y/j3")]) == [
        Reject(
            "j3:0", "caller 'y' (for 'y/j3') has 1 interactive turns held, its limit (max_held = 1)", 429, 1.0
        )
    ]
    assert held_turns(state) == ["j1:0", "j1:1", "deep", "j2:0"]


def test_a_roots_token_bucket_is_drained_by_all_its_sub_callers() -> None:
    state = _limited("[scheduler.protection.callers.y]\ntokens_per_s = 10\nburst_tokens = 20\n")
    feed(state, [arrive("t1", "r1", caller="y/j1"), finish("t1", at=1.0)])  # 15 tokens: 5 left
    feed(state, [arrive("t2", "r2", at=1.0, caller="y/j2"), finish("t2", at=1.0)])  # 15 more: -10
    reason = "caller 'y' (for 'y/j3') used up its interactive token rate (10 tokens/s)"
    assert feed(state, [arrive("t3", "r3", at=1.0, caller="y/j3")]) == [Reject("t3", reason, 429, 2.0)]
    assert feed(state, [arrive("t4", "r4", at=1.0, caller="x/j1")]) == [Place("t4", "r")]  # no rate
    assert snapshot(state, 1.0)["limits"]["token_buckets"] == {"y": {"interactive": -10.0}}
    feed(state, [Tick(10.0)])  # full again: forgotten
    assert state.buckets == {}


def test_a_roots_queue_timeout_holds_for_its_sub_callers() -> None:
    state = _limited("[scheduler.protection.callers.y]\nqueue_timeout_s = 5\n")
    feed(state, [arrive("z", "rz", caller="z"), arrive("t1", "r1", caller="y/j1"), arrive("t2", "r2")])
    assert feed(state, [Tick(5.0)]) == [Reject("t1", "turn held 5 s, past its queue timeout (5 s)", 429, 1.0)]
    assert held_turns(state) == ["t2"]
