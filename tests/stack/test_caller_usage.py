"""Tokens per caller key and model (docs/operating-metrics.md "Usage per caller key"), on a real
stack with caller keys and the shared token: the usage each key's turns reported to its client is
what the dataplane's ``GET /admin/usage``, ``GET /status`` and its counters say, a sub-caller
counts for its key, and only the operator's token reads the figures."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import openai
import pytest
from caller_keys_helpers import TEAM_A, TEAM_B, TEAMS, keyed_stack, keys_file
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "operator-token-of-the-stack"
KEYS_FILE = keys_file(
    TEAMS[0], {"caller": "team-b", "key_sha256": hashlib.sha256(TEAM_B.encode()).hexdigest()}
)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with keyed_stack(
        tmp_path_factory.mktemp("usage"), KEYS_FILE, token=TOKEN, dataplane="usage_window_s = 60\n"
    ) as stack:
        yield stack


def _turns(stack: Stack, key: str, count: int, caller: str | None = None) -> tuple[int, int]:
    """``count`` turns with ``key`` (half streamed with usage, half whole): the prompt and
    completion tokens their answers reported to the client."""
    client = openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key=key, max_retries=0)
    headers = {"x-luftpause-caller": caller} if caller else {}
    prompt = completion = 0
    for n in range(count):
        messages = [{"role": "user", "content": f"turn {n} " + "words " * n}]
        if n % 2:
            stream = client.chat.completions.create(
                model=stack.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=headers,
            )
            usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
        else:
            whole = client.chat.completions.create(
                model=stack.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=12,
                extra_headers=headers,
            )
            assert whole.usage is not None
            usage = whole.usage
        prompt += usage.prompt_tokens
        completion += usage.completion_tokens
    return prompt, completion


def _get(stack: Stack, path: str, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{stack.dataplane_url}{path}", headers=headers, timeout=30)


def test_each_keys_tokens_are_what_its_clients_were_told_on_every_surface(keyed: Stack) -> None:
    a_prompt, a_completion = _turns(keyed, TEAM_A, 4)
    sub_prompt, sub_completion = _turns(keyed, TEAM_A, 2, caller="team-a/nightly-7")  # narrowed
    b_prompt, b_completion = _turns(keyed, TEAM_B, 3, caller="team-a")  # cannot pose as team-a
    expected = {
        "team-a": (a_prompt + sub_prompt, a_completion + sub_completion, 6),
        "team-b": (b_prompt, b_completion, 3),
    }

    usage = _get(keyed, "/admin/usage", TOKEN)
    assert usage.status_code == 200, usage.text
    report = usage.json()
    life = {
        row["caller"]: (row["promptTokens"], row["completionTokens"], row["turns"])
        for row in report["life"]
        if row["model"] == keyed.model
    }
    assert life == expected
    assert report["windowSeconds"] == 60
    assert report["current"]["end"] - report["current"]["start"] == 60
    # the windows hold the same turns (the current one, or the one before if one just began)
    in_windows: dict[str, int] = {}
    for window in ("previous", "current"):
        for row in report[window]["usage"]:
            in_windows[row["caller"]] = in_windows.get(row["caller"], 0) + row["turns"]
    assert in_windows == {"team-a": 6, "team-b": 3}

    status = _get(keyed, "/status", TOKEN)
    assert status.status_code == 200
    assert status.json()["usage"]["life"] == report["life"]

    metrics = _get(keyed, "/metrics", None).text
    counted: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "luftpause_dataplane_tokens_total" and sample.labels["model"] == keyed.model:
                key = (sample.labels["caller"], sample.labels["type"])
                counted[key] = counted.get(key, 0) + sample.value
    for caller, (prompt, completion, _) in expected.items():
        assert counted[(caller, "prompt")] == prompt
        assert counted[(caller, "completion")] == completion


@pytest.mark.parametrize("path", ["/admin/usage", "/status"])
def test_only_the_operators_token_reads_the_usage(keyed: Stack, path: str) -> None:
    for credential in (None, TEAM_A, "wrong"):
        refused = _get(keyed, path, credential)
        assert refused.status_code == 401, (credential, refused.text)
        assert refused.json()["error"]["message"]
        assert refused.headers["www-authenticate"].startswith("Bearer")
    wrong_method = httpx.post(
        f"{keyed.dataplane_url}{path}", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]
