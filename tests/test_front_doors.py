"""``POST /v1/messages`` and ``POST /v1/responses`` on the dataplane, driven by the official
``anthropic`` and ``openai`` clients against real processes (``front_door_helpers``): each turn is
translated to Chat Completions for a replica that speaks only that, or relayed unchanged to one that
serves the API natively; either way it is scheduled like a chat turn (run identity, class, caller),
and ``GET /v1/models`` answers in the client's shape.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest
from front_door_helpers import NATIVE, TOKEN, TRANSLATED, FrontDoorStack, front_door_stack, sse_events

pytestmark = pytest.mark.integration

COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
MESSAGES_TOOLS: Any = [{"name": "count", "description": "counts things", "input_schema": COUNT}]
RESPONSES_TOOLS: Any = [{"type": "function", "name": "count", "parameters": COUNT, "strict": False}]
PATHS = pytest.mark.parametrize("model", [TRANSLATED, NATIVE], ids=["translated", "native"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoorStack]:
    with front_door_stack(tmp_path_factory.mktemp("front-doors")) as running:
        yield running


@pytest.fixture
def claude(stack: FrontDoorStack) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=stack.url, api_key=TOKEN, max_retries=0)  # sent as x-api-key
    yield client
    client.close()


@pytest.fixture
def openai_client(stack: FrontDoorStack) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=TOKEN, max_retries=0)  # as a bearer token
    yield client
    client.close()


def _caller() -> str:
    return f"caller-{uuid.uuid4().hex[:8]}"


def _runs_of(stack: FrontDoorStack, caller: str) -> int:
    return int(stack.status()["runs_by_caller"].get(caller, 0))


@PATHS
def test_a_messages_tool_round_streams_through_the_anthropic_client_as_one_run(
    stack: FrontDoorStack, claude: anthropic.Anthropic, model: str
) -> None:
    caller = _caller()
    headers = {"x-luftpause-caller": caller, "x-luftpause-class": "batch"}
    prompt: Any = [{"role": "user", "content": "count the things"}]
    with claude.messages.stream(
        model=model, max_tokens=60, messages=prompt, tools=MESSAGES_TOOLS, extra_headers=headers
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
        run_id = stream.response.headers["x-luftpause-run-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "count" and isinstance(call.input["n"], int)
    # translated: the engine's chat tool-call id, unchanged; native: the engine's own toolu_ id
    assert call.id.startswith("call_" if model == TRANSLATED else "toolu_")
    assert run_id.startswith("run-")
    # The tool round's answer names no run: the echoed tool_use id finds it.
    answer = claude.messages.with_raw_response.create(
        model=model,
        max_tokens=12,
        tools=MESSAGES_TOOLS,
        extra_headers=headers,
        messages=[
            *prompt,
            {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in message.content],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"}]},
        ],
    )
    assert answer.headers["x-luftpause-run-id"] == run_id
    parsed = answer.parse()
    assert parsed.content[0].type == "text" and parsed.content[0].text.startswith("I saw 1 tool result.")
    assert _runs_of(stack, caller) == 1
    assert stack.status()["runs_by_class"]["batch"] >= 1


@PATHS
def test_a_responses_tool_round_streams_through_the_openai_client_as_one_run(
    stack: FrontDoorStack, openai_client: openai.OpenAI, model: str
) -> None:
    caller = _caller()
    headers = {"x-luftpause-caller": caller}
    with openai_client.responses.with_streaming_response.create(
        model=model, input="count the things", tools=RESPONSES_TOOLS, stream=True, extra_headers=headers
    ) as raw:
        run_id = raw.headers["x-luftpause-run-id"]
        events = list(raw.parse())
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    call = completed.response.output[-1]
    assert call.type == "function_call" and call.name == "count"
    answer = openai_client.responses.with_raw_response.create(
        model=model,
        tools=RESPONSES_TOOLS,
        extra_headers=headers,
        input=[
            {"role": "user", "content": "count the things"},
            {"type": "function_call", "call_id": call.call_id, "name": "count", "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
        ],
    )
    assert answer.headers["x-luftpause-run-id"] == run_id
    assert answer.parse().output_text.startswith("I saw 1 tool result.")
    assert _runs_of(stack, caller) == 1


def test_a_native_answer_reaches_the_client_byte_for_byte(stack: FrontDoorStack) -> None:
    """What the native engine sent is what the client got: nothing re-framed, nothing added."""
    import httpx2

    body = {
        "model": NATIVE,
        "max_tokens": 20,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx2.Client(timeout=30) as http:
        got = http.post(f"{stack.url}/v1/messages", json=body, headers={"x-api-key": TOKEN}).content
        message_id = sse_events(got)[0]["message"]["id"]
        assert got == stack.sent("native", message_id)
        body = {"model": NATIVE, "stream": True, "input": "hi"}
        got = http.post(
            f"{stack.url}/v1/responses", json=body, headers={"authorization": f"Bearer {TOKEN}"}
        ).content
        assert got == stack.sent("native", sse_events(got)[0]["response"]["id"])


@PATHS
def test_whole_answers_in_both_apis(
    claude: anthropic.Anthropic, openai_client: openai.OpenAI, model: str
) -> None:
    """Not streamed: Claude Code asks so when it retries a broken stream."""
    message = claude.messages.create(model=model, max_tokens=7, messages=[{"role": "user", "content": "hi"}])
    assert message.type == "message" and message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 7 and message.content[0].type == "text"
    response = openai_client.responses.create(model=model, input="hi", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_the_beta_route_of_the_anthropic_client(claude: anthropic.Anthropic) -> None:
    """``client.beta.messages`` posts to ``/v1/messages?beta=true``, as Claude Code does."""
    message = claude.beta.messages.create(
        model=TRANSLATED, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].type == "text"


def test_claude_codes_session_headers_name_the_run(claude: anthropic.Anthropic) -> None:
    session = str(uuid.uuid4())
    headers = {"X-Claude-Code-Session-Id": session}
    ask: Any = [{"role": "user", "content": "hi"}]
    main = claude.messages.with_raw_response.create(
        model=TRANSLATED, max_tokens=3, messages=ask, extra_headers=headers
    )
    assert main.headers["x-luftpause-run-id"] == f"claude-code:{session}"
    agent = claude.messages.with_raw_response.create(
        model=NATIVE,
        max_tokens=3,
        messages=ask,
        extra_headers={**headers, "X-Claude-Code-Agent-Id": "a0123456789abcdef"},
    )
    assert agent.headers["x-luftpause-run-id"] == f"claude-code:{session}:a0123456789abcdef"
    # without the headers (a proxy in between dropped them), the body's session
    user = orjson.dumps({"device_id": "d", "session_id": session}).decode()
    body = claude.messages.with_raw_response.create(
        model=TRANSLATED, max_tokens=3, messages=ask, metadata={"user_id": user}
    )
    assert body.headers["x-luftpause-run-id"] == f"claude-code:{session}"
    # the client's own run id wins over all of them
    named = claude.messages.with_raw_response.create(
        model=TRANSLATED, max_tokens=3, messages=ask, extra_headers={**headers, "x-luftpause-run-id": "mine"}
    )
    assert named.headers["x-luftpause-run-id"] == "mine"


def test_codexs_thread_header_names_the_run(openai_client: openai.OpenAI) -> None:
    thread = str(uuid.uuid4())
    answer = openai_client.responses.with_raw_response.create(
        model=TRANSLATED, input="hi", extra_headers={"session-id": "root", "thread-id": thread}
    )
    assert answer.headers["x-luftpause-run-id"] == f"codex:{thread}"
    keyed = openai_client.responses.with_raw_response.create(model=NATIVE, input="hi", prompt_cache_key="k-1")
    assert keyed.headers["x-luftpause-run-id"] == "prompt-cache-key:k-1"


def test_the_model_list_in_each_clients_shape(
    claude: anthropic.Anthropic, openai_client: openai.OpenAI
) -> None:
    anthropic_models = claude.models.list()
    assert [m.id for m in anthropic_models.data][:1] == [TRANSLATED]
    assert all(m.type == "model" for m in anthropic_models.data) and anthropic_models.has_more is False
    assert claude.models.retrieve(NATIVE).id == NATIVE
    openai_models = [m.id for m in openai_client.models.list()]
    assert TRANSLATED in openai_models and NATIVE in openai_models
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.models.retrieve("no-such-model")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_an_untranslatable_request_is_refused_400_in_its_apis_shape(
    claude: anthropic.Anthropic, openai_client: openai.OpenAI
) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=TRANSLATED,
            max_tokens=5,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"container": "c-1"},
        )
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": refused.value.body["error"]["message"]},  # type: ignore[index]
    }
    assert "'container'" in refused.value.message
    with pytest.raises(openai.BadRequestError) as previous:
        openai_client.responses.create(model=TRANSLATED, input="hi", previous_response_id="resp_1")
    assert previous.value.param == "previous_response_id"
    assert previous.value.code is None and "stores no responses" in previous.value.message
    # A model every replica of which serves the API natively is not translated: the engine judges.
    native = openai_client.responses.create(
        model=NATIVE, input="hi", extra_body={"service_tier": "x", "store": True}
    )
    assert native.status == "completed"


def test_the_token_as_x_api_key_or_bearer_and_401_in_each_shape(stack: FrontDoorStack) -> None:
    wrong = anthropic.Anthropic(base_url=stack.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model=TRANSLATED, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    wrong.close()
    bearer = anthropic.Anthropic(base_url=stack.url, auth_token=TOKEN, max_retries=0)  # ANTHROPIC_AUTH_TOKEN
    assert bearer.messages.create(
        model=NATIVE, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    ).content
    bearer.close()
    other = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        other.responses.create(model=TRANSLATED, input="hi")
    assert denied.value.code == "invalid_api_key"
    other.close()
