"""``luftpause up`` supervises (issue 25, item 4; docs/failover.md "luftpause up"): a process that
dies is started again and logged, the others keep serving meanwhile, and only a crash loop stops
the stack, naming the process.

What broke: one engine killed under ``up`` stopped the whole stack (1,367 of 1,831 turns failed);
up restarted nothing. Here each process ``up`` starts (an engine, the fake MCP server, scheduler,
dataplane, runtime) is SIGKILLed in turn under a real ``up``, with the ``openai`` client's turns
checked while it is down and after it is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import openai
import pytest

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.procs import free_port, reap_with_this_process, stat_fields

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "hi"}]


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    stderr: Path
    ports: dict[str, int]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def child(self, command: str, port: int | None = None) -> int | None:
        """The pid of the child of ``up`` running ``luftpause <command>`` (with ``--port port``)."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            fields = stat_fields(int(entry))
            if fields is None or int(fields[1]) != self.proc.pid:
                continue
            try:
                words = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().split()
            except OSError:
                continue
            if command in words and (port is None or str(port) in words):
                return int(entry)
        return None

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def wait_until(check: Callable[[], bool], timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def start_up(workdir: Path, *flags: str) -> Up:
    names = ("engine0", "engine1", "mcp", "grpc", "http", "dataplane", "runtime")
    ports = {name: free_port() for name in names}
    config = workdir / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{ports["grpc"]}"\nhttp = "127.0.0.1:{ports["http"]}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{ports["dataplane"]}"\nscheduler = "127.0.0.1:{ports["grpc"]}"\n'
        f'[runtime]\nlisten = "127.0.0.1:{ports["runtime"]}"\ndataplane = "http://127.0.0.1:{ports["dataplane"]}"\n'
        f'state_dir = "{workdir / "state"}"\ndefault_model = "{DEFAULT_MODEL}"\n'
        + "".join(
            f'[[replicas]]\nname = "sim-{i}"\nurl = "http://127.0.0.1:{ports[f"engine{i}"]}"\n'
            f'models = ["{DEFAULT_MODEL}"]\n'
            for i in range(2)
        )
        + f'[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{ports["mcp"]}/mcp"\n'
    )
    stderr = workdir / "up.stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "luftpause", "up", "--config", str(config), "--simulate", "--logs",
             str(workdir / "logs"), *flags],
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "LUFTPAUSE_TOKEN": ""},
            start_new_session=True,
        )  # fmt: skip
    reap_with_this_process(proc)
    up = Up(proc, stderr, ports)
    assert wait_until(
        lambda: ok(f"{up.url('runtime')}/readyz") and ok(f"{up.url('dataplane')}/readyz"), 180
    ), up.log()
    return up


def stop_up(up: Up) -> None:
    if up.proc.poll() is None:
        up.proc.send_signal(signal.SIGTERM)
        try:
            up.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.proc.pid, signal.SIGKILL)
            up.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    started = start_up(tmp_path)
    try:
        yield started
    finally:
        stop_up(started)


def a_turn_answers(up: Up) -> bool:
    with openai.OpenAI(
        base_url=f"{up.url('dataplane')}/v1", api_key="x", max_retries=0, timeout=30
    ) as client:
        try:
            answer = client.chat.completions.create(model=DEFAULT_MODEL, messages=HI, max_tokens=2)  # type: ignore[arg-type]
        except openai.APIError:
            return False
        return bool(answer.choices)


# (what up runs, its --port or None, how to see it serving, what else must serve while it is down)
PROCESSES = [
    ("fake-engine", "engine0", "/health", ("turn",)),
    ("fake-mcp", "mcp", None, ("turn", "runtime")),
    ("scheduler", None, "/readyz", ("runtime", "dataplane-live")),
    ("dataplane", None, "/readyz", ("runtime", "scheduler")),
    ("runtime", None, "/readyz", ("turn", "scheduler")),
]


def serving(up: Up, what: str) -> bool:
    if what == "turn":
        return a_turn_answers(up)
    if what == "runtime":
        return ok(f"{up.url('runtime')}/status")
    if what == "scheduler":
        return ok(f"{up.url('http')}/status")
    if what == "dataplane-live":
        return ok(f"{up.url('dataplane')}/livez")
    raise AssertionError(what)


def back(up: Up, command: str, port: int | None, dead: int) -> Callable[[], bool]:
    """Whether ``up`` runs ``command`` again, under another pid than ``dead``."""

    def check() -> bool:
        now = up.child(command, port)
        return now is not None and now != dead

    return check


def test_killing_each_process_under_up_leaves_the_rest_serving_and_brings_it_back(up: Up) -> None:
    for command, port_name, ready_path, others in PROCESSES:
        port = up.ports[port_name] if port_name else None
        pid = up.child(command, port)
        assert pid is not None, (command, up.log())
        os.killpg(pid, signal.SIGKILL)  # the child and its workers: its own process group
        for what in others:
            assert wait_until(partial(serving, up, what), 60), (command, what, up.log())
        assert wait_until(back(up, command, port, pid), 60), (command, up.log())
        if ready_path is not None:
            name = {"scheduler": "http"}.get(command, port_name or command)
            assert wait_until(partial(ok, f"{up.url(name)}{ready_path}"), 90), (command, up.log())
        assert up.proc.poll() is None, up.log()
        assert wait_until(partial(a_turn_answers, up), 90), (command, up.log())
    log = up.log()
    for name in ("engine sim-0", "mcp tools", "scheduler", "dataplane", "runtime"):
        assert f"luftpause up: {name} exited with" in log, log
        assert f"luftpause up: {name} started again" in log, log


def test_a_crash_loop_stops_the_stack_and_names_the_process(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--max-restarts", "1", "--restart-window-s", "300")
    try:
        first = up.child("fake-mcp", up.ports["mcp"])
        assert first is not None
        os.killpg(first, signal.SIGKILL)
        assert wait_until(back(up, "fake-mcp", up.ports["mcp"], first), 60), up.log()
        second = up.child("fake-mcp", up.ports["mcp"])
        assert second is not None
        os.killpg(second, signal.SIGKILL)
        assert up.proc.wait(60) == 1
        assert "mcp tools exited 2 times within 300 s (--max-restarts 1): a crash loop" in up.log()
    finally:
        stop_up(up)
