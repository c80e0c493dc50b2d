"""The README's OpenAI and Anthropic client snippets ("Point an agent at it"), run as the README says
(a script under the venv's Python) against a stack on free ports: the OpenAI one streams its answer
and prints the run id it named; the Anthropic one, whose ``base_url`` has no ``/v1``, gets a whole
Messages answer. Both also run with ``LUFTPAUSE_TOKEN`` set, in their environment and on the stack:
they read it (a hard-coded ``api_key="unused"`` got 401 there).
(The MCP snippet is run in ``tests/runtime/web/test_runtime_http_edge_with_token.py``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_paths import ROOT

from luftpause.testkit.launch.stack import Stack

README_DATAPLANE = "http://127.0.0.1:8080"
"""The dataplane's address in the snippets: the one ``luftpause up`` prints (not ``localhost``)."""

TOKEN = "readme-snippet-token"


@pytest.fixture(scope="module")
def guarded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack with ``LUFTPAUSE_TOKEN`` set."""
    with Stack.start(tmp_path_factory.mktemp("readme-token"), env={"LUFTPAUSE_TOKEN": TOKEN}) as running:
        running.wait_connected()
        yield running


@pytest.fixture(params=["without-a-token", "with-a-token"])
def either_stack(request: pytest.FixtureRequest) -> Stack:
    """The shared stack (no token), or :func:`guarded_stack`."""
    name = "guarded_stack" if request.param == "with-a-token" else "stack"
    running: Stack = request.getfixturevalue(name)
    return running


def _readme_python_block(marker: str) -> str:
    """The README's one ```python block that contains ``marker``."""
    blocks = [b.split("```", 1)[0] for b in (ROOT / "README.md").read_text().split("```python\n")[1:]]
    (block,) = [b for b in blocks if marker in b]
    return block


def _run(snippet: str, stack: Stack, tmp_path: Path) -> str:
    assert README_DATAPLANE in snippet
    script = tmp_path / "hello.py"
    script.write_text(snippet.replace(README_DATAPLANE, stack.dataplane_url))
    env = {k: v for k, v in os.environ.items() if k != "LUFTPAUSE_TOKEN"}
    if stack.token:
        env["LUFTPAUSE_TOKEN"] = stack.token
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_openai_snippet_streams_and_prints_its_run(either_stack: Stack, tmp_path: Path) -> None:
    snippet = _readme_python_block("from openai import OpenAI")
    assert f'base_url="{README_DATAPLANE}/v1"' in snippet
    answer, _, run = _run(snippet, either_stack, tmp_path).rpartition("\nrun: ")
    assert answer.strip() and run.strip() == "my-run-42"


@pytest.mark.parametrize("with_v1", [False, True], ids=["as-written", "with-the-openai-base-url"])
def test_the_anthropic_snippet_takes_the_address_without_v1(
    stack: Stack, tmp_path: Path, with_v1: bool
) -> None:
    snippet = _readme_python_block("import anthropic")
    assert f'base_url="{README_DATAPLANE}"' in snippet
    if not with_v1:
        text, _, stop_reason = _run(snippet, stack, tmp_path).strip().rpartition(" ")
        assert text and stop_reason in ("end_turn", "max_tokens")
        return
    # The mistake the README warns of: the OpenAI base_url gives /v1/v1/messages, a 404.
    script = tmp_path / "hello.py"
    script.write_text(snippet.replace(README_DATAPLANE, f"{stack.dataplane_url}/v1"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "NotFoundError" in done.stderr, done.stdout + done.stderr


def test_the_anthropic_snippet_sends_the_token_it_is_given(guarded_stack: Stack, tmp_path: Path) -> None:
    snippet = _readme_python_block("import anthropic")
    text, _, stop_reason = _run(snippet, guarded_stack, tmp_path).strip().rpartition(" ")
    assert text and stop_reason in ("end_turn", "max_tokens")
