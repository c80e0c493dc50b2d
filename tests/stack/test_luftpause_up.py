"""``luftpause up``: what it starts, the ready banner, and stopping everything as one."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import pytest
from repo_paths import ROOT

from luftpause.cli import main
from luftpause.config import EMBEDDED_DEFAULT, load_config, parse_config
from luftpause.supervise.up import address_mismatches, banner, busy_message, pages, plan
from luftpause.testkit.launch.procs import ChildProcess, free_port, port_open

pytestmark = pytest.mark.integration


def test_embedded_default_starts_the_simulated_pool_before_the_three_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    children = plan(load_config(), tmp_path)
    assert [c.name for c in children] == [
        "engine sim-a",
        "engine sim-b",
        "mcp fake",
        "scheduler",
        "dataplane",
        "runtime",
    ]
    assert "fake-engine" in children[0].argv and "30001" in children[0].argv
    assert "fake-mcp" in children[2].argv and "7100" in children[2].argv


def test_with_a_file_only_the_three_processes_start(tmp_path: Path) -> None:
    path = tmp_path / "lp.toml"
    path.write_text('[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n')
    children = plan(load_config(path), tmp_path)
    assert [c.name for c in children] == ["scheduler", "dataplane", "runtime"]
    assert all(["--config", str(path.resolve())] == c.argv[-2:] for c in children)


def test_with_a_file_and_simulate_the_simulated_pool_starts_on_the_file_s_ports(tmp_path: Path) -> None:
    path = tmp_path / "lp.toml"
    path.write_text(
        '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:41001"\nmodels = ["m1", "m2"]\n'
        '[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:41002/mcp"\n'
        '[[mcp_servers]]\nname = "local"\ncommand = ["some-mcp-server"]\n'
    )
    children = plan(load_config(path), tmp_path, simulate=True)
    assert [c.name for c in children] == ["engine a", "mcp tools", "scheduler", "dataplane", "runtime"]
    assert children[0].argv[-6:] == ["--port", "41001", "--model", "m1", "--model", "m2"]
    assert children[1].argv[-2:] == ["--port", "41002"]


def test_simulate_starts_each_engine_with_its_replica_s_priority_order(tmp_path: Path) -> None:
    """The engines ``plan`` starts report the queue order their replica names (unset: FIFO)."""
    orders = {"low": "lower_first", "high": "higher_first", "plain": None}
    ports = {name: free_port() for name in orders}
    path = tmp_path / "lp.toml"
    path.write_text(
        "".join(
            f'[[replicas]]\nname = "{name}"\nurl = "http://127.0.0.1:{ports[name]}"\nmodels = ["m"]\n'
            + (f'priority = "{order}"\n' if order else "")
            for name, order in orders.items()
        )
    )
    engines = [c for c in plan(load_config(path), tmp_path, simulate=True) if c.name.startswith("engine ")]
    try:
        for engine in engines:
            engine.start()
        reported = {}
        for engine, name in zip(engines, orders, strict=True):
            engine.wait_ready()
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/server_info", timeout=10) as reply:
                reported[name] = json.load(reply)["schedule_policy"]
    finally:
        for engine in engines:
            engine.stop()
    assert reported == {"low": "lower_first", "high": "higher_first", "plain": "fcfs"}


def test_the_banner_and_readiness_probes_use_urls_that_reach_each_listen(tmp_path: Path) -> None:
    """IPv6 hosts in brackets, an all-addresses listen reached on loopback."""
    path = tmp_path / "v6.toml"
    path.write_text(
        _with(
            scheduler={"grpc": "[::1]:41570", "http": "0.0.0.0:41571"},
            dataplane={"listen": "[::1]:41580", "scheduler": "[::1]:41570"},
            runtime={"listen": "[::]:41590", "dataplane": "http://[::1]:41580"},
        )
    )
    config = load_config(path)
    printed = banner(config, tmp_path)
    assert "OpenAI base_url   http://[::1]:41580/v1\n" in printed
    assert "MCP endpoint      http://[::1]:41590/mcp\n" in printed
    assert "scheduler page    http://127.0.0.1:41571/?runtime=http://%5B::1%5D:41590\n" in printed
    assert "scheduler status  http://127.0.0.1:41571/status\n" in printed
    assert "runtime monitor   http://[::1]:41590/monitor\n" in printed
    assert (
        "metrics           http://127.0.0.1:41571/metrics  http://[::1]:41580/metrics  http://[::1]:41590/metrics\n"
    ) in printed
    assert (
        "ready             http://127.0.0.1:41571/readyz  http://[::1]:41580/readyz  http://[::1]:41590/readyz\n"
    ) in printed
    # up waits for every /readyz, but for a dataplane in front of engines it did not start: alive is
    # enough for that one (its engines may come later), the banner says what is not ready
    probes = {c.name: c.ready_url for c in plan(config, tmp_path)}
    assert probes == {
        "scheduler": "http://127.0.0.1:41571/readyz",
        "dataplane": "http://[::1]:41580/livez",
        "runtime": "http://[::1]:41590/readyz",
    }
    simulated = {c.name: c.ready_url for c in plan(config, tmp_path, simulate=True)}
    assert simulated["dataplane"] == "http://[::1]:41580/readyz"


def test_the_banner_says_what_is_not_ready_yet(tmp_path: Path) -> None:
    path = tmp_path / "lp.toml"
    path.write_text('[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n')
    config = load_config(path)
    assert "not ready" not in banner(config, tmp_path, unready=[])
    printed = banner(config, tmp_path, unready=["dataplane: replicas: 0 healthy", "runtime: journal: no"])
    assert (
        "  not ready         dataplane: replicas: 0 healthy\n                    runtime: journal: no\n"
        in printed
    )


def test_the_banner_names_every_page_and_where_the_token_goes_only_when_it_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    config = load_config(None)
    # without a token the processes' own warnings go to the logs only: the terminal says it too
    unguarded = banner(config, tmp_path)
    assert "  token             LUFTPAUSE_TOKEN is not set: every route is open" in unguarded
    assert "?token=" not in unguarded and "Bearer" not in unguarded
    printed = banner(config, tmp_path, token_set=True)
    assert "not set" not in printed
    for url in (dict(pages(config))[what] for what in ("scheduler page", "runtime monitor")):
        assert url in printed
    assert "LUFTPAUSE_TOKEN is set: /v1, /mcp and both /status need" in printed
    assert "http://127.0.0.1:5001/?runtime=http://127.0.0.1:7000&token=$LUFTPAUSE_TOKEN\n" in printed
    assert "http://127.0.0.1:7000/monitor?token=$LUFTPAUSE_TOKEN\n" in printed


def test_print_config_prints_the_embedded_default_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    assert main(["up", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == EMBEDDED_DEFAULT.strip()
    assert parse_config(printed, "printed.toml").model_dump(exclude={"source"}) == parse_config(
        EMBEDDED_DEFAULT
    ).model_dump(exclude={"source"})


@pytest.mark.parametrize("given", ["--config", "LUFTPAUSE_CONFIG"])
def test_print_config_prints_the_file_up_would_use_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, given: str
) -> None:
    path = tmp_path / "X.toml"
    text = '# mine, comments kept\n[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]'
    path.write_text(text + "\n")
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    if given == "LUFTPAUSE_CONFIG":
        monkeypatch.setenv("LUFTPAUSE_CONFIG", str(path))
    assert main(["up", *(["--config", str(path)] if given == "--config" else []), "--print-config"]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_print_config_says_which_variables_override_the_text_it_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    monkeypatch.setenv("LUFTPAUSE_DATAPLANE__LISTEN", "127.0.0.1:18080")
    assert main(["up", "--print-config"]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == EMBEDDED_DEFAULT.strip()
    assert printed.err == "luftpause up: the environment overrides this text: LUFTPAUSE_DATAPLANE__LISTEN\n"


def test_print_config_refuses_a_bad_file_as_up_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[replicas]]\nname = "a"\nurl = "127.0.0.1:1"\nmodels = ["m"]\n')
    with pytest.raises(SystemExit) as exited:
        main(["up", "--config", str(path), "--print-config"])
    assert exited.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert f"{path}: replicas[0].url" in printed.err


def test_a_taken_port_says_how_to_move_the_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LUFTPAUSE_CONFIG", raising=False)
    embedded = busy_message(["127.0.0.1:8080"], load_config(None))
    assert "already in use: 127.0.0.1:8080" in embedded
    assert "luftpause up --print-config > luftpause.toml" in embedded
    assert "luftpause up --config luftpause.toml --simulate" in embedded
    assert "docs/operating.md: Moving the ports" in embedded
    path = tmp_path / "mine.toml"
    path.write_text('[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n')
    from_file = busy_message(["127.0.0.1:8080"], load_config(path))
    assert f"change these addresses in {path}" in from_file


def _pids_with(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if fragment in cmdline:
                found.append(int(entry.name))
    return found


@pytest.fixture
def up_with_file(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int], Path]]:
    """``luftpause up --config FILE --max-restarts 0`` (one death is a crash loop) against a
    simulated engine and MCP server the test starts, its stdout and stderr in one pipe."""
    with _up_against_pool(
        tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, flags=("--max-restarts", "0")
    ) as started:
        yield started


@contextmanager
def _up_against_pool(
    tmp_path: Path, stdout: int, stderr: int | IO[bytes], flags: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int], Path]]:
    """``luftpause up --config FILE`` (its output to ``stdout``/``stderr``) against a simulated
    engine and MCP server started here; (up, its four ports by name, FILE). Stops all on exit."""
    engine_port, mcp_port = free_port(), free_port()
    ports = {name: free_port() for name in ("grpc", "status", "dataplane", "runtime")}
    path = tmp_path / "up.toml"
    path.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{ports["grpc"]}"
http = "127.0.0.1:{ports["status"]}"
[dataplane]
listen = "127.0.0.1:{ports["dataplane"]}"
scheduler = "127.0.0.1:{ports["grpc"]}"
[runtime]
listen = "127.0.0.1:{ports["runtime"]}"
dataplane = "http://127.0.0.1:{ports["dataplane"]}"
state_dir = "{tmp_path / "state"}"
[[replicas]]
name = "a"
url = "http://127.0.0.1:{engine_port}"
models = ["llama-3.2-1b"]
[[mcp_servers]]
name = "fake"
url = "http://127.0.0.1:{mcp_port}/mcp"
"""
    )
    engine = ChildProcess(
        "engine",
        ["fake-engine", "--port", str(engine_port)],
        tmp_path / "engine.log",
        ready_url=f"http://127.0.0.1:{engine_port}/health",
    ).start()
    mcp = ChildProcess(
        "mcp", ["fake-mcp", "--port", str(mcp_port)], tmp_path / "mcp.log", ready_port=("127.0.0.1", mcp_port)
    ).start()
    up = subprocess.Popen(
        [sys.executable, "-m", "luftpause", "up", "--config", str(path), *flags], stdout=stdout, stderr=stderr
    )
    try:
        engine.wait_ready()
        mcp.wait_ready()
        yield up, ports, path
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        if up.stdout is not None:
            up.stdout.close()
        for pid in _pids_with(str(path)):
            os.kill(pid, signal.SIGKILL)
        engine.stop()
        mcp.stop()


def _read_until(up: subprocess.Popen[bytes], marker: bytes, timeout: float = 60.0) -> bytes:
    assert up.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        line = up.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} from luftpause up; it printed:\n{seen.decode()}")
        seen += line
    return seen


def _wait_exit(up: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """Its exit status; up stops its three children one after another, each given 5 s before
    SIGKILL, so a loaded machine may take well over 20 s."""
    return up.wait(timeout)


def test_up_prints_the_urls_once_ready_and_ctrl_c_stops_every_child(
    up_with_file: tuple[subprocess.Popen[bytes], dict[str, int], Path],
) -> None:
    up, ports, path = up_with_file
    printed = _read_until(up, b"Ctrl-C stops everything")
    assert f"http://127.0.0.1:{ports['dataplane']}/v1".encode() in printed
    assert f"http://127.0.0.1:{ports['runtime']}/mcp".encode() in printed
    # Every page it prints answers (the API endpoints want a POST or a path below them).
    urls = [url for what, url in pages(load_config(path)) if what not in ("OpenAI base_url", "MCP endpoint")]
    for url in (u for line in urls for u in line.split()):
        assert url.encode() in printed
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, url
    assert all(port_open("127.0.0.1", p) for p in ports.values())
    up.send_signal(signal.SIGINT)
    assert _wait_exit(up) == 0
    assert not any(port_open("127.0.0.1", p) for p in ports.values())
    assert _pids_with(str(path)) == []


@pytest.mark.parametrize("variables", [False, True], ids=["file", "and-variables"])
def test_the_readme_recipe_moves_every_port_and_keeps_the_simulated_pool(
    tmp_path: Path, variables: bool
) -> None:
    """``up --print-config``, every address moved, ``up --config FILE --simulate``; ``and-variables``:
    the dataplane's pair moved once more by its environment variables, which ``up`` and the
    children it starts read alike."""
    text = subprocess.run(
        [sys.executable, "-m", "luftpause", "up", "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for default in ("5000", "5001", "8080", "7000", "30001", "30002", "7100"):
        assert f":{default}" in text, default
        text = text.replace(f":{default}", f":{free_port()}")
    text = text.replace('state_dir = "state"', f'state_dir = "{tmp_path / "state"}"')
    path = tmp_path / "moved.toml"
    path.write_text(text)
    config = load_config(path)
    urls = [*(r.url for r in config.replicas), *(s.url for s in config.mcp_servers if s.url)]
    pool = [urlsplit(url).port or 0 for url in urls]  # two simulated engines and the fake MCP server
    listen, env = config.dataplane.listen, dict(os.environ)
    if variables:
        listen = f"127.0.0.1:{free_port()}"
        env |= {"LUFTPAUSE_DATAPLANE__LISTEN": listen, "LUFTPAUSE_RUNTIME__DATAPLANE": f"http://{listen}"}
    up = subprocess.Popen(
        [sys.executable, "-m", "luftpause", "up", "--config", str(path), "--simulate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        printed = _read_until(up, b"Ctrl-C stops everything")
        assert b"luftpause is up (simulated engines)" in printed
        assert f"OpenAI base_url   http://{listen}/v1".encode() in printed
        with urllib.request.urlopen(f"http://{listen}/health", timeout=10) as response:
            assert response.status == 200
        assert port_open("127.0.0.1", int(listen.rsplit(":", 1)[1]))
        assert port_open("127.0.0.1", int(config.dataplane.listen.rsplit(":", 1)[1])) is not variables
        assert len(pool) == 3 and all(port_open("127.0.0.1", port) for port in pool)
        up.send_signal(signal.SIGINT)
        assert _wait_exit(up) == 0
        assert not any(port_open("127.0.0.1", port) for port in pool)
    finally:
        if up.poll() is None:  # a failed check: up stops the pool it started (a kill would orphan it)
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        if up.stdout is not None:
            up.stdout.close()
        for pid in _pids_with(str(path)):
            os.kill(pid, signal.SIGKILL)


def _read_fd_until(fd: int, up: subprocess.Popen[bytes], marker: bytes, timeout: float = 60.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        if up.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} from luftpause up; it printed:\n{seen.decode()}")
        if select.select([fd], [], [], 0.5)[0]:
            seen += os.read(fd, 65536)
    return seen


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:.0f} s")
        time.sleep(0.01)


def _blocked_writing_to_a_pipe(pid: int) -> bool:
    return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()


def _sigint_pending(pid: int) -> bool:
    """SIGINT sent to ``pid`` and not yet delivered (bit 1 of its pending masks, proc(5))."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signal.SIGINT - 1)) for mask in masks)


def test_a_second_ctrl_c_while_stopping_is_ignored_and_up_exits_0(tmp_path: Path) -> None:
    """The second SIGINT arrives while up is still printing "stopping ...": it used to escape as
    a traceback and exit 1. Up's stdout is a pipe this test fills, so that print waits (in
    write) until the test drains it, the second signal arriving surely in between."""
    read_end, write_end = os.pipe()
    errors = tmp_path / "up.stderr"
    try:
        with errors.open("wb") as err, _up_against_pool(tmp_path, stdout=write_end, stderr=err) as started:
            up, ports, path = started
            _read_fd_until(read_end, up, b"Ctrl-C stops everything")
            # A description of its own, non-blocking, so that up's end stays blocking.
            filler = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)
            try:
                while True:
                    os.write(filler, b"x" * 4096)
            except BlockingIOError:
                pass
            finally:
                os.close(filler)
            up.send_signal(signal.SIGINT)
            _wait_for(lambda: _blocked_writing_to_a_pipe(up.pid), "blocked printing")
            up.send_signal(signal.SIGINT)
            _wait_for(lambda: not _sigint_pending(up.pid), "given the second SIGINT")
            os.close(write_end)
            write_end = -1
            printed = b""
            while chunk := os.read(read_end, 65536):  # EOF once up has exited
                printed += chunk
            assert _wait_exit(up) == 0, errors.read_text()
            assert b"stopping ..." in printed
            assert "Traceback" not in errors.read_text()
            assert not any(port_open("127.0.0.1", p) for p in ports.values())
            assert _pids_with(str(path)) == []
    finally:
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])


@pytest.mark.parametrize("victim", ["scheduler", "runtime", "dataplane"])
def test_up_in_a_crash_loop_stops_everything_and_shows_the_log_of_the_child_that_died(
    up_with_file: tuple[subprocess.Popen[bytes], dict[str, int], Path], victim: str
) -> None:
    up, ports, path = up_with_file
    _read_until(up, b"Ctrl-C stops everything")
    # The child up started itself (for runtime and dataplane, granian's main process: its worker
    # process must not outlive it).
    leaders = [
        pid
        for pid in _pids_with(str(path))
        if victim.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and _parent(pid) == up.pid
    ]
    assert len(leaders) == 1
    os.kill(leaders[0], signal.SIGKILL)
    assert _wait_exit(up) == 1
    assert up.stdout is not None
    said = up.stdout.read()
    assert f"{victim} exited".encode() in said
    assert f"{victim} exited 1 time within 60 s (--max-restarts 0): a crash loop".encode() in said
    assert not any(port_open("127.0.0.1", p) for p in ports.values())
    assert _pids_with(str(path)) == []


def test_up_refuses_to_start_when_a_port_it_needs_is_taken(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        path = tmp_path / "busy.toml"
        path.write_text(
            f'[dataplane]\nlisten = "127.0.0.1:{taken}"\n'
            f'[runtime]\ndataplane = "http://127.0.0.1:{taken}"\n'
            '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
        )
        done = subprocess.run(
            [sys.executable, "-m", "luftpause", "up", "--config", str(path)],
            capture_output=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"127.0.0.1:{taken}".encode() in done.stderr
    assert b"already in use" in done.stderr
    assert f"or change these addresses in {path}".encode() in done.stderr


def _with(**sections: dict[str, str]) -> str:
    """A configuration file's text: the given ``[section] key = "value"`` lines, one replica."""
    text = "".join(
        f"[{name}]\n" + "".join(f'{key} = "{value}"\n' for key, value in keys.items())
        for name, keys in sections.items()
    )
    return text + '[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'


@pytest.mark.parametrize(
    ("sections", "keys"),
    [
        (
            {"runtime": {"dataplane": "http://127.0.0.1:41599"}, "dataplane": {"listen": "127.0.0.1:41580"}},
            ('[runtime] dataplane = "http://127.0.0.1:41599"', '[dataplane] listen = "127.0.0.1:41580"'),
        ),
        (
            {"scheduler": {"grpc": "127.0.0.1:41580"}, "dataplane": {"scheduler": "127.0.0.1:41598"}},
            ('[dataplane] scheduler = "127.0.0.1:41598"', '[scheduler] grpc = "127.0.0.1:41580"'),
        ),
        (  # the same machine by other names, but another port
            {"runtime": {"dataplane": "http://localhost:41599"}, "dataplane": {"listen": "0.0.0.0:41580"}},
            ("[runtime] dataplane", "[dataplane] listen"),
        ),
        (
            {"scheduler": {"grpc": "[::]:41580"}, "dataplane": {"scheduler": "[::1]:41598"}},
            ("[dataplane] scheduler", "[scheduler] grpc"),
        ),
        (  # a URL without a port is on port 80
            {"runtime": {"dataplane": "http://127.0.0.1"}, "dataplane": {"listen": "127.0.0.1:41580"}},
            ("[runtime] dataplane", "[dataplane] listen"),
        ),
    ],
)
def test_addresses_that_must_match_and_name_another_port_are_found(
    sections: dict[str, dict[str, str]], keys: tuple[str, str]
) -> None:
    (line,) = address_mismatches(parse_config(_with(**sections), "lp.toml"))
    assert all(key in line for key in keys), line


@pytest.mark.parametrize(
    "sections",
    [
        {"runtime": {"dataplane": "http://localhost:41580"}, "dataplane": {"listen": "127.0.0.1:41580"}},
        {"runtime": {"dataplane": "http://127.0.0.1:41580"}, "dataplane": {"listen": "0.0.0.0:41580"}},
        {"runtime": {"dataplane": "http://[::1]:41580/"}, "dataplane": {"listen": "[::]:41580"}},
        {"runtime": {"dataplane": "http://127.0.0.1"}, "dataplane": {"listen": "127.0.0.1:80"}},
        # another name on another port may be a proxy forwarding to the dataplane
        {"runtime": {"dataplane": "https://gateway.example"}, "dataplane": {"listen": "127.0.0.1:41580"}},
        {"scheduler": {"grpc": "0.0.0.0:41580"}, "dataplane": {"scheduler": "localhost:41580"}},
        {"scheduler": {"grpc": "127.0.0.1:41580"}, "dataplane": {"scheduler": "sched.internal:5000"}},
    ],
)
def test_addresses_that_may_name_the_same_place_pass(sections: dict[str, dict[str, str]]) -> None:
    assert address_mismatches(parse_config(_with(**sections), "lp.toml")) == []


def _exit_before_ready(argv: list[str], path: Path) -> subprocess.CompletedProcess[bytes]:
    """Run ``luftpause up`` and return once it exits; a failure (after stopping it) when it
    prints its ready banner instead."""
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert up.stdout is not None and up.stderr is not None
        out = b""
        for line in up.stdout:
            out += line
            assert b"Ctrl-C stops everything" not in line, out.decode()
        return subprocess.CompletedProcess(argv, up.wait(60), out, up.stderr.read())
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        for stream in (up.stdout, up.stderr):
            if stream is not None:
                stream.close()
        for pid in _pids_with(str(path)):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("simulate", [False, True])
def test_up_refuses_to_start_when_the_runtime_s_dataplane_is_another_port(
    tmp_path: Path, simulate: bool
) -> None:
    ports = {name: free_port() for name in ("grpc", "status", "dataplane", "elsewhere", "runtime", "engine")}
    path = tmp_path / "mismatch.toml"
    path.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{ports["grpc"]}"
http = "127.0.0.1:{ports["status"]}"
[dataplane]
listen = "127.0.0.1:{ports["dataplane"]}"
scheduler = "127.0.0.1:{ports["grpc"]}"
[runtime]
listen = "127.0.0.1:{ports["runtime"]}"
dataplane = "http://127.0.0.1:{ports["elsewhere"]}"
state_dir = "{tmp_path / "state"}"
[[replicas]]
name = "a"
url = "http://127.0.0.1:{ports["engine"]}"
models = ["m"]
"""
    )
    argv = [
        sys.executable,
        "-m",
        "luftpause",
        "up",
        "--config",
        str(path),
        *(["--simulate"] if simulate else []),
    ]
    done = _exit_before_ready(argv, path)
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert f'[runtime] dataplane = "http://127.0.0.1:{ports["elsewhere"]}"' in line
    assert f'[dataplane] listen = "127.0.0.1:{ports["dataplane"]}"' in line
    assert "docs/operating.md: Moving the ports" in line
    assert b"starting" not in done.stdout
    assert not any(port_open("127.0.0.1", p) for p in ports.values())


def test_up_refuses_to_start_when_the_dataplane_s_scheduler_is_another_port(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("grpc", "elsewhere", "status", "dataplane", "runtime")}
    path = tmp_path / "mismatch.toml"
    path.write_text(
        _with(
            scheduler={"grpc": f"127.0.0.1:{ports['grpc']}", "http": f"127.0.0.1:{ports['status']}"},
            dataplane={
                "listen": f"127.0.0.1:{ports['dataplane']}",
                "scheduler": f"localhost:{ports['elsewhere']}",
            },
            runtime={
                "listen": f"127.0.0.1:{ports['runtime']}",
                "dataplane": f"http://127.0.0.1:{ports['dataplane']}",
                "state_dir": str(tmp_path / "state"),
            },
        )
    )
    done = _exit_before_ready([sys.executable, "-m", "luftpause", "up", "--config", str(path)], path)
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert f'[dataplane] scheduler = "localhost:{ports["elsewhere"]}"' in line
    assert f'[scheduler] grpc = "127.0.0.1:{ports["grpc"]}"' in line
    assert not any(port_open("127.0.0.1", p) for p in ports.values())


def test_what_make_up_and_the_moving_the_ports_recipe_write_is_ignored_by_git() -> None:
    """``state/`` (logs, journal) and ``luftpause.toml`` from ``up --print-config > luftpause.toml``."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["luftpause.toml", "state/logs/runtime.log", "state/runs.jsonl"]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.stdout.split() == names
    kept = subprocess.run(
        ["git", "check-ignore", "--no-index", "tests/luftpause.toml"],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
    )
    assert kept.returncode == 1  # only the root's: a fixture of that name elsewhere stays tracked
