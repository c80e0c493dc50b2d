"""The engine model (luftpause.testkit.engine.model): a request's life, pool admission, cancel,
queue order and the contract of the clock. Times are virtual: computed, never measured."""

from __future__ import annotations

import pytest
from engine_model_helpers import by_id, node_after, of_kind, path, run_until_idle, small, then

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineModel,
    EngineRequest,
    FirstTokenGenerated,
    RequestAdmitted,
    RequestFinished,
)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_request_is_admitted_prefilled_decoded_and_finished(name: str) -> None:
    engine = EngineModel(PROFILES[name])
    prompt = path("run", 300, 200)
    engine.submit(EngineRequest("r1", prompt, 16, reply=node_after(prompt, "reply", 16)), 0.0)
    events = run_until_idle(engine)
    assert [type(e) for e in events] == [RequestAdmitted, FirstTokenGenerated, RequestFinished]
    admitted, first, finished = events
    assert admitted.time == 0.0 and 0 < first.time < finished.time
    assert isinstance(finished, RequestFinished)
    assert (finished.prompt_tokens, finished.cached_tokens, finished.completion_tokens) == (500, 0, 16)
    load = engine.load()
    assert (load.running, load.waiting, load.used_tokens) == (0, 0, 0)
    assert load.cached_tokens == 516  # the prompt and its reply, for the run's next turn
    assert engine.next_event_time() is None


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_the_next_turn_finds_prompt_and_reply_cached(style: str) -> None:
    engine = EngineModel(small(style, 10_000))
    prompt = path("run", 400, 100)
    reply = node_after(prompt, "reply", 30)
    engine.submit(EngineRequest("turn1", prompt, 30, reply=reply), 0.0)
    run_until_idle(engine)
    following = then(then(prompt, "reply", 30), "tool result", 50)
    assert following.nodes[-2] == reply
    engine.submit(EngineRequest("turn2", following, 5), 10.0)
    finished = by_id(run_until_idle(engine), RequestFinished)["turn2"]
    assert (finished.prompt_tokens, finished.cached_tokens) == (580, 530)


# --- pool admission --------------------------------------------------------------------------------


def test_sglang_admits_only_when_the_pool_holds_the_reservation_of_max_tokens() -> None:
    # 1,000 tokens; each request: 100 prompt tokens, 600 max_tokens, 10 generated. The first
    # running reserves (600 - 1) x 0.7 = 419 tokens beyond its prompt, so the second's
    # 100 + 600 + 1 does not fit until the first finishes, although both would fit as they run.
    engine = EngineModel(small("sglang", 1000))
    engine.submit(EngineRequest("a", path("a", 100), 10, max_tokens=600), 0.0)
    engine.submit(EngineRequest("b", path("b", 100), 10, max_tokens=600), 0.0)
    moment = engine.next_event_time()
    assert moment is not None
    engine.advance(moment)
    assert (engine.load().running, engine.load().waiting) == (1, 1)
    events = run_until_idle(engine)
    admitted, finished = by_id(events, RequestAdmitted), by_id(events, RequestFinished)
    assert admitted["b"].time == finished["a"].time


def test_sglang_admits_both_when_the_reservation_fits() -> None:
    engine = EngineModel(small("sglang", 2000))
    engine.submit(EngineRequest("a", path("a", 100), 10, max_tokens=600), 0.0)
    engine.submit(EngineRequest("b", path("b", 100), 10, max_tokens=600), 0.0)
    events = run_until_idle(engine)
    admitted, finished = by_id(events, RequestAdmitted), by_id(events, RequestFinished)
    assert admitted["b"].time < finished["a"].time


def test_vllm_admits_when_the_pool_holds_the_uncached_prompt_and_waits_otherwise() -> None:
    # No reservation: b (500 tokens) waits only because a holds 600 of 1,000 tokens and grows.
    engine = EngineModel(small("vllm", 1000))
    engine.submit(EngineRequest("a", path("a", 600), 300), 0.0)
    engine.submit(EngineRequest("b", path("b", 500), 10), 0.0)
    engine.submit(EngineRequest("c", path("c", 100), 10), 0.0)
    events = run_until_idle(engine)
    admitted, finished = by_id(events, RequestAdmitted), by_id(events, RequestFinished)
    assert admitted["b"].time == finished["a"].time
    # c, behind b in the queue, is not admitted ahead of it although it would fit.
    assert admitted["c"].time == admitted["b"].time


@pytest.mark.parametrize(
    ("style", "prompt", "max_tokens", "fits"),
    [
        ("sglang", 500, 498, True),
        ("sglang", 500, 499, False),  # prompt + max_tokens + 1 must stay below the pool
        ("vllm", 500, 500, True),
        ("vllm", 500, 501, False),
    ],
)
def test_a_request_that_can_never_fit_is_refused_at_submit(
    style: str, prompt: int, max_tokens: int, fits: bool
) -> None:
    engine = EngineModel(small(style, 1000))
    request = EngineRequest("big", path("big", prompt), 1, max_tokens=max_tokens)
    if fits:
        engine.submit(request, 0.0)
        assert by_id(run_until_idle(engine), RequestFinished)["big"].completion_tokens == 1
    else:
        with pytest.raises(ValueError, match="needs"):
            engine.submit(request, 0.0)
        assert engine.load().waiting == 0


# --- cancel ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_cancel_frees_a_running_requests_kv_at_once_and_keeps_its_prefix_cached(style: str) -> None:
    engine = EngineModel(small(style, 10_000))
    engine.submit(EngineRequest("a", path("a", 300, 200), 1000), 0.0)
    for _ in range(5):
        moment = engine.next_event_time()
        assert moment is not None
        engine.advance(moment)
    assert engine.load().used_tokens > 500
    assert engine.cancel("a", engine.next_event_time() or 0.0)
    load = engine.load()
    assert (load.running, load.used_tokens) == (0, 0)
    assert load.evictable_tokens == 500  # the prompt it computed, unpinned
    assert run_until_idle(engine) == []
    assert not engine.cancel("a", 100.0)


def test_cancel_takes_a_waiting_request_out_of_the_queue() -> None:
    engine = EngineModel(small("vllm", 1000))
    engine.submit(EngineRequest("a", path("a", 600), 300), 0.0)
    engine.submit(EngineRequest("b", path("b", 500), 10), 0.0)
    assert engine.cancel("b", 0.0)
    assert engine.load().waiting == 0
    events = run_until_idle(engine)
    assert "b" not in by_id(events, RequestAdmitted)
    assert list(by_id(events, RequestFinished)) == ["a"]


# --- queue order -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "first"), [("fcfs", "relaxed"), ("lower_first", "urgent"), ("higher_first", "relaxed")]
)
@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_the_waiting_queue_follows_priority_when_set(style: str, order: str, first: str) -> None:
    engine = EngineModel(small(style, 1000), priority_order=order)
    engine.submit(EngineRequest("hog", path("hog", 600), 100, max_tokens=300), 0.0)
    engine.submit(EngineRequest("relaxed", path("relaxed", 500), 5, priority=5), 0.0)
    engine.submit(EngineRequest("urgent", path("urgent", 500), 5, priority=1), 0.0)
    admitted = of_kind(run_until_idle(engine), RequestAdmitted)
    assert [event.request_id for event in admitted][1] == first


# --- the clock -------------------------------------------------------------------------------------


def test_time_never_goes_back_and_steps_are_advanced_before_new_input() -> None:
    engine = EngineModel(small("sglang", 10_000))
    engine.submit(EngineRequest("a", path("a", 100), 2000), 1.0)
    end = engine.next_event_time()
    assert end is not None
    with pytest.raises(ValueError, match="advance"):
        engine.submit(EngineRequest("b", path("b", 100), 5), end + 1.0)
    engine.advance(end + 1.0)
    with pytest.raises(ValueError, match="back"):
        engine.advance(end)
    with pytest.raises(ValueError, match="already held"):
        engine.submit(EngineRequest("a", path("a", 100), 5), end + 1.0)


def test_advance_returns_each_event_once_in_time_order() -> None:
    engine = EngineModel(small("vllm", 10_000))
    for index in range(5):
        engine.submit(EngineRequest(f"r{index}", path(f"r{index}", 100 * (index + 1)), 20 + index), 0.0)
    events = engine.advance(1000.0)
    assert engine.advance(1000.0) == []
    times = [event.time for event in events]
    assert times == sorted(times)
    assert len(of_kind(events, RequestFinished)) == 5
    assert engine.generated("r0") is None  # finished: no longer held


def test_generated_counts_tokens_as_they_are_produced() -> None:
    engine = EngineModel(small("sglang", 10_000))
    engine.submit(EngineRequest("a", path("a", 100), 5), 0.0)
    counts = []
    while (moment := engine.next_event_time()) is not None:
        counts.append(engine.generated("a"))
        engine.advance(moment)
    assert counts == [0, 1, 2, 3, 4]
