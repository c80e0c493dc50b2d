"""``luftpause top`` (issue 6): the run network in a terminal, read from the monitor's JSON.

End to end: the real runtime process with the scripted engine of the pods tests
(:mod:`pods_helpers`), a run ``a`` that spawns a child ``c`` held busy in its turn, and
``python -m luftpause top`` as a subprocess (``--once``, and live in a pseudo-terminal ended by
Ctrl-C). The fitting of a large network to the terminal is tested on data in the monitor's shape
without a server.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pods_helpers import Pod, call, script, start_pod, until
from rich.console import Console

from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.procs import free_port
from luftpause.top.monitor_client import NetworkPoller, parse_url
from luftpause.top.view import (
    COLUMNS,
    column_widths,
    counts_line,
    fit,
    frame,
    more_line,
    short_scope,
    state_text,
)

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


def top(*argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "luftpause", "top", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
    )


@dataclass
class Network:
    pod: Pod
    a: str
    c: str


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A runtime with a token and two runs: ``a`` (answered: completed) and its child ``c``, busy
    in a turn the engine holds until the end of the module."""
    with start_pod(tmp_path_factory.mktemp("top"), token=TOKEN) as pod:
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
    assert "2 runs: 1 running, 1 completed" in out  # the run states, in the pages' words
    a_row, c_row = _row(out, network.a), _row(out, network.c)
    # c hangs under a: a is a root line, c's line starts with the tree guide, right below a.
    lines = out.splitlines()
    assert lines.index(c_row) == lines.index(a_row) + 1
    assert re.match(r"^a\s", a_row) and re.match(r"^└─ c\s", c_row), (a_row, c_row)
    # a: answered (completed), batch (as spawned; c inherits it), 2 turns, 1 tool call (the
    # spawn), no scope, the first line of its answer; c: running, no turn answered, no answer yet.
    assert re.search(r"\scompleted\s+batch\s+2\s+1\s+-\s+A is waiting$", a_row), a_row
    # c reads what a's grant let it read (the workspace) and writes nothing; a, idle, holds none.
    assert re.search(rf"\srunning\s+batch\s+0\s+0\s+r {re.escape(str(network.pod.workspace))}\s*$", c_row), (
        c_row
    )
    assert "for c" not in out  # only the answer's first line
    assert all(line == line.rstrip() for line in lines)  # no padding at the ends of lines


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


@dataclass
class LiveRun:
    code: int
    before: str
    """The screen output until the signal."""
    after: str
    """The screen output after it, to the end."""
    err: str


def _live(
    argv: list[str], until_text: str, rows: int = 12, cols: int = 160, signum: int = signal.SIGINT
) -> LiveRun:
    """``luftpause top`` live in a pseudo-terminal of ``rows`` x ``cols``: waits until its screen
    shows ``until_text``, sends ``signum`` (Ctrl-C's SIGINT by default) and reads the screen to
    the end."""
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

    def read_until(done: Callable[[bytes], bool], what: str) -> bytes:
        screen = b""
        deadline = time.monotonic() + 30  # a fail-safe bound only
        while not done(screen):
            assert time.monotonic() < deadline, f"never {what}: {screen[-2000:]!r}"
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal (it ended)
                    break
                if not chunk:
                    break
                screen += chunk
        return screen

    try:
        before = read_until(lambda screen: until_text.encode() in screen, f"showed {until_text!r}")
        process.send_signal(signum)
        after = read_until(lambda screen: False, "ended")
        code = process.wait(timeout=30)
        assert process.stderr is not None
        return LiveRun(
            code,
            before.decode("utf-8", "replace"),
            after.decode("utf-8", "replace"),
            process.stderr.read().decode(),
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        os.close(leader)


@integration
def test_live_shows_the_network_and_ctrl_c_ends_it_with_exit_code_0(network: Network) -> None:
    shown = _live(["--url", network.pod.url, "--token", TOKEN, "--interval", "0.2"], network.c)
    assert shown.code == 0, shown.err
    assert "Traceback" not in shown.err and network.a in shown.before
    assert "2 runs: 1 running, 1 completed" in shown.before


@integration
def test_live_shows_an_unreachable_runtime_in_the_header_and_keeps_polling() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    shown = _live(["--url", url, "--interval", "0.2"], "cannot reach the runtime")
    assert shown.code == 0, shown.err
    assert "Traceback" not in shown.err and "retrying every 0.2 s" in shown.before


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
    assert lines[-1] == more_line(fitted)
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
    chain[5]["state"], chain[5]["runState"] = "running", "running"
    lonely = _network(2, fanout=1, running_every=1_000)
    lonely[0]["handle"], lonely[1]["handle"] = "run-lonely-0", "run-lonely-1"
    lonely[1]["state"], lonely[1]["runState"] = "idle", "completed"
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


@pytest.mark.parametrize("width", [30, 50, 60, *range(62, 84), 100, 120, 200])
def test_every_width_gives_exactly_height_lines_with_the_more_line(width: int) -> None:
    # Classes and scopes of different widths: the reviewer's 80-column terminal wrapped the
    # LAST ANSWER header to two lines at widths 62-83 (depending on the classes shown), so the
    # frame had height + 1 lines and the "more" line went off screen.
    runs = _network(200, running_every=7)
    rule = {"effect": "allow", "access": ["read", "write"], "path": "/workspace/some/deeper/directory"}
    for i, run in enumerate(runs):
        run["serviceClass"] = "interactive" if i % 3 else "batch"
        run["scope"] = {"granted": [rule], "heldByChildren": []} if i % 2 else None
    lines = _render(runs, 20, width=width)
    assert len(lines) == 20, lines
    assert re.fullmatch(r"… [\d,]+ more runs \([\d,]+ running\)", lines[-1]), lines[-1]
    assert all(len(line) <= width and line == line.rstrip() for line in lines), lines
    rows = lines[3:-1]
    assert len(rows) == 16
    if width >= 60:  # handles and states whole, the answer shown
        assert all(re.search(r"\srun-[0-9a-f]{16}\s+(running|completed)\s", row) for row in rows), rows
        assert lines[2].endswith("LAST ANSWER")
    if width >= 80:  # the answer gets a useful width: at least its first two words
        assert all(re.search(r"answer \d+ words", row) for row in rows), rows
    if width >= 140:  # then every column
        assert lines[2].split() == [
            "RUN",
            "HANDLE",
            "STATE",
            "CLASS",
            "TURNS",
            "TOOLS",
            "SCOPE",
            "LAST",
            "ANSWER",
        ]


def test_a_narrow_terminal_drops_scope_then_class_then_the_counters() -> None:
    desired = {
        "RUN": 10,
        "HANDLE": 20,
        "STATE": 7,
        "CLASS": 11,
        "TURNS": 5,
        "TOOLS": 5,
        "SCOPE": 30,
        "LAST ANSWER": 200,
    }
    # RUN HANDLE STATE with gaps: 10 + 20 + 7 + 4 = 41; each further column adds its width + 2.
    assert list(column_widths(desired, 200)) == list(COLUMNS)
    assert "SCOPE" not in column_widths(desired, 41 + 2 + 24 + 7 + 7 + 13 + 31)
    assert list(column_widths(desired, 41 + 2 + 24 + 7 + 7 + 13)) == [
        "RUN",
        "HANDLE",
        "STATE",
        "CLASS",
        "TURNS",
        "TOOLS",
        "LAST ANSWER",
    ]
    assert list(column_widths(desired, 41 + 2 + 24 + 7 + 7 + 12)) == [
        "RUN",
        "HANDLE",
        "STATE",
        "TURNS",
        "TOOLS",
        "LAST ANSWER",
    ]
    assert list(column_widths(desired, 41 + 2 + 24)) == ["RUN", "HANDLE", "STATE", "LAST ANSWER"]
    assert column_widths(desired, 41 + 2 + 24)["LAST ANSWER"] == 24
    for width in (41 + 2 + 8, 60, 80, 100, 200):  # every column counted fits the width exactly
        widths = column_widths(desired, width)
        assert sum(widths.values()) + 2 * (len(widths) - 1) <= width
        assert (widths["HANDLE"], widths["STATE"]) == (20, 7)
    assert column_widths(desired, 30)["HANDLE"] == 20  # the name is cut first


STATES = [
    # (the monitor's pod state "state", its "runState") -> what top shows, as both pages do
    (("running", "AwaitingApproval"), "awaiting approval"),
    (("running", "running"), "running"),
    (("idle", "failed"), "failed"),
    (("idle", "completed"), "completed"),
    (("stopped", "cancelled"), "cancelled"),
    (("stopped", "completed"), "completed (stopped)"),
    (("stopped", "failed"), "failed (stopped)"),
    (("idle", "Suspended"), "Suspended"),  # a state of a newer runtime: shown as it is sent
    (("idle", None), "-"),
]


@pytest.mark.parametrize(("sent", "shown"), STATES, ids=[shown for _, shown in STATES])
def test_a_runs_state_is_shown_in_the_words_of_the_pages(sent: tuple[str, str | None], shown: str) -> None:
    state, run_state = sent
    run = {"state": state} if run_state is None else {"state": state, "runState": run_state}
    assert state_text(run).plain == shown


def test_the_counts_are_by_run_state_and_the_more_line_names_the_live_runs() -> None:
    runs = [{"state": state, "runState": run_state} for (state, run_state), _ in STATES]
    assert counts_line(runs) == (
        "9 runs: 1 running, 1 awaiting approval, 2 completed, 2 failed, 1 cancelled, 1 Suspended, "
        "1 with no state"
    )
    assert counts_line([]) == "no runs"
    live = [
        {"handle": f"run-{i}", "state": "running", "runState": "AwaitingApproval" if i % 3 else "running"}
        for i in range(9)
    ]
    fitted = fit([{"handle": "root", "state": "idle", "runState": "completed"}, *live], 2)
    assert [r["handle"] for _, r in fitted.lines] == ["run-8"]  # the newest live run
    assert (fitted.hidden, fitted.hidden_running, fitted.hidden_awaiting) == (9, 3, 5)
    assert more_line(fitted) == "… 9 more runs (3 running, 5 awaiting approval)"


def test_counts_scope_and_urls() -> None:
    rule = {"effect": "allow", "access": ["read", "write"], "path": "/ws/b"}
    held = {"handle": "run-x", "name": "d", "scope": [rule]}
    assert short_scope(None) == "-"
    assert short_scope({"granted": [rule], "heldByChildren": []}) == "rw /ws/b"
    assert short_scope({"granted": [rule, rule], "heldByChildren": [held]}) == "rw /ws/b +1 (1 lent)"
    assert parse_url("127.0.0.1:7000/mcp/") == ("http://127.0.0.1:7000", None)
    assert parse_url("http://h:1/monitor") == ("http://h:1", None)
    assert parse_url("https://h:1/monitor/?token=sekrit#x") == ("https://h:1", "sekrit")


def test_the_top_command_is_registered() -> None:
    from luftpause.cli import COMMANDS

    assert COMMANDS["top"][0] == "luftpause.top.view"


# --- what the runtime sends is shown, never obeyed ---------------------------------------------------

HOSTILE = "x \x1b]0;PWNED-TITLE\x07 \x1b[31mRED\x1b[0m \x1b[2J \x1b]52;c;cHduZWQ=\x07 \x9b2J \x7f\x08\r [link=http://evil]y[/link]"
"""An answer a model was led to write: set the title, colour, clear the screen, write the
clipboard (OSC 52), a C1 CSI, DEL, backspace, carriage return, and rich markup (OSC 8 link)."""


def _hostile_network() -> list[dict[str, Any]]:
    rule = {"effect": "allow", "access": ["read"], "path": f"/ws/{HOSTILE}"}
    return [
        {
            "handle": f"run-1{HOSTILE}",
            "name": f"name{HOSTILE}",
            "state": f"running{HOSTILE}",
            "runState": f"own{HOSTILE}",
            "serviceClass": f"class{HOSTILE}",
            "scope": {"granted": [rule], "heldByChildren": []},
            "lastAnswer": f"answer {HOSTILE}",
            "turns": 1,
            "toolCalls": 0,
        },
        {"handle": "run-2", "parent": f"run-1{HOSTILE}", "state": "idle", "error": f"failed {HOSTILE}"},
    ]


def _controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}


@pytest.mark.parametrize("width", [80, 400])
def test_control_characters_from_the_runtime_never_reach_the_terminal(width: int) -> None:
    shown = "\n".join(_render(_hostile_network(), None, width=width))
    assert _controls(shown) == set(), repr(shown)
    assert "PWNED-TITLE" in shown and "\ufffd]0;" in shown  # shown, as text
    if width == 400:  # rich markup is text too: no OSC 8 link, the brackets shown
        assert "[link=http://evil]y[/link]" in shown and "failed x" in shown
    # The header's error and URL too (an HTTP error's body is the server's text).
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(frame(None, f"http://h{HOSTILE}", height=None, error=f"HTTP 500: {HOSTILE}"))
    assert isinstance(console.file, io.StringIO) and _controls(console.file.getvalue()) == set()


def test_control_characters_stay_out_of_styled_output() -> None:
    # With colours on, the only escape sequences are rich's own SGR styles (ESC [ ... m).
    console = Console(file=io.StringIO(), width=300, color_system="truecolor", force_terminal=True)
    console.print(frame(_hostile_network(), "http://h", height=None))
    assert isinstance(console.file, io.StringIO)
    without_styles = re.sub(r"\x1b\[[0-9;]*m", "", console.file.getvalue())
    assert _controls(without_styles) == set(), repr(without_styles)


# --- a runtime that answers badly, without a runtime ------------------------------------------------


class RawHttpServer:
    """Answers every connection on ``127.0.0.1:<port>`` with ``reply`` (bytes sent as they
    are) once the request's head has arrived, then closes it; ``requests`` keeps the heads."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._socket = socket.create_server(("127.0.0.1", self.port))
        self._socket.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="raw-http", daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(10)
                head = b""
                try:
                    while b"\r\n\r\n" not in head:
                        chunk = connection.recv(65536)
                        if not chunk:
                            break
                        head += chunk
                    self.requests.append(head)
                    connection.sendall(self.reply)
                except OSError:
                    pass

    def __enter__(self) -> RawHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._socket.close()


def _http(
    status: str, body: bytes, content_type: str = "application/json", length: int | None = None
) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length or len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def _monitor(runs: Any) -> bytes:
    return _http("200 OK", json.dumps({"version": "b.1", "runs": runs}).encode())


def _one_error_line(shown: subprocess.CompletedProcess[str], url: str) -> str:
    assert shown.returncode == 1 and shown.stdout == "", (shown.returncode, shown.stdout)
    assert "Traceback" not in shown.stderr and len(shown.stderr.splitlines()) == 1, shown.stderr
    assert shown.stderr.startswith(f"luftpause top: {url}"), shown.stderr
    return shown.stderr.strip()


HTML_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\n<center><h1>502 Bad Gateway</h1>"
    + (b"\n<p>" + b"padding " * 200 + b"</p>\n</center>\n</body>\n</html>\n")
)


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        # A gRPC (HTTP/2) port: its SETTINGS frame is no HTTP/1 status line.
        (b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64", "no HTTP answer the monitor gives"),
        (
            b"SSH-2.0-OpenSSH_9.6\r\n",
            "no HTTP answer the monitor gives (is this the runtime?): BadStatusLine",
        ),
        (_http("200 OK", b'{"version"', length=100), "IncompleteRead"),
        (b"", "RemoteDisconnected"),
        (_http("200 OK", b"hello", "text/plain"), "/monitor/runs: not JSON"),
        (
            _http("502 Bad Gateway", HTML_502, "text/html"),
            "HTTP 502: <html> <head><title>502 Bad Gateway</title>",
        ),
        (
            _http("302 Found", b"", "text/plain").replace(
                b"Connection", b"Location: http://elsewhere/\r\nConnection"
            ),
            "HTTP 302",
        ),
        (
            _monitor([{"handle": "run-1", "scope": {"granted": [], "heldByChildren": 3}}]),
            "not a luftpause runtime's monitor data: runs[0].scope.heldByChildren: expected a list, "
            "got an integer",
        ),
        (
            _monitor([3]),
            "not a luftpause runtime's monitor data: runs[0]: expected an object, got an integer",
        ),
        (
            _monitor({"run-1": {}}),
            "not a luftpause runtime's monitor data: runs: expected a list, got an object",
        ),
        (
            _monitor([{"handle": "run-1", "turns": "2"}]),
            "runs[0].turns: expected an integer or null, got a string",
        ),
        (
            _monitor([{"handle": "run-1", "scope": {"granted": [{"access": "rw"}]}}]),
            "runs[0].scope.granted[0].access: expected a list, got a string",
        ),
        (_http("200 OK", b'{"runs": []}'), "not a luftpause runtime's monitor data: no version"),
    ],
    ids=[
        "grpc",
        "ssh",
        "cut-short",
        "closed",
        "not-json",
        "html-502",
        "redirect",
        "held-by-children",
        "run-not-object",
        "runs-not-list",
        "turns-string",
        "access-string",
        "no-version",
    ],
)
def test_a_bad_answer_is_one_line_and_exit_code_1(reply: bytes, says: str) -> None:
    with RawHttpServer(reply) as server:
        shown = top("--url", f"{server.url}/monitor?token=sekrit", "--once")
    line = _one_error_line(shown, server.url)
    assert says in line, line
    assert "sekrit" not in shown.stderr and len(line) < 400, line
    assert "\ufffd" not in line, line  # no bytes of a binary answer (the gRPC frame's) shown
    if reply.startswith(b"HTTP/1.1 302"):  # the redirect is not followed (the token would go along)
        assert len(server.requests) == 1


def test_live_shows_a_bad_answer_in_the_header_and_keeps_polling() -> None:
    with RawHttpServer(b"SSH-2.0-OpenSSH_9.6\r\n") as server:
        shown = _live(["--url", server.url, "--interval", "0.2"], "retrying every 0.2 s")
    assert shown.code == 0, shown.err
    assert "Traceback" not in shown.err and "no HTTP answer the monitor gives" in shown.before
    assert len(server.requests) >= 1


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://127.0.0.1/?token=sekrit", "ftp://127.0.0.1/: not an http:// or https:// URL"),
        (
            "http://127.0.0.1:abc/monitor?token=sekrit",
            "http://127.0.0.1:abc/monitor: not a URL: Port could not",
        ),
        ("http://127.0.0.1:99999", "http://127.0.0.1:99999: not a URL: Port out of range"),
        ("http://exa mple", "http://exa mple: no valid host in the URL"),
        ("http://[::1", "http://[::1: not a URL: Invalid IPv6 URL"),
        ("http://[::1/monitor?token=sekrit", "http://[::1/monitor: not a URL: Invalid IPv6 URL"),
        (
            "http://me:sekrit@127.0.0.1:7000",
            "http://127.0.0.1:7000: a user name or password in the URL is not used",
        ),
        ("http://:7000", "http://:7000: no valid host in the URL"),
        ("", "--url is empty"),
        ("  ", "--url is empty"),
    ],
)
@pytest.mark.parametrize("once", [True, False], ids=["once", "live"])
def test_a_url_that_cannot_work_is_refused_at_once_with_exit_code_2(url: str, says: str, once: bool) -> None:
    shown = top("--url", url, *(["--once"] if once else []), timeout=20)
    assert shown.returncode == 2 and shown.stdout == "", shown
    assert "Traceback" not in shown.stderr and len(shown.stderr.splitlines()) == 1, shown.stderr
    assert shown.stderr.startswith(f"luftpause top: {says}"), shown.stderr
    assert "sekrit" not in shown.stderr


def test_live_mode_without_a_terminal_says_to_use_once() -> None:
    with RawHttpServer(_monitor([])) as server:
        shown = top("--url", server.url, timeout=20)  # stdout is a pipe
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.strip() == (
        "luftpause top: standard output is not a terminal: live mode draws on a terminal; "
        "use --once to print the network once"
    )
    assert server.requests == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_restore_the_terminal_and_exit_0(signum: int) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    shown = _live(["--url", url, "--interval", "0.2"], "cannot reach the runtime", signum=signum)
    assert shown.code == 0, (shown.code, shown.err)
    assert "Traceback" not in shown.err
    assert "\x1b[?1049h" in shown.before  # it drew on the alternate screen
    assert "\x1b[?1049l" in shown.after and "\x1b[?25h" in shown.after  # main screen and cursor back


def test_the_token_comes_from_the_urls_query_unless_given() -> None:
    with RawHttpServer(_monitor([])) as server:
        assert top("--url", f"{server.url}/monitor?token=from-url", "--once").returncode == 0
        given = top("--url", f"{server.url}/monitor?token=from-url", "--once", "--token", "given")
        assert given.returncode == 0 and "from-url" not in given.stdout
        env = top("--url", server.url, "--once", LUFTPAUSE_TOKEN="from-env")
        assert env.returncode == 0
        over_env = top("--url", f"{server.url}?token=from-url", "--once", LUFTPAUSE_TOKEN="from-env")
        assert over_env.returncode == 0
    tokens = [re.search(rb"Authorization: Bearer (\S+)", head) for head in server.requests]
    assert [t.group(1) if t else None for t in tokens] == [b"from-url", b"given", b"from-env", b"from-url"]
    paths = [head.split(b" ")[1] for head in server.requests]
    assert paths == [b"/monitor/runs"] * 4  # the query is not sent on


def test_once_shows_the_hostile_network_as_text() -> None:
    with RawHttpServer(_monitor(_hostile_network())) as server:
        shown = top("--url", server.url, "--once")
    assert shown.returncode == 0, shown.stderr
    assert "PWNED-TITLE" in shown.stdout and _controls(shown.stdout) == set(), repr(shown.stdout)


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
@pytest.mark.parametrize("which", ["network", "hostile", "wide"])
def test_the_plain_once_frame_is_the_live_frame_without_styles(width: int, which: str) -> None:
    """``--once`` prints :func:`plain_frame` (no rich needed); it shows what the live frame shows."""
    from luftpause.top.view import plain_frame

    networks = {"network": _network(40, running_every=3), "hostile": _hostile_network(), "wide": _network(3)}
    runs = networks[which]
    if which == "wide":
        runs[1]["name"] = "名前のある走り" * 3  # two columns a character
        runs[2]["lastAnswer"] = "e\u0301" * 50  # combining accents take none
    assert plain_frame(runs, "http://127.0.0.1:7000", width).splitlines() == _render(runs, None, width)


_WITHOUT_RICH = (
    "import sys; sys.modules['rich'] = None; "
    "from luftpause.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def test_once_needs_no_rich_but_live_mode_does() -> None:
    """``rich`` made unimportable in the child (as when the ``tui`` extra is not installed)."""
    with RawHttpServer(_monitor(_network(3))) as server:
        argv = [sys.executable, "-c", _WITHOUT_RICH, "top", "--url", server.url]
        shown = subprocess.run([*argv, "--once"], capture_output=True, text=True, env=_env(), timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "3 runs" in shown.stdout and "run-" in shown.stdout
        live = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    assert live.returncode == 2 and live.stderr.strip().endswith("pip install 'luftpause[tui]'"), live.stderr
