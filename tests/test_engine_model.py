"""The engine model (luftpause.testkit.engine.model): one request's life, on every profile."""

from __future__ import annotations

import pytest
from engine_model_helpers import node_after, path, run_until_idle

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
