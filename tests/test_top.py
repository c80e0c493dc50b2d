"""``luftpause top`` (issue 6): the run network in a terminal, read from the monitor's JSON.

End to end: the real runtime process with the scripted engine of the pods tests
(:mod:`test_runtime_pods`), a run ``a`` that spawns a child ``c`` held busy in its turn, and
``python -m luftpause top`` as a subprocess (``--once``, and live in a pseudo-terminal ended by
Ctrl-C). The fitting of a large network to the terminal is tested on data in the monitor's shape
without a server.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console
from test_runtime_pods import Pod, call, script, start_pod, until

from luftpause.testkit.loadgen import runtime_client
from luftpause.testkit.procs import free_port
from luftpause.top import NetworkPoller, counts_line, fit, frame, normalize_url, runtime_base_url, short_scope

TOKEN = "top-test-token"
integration = pytest.mark.integration
"""The tests that start the runtime (``top``'s fitting and formatting are tested without one)."""


def _env(**extra: str) -> dict[str, str]:
    """This environment without what would change ``top``'s defaults, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COLUMNS", "LINES", "LUFTPAUSE_TOKEN", "LUFTPAUSE_CONFIG")
    }
    return {**env, **extra}


def top(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "top", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(**env),
    )


@dataclass
class Network:
    pod: Pod
    a: str
    c: str


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A runtime with a token and two runs: ``a`` (answered, idle) and its child ``c``, busy in a
    turn the engine holds until the end of the module."""
    with contextmanager(start_pod)(tmp_path_factory.mktemp("top"), token=TOKEN) as pod:
        child = script({"hold": "c", "say": "c done"})
        a_task = script(
            {"call": "spawn", "args": {"task": child, "name": "c"}}, {"say": "A is waiting\nfor c"}
        )

        async def build() -> tuple[str, str]:
            async with runtime_client(f"{pod.url}/mcp", TOKEN) as client:
                a = str(
                    (
                        await call(
                            client, "spawn", task=a_task, name="a", orchestrate=True, serviceClass="batch"
                        )
                    )["handle"]
                )

                async def settled() -> Any:
                    runs = (await call(client, "list", handle=a))["runs"]
                    top_state = (await call(client, "read", handle=a))["state"]
                    busy = runs and pod.engine.holding(runs[0]["handle"])
                    return runs[0]["handle"] if busy and top_state == "idle" else None

                return a, str(await until(settled, "a idle and c in a held turn"))

        a, c = asyncio.run(build())
        yield Network(pod, a, c)


def _row(output: str, handle: str) -> str:
    return next(line for line in output.splitlines() if handle in line)


@integration
def test_once_prints_the_tree_with_states_counters_and_the_last_answer(network: Network) -> None:
    shown = top("--url", network.pod.url, "--once", LUFTPAUSE_TOKEN=TOKEN)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"luftpause top  {network.pod.url}" in out
    assert "2 runs: 1 running, 1 idle" in out
    a_row, c_row = _row(out, network.a), _row(out, network.c)
    # c hangs under a: a is a root line, c's line starts with the tree guide, right below a.
    lines = out.splitlines()
    assert lines.index(c_row) == lines.index(a_row) + 1
    assert re.match(r"^a\s", a_row) and re.match(r"^└─ c\s", c_row), (a_row, c_row)
    # a: answered (idle), batch (as spawned; c inherits it), 2 turns, 1 tool call (the spawn),
    # no scope, the first line of its answer; c: running, no turn answered, no answer yet.
    assert re.search(r"\sidle\s+batch\s+2\s+1\s+-\s+A is waiting$", a_row), a_row
    # c reads what a's grant let it read (the workspace) and writes nothing; a, idle, holds none.
    assert re.search(rf"\srunning\s+batch\s+0\s+0\s+r {re.escape(str(network.pod.workspace))}\s*$", c_row), (
        c_row
    )
    assert "for c" not in out  # only the answer's first line


@integration
def test_the_url_comes_from_the_configuration_and_the_token_from_the_environment(network: Network) -> None:
    shown = top("--config", str(network.pod.config), "--once", LUFTPAUSE_TOKEN=TOKEN)
    assert shown.returncode == 0, shown.stderr
    assert f"luftpause top  {network.pod.url}" in shown.stdout and network.c in shown.stdout


@integration
def test_a_wrong_or_missing_token_is_one_line_and_exit_code_1(network: Network) -> None:
    wrong = top("--url", network.pod.url, "--once", "--token", "not-it")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.strip() == (
        f"luftpause top: {network.pod.url}: 401: the runtime refused the token "
        "(a wrong --token or $LUFTPAUSE_TOKEN)"
    )
    missing = top("--url", f"{network.pod.url}/monitor", "--once")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"luftpause top: {network.pod.url}: 401: the runtime needs a token: "
        "pass --token or set $LUFTPAUSE_TOKEN"
    )


@integration
def test_an_unreachable_runtime_is_one_line_and_exit_code_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    shown = top("--url", url, "--once")
    assert shown.returncode == 1 and shown.stdout == ""
    assert shown.stderr.startswith(f"luftpause top: {url}: cannot reach the runtime: ")
    assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr


@integration
def test_the_poller_sends_its_version_and_keeps_the_runs_while_unchanged(network: Network) -> None:
    poller = NetworkPoller(network.pod.url, TOKEN)
    first = poller.poll()
    version = poller.version
    assert version and {r["handle"] for r in first} == {network.a, network.c}
    assert poller.poll() is first and poller.version == version  # the runtime answered "unchanged"


def _live(argv: list[str], until_text: str, rows: int = 12, cols: int = 160) -> tuple[int, str, str]:
    """``luftpause top`` live in a pseudo-terminal of ``rows`` x ``cols``: waits until its screen
    shows ``until_text``, sends Ctrl-C (SIGINT); returns (exit code, screen output, stderr)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "luftpause", "top", *argv],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.PIPE,
        env=_env(TERM="xterm-256color"),
        start_new_session=True,
    )
    os.close(follower)
    screen = b""
    try:
        deadline = time.monotonic() + 30  # a fail-safe bound only
        while until_text.encode() not in screen:
            assert time.monotonic() < deadline, f"never showed {until_text!r}: {screen[-2000:]!r}"
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    screen += os.read(leader, 65536)
                except OSError:  # the child closed the terminal (it ended)
                    break
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
        assert process.stderr is not None
        return code, screen.decode("utf-8", "replace"), process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        os.close(leader)


@integration
def test_live_shows_the_network_and_ctrl_c_ends_it_with_exit_code_0(network: Network) -> None:
    code, screen, err = _live(["--url", network.pod.url, "--token", TOKEN, "--interval", "0.2"], network.c)
    assert code == 0, err
    assert "Traceback" not in err and network.a in screen and "2 runs: 1 running, 1 idle" in screen


@integration
def test_live_shows_an_unreachable_runtime_in_the_header_and_keeps_polling() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, screen, err = _live(["--url", url, "--interval", "0.2"], "cannot reach the runtime")
    assert code == 0, err
    assert "Traceback" not in err and "retrying every 0.2 s" in screen


def test_help_says_it_only_watches_and_where_to_act() -> None:
    shown = " ".join(top("--help").stdout.split())
    assert "It only watches: there are no keys to act" in shown and "monitor page (/monitor)" in shown
    for option in ("--url", "--token", "--interval S", "--once", "--config FILE", "$LUFTPAUSE_TOKEN"):
        assert option in shown, option


# --- fitting a large network, without a server -------------------------------------------------


def _network(count: int, fanout: int = 10, running_every: int = 997) -> list[dict[str, Any]]:
    """``count`` runs in the monitor's shape, oldest first: trees of ``fanout`` children under
    each root, every ``running_every``-th run running."""
    runs: list[dict[str, Any]] = []
    for i in range(count):
        root = i - i % fanout
        runs.append(
            {
                "handle": f"run-{i:016x}",
                "name": f"n{i}",
                "state": "running" if i % running_every == 0 else "idle",
                "runState": "running" if i % running_every == 0 else "completed",
                "parent": None if i == root else f"run-{root:016x}",
                "caller": "c",
                "task": "t",
                "scope": None,
                "lastAnswer": f"answer {i} " + "words " * 40,
                "children": [],
                "pendingEvents": 0,
                "serviceClass": "batch",
                "turns": 1,
                "toolCalls": 0,
            }
        )
    return runs


def _render(runs: list[dict[str, Any]], height: int | None, width: int = 160) -> list[str]:
    console = Console(file=io.StringIO(), width=width, height=height or 25, color_system=None)
    console.print(frame(runs, "http://127.0.0.1:7000", height=height))
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue().splitlines()


@pytest.mark.parametrize("height", [5, 24, 60])
def test_ten_thousand_runs_fit_the_terminal_height_with_a_more_line(height: int) -> None:
    runs = _network(10_000)
    lines = _render(runs, height)
    assert len(lines) == height  # title, counts, column names, the runs, the "more" line
    shown = [line for line in lines if re.search(r"run-[0-9a-f]{16}", line)]
    assert len(shown) == height - 4
    fitted = fit(runs, height - 3)
    assert fitted.hidden == 10_000 - len(shown)
    running = f" ({fitted.hidden_running:,} running)" if fitted.hidden_running else ""
    assert lines[-1] == f"… {fitted.hidden:,} more runs{running}"


def test_running_runs_and_their_spawners_come_first_then_the_newest() -> None:
    runs = _network(10_000)  # 11 running: n0 and n9970 roots, 9 others children of idle roots
    index = {r["handle"]: i for i, r in enumerate(runs)}
    running = {r["handle"] for r in runs if r["state"] == "running"}
    spawners = {r["parent"] for r in runs if r["handle"] in running and r["parent"]}
    fitted = fit(runs, 40)
    handles = [r["handle"] for _, r in fitted.lines]
    assert len(handles) == 39 and fitted.hidden == 10_000 - 39 and fitted.hidden_running == 0
    assert running | spawners <= set(handles)
    # Every run shown hangs under its spawner, shown above it with the tree guide.
    for guide, run in fitted.lines:
        if run["parent"] is None:
            assert guide == ""
        else:
            assert guide in ("├─ ", "└─ ") and handles.index(run["parent"]) < handles.index(run["handle"])
    # The roots: the active ones (running, or spawning a running run) first, newest first; then
    # the newest idle ones.
    roots = [index[r["handle"]] for guide, r in fitted.lines if not guide]
    active = [i for i in roots if runs[i]["handle"] in running | spawners]
    assert roots[: len(active)] == sorted(active, reverse=True)
    assert roots[len(active) :] == sorted(roots[len(active) :], reverse=True)
    # The idle runs shown beyond the active ones are the newest: none hidden is newer, but for
    # the idle spawners they hang from.
    leaves = [index[h] for h in handles if h not in running | spawners and runs[index[h]]["parent"]]
    hidden = set(range(10_000)) - {index[h] for h in handles}
    assert max(hidden) < min(leaves) and index[runs[-1]["handle"]] in [index[h] for h in handles]


def test_a_run_whose_spawners_do_not_fit_gives_its_place_to_one_that_does() -> None:
    chain = _network(6, fanout=1, running_every=1_000)  # six roots, run 0 running
    for i in range(1, 6):  # made a chain instead: each under the one before
        chain[i]["parent"] = chain[i - 1]["handle"]
    chain[5]["state"] = "running"
    lonely = _network(2, fanout=1, running_every=1_000)
    lonely[0]["handle"], lonely[1]["handle"] = "run-lonely-0", "run-lonely-1"
    lonely[1]["state"] = "idle"
    fitted = fit(chain + lonely, 3)
    shown = [r["handle"] for _, r in fitted.lines]
    # The deepest running run needs 6 lines with its spawners: it cannot be shown in the 2 there
    # are; its spawners are active but do not fit either, but for the root, which needs 1 line.
    assert shown == ["run-lonely-0", chain[0]["handle"]]
    assert fitted.hidden == 6 and fitted.hidden_running == 1


def test_once_shows_every_run_and_a_small_network_has_no_more_line() -> None:
    runs = _network(30)
    assert len(fit(runs, None).lines) == 30 and fit(runs, 30).hidden == 0
    lines = _render(runs, None)
    assert len(lines) == 3 + 30 and not any(line.startswith("…") for line in lines)


def test_a_narrow_terminal_cuts_cells_never_wraps_them() -> None:
    lines = _render(_network(50), 20, width=60)
    assert len(lines) == 20 and all(len(line) <= 60 for line in lines)


def test_counts_scope_and_urls() -> None:
    runs = [
        {"state": "running", "runState": "AwaitingApproval"},
        {"state": "running", "runState": "running"},
        {"state": "idle", "runState": "failed"},
        {"state": "stopped", "runState": "cancelled"},
    ]
    assert counts_line(runs) == "4 runs: 2 running (1 awaiting approval), 1 idle, 1 stopped"
    assert counts_line([]) == "no runs"
    rule = {"effect": "allow", "access": ["read", "write"], "path": "/ws/b"}
    held = {"handle": "run-x", "name": "d", "scope": [rule]}
    assert short_scope(None) == "-"
    assert short_scope({"granted": [rule], "heldByChildren": []}) == "rw /ws/b"
    assert short_scope({"granted": [rule, rule], "heldByChildren": [held]}) == "rw /ws/b +1 (1 lent)"
    assert runtime_base_url("0.0.0.0:7000") == "http://127.0.0.1:7000"
    assert runtime_base_url("[::1]:7000") == "http://[::1]:7000"
    assert runtime_base_url("10.0.0.5:7001") == "http://10.0.0.5:7001"
    assert normalize_url("127.0.0.1:7000/mcp/") == "http://127.0.0.1:7000"
    assert normalize_url("http://h:1/monitor") == "http://h:1"


def test_the_top_command_is_registered() -> None:
    from luftpause.cli import COMMANDS

    assert COMMANDS["top"][0] == "luftpause.top"
