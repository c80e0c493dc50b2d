"""Start luftpause commands as real child processes on loopback, and wait until they answer.

Used by the tests and by ``luftpause up``. Every process runs ``python -m luftpause <command>`` with
the interpreter that runs this module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 0.5) -> bool:
    """True when ``GET url`` answers with any HTTP status below 500."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


class ChildProcess:
    """One ``luftpause`` command running as a child process, its output sent to ``log_path``.

    ``ready_url`` (HTTP) or ``ready_port`` (TCP) tells when it is serving; :meth:`wait_ready`
    raises ``RuntimeError`` with the end of its log when it exits first or takes too long.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        ready_url: str | None = None,
        ready_port: tuple[str, int] | None = None,
    ) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "luftpause", *argv]
        self.log_path = log_path
        self.ready_url = ready_url
        self.ready_port = ready_port
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ChildProcess:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        if self.log_path:
            out.close()  # type: ignore[union-attr]
        return self

    def is_ready(self) -> bool:
        if self.ready_url is not None:
            return http_ok(self.ready_url)
        if self.ready_port is not None:
            return port_open(*self.ready_port)
        return True

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.is_ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout`` seconds.

        The group is signalled even when its leader has already exited: a server's worker
        processes (granian's) outlive a leader that was killed.
        """
        if self.proc is None or (self.proc.poll() is not None and not _group_alive(self.proc.pid)):
            return  # all gone: its pid may already name someone else's group
        if not _signal_group(self.proc.pid, signal.SIGTERM):
            self.proc.wait()
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.poll()
            if not _group_alive(self.proc.pid):
                break
            time.sleep(0.02)
        else:
            self.kill()
        self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the whole process group at once, and wait until every member is gone."""
        if self.proc is None or (self.proc.poll() is not None and not _group_alive(self.proc.pid)):
            return  # all gone: its pid may already name someone else's group
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 5
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)


def _signal_group(pgid: int, signum: int) -> bool:
    """Signal every process of group ``pgid``; False when none is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies of our own child aside)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields: state, ppid, pgrp, ...; a zombie (Z) holds no port and is reaped by wait().
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False
