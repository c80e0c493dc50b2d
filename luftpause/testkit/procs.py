"""Start luftpause commands as real child processes on loopback, and wait until they answer.

Used by the tests, the benchmarks and ``luftpause up``. A process runs ``python -m luftpause
<command>`` with the interpreter that runs this module, or any other program (nginx, SGLang's
router) given whole with ``program=()``. Each runs in its own session, so that its whole process
group (a server's workers too) can be found, measured and ended.
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

_HANDED_OUT: dict[int, None] = {}
"""The ports :func:`free_port` returned in this process, oldest first; the last
:data:`_REMEMBERED` only (the kernel hands out about 14,000 different ports)."""
_REMEMBERED = 4096


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that none of this process's
    last 4,096 calls returned.

    The kernel picks a random free port, and a port is free again as soon as the probing socket
    closes: two calls a moment apart returned the same port about once in 14,000 pairs (a stack
    takes seven ports before starting anything, so about once in 700 stacks), and the second
    server then failed to bind, or a port meant to stay unanswered was served. Remembering what
    was handed out (the last 4,096 ports) rules that out within the process (a test run); other
    processes can still race for a port between this call and the bind.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT[port] = None
            if len(_HANDED_OUT) > _REMEMBERED:
                del _HANDED_OUT[next(iter(_HANDED_OUT))]
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


LUFTPAUSE = (sys.executable, "-m", "luftpause")
"""The program of a ``luftpause`` command: this interpreter running the package."""


class ChildProcess:
    """One command running as a child process in its own session, its output sent to ``log_path``.

    ``argv`` are the arguments after ``program``: by default ``program`` is :data:`LUFTPAUSE`, so
    ``ChildProcess("dp", ["dataplane", "--config", path])`` runs ``python -m luftpause dataplane
    ...``; ``program=()`` takes ``argv`` whole (``[NGINX, "-c", conf]``). ``self.argv`` is the whole
    command line, ``self.args`` the part after ``program``. ``env`` is added to this process's
    environment (``replace_env=True``: used instead of it); ``cwd`` is its working directory.
    ``ready_url`` (HTTP) or ``ready_port`` (TCP) tells when it is serving; :meth:`wait_ready`
    raises ``RuntimeError`` with the end of its log when it exits first or takes too long.
    :meth:`start` may be called once only (``RuntimeError`` after that): a second start would
    lose the first process, still running, to nobody's stop.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        ready_url: str | None = None,
        ready_port: tuple[str, int] | None = None,
        *,
        program: Sequence[str] = LUFTPAUSE,
        cwd: Path | None = None,
        replace_env: bool = False,
    ) -> None:
        self.name = name
        self.program = tuple(program)
        self.args = list(argv)
        self.argv = [*self.program, *self.args]
        if not self.argv:
            raise ValueError(f"{name}: an empty command line")
        self.log_path = log_path
        self.ready_url = ready_url
        self.ready_port = ready_port
        self.env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ChildProcess:
        """Start the process (once); ``self``. ``RuntimeError`` when it was started before."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} was already started (pid {self.proc.pid})")
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        return self

    @property
    def pgid(self) -> int:
        """The process group of the child and everything it started (its pid, as session leader)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    def group_pids(self) -> list[int]:
        """Live (not zombie) processes of the child's process group; empty before :meth:`start`."""
        return [] if self.proc is None else group_pids(self.proc.pid)

    def exited(self) -> bool:
        """True when the child (the group's leader) was started and has exited."""
        return self.proc is not None and self.proc.poll() is not None

    def is_ready(self) -> bool:
        if self.ready_url is not None:
            return http_ok(self.ready_url)
        if self.ready_port is not None:
            return port_open(*self.ready_port)
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll every 0.05 s until the child answers; ``RuntimeError`` (with its log's end) when it
        exits first or ``timeout`` seconds pass. The deadline is for a loaded 2-core machine, where
        importing the package and starting a server can take many seconds."""
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
    return bool(group_pids(pgid))


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ..., utime, stime at
    indexes 11 and 12 (proc(5) fields 3 onwards); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``; a zombie (Z) holds no port and is reaped by
    ``wait()``, so it is left out."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids
