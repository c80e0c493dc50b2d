"""Protection limits and the circuit breaker (rules 17 and 18 of ``decide``; ``policies/limits.py``,
``policies/breaker.py``): opt-in, off by default (issue 18)."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, fail, feed, finish, held_turns, make_state, placements, probe

from luftpause.config import ConfigError, parse_config
from luftpause.scheduler.core import BreakerChanged, Place, Reject, State, Tick, TurnFailed, decide, snapshot
from luftpause.scheduler.core.policies import limits
from luftpause.scheduler.core.policies.limits import Bucket, ClassLimits, Protection

# -- the policy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protection", "caller", "cls", "expected"),
    [
        (Protection(), "x", "interactive", ClassLimits()),
        (Protection({"batch": ClassLimits(max_held=3)}), "x", "batch", ClassLimits(max_held=3)),
        (Protection({"batch": ClassLimits(max_held=3)}), "x", "interactive", ClassLimits()),
        (  # a caller's key replaces the class's, the others stay
            Protection(
                {"batch": ClassLimits(max_held=3, queue_timeout_s=9.0)}, {"x": ClassLimits(max_held=1)}
            ),
            "x",
            "batch",
            ClassLimits(max_held=1, queue_timeout_s=9.0),
        ),
        (
            Protection({}, {"x": ClassLimits(tokens_per_s=5.0)}),
            "x",
            "interactive",
            ClassLimits(tokens_per_s=5.0),
        ),
        (Protection({}, {"x": ClassLimits(tokens_per_s=5.0)}), "y", "interactive", ClassLimits()),
    ],
)
def test_the_limits_of_a_caller_and_class(
    protection: Protection, caller: str, cls: str, expected: ClassLimits
) -> None:
    assert protection.of(caller, cls) == expected  # type: ignore[arg-type]


def test_protection_is_off_unless_a_limit_is_set() -> None:
    assert not Protection().on
    assert not Protection(breaker_failures=5).on  # the breaker apart
    assert Protection({"batch": ClassLimits(queue_timeout_s=1.0)}).on
    assert Protection({}, {"": ClassLimits(max_held=0)}).on
    assert (
        Protection(
            {"batch": ClassLimits(queue_timeout_s=9.0)}, {"x": ClassLimits(queue_timeout_s=2.0)}
        ).shortest_timeout_s
        == 2.0
    )


@pytest.mark.parametrize(
    ("level", "rate", "expected"),
    [(5.0, 10.0, None), (1.0, 10.0, None), (0.5, 10.0, 1.0), (-95.0, 10.0, 10.0), (-100.5, 10.0, 11.0)],
)
def test_the_retry_after_of_an_empty_bucket(level: float, rate: float, expected: float | None) -> None:
    assert limits.rate_retry_after(level, ClassLimits(tokens_per_s=rate)) == expected


def test_a_bucket_fills_at_its_rate_up_to_its_size() -> None:
    these = ClassLimits(tokens_per_s=10.0, burst_tokens=50.0)
    bucket = Bucket(-20.0, 0.0)
    assert limits.refill(bucket, these, 1.0) == -10.0
    assert limits.refill(bucket, these, 100.0) == 50.0
    assert limits.refill(bucket, these, 50.0) == 50.0  # a time before the last: nothing added
    assert ClassLimits(tokens_per_s=10.0).burst == 100.0  # 10 s of the rate by default


@pytest.mark.parametrize(
    "bad", [{"max_held": -1}, {"queue_timeout_s": 0.0}, {"tokens_per_s": -1.0}, {"burst_tokens": 0.0}]
)
def test_bad_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ClassLimits(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            "[scheduler.protection.batch]\nmax_held = -1",
            "scheduler.protection.batch.max_held: expected a number >= 0, got -1",
        ),
        (
            "[scheduler.protection.interactive]\nqueue_timeout_s = 0",
            "scheduler.protection.interactive.queue_timeout_s: expected a number > 0, got 0",
        ),
        (
            '[scheduler.protection.callers."ci"]\ntokens_per_s = "fast"',
            "scheduler.protection.callers.ci.tokens_per_s: expected a number, got 'fast'",
        ),
        (
            "[scheduler.protection]\nbreaker_failures = -2",
            "scheduler.protection.breaker_failures: expected a number >= 0, got -2",
        ),
        (
            "[scheduler.protection.batch]\nmax_waiting = 3",
            "scheduler.protection.batch.max_waiting: unknown key",
        ),
        ("[scheduler.protection.bulk]\nmax_held = 3", "scheduler.protection.bulk: unknown key"),
    ],
)
def test_bad_values_are_refused_at_start_naming_the_key(table: str, message: str) -> None:
    replicas = '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
    with pytest.raises(ConfigError) as refused:
        parse_config(f"{table}\n{replicas}", "luftpause.toml")
    assert str(refused.value) == f"luftpause.toml: {message}"


def test_the_configuration_gives_the_core_its_protection() -> None:
    config = parse_config(
        """
[scheduler.protection]
breaker_failures = 5
[scheduler.protection.batch]
max_held = 100
queue_timeout_s = 60
[scheduler.protection.callers."ci-bot"]
max_held = 4
tokens_per_s = 2000
burst_tokens = 10000
[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
models = ["m"]
""",
        "luftpause.toml",
    )
    protection = config.scheduler.protection.policy()
    assert protection.breaker_failures == 5 and protection.on
    assert protection.of("ci-bot", "batch") == ClassLimits(4, 60.0, 2000.0, 10000.0)
    assert protection.of("ci-bot", "interactive") == ClassLimits(4, None, 2000.0, 10000.0)
    assert protection.of("alice", "batch") == ClassLimits(100, 60.0)
    default = parse_config('[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n')
    assert default.scheduler.protection.policy() == Protection(
        {"interactive": ClassLimits(), "batch": ClassLimits()}, {}, 0
    )


# -- in decide --------------------------------------------------------------------------------------


def limited(protection: Protection, caps: tuple[int, ...] = (1,)) -> State:
    state = make_state([(name, ["m"], cap) for name, cap in zip("abc", caps, strict=False)])
    state.protection = protection
    return state


def test_a_turn_over_its_callers_held_limit_is_refused_with_429_and_nothing_recorded() -> None:
    state = limited(Protection({"interactive": ClassLimits(max_held=2)}))
    feed(
        state,
        [arrive("t1", "r1", caller="x"), arrive("t2", "r2", caller="x"), arrive("t3", "r3", caller="x")],
    )
    assert held_turns(state) == ["t2", "t3"]
    actions = feed(state, [arrive("t4", "r4", at=1.0, caller="x")])
    reason = "caller 'x' has 2 interactive turns held, its limit (max_held = 2)"
    assert actions == [Reject("t4", reason, 429, 1.0)]
    assert "r4" not in state.runs and held_turns(state) == ["t2", "t3"]
    # another caller, another class: their own counts
    assert (
        feed(
            state,
            [arrive("t5", "r5", at=1.0, caller="y"), arrive("t6", "r6", at=1.0, caller="x", cls="batch")],
        )
        == []
    )
    assert held_turns(state) == ["t2", "t3", "t5", "t6"]
    status = snapshot(state, 1.0)
    assert status["counters"]["limited_held"] == 1 and status["counters"]["rejected"] == 1
    assert status["limits"]["refused_by_caller"] == {"x": 1}
    assert status["limits"]["refused_by_class"] == {"interactive": {"held": 1}}
    arrived, ends = state.balance()
    assert arrived[0] == arrived[1] and ends[0] == ends[1]


def test_a_turn_placed_at_once_is_never_refused_by_the_held_limit() -> None:
    state = limited(Protection({"interactive": ClassLimits(max_held=0)}), caps=(2,))
    assert feed(state, [arrive("t1", "r1"), arrive("t2", "r2")]) == [Place("t1", "a"), Place("t2", "a")]
    assert feed(state, [arrive("t3", "r3")]) == [
        Reject("t3", "the anonymous caller has 0 interactive turns held, its limit (max_held = 0)", 429, 1.0)
    ]


def test_the_held_limit_judges_a_pinned_run_by_its_own_replica() -> None:
    # r1 generates on a (full); b has room but r1 may not go there: its turn would be held
    state = limited(Protection({"interactive": ClassLimits(max_held=0)}), caps=(1, 1))
    feed(state, [arrive("t1", "r1")])
    (action,) = feed(state, [arrive("t2", "r1", at=0.5)])
    assert isinstance(action, Reject) and action.http_status == 429
    assert feed(state, [arrive("t3", "r3", at=0.6)]) == [Place("t3", "b")]


def test_a_held_turn_past_its_queue_timeout_is_refused_on_the_next_tick() -> None:
    state = limited(
        Protection(
            {"interactive": ClassLimits(queue_timeout_s=30.0)}, {"slow": ClassLimits(queue_timeout_s=90.0)}
        )
    )
    feed(
        state,
        [
            arrive("t1", "r1"),
            arrive("t2", "r2", at=1.0),
            arrive("t3", "r3", at=2.0, caller="slow"),
            arrive("t4", "r4", at=5.0),
        ],
    )
    assert feed(state, [Tick(30.9)]) == []
    actions = feed(state, [Tick(31.0)])
    assert actions == [Reject("t2", "turn held 30 s, past its queue timeout (30 s)", 429, 1.0)]
    assert held_turns(state) == ["t3", "t4"] and "t2" not in state.runs["r2"].turns
    assert [a.turn_id for a in feed(state, [Tick(40.0)])] == ["t4"]  # type: ignore[union-attr]
    assert feed(state, [Tick(92.0)]) == [
        Reject("t3", "turn held 90 s, past its queue timeout (90 s)", 429, 1.0)
    ]
    status = snapshot(state, 92.0)
    assert status["counters"]["held_timed_out"] == 3 and status["limits"]["refused"]["queue_timeout"] == 3
    arrived, ends = state.balance()
    assert arrived[0] == arrived[1] and ends[0] == ends[1]


def test_a_caller_over_its_token_rate_is_refused_until_its_bucket_refills() -> None:
    state = limited(Protection({}, {"x": ClassLimits(tokens_per_s=10.0, burst_tokens=20.0)}), caps=(4,))
    feed(state, [arrive("t1", "r1", caller="x"), finish("t1", at=1.0)])  # 15 tokens: 5 left
    assert feed(state, [arrive("t2", "r2", at=1.0, caller="x")]) == [Place("t2", "a")]
    feed(state, [finish("t2", at=1.0)])  # 15 more: -10
    reason = "caller 'x' used up its interactive token rate (10 tokens/s)"
    assert feed(state, [arrive("t3", "r3", at=1.0, caller="x")]) == [Reject("t3", reason, 429, 2.0)]
    assert feed(state, [arrive("t4", "r4", at=1.0, caller="y")]) == [Place("t4", "a")]  # no rate of its own
    assert feed(state, [arrive("t5", "r5", at=2.0, caller="x")]) == [Reject("t5", reason, 429, 1.0)]
    assert feed(state, [arrive("t6", "r6", at=2.1, caller="x")]) == [Place("t6", "a")]
    assert snapshot(state, 2.1)["limits"]["token_buckets"] == {"x": {"interactive": 1.0}}
    assert state.counters.limited_token_rate == 2
    feed(state, [Tick(10.0)])  # full again: forgotten
    assert state.buckets == {}


def test_no_limit_set_keeps_todays_behaviour() -> None:
    state = limited(Protection(), caps=(1,))
    feed(state, [arrive(f"t{i}", f"r{i}", at=float(i)) for i in range(50)])
    assert feed(state, [Tick(599.0)]) == [] and len(held_turns(state)) == 49  # no timeout


# -- the circuit breaker ------------------------------------------------------------------------------


def test_a_replica_failing_turns_in_a_row_leaves_rotation_until_its_trial_turn_finishes() -> None:
    state = limited(Protection(breaker_failures=2), caps=(1, 1))
    feed(state, [arrive("t1", "r1"), arrive("t2", "r2"), fail("t1", at=1.0)])
    assert state.replicas["a"].failures == 1 and not state.replicas["a"].tripped
    feed(state, [arrive("t3", "r3", at=1.1)])
    assert placements(state) == {"t2": "b", "t3": "a"}
    feed(state, [arrive("t4", "r4", at=1.2)])  # held: both full
    actions = feed(state, [fail("t3", at=2.0)])  # the second in a row: a is out before its slot is given
    why = "2 failed turns within 60 s: engine a: connection refused"
    opened = BreakerChanged("a", "closed", "open", why)
    assert actions == [opened] and state.replicas["a"].tripped and held_turns(state) == ["t4"]
    assert snapshot(state, 2.0)["replicas"][0]["tripped"] is True
    assert state.counters.breaker_trips == 1
    assert feed(state, [probe("a", at=2.5, healthy=False)]) == []  # still out
    # a healthy probe makes it half-open, said before the held turn goes there as its trial turn
    half = BreakerChanged("a", "open", "half_open", "a healthy probe")
    assert feed(state, [probe("a", at=3.0)]) == [half, Place("t4", "a")]
    assert state.replicas["a"].breaker == "half_open" and state.counters.breaker_closes == 0
    closed = BreakerChanged("a", "half_open", "closed", "1 trial turns finished")
    assert feed(state, [finish("t4", at=3.5)]) == [closed]
    assert state.replicas["a"].failures == 0 and state.counters.breaker_closes == 1


def test_a_finished_turn_or_a_client_leaving_breaks_no_run_of_failures() -> None:
    state = limited(Protection(breaker_failures=2), caps=(3,))
    feed(state, [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3")])
    feed(state, [fail("t1"), finish("t2", at=1.1)])
    assert state.replicas["a"].failures == 0
    feed(state, [TurnFailed("t3", 1.2, "client disconnected", engine_fault=False)])
    assert state.replicas["a"].failures == 0 and not state.replicas["a"].tripped


def test_a_tripped_replica_gives_up_the_runs_pinned_there() -> None:
    state = limited(Protection(breaker_failures=1), caps=(1, 1))
    # r1 overlaps itself on a: t3 pinned there; a trips on t1's failure... t3 goes to b
    feed(state, [arrive("t1", "r1"), arrive("t2", "r1", at=0.5), arrive("t3", "r3", at=0.6)])
    assert placements(state) == {"t1": "a", "t3": "b"} and held_turns(state) == ["t2"]
    feed(state, [finish("t3", at=0.7)])
    assert placements(state) == {"t1": "a"} and held_turns(state) == ["t2"]  # pinned to a
    _, actions = decide(state, fail("t1", at=1.0))
    assert [a for a in actions if not isinstance(a, BreakerChanged)] == [Place("t2", "b")]


def test_the_breaker_is_off_by_default() -> None:
    state = limited(Protection(), caps=(1,))
    for i in range(20):
        feed(state, [arrive(f"t{i}", f"r{i}", at=float(i)), fail(f"t{i}", at=i + 0.5)])
    assert not state.replicas["a"].tripped


def test_an_unreachable_engine_opens_its_breaker_at_once_even_with_the_breaker_off() -> None:
    # docs/failover.md: the dataplane says the engine was never reached; the next probe may be 2 s
    # away, and the turn it admits again must not go back there
    state = limited(Protection(), caps=(1, 1))
    feed(state, [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3", at=0.5)])
    assert placements(state) == {"t1": "a", "t2": "b"} and held_turns(state) == ["t3"]
    gone = TurnFailed("t1", 1.0, "engine a: cannot connect: Connection refused", unreachable=True)
    actions = feed(state, [gone])
    assert actions == [BreakerChanged("a", "closed", "open", "engine unreachable: " + gone.error)]
    assert state.replicas["a"].tripped and held_turns(state) == ["t3"]  # not given a's slot
    assert state.counters.breaker_trips == 1
    # admitted again: it goes to b once b has room, never to a while a is out
    feed(state, [arrive("t1b", "r1", at=1.1, failover_from="a")])
    feed(state, [finish("t2", at=1.2)])
    assert "a" not in placements(state).values()
    assert feed(state, [probe("a", at=2.0)])[0] == BreakerChanged("a", "open", "half_open", "a healthy probe")
    assert not state.replicas["a"].tripped and state.replicas["a"].breaker == "half_open"


def test_a_turn_admitted_again_with_no_usable_replica_left_is_refused_at_once_not_held() -> None:
    state = limited(Protection(), caps=(1,))
    feed(state, [arrive("t1", "r1")])
    feed(state, [TurnFailed("t1", 1.0, "engine a: reset", unreachable=True)])
    actions = feed(state, [arrive("t1b", "r1", at=1.1, failover_from="a")])
    reason = "replica a failed the turn before answering, and no other healthy replica serves model 'm'"
    assert actions == [Reject("t1b", reason, 502)] and held_turns(state) == []
    # a turn that is not a failover is held for the replica, as ever
    assert feed(state, [arrive("t2", "r2", at=1.2)]) == [] and held_turns(state) == ["t2"]


def test_a_turn_admitted_again_goes_to_another_replica_even_when_its_own_stays_in_rotation() -> None:
    # an engine status [dataplane.failover] retries: a is still healthy, but the turn must not go
    # back to it (nor wait for it as the idle run's last replica)
    state = limited(Protection(), caps=(1, 1))
    assert feed(state, [arrive("t1", "r1")]) == [Place("t1", "a")]
    feed(state, [TurnFailed("t1", 1.0, "engine answered 503")])
    assert not state.replicas["a"].tripped
    assert feed(state, [arrive("t1b", "r1", at=1.1, failover_from="a")]) == [Place("t1b", "b")]
