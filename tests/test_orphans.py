"""A SIGKILL of a granian server's main process takes its worker with it, for the dataplane and
the runtime alike (:func:`luftpause.orphans.exit_with_parent`, called in the worker's startup): a
review found the worker going on serving the port (the dataplane's still connected to the
scheduler)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from luftpause.testkit.procs import ChildProcess, free_port, port_open, stat_fields

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _section(command: str, port: int, tmp_path: Path) -> str:
    # Nothing it talks to is listening: each serves all the same (the dataplane "connecting").
    if command == "dataplane":
        return f'[dataplane]\nlisten = "127.0.0.1:{port}"\nscheduler = "127.0.0.1:{free_port()}"\n'
    return (
        f'[runtime]\nlisten = "127.0.0.1:{port}"\ndataplane = "http://127.0.0.1:{free_port()}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
    )


@pytest.mark.parametrize("command", ["dataplane", "runtime"])
def test_the_worker_exits_when_the_main_process_is_sigkilled(tmp_path: Path, command: str) -> None:
    port = free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        _section(command, port, tmp_path)
        + f'[[replicas]]\nname = "nowhere"\nurl = "http://127.0.0.1:{free_port()}"\nmodels = ["m"]\n'
    )
    server = ChildProcess(
        command,
        [command, "--config", str(config)],
        log_path=tmp_path / f"{command}.log",
        env={"LUFTPAUSE_TOKEN": ""},
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        server.start().wait_ready()
        assert server.proc is not None
        main = server.proc.pid
        workers = _children(main)
        assert workers, "granian started no worker process"
        os.kill(main, signal.SIGKILL)  # the main process only, not its process group
        server.proc.wait()
        deadline = time.monotonic() + 30  # generous: the worker polls every 0.5 s, then stops
        while any(_alive(w) for w in workers) or port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, f"worker(s) {workers} still serving\n{server.log_tail()}"
            time.sleep(0.1)
    finally:
        server.stop()
