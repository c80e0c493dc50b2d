"""Settings given as environment variables and flags, as an operator gives them: real processes
listen where the variable or the flag says (over the file, a flag over a variable), the dataplane's
granian worker uses them too, and a bad one stops the process at start naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dataplane_procs import wait_until

from luftpause.config.settings import ENV_DELIMITER, ENV_PREFIX
from luftpause.testkit.launch.procs import ChildProcess, free_port, port_open

pytestmark = pytest.mark.integration


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _file(tmp_path: Path, ports: dict[str, int]) -> Path:
    """A file whose every address is a port nothing will listen on (the overrides move them all)."""
    path = tmp_path / "lp.toml"
    path.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{ports["grpc"]}"
http = "127.0.0.1:{ports["http"]}"
[dataplane]
listen = "127.0.0.1:{ports["listen"]}"
scheduler = "127.0.0.1:{ports["grpc"]}"
[runtime]
listen = "127.0.0.1:{ports["runtime"]}"
state_dir = "{tmp_path / "file-state"}"
[[replicas]]
name = "a"
url = "http://127.0.0.1:{ports["engine"]}"
models = ["m"]
"""
    )
    return path


def test_a_scheduler_from_variables_and_a_dataplane_from_flags_find_each_other(tmp_path: Path) -> None:
    in_file = {name: free_port() for name in ("grpc", "http", "listen", "runtime", "engine")}
    path = _file(tmp_path, in_file)
    grpc, http, listen, listen_in_env = free_port(), free_port(), free_port(), free_port()
    scheduler = ChildProcess(
        "scheduler",
        ["scheduler", "--config", str(path)],
        tmp_path / "scheduler.log",
        env={
            "LUFTPAUSE_SCHEDULER__GRPC": f"127.0.0.1:{grpc}",
            "LUFTPAUSE_SCHEDULER__HTTP": f"127.0.0.1:{http}",
        },
        ready_url=f"http://127.0.0.1:{http}/health",
    )
    dataplane = ChildProcess(
        "dataplane",
        [
            "dataplane",
            "--config",
            str(path),
            "--listen",
            f"127.0.0.1:{listen}",
            "--scheduler",
            f"127.0.0.1:{grpc}",
        ],
        tmp_path / "dataplane.log",
        env={"LUFTPAUSE_DATAPLANE__LISTEN": f"127.0.0.1:{listen_in_env}"},  # the flag wins over it
        ready_url=f"http://127.0.0.1:{listen}/health",
    )
    try:
        scheduler.start().wait_ready()
        dataplane.start().wait_ready()
        assert _get_json(f"http://127.0.0.1:{http}/status")["replicas"]
        # The worker that answers took --scheduler too (it sees no flags: it was handed the config).
        assert wait_until(
            lambda: _get_json(f"http://127.0.0.1:{listen}/health")["scheduler"] == "connected", 30
        ), dataplane.log_tail()
        assert port_open("127.0.0.1", grpc)
        for port in [*in_file.values(), listen_in_env]:
            assert not port_open("127.0.0.1", port), port
    finally:
        dataplane.stop()
        scheduler.stop()


def test_a_runtime_listens_and_keeps_its_state_where_its_flags_say(tmp_path: Path) -> None:
    in_file = {name: free_port() for name in ("grpc", "http", "listen", "runtime", "engine")}
    path = _file(tmp_path, in_file)
    listen, listen_in_env = free_port(), free_port()
    runtime = ChildProcess(
        "runtime",
        [
            "runtime",
            "--config",
            str(path),
            "--listen",
            f"127.0.0.1:{listen}",
            "--state-dir",
            str(tmp_path / "flag-state"),
        ],
        tmp_path / "runtime.log",
        env={"LUFTPAUSE_RUNTIME__LISTEN": f"127.0.0.1:{listen_in_env}"},
        ready_url=f"http://127.0.0.1:{listen}/health",
    )
    try:
        runtime.start().wait_ready()
        assert _get_json(f"http://127.0.0.1:{listen}/status")["runs"] == []
        assert (tmp_path / "flag-state").is_dir() and not (tmp_path / "file-state").exists()
        assert not port_open("127.0.0.1", listen_in_env) and not port_open("127.0.0.1", in_file["runtime"])
    finally:
        runtime.stop()


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["scheduler"],
            {"LUFTPAUSE_SCHEDULER__STRICT_AFFINITY": "maybe"},
            "luftpause scheduler: LUFTPAUSE_SCHEDULER__STRICT_AFFINITY: expected true or false, got 'maybe'",
        ),
        (
            ["dataplane", "--listen", "8080"],
            {},
            "luftpause dataplane: --listen: expected 'host:port', got '8080'",
        ),
        (
            ["runtime"],
            {"LUFTPAUSE_REPLICAS__0__URL": "http://127.0.0.1:1"},
            "luftpause runtime: LUFTPAUSE_REPLICAS__0__URL: [[replicas]] is set in the configuration file",
        ),
    ],
)
def test_a_bad_variable_or_flag_stops_the_process_at_start_naming_it(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "luftpause", *argv],
        env={**_clean_environ(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(expected), done.stderr


def _clean_environ() -> dict[str, str]:
    """This environment without the settings' variables a shell may have set."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.upper().startswith(ENV_PREFIX) or ENV_DELIMITER not in name
    }
