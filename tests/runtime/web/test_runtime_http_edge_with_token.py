"""The runtime's HTTP edge with ``LUFTPAUSE_TOKEN`` set, on a whole stack of real processes.

Every child gets the token, so the dataplane requires it on ``/v1`` too: a run that completes with
tool calls proves the runtime sent it on its turns. Also here, because they need a running runtime:
JSON error bodies for 401, 404 and 405, and ``spawn`` / ``await`` refusing bad numbers and unknown
models at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.types import CallToolResult, TextContent
from repo_paths import ROOT

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack.start(tmp_path_factory.mktemp("guarded"), env={"LUFTPAUSE_TOKEN": TOKEN})
    try:
        yield stack
    finally:
        stack.stop()


def _base(stack: Stack) -> str:
    return stack.runtime_url.removesuffix("/mcp")


def _http(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _error_message(headers: dict[str, str], body: bytes) -> str:
    """The message of a JSON error body ``{"error": {"message": ...}}``; fails on any other shape."""
    assert headers["content-type"].startswith("application/json"), headers
    message = json.loads(body)["error"]["message"]
    assert isinstance(message, str) and message
    return message


INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
).encode()
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"],
    ids=["none", "wrong", "other-scheme", "longer", "empty"],
)
def test_mcp_and_status_refuse_a_missing_or_wrong_token_with_json_401(
    guarded: Stack, authorization: str | None
) -> None:
    auth = {"authorization": authorization} if authorization is not None else {}
    for method, path, headers, body in [
        ("POST", "/mcp", {**MCP_HEADERS, **auth}, INITIALIZE),
        ("GET", "/status", auth, None),
        ("GET", "/no-such-path", auth, None),
    ]:
        status, got, raw = _http(method, _base(guarded) + path, headers, body)
        assert status == 401, (path, raw)
        assert "LUFTPAUSE_TOKEN" in _error_message(got, raw)
        assert got["www-authenticate"].startswith("Bearer")
        if path == "/mcp":  # also a JSON-RPC error, so MCP clients show the message
            assert json.loads(raw)["jsonrpc"] == "2.0"


def test_health_stays_open_and_the_right_token_opens_status(guarded: Stack) -> None:
    status, _, body = _http("GET", _base(guarded) + "/health")
    assert (status, json.loads(body)) == (200, {"ok": True})
    status, headers, body = _http("GET", _base(guarded) + "/status", {"authorization": f"bearer {TOKEN}"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert "runs" in json.loads(body)


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def test_a_client_with_the_token_spawns_runs_whose_turns_pass_the_guarded_dataplane(guarded: Stack) -> None:
    async def scenario() -> dict[str, Any]:
        async with runtime_client(guarded.runtime_url, TOKEN) as client:
            handles = [
                _payload(await client.call_tool("spawn", {"task": f"Research topic {i}."}))["handle"]
                for i in range(2)
            ]
            return _payload(
                await client.call_tool("await", {"handles": handles, "timeout": 60}, read_timeout_seconds=90)
            )

    result = asyncio.run(scenario())
    assert result["timedOut"] is False
    for run in result["runs"]:
        # A turn without the token would be the dataplane's 401 and fail the run.
        assert run["state"] == "completed", (run, guarded.logs())
        assert run["toolCalls"] >= 1 and run["turns"] == run["toolCalls"] + 1
    runtime_log = Path(guarded.children["runtime"].log_path or "").read_text()
    assert "refused the end" not in runtime_log  # DELETE /v1/runs/{id} carried the token as well


def test_unknown_paths_and_wrong_methods_answer_the_json_error_body(guarded: Stack) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    status, headers, body = _http("GET", _base(guarded) + "/no-such-path", auth)
    assert status == 404
    assert _error_message(headers, body) == "no route GET /no-such-path"

    status, headers, body = _http("POST", _base(guarded) + "/status", auth, b"{}")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    assert _error_message(headers, body) == "/status takes GET, HEAD, not POST"

    # /mcp's own refusals are the SDK's JSON-RPC error objects, which carry error.message too.
    status, headers, body = _http("PUT", _base(guarded) + "/mcp", {**auth, **MCP_HEADERS}, b"{}")
    assert status == 405
    assert "POST" in headers["allow"]
    assert _error_message(headers, body)


def test_spawn_and_await_refuse_bad_numbers_and_unknown_models_at_once(guarded: Stack) -> None:
    refused_spawns: list[tuple[dict[str, Any], str]] = [
        ({"maxToolCalls": 10**30}, "maxToolCalls"),
        ({"maxToolCalls": 1001}, "maxToolCalls"),
        ({"maxToolCalls": -1}, "maxToolCalls"),
        ({"maxTokens": 10**12}, "maxTokens"),
        ({"model": "no-such-model"}, "no-such-model"),
    ]

    async def scenario() -> tuple[list[CallToolResult], list[CallToolResult], int]:
        async with runtime_client(guarded.runtime_url, TOKEN) as client:
            before = len(_payload(await client.call_tool("status", {}))["runs"])
            spawns = [await client.call_tool("spawn", {"task": "x", **extra}) for extra, _ in refused_spawns]
            handle = _payload(await client.call_tool("spawn", {"task": "Short one.", "maxTokens": 16}))[
                "handle"
            ]
            waits = [
                await client.call_tool("await", {"handles": [handle], "timeout": timeout})
                for timeout in ("NaN", "Infinity", "-Infinity")
            ]
            await client.call_tool("await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90)
            after = len(_payload(await client.call_tool("status", {}))["runs"])
            return spawns, waits, after - before

    spawns, waits, added = asyncio.run(scenario())
    for result, (_, named) in zip(spawns, refused_spawns, strict=True):
        assert result.is_error and named in _text(result), _text(result)
    unknown_model = _text(spawns[-1])
    assert "no-such-model" in unknown_model and DEFAULT_MODEL in unknown_model  # names what is served
    for result in waits:
        assert result.is_error and "finite" in _text(result), _text(result)
    assert added == 1  # only the good spawn made a run

    # The page that a 10**30 once broke for ever still answers.
    status, headers, body = _http("GET", _base(guarded) + "/status", {"authorization": f"Bearer {TOKEN}"})
    assert (status, headers["content-type"]) == (200, "application/json"), body
    assert all(run["own"]["toolCalls"] <= 1000 for run in json.loads(body)["runs"])


def test_loadgen_sends_the_token_from_the_environment(guarded: Stack) -> None:
    argv = [sys.executable, "-m", "luftpause", "loadgen", "--runtime", guarded.runtime_url]
    argv += ["--spawn", "2", "--timeout", "120", "--json"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=180, env={**os.environ, "LUFTPAUSE_TOKEN": TOKEN}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert (summary["spawned"], summary["completed"]) == (2, 2)

    refused = subprocess.run(
        [*argv, "--token", "wrong"], capture_output=True, text=True, timeout=180, env=os.environ.copy()
    )
    assert refused.returncode == 1
    assert "missing or wrong bearer token" in refused.stderr, refused.stderr  # our message, not the SDK's


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"],
)
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/chat/completions"), ("GET", "/v1/models")])
def test_the_dataplane_refuses_v1_routes_without_the_token_with_json_401(
    guarded: Stack, authorization: str | None, method: str, path: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    code, answer_headers, answer = _http(method, f"{guarded.dataplane_url}{path}", headers=headers)
    assert code == 401
    assert answer_headers["www-authenticate"] == 'Bearer realm="luftpause"'  # RFC 6750 section 3
    assert answer_headers["content-type"] == "application/json"
    assert "bearer token" in json.loads(answer)["error"]["message"]


def test_the_dataplane_serves_v1_routes_with_the_token_and_health_without(guarded: Stack) -> None:
    code, _, answer = _http(
        "GET", f"{guarded.dataplane_url}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert code == 200 and json.loads(answer)["data"]
    code, _, _ = _http("GET", f"{guarded.dataplane_url}/health")
    assert code == 200


README = ROOT / "README.md"


def _readme_python_block(marker: str) -> str:
    """The README's one ```python block that contains ``marker``."""
    blocks = [b.split("```", 1)[0] for b in README.read_text().split("```python\n")[1:]]
    (block,) = [b for b in blocks if marker in b]
    return block


def test_the_readme_s_mcp_client_snippet_spawns_and_awaits_a_run_with_the_token(
    guarded: Stack, tmp_path: Path
) -> None:
    snippet = _readme_python_block("from mcp import Client")
    assert 'URL = "http://127.0.0.1:7000/mcp"' in snippet
    script = tmp_path / "mcp_snippet.py"
    script.write_text(snippet.replace("http://127.0.0.1:7000/mcp", guarded.runtime_url))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LUFTPAUSE_TOKEN": TOKEN},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    state, _, answer = done.stdout.partition(" ")
    assert state == "completed" and answer.strip(), done.stdout
