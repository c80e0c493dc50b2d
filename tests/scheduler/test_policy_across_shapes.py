"""The policy on load shapes it was not tuned on (issue 23), in virtual time.

The policy (run order, pause hold, engine-load admission) was chosen on the published flood (48
batch + 4 interactive agents, 0.5 s tools, 8 slots; its test is
``tests/testkit/load/test_floods_in_virtual_time.py``). These cells were not part of that choice:
tools with a heavy tail for both classes, a light load that saturates nothing, and engines that
order their own queue by the longest cached prefix (SGLang's ``--schedule-policy lpm``). Each
asserts a goal of the issue on SIMULATED figures: the engine models on a virtual clock, the real
scheduler core, one fixed seed, so the same figures every run (no timing is asserted).
"""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.scheduler.core.policies.pause_hold import PauseHold
from luftpause.testkit.sim.flood import by_class, simulate
from luftpause.testkit.sim.shapes import ShapeFile, parse_shape

CONSTANT = {"tool_seconds": {"dist": "constant", "seconds": 0.5}}
HEAVY = {"tool_seconds": {"dist": "lognormal", "median": 2.0, "p99": 60.0}}


def _shape(name: str, batch: int, slots: int | str, tools: dict[str, Any], **more: Any) -> ShapeFile:
    """The published agents' prompts and replies, ``batch`` + 4 interactive own-loop agents."""
    return parse_shape(
        {
            "duration_s": 180,
            "seeds": [0],
            "replicas": 2,
            "slots": slots,
            "profile": "sglang-llama-3.2-1b-fp8-8gb",
            "via": "own_loop",
            "context_tokens": 2650,
            "reply_tokens": 256,
            "groups": [
                {"agents": 4, "class": "interactive", "caller": "ide", "tool_rounds": 3, **tools},
                {"agents": batch, "class": "batch", "caller": "bulk", "tool_rounds": 3, **tools},
            ],
            **more,
        },
        name,
    )


def _figures(shape: ShapeFile, arrangement: str, **spec: Any) -> tuple[float, float]:
    """(interactive, batch) runs per minute of one simulated pass."""
    report = simulate(shape.spec(seed=shape.seeds[0], **spec), arrangement)
    return (
        by_class(report, "interactive", "runsPerMinute") or 0.0,
        by_class(report, "batch", "runsPerMinute") or 0.0,
    )


def test_at_light_load_luftpause_holds_nothing_and_equals_the_router() -> None:
    """8 batch + 4 interactive agents, no running bound: nothing saturates. A probe that caught the
    engine still admitting (a lone queue, KV to spare) used to cap the replica at what ran then and
    hold batch turns for up to 6 s: batch 0.96x the router's."""
    light = _shape("light", batch=8, slots="none", tools=CONSTANT)
    router = _figures(light, "router")
    ours = _figures(light, "luftpause")
    assert ours[0] >= 0.98 * router[0], f"interactive {ours[0]} against the router's {router[0]}"
    assert ours[1] >= 0.98 * router[1], f"batch {ours[1]} against the router's {router[1]}"


def test_heavy_tailed_tools_keep_no_slot_idle_for_their_tail() -> None:
    """Both classes' tools lognormal, median 2 s, p99 60 s, 8 slots. The hold sized as twice the
    longest recent pause (``ttl``, up to 60 s) kept interactive runs' slots idle through their
    minute-long tools: batch below the router's. The cost model holds only what pays."""
    heavy = _shape("heavy-tail-both", batch=48, slots=8, tools=HEAVY)
    router = _figures(heavy, "router")
    ours = _figures(heavy, "luftpause")
    old = _figures(heavy, "luftpause", policy={"pause_hold": PauseHold(mode="ttl")})
    assert old[1] < router[1], "the input no longer shows what the old hold cost"
    assert ours[1] >= router[1], f"batch {ours[1]} against the router's {router[1]}"
    assert sum(ours) >= 0.97 * sum(router), f"total {sum(ours)} against the router's {sum(router)}"


@pytest.mark.parametrize("slots", [8, 4])
def test_against_engines_in_lpm_order_interactive_leads_every_peer(slots: int) -> None:
    """The published flood with the engines in SGLang's ``lpm`` order, which gives the classless
    router the prefix cache luftpause's run order keeps: interactive still at least 2x the
    router's and at least SGLang Model Gateway's (its slot pool set for the load)."""
    lpm = _shape("lpm", batch=48, slots=slots, tools=CONSTANT, engine={"queue": "lpm"})
    router = _figures(lpm, "router")
    gateway = _figures(lpm, "smg", smg_capacity="load")
    ours = _figures(lpm, "luftpause")
    assert ours[0] >= 2.0 * router[0], f"interactive {ours[0]} against the router's {router[0]}"
    assert ours[0] >= gateway[0], f"interactive {ours[0]} against the gateway's {gateway[0]}"
