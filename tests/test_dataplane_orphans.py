"""A SIGKILL of the dataplane's main process takes its granian worker with it
(:func:`luftpause.orphans.exit_with_parent`, called in the worker's lifespan startup): the review
found the worker going on serving the port, still connected to the scheduler."""

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


def test_the_worker_exits_when_the_main_process_is_sigkilled(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "luftpause.toml"
    # No scheduler listening: the dataplane serves (connecting) all the same.
    config.write_text(
        f"""
[dataplane]
listen = "127.0.0.1:{port}"
scheduler = "127.0.0.1:{free_port()}"

[[replicas]]
name = "nowhere"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]
"""
    )
    dataplane = ChildProcess(
        "dataplane",
        ["dataplane", "--config", str(config)],
        log_path=tmp_path / "dataplane.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        dataplane.start().wait_ready()
        assert dataplane.proc is not None
        main = dataplane.proc.pid
        workers = _children(main)
        assert workers, "granian started no worker process"
        os.kill(main, signal.SIGKILL)  # the main process only, not its process group
        dataplane.proc.wait()
        deadline = time.monotonic() + 30  # generous: the worker polls every 0.5 s, then stops
        while any(_alive(w) for w in workers) or port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, f"worker(s) {workers} still serving\n{dataplane.log_tail()}"
            time.sleep(0.1)
    finally:
        dataplane.stop()
