"""The engine model's llama.cpp style: slots with their own context, chosen by prompt similarity
or recency, and the prompt cache in host memory that saves and restores them."""

from __future__ import annotations

import pytest
from engine_model_helpers import by_id, node_after, path, run_until_idle, then

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineModel,
    EngineProfile,
    EngineRequest,
    RequestFinished,
)

LLAMACPP = PROFILES["llamacpp-smollm2-135m-cpu"]


def turn(
    engine: EngineModel, name: str, prompt_nodes: tuple[int, ...], at: float, follows: str | None = None
) -> RequestFinished:
    """Run one turn of run ``name`` alone and return its finish; ``follows`` names the reply of
    the run's previous turn, which then precedes a 20-token tool result."""
    prompt = path(name, *prompt_nodes)
    if follows is not None:
        prompt = then(then(prompt, follows, 8), f"{follows} result", 20)
    reply = node_after(prompt, f"{name}-reply-{at}", 8)
    engine.submit(EngineRequest(f"{name}@{at}", prompt, 8, reply=reply), at)
    return by_id(run_until_idle(engine), RequestFinished)[f"{name}@{at}"]


def profile(slots: int, cache: bool) -> EngineProfile:
    return LLAMACPP.with_changes(
        pool_tokens=slots * 2048,
        max_running=slots,
        ram_cache_tokens=LLAMACPP.ram_cache_tokens if cache else 0,
    )


def test_a_runs_next_turn_goes_to_the_slot_that_holds_its_prefix() -> None:
    engine = EngineModel(profile(2, cache=False))
    turn(engine, "a", (300,), 0.0)
    turn(engine, "b", (300,), 100.0)  # the least recently used slot: the other one
    # Each run's next turn finds its own slot by similarity: prompt and reply reused.
    assert turn(engine, "a", (300,), 200.0, follows=f"a-reply-{0.0}").cached_tokens == 308
    assert turn(engine, "b", (300,), 300.0, follows=f"b-reply-{100.0}").cached_tokens == 308


@pytest.mark.parametrize(("cache", "cached"), [(True, 308), (False, 0)])
def test_the_prompt_cache_restores_a_run_whose_slot_was_taken(cache: bool, cached: int) -> None:
    # One slot, two runs taking turns: b's turn overwrites a's tokens in the slot; with the prompt
    # cache, a's were saved first and come back for a's next turn.
    engine = EngineModel(profile(1, cache=cache))
    turn(engine, "a", (300,), 0.0)
    turn(engine, "b", (300,), 100.0)
    assert turn(engine, "a", (300,), 200.0, follows=f"a-reply-{0.0}").cached_tokens == cached


def test_a_slot_sharing_too_little_of_the_prompt_is_passed_over_for_the_least_recently_used() -> None:
    engine = EngineModel(profile(2, cache=False))
    turn(engine, "x", (20, 380), 0.0)  # slot 0
    turn(engine, "y", (100,), 100.0)  # slot 1, the one not used yet
    assert turn(engine, "x", (20, 380), 150.0).cached_tokens == 399  # slot 0 again, by similarity
    # 20 shared tokens of a 1,019-token prompt: 2 %, under the 10 % threshold, so not slot 0 but
    # the least recently used one, y's: nothing reused.
    assert turn(engine, "x", (20, 999), 200.0).cached_tokens == 0
