"""The engine model's waiting-queue orders (``schedule_policy``: SGLang's ``lpm`` with its fallback
and in-batch rule, Continuum's program-level FCFS; ``priority_order``), table-driven, and the
holds that pin a finished request's prefix (Continuum's TTL pins). One running slot, so the queue
order is the order of admission."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from engine_model_helpers import node_after, of_kind, path, run_until_idle, small, then

from luftpause.testkit.engine.model import (
    EngineModel,
    EngineRequest,
    PrefixPath,
    RequestAdmitted,
)


@dataclass(frozen=True)
class Waiting:
    """A request submitted while the one running slot is busy."""

    name: str
    prompt: PrefixPath
    priority: int = 0
    program_arrival: float | None = None


CACHED = path("cached", 500)
CONTINUES = then(then(CACHED, "reply", 1), "tool", 20)


@dataclass(frozen=True)
class Case:
    policy: str
    waiting: list[Waiting]
    first: list[str]
    """The names admitted first, in order."""
    priority_order: str = "fcfs"
    slots: int = 1


def _uncached(n: int) -> list[Waiting]:
    return [Waiting(f"u{i}", path(f"u{i}", 40)) for i in range(n)]


CASES = {
    "fcfs keeps arrival order": Case(
        "fcfs", [Waiting("new", path("new", 500)), Waiting("cont", CONTINUES)], ["new", "cont"]
    ),
    "lpm takes the longest cached prefix first": Case(
        "lpm", [Waiting("new", path("new", 500)), Waiting("cont", CONTINUES)], ["cont", "new"]
    ),
    "lpm keeps queue order on a tie": Case(
        "lpm", [Waiting("b", path("b", 300)), Waiting("a", path("a", 300))], ["b", "a"]
    ),
    "lpm defers an uncached request sharing its head with an earlier one": Case(
        "lpm",
        [
            Waiting("c1", path("c", 100, 10)),
            Waiting("c2", path("c", 100, 20)),
            Waiting("d", path("d", 100)),
        ],
        ["c1", "d", "c2"],  # c1 and d in one prefill batch; c2 then finds c1's head cached
        slots=2,
    ),
    "lpm falls back to fcfs above 128 waiting": Case(
        "lpm", [*_uncached(129), Waiting("cont", CONTINUES)], ["u0", "u1"]
    ),
    "program order serves the earliest program first": Case(
        "program",
        [
            Waiting("late", path("late", 100), program_arrival=5.0),
            Waiting("early", CONTINUES, program_arrival=1.0),
            Waiting("own", path("own", 100)),
        ],
        ["early", "own", "late"],
    ),
    "priority scheduling serves the higher priority first": Case(
        "fcfs",
        [Waiting("low", path("low", 100), priority=0), Waiting("high", path("high", 100), priority=1)],
        ["high", "low"],
        priority_order="higher_first",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_waiting_queue_is_served_in_the_policy_order(case: Case) -> None:
    engine = EngineModel(
        small("sglang", 100_000, max_running=case.slots),
        schedule_policy=case.policy,
        priority_order=case.priority_order,
    )
    engine.submit(EngineRequest("warm", CACHED, 1, reply=node_after(CACHED, "reply", 1)), 0.0)
    run_until_idle(engine)
    engine.submit(EngineRequest("busy", path("busy", 50), 1), 2.0)  # takes the one slot
    for w in case.waiting:
        engine.submit(
            EngineRequest(w.name, w.prompt, 1, priority=w.priority, program_arrival=w.program_arrival), 2.0
        )
    admitted = [e.request_id for e in of_kind(run_until_idle(engine), RequestAdmitted)]
    assert admitted[0] == "busy"
    assert admitted[1 : 1 + len(case.first)] == case.first


@pytest.mark.parametrize("policy", ["lpm", "program"])
def test_a_reordering_policy_needs_a_shared_pool_and_fcfs_priority(policy: str) -> None:
    with pytest.raises(ValueError, match="shared KV pool"):
        EngineModel(small("sglang", 1000), schedule_policy=policy, priority_order="higher_first")
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineModel(small("sglang", 1000), schedule_policy="lifo")


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_a_held_prefix_survives_pressure_until_released(style: str) -> None:
    engine = EngineModel(small(style, 1000))
    first = path("a", 600)
    reply = node_after(first, "reply", 1)
    engine.submit(EngineRequest("a", first, 1, reply=reply), 0.0)
    run_until_idle(engine)
    handle = engine.hold((*first.nodes, reply), 1.0)
    assert handle is not None and engine.held == 1
    engine.submit(EngineRequest("b", path("b", 600), 1), 1.0)
    assert of_kind(run_until_idle(engine), RequestAdmitted) == []  # 601 pinned: no room for b
    assert engine.load().cached_tokens == 601 and engine.load().waiting == 1
    engine.release(handle, 2.0)
    events = run_until_idle(engine)
    assert [e.request_id for e in of_kind(events, RequestAdmitted)] == ["b"]
    assert engine.held == 0


def test_holding_what_the_cache_lacks_gives_no_handle() -> None:
    engine = EngineModel(small("sglang", 1000))
    assert engine.hold(path("never", 10).nodes, 0.0) is None
