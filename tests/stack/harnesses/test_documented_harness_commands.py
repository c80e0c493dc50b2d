"""Every harness command line ``docs/harnesses.md`` gives runs as written, against a stack like the
one ``make up`` starts, with no token and with ``LUFTPAUSE_TOKEN`` set (issue 22: the instructions
did not work on the default stack: Claude Code said "Not logged in" and then got 404 for its own
default model, Codex stopped with "Missing environment variable" because they assumed a token).

The doc marks what is run: a fenced block whose info string says ``docs-test=NAME`` is a shell
script (``sh``), or a file the harness reads when it also says ``file=PATH`` (``~/`` is the
harness's home, else the folder it runs in). Each NAME's blocks, in order, are one run: the files
written, then the scripts run by ``bash -e`` in an empty folder, with a fresh ``HOME``, the
harness's executable on ``PATH``, and ``LUFTPAUSE_TOKEN`` set when the stack has one; nothing else
from this process's environment. The one change made to the text: the default ports
(``127.0.0.1:8080``, ``127.0.0.1:7000``) become the test stack's, which listens on free ones.

A run passes when it exits 0 and shows the simulated engine's words (``I saw N tool results.``),
which only reach it through the dataplane; ``claude mcp list`` must also report the runtime
connected. A run whose blocks connect the runtime (``:7000/mcp``) must also have spawned a
sub-agent that completed, as the runtime's ``GET /status`` shows: exit 0 and the words alone passed
a Codex run whose ``spawn`` the runtime refused (it named model ``'hello'``, before ``spawn``'s
``model`` was an enum of the models served).
Where a harness is not installed, its runs skip, saying how to install it:
npm harnesses in ``~/.cache/luftpause/harnesses`` (``LUFTPAUSE_HARNESSES_DIR``), PyPI ones each in a
venv under ``~/.cache/luftpause/pyharnesses`` (as ``test_chat_harnesses_on_the_stack.py`` finds
them), Goose on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from harness_runs import HARNESSES_ENV, harness_bin
from repo_paths import ROOT

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

DOC = ROOT / "docs" / "harnesses.md"
TOKEN = "documented-harness-token"
DATAPLANE = "127.0.0.1:8080"
RUNTIME = "127.0.0.1:7000"
SIMULATED = re.compile(r"I saw \d+ tool results?\.")
"""How every answer of the simulated engine begins (``luftpause/testkit/engine/replies.py``)."""

FENCE = re.compile(r"^```(\w+) ([^\n]*docs-test=[^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass
class Run:
    """One ``docs-test`` name's blocks: files to write and scripts to run."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    scripts: list[str] = field(default_factory=list)


def documented_runs(text: str) -> dict[str, Run]:
    """The runs ``text`` marks, by name, in the order they first appear."""
    runs: dict[str, Run] = {}
    for match in FENCE.finditer(text):
        language, attributes, body = match.groups()
        fields = dict(part.split("=", 1) for part in attributes.split() if "=" in part)
        run = runs.setdefault(fields["docs-test"], Run(fields["docs-test"]))
        if "file" in fields:
            run.files[fields["file"]] = body
        else:
            assert language == "sh", f"{run.name}: a block to run must be sh, not {language}"
            run.scripts.append(body)
    return runs


RUNS = documented_runs(DOC.read_text())

ONLY_WITH_A_TOKEN = {"codex-with-a-token"}
ONLY_WITHOUT_A_TOKEN = {"codex-without-a-token"}

NO_SPAWN_ON_THE_SIMULATOR = {
    "codex": "the simulated engine's spawn call names a served model (spawn's model is an enum) but "
    "made-up tools (['have'], which the runtime refuses: no run starts) and budgetTokens 3 (a run "
    "would be cancelled after its first turn)",
    "opencode": "the simulated engine never calls spawn for this prompt, only approve and cancel with "
    "made-up handles, which the runtime refuses naming the caller's own: no run starts",
}
"""Over-MCP runs whose simulated tool calls do not spawn a sub-agent (docs/harnesses.md says what
the user sees): expected to fail the runtime check, strictly, so that a fix shows."""


def _pyharness(venv: str, exe: str) -> str | None:
    path = os.path.expanduser(f"~/.cache/luftpause/pyharnesses/{venv}/bin/{exe}")
    return path if os.access(path, os.X_OK) else None


NPM = f"npm install --prefix ~/.cache/luftpause/harnesses {{}} (or set {HARNESSES_ENV})"
PIP = (
    "python3 -m venv ~/.cache/luftpause/pyharnesses/{0} && "
    "~/.cache/luftpause/pyharnesses/{0}/bin/pip install {1}"
)
EXECUTABLES = {
    "claude-code": ("claude", lambda: harness_bin("claude"), NPM.format("@anthropic-ai/claude-code")),
    "codex": ("codex", lambda: harness_bin("codex"), NPM.format("@openai/codex")),
    "opencode": ("opencode", lambda: harness_bin("opencode"), NPM.format("opencode-ai")),
    "aider": ("aider", lambda: _pyharness("aider", "aider"), PIP.format("aider", "aider-chat")),
    "llm": ("llm", lambda: _pyharness("llm", "llm"), PIP.format("llm", "llm")),
    "goose": (
        "goose",
        lambda: shutil.which("goose"),
        "Goose ships from GitHub releases, not a package registry: put its goose on PATH",
    ),
}
"""Per harness (a run's name up to its first ``-`` variant): its command, where it is, how to
install it."""


def _harness(run: str) -> tuple[str, str]:
    """(the command the run calls, its path); skips, saying how to install it, when absent."""
    key = next(k for k in EXECUTABLES if run == k or run.startswith(f"{k}-"))
    command, find, install = EXECUTABLES[key]
    path = find()
    if path is None:
        pytest.skip(f"{command} is not installed: {install}")
    return command, path


def _stack(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Iterator[Stack]:
    with Stack.start(tmp_path_factory.mktemp("documented-harnesses"), env=env) as running:
        running.wait_connected()
        yield running


@pytest.fixture(scope="module")
def open_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack ``make up`` starts: no token."""
    yield from _stack(tmp_path_factory, {})


@pytest.fixture(scope="module")
def guarded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The same with ``LUFTPAUSE_TOKEN`` set."""
    yield from _stack(tmp_path_factory, {"LUFTPAUSE_TOKEN": TOKEN})


def _ported(text: str, stack: Stack) -> str:
    return text.replace(DATAPLANE, urlsplit(stack.dataplane_url).netloc).replace(
        RUNTIME, urlsplit(stack.runtime_url).netloc
    )


def _runtime_runs(stack: Stack) -> list[dict[str, Any]]:
    """The runtime's ``GET /status`` runs, oldest first."""
    url = stack.runtime_url.removesuffix("/mcp") + "/status"
    answer = httpx.get(url, headers=stack.auth_headers, timeout=10)
    answer.raise_for_status()
    return list(answer.json()["runs"])


FINISHED = {"completed", "failed", "cancelled"}


def _runs_spawned_since(stack: Stack, before: set[str]) -> list[dict[str, Any]]:
    """The runs the runtime holds that are not in ``before``, once none of them is still going
    (a harness may end while the sub-agent it spawned without awaiting it runs on)."""
    for _ in range(600):
        spawned = [r for r in _runtime_runs(stack) if r["id"] not in before]
        if all(r["state"] in FINISHED for r in spawned):
            return spawned
        time.sleep(0.1)
    return spawned


def test_the_doc_marks_a_run_for_each_harness_it_gives_command_lines_for() -> None:
    assert set(RUNS) == {
        "claude-code",
        "codex-without-a-token",
        "codex-with-a-token",
        "opencode",
        "aider",
        "llm",
        "goose",
    }
    for run in RUNS.values():
        assert run.scripts, f"{run.name}: files but nothing to run"
        key = next(k for k in EXECUTABLES if run.name == k or run.name.startswith(f"{k}-"))
        assert any(EXECUTABLES[key][0] in script for script in run.scripts), run.name


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("token", ["without-a-token", "with-a-token"])
def test_the_documented_commands_run_as_written(
    name: str, token: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    has_token = token == "with-a-token"
    if name in ONLY_WITH_A_TOKEN and not has_token:
        pytest.skip("the doc gives this configuration for a stack with LUFTPAUSE_TOKEN set")
    if name in ONLY_WITHOUT_A_TOKEN and has_token:
        pytest.skip("the doc gives this configuration for a stack without a token")
    command, path = _harness(name)
    for key, why in NO_SPAWN_ON_THE_SIMULATOR.items():
        if name == key or name.startswith(f"{key}-"):
            request.applymarker(pytest.mark.xfail(reason=why, strict=True))
    # started only for a harness that is there: a machine without any starts no stack
    stack: Stack = request.getfixturevalue("guarded_stack" if has_token else "open_stack")
    run = RUNS[name]
    home, work, bin_dir = tmp_path / "home", tmp_path / "work", tmp_path / "bin"
    for folder in (home, work, bin_dir):
        folder.mkdir()
    (bin_dir / command).symlink_to(path)
    for where, body in run.files.items():
        target = home / where[2:] if where.startswith("~/") else work / where
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_ported(body, stack))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "TERM": "dumb"}
    if has_token:
        env["LUFTPAUSE_TOKEN"] = TOKEN
    script = "\n".join(_ported(body, stack) for body in run.scripts)
    before = {r["id"] for r in _runtime_runs(stack)}
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert SIMULATED.search(done.stdout), out[-4000:]
    if "7000/mcp" in "".join([*run.scripts, *run.files.values()]):
        spawned = _runs_spawned_since(stack, before)
        assert spawned, f"{name}: no sub-agent run was spawned at the runtime\n{out[-4000:]}"
        failed = [r for r in spawned if r["state"] != "completed" or r.get("error")]
        assert not failed, f"{name}: {failed}\n{out[-4000:]}"
    if "claude mcp list" in script:
        assert re.search(r"luftpause: \S+ \(HTTP\) - . Connected", out), out[-4000:]
