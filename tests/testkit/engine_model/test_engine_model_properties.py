"""Properties of the engine model over random traffic (Hypothesis), on every scheduler style:

* every submitted request finishes exactly once or is cancelled, with all its tokens;
* the pool is never over-committed: running requests' tokens plus the prefix cache fit the pool;
* a request's events come in order (admitted, first token, finished), none after it finished;
* the same traffic gives the same events (no randomness), and an idle engine holds no KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from engine_model_helpers import path, small
from hypothesis import event as note_event
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineEvent,
    EngineModel,
    EngineProfile,
    EngineRequest,
    FirstTokenGenerated,
    RequestAdmitted,
    RequestFinished,
    RequestRetracted,
)


@dataclass(frozen=True)
class Submit:
    family: int
    nodes: tuple[int, ...]
    output: int
    extra_max: int
    priority: int


@dataclass(frozen=True)
class Cancel:
    index: int


@dataclass(frozen=True)
class Wait:
    seconds: float


submits = st.builds(
    Submit,
    st.integers(0, 3),
    # The first node holds a token at least (an empty prompt is refused); others may not.
    st.tuples(st.integers(1, 120), st.lists(st.integers(0, 120), max_size=2)).map(
        lambda nodes: (nodes[0], *nodes[1])
    ),
    st.integers(1, 300),
    st.integers(0, 100),
    st.integers(0, 3),
)
# Mostly arrivals, close together (a step is about 10 ms), so that requests crowd the pool.
operations = st.lists(
    st.one_of(
        submits,
        submits,
        submits,
        submits,
        st.builds(Cancel, st.integers(0, 40)),
        st.builds(Wait, st.floats(0.0, 0.1)),
    ),
    min_size=8,
    max_size=50,
)


@st.composite
def profiles(draw: st.DrawFn, style: str) -> EngineProfile:
    step_tokens = draw(st.integers(8, 700))
    if style == "llamacpp":
        slots = draw(st.integers(1, 4))
        return PROFILES["llamacpp-smollm2-135m-cpu"].with_changes(
            pool_tokens=slots * draw(st.integers(700, 1200)), max_running=slots, step_tokens=step_tokens
        )
    changes: dict[str, object] = {"max_running": draw(st.integers(1, 12))}
    if style == "sglang":
        # A low, fast-decaying ratio over-admits, so that retraction happens often.
        changes.update(
            init_new_token_ratio=draw(st.sampled_from([0.05, 0.05, 0.3, 0.7])), new_token_ratio_decay_steps=50
        )
    return small(style, draw(st.integers(700, 1500)), step_tokens=step_tokens, **changes)


Operation = Submit | Cancel | Wait


def play(
    profile: EngineProfile, ops: list[Operation], order: str
) -> tuple[list[EngineEvent], dict[str, EngineRequest], set[str]]:
    """Run ``ops``, checking the pool after every call; returns every event, the accepted
    requests by id, and the ids cancelled while held."""
    engine = EngineModel(profile, priority_order=order)
    now = 0.0
    events: list[EngineEvent] = []
    accepted: dict[str, EngineRequest] = {}
    cancelled: set[str] = set()

    def check() -> None:
        load = engine.load()
        assert 0 <= load.evictable_tokens <= load.cached_tokens
        assert load.used_tokens + load.evictable_tokens <= load.pool_tokens  # never over-committed
        assert load.running <= profile.max_running
        assert load.running + load.waiting == len(accepted) - len(cancelled) - load.finished_total

    for index, op in enumerate(ops):
        if isinstance(op, Wait):
            now += op.seconds
            events.extend(engine.advance(now))
        elif isinstance(op, Cancel):
            events.extend(engine.advance(now))
            # The index often names no request (or a finished one): clients mostly stay.
            target = f"r{op.index}"
            if target in accepted and engine.cancel(target, now):
                cancelled.add(target)
        else:
            events.extend(engine.advance(now))
            request = EngineRequest(
                f"r{index}",
                path(f"family{op.family}", *op.nodes),
                op.output,
                reply=(f"reply{index}".encode(), op.output),
                priority=op.priority,
                max_tokens=op.output + op.extra_max,
            )
            try:
                engine.submit(request, now)
            except ValueError:
                pass  # can never fit this engine: refused, not held
            else:
                accepted[request.request_id] = request
        check()
    for _ in range(100_000):
        moment = engine.next_event_time()
        if moment is None:
            break
        events.extend(engine.advance(moment))
        check()
    load = engine.load()
    assert (load.running, load.waiting, load.used_tokens) == (0, 0, 0)
    assert load.cached_tokens == load.evictable_tokens  # nothing pinned once idle
    assert load.retractions == sum(isinstance(e, RequestRetracted) for e in events)
    return events, accepted, cancelled


STYLES = pytest.mark.parametrize("style", ["sglang", "vllm", "llamacpp"])


@STYLES
@settings(max_examples=100, deadline=None)
@given(data=st.data(), ops=operations, order=st.sampled_from(["fcfs", "lower_first", "higher_first"]))
def test_every_request_finishes_or_is_cancelled_exactly_once_and_the_pool_holds(
    style: str, data: st.DataObject, ops: list[Operation], order: str
) -> None:
    profile = data.draw(profiles(style))
    events, accepted, cancelled = play(profile, ops, order)
    retracted = any(isinstance(e, RequestRetracted) for e in events)
    note_event("some retracted" if retracted else "none retracted")
    times = [event.time for event in events]
    assert times == sorted(times)
    finished: dict[str, RequestFinished] = {}
    stage: dict[str, str] = {}
    first_tokens: set[str] = set()
    for event in events:
        rid = event.request_id
        assert rid in accepted and rid not in finished, f"an event for {rid} after it finished"
        if isinstance(event, RequestAdmitted):
            assert stage.get(rid) in (None, "retracted")
            stage[rid] = "admitted"
        elif isinstance(event, RequestRetracted):
            assert stage.get(rid) == "admitted"
            stage[rid] = "retracted"
        elif isinstance(event, FirstTokenGenerated):
            assert stage.get(rid) == "admitted"
            assert rid not in first_tokens
            first_tokens.add(rid)
        else:
            assert stage.get(rid) == "admitted"
            finished[rid] = event
            assert event.completion_tokens == accepted[rid].output_tokens
            assert event.prompt_tokens == accepted[rid].prompt_tokens
            assert 0 <= event.cached_tokens < event.prompt_tokens + 1
    assert set(finished) | cancelled == set(accepted)
    assert not set(finished) & cancelled


@STYLES
@settings(max_examples=20, deadline=None)
@given(data=st.data(), ops=operations)
def test_the_same_traffic_gives_the_same_events(
    style: str, data: st.DataObject, ops: list[Operation]
) -> None:
    profile = data.draw(profiles(style))
    assert play(profile, ops, "fcfs")[0] == play(profile, ops, "fcfs")[0]
