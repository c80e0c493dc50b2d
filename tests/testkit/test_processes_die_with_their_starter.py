"""Every process the test kit starts dies with the process that started it, even when that one is
SIGKILLed (the issue's item 7: a killed test run left a whole stack, scheduler, dataplane, runtime
and fake MCP, running 26 minutes later). The starter here is a child process that starts a whole
:class:`~luftpause.testkit.launch.stack.Stack` and a stream client, prints every pid, and is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from luftpause.testkit.launch import procs
from luftpause.testkit.launch.procs import group_pids, stat_fields

pytestmark = pytest.mark.integration

FAIL_SAFE_S = 60.0

_STARTER = """
import sys, time, orjson
from pathlib import Path
from luftpause.testkit.launch.stack import Stack
stack = Stack.start(Path(sys.argv[1]), env={"LUFTPAUSE_TOKEN": ""}, decode_ms=50)
stack.wait_connected()
clients = stack.stream_clients(1, max_tokens=100_000)
groups = [child.pgid for child in stack.children.values()] + [client.pid for client in clients]
print(orjson.dumps(groups).decode(), flush=True)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def test_a_sigkilled_starter_takes_its_whole_stack_with_it(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path / "stack")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    groups: list[int] = []
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()
        assert line, "the starter printed nothing (its stack did not start)"
        groups = orjson.loads(line)
        assert len(groups) == 7  # two engines, fake MCP, scheduler, dataplane, runtime, a client
        members = [pid for group in groups for pid in group_pids(group)]
        assert len(members) >= 9  # the dataplane's and the runtime's granian workers too
        starter.kill()  # SIGKILL: no cleanup of its own runs
        starter.wait()
        deadline = time.monotonic() + FAIL_SAFE_S
        while alive := [pid for pid in members if _alive(pid)]:
            assert time.monotonic() < deadline, f"still running after their starter died: {alive}"
            time.sleep(0.1)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if starter.stdout is not None:
            starter.stdout.close()
        for group in groups:  # should the reaper have failed, leave nothing behind
            if group_pids(group):
                os.killpg(group, signal.SIGKILL)


def test_the_reaper_spares_groups_withdrawn_or_whose_number_was_reused() -> None:
    """The reaper itself, fed by hand: of three sleeping groups, the one still announced is ended
    when its stdin closes; the one withdrawn (stopped, its number free for reuse) and the one
    announced with another start time (its number reused by a later process) are not."""
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
        for _ in range(3)
    ]
    doomed, withdrawn, reused = (p.pid for p in sleepers)
    reaper = subprocess.Popen([sys.executable, "-c", procs._REAPER, "1"], stdin=subprocess.PIPE)
    try:
        assert reaper.stdin is not None
        start = {pid: stat_fields(pid)[19] for pid in (doomed, withdrawn, reused)}  # type: ignore[index]
        reaper.stdin.write(
            f"+ {doomed} {start[doomed]}\n+ {withdrawn} {start[withdrawn]}\n- {withdrawn} -\n"
            f"+ {reused} 1\n".encode()
        )
        reaper.stdin.close()  # as when its starter dies
        assert reaper.wait(FAIL_SAFE_S) == 0
        assert sleepers[0].wait(FAIL_SAFE_S) == -signal.SIGTERM
        assert sleepers[1].poll() is None and sleepers[2].poll() is None
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
