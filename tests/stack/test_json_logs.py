"""``luftpause --log-format json``: one JSON object per line from every luftpause process.

Every line of every log must parse as a JSON object (the processes' "serving on ..." lines
included), with ``time`` in UTC ISO 8601 with milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import httpx2
import pytest

from luftpause.cli import main
from luftpause.observe import logs
from luftpause.testkit.launch.procs import ChildProcess, free_port, http_ok

KEYS = {"time", "level", "logger", "process", "message"}
LEVEL_ENV = "LUFTPAUSE_LOG_LEVEL"


def _records(log: Path, process: str) -> list[dict[str, object]]:
    """Every line of ``log`` as a JSON object of ``process``; fails on any line that is not one."""
    records = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{log.name} line {number} is not JSON: {line!r}") from None
        assert isinstance(record, dict) and KEYS <= record.keys(), (log.name, line)
        assert record["process"] == process, (log.name, line)
        moment = datetime.fromisoformat(str(record["time"]))
        assert moment.utcoffset() == timedelta(0), record["time"]
        assert str(record["time"]).endswith("Z") and len(str(record["time"]).split(".")[1]) == 4, record[
            "time"
        ]
        records.append(record)
    return records


def _lenient(log: Path) -> list[dict[str, object]]:
    """The lines of ``log`` that already parse (used only while waiting)."""
    records = []
    for line in log.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _connected(records: list[dict[str, object]]) -> bool:
    return any(
        r.get("logger") == "luftpause.dataplane"
        and str(r.get("message")).startswith("connected to scheduler")
        for r in records
    )


def test_scheduler_dataplane_and_the_granian_worker_log_json_lines(tmp_path: Path) -> None:
    grpc, status, dataplane, nowhere = free_port(), free_port(), free_port(), free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc}"\nhttp = "127.0.0.1:{status}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{dataplane}"\nscheduler = "127.0.0.1:{grpc}"\n'
        f'[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:{nowhere}"\nmodels = ["m"]\n'
    )
    children = [
        ChildProcess(
            name,
            ["--log-format", "json", name, "--config", str(config)],
            tmp_path / f"{name}.log",
            env={"LUFTPAUSE_TOKEN": ""},
            ready_url=ready,
        )
        for name, ready in (
            ("scheduler", f"http://127.0.0.1:{status}/health"),
            ("dataplane", f"http://127.0.0.1:{dataplane}/health"),
        )
    ]
    try:
        for child in children:
            child.start().wait_ready()
        deadline = time.monotonic() + 30  # generous for a loaded machine; polled every 0.1 s
        while time.monotonic() < deadline and not _connected(_lenient(tmp_path / "dataplane.log")):
            time.sleep(0.1)
    finally:
        for child in reversed(children):
            child.stop()
    scheduler = _records(tmp_path / "scheduler.log", "scheduler")
    assert any(str(r["message"]).startswith("luftpause scheduler: gRPC on") for r in scheduler)
    records = _records(tmp_path / "dataplane.log", "dataplane")
    assert "_granian" in {r["logger"] for r in records}  # granian's own, through the same formatter
    assert any("LUFTPAUSE_TOKEN is not set" in str(r["message"]) for r in records)  # the main process
    assert any(str(r["message"]).startswith("luftpause dataplane: OpenAI-compatible proxy") for r in records)
    assert _connected(records), records  # the worker process's own record


def test_up_children_and_the_simulators_log_only_json_lines(tmp_path: Path) -> None:
    """``luftpause --log-format json up``: the scheduler, dataplane and runtime it starts, and a
    fake engine and fake MCP server started the same way, write nothing but JSON lines."""
    engine_port, mcp_port = free_port(), free_port()
    ports = {name: free_port() for name in ("grpc", "status", "dataplane", "runtime")}
    config = tmp_path / "up.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{ports["grpc"]}"\nhttp = "127.0.0.1:{ports["status"]}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{ports["dataplane"]}"\nscheduler = "127.0.0.1:{ports["grpc"]}"\n'
        f'[runtime]\nlisten = "127.0.0.1:{ports["runtime"]}"\n'
        f'dataplane = "http://127.0.0.1:{ports["dataplane"]}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:{engine_port}"\nmodels = ["llama-3.2-1b"]\n'
        f'[[mcp_servers]]\nname = "fake"\nurl = "http://127.0.0.1:{mcp_port}/mcp"\n'
    )
    logs = tmp_path / "logs"
    engine = ChildProcess(
        "engine",
        ["--log-format", "json", "fake-engine", "--port", str(engine_port)],
        tmp_path / "engine.log",
        ready_url=f"http://127.0.0.1:{engine_port}/health",
    )
    mcp = ChildProcess(
        "mcp",
        ["--log-format", "json", "fake-mcp", "--port", str(mcp_port)],
        tmp_path / "mcp.log",
        ready_port=("127.0.0.1", mcp_port),
    )
    up: subprocess.Popen[bytes] | None = None
    up_args = ["--config", str(config), "--logs", str(logs)]
    try:
        engine.start().wait_ready()
        mcp.start().wait_ready()
        with open(tmp_path / "up.out", "wb") as out:
            up = subprocess.Popen(
                [sys.executable, "-m", "luftpause", "--log-format", "json", "up", *up_args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "luftpause is up" not in (tmp_path / "up.out").read_text():
            assert up.poll() is None, (tmp_path / "up.out").read_text()
            time.sleep(0.2)
        assert http_ok(f"http://127.0.0.1:{ports['runtime']}/health"), (tmp_path / "up.out").read_text()
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    finally:
        if up is not None and up.poll() is None:
            up.kill()
            up.wait()
        engine.stop()
        mcp.stop()
    runtime = _records(logs / "runtime.log", "runtime")
    assert any(str(r["message"]).startswith("luftpause runtime: MCP on") for r in runtime), runtime
    _records(logs / "scheduler.log", "scheduler")
    _records(logs / "dataplane.log", "dataplane")
    assert any(
        "serving llama-3.2-1b" in str(r["message"]) for r in _records(tmp_path / "engine.log", "fake-engine")
    )
    assert any("serving lookup" in str(r["message"]) for r in _records(tmp_path / "mcp.log", "fake-mcp"))


def test_an_unknown_log_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--log-format", "xml", "scheduler"])
    assert exited.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """Undo :func:`logs.configure` after the test: the root's handlers and level, and the levels
    of the per-request loggers, as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpx2", "httpcore", "httpcore2")}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)


def _post_with_httpx_and_httpx2() -> None:
    """One POST with each client library (the mcp SDK's httpx2 and httpx), over a mock transport:
    the libraries' own code writes their ``HTTP Request: POST ...`` line, no socket needed."""
    with httpx2.Client(transport=httpx2.MockTransport(lambda request: httpx2.Response(200))) as client2:
        client2.post("http://127.0.0.1:7000/mcp")
    with httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200))) as client:
        client.post("http://127.0.0.1:7000/mcp")


@pytest.mark.usefixtures("restored_logging")
def test_the_http_clients_per_request_lines_are_kept_out_at_info(capsys: pytest.CaptureFixture[str]) -> None:
    # luftpause loadgen --spawn 10 wrote one such line per MCP message, burying the summary.
    logs.configure("loadgen")
    _post_with_httpx_and_httpx2()
    logging.getLogger("luftpause.loadgen").info("our own line")
    logging.getLogger("httpx2").warning("a client warning")
    err = capsys.readouterr().err
    assert "HTTP Request" not in err
    assert "our own line" in err and "a client warning" in err


@pytest.mark.usefixtures("restored_logging")
def test_the_http_clients_per_request_lines_are_shown_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("loadgen", logging.DEBUG)
    _post_with_httpx_and_httpx2()
    err = capsys.readouterr().err
    assert 'httpx2 INFO HTTP Request: POST http://127.0.0.1:7000/mcp "HTTP/1.1 200 OK"' in err
    assert "httpx INFO HTTP Request: POST" in err


@pytest.fixture
def posting_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """``luftpause top`` runs one POST with each HTTP client library instead of watching a runtime,
    so :func:`main` (argument parsing, ``logs.configure``) is what decides which lines show.
    ``LUFTPAUSE_LOG_LEVEL`` is unset for the test and put back after it (``main`` writes it)."""
    import luftpause.top.view

    def run(args: object) -> int:
        _post_with_httpx_and_httpx2()
        logging.getLogger("luftpause.top").info("our own line")
        return 0

    monkeypatch.setattr(luftpause.top.view, "run", run)
    monkeypatch.setenv(LEVEL_ENV, "")
    monkeypatch.delenv(LEVEL_ENV)
    monkeypatch.delenv(logs.LOG_FORMAT_ENV, raising=False)


@pytest.mark.usefixtures("restored_logging", "posting_command")
def test_log_level_debug_lets_the_per_request_lines_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "debug", "top"]) == 0
    err = capsys.readouterr().err
    assert 'httpx2 INFO HTTP Request: POST http://127.0.0.1:7000/mcp "HTTP/1.1 200 OK"' in err
    assert "httpx INFO HTTP Request: POST" in err
    # luftpause up's children and granian's workers read it from the environment.
    assert os.environ[LEVEL_ENV] == "debug"


@pytest.mark.usefixtures("restored_logging", "posting_command")
def test_the_default_log_level_is_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top"]) == 0
    err = capsys.readouterr().err
    assert "HTTP Request" not in err
    assert "our own line" in err


@pytest.mark.usefixtures("restored_logging", "posting_command")
def test_log_level_warning_hides_info_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "warning", "top"]) == 0
    assert "our own line" not in capsys.readouterr().err


@pytest.mark.usefixtures("restored_logging", "posting_command")
def test_the_log_level_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a child of luftpause up (started without --log-level) sees.
    monkeypatch.setenv(LEVEL_ENV, "debug")
    assert main(["top"]) == 0
    assert "httpx INFO HTTP Request: POST" in capsys.readouterr().err
    assert logs.granian_log_config("dataplane")["root"]["level"] == "DEBUG"
    monkeypatch.setenv(LEVEL_ENV, "error")
    assert logs.granian_log_config("dataplane")["root"]["level"] == "ERROR"


def test_an_unknown_log_level_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--log-level", "verbose", "scheduler"])
    assert exited.value.code == 2
    assert "argument --log-level: invalid choice: 'verbose'" in capsys.readouterr().err
