"""``run`` (spawn and wait in one call, with progress) and ``decide`` (single pass, or labels scored
by first-token logprobs), through the real ``mcp`` client against the whole stack with a simulated
single-pass classifier as an extra replica."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent
from postgres_helpers import STORES, on_the_file_journal, store_line, store_of

from luftpause.runtime.decide import label_prompt, score_labels
from luftpause.runtime.runs.waiting import PROGRESS_INTERVAL_ENV
from luftpause.testkit.engine.replies import words_of
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

CLASSIFIER = "sim-classifier"
CLASSES = ("negative", "positive")  # the fake engine's default classifier labels


@pytest.fixture(scope="module", params=STORES)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Engines at 20 ms a token (so a long reply outlasts one progress interval), and a
    single-pass classifier replica; the runtime on each store (``decide`` records nothing: its
    tests run on the file journal only)."""
    store = store_of(request)
    workdir = tmp_path_factory.mktemp("run-decide")
    port = free_port()
    classifier = ChildProcess(
        "classifier",
        ["fake-engine", "--port", str(port), "--model", CLASSIFIER],
        workdir / "classifier.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    extra = f"""
[[replicas]]
name = "classifier"
url = "http://127.0.0.1:{port}"
models = ["{CLASSIFIER}"]
kind = "single_pass"
"""
    try:
        classifier.start().wait_ready()
        # Progress every 0.2 s: a 6 s run sends many, not one that depends on 6 s beating 5 s.
        env = {"LUFTPAUSE_TOKEN": "", PROGRESS_INTERVAL_ENV: "0.2"}
        sections = {"runtime": store_line(store)}
        running = Stack.start(workdir, decode_ms=20, extra_config=extra, env=env, sections=sections)
        try:
            running.wait_connected()
            yield running
        finally:
            running.stop()
    finally:
        classifier.stop()


def _text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict), _text(result)
    return result.structured_content


def call(stack: Stack, tool: str, arguments: dict[str, Any], **options: Any) -> CallToolResult:
    async def go() -> CallToolResult:
        async with Client(stack.runtime_url) as client:
            return await client.call_tool(tool, arguments, read_timeout_seconds=120, **options)

    return asyncio.run(go())


def test_run_spawns_and_waits_and_answers_as_await_does(stack: Stack) -> None:
    result = _payload(call(stack, "run", {"task": "tell me about otters", "maxTokens": 16, "timeout": 60}))
    assert result["timedOut"] is False
    [run] = result["runs"]
    assert run["state"] == "completed", run
    assert run["answer"].startswith("I saw 2 tool results")
    assert run["toolCalls"] == 2 and run["failedToolCalls"] == 0
    again = _payload(call(stack, "await", {"handles": [run["handle"]], "timeout": 1}))
    assert again["runs"][0]["answer"] == run["answer"]


def test_run_that_times_out_returns_the_running_handle(stack: Stack) -> None:
    result = _payload(call(stack, "run", {"task": "slow otters", "maxTokens": 400, "timeout": 0.2}))
    assert result["timedOut"] is True
    assert result["runs"][0]["state"] == "running"
    call(stack, "cancel", {"handle": result["runs"][0]["handle"]})


def test_a_long_run_sends_progress_notifications_to_the_client(stack: Stack) -> None:
    """The final answer of 300 tokens at 20 ms a token takes about 6 s, thirty times the 0.2 s
    progress interval this stack is given (it relied on 6 s beating the default 5 s)."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    result = _payload(
        call(
            stack, "run", {"task": "long otters", "maxTokens": 300, "timeout": 60}, progress_callback=progress
        )
    )
    assert result["runs"][0]["state"] == "completed", result
    assert len(seen) >= 2, "progress notifications did not keep coming during a wait of seconds"
    values = [value for value, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing
    assert all(total == 60 for _, total, _ in seen)
    assert seen[0][2] == "0 of 1 runs finished"


@on_the_file_journal("stack")
def test_decide_with_labels_scores_the_labels_by_first_token_logprobs(stack: Stack) -> None:
    labels = ["positive", "negative", "neutral", "ok"]
    arguments = {"input": "The otters were delightful", "labels": labels}
    first = _payload(call(stack, "decide", arguments))
    assert first["mode"] == "labels" and first["model"] == stack.model
    # "ok" is shorter than the simulator's three-letter words: never among its candidates.
    assert first["unscored"] == ["ok"]
    assert set(first["probabilities"]) == {"positive", "negative", "neutral"}
    assert math.isclose(sum(first["probabilities"].values()), 1.0, abs_tol=1e-4)
    assert first["label"] == max(first["probabilities"], key=first["probabilities"].get)
    # The same prompt gets the same verdict; the simulator's verdict varies between inputs.
    assert _payload(call(stack, "decide", arguments)) == first
    verdicts = {
        _payload(call(stack, "decide", {"input": f"otter number {i}", "labels": labels[:3]}))["label"]
        for i in range(8)
    }
    assert len(verdicts) > 1, verdicts


def test_the_label_prompt_puts_the_labels_where_the_simulator_scores() -> None:
    labels = ["alpha", "beta", "gamma"]
    assert words_of(label_prompt("whatever input text", labels))[:3] == labels


def test_score_labels_sums_token_variants_and_normalizes_over_scored_labels() -> None:
    top = [
        {"token": "Yes", "logprob": math.log(0.5)},
        {"token": " yes", "logprob": math.log(0.1)},
        {"token": "No", "logprob": math.log(0.2)},
        {"token": "very", "logprob": math.log(0.1)},  # prefix of two labels: ambiguous, ignored
        {"token": "Maybe", "logprob": math.log(0.05)},
    ]
    scored = score_labels(top, ["yes", "no", "very good", "very bad", "unknown"])
    assert scored["label"] == "yes"
    assert scored["probabilities"] == {"yes": pytest.approx(0.75), "no": pytest.approx(0.25)}
    assert scored["unscored"] == ["very good", "very bad", "unknown"]
    assert score_labels([], ["a", "b"]) == {"label": None, "probabilities": {}, "unscored": ["a", "b"]}


@on_the_file_journal("stack")
def test_decide_without_labels_asks_the_single_pass_replica(stack: Stack) -> None:
    result = call(stack, "decide", {"input": "Is this spam?"})
    payload = _payload(result)
    assert payload["mode"] == "single-pass" and payload["model"] == CLASSIFIER
    assert payload["label"] in CLASSES
    assert payload["numClasses"] == len(CLASSES)
    assert math.isclose(sum(payload["probs"]), 1.0, abs_tol=1e-6)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"input": "x", "labels": ["only"]}, "labels"),
        ({"input": "x", "labels": ["same", "same"]}, "distinct"),
        ({"input": "x", "labels": ["Yes", "yes", "no"]}, "distinct ignoring case: 'Yes' and 'yes'"),
        ({"input": "x", "labels": [f"label{i}" for i in range(21)]}, "labels"),
        ({"input": "x", "model": "no-such-model"}, "no single-pass replica"),
        ({"input": "x", "labels": ["good", "bad"], "model": CLASSIFIER}, CLASSIFIER),
    ],
    ids=[
        "one-label",
        "duplicates",
        "case-duplicates",
        "21-labels",
        "unknown-single-pass",
        "labels-on-a-classifier",
    ],
)
@on_the_file_journal("stack")
def test_decide_refuses_bad_input(stack: Stack, arguments: dict[str, Any], expected: str) -> None:
    result = call(stack, "decide", arguments)
    assert result.is_error
    assert expected in _text(result), _text(result)


def test_decide_waits_out_a_429_like_a_turn_does() -> None:
    """A 429 from the dataplane failed ``decide`` at once; it is now retried after Retry-After.
    The dataplane here is the client's transport seam (an ``httpx2.MockTransport``)."""
    import httpx2

    from luftpause.runtime.dataplane import DataplaneClient
    from luftpause.runtime.decide import Decider

    answers = [
        httpx2.Response(429, json={"error": {"message": "queue full"}}, headers={"Retry-After": "0"}),
        httpx2.Response(200, json={"data": [{"label": "spam", "probs": [0.9, 0.1], "num_classes": 2}]}),
    ]
    seen: list[str] = []

    def dataplane(request: httpx2.Request) -> httpx2.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/decide")
        seen.append(request.headers["x-luftpause-caller"])
        return answers.pop(0)

    async def scenario() -> dict[str, Any]:
        transport = httpx2.MockTransport(dataplane)
        async with DataplaneClient("http://dataplane.test", transport=transport) as client:
            return await Decider(client).single_pass("buy now", "clf", "Zoë\r\n")

    result = asyncio.run(scenario())
    assert result["label"] == "spam"
    assert seen == ["Zo%C3%AB%0D%0A"] * 2  # the caller header is encoded as for turns
