"""The README's OpenAI and Anthropic client snippets ("Point an agent at it"), run as the README says
(a script under the venv's Python) against a stack on free ports: the OpenAI one streams its answer
and prints the run id it named; the Anthropic one, whose ``base_url`` has no ``/v1``, gets a whole
Messages answer. (The MCP snippet is run in ``tests/runtime/web/test_runtime_http_edge_with_token.py``.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

from luftpause.testkit.stack import Stack

README_DATAPLANE = "http://127.0.0.1:8080"
"""The dataplane's address in the snippets: the one ``luftpause up`` prints (not ``localhost``)."""


def _readme_python_block(marker: str) -> str:
    """The README's one ```python block that contains ``marker``."""
    blocks = [b.split("```", 1)[0] for b in (ROOT / "README.md").read_text().split("```python\n")[1:]]
    (block,) = [b for b in blocks if marker in b]
    return block


def _run(snippet: str, stack: Stack, tmp_path: Path) -> str:
    assert README_DATAPLANE in snippet
    script = tmp_path / "hello.py"
    script.write_text(snippet.replace(README_DATAPLANE, stack.dataplane_url))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_openai_snippet_streams_and_prints_its_run(stack: Stack, tmp_path: Path) -> None:
    snippet = _readme_python_block("from openai import OpenAI")
    assert f'base_url="{README_DATAPLANE}/v1"' in snippet
    answer, _, run = _run(snippet, stack, tmp_path).rpartition("\nrun: ")
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
