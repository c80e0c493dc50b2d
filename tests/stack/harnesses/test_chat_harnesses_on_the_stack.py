"""Harnesses that speak Chat Completions, run for real against a stack with ``LUFTPAUSE_TOKEN`` set,
configured as ``docs/harnesses.md`` says: ``llm``, aider and fast-agent (PyPI), opencode (npm).
Each sends its turns to ``/v1/chat/completions`` with the token and the ``x-luftpause-*`` headers
from its configuration, which the scheduler sees as the turns' class and caller.

Skipped, saying why, where a harness is not installed: ``llm``, aider and fast-agent each in a venv
of its own under ``~/.cache/luftpause/pyharnesses`` (``python3 -m venv .../llm &&
.../llm/bin/pip install llm``; ``aider-chat`` in ``.../aider``; ``fast-agent-mcp`` in
``.../fastagent``, with Python 3.12 or later), or the executable in ``LUFTPAUSE_LLM``,
``LUFTPAUSE_AIDER``, ``LUFTPAUSE_FAST_AGENT``; opencode with the npm harnesses (``npm install
--prefix ~/.cache/luftpause/harnesses opencode-ai``, or ``LUFTPAUSE_HARNESSES_DIR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_runs import HARNESSES_ENV, harness_bin

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "chat-harness-token"
LLM_ENV = "LUFTPAUSE_LLM"
AIDER_ENV = "LUFTPAUSE_AIDER"
FAST_AGENT_ENV = "LUFTPAUSE_FAST_AGENT"


def _llm() -> str:
    path = os.environ.get(LLM_ENV) or os.path.expanduser("~/.cache/luftpause/pyharnesses/llm/bin/llm")
    if not os.access(path, os.X_OK):
        pytest.skip(
            f"llm is not installed: python3 -m venv ~/.cache/luftpause/pyharnesses/llm && "
            f"~/.cache/luftpause/pyharnesses/llm/bin/pip install llm (or set {LLM_ENV})"
        )
    return path


def _opencode() -> str:
    path = harness_bin("opencode")
    if path is None:
        pytest.skip(
            "opencode is not installed: npm install --prefix ~/.cache/luftpause/harnesses opencode-ai "
            f"(or set {HARNESSES_ENV})"
        )
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(
        tmp_path_factory.mktemp("chat-harnesses"), env={"LUFTPAUSE_TOKEN": TOKEN}, tool_rounds=1
    )
    try:
        yield running
    finally:
        running.stop()


def _status(stack: Stack) -> dict[str, Any]:
    request = urllib.request.Request(stack.status_url, headers={"authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def test_llm_sends_its_turns_with_the_luftpause_headers(stack: Stack, home: str) -> None:
    exe = _llm()
    caller = f"llm-{uuid.uuid4().hex[:8]}"
    Path(home, "extra-openai-models.yaml").write_text(
        f"""- model_id: luftpause
  model_name: {stack.model}
  api_base: "{stack.dataplane_url}/v1"
  api_key_name: luftpause
  headers:
    x-luftpause-class: batch
    x-luftpause-caller: {caller}
"""
    )
    Path(home, "keys.json").write_text(json.dumps({"luftpause": TOKEN}))  # llm ignores api_key in the YAML
    env = {"PATH": os.environ["PATH"], "HOME": home, "LLM_USER_PATH": home}
    for stream in ([], ["--no-stream"]):
        done = subprocess.run(
            [exe, "-m", "luftpause", *stream, "Say hello"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.startswith("I saw 0 tool results.")  # the simulated engine's words
    status = _status(stack)
    # no run id per session: each prompt is a run of its own, of the class and caller configured
    assert status["runs_by_caller"].get(caller) == 2
    assert status["runs_by_class"]["batch"] >= 2


def test_opencode_sends_its_turns_with_the_luftpause_headers(stack: Stack, home: str) -> None:
    exe = _opencode()
    caller = f"opencode-{uuid.uuid4().hex[:8]}"
    work = Path(home, "work")
    work.mkdir()
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
                # without limit.output opencode sends no max_tokens, and the engine's default applies
                "models": {stack.model: {"name": stack.model, "limit": {"context": 8192, "output": 64}}},
            }
        },
    }
    (work / "opencode.json").write_text(json.dumps(config))
    env = {"PATH": os.environ["PATH"], "HOME": home, "LUFTPAUSE_TOKEN": TOKEN}
    done = subprocess.run(
        [exe, "run", "-m", f"luftpause/{stack.model}", "Say hello"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "I saw" in done.stdout, done.stdout[-3000:]  # the simulated engine's answer, shown
    status = _status(stack)
    # its agent loop's turns are joined by tool-call ids; its side requests (a title) are runs of their own
    assert status["runs_by_caller"].get(caller, 0) >= 1


def _aider() -> str:
    path = os.environ.get(AIDER_ENV) or os.path.expanduser("~/.cache/luftpause/pyharnesses/aider/bin/aider")
    if not os.access(path, os.X_OK):
        pytest.skip(
            "aider is not installed: python3 -m venv ~/.cache/luftpause/pyharnesses/aider && "
            f"~/.cache/luftpause/pyharnesses/aider/bin/pip install aider-chat (or set {AIDER_ENV})"
        )
    return path


def test_aider_sends_its_turns_with_the_luftpause_headers(stack: Stack, home: str) -> None:
    exe = _aider()
    caller = f"aider-{uuid.uuid4().hex[:8]}"
    work = Path(home, "work")
    work.mkdir()
    # litellm's extra_headers, per model: how aider sends the luftpause headers
    (work / ".aider.model.settings.yml").write_text(
        f"""- name: openai/{stack.model}
  extra_params:
    max_tokens: 64
    extra_headers:
      x-luftpause-class: batch
      x-luftpause-caller: {caller}
"""
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": home,
        "OPENAI_API_BASE": f"{stack.dataplane_url}/v1",
        "OPENAI_API_KEY": TOKEN,
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        exe,
        "--model",
        f"openai/{stack.model}",
        "--no-git",
        "--yes-always",
        "--no-check-update",
        "--no-show-model-warnings",
        "--no-analytics",
        "--no-pretty",
        "--no-stream",
        "--message",
        "Say hello",
    ]
    done = subprocess.run(
        cmd, env=env, cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "I saw 0 tool results." in done.stdout, done.stdout[-3000:]
    status = _status(stack)
    assert status["runs_by_caller"].get(caller, 0) >= 1, status["runs_by_caller"]


def _fast_agent() -> str:
    path = os.environ.get(FAST_AGENT_ENV) or os.path.expanduser(
        "~/.cache/luftpause/pyharnesses/fastagent/bin/fast-agent"
    )
    if not os.access(path, os.X_OK):
        pytest.skip(
            "fast-agent is not installed (it needs Python 3.12 or later): python3.12 -m venv "
            "~/.cache/luftpause/pyharnesses/fastagent && ~/.cache/luftpause/pyharnesses/fastagent/bin/pip "
            f"install fast-agent-mcp (or set {FAST_AGENT_ENV})"
        )
    return path


def test_fast_agent_sends_its_turns_with_the_luftpause_headers(stack: Stack, home: str) -> None:
    exe = _fast_agent()
    caller = f"fast-agent-{uuid.uuid4().hex[:8]}"
    work = Path(home, "work")
    work.mkdir()
    (work / "fastagent.config.yaml").write_text(
        f"""generic:
  api_key: {TOKEN}
  base_url: {stack.dataplane_url}/v1
  default_headers:
    x-luftpause-class: batch
    x-luftpause-caller: {caller}
"""
    )
    done = subprocess.run(
        [exe, "go", "--model", f"generic.{stack.model}", "--message", "Say hello", "--quiet"],
        env={"PATH": os.environ["PATH"], "HOME": home},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("I saw 0 tool results."), done.stdout[-3000:]
    assert _status(stack)["runs_by_caller"].get(caller) == 1
