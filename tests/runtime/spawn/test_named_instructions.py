"""Named instructions (issue 16): ``spawn(instruction="reviewer")`` gives the run the text of
``<[runtime] instructions_dir>/reviewer.md`` as its system prompt, ``default.md`` is the prompt of a
run spawned with neither ``instruction`` nor ``system``, and ``system`` stays for inline text.

Real processes: the runtime, driven through the real ``mcp`` client, over the scripted engine of the
pods tests (it records every request, so the system prompt a run's first turn carried is read
there); a sub-agent's own ``spawn`` takes ``instruction`` too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, script, start_pod, tool_text, until
from postgres_helpers import STORES, on_the_file_journal, store_of

pytestmark = pytest.mark.integration

REVIEWER = "You review code changes. Name each problem with its file and line.\n"
DEFAULT = "You are a careful sub-agent. Answer briefly.\n"


@pytest.fixture(scope="module", params=STORES)
def pod(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    store = store_of(request)
    workdir = tmp_path_factory.mktemp("instructions")
    folder = workdir / "instructions"
    folder.mkdir()
    (folder / "reviewer.md").write_text(REVIEWER)
    (folder / "default.md").write_text(DEFAULT)
    (folder / "notes.txt").write_text("not an instruction: only .md files are")
    settings = f'instructions_dir = "{folder}"\n'
    with start_pod(workdir, workspace=None, runtime_toml=settings, store=store) as running:
        yield running


def _first_system(pod: Pod, handle: str) -> str | None:
    first = pod.engine.requests[handle][0]["messages"]
    return first[0]["content"] if first[0]["role"] == "system" else None


async def _done(client: Client, handle: str) -> dict[str, Any]:
    result = await call(client, "await", handles=[handle], timeout=60)
    (run,) = result["runs"]
    assert run["state"] == "completed", run
    return dict(run)


def test_a_named_instruction_a_default_and_an_inline_system_prompt(pod: Pod) -> None:
    async def go() -> dict[str, tuple[str, dict[str, Any]]]:
        async with Client(f"{pod.url}/mcp") as client:
            runs = {}
            for label, extra in (
                ("named", {"instruction": "reviewer"}),
                ("default", {}),
                ("inline", {"system": "Inline prompt."}),
            ):
                handle = (await call(client, "spawn", task=script({"say": label}), **extra))["handle"]
                await _done(client, handle)
                runs[label] = (handle, (await call(client, "status", handle=handle))["run"])
            return runs

    runs = asyncio.run(go())
    named, named_status = runs["named"]
    assert _first_system(pod, named) == REVIEWER and named_status["instruction"] == "reviewer"
    default, default_status = runs["default"]
    assert _first_system(pod, default) == DEFAULT and default_status["instruction"] == "default"
    inline, inline_status = runs["inline"]
    assert _first_system(pod, inline) == "Inline prompt." and inline_status["instruction"] is None
    # The journal holds the text the run got and the name it came from: a restart resumes it with
    # the same prompt, whatever the folder holds by then.
    (start,) = [r for r in pod.journal() if r["type"] == "start" and r["handle"] == named]
    assert (start["instruction"], start["system"]) == ("reviewer", REVIEWER)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"instruction": "writer"}, "instruction 'writer': no file"),
        ({"instruction": "notes"}, "instructions there: 'default', 'reviewer'"),
        ({"instruction": "../reviewer"}, "a name is 1-64 letters, digits"),
        ({"instruction": ".hidden"}, "not starting with '.'"),
        ({"instruction": "reviewer", "system": "also inline"}, "give instruction or system, not both"),
    ],
    ids=["unknown", "not-md", "a-path", "dotfile", "both"],
)
@on_the_file_journal("pod")
def test_an_instruction_that_cannot_be_used_is_refused_saying_why(
    pod: Pod, arguments: dict[str, Any], expected: str
) -> None:
    async def go() -> tuple[bool, str]:
        async with Client(f"{pod.url}/mcp") as client:
            result = await client.call_tool("spawn", {"task": script({"say": "x"}), **arguments})
            return bool(result.is_error), tool_text(result)

    is_error, text = asyncio.run(go())
    assert is_error and expected in text, text


def test_a_sub_agent_gives_its_child_a_named_instruction(pod: Pod) -> None:
    child = script({"say": "reviewed"})
    parent = script(
        {"call": "spawn", "args": {"task": child, "name": "rev", "instruction": "reviewer"}},
        {"say": "delegated"},
    )

    async def go() -> str:
        async with Client(f"{pod.url}/mcp") as client:
            handle = (await call(client, "spawn", task=parent, orchestrate=True))["handle"]
            await _done(client, handle)

            async def child_handle() -> str | None:
                runs = (await call(client, "list", handle=handle))["runs"]
                return str(runs[0]["handle"]) if runs and runs[0]["state"] == "idle" else None

            return str(await until(child_handle, "the child to answer"))

    assert _first_system(pod, asyncio.run(go())) == REVIEWER


def test_without_an_instructions_folder_a_named_instruction_is_refused(tmp_path: Path) -> None:
    with start_pod(tmp_path, workspace=None) as bare:

        async def go() -> tuple[bool, str]:
            async with Client(f"{bare.url}/mcp") as client:
                result = await client.call_tool("spawn", {"task": "x", "instruction": "reviewer"})
                return bool(result.is_error), tool_text(result)

        is_error, text = asyncio.run(go())
    assert is_error and "no [runtime] instructions_dir is configured" in text, text
