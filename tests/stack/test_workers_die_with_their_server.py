"""A SIGKILL of a granian server's main process takes its worker with it, at once, for the
dataplane and the runtime alike (:func:`luftpause.supervise.orphans.exit_with_parent`, called in the worker's
startup): a review found the worker going on serving the port (the dataplane's still connected to
the scheduler), and then the issue found it streaming for 5 s with no main process (it polled,
then stopped gracefully). Now the worker waits on a pidfd of its parent and exits the moment the
parent is gone: its client's stream is broken and its engine request closed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from dataplane_procs import MODEL, fake_engine, scheduler_and_dataplane

from luftpause.testkit.launch.procs import (
    ChildProcess,
    free_port,
    port_open,
    reap_with_this_process,
    stat_fields,
)

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
        deadline = time.monotonic() + 30  # a fail-safe: the worker exits at once
        while any(_alive(w) for w in workers) or port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, f"worker(s) {workers} still serving\n{server.log_tail()}"
            time.sleep(0.1)
    finally:
        server.stop()


# A process that starts a child which calls exit_with_parent with a poll interval of an hour (so
# only the pidfd can tell it at once), prints the child's pid, and waits.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(3600)
"""
_CHILD = """
import time
from luftpause.supervise.orphans import exit_with_parent
exit_with_parent(poll_seconds=3600)
time.sleep(3600)
"""


def test_a_worker_learns_of_its_parents_death_at_once_not_by_polling() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD], stdout=subprocess.PIPE, start_new_session=True
    )
    reap_with_this_process(parent)  # the child is in its group: neither outlives a failing test
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(1)  # the child has started its watch (a fail-safe wait, not a measured bound)
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30  # were it polling, it would look again in an hour
        while _alive(child):
            assert time.monotonic() < deadline, "the child did not follow its parent out"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def _running_at(engine_url: str) -> float:
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("sglang:num_running_reqs"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the engine reports no sglang:num_running_reqs")


def test_a_stream_whose_dataplane_main_is_sigkilled_breaks_and_its_engine_request_closes(
    tmp_path: Path,
) -> None:
    """The issue's input: the dataplane's main process killed while its worker streams. The stream
    would run for minutes (20 ms per token, 100,000 tokens); it is broken instead (no clean end),
    the engine sees its request closed, and the port is free for a restart."""
    with (
        fake_engine(tmp_path, decode_ms=20) as engine_url,
        scheduler_and_dataplane(tmp_path, [engine_url]) as pair,
    ):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100_000,
            "stream": True,
        }
        request = urllib.request.Request(
            f"{pair.dataplane_url}/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
            method="POST",
        )
        chunks: list[bytes] = []
        ended: list[BaseException | None] = []
        streaming = threading.Event()

        def read() -> None:
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    while chunk := response.read1(65536):
                        chunks.append(chunk)
                        streaming.set()
                ended.append(None)  # a clean end: what must not happen
            except Exception as exc:
                ended.append(exc)
            streaming.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert streaming.wait(60) and chunks, pair.logs()
        assert _running_at(engine_url) == 1
        dataplane = pair.children["dataplane"]
        assert dataplane.proc is not None
        os.kill(dataplane.proc.pid, signal.SIGKILL)  # the main process only
        reader.join(60)
        assert not reader.is_alive(), "the stream went on after its dataplane's main process died"
        assert ended and ended[0] is not None, "the stream ended cleanly, as if the answer were whole"
        deadline = time.monotonic() + 30
        while _running_at(engine_url) != 0:
            assert time.monotonic() < deadline, "the engine request was never closed"
            time.sleep(0.1)
        port = int(pair.dataplane_url.rsplit(":", 1)[1])
        while port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, "the port is still served"
            time.sleep(0.1)
