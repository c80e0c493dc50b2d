"""The policy with KV-token admission on load shapes it was never run on while it was chosen
(issue 23 item 4), in virtual time.

KV-token admission's settings (the fill, when a run is parked, the first burst's count) were
chosen on ``bench/shapes/`` (the flood matrix). These two shapes were written after and run once:
12k-token contexts in a 1.5x pool with heavy-tailed batch tools (lognormal, median 2 s, p99 60 s),
and the published flood on the vLLM profile with no running bound (the KV pool the only bound).
Each asserts the issue's goals on SIMULATED figures (the engine models on a virtual clock, the real
scheduler core, one fixed seed: the same figures every run; no timing is asserted): the flood
matters there (the router's interactive run time over twice the interactive agents' alone), and
luftpause's interactive runs/min are at least every peer's and twice the router's, its total at
least 0.97x the best peer's, its batch at least ThunderAgent's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from luftpause.testkit.sim.flood import PEERS, by_class, simulate
from luftpause.testkit.sim.shapes import ShapeFile, parse_shape

CONSTANT = {"dist": "constant", "seconds": 0.5}
HEAVY = {"dist": "lognormal", "median": 2.0, "p99": 60.0}


def _shape(
    name: str, context: int, slots: int | str, pool: float, batch: int, interactive: int, **more: Any
) -> ShapeFile:
    batch_tools = more.pop("batch_tools", CONSTANT)
    return parse_shape(
        {
            "duration_s": 180,
            "seeds": [0],
            "replicas": 2,
            "slots": slots,
            "profile": more.pop("profile", "sglang-llama-3.2-1b-fp8-8gb"),
            "via": "own_loop",
            "context_tokens": context,
            "reply_tokens": 256,
            "engine": {"queue": "fcfs", "pool_scale": pool},
            "groups": [
                {"agents": interactive, "class": "interactive", "caller": "ide", "tool_rounds": 3,
                 "tool_seconds": CONSTANT},
                {"agents": batch, "class": "batch", "caller": "bulk", "tool_rounds": 3,
                 "tool_seconds": batch_tools},
            ],
        },
        name,
    )  # fmt: skip


HELD_OUT = [
    _shape("context-12k-heavy-tail", 12_000, 8, 1.5, batch=24, interactive=2, batch_tools=HEAVY),
    _shape(
        "vllm-unbounded", 2_650, "none", 1.0, batch=48, interactive=4, profile="vllm-llama-3.2-1b-fp8-8gb"
    ),
]


def _run(shape: ShapeFile, arrangement: str, interactive_only: bool = False) -> dict[str, Any]:
    """One simulated pass; ``interactive_only``: the shape's interactive agents alone (the
    light-load control that says whether the flood matters)."""
    spec = shape.spec(seed=shape.seeds[0], smg_capacity="load")
    if interactive_only:
        load = shape.load
        groups = tuple(group for group in load.groups if group.service_class == "interactive")
        spec = dataclasses.replace(spec, shape=dataclasses.replace(load, groups=groups))
    return simulate(spec, arrangement)


def _figures(report: dict[str, Any]) -> tuple[float, float]:
    return (
        by_class(report, "interactive", "runsPerMinute") or 0.0,
        by_class(report, "batch", "runsPerMinute") or 0.0,
    )


@pytest.mark.parametrize("shape", HELD_OUT, ids=[shape.name for shape in HELD_OUT])
def test_on_a_held_out_shape_luftpause_meets_every_goal(shape: ShapeFile) -> None:
    reports = {name: _run(shape, name) for name in (*PEERS, "luftpause")}
    control = _run(shape, "router", interactive_only=True)
    flood_p50 = by_class(reports["router"], "interactive", "runTimeP50")
    light_p50 = by_class(control, "interactive", "runTimeP50")
    assert flood_p50 is not None and light_p50 is not None and flood_p50 > 2 * light_p50, "no flood"
    ours = _figures(reports["luftpause"])
    peers = {name: _figures(reports[name]) for name in PEERS}
    for name, (interactive, _) in peers.items():
        assert ours[0] >= interactive, f"interactive {ours[0]} against {name}'s {interactive}"
    assert ours[0] >= 2 * peers["router"][0], (
        f"interactive {ours[0]} against the router's {peers['router'][0]}"
    )
    best = max(sum(figures) for figures in peers.values())
    assert sum(ours) >= 0.97 * best, f"total {sum(ours)} against the best peer's {best}"
    thunder = peers["thunderagent"]
    assert ours[1] >= thunder[1], f"batch {ours[1]} against ThunderAgent's {thunder[1]}"
