"""One dataplane per listen address: a second started at the same moment is refused (it would bind
beside the first with SO_REUSEPORT and serve under the same dataplane id), and a restart after the
first crashed still starts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from luftpause.testkit.launch.procs import ChildProcess, free_port, http_ok

pytestmark = pytest.mark.integration


def _config(tmp_path: Path) -> tuple[Path, int]:
    port = free_port()
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f"""
[dataplane]
listen = "127.0.0.1:{port}"
scheduler = "127.0.0.1:{free_port()}"

[[replicas]]
name = "a"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]
health_path = ""
"""
    )
    return config, port


def _dataplane(tmp_path: Path, config: Path, name: str, port: int) -> ChildProcess:
    return ChildProcess(
        name,
        ["dataplane", "--config", str(config)],
        tmp_path / f"{name}.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )


def test_two_dataplanes_started_at_once_on_one_address_one_is_refused(tmp_path: Path) -> None:
    config, port = _config(tmp_path)
    first, second = (_dataplane(tmp_path, config, name, port) for name in ("first", "second"))
    try:
        first.start()
        second.start()  # at once: neither is listening yet
        deadline = time.monotonic() + 30
        while not (first.exited() or second.exited()) and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = first if first.exited() else second
        serving = second if refused is first else first
        assert refused.exited(), "neither dataplane was refused"
        assert refused.poll() == 1
        assert "already in use by another luftpause dataplane" in refused.log_tail()
        serving.wait_ready()
        assert not serving.exited()

        # The survivor crashes (SIGKILL to its whole group): a restart on the address starts.
        os.killpg(serving.pgid, signal.SIGKILL)
        serving.stop()
        again = _dataplane(tmp_path, config, "again", port)
        try:
            again.start().wait_ready()
            assert http_ok(f"http://127.0.0.1:{port}/health")
        finally:
            again.stop()
    finally:
        first.stop()
        second.stop()
