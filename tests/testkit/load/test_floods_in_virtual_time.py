"""Floods in virtual time (``luftpause.testkit.sim``): the clock, the router and gateway models, and
small flood shapes through every arrangement, deterministic for a seed, no process, no socket."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.testkit.engine.prefix_cache import PrefixPath
from luftpause.testkit.sim.clock import Timer, VirtualClock
from luftpause.testkit.sim.flood import ARRANGEMENTS, FloodSpec, by_class, simulate
from luftpause.testkit.sim.router import CacheAwareRouter
from luftpause.testkit.sim.workload import published_shape

PROFILE = "sglang-llama-3.2-1b-fp8-8gb"


def _without_wall(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "wallSeconds"}


def test_the_clock_runs_callbacks_in_time_then_schedule_order() -> None:
    clock = VirtualClock()
    seen: list[tuple[float, str]] = []
    clock.call_at(2.0, lambda: seen.append((clock.now, "b")))
    clock.call_at(1.0, lambda: seen.append((clock.now, "a")))
    clock.call_at(2.0, lambda: seen.append((clock.now, "c")))
    clock.every(1.5, lambda: seen.append((clock.now, "tick")))
    clock.run_until(3.5)
    assert seen == [(1.0, "a"), (1.5, "tick"), (2.0, "b"), (2.0, "c"), (3.0, "tick")]
    assert clock.now == 3.5


def test_a_moved_timer_fires_once_at_its_last_time() -> None:
    clock = VirtualClock()
    fired: list[float] = []
    timer = Timer(clock, lambda: fired.append(clock.now))
    timer.set(5.0)
    timer.set(2.0)
    timer.set(3.0)
    clock.run_until(10.0)
    timer.set(12.0)
    timer.cancel()
    clock.run_until(20.0)
    assert fired == [3.0]


def _path(*nodes: tuple[str, int]) -> PrefixPath:
    return PrefixPath(tuple((key.encode(), tokens) for key, tokens in nodes))


def test_the_router_follows_a_prefix_match_above_30_percent_else_the_smallest_tree() -> None:
    router = CacheAwareRouter(2)
    first = router.route(_path(("run-a", 1000)))  # empty tree: the smallest, worker 0
    second = router.route(_path(("run-b", 100)))  # no match: the smallest tree, worker 1
    assert (first, second) == (0, 1)
    # run a's next turn: 1000 of 1100 tokens match (91 %): back to worker 0 although it is busier
    assert router.route(_path(("run-a", 1000), ("reply-a", 100))) == 0
    # a prompt that matches 100 of 400 tokens (25 %) goes to the smallest tree instead
    assert router.route(_path(("run-b", 100), ("long", 300))) == 1
    assert router.load == [2, 2]


def test_the_router_picks_the_least_loaded_worker_when_load_is_imbalanced() -> None:
    router = CacheAwareRouter(2)
    for n in range(65):
        assert router.route(_path(("run-a", 1000), (f"turn-{n}", 10))) == 0  # all follow run a
    # 65 - 0 > 64 and 65 > 1.5 x 0: imbalanced, so even run a's prompt goes to worker 1
    assert router.route(_path(("run-a", 1000), ("turn-x", 10))) == 1
    router.done(0)


def _small_flood(**changes: Any) -> Any:
    """The published flood's agents (48 batch, 4 interactive) for one simulated minute."""
    return published_shape(duration_s=60.0, **changes)


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_a_flood_is_the_same_for_the_same_seed(arrangement: str) -> None:
    spec = FloodSpec(_small_flood(), PROFILE, slots=4, seed=3)
    first, second = simulate(spec, arrangement), simulate(spec, arrangement)
    assert _without_wall(first) == _without_wall(second)
    assert first["simulated"] is True
    assert sum(row["completed"] for row in first["groups"]) > 0


def test_under_light_load_every_arrangement_performs_alike() -> None:
    """The control: the interactive agents alone, the engines never queue."""
    shape = published_shape(interactive=4, batch=0, duration_s=120.0)
    figures = {a: simulate(FloodSpec(shape, PROFILE, slots=8), a) for a in ARRANGEMENTS}
    router = by_class(figures["router"], "interactive", "runsPerMinute")
    assert router is not None and router > 0
    for arrangement in ("smg", "luftpause", "direct"):
        runs = by_class(figures[arrangement], "interactive", "runsPerMinute")
        assert runs is not None and abs(runs / router - 1) <= 0.05, (arrangement, runs, router)


@pytest.mark.parametrize("slots", [4, 8])
def test_under_a_flood_luftpause_is_ahead_of_the_router_on_interactive(slots: int) -> None:
    spec = FloodSpec(_small_flood(), PROFILE, slots=slots)
    router, luftpause = simulate(spec, "router"), simulate(spec, "luftpause")

    def ratio(service_class: str) -> float:
        ours = by_class(luftpause, service_class, "runsPerMinute") or 0.0
        return ours / (by_class(router, service_class, "runsPerMinute") or 1.0)

    interactive, batch = ratio("interactive"), ratio("batch")
    assert interactive >= 2.0, f"interactive {interactive:.2f}x the router's"
    assert batch >= 0.9, f"batch {batch:.2f}x the router's"


def test_runs_that_may_move_do_move_and_strict_ones_do_not() -> None:
    spec = FloodSpec(_small_flood(), PROFILE, slots=4)
    moving, strict = simulate(spec, "luftpause-moving"), simulate(spec, "luftpause")
    assert sum(row["movedRuns"] for row in moving["groups"]) > 0
    assert sum(row["movedRuns"] for row in strict["groups"]) == 0


def test_cut_off_sessions_give_their_headroom_back_in_the_simulation() -> None:
    """Every third run of each agent is cut off in its first tool call (never ended): with the pause
    hold the interactive runs still complete at the pace they do with no cut-offs at all."""
    cut = simulate(FloodSpec(_small_flood(cutoff_every=3), PROFILE, slots=4), "luftpause")
    rows = {row["class"]: row for row in cut["groups"]}
    assert rows["interactive"]["cutOff"] > 0 and rows["interactive"]["completed"] > 0


def test_the_gateway_reserves_slots_for_interactive_and_queues_bulk() -> None:
    spec = FloodSpec(_small_flood(), PROFILE, slots=4)
    report = simulate(spec, "smg")
    assert report["arrangementCounters"]["capacity"] == 8  # 2 engines x 4 running slots
    router = simulate(spec, "router")
    assert (by_class(report, "interactive", "runsPerMinute") or 0) > (
        by_class(router, "interactive", "runsPerMinute") or 0
    )
