"""A SIGKILL of the runtime's main process takes its granian worker with it
(:func:`luftpause.orphans.exit_with_parent`): the worker used to go on serving the port."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from luftpause.testkit.procs import ChildProcess, free_port, port_open

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing parenthesis
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_worker_exits_when_the_main_process_is_sigkilled(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{port}"
dataplane = "http://127.0.0.1:{free_port()}"
state_dir = "{tmp_path / "state"}"

[[replicas]]
name = "nowhere"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]
"""
    )
    runtime = ChildProcess(
        "runtime",
        ["runtime", "--config", str(config)],
        log_path=tmp_path / "runtime.log",
        env={"LUFTPAUSE_TOKEN": ""},
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        runtime.start().wait_ready()
        assert runtime.proc is not None
        main = runtime.proc.pid
        workers = _children(main)
        assert workers, "granian started no worker process"
        os.kill(main, signal.SIGKILL)  # the main process only, not its process group
        runtime.proc.wait()
        deadline = time.monotonic() + 30  # generous: the worker polls every 0.5 s, then stops
        while any(_alive(w) for w in workers) or port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, f"worker(s) {workers} still serving\n{runtime.log_tail()}"
            time.sleep(0.1)
    finally:
        runtime.stop()
