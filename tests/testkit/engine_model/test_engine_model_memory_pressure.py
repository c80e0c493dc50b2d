"""The engine model under memory pressure and shared engine time: retraction (SGLang) and
preemption (vLLM) when decode runs out of room, recompute afterwards, a cache miss slowing every
running request, and the chunked prefill budget."""

from __future__ import annotations

import math

import pytest
from engine_model_helpers import by_id, of_kind, path, run_until_idle, small

from luftpause.testkit.engine.model import (
    EngineEvent,
    EngineModel,
    EngineRequest,
    FirstTokenGenerated,
    RequestAdmitted,
    RequestFinished,
    RequestRetracted,
    StepCosts,
)

# --- retraction and preemption ---------------------------------------------------------------------


def crowd(style: str, **changes: object) -> tuple[EngineModel, list[EngineRequest]]:
    """Four requests of 200 prompt and 400 generated tokens on a 2,000-token pool: admitted
    together (SGLang with a new-token ratio held at 0.1), they need 2,400 tokens by the end."""
    engine = EngineModel(small(style, 2000, **changes))
    requests = [EngineRequest(name, path(name, 200), 400) for name in "abcd"]
    for request in requests:
        engine.submit(request, 0.0)
    return engine, requests


@pytest.mark.parametrize(
    ("style", "changes", "first_victim"),
    [
        # SGLang retracts the request with the fewest output tokens (then the longest prompt):
        # a, admitted alone at first, is one token ahead; of b, c, d the sort keeps the order.
        ("sglang", {"init_new_token_ratio": 0.1, "min_new_token_ratio_factor": 1.0}, "d"),
        # vLLM preempts the newest running request.
        ("vllm", {}, "d"),
    ],
)
def test_decode_out_of_room_retracts_and_every_request_still_finishes_with_all_its_tokens(
    style: str, changes: dict[str, object], first_victim: str
) -> None:
    engine, requests = crowd(style, **changes)
    events = run_until_idle(engine)
    retracted = of_kind(events, RequestRetracted)
    assert retracted, "the pool was never short"
    assert retracted[0].request_id == first_victim
    finished = by_id(events, RequestFinished)
    assert sorted(finished) == ["a", "b", "c", "d"]
    for request in requests:
        done = finished[request.request_id]
        assert done.completion_tokens == 400
        assert done.retractions == sum(1 for r in retracted if r.request_id == request.request_id)
        assert (done.recomputed_tokens > 0) == (done.retractions > 0)
    load = engine.load()
    assert load.generated_tokens_total == 1600  # no token generated twice
    assert load.retractions == len(retracted)
    assert (load.used_tokens, load.running, load.waiting) == (0, 0, 0)
    # Each retracted request was admitted again, and its first token came only once.
    admitted = of_kind(events, RequestAdmitted)
    for event in retracted:
        assert sum(1 for a in admitted if a.request_id == event.request_id) >= 2
    assert len(of_kind(events, FirstTokenGenerated)) == 4


def test_a_preempted_request_keeps_its_prefix_cached_and_recomputes_the_rest() -> None:
    engine, _ = crowd("vllm")
    events: list[EngineEvent] = []
    while not of_kind(events, RequestRetracted):
        events.extend(engine.advance(engine.next_event_time() or 0.0))
    victim = of_kind(events, RequestRetracted)[0]
    # Its prompt node stays cached, unpinned (the only unpinned tokens: the others run).
    assert engine.load().evictable_tokens == 200
    events.extend(run_until_idle(engine))
    finished = by_id(events, RequestFinished)[victim.request_id]
    readmitted = [e for e in of_kind(events, RequestAdmitted) if e.request_id == victim.request_id]
    assert finished.retractions == len(readmitted) - 1 == 1
    # Recomputed: prompt and the tokens generated before, less what the cache still held.
    assert finished.recomputed_tokens == 200 + victim.generated - readmitted[1].cached_tokens
    assert finished.cached_tokens == 0  # the first admission's hit, as usage reports it


def test_sglang_decays_its_new_token_ratio_and_raises_it_after_a_retraction() -> None:
    engine, _ = crowd("sglang", init_new_token_ratio=0.1, min_new_token_ratio_factor=0.5)
    ratios = []
    while (moment := engine.next_event_time()) is not None:
        events = engine.advance(moment)
        ratio = engine.load().new_token_ratio
        ratios.append(ratio)
        if retracted := of_kind(events, RequestRetracted):
            kept = [name for name in "abcd" if engine.is_running(name)]
            assert [r.request_id for r in retracted] == ["d"] and kept == ["a", "b", "c"]
            # SGLang: (tokens decoded by those kept + retract_decode_steps x kept) / their max_new.
            decoded = sum(engine.generated(name) or 0 for name in kept)
            assert ratio == pytest.approx((decoded + 20 * 3) / (3 * 400))
    decay = (0.1 - 0.05) / 600
    assert ratios[2] == pytest.approx(ratios[1] - decay)  # one decode step, one decay
    assert max(ratios) > 0.5
    assert ratios[-1] == 0.1  # idle again: back to the start


def test_vllm_admits_nothing_in_a_step_that_preempted() -> None:
    engine, _ = crowd("vllm")
    engine.submit(EngineRequest("late", path("late", 10), 1), 0.0)
    while (moment := engine.next_event_time()) is not None:
        events = engine.advance(moment)
        retracted = {e.time for e in of_kind(events, RequestRetracted)}
        admitted = {e.time for e in of_kind(events, RequestAdmitted)}
        assert not retracted & admitted


# --- engine time is shared -------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_a_long_uncached_prefill_slows_the_running_requests_decode(style: str) -> None:
    """A decodes 200 tokens; at 0.5 s B arrives with 6,000 prompt tokens, either cached but the
    last 100 (a hit) or not at all (a miss). A finishes later after the miss than after the hit,
    and later after either than alone: every step computing B's prompt is a longer step for A
    (vLLM), or a step without A at all (SGLang)."""
    costs = StepCosts(0.010, 0.0001, 0.0)  # 10 ms a step, 0.1 ms a token computed

    def finish_of_a(arrival: str | None) -> float:
        engine = EngineModel(small(style, 50_000, step_tokens=2048, costs=costs))
        warm = path("shared", 5900)
        engine.submit(EngineRequest("warmup", warm, 1), 0.0)
        run_until_idle(engine)
        engine.submit(EngineRequest("a", path("a", 100), 200), 1.0)
        engine.advance(1.5)
        if arrival is not None:
            at = engine.next_event_time() or 1.5
            engine.advance(at)
            prompt = path("shared", 5900, 100) if arrival == "hit" else path("cold", 5900, 100)
            engine.submit(EngineRequest("b", prompt, 1), at)
        return by_id(run_until_idle(engine), RequestFinished)["a"].time

    alone, hit, miss = finish_of_a(None), finish_of_a("hit"), finish_of_a("miss")
    assert alone < hit < miss
    # The miss costs A about B's 5,900 extra prompt tokens at 0.1 ms each (plus a step or two).
    assert miss - hit == pytest.approx(0.59, abs=0.05)


def test_a_steps_duration_grows_with_tokens_computed_and_kv_read() -> None:
    costs = StepCosts(0.010, 0.0001, 0.00001)
    assert costs.step_seconds(0, 0) == 0.010
    assert costs.step_seconds(100, 0) == pytest.approx(0.020)
    assert costs.step_seconds(1, 1000) == pytest.approx(0.0201)
    with pytest.raises(ValueError):
        StepCosts(-1.0, 0.0, 0.0)


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_a_batch_reading_more_kv_decodes_slower(style: str) -> None:
    costs = StepCosts(0.010, 0.0, 0.000001)  # 1 us per token of KV read

    def decode_time(context: int) -> float:
        engine = EngineModel(small(style, 50_000, costs=costs))
        for index in range(4):
            engine.submit(EngineRequest(f"r{index}", path(f"r{index}", context), 100), 0.0)
        events = run_until_idle(engine)
        first = by_id(events, FirstTokenGenerated)
        done = by_id(events, RequestFinished)
        return max(done[k].time - first[k].time for k in done)

    assert decode_time(8000) > decode_time(1000) * 1.3


# --- chunked prefill -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "prompt", "budget", "prefill_steps"),
    [
        ("sglang", 2048, 2048, 1),
        ("sglang", 2049, 2048, 2),
        ("sglang", 5000, 2048, 3),
        ("sglang", 5000, 512, 10),
        ("vllm", 5000, 2048, 3),
        ("vllm", 100, 2048, 1),
    ],
)
def test_a_prompt_is_prefilled_in_chunks_of_the_step_budget(
    style: str, prompt: int, budget: int, prefill_steps: int
) -> None:
    engine = EngineModel(small(style, 50_000, step_tokens=budget))
    engine.submit(EngineRequest("r", path("r", prompt), 3), 0.0)
    steps = 0
    while True:
        moment = engine.next_event_time()
        assert moment is not None
        steps += 1
        if of_kind(engine.advance(moment), FirstTokenGenerated):
            break
    assert steps == prefill_steps == math.ceil(prompt / budget)


@pytest.mark.parametrize(("style", "decoded_meanwhile"), [("sglang", 1), ("vllm", 4)])
def test_a_chunked_prefill_pauses_decode_on_sglang_and_shares_steps_on_vllm(
    style: str, decoded_meanwhile: int
) -> None:
    engine = EngineModel(small(style, 50_000, step_tokens=2048))
    engine.submit(EngineRequest("a", path("a", 100), 500), 0.0)
    for _ in range(3):
        engine.advance(engine.next_event_time() or 0.0)
    at = engine.next_event_time() or 0.0
    engine.advance(at)
    engine.submit(EngineRequest("b", path("b", 6000), 2), at)
    before = engine.generated("a") or 0
    while not of_kind(engine.advance(engine.next_event_time() or 0.0), FirstTokenGenerated):
        pass
    # The step in flight when B arrives decodes A once more; then B's 6,000 tokens take 3 steps,
    # with A's decode token inside each step's budget on vLLM, without A at all on SGLang.
    assert (engine.generated("a") or 0) - before == decoded_meanwhile
