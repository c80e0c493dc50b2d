"""A turn asking for more output tokens than its model's cap is refused 400 on all three front
doors (issue 25, item 7; docs/failover.md "Output tokens"), through the real ``openai`` and
``anthropic`` clients.

What broke: ``max_tokens`` went to the engine unbounded; a request for 10^12 tokens held a turn
until the engine gave up. The cap is ``[dataplane] max_tokens`` for a model, else the context
length its replicas report (``max_model_len`` in ``GET /v1/models``, which the scheduler reads and
sends in its replica set; the simulated engine reports 8,192).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from dataplane_procs import MODEL, SchedulerAndDataplane, fake_engine, scheduler_and_dataplane

from luftpause.testkit.engine.settings import MAX_MODEL_LEN

pytestmark = pytest.mark.integration

CONFIGURED = "capped-model"
"""Served by the same engine, capped by configuration at 50 tokens."""
CONTEXT = MAX_MODEL_LEN
"""What the simulated engine reports as its context length (``max_model_len``)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerAndDataplane]:
    workdir: Path = tmp_path_factory.mktemp("max-tokens")
    with fake_engine(workdir, args=("--model", MODEL, "--model", CONFIGURED)) as url:
        replicas = f'\n[[replicas]]\nname = "sim-0"\nurl = "{url}"\nmodels = ["{MODEL}", "{CONFIGURED}"]\n'
        with scheduler_and_dataplane(
            workdir, [url], replicas=replicas, dataplane=f'max_tokens = {{ "{CONFIGURED}" = 50 }}'
        ) as started:
            yield started


def refused_once_known(call: Callable[[], object], error: type[Exception]) -> Exception:
    """``call()`` until it raises ``error`` (the scheduler's first probe, which reads the context
    length, may come after the dataplane connected); the error, or AssertionError after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            call()
        except error as exc:
            return exc
        assert time.monotonic() < deadline, "never refused"
        time.sleep(0.5)


@pytest.fixture
def client(pair: SchedulerAndDataplane) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{pair.dataplane_url}/v1", api_key="x", max_retries=0, timeout=30) as opened:
        yield opened


HI = [{"role": "user", "content": "hi"}]


def test_chat_max_tokens_past_the_engines_context_length_is_400(client: openai.OpenAI) -> None:
    exc = refused_once_known(
        lambda: client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10**12),  # type: ignore[arg-type]
        openai.BadRequestError,
    )
    assert isinstance(exc, openai.BadRequestError) and exc.status_code == 400
    assert f"at most {CONTEXT}" in str(exc) and "max_tokens" in str(exc)
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
        client.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=CONTEXT + 1)  # type: ignore[arg-type]
    answer = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert answer.choices[0].message is not None


def test_a_configured_cap_wins_over_the_context_length(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="at most 50 output tokens"):
        client.chat.completions.create(model=CONFIGURED, messages=HI, max_tokens=51)  # type: ignore[arg-type]
    assert client.chat.completions.create(model=CONFIGURED, messages=HI, max_tokens=50).choices  # type: ignore[arg-type]


def test_messages_max_tokens_past_the_cap_is_400_in_anthropics_shape(pair: SchedulerAndDataplane) -> None:
    with anthropic.Anthropic(base_url=pair.dataplane_url, api_key="x", max_retries=0, timeout=30) as client:
        exc = refused_once_known(
            lambda: client.messages.create(model=MODEL, max_tokens=10**9, messages=HI),  # type: ignore[arg-type]
            anthropic.BadRequestError,
        )
    assert isinstance(exc, anthropic.BadRequestError)
    assert exc.body["type"] == "error" and "max_tokens" in exc.body["error"]["message"]  # type: ignore[index]


def test_responses_max_output_tokens_past_the_cap_is_400(client: openai.OpenAI) -> None:
    exc = refused_once_known(
        lambda: client.responses.create(model=MODEL, input="hi", max_output_tokens=10**9),
        openai.BadRequestError,
    )
    assert "max_output_tokens" in str(exc)
