"""Claude Code and Codex CLI (from npm, ``LUFTPAUSE_HARNESSES_DIR``) run for real against a whole
stack with ``LUFTPAUSE_TOKEN`` set, configured as ``docs/harnesses.md`` says: each harness's model
turns go through the dataplane (Claude Code's to ``/v1/messages``, Codex's to ``/v1/responses``,
translated to the scripted engine's Chat Completions), it calls the runtime's ``spawn`` and
``await`` over MCP, and the whole session is one run at the scheduler. opencode and fast-agent
likewise over Chat Completions.

Skipped, saying why, where npm's harnesses are not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dataplane_procs import fake_engine
from harness_runs import HARNESSES_ENV, harness_bin
from harness_stack import (
    HARNESS_MODEL,
    Endpoints,
    OrchestratingEngine,
    run_claude_code,
    run_codex,
)

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "harness-token"
NATIVE_MODEL = "native-sim"
"""Served by a simulated engine that speaks Messages and Responses itself: relayed unchanged."""


def _require(name: str) -> None:
    if harness_bin(name) is None:
        pytest.skip(
            f"{name} is not installed: npm install --prefix ~/.cache/luftpause/harnesses "
            f"@anthropic-ai/claude-code @openai/codex (or set {HARNESSES_ENV})"
        )


@pytest.fixture(scope="module")
def engine() -> Iterator[OrchestratingEngine]:
    running = OrchestratingEngine().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, engine: OrchestratingEngine) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("harnesses")
    native_args = ("--model", NATIVE_MODEL, "--apis", "messages,responses", "--tool-rounds", "0")
    with fake_engine(workdir, args=native_args, name="native") as native:
        extra = f"""
[[replicas]]
name = "orchestrator"
url = "{engine.url}"
models = ["{HARNESS_MODEL}"]
health_path = ""

[[replicas]]
name = "native"
url = "{native}"
models = ["{NATIVE_MODEL}"]
apis = ["chat", "messages", "responses"]
"""
        running = Stack.start(workdir, extra_config=extra, env={"LUFTPAUSE_TOKEN": TOKEN})
        try:
            yield running
        finally:
            running.stop()


def _endpoints(stack: Stack, caller: str) -> Endpoints:
    return Endpoints(stack.dataplane_url, stack.runtime_url, TOKEN, caller)


def _status(stack: Stack) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(stack.status_url, headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def _orchestrated(engine: OrchestratingEngine, since: int) -> list[str]:
    """The tools the scripted model saw called and answered in the requests after ``since``."""
    names = []
    for body in engine.recorded()[since:]:
        for message in body.get("messages", []):
            for call in message.get("tool_calls") or ():
                names.append(call["function"]["name"])
    return list(dict.fromkeys(names))


def test_claude_code_orchestrates_a_sub_agent_through_luftpause(
    stack: Stack, engine: OrchestratingEngine, home: str
) -> None:
    _require("claude")
    caller = f"claude-{uuid.uuid4().hex[:8]}"
    since = len(engine.recorded())
    run = run_claude_code(
        _endpoints(stack, caller), home, "Have a sub-agent say hello, and tell me what it said."
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["is_error"] is False, result
    assert result["result"].startswith("the sub-agent answered: I saw "), (
        result
    )  # the simulated model's words
    # it really went through the runtime: spawn, then await, each answered
    assert _orchestrated(engine, since) == ["mcp__luftpause__spawn", "mcp__luftpause__await"]
    turns = engine.recorded()[since:]
    assert len(turns) >= 3 and all(t["model"] == HARNESS_MODEL for t in turns)
    status = _status(stack)
    assert status["runs_by_caller"].get(caller) == 1, status["runs_by_caller"]  # the session: one run


def test_codex_orchestrates_a_sub_agent_through_luftpause(
    stack: Stack, engine: OrchestratingEngine, home: str
) -> None:
    _require("codex")
    caller = f"codex-{uuid.uuid4().hex[:8]}"
    since = len(engine.recorded())
    run = run_codex(_endpoints(stack, caller), home, "Have a sub-agent say hello, and tell me what it said.")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    calls = [
        (e["item"]["server"], e["item"]["tool"], e["item"]["status"])
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "mcp_tool_call"
    ]
    assert calls == [("luftpause", "spawn", "completed"), ("luftpause", "await", "completed")], (
        run.stdout[-3000:],
        run.stderr[-3000:],
    )
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages and messages[-1].startswith("the sub-agent answered: I saw "), messages
    assert events[-1]["type"] == "turn.completed"
    assert _orchestrated(engine, since) == ["mcp__luftpause__spawn", "mcp__luftpause__await"]
    status = _status(stack)
    assert status["runs_by_caller"].get(caller) == 1, status["runs_by_caller"]


def test_both_harnesses_take_a_natively_served_answer_relayed_unchanged(stack: Stack, home: str) -> None:
    """A replica that serves Messages and Responses itself: the harnesses' turns reach it as they
    sent them, and its answers reach them unchanged (a simulated engine's text)."""
    for name in ("claude", "codex"):
        _require(name)
    at = Endpoints(stack.dataplane_url, stack.runtime_url, TOKEN, "native")
    claude = run_claude_code(at, home, "Say hello", model=NATIVE_MODEL, mcp=False)
    assert claude.returncode == 0, claude.stdout[-3000:] + claude.stderr[-3000:]
    assert json.loads(claude.stdout)["result"].startswith("I saw 0 tool results.")
    codex = run_codex(at, home, "Say hello", model=NATIVE_MODEL, mcp=False)
    assert codex.returncode == 0, codex.stdout[-3000:] + codex.stderr[-3000:]
    events = [json.loads(line) for line in codex.stdout.splitlines() if line.startswith("{")]
    said = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert said and said[-1].startswith("I saw 0 tool results."), codex.stdout[-3000:]


def test_opencode_orchestrates_a_sub_agent_through_luftpause(
    stack: Stack, engine: OrchestratingEngine, home: str
) -> None:
    """opencode both ways: its turns to ``/v1/chat/completions`` (no translation), the runtime as its
    remote MCP server."""
    exe = harness_bin("opencode")
    if exe is None:
        pytest.skip(
            "opencode is not installed: npm install --prefix ~/.cache/luftpause/harnesses opencode-ai "
            f"(or set {HARNESSES_ENV})"
        )
    caller = f"opencode-{uuid.uuid4().hex[:8]}"
    work = os.path.join(home, "work")
    os.makedirs(work)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "luftpause": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "luftpause",
                "options": {
                    "baseURL": f"{stack.dataplane_url}/v1",
                    "apiKey": "{env:LUFTPAUSE_TOKEN}",
                    "headers": {"x-luftpause-class": "interactive", "x-luftpause-caller": caller},
                },
                "models": {HARNESS_MODEL: {"name": HARNESS_MODEL, "limit": {"context": 8192, "output": 256}}},
            }
        },
        "mcp": {
            "luftpause": {
                "type": "remote",
                "url": stack.runtime_url,
                "headers": {"Authorization": "Bearer {env:LUFTPAUSE_TOKEN}"},
                "enabled": True,
            }
        },
    }
    with open(os.path.join(work, "opencode.json"), "w") as f:
        json.dump(config, f)
    since = len(engine.recorded())
    done = subprocess.run(
        [exe, "run", "-m", f"luftpause/{HARNESS_MODEL}", "Have a sub-agent say hello"],
        env={"PATH": os.environ["PATH"], "HOME": home, "LUFTPAUSE_TOKEN": TOKEN},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the sub-agent answered: I saw " in done.stdout, done.stdout[-3000:]
    called = _orchestrated(engine, since)
    assert [name.rsplit("_", 1)[-1] for name in called] == ["spawn", "await"], called


def test_fast_agent_orchestrates_a_sub_agent_through_luftpause(
    stack: Stack, engine: OrchestratingEngine, home: str
) -> None:
    """fast-agent both ways: its turns to ``/v1/chat/completions``, the runtime as its HTTP MCP
    server (``fastagent.config.yaml``)."""
    exe = os.environ.get("LUFTPAUSE_FAST_AGENT") or os.path.expanduser(
        "~/.cache/luftpause/pyharnesses/fastagent/bin/fast-agent"
    )
    if not os.access(exe, os.X_OK):
        pytest.skip(
            "fast-agent is not installed (Python 3.12 or later): python3.12 -m venv "
            "~/.cache/luftpause/pyharnesses/fastagent && .../bin/pip install fast-agent-mcp "
            "(or set LUFTPAUSE_FAST_AGENT)"
        )
    caller = f"fast-agent-{uuid.uuid4().hex[:8]}"
    work = os.path.join(home, "work")
    os.makedirs(work)
    with open(os.path.join(work, "fastagent.config.yaml"), "w") as f:
        f.write(
            f"""generic:
  api_key: {TOKEN}
  base_url: {stack.dataplane_url}/v1
  default_headers:
    x-luftpause-class: interactive
    x-luftpause-caller: {caller}
mcp:
  servers:
    luftpause:
      transport: http
      url: {stack.runtime_url}
      headers:
        Authorization: Bearer {TOKEN}
"""
        )
    since = len(engine.recorded())
    done = subprocess.run(
        [
            exe,
            "go",
            "--model",
            f"generic.{HARNESS_MODEL}",
            "--servers",
            "luftpause",
            "--message",
            "Have a sub-agent say hello",
            "--quiet",
        ],
        env={"PATH": os.environ["PATH"], "HOME": home},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the sub-agent answered: I saw " in done.stdout, done.stdout[-3000:]
    called = _orchestrated(engine, since)
    assert [name.rsplit("_", 1)[-1] for name in called] == ["spawn", "await"], called
    assert _status(stack)["runs_by_caller"].get(caller) == 1  # one agent loop, joined by tool-call ids
