"""``--help`` of the commands issue 8's review found short: ``luftpause loadgen`` and the examples
show every option's default, and the examples name the environment variables they read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def help_of(*argv: str) -> str:
    """The ``--help`` text of ``python argv... --help``, whitespace folded to single spaces."""
    shown = subprocess.run(
        [sys.executable, *argv, "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return " ".join(shown.split())


def test_loadgen_help_shows_the_defaults_of_task_and_caller() -> None:
    from luftpause.testkit.loadgen import DEFAULT_TASK

    shown = help_of("-m", "luftpause", "loadgen")
    assert f"the task of every run (default: {DEFAULT_TASK!r})" in shown
    assert "x-luftpause-caller of the group's runs (default: none, the header is not sent)" in shown


@pytest.mark.parametrize("example", ["openai_agent.py", "agents_sdk_agent.py", "langgraph_agent.py"])
def test_an_examples_help_shows_every_default_and_the_environment_it_reads(example: str) -> None:
    shown = help_of(str(EXAMPLES / example))
    assert "(default: $LUFTPAUSE_MODEL or llama-3.2-1b)" in shown
    assert "(default: example-<a new UUID>)" in shown
    assert "x-luftpause-class of every turn (default: interactive)" in shown
    assert "x-luftpause-caller of every turn (default: examples)" in shown
    assert "the agent's task (default: 'Find out what luftpause does and answer in one sentence.')" in shown
    assert "$LUFTPAUSE_BASE_URL" in shown
