"""A hard link in the workspace does not let a sub-agent read the file outside it (issue 17, item 6),
through the real runtime process, the real ``mcp`` client and a sub-agent the scripted engine
drives (tests/pods_helpers.py): ``read_file`` and ``edit_file`` refuse the link, ``list_directory``
shows it without the outside file's size, and a symlink pointing outside stays refused as before.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import call, script, start_pod

pytestmark = pytest.mark.integration

SECRET = "top secret: the launch codes\n"


def test_a_sub_agent_cannot_read_outside_the_workspace_through_a_hard_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(SECRET)
    with start_pod(tmp_path) as pod:
        ws = pod.workspace
        assert ws is not None
        os.link(secret, ws / "innocent.txt")  # the same file under a name inside the workspace
        (ws / "link.txt").symlink_to(secret)
        (ws / "plain.txt").write_text("plain text\n")
        steps = [
            {"call": "read_file", "args": {"path": "innocent.txt"}},
            {"call": "read_file", "args": {"path": str(ws / "innocent.txt"), "offset": 1, "limit": 1}},
            {"call": "edit_file", "args": {"path": "innocent.txt", "old": "top", "new": "no"}},
            {"call": "list_directory", "args": {"path": str(ws)}},
            {"call": "read_file", "args": {"path": "link.txt"}},
            {"call": "read_file", "args": {"path": "plain.txt"}},
            {"say": "done"},
        ]

        rules = [{"effect": "allow", "access": ["read", "write"], "path": str(ws)}]  # all of it

        async def go() -> dict[str, Any]:
            async with Client(f"{pod.url}/mcp") as client:
                handle = (await call(client, "spawn", task=script(*steps), maxToolCalls=10, scope=rules))[
                    "handle"
                ]
                result: dict[str, Any] = (await call(client, "await", handles=[handle], timeout=60))["runs"][
                    0
                ]
                return result

        result = asyncio.run(go())
        assert result["state"] == "completed" and result["answer"] == "done", result
        assert result["failedToolCalls"] == 4, result  # both reads, the edit, the symlink
        last = pod.engine.requests[result["handle"]][-1]["messages"]
        read, offset_read, edit, listing, symlinked, plain = [
            m["content"] for m in last if m["role"] == "tool"
        ]
        real = ws / "innocent.txt"
        for refused in (read, offset_read):
            assert refused.startswith(f"Error: {real} has 2 hard links") and "so it is not read" in refused
        assert edit.startswith(f"Error: {real} has 2 hard links: writing it would change the file")
        assert "innocent.txt  (2 hard links: not read)" in listing.splitlines()
        assert f"link.txt -> {secret}" in listing.splitlines()
        assert symlinked.startswith(f"Error: read {secret} denied") and "asked for link.txt" in symlinked
        assert plain == "plain text\n"
        for text in (read, offset_read, edit, listing, symlinked):
            assert "launch codes" not in text and str(len(SECRET)) + " bytes" not in text
        assert secret.read_text() == SECRET
