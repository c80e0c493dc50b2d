"""An unwritable ``[runtime] state_dir`` is refused at start with one line naming it (it used to
end in a 100-line ExceptionGroup from the worker, after the stdio servers were started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from luftpause.testkit.launch.procs import free_port


@pytest.mark.parametrize("kind", ["a file in the way", "a read-only directory"])
def test_an_unwritable_state_dir_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    if kind == "a file in the way":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        state_dir = blocker / "state"
    else:
        state_dir = tmp_path / "ro"
        state_dir.mkdir()
        state_dir.chmod(0o500)
        probe = state_dir / "probe"
        try:
            probe.write_text("x")  # root writes anyway: the check cannot be made here
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("running as root: a read-only directory is writable")
    stdio_marker = tmp_path / "stdio-started"
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{free_port()}"
state_dir = "{state_dir}"

[[replicas]]
name = "nowhere"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]

[[mcp_servers]]
name = "local"
command = ["{sys.executable}", "-c", "open({str(stdio_marker)!r}, 'w')"]
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "luftpause", "runtime", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("luftpause runtime: [runtime] state_dir ") and str(state_dir) in lines[0]
    assert not stdio_marker.exists()
